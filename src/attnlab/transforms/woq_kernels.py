"""Deprecated: attnlab's C++ kernels moved to :mod:`attnlab.kernels` (one folder, one entry point).

``attnlab.transforms.woq_kernels.NAME`` keeps working for one release with a
``DeprecationWarning``; import ``attnlab.kernels`` instead.
"""

from __future__ import annotations

import warnings
from typing import Any

import attnlab.kernels as _kernels


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    warnings.warn(
        f"attnlab.transforms.woq_kernels.{name} moved to attnlab.kernels.{name}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(_kernels, name)
