"""``attnlab convert-run RUN_DIR``: bring a run of an older attnlab into the current layout.

Today this converts translation runs of attnlab 0.1 (their own loop and snapshot layout) into
runs of the ``translate`` recipe, which ``attnlab train translate --resume`` then continues
(:func:`attnlab.training.legacy.convert_translation_run`); the old files are kept in
``RUN_DIR/legacy-0.1/``. Runs of 0.1's other recipes need no conversion: they load and resume
as they are.
"""

from __future__ import annotations

import argparse
from typing import Any

from attnlab.cli.common import guarded


def add_parser(commands: Any) -> None:
    """The ``convert-run`` command."""
    p = commands.add_parser(
        "convert-run",
        help="convert a run of an older attnlab (0.1's translation runs) to the current layout",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument("run", help="the run directory")
    p.set_defaults(func=guarded("attnlab convert-run", run_convert))


def run_convert(args: argparse.Namespace) -> int:
    """Convert; print where the checkpoint is."""
    from attnlab.training.legacy import convert_translation_run

    checkpoint = convert_translation_run(args.run)
    print(f"converted {args.run}: checkpoint {checkpoint}; continue with "
          f"`attnlab train translate --out {args.run} --resume`")  # fmt: skip
    return 0


__all__ = ["add_parser", "run_convert"]
