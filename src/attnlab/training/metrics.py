"""Run metrics: one JSON object per line in ``<run>/metrics.jsonl`` (read by
:mod:`attnlab.viz.curves`), and optionally TensorBoard scalars.

Lines are appended and flushed as they are written, so a killed run keeps what it logged; a
resumed run first drops lines logged after its checkpoint's step, so the file never holds two
values for one step (written to a temporary file and moved over the old one, so a kill then
loses nothing).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

METRICS_NAME = "metrics.jsonl"

logger = logging.getLogger(__name__)


class MetricsLogger:
    """Append metrics to ``<run_dir>/metrics.jsonl`` (and TensorBoard when asked and installed).

    Args:
        run_dir: the run directory (created).
        tensorboard: also write ``torch.utils.tensorboard`` event files to ``<run_dir>/tb``.
        resume_step: drop existing lines whose ``step`` is greater than this (resuming);
            ``None`` starts a fresh file.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        tensorboard: bool = False,
        resume_step: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_NAME
        if resume_step is None:
            self.path.write_text("")
        elif self.path.is_file():
            self._truncate_after(resume_step)
        self._file = self.path.open("a", encoding="utf-8")
        self._tb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional
                logger.warning("--tensorboard needs the tensorboard package; logging JSONL only")
            else:
                self._tb = SummaryWriter(str(self.run_dir / "tb"))

    def _truncate_after(self, step: int) -> None:
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a half-written last line of a killed run
            if isinstance(record, dict) and record.get("step", 0) <= step:
                kept.append(line)
        # through a temporary file and os.replace: a kill here must not lose the kept lines
        tmp = self.path.with_name(f".{METRICS_NAME}.tmp")
        tmp.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
        os.replace(tmp, self.path)

    def log(self, record: dict[str, Any]) -> None:
        """Append ``record`` (must hold ``"step"``) as one line."""
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, int | float):
                    self._tb.add_scalar(key, value, record["step"])

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


__all__ = ["METRICS_NAME", "MetricsLogger"]
