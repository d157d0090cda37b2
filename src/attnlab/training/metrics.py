"""Run metrics: one JSON object per line in ``<run>/metrics.jsonl``, and optionally TensorBoard.

One schema for every recipe. Each record has ``step`` (optimizer updates so far), ``split`` and
``elapsed_s`` (training time in total, over resumed sessions), then the split's figures:

- ``"train"``: ``loss`` (the update's mean training loss, label smoothing included), ``lr``,
  ``grad_norm`` (before clipping), ``tokens`` (input tokens so far), ``tokens_per_s``, and
  ``epoch`` for recipes whose data has epochs; mixture-of-experts models add ``aux_loss`` (the
  routers' weighted auxiliary loss, trained on beside ``loss``), ``moe_balance_loss``,
  ``moe_z_loss``, ``moe_dropped_fraction``, ``moe_max_load_ratio`` and ``moe_load`` (layer ->
  assignments per expert in that step; :meth:`attnlab.training.moe.MoEStepStats.fields`);
- ``"val"``: ``loss`` (no label smoothing), ``accuracy`` (of the loss's targets), the
  recipe's own metrics (``ppl``, ``bleu``, ``exact_match``, ...) and ``eval_s``, the seconds the
  evaluation took (its ``elapsed_s`` is the time before it; later records' include it, so
  training seconds alone are ``elapsed_s`` less the ``eval_s`` of the evaluations before);
- ``"final"``: the same figures for a model made at the end, named by ``model``
  (``"averaged"``: §6.1's checkpoint average).

:func:`read_metrics` reads a run's file and also the two layouts of attnlab 0.1 (``train_loss``
/ ``val_loss`` keys; the translation loop's ``seconds`` and ``val_*``/``avg_*`` keys), returned
in this schema.

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

from attnlab.io import atomic_write_text, parse_json_line

METRICS_NAME = "metrics.jsonl"
# The figures of a record that are wall-clock measurements: they differ between two runs that
# are otherwise identical (a resumed run and an uninterrupted one match in everything else).
TIMING_KEYS: tuple[str, ...] = ("elapsed_s", "tokens_per_s", "eval_s")

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
            record = parse_json_line(line)  # None: a half-written last line of a killed run
            if isinstance(record, dict) and record.get("step", 0) <= step:
                kept.append(line)
        # through a temporary file and os.replace: a kill here must not lose the kept lines
        atomic_write_text(self.path, "".join(f"{line}\n" for line in kept))

    def log(self, record: dict[str, Any]) -> None:
        """Append ``record`` (must hold ``"step"``) as one line.

        Raises:
            OSError: naming the metrics file when it cannot be written (a full disk's
                ``ENOSPC`` names no file by itself).
        """
        line = json.dumps(record) + "\n"
        try:
            self._file.write(line)
            self._file.flush()
        except OSError as e:
            if e.filename is not None:
                raise
            raise OSError(e.errno, e.strerror or str(e), str(self.path)) from e
        if self._tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, int | float):
                    self._tb.add_scalar(key, value, record["step"])

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


_LEGACY_VAL = {"val_loss": "loss", "val_accuracy": "accuracy", "val_ppl": "ppl", "val_bleu": "bleu"}


def normalise_record(record: dict[str, Any]) -> dict[str, Any]:
    """A metrics record in the schema above (records of attnlab 0.1 converted)."""
    legacy = ("train_loss" in record or "seconds" in record
              or any(k.startswith(("avg_", "val_")) for k in record))  # fmt: skip
    if "split" in record and not legacy:
        return record
    out: dict[str, Any] = {"step": record.get("step")}
    split = record.get("split")
    if "seconds" in record:
        out["elapsed_s"] = record["seconds"]
    if "train_loss" in record:
        split = "train"
        out["loss"] = record["train_loss"]
    elif split is None and ("val_loss" in record or "val_accuracy" in record):
        split = "val"
    out["split"] = split or "train"
    for key, value in record.items():
        if key in ("step", "split", "seconds", "train_loss"):
            continue
        name = key.removeprefix("avg_")
        out[_LEGACY_VAL.get(name, name)] = value
    return out


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a metrics file (or of a run directory's ``metrics.jsonl``), in the schema
    above; blank lines and lines that are not JSON objects (a torn last line) are skipped.

    Raises:
        FileNotFoundError: if there is no such file.
    """
    file = Path(path)
    if file.is_dir():
        file = file / METRICS_NAME
    if not file.is_file():
        raise FileNotFoundError(f"no metrics file {file}")
    records = []
    for line in file.read_text(encoding="utf-8", errors="replace").splitlines():
        record = parse_json_line(line)
        if isinstance(record, dict) and "step" in record:
            records.append(normalise_record(record))
    return records


__all__ = ["METRICS_NAME", "TIMING_KEYS", "MetricsLogger", "normalise_record", "read_metrics"]
