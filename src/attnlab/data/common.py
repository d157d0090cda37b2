"""What every data set shares: the names of the splits and the folder downloads are cached in.

Data sets are *looked up* offline first, in :func:`attnlab.io.data_dirs` (``$ATTNLAB_DATA``,
``../shared/data`` beside a source checkout, ``~/.cache/attnlab``; :func:`attnlab.io.
find_data_file` finds one file there); a loader that has to download writes into
:func:`data_dir`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

Split = Literal["train", "val", "test"]


def data_dir() -> Path:
    """Where downloads are cached: ``$ATTNLAB_DATA`` if set, else ``~/.cache/attnlab``."""
    env = os.environ.get("ATTNLAB_DATA")
    return Path(env) if env else Path.home() / ".cache" / "attnlab"


__all__ = ["Split", "data_dir"]
