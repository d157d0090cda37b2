"""The trainer: accumulation, clipping, schedules, evaluation, early stopping, checkpoints, resume.

One update (a *step*) draws ``grad_accum`` micro-batches, normalises their summed losses by the
total number of loss terms (so k micro-batches equal one k-times batch exactly), clips the
global gradient norm, steps the optimizer and the schedule. Evaluation runs every
``eval_every`` steps on the same fixed validation batches; with ``early_stopping`` the run stops
after that many evaluations without a new best.

Determinism on CPU: the data generator (the data position) and torch's global RNG (dropout) are
seeded from ``config.seed``; a checkpoint stores both, plus the optimizer and scheduler states,
so ``fit(resume=True)`` continues bitwise as the uninterrupted run would.

Distributed (under torchrun, :mod:`attnlab.training.distributed`): the trainer wraps the model
(DDP, or FSDP2 with ``config.fsdp``), every process draws the same global micro-batches and
computes its slice, losses and evaluation metrics are summed over the processes, only rank 0
logs and writes checkpoints, and every process resumes from them. The checkpoint format is the
same for any number of processes (full weights, optimizer state keyed by parameter name).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn
from tqdm.auto import tqdm

from attnlab.io import atomic_write_text, remove_stale_temp_files
from attnlab.pretrained import WEIGHTS_NAME, with_tied_names
from attnlab.training.config import TrainConfig
from attnlab.training.data import shard_batch
from attnlab.training.distributed import (
    DistributedContext,
    all_gather_stack,
    all_reduce_sum,
    any_rank,
    barrier,
    broadcast_state,
    current_context,
    full_model_state_dict,
    full_optimizer_state_dict,
    gradient_sync,
    load_full_optimizer_state_dict,
    load_full_state,
    move_to,
    parallelize,
    rank_seed,
    unwrap_model,
)
from attnlab.training.metrics import MetricsLogger
from attnlab.training.objectives import Objective
from attnlab.training.optim import build_optimizer, build_scheduler
from attnlab.training.state import (
    CHECKPOINTS_DIR,
    checkpoint_path,
    latest_checkpoint,
    read_training_state,
    rng_state,
    save_training_checkpoint,
    set_rng_state,
)

EVAL_SEED_OFFSET = 1_000_003  # validation batches use their own fixed generator


@dataclass
class FitResult:
    """What :meth:`Trainer.fit` did."""

    step: int  # optimizer updates done in total (resumed ones included)
    losses: list[float] = field(default_factory=list)  # train loss per step of this call
    evals: list[dict[str, float]] = field(default_factory=list)  # this call's evaluations
    best_val_loss: float = math.inf
    stopped_early: bool = False
    seconds: float = 0.0
    checkpoint: Path | None = None


class Trainer:
    """Train ``model`` on ``objective`` with ``config``.

    Args:
        model: any module the objective knows how to call; build it under your seed.
        objective: :class:`~attnlab.training.objectives.Objective` (batches + summed loss).
        config: the :class:`TrainConfig`.
        run_dir: where ``metrics.jsonl`` and checkpoints go; ``None`` writes nothing.
        d_model: the width the Noam schedule needs (default ``model.config.d_model``).
        extra_config: JSON-ready extras stored next to the config (recipe, model config, ...).
        distributed: the processes to train over (default: the initialised process group's,
            :func:`~attnlab.training.distributed.current_context`; a single process if none).
            With more than one, ``model`` is wrapped (DDP, or FSDP2 when ``config.fsdp``);
            every process must build the trainer with the same model, data and config.

    Raises:
        ValueError: if the world size does not divide ``config.batch_size``.
    """

    def __init__(
        self,
        model: nn.Module,
        objective: Objective,
        config: TrainConfig,
        *,
        run_dir: str | os.PathLike[str] | None = None,
        d_model: int | None = None,
        extra_config: dict[str, Any] | None = None,
        distributed: DistributedContext | None = None,
    ) -> None:
        self.dist = distributed if distributed is not None else current_context()
        config.per_rank_batch_size(self.dist.world_size)  # raises early if not divisible
        self.objective, self.config = objective, config
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.extra_config = dict(extra_config or {})
        if d_model is None:
            d_model = getattr(getattr(unwrap_model(model), "config", None), "d_model", None)
        if config.schedule == "noam" and d_model is None:
            raise ValueError("schedule='noam' needs d_model (the model has no config.d_model)")
        # the module trained (a DDP wrapper, a sharded model, or model itself) and the user's
        self.model = parallelize(model, self.dist, fsdp=config.fsdp)
        self.module = unwrap_model(self.model)
        first = next(iter(self.module.parameters()), None)
        self.device = self.dist.device if self.dist.enabled or first is None else first.device
        self.optimizer = build_optimizer(model, config)
        self.scheduler = build_scheduler(self.optimizer, config, d_model=d_model or 1)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.step = 0
        self.best_val_loss = math.inf
        self.evals_since_best = 0

    # -- one update ------------------------------------------------------------------------

    def _local(self, batch: Any) -> Any:
        """This process's slice of a global batch, on its device."""
        return move_to(shard_batch(batch, self.dist.rank, self.dist.world_size), self.device)

    def train_step(self) -> tuple[float, int, float]:
        """One optimizer update; returns ``(loss, tokens, grad norm before clipping)``, all
        over the whole global batch (summed over the processes)."""
        c, world = self.config, self.dist.world_size
        self.model.train()
        # every process draws the same global micro-batches, so counts are global for free
        micro = [
            self.objective.batch("train", c.batch_size, self.generator) for _ in range(c.grad_accum)
        ]
        total = sum(self.objective.count(b) for b in micro)
        self.optimizer.zero_grad(set_to_none=True)
        loss_value = 0.0
        for i, batch in enumerate(micro):
            with gradient_sync(self.model, i == len(micro) - 1):
                terms = self.objective.loss(
                    self.model, self._local(batch), label_smoothing=c.label_smoothing
                )
                loss = terms.loss_sum / max(total, 1)
                # DDP and FSDP average gradients over the processes; the loss sums over them
                (loss * world if world > 1 else loss).backward()
            loss_value += loss.item()
        grad_norm = clip_gradients(self.model, c.clip_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        if world > 1:
            loss_value = all_reduce_sum([loss_value], self.dist)[0]
        return loss_value, sum(self.objective.n_tokens(b) for b in micro), grad_norm

    @torch.no_grad()
    def evaluate(self, n_batches: int | None = None) -> dict[str, float]:
        """Mean validation loss (no label smoothing) and accuracy over fixed batches (each
        process evaluates its slice of every batch; the sums are reduced over them)."""
        c = self.config
        was_training = self.module.training
        self.module.eval()
        generator = torch.Generator().manual_seed(c.seed + EVAL_SEED_OFFSET)
        loss_sum, count, correct = 0.0, 0, 0
        for _ in range(n_batches or c.eval_batches):
            batch = self._local(self.objective.batch("val", c.batch_size, generator))
            terms = self.objective.loss(self.module, batch, label_smoothing=0.0)
            loss_sum += float(terms.loss_sum)
            count += terms.count
            correct += terms.correct
        self.module.train(was_training)
        if self.dist.enabled:
            loss_sum, n, right = all_reduce_sum([loss_sum, count, correct], self.dist)
            count, correct = round(n), round(right)
        return {"val_loss": loss_sum / max(count, 1), "val_accuracy": correct / max(count, 1)}

    # -- checkpoints -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything but the weights that resuming needs: step, optimizer state (full, keyed by
        parameter name), scheduler, RNG states (data position, and every process's global RNG),
        early-stopping counters; plus the world size and config, for the record.

        Distributed: every process must call it (it gathers); rank 0's is complete.
        """
        rng = rng_state(self.generator)
        if self.dist.enabled:
            rng["torch_by_rank"] = all_gather_stack(torch.get_rng_state(), self.dist)
        if self.device.type == "cuda":
            rng["cuda_by_rank"] = all_gather_stack(torch.cuda.get_rng_state(self.device), self.dist)
        return {
            "step": self.step,
            "optimizer": full_optimizer_state_dict(self.model, self.optimizer),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng,
            "best_val_loss": self.best_val_loss,
            "evals_since_best": self.evals_since_best,
            "world_size": self.dist.world_size,
            "train_config": self.config.to_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (every process passes the whole state)."""
        load_full_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])
        self._load_rest(state)

    def _load_rest(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.scheduler.load_state_dict(state["scheduler"])
        rng, rank = state["rng"], self.dist.rank
        set_rng_state(rng, self.generator)
        by_rank = rng.get("torch_by_rank")
        if by_rank is not None and rank < len(by_rank):
            torch.set_rng_state(by_rank[rank].clone())
        elif rank > 0:  # more processes than the checkpoint's run had: fresh, derived streams
            torch.manual_seed(rank_seed(self.config.seed, rank, self.step))
        cuda = rng.get("cuda_by_rank")
        if self.device.type == "cuda" and cuda is not None and rank < len(cuda):
            torch.cuda.set_rng_state(cuda[rank].clone(), self.device)
        self.best_val_loss = float(state["best_val_loss"])
        self.evals_since_best = int(state["evals_since_best"])

    def save(self) -> Path:
        """Write a checkpoint of the current step to ``run_dir`` (rank 0 writes; in a
        distributed run every process must call it, and all return once it is complete).

        Raises:
            ValueError: without a ``run_dir``.
        """
        if self.run_dir is None:
            raise ValueError("Trainer was built without run_dir; nowhere to save")
        weights = full_model_state_dict(self.model) if self.dist.enabled else None
        state = self.state_dict()
        directory = checkpoint_path(self.run_dir, self.step)
        if self.dist.is_main:
            directory = save_training_checkpoint(
                self.run_dir, self.module, state, keep=self.config.keep_checkpoints,
                model_state=weights,
            )  # fmt: skip
        barrier(self.dist)
        return directory

    def resume(self) -> bool:
        """Load the newest checkpoint of ``run_dir`` if there is one; returns whether it did.

        Distributed: rank 0 reads it and broadcasts it (weights and optimizer state re-sharded
        for FSDP), so the checkpoint may come from any number of processes.
        """
        found = None
        if self.dist.is_main and self.run_dir is not None:
            # temporary files of writes a kill interrupted (never used: nothing else writes here)
            remove_stale_temp_files(self.run_dir / CHECKPOINTS_DIR)
            remove_stale_temp_files(self.run_dir, recursive=False)
            found = latest_checkpoint(self.run_dir)
        if not any_rank(found is not None, self.dist):
            return False
        weights: dict[str, Any] | None = None
        state: dict[str, Any] = {}
        if found is not None:
            state = read_training_state(found)
            weights = with_tied_names(load_file(found / WEIGHTS_NAME), self.module)
        optimizer = state.pop("optimizer", None)
        load_full_state(self.model, self.optimizer, weights, optimizer, self.dist)
        self._load_rest(broadcast_state(state, self.dist))
        return True

    def _write_config(self) -> None:
        if self.run_dir is None:
            raise ValueError("the trainer has no run directory to write its config to")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        data = {"train": self.config.to_dict(), **self.extra_config}
        atomic_write_text(self.run_dir / "train_config.json", json.dumps(data, indent=2) + "\n")

    # -- the loop --------------------------------------------------------------------------

    def fit(self, *, resume: bool = False, until: int | None = None) -> FitResult:
        """Train to ``config.steps`` (or to step ``until``, checkpointing there: an interrupted
        run), evaluating, logging and checkpointing on the way.

        Args:
            resume: first load the newest checkpoint of ``run_dir`` (no checkpoint: start fresh).
        """
        c, main = self.config, self.dist.is_main
        if self.step == 0:  # a fresh run; a resumed or continued one keeps its RNG state
            torch.manual_seed(rank_seed(c.seed, self.dist.rank))
        was_deterministic = torch.are_deterministic_algorithms_enabled()
        warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        if c.deterministic:  # restored when fit returns
            torch.use_deterministic_algorithms(True, warn_only=True)
        resumed = resume and self.resume()
        log = None
        if self.run_dir is not None and main:  # only rank 0 writes files
            self._write_config()
            log = MetricsLogger(
                self.run_dir, tensorboard=c.tensorboard, resume_step=self.step if resumed else None
            )
        end = min(c.steps, until) if until is not None else c.steps
        deadline = None if c.max_minutes is None else time.monotonic() + 60 * c.max_minutes
        result = FitResult(step=self.step)
        start = last_log = time.monotonic()
        tokens_since_log, saved_step = 0, -1
        bar = tqdm(
            total=end,
            initial=self.step,
            desc="train",
            unit="step",
            disable=not (c.progress and main),
        )
        try:
            while self.step < end:
                lr = self.optimizer.param_groups[0]["lr"]
                loss, tokens, grad_norm = self.train_step()
                result.losses.append(loss)
                tokens_since_log += tokens
                bar.update(1)
                if self.step % c.log_every == 0 or self.step == end:
                    now = time.monotonic()
                    tok_s = tokens_since_log / max(now - last_log, 1e-9)
                    last_log, tokens_since_log = now, 0
                    bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tok_s:.0f}")
                    if log is not None:
                        log.log({"step": self.step, "train_loss": loss, "lr": lr,
                                 "grad_norm": grad_norm, "tokens_per_s": tok_s,
                                 "elapsed_s": now - start})  # fmt: skip
                # every process must take the same branch, so "timed out" is decided together
                timed_out = deadline is not None and any_rank(
                    time.monotonic() > deadline, self.dist
                )
                eval_now = (c.eval_every and self.step % c.eval_every == 0) or self.step == c.steps
                if eval_now and self._evaluate(result, log):
                    result.stopped_early = True
                if (
                    self.run_dir is not None
                    and c.checkpoint_every
                    and self.step % c.checkpoint_every == 0
                ):
                    result.checkpoint, saved_step = self.save(), self.step
                if result.stopped_early or timed_out:
                    result.stopped_early = True
                    break
        finally:
            bar.close()
            if log is not None:
                log.close()
            torch.use_deterministic_algorithms(was_deterministic, warn_only=warn_only)
        if self.run_dir is not None and saved_step != self.step:
            result.checkpoint = self.save()
        result.step, result.best_val_loss = self.step, self.best_val_loss
        result.seconds = time.monotonic() - start
        return result

    def _evaluate(self, result: FitResult, log: MetricsLogger | None) -> bool:
        """Evaluate, log, track the best; returns whether early stopping triggers."""
        metrics = self.evaluate()
        result.evals.append({"step": self.step, **metrics})
        if log is not None:
            log.log({"step": self.step, **metrics})
        if metrics["val_loss"] < self.best_val_loss:
            self.best_val_loss, self.evals_since_best = metrics["val_loss"], 0
        else:
            self.evals_since_best += 1
        patience = self.config.early_stopping
        return patience is not None and self.evals_since_best >= patience


def clip_gradients(model: nn.Module, max_norm: float | None) -> float:
    """The global L2 norm of ``model``'s gradients, scaled down to ``max_norm`` when larger
    (``None``: measured only). Sharded (FSDP) gradients give the norm over all shards."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return 0.0
    if max_norm is None:
        grads = [p.grad for p in params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, 2.0, foreach=False)
    else:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=False)
    full = getattr(norm, "full_tensor", None)  # a DTensor under FSDP
    return float(full() if full is not None else norm)


__all__ = ["FitResult", "Trainer", "clip_gradients"]
