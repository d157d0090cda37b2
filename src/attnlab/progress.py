"""Progress on stderr, as a reader of the output expects it: on a terminal (or in a notebook) a
tqdm bar redrawn in place; anywhere else (``attnlab ... > log 2>&1``, a batch job, CI), where
redraws would fill the file with carriage-return frames, a plain line at a low rate.

This is the one place library code writes to a stream: the stream a tqdm bar draws on (stderr).
:class:`Counter` counts work items (a translation's sentences);
:mod:`attnlab.training.progress` builds a training run's display on :func:`is_interactive` and
:func:`write_line`.
"""

from __future__ import annotations

import sys
from typing import TextIO

from tqdm.auto import tqdm


def is_interactive(stream: TextIO | None = None) -> bool:
    """Whether a progress bar redrawn in place can be shown on ``stream`` (default stderr): a
    terminal, or a notebook (where ``tqdm.auto`` draws a widget)."""
    if any(c.__module__ == "tqdm.notebook" for c in tqdm.__mro__):
        return True
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def write_line(text: str) -> None:
    """One plain progress line on stderr, flushed (where a tqdm bar would draw)."""
    sys.stderr.write(f"{text}\n")
    sys.stderr.flush()


class Counter:
    """Progress over ``total`` items: a tqdm bar on a terminal, else a plain line each tenth
    (``"DESC: done/total UNITs (P%)"``).

    Args:
        total: the number of items. desc: what is counted, e.g. ``"translating"``.
        unit: the item's name (plural: ``unit + "s"``).
        interactive: a bar (``True``) or plain lines (``False``); default :func:`is_interactive`.
    """

    def __init__(self, total: int, desc: str, unit: str, *, interactive: bool | None = None):
        self.total, self.desc, self.unit = total, desc, unit
        self.done, self.tenth = 0, 0
        bar = is_interactive() if interactive is None else interactive
        self.bar = tqdm(total=total, unit=unit, desc=desc) if bar else None

    def update(self, n: int) -> None:
        """``n`` more items done."""
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            return
        tenth = 10 * self.done // max(self.total, 1)
        if tenth > self.tenth:
            self.tenth = tenth
            percent = 100 * self.done // max(self.total, 1)
            write_line(f"{self.desc}: {self.done}/{self.total} {self.unit}s ({percent}%)")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


__all__ = ["Counter", "is_interactive", "write_line"]
