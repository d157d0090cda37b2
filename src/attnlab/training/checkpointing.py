"""The trainer's checkpoints: its state, saving, resuming with fallback, exports and averaging.

:class:`TrainerCheckpoints` is the part of :class:`~attnlab.training.Trainer` that talks to the
run directory (:mod:`attnlab.training.rundir`):

- :meth:`~TrainerCheckpoints.state_dict` / :meth:`~TrainerCheckpoints.load_state_dict`: step,
  optimizer (full, keyed by parameter name), scheduler, RNG states (every process's), the data
  position, training time and tokens, the best score and early-stopping counter, the precision
  (fp16's loss scaler and skipped steps);
- :meth:`~TrainerCheckpoints.save`: rank 0 writes a checkpoint (all processes call it);
- :meth:`~TrainerCheckpoints.resume`: rank 0 tries the run's checkpoints newest first and
  uses the first that loads, saying which it skipped and why; it refuses (``RunDirError``) a
  checkpoint of another model, or a directory whose checkpoints all fail, and
  (``NewerVersionError``) a checkpoint written by a newer attnlab: that is not damage, so it
  never falls back past it (which would then overwrite and prune it);
- :meth:`~TrainerCheckpoints.finish`: at the end of a run, ``last/`` (with ``export_last``) and
  the §6.1 average of the last ``average_last`` checkpoints in ``averaged/``, evaluated.

§6.1's averaging: the element-wise mean of every parameter and float buffer of the last k
checkpoints, accumulated in float64 (:func:`average_checkpoints`).
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from attnlab.config import config_to_dict
from attnlab.io import NewerVersionError, read_json
from attnlab.pretrained import CONFIG_NAME, load_weights, read_model_weights
from attnlab.training.config import TrainConfig
from attnlab.training.distributed import (
    DistributedContext,
    all_gather_stack,
    any_rank,
    barrier,
    broadcast_state,
    full_model_state_dict,
    full_optimizer_state_dict,
    load_full_optimizer_state_dict,
    load_full_state,
    rank_seed,
)
from attnlab.training.hardware import Precision
from attnlab.training.metrics import MetricsLogger, read_metrics
from attnlab.training.objectives import DataStream
from attnlab.training.rundir import RunDir, RunDirError
from attnlab.training.state import read_training_state, rng_state, set_rng_state

logger = logging.getLogger(__name__)


class _Trainer(Protocol):
    """What of a :class:`~attnlab.training.Trainer` its checkpoints read and restore."""

    config: TrainConfig
    run: RunDir | None
    dist: DistributedContext
    model: nn.Module
    module: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    stream: DataStream
    device: torch.device
    precision: Precision
    callbacks: list[Any]
    step: int
    elapsed: float
    tokens: int
    best_value: float | None
    best_step: int | None
    evals_since_best: int

    def evaluate(
        self, n_batches: int | None = None, *, model: nn.Module | None = None
    ) -> dict[str, float]: ...


class TrainerCheckpoints:
    """Checkpoint I/O of one :class:`~attnlab.training.Trainer` (see the module docstring)."""

    def __init__(self, trainer: _Trainer) -> None:
        self.t = trainer
        # the checkpoint an interrupt wrote off the schedule (saved, or resumed from), which
        # the next checkpoint replaces (rank 0)
        self.interrupt_checkpoint: Path | None = None

    # -- state -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything but the weights that resuming needs (every process must call it: the
        RNG states are gathered; rank 0's is complete)."""
        t = self.t
        rng = rng_state()
        if t.dist.enabled:
            rng["torch_by_rank"] = all_gather_stack(torch.get_rng_state(), t.dist)
        if t.device.type == "cuda":
            rng["cuda_by_rank"] = all_gather_stack(torch.cuda.get_rng_state(t.device), t.dist)
        return {
            "step": t.step,
            "optimizer": full_optimizer_state_dict(t.model, t.optimizer),
            "scheduler": t.scheduler.state_dict(),
            "rng": rng,
            "data": t.stream.state_dict(),
            "elapsed_s": t.elapsed,
            "tokens": t.tokens,
            "best_value": t.best_value,
            "best_step": t.best_step,
            "evals_since_best": t.evals_since_best,
            "world_size": t.dist.world_size,
            "precision": t.precision.state_dict(),
            "train_config": t.config.to_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (every process passes the whole state)."""
        load_full_optimizer_state_dict(self.t.model, self.t.optimizer, state["optimizer"])
        self._load_rest(state)

    def _load_rest(self, state: dict[str, Any]) -> None:
        t = self.t
        t.step = int(state["step"])
        t.scheduler.load_state_dict(state["scheduler"])
        rng, rank = state["rng"], t.dist.rank
        set_rng_state(rng)
        t.stream.load_state_dict(state["data"])
        by_rank = rng.get("torch_by_rank")
        if by_rank is not None and rank < len(by_rank):
            torch.set_rng_state(by_rank[rank].clone())
        elif rank > 0:  # more processes than the checkpoint's run had: fresh, derived streams
            torch.manual_seed(rank_seed(t.config.seed, rank, t.step))
        cuda = rng.get("cuda_by_rank")
        if t.device.type == "cuda" and cuda is not None and rank < len(cuda):
            torch.cuda.set_rng_state(cuda[rank].clone(), t.device)
        t.elapsed = float(state.get("elapsed_s", 0.0))
        t.tokens = int(state.get("tokens", 0))
        best = state.get("best_value", state.get("best_val_loss"))  # 0.1: best_val_loss
        t.best_value = None if best is None or best == float("inf") else float(best)
        t.best_step = state.get("best_step")
        t.evals_since_best = int(state["evals_since_best"])
        t.precision.load_state_dict(state.get("precision", {}))  # any precision's state loads

    # -- saving ----------------------------------------------------------------------------

    def save(self, *, interrupted: bool = False) -> Path:
        """Write a checkpoint of the current step (rank 0 writes; in a distributed run every
        process must call it, and all return once it is complete).

        Args:
            interrupted: the checkpoint of an interrupt, off the schedule: kept beside the
                ``keep_checkpoints`` newest, marked in its state, and removed once a newer
                checkpoint is complete (so that a resumed run keeps the checkpoints the
                uninterrupted run keeps, and averages the same ones).

        A ``KeyboardInterrupt`` during the write (a second Ctrl-C) removes the half-written
        directory unless ``latest`` names it already, and propagates.

        Raises:
            ValueError: without a run directory.
        """
        t = self.t
        if t.run is None:
            raise ValueError("Trainer was built without run_dir; nowhere to save")
        weights = full_model_state_dict(t.model) if t.dist.enabled else None
        state = self.state_dict()
        if interrupted:
            state["interrupted"] = True
        directory = t.run.checkpoint(t.step)
        if t.dist.is_main:
            replaced = self.interrupt_checkpoint
            if replaced is not None and replaced.name >= directory.name:
                replaced = None  # rewritten in place (same step), or not older
            keep = t.config.keep_checkpoints + int(interrupted) + int(replaced is not None)
            try:
                t.run.save_checkpoint(t.module, state, keep=keep, model_state=weights)
            except KeyboardInterrupt:
                if t.run.pointer_target() != directory:  # never named: no checkpoint yet
                    shutil.rmtree(directory, ignore_errors=True)
                raise
            if replaced is not None:  # the new checkpoint is complete and named by latest
                shutil.rmtree(replaced, ignore_errors=True)
            self.interrupt_checkpoint = directory if interrupted else None
        barrier(t.dist)
        return directory

    def export(self, name: str, model: nn.Module, metrics: dict[str, float]) -> None:
        """Rank 0 writes ``name/`` (a model directory with the run's tokenizer)."""
        t = self.t
        if t.run is not None and t.dist.is_main:
            info = {"kind": name, "step": t.step, **self.export_info, **metrics}
            t.run.export(name, model, info)

    @property
    def export_info(self) -> dict[str, Any]:
        """What exports record about the run (the recipe and its data, from ``run.json``)."""
        t = self.t
        if t.run is None or not t.run.record_file.is_file():
            return {}
        record = read_json(t.run.record_file, expect=dict)
        return {"recipe": record.get("recipe"), **record.get("export", {})}

    # -- resuming --------------------------------------------------------------------------

    def resume(self) -> bool:
        """Load the newest checkpoint that loads; returns whether one was loaded.

        Raises:
            RunDirError: for a checkpoint of another model, or checkpoints none of which loads.
            NewerVersionError: for a checkpoint written by a newer attnlab (before any older
                one is tried).
        """
        t = self.t
        found: tuple[Path, dict[str, Any], dict[str, Any]] | None = None
        if t.dist.is_main and t.run is not None:
            found = self._first_loadable(t.run.resume_candidates())
        if not any_rank(found is not None, t.dist):
            return False
        weights: dict[str, Any] | None = None
        state: dict[str, Any] = {}
        if found is not None:
            directory, state, weights = found
            if state.pop("interrupted", False):  # replaced by the next checkpoint
                self.interrupt_checkpoint = directory
        optimizer = state.pop("optimizer", None)
        load_full_state(t.model, t.optimizer, weights, optimizer, t.dist)
        self._load_rest(broadcast_state(state, t.dist))
        return True

    def _first_loadable(
        self, candidates: Sequence[Path]
    ) -> tuple[Path, dict[str, Any], dict[str, Any]] | None:
        t = self.t
        run = t.run
        if run is None:
            return None
        skipped: list[str] = []
        expected = config_to_dict(t.module.config) if hasattr(t.module, "config") else None
        for directory in candidates:
            try:
                saved = read_json(directory / CONFIG_NAME, what="model config", expect=dict)
                if expected is not None and saved != expected:
                    raise RunDirError(
                        f"{directory} holds a checkpoint of another model than the one built "
                        "now: resume with the run's own settings (see its run.json)"
                    )
                state = read_training_state(directory)
                # dtype kinds, the config and content digests (attnlab.integrity): a
                # checkpoint whose bytes changed is damaged like a truncated one
                weights = read_model_weights(directory, t.module)
            except RunDirError:
                raise
            except NewerVersionError as e:  # not damage: never fall back past it (and prune it)
                raise NewerVersionError(f"--resume: {e}; nothing was changed") from None
            except (OSError, ValueError, KeyError) as e:
                skipped.append(f"{directory.name} ({e})")
                logger.warning(
                    "checkpoint %s does not load (%s); trying an older one", directory, e
                )
                continue
            if skipped:
                logger.warning("resuming from %s (skipped: %s)", directory, "; ".join(skipped))
            return directory, state, weights
        # A run whose first checkpoint never completed (no pointer yet) starts again; one that
        # had a complete checkpoint (a pointer, complete-looking ones that fail, or a metrics
        # history past the first scheduled checkpoint) never does: that would rewrite history.
        history = self._history_past_first_checkpoint()
        if skipped or (run.checkpoints / "latest").exists() or history is not None:
            if skipped:
                why = f" (tried: {'; '.join(skipped)})"
            elif history is not None and not run.checkpoint_dirs():
                why = f" (none is left, but {history})"
            else:
                why = " (all are incomplete)"
            raise RunDirError(
                f"--resume: no checkpoint of {run.path} loads{why}; nothing was changed. "
                "Start a new run with another --out, or --overwrite"
            )
        return None

    def _history_past_first_checkpoint(self) -> str | None:
        """What in ``metrics.jsonl`` proves a checkpoint had completed, if anything: a record of
        a step past the first scheduled checkpoint (saved before that step ran), or the record
        of a finished run."""
        run, every = self.t.run, self.t.config.checkpoint_every
        if run is None:
            return None
        try:
            records = read_metrics(run.path)
        except (OSError, ValueError):
            return None
        if any(r.get("split") == "final" for r in records):
            return "metrics.jsonl records a finished run"
        steps = [int(r["step"]) for r in records if isinstance(r.get("step"), int)]
        if every > 0 and steps and max(steps) > every:
            return f"metrics.jsonl records training to step {max(steps)}"
        return None

    # -- the end of a run ------------------------------------------------------------------

    def finish(
        self, log: MetricsLogger | None, last: dict[str, float]
    ) -> dict[str, dict[str, float]]:
        """``last/`` (``export_last``, recording ``last``: the final evaluation) and §6.1's
        ``averaged/`` (``average_last``), evaluated and logged as a ``final`` record; returns
        ``{"averaged": metrics}`` (or ``{}``)."""
        t, c = self.t, self.t.config
        final: dict[str, dict[str, float]] = {}
        if c.export_last:
            self.export("last", t.module, last)
        if c.average_last and t.run is not None:
            barrier(t.dist)
            directories = t.run.checkpoint_dirs()[-c.average_last :]
            averaged = average_checkpoints(copy.deepcopy(t.module), directories)
            metrics = t.evaluate(model=averaged)
            steps = [int(d.name.removeprefix("step_")) for d in directories]
            self.export("averaged", averaged, {**metrics, "averaged_steps": steps})  # type: ignore[dict-item]
            final["averaged"] = metrics
            if log is not None:
                body = {k.removeprefix("val_"): v for k, v in metrics.items()}
                log.log({"split": "final", "step": t.step, "model": "averaged",
                         "averaged_steps": steps, **body})  # fmt: skip
        return final


@torch.no_grad()
def average_checkpoints(
    model: nn.Module, directories: Sequence[str | os.PathLike[str]]
) -> nn.Module:
    """Set ``model``'s parameters and float buffers to their mean over the checkpoint (model)
    ``directories`` (§6.1); returns ``model``.

    Each directory's ``model.safetensors`` is loaded into ``model`` in turn
    (:func:`attnlab.pretrained.load_weights`: tied tensors added back, checked against the
    digests it records), summed in float64, and the mean written back.

    Raises:
        ValueError: for an empty list, weights that do not fit ``model``
            (``CheckpointMismatchError``) or that changed after saving
            (``DigestMismatchError``).
    """
    if not directories:
        raise ValueError("average_checkpoints needs at least one checkpoint directory")
    tensors: dict[str, torch.Tensor] = dict(model.named_parameters())
    tensors.update((n, b) for n, b in model.named_buffers() if b.is_floating_point())
    total = {n: torch.zeros_like(x, dtype=torch.float64) for n, x in tensors.items()}
    for d in directories:
        load_weights(model, d)
        for n, x in tensors.items():
            total[n] += x.double()
    for n, x in tensors.items():
        x.copy_(total[n] / len(directories))
    return model


__all__ = ["TrainerCheckpoints", "average_checkpoints"]
