"""The course pages' shared set-up: every page's first cell imports this module.

A page is a Markdown file under ``docs/course/<language>/`` whose ``python`` fences are its code
cells (jupytext reads the same file as a notebook). Jupyter runs a page with the page's directory
as the working directory, and so does ``tests/course/test_course.py``; the first cell is::

    import sys; sys.path.insert(0, "..")
    from companion import FAST, ROOT, DATA, figure, recorded

- ``FAST``: ``True`` when ``ATTNLAB_COURSE_FAST=1`` (CI): pages that train use small sizes. The
  full sizes run from ``benchmarks/course_*.py`` and the pages show those recorded outputs.
- ``ROOT``: the checkout (the directory holding ``pyproject.toml``).
- ``DATA``: the shared data sets (``ATTNLAB_DATA``, else ``../shared/data`` beside the checkout).
- ``figure(name)``: the path a page saves its picture ``name`` to: ``docs/course/images/`` when
  ``ATTNLAB_COURSE_WRITE_IMAGES=1`` (how the committed pictures were made), else a scratch
  directory, so running a page never rewrites the checkout.
- ``recorded(name)``: the JSON a ``benchmarks/course_*.py`` run wrote to
  ``benchmarks/results/course/<name>.json``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = next(p for p in (HERE, *HERE.parents) if (p / "pyproject.toml").exists())
DATA = Path(os.environ.get("ATTNLAB_DATA", ROOT.parent / "shared" / "data"))
FAST = os.environ.get("ATTNLAB_COURSE_FAST") == "1"
RESULTS = ROOT / "benchmarks" / "results" / "course"
IMAGES = HERE / "images"


def figure(name: str) -> Path:
    """Where to save the picture ``name`` (e.g. ``"pe_heatmap.png"``)."""
    if os.environ.get("ATTNLAB_COURSE_WRITE_IMAGES") == "1":
        IMAGES.mkdir(exist_ok=True)
        return IMAGES / name
    scratch = Path(os.environ.get("ATTNLAB_COURSE_OUT") or tempfile.gettempdir()) / "attnlab-course"
    scratch.mkdir(parents=True, exist_ok=True)
    return scratch / name


def recorded(name: str) -> Any:
    """The recorded result ``benchmarks/results/course/<name>.json`` (see the page's benchmark)."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(
            f"no recorded result {path}: run the benchmark the page names to make it"
        )
    return json.loads(path.read_text(encoding="utf-8"))
