"""The progress bar of a training run: a total and an ETA for whichever budget applies.

With a step budget the bar counts steps; with only an epoch budget, batches of the data; with
only a time budget, seconds of training. The postfix shows the loss and the learning rate.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from tqdm.auto import tqdm

from attnlab.training.config import TrainConfig


class Progress:
    """A tqdm bar over the run's budget (disabled: does nothing).

    Args:
        config: the run's budgets. stream: its data stream (``epoch``, ``batches_per_epoch``).
        initial_step, initial_s: where a resumed run starts.
    """

    def __init__(
        self,
        config: TrainConfig,
        stream: Any,
        *,
        initial_step: int,
        initial_s: float,
        enabled: bool,
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
        self.bar = tqdm(total=total, initial=initial, desc="train", unit=self.unit,
                        disable=not enabled, dynamic_ncols=True)  # fmt: skip

    def update(self, step: int, elapsed_s: float, *, loss: float, lr: float) -> None:
        """Move the bar to the run's position after ``step``."""
        if self.bar.disable:
            return
        if self.unit == "step":
            position = step
        elif self.unit == "batch":
            position = round((self.stream.epoch or 0.0) * (self.per_epoch or 1))
        else:
            position = round(elapsed_s)
        self.bar.update(max(0, min(position, self.bar.total or position) - self.bar.n))
        self.bar.set_postfix(step=step, loss=f"{loss:.3f}", lr=f"{lr:.2e}", refresh=False)

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.bar.close()


__all__ = ["Progress"]
