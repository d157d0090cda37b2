"""The progress display of a training run: a total and an ETA for whichever budget applies.

With a step budget it counts steps; with only an epoch budget, batches of the data; with only
a time budget, seconds of training. It shows the loss and the learning rate.

On a terminal (or in a notebook) it is a tqdm bar, redrawn in place. Where stderr is not a
terminal (``attnlab train ... > log 2>&1``, a batch job, CI) redraws would fill the file with
carriage-return frames, so it writes a plain line instead, at a low rate: each tenth of the
budget, and at least every :data:`LINE_EVERY_S` seconds (a few dozen lines for a whole run).
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any

from tqdm.auto import tqdm

from attnlab.progress import is_interactive, write_line
from attnlab.training.config import TrainConfig

LINE_EVERY_S = 60.0  # off a terminal: a plain line at least this often (and each 10%)


_PLURAL = {"step": "steps", "batch": "batches", "s": "s"}


def _clock(seconds: float) -> str:
    seconds = max(0, round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """The run's progress over its budget (disabled: does nothing).

    Args:
        config: the run's budgets. stream: its data stream (``epoch``, ``batches_per_epoch``).
        initial_step, initial_s: where a resumed run starts.
        enabled: show anything at all (``TrainConfig.progress``, the main process).
        interactive: a tqdm bar (``True``) or plain lines at a low rate (``False``); default:
            a bar when stderr is a terminal (:func:`is_interactive`).
    """

    def __init__(
        self,
        config: TrainConfig,
        stream: Any,
        *,
        initial_step: int,
        initial_s: float,
        enabled: bool,
        interactive: bool | None = None,
    ) -> None:
        per_epoch = getattr(stream, "batches_per_epoch", None) if enabled else None
        if config.steps is not None:
            self.unit, total, initial = "step", config.steps, initial_step
        elif config.max_epochs is not None and per_epoch:
            self.unit, total = "batch", config.max_epochs * per_epoch
            initial = round((stream.epoch or 0.0) * per_epoch)
        else:
            self.unit, total, initial = "s", round(60 * (config.max_minutes or 0)), round(initial_s)
        self.stream, self.per_epoch = stream, per_epoch
        self.enabled = enabled
        self.interactive = is_interactive() if interactive is None else interactive
        self.total, self.position = total, initial
        self.bar = tqdm(total=total, initial=initial, desc="train", unit=self.unit,
                        disable=not (enabled and self.interactive), dynamic_ncols=True)  # fmt: skip
        # plain lines: the next tenth of the budget to report, the clock of the last line
        self._start, self._initial = time.monotonic(), initial
        self._last_line = self._start
        self._next_tenth = self._tenth(initial) + 1
        self._state: dict[str, Any] = {}
        self._written_at: int | None = None

    @property
    def plain(self) -> bool:
        """Whether it writes plain lines (enabled, stderr not a terminal)."""
        return self.enabled and not self.interactive

    def _tenth(self, position: int) -> int:
        return 10 * position // self.total if self.total else 0

    def update(self, step: int, elapsed_s: float, *, loss: float, lr: float) -> None:
        """Move to the run's position after ``step``."""
        if not self.enabled:
            return
        if self.unit == "step":
            position = step
        elif self.unit == "batch":
            position = round((self.stream.epoch or 0.0) * (self.per_epoch or 1))
        else:
            position = round(elapsed_s)
        self.position = max(0, min(position, self.total or position))
        self._state = {"step": step, "loss": loss, "lr": lr}
        if not self.plain:
            self.bar.update(self.position - self.bar.n)
            self.bar.set_postfix(step=step, loss=f"{loss:.3f}", lr=f"{lr:.2e}", refresh=False)
            return
        now = time.monotonic()
        if self._tenth(self.position) >= self._next_tenth or now - self._last_line >= LINE_EVERY_S:
            self._write_line(now)

    def _write_line(self, now: float) -> None:
        """One plain line on stderr: where the run is, its loss and rate, time spent and left.
        (The same stream a tqdm bar draws on; library code prints nothing else.)"""
        s, position, total = self._state, self.position, self.total
        where = f"{position}/{total} {_PLURAL[self.unit]}"
        if total:
            where += f" ({100 * position // total}%)"
        if self.unit != "step":
            where += f", step {s['step']}"
        spent = now - self._start
        done = position - self._initial
        left = f", ~{_clock((total - position) * spent / done)} left" if done > 0 and total else ""
        write_line(f"train: {where}, loss {s['loss']:.3f}, lr {s['lr']:.2e}, {_clock(spent)} "
                   f"elapsed{left}")  # fmt: skip
        self._last_line, self._written_at = now, position
        self._next_tenth = self._tenth(position) + 1

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.plain and self._state and self._written_at != self.position:
            self._write_line(time.monotonic())  # where it stopped (a time budget, an error)
        self.bar.close()


__all__ = ["LINE_EVERY_S", "Progress", "is_interactive"]
