"""The trainer: the one training loop of attnlab, for every recipe.

One update (a *step*) draws ``grad_accum`` micro-batches from the objective's data stream,
normalises their summed losses by the total number of loss terms (so k micro-batches equal one
k-times batch exactly), clips the global gradient norm, steps the optimizer and the schedule.
Evaluation runs every ``eval_every`` steps and when the run stops, on the objective's fixed
validation batches, plus the metrics of the :class:`Callback` s (exact match, BLEU, ...); the best
``best_metric`` so far drives early stopping and, with ``save_best``, the ``best/`` model. The
run stops at the first budget reached (``steps``, ``max_minutes`` of training time summed over
sessions, ``max_epochs``). Checkpoints (:mod:`attnlab.training.rundir`) are written every
``checkpoint_every`` steps / ``checkpoint_every_minutes`` and at the end; with
``average_last`` the last checkpoints are averaged into ``averaged/`` (§6.1) and evaluated.

Determinism on CPU: the data stream (its position), torch's global RNG (dropout) and Python's
are seeded from ``config.seed``; a checkpoint stores them with the optimizer and scheduler
states, so ``fit(resume=True)`` continues bitwise as the uninterrupted run would. A resume uses
the newest checkpoint that loads, falling back to older ones (with a warning) when one is
damaged (never past one a newer attnlab wrote: that is refused), and never starts over in a
directory that has checkpoints. The run directory is owned (locked) by rank 0 while ``fit``
runs (:mod:`attnlab.training.runlock`): a second writer is refused. A non-finite training loss
stops the run with :class:`NonFiniteLossError` before anything is written.

Interrupted runs (SIGINT, i.e. Ctrl-C, or SIGTERM) in a single process: ``fit`` finishes the
current step (its logging, due evaluation and due checkpoint: the step boundary), writes a
checkpoint there (atomic, like every checkpoint) and raises :class:`TrainingInterrupted` (a
``KeyboardInterrupt``) naming the step and the checkpoint; a resume from it continues bitwise as
the uninterrupted run would, and ``metrics.jsonl`` holds nothing past its step. A second signal
aborts at once (``KeyboardInterrupt``): the checkpoint being written is removed and ``latest``
still names the previous one. This checkpoint is kept beside ``keep_checkpoints`` and removed
when the run writes its next one, so a resumed run ends with the uninterrupted run's
checkpoints. Only while the training loop runs, in the main thread, and where the signals have
Python's default handlers; under torchrun the signals keep their default behaviour (the
launcher forwards a Ctrl-C to every process, often twice, and a process that left a collective
would hang the others): the run stops without a checkpoint and resumes from its last one.

Mixture-of-experts models (:mod:`attnlab.training.moe`): the objective's ``aux_loss`` (the
routers' balancing and z-losses) is added to the training loss (the logged ``loss`` stays the
task's; ``aux_loss`` is logged beside it), each train line gets the step's expert load and
dropped fraction, and aux-loss-free router biases are updated after each optimizer step.

Distributed (under torchrun, :mod:`attnlab.training.distributed`): the trainer wraps the model
(DDP, or FSDP2 with ``config.fsdp``), every process draws the same global micro-batches and
computes its slice, losses and evaluation metrics are summed over the processes, only rank 0
logs and writes checkpoints, and every process resumes from them. The checkpoint format is the
same for any number of processes (full weights, optimizer state keyed by parameter name).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, cast

import torch
from torch import nn

from attnlab.allocator import release_freed_memory, retain_freed_memory
from attnlab.data.batches import shard_batch
from attnlab.training.checkpointing import TrainerCheckpoints
from attnlab.training.config import TrainConfig
from attnlab.training.distributed import (
    DistributedContext,
    all_reduce_sum,
    any_rank,
    current_context,
    gradient_sync,
    move_to,
    parallelize,
    rank_seed,
    unwrap_model,
)
from attnlab.training.hardware import Precision, compile_warm_up, resolve_device
from attnlab.training.metrics import MetricsLogger
from attnlab.training.moe import MoEStepStats
from attnlab.training.objectives import Objective
from attnlab.training.optim import build_optimizer, build_scheduler, describe_optimizer
from attnlab.training.progress import Progress
from attnlab.training.rundir import RunDir
from attnlab.training.runlock import RunLock, RunOwnedError, acquire
from attnlab.training.schedules import warmup_size
from attnlab.transforms.activation_checkpointing import checkpoint_blocks, checkpointed_blocks
from attnlab.transforms.compile import compile_model

logger = logging.getLogger(__name__)


class NonFiniteLossError(ValueError):
    """The training loss became NaN or infinite; nothing of that step was saved."""


class TrainingInterrupted(KeyboardInterrupt):
    """:meth:`Trainer.fit` stopped by SIGINT or SIGTERM at a step boundary, after saving.

    A ``KeyboardInterrupt``: code that handles Ctrl-C keeps working (and ``except Exception``
    does not swallow it).

    Attributes:
        step: the step the run stopped after (the checkpoint's).
        checkpoint: the checkpoint directory that resumes it (``None`` without a run directory).
        signal_name: ``"SIGINT"`` or ``"SIGTERM"``.
        result: what ``fit`` did until then (:class:`FitResult`, ``stopped_by`` ``None``).
    """

    def __init__(
        self, step: int, checkpoint: Path | None, signal_name: str, result: FitResult
    ) -> None:
        where = f"; checkpoint {checkpoint}" if checkpoint is not None else ""
        super().__init__(f"{signal_name}: stopped after step {step}{where}")
        self.step, self.checkpoint, self.signal_name = step, checkpoint, signal_name
        self.result = result


class _InterruptGuard:
    """While entered (when ``enabled``): the first SIGINT or SIGTERM is only recorded
    (:attr:`signal_name`), for the loop to stop at the next step boundary; a second raises
    ``KeyboardInterrupt`` at once. Signals whose handler is not Python's default (the user's
    own, or ignored) are left alone; the previous handlers come back on exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.signal_name is not None:  # the second: stop now, saving nothing more
            raise KeyboardInterrupt(f"{name} again: aborted")
        self.signal_name = name
        logger.warning(
            "%s: the run stops after the step under way, with a checkpoint there (send it again "
            "to stop at once, without that checkpoint)",
            name,
        )

    def __enter__(self) -> _InterruptGuard:
        if self.enabled:
            for sig in self.SIGNALS:
                current = signal.getsignal(sig)
                if current is signal.default_int_handler or current == signal.SIG_DFL:
                    self._previous[sig] = current
                    signal.signal(sig, self._handle)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()


class Callback:
    """Extra evaluation of a recipe (override what you need).

    Attributes:
        names: the metrics :meth:`metrics` returns (without ``val_``), when known up front: a
            ``best_metric`` that no part of the evaluation measures is then refused before
            training instead of at the first evaluation. ``None``: not declared.
    """

    names: tuple[str, ...] | None = None

    def metrics(
        self, trainer: Trainer, model: nn.Module, base: dict[str, float]
    ) -> dict[str, float]:
        """Validation metrics of ``model`` besides ``base`` (``val_loss``, ``val_accuracy``);
        names without the ``val_`` prefix."""
        return {}


@dataclass
class FitResult:
    """What :meth:`Trainer.fit` did.

    Attributes:
        step: optimizer updates done in total (resumed ones included).
        losses: training loss per step of this call. evals: this call's evaluations.
        stopped_by: the budget that ended the run (``"steps"``, ``"minutes"``, ``"epochs"``),
            ``"early_stopping"``, or ``None`` (interrupted with ``until``, or by a signal:
            :attr:`TrainingInterrupted.result`).
        seconds: this call's wall time. elapsed_s: training time in total.
        final: evaluations of the models made at the end (``"averaged"``).
        compile_s: seconds ``torch.compile`` took before the first step (``config.compile``;
            in ``seconds`` and ``elapsed_s``, not in the step times).
        setup: how the run computed (:meth:`Trainer.setup_info`: device, precision, the
            optimizer's implementation, compile, checkpointed blocks).
    """

    step: int
    losses: list[float] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    best_value: float | None = None
    best_step: int | None = None
    stopped_by: str | None = None
    seconds: float = 0.0
    elapsed_s: float = 0.0
    checkpoint: Path | None = None
    final: dict[str, dict[str, float]] = field(default_factory=dict)
    compile_s: float | None = None
    setup: dict[str, Any] = field(default_factory=dict)

    @property
    def stopped_early(self) -> bool:
        """Whether the run ended before its step budget."""
        return self.stopped_by not in ("steps", None)


class Trainer:
    """Train ``model`` on ``objective`` with ``config``.

    Args:
        model: any module the objective knows how to call; build it under your seed.
        objective: :class:`~attnlab.training.objectives.Objective` (data stream + summed loss).
        config: the :class:`TrainConfig`.
        run_dir: where ``metrics.jsonl``, checkpoints and exports go; ``None`` writes nothing.
        callbacks: extra evaluation metrics (:class:`Callback`).
        d_model: the width the Noam schedule needs (default ``model.config.d_model``).
        distributed: the processes to train over (default: the initialised process group's,
            :func:`~attnlab.training.distributed.current_context`; a single process if none).

    Raises:
        ValueError: if the world size does not divide ``config.batch_size``, or Noam without a
            ``d_model``.
    """

    def __init__(
        self,
        model: nn.Module,
        objective: Objective,
        config: TrainConfig,
        *,
        run_dir: str | os.PathLike[str] | RunDir | None = None,
        callbacks: Sequence[Callback] = (),
        d_model: int | None = None,
        distributed: DistributedContext | None = None,
    ) -> None:
        self.dist = distributed if distributed is not None else current_context()
        config.per_rank_batch_size(self.dist.world_size)  # raises early if not divisible
        self.objective, self.config, self.callbacks = objective, config, list(callbacks)
        self.run = run_dir if isinstance(run_dir, RunDir) or run_dir is None else RunDir(run_dir)
        if d_model is None:
            d_model = getattr(getattr(unwrap_model(model), "config", None), "d_model", None)
        if config.schedule == "noam" and d_model is None:
            raise ValueError("schedule='noam' needs d_model (the model has no config.d_model)")
        # device, precision, checkpointing (attnlab.training.hardware, attnlab.transforms)
        process = self.dist.device if self.dist.enabled else None
        self.device = resolve_device(config.device, unwrap_model(model), process)
        self.precision = Precision(config.precision, self.device)
        model = self.precision.prepare_model(model.to(self.device))
        if config.activation_checkpointing:
            checkpoint_blocks(unwrap_model(model), config.activation_checkpointing)
        # the module trained (compiled, a DDP wrapper, a sharded model, or model itself), the
        # one wrapped for data parallelism, and the user's
        self.wrapped = parallelize(model, self.dist, fsdp=config.fsdp)
        self.model = compile_model(self.wrapped) if config.compile else self.wrapped
        self.module = unwrap_model(self.wrapped)
        self.compile_s: float | None = None  # measured by fit's compile warm-up
        self.step, self.elapsed, self.tokens = 0, 0.0, 0
        self.optimizer = build_optimizer(model, config)
        self.scheduler = build_scheduler(
            self.optimizer, config, d_model=d_model or 1, elapsed_s=lambda: self.elapsed
        )
        self.stream = objective.train_stream(config.batch_size, config.seed)
        self._check_warmups()
        self.best_value: float | None = None
        self.best_step: int | None = None
        self.evals_since_best = 0
        self.checkpoints = TrainerCheckpoints(self)
        self._resumed: bool | None = None  # what resume() found, before fit
        self.moe = MoEStepStats.of(self.module)  # mixture-of-experts statistics; None if dense
        self.last_aux_loss = 0.0
        self._val: list[Any] | None = None
        self._check_best_metric()

    def _check_best_metric(self) -> None:
        """Refuse a ``best_metric`` that the evaluation cannot measure (when every callback
        declares its names)."""
        declared = [cb.names for cb in self.callbacks]
        if any(names is None for names in declared):
            return
        known = ["val_loss", "val_accuracy"] + [f"val_{n}" for ns in declared for n in ns or ()]
        if self.config.best_metric not in known:
            raise ValueError(
                f"best_metric={self.config.best_metric!r} is not measured by this run; "
                f"choose one of {known}"
            )

    def _check_warmups(self) -> None:
        """Refuse a batch or sequence warmup that the objective cannot apply (it lists what
        its ``trim`` cuts in ``trimmable``)."""
        c = self.config
        asked = [n for n, on in (("rows", c.batch_warmup), ("length", c.seq_warmup)) if on]
        can = getattr(self.objective, "trimmable", ())
        missing = [n for n in asked if n not in can]
        if missing:
            field = {"rows": "batch_warmup", "length": "seq_warmup"}
            raise ValueError(
                f"{', '.join(field[n] for n in missing)} cannot apply to "
                f"{type(self.objective).__name__} (its batches cannot be cut that way); the "
                "warmups apply to causal and masked language modelling (batch_warmup also to "
                "image classification)"
            )
        world = self.dist.world_size
        if c.batch_warmup and (c.batch_warmup_start % world or c.batch_warmup_multiple % world):
            raise ValueError(
                f"batch_warmup_start={c.batch_warmup_start} and batch_warmup_multiple="
                f"{c.batch_warmup_multiple} must be multiples of the {world} processes (so "
                "every warmup batch splits evenly and equals a single process's); e.g. "
                f"batch_warmup_start={world * max(1, c.batch_warmup_start // world)} "
                f"batch_warmup_multiple={world}"
            )

    def warmup_shape(self, step: int, length: int) -> tuple[int | None, int | None]:
        """The examples and positions that update ``step`` (0-based) uses of a micro-batch of
        sequences of ``length`` positions, under the batch and sequence warmups (``None``: all;
        :func:`~attnlab.training.schedules.warmup_size`). They do not depend on the number of
        processes; each computes its equal share of the rows."""
        c = self.config
        rows = cut = None
        if step < c.batch_warmup:
            rows = warmup_size(step, start=c.batch_warmup_start, full=c.batch_size,
                               steps=c.batch_warmup, multiple=c.batch_warmup_multiple)  # fmt: skip
        if step < c.seq_warmup:
            cut = warmup_size(step, start=min(c.seq_warmup_start, length), full=length,
                              steps=c.seq_warmup, multiple=c.seq_warmup_multiple)  # fmt: skip
        return rows, cut

    def _trim(self, batch: Any) -> Any:
        """``batch`` cut to this update's warmup shape (unchanged once the warmups end)."""
        length = int(batch[0].shape[1]) if batch[0].dim() > 1 else 1
        rows, cut = self.warmup_shape(self.step, length)
        if rows is None and cut is None:
            return batch
        return cast(Any, self.objective).trim(batch, rows, cut)

    # -- one update ------------------------------------------------------------------------

    def _local(self, batch: Any) -> Any:
        """This process's slice of a global batch, on its device (floats in the weights'
        dtype under pure bf16)."""
        local = shard_batch(batch, self.dist.rank, self.dist.world_size)
        return self.precision.batch(move_to(local, self.device))

    def setup_info(self) -> dict[str, Any]:
        """How this run computes: device, precision, optimizer implementation, compile and
        activation checkpointing (recorded in ``run.json``'s sessions and printed)."""
        return {
            "device": str(self.device),
            "precision": self.precision.name,
            "optimizer": describe_optimizer(self.optimizer),
            "compile": self.config.compile,
            "checkpointed_blocks": checkpointed_blocks(self.module),
        }

    def train_step(self) -> tuple[float, int, float]:
        """One optimizer update; returns ``(loss, tokens, grad norm before clipping)``, all
        over the whole global batch (summed over the processes).

        Raises:
            NonFiniteLossError: when the loss is NaN or infinite (the update is not applied).
        """
        c, world = self.config, self.dist.world_size
        self.model.train()
        # every process draws the same global micro-batches, so counts are global for free
        micro = [self.stream.next_batch() for _ in range(c.grad_accum)]
        if c.batch_warmup or c.seq_warmup:  # the same draws, cut (so resume stays exact)
            micro = [self._trim(b) for b in micro]
        total = sum(self.objective.count(b) for b in micro)
        self.optimizer.zero_grad(set_to_none=True)
        loss_value, aux_value = 0.0, 0.0
        if self.moe is not None:
            self.moe.reset()
        for i, batch in enumerate(micro):
            with gradient_sync(self.wrapped, i == len(micro) - 1):
                with self.precision.autocast():
                    terms = self.objective.loss(
                        self.model, self._local(batch), label_smoothing=c.label_smoothing
                    )
                    loss = terms.loss_sum / max(total, 1)
                    objective = loss
                    if terms.aux_loss is not None:  # a mean, weighted by this batch's share
                        aux = terms.aux_loss * (terms.count / max(total, 1))
                        objective = loss + aux
                        aux_value += float(aux.detach())
                # DDP and FSDP average gradients over the processes; the loss sums over them
                self.precision.scale(objective * world if world > 1 else objective).backward()
            loss_value += loss.item()
            if self.moe is not None:
                self.moe.add()
        if world > 1:
            loss_value, aux_value = all_reduce_sum([loss_value, aux_value], self.dist)
        self.last_aux_loss = aux_value
        if not math.isfinite(loss_value + aux_value):
            aux_note = f" (+ auxiliary {aux_value})" if aux_value else ""
            raise NonFiniteLossError(
                f"the training loss is {loss_value}{aux_note} at step {self.step + 1}; stopped "
                "before applying it (nothing of this step was saved). Lower lr, enable clipping "
                "(clip_grad_norm) or warmup, or check the data and init_std"
                + ("; under fp16-mixed the forward may overflow float16's range (65504): try "
                   "bf16-mixed" if self.precision.name == "fp16-mixed" else "")
            )  # fmt: skip
        self.precision.unscale(self.optimizer)  # fp16: true gradients before clipping
        grad_norm = clip_gradients(self.model, c.clip_grad_norm)
        stepped = self.precision.step(self.optimizer)  # fp16: skipped if gradients overflowed
        self.scheduler.step()
        if self.moe is not None and stepped:  # aux-loss-free balancing: biases follow the load
            self.moe.after_step(self.module, self.dist)
        self.step += 1
        return loss_value, sum(self.objective.n_tokens(b) for b in micro), grad_norm

    def _train_extras(self) -> dict[str, Any]:
        """The last step's figures beyond the loss: fp16's loss scale and skipped steps, the
        auxiliary loss added to it, and the mixture-of-experts statistics
        (:meth:`~attnlab.training.moe.MoEStepStats.fields`)."""
        out: dict[str, Any] = {}
        if self.precision.scaler is not None:
            out = {"loss_scale": self.precision.loss_scale, "skipped_steps": self.precision.skipped}
        if self.moe is None:
            return out
        return {**out, "aux_loss": self.last_aux_loss, **self.moe.fields(self.dist)}

    # -- evaluation ------------------------------------------------------------------------

    def val_batches(self) -> list[Any]:
        """The objective's fixed validation batches (drawn once, kept)."""
        if self._val is None:
            c = self.config
            self._val = self.objective.val_batches(c.batch_size, c.eval_batches, c.seed)
        return self._val

    @torch.no_grad()
    def evaluate(
        self, n_batches: int | None = None, *, model: nn.Module | None = None
    ) -> dict[str, float]:
        """``val_loss`` (no label smoothing), ``val_accuracy`` and the callbacks' metrics of
        ``model`` (default: the model trained), each process on its slice of every batch."""
        module = self.module if model is None else model
        was_training = module.training
        module.eval()
        loss_sum, count, correct = 0.0, 0, 0
        batches = self.val_batches()
        with self.precision.autocast():  # evaluation computes as training does (eager)
            for batch in batches[:n_batches] if n_batches is not None else batches:
                terms = self.objective.loss(module, self._local(batch), label_smoothing=0.0)
                loss_sum += float(terms.loss_sum)
                count += terms.count
                correct += terms.correct
            if self.dist.enabled:
                loss_sum, n, right = all_reduce_sum([loss_sum, count, correct], self.dist)
                count, correct = round(n), round(right)
            out = {"val_loss": loss_sum / max(count, 1), "val_accuracy": correct / max(count, 1)}
            for callback in self.callbacks:
                extra = callback.metrics(self, module, dict(out))
                out.update({f"val_{k}": v for k, v in extra.items()})
        module.train(was_training)
        return out

    def _compile_warm_up(self) -> float:
        """Compile the forward and backward on the first validation batch
        (:func:`~attnlab.training.hardware.compile_warm_up`); returns its seconds."""

        def loss() -> torch.Tensor:
            batch = self._local(self.val_batches()[0])
            return self.objective.loss(self.model, batch, label_smoothing=0.0).loss_sum

        return compile_warm_up(self.model, self.module, loss, self.precision, self.optimizer)

    def _evaluate(self, result: FitResult, log: MetricsLogger | None) -> bool:
        """Evaluate, log, track the best (exporting it); returns whether early stopping fires."""
        began = time.monotonic()
        metrics = self.evaluate()
        result.evals.append({"step": self.step, **metrics})
        if log is not None:
            took = round(time.monotonic() - began, 3)
            log.log(_record("val", self.step, self.elapsed, {**metrics, "eval_s": took}))
        c = self.config
        value = metrics.get(c.best_metric)
        if value is None:
            raise ValueError(f"best_metric={c.best_metric!r} is not measured; have {list(metrics)}")
        better = self.best_value is None or (
            value < self.best_value if c.best_mode == "min" else value > self.best_value
        )
        if better:
            self.best_value, self.best_step, self.evals_since_best = value, self.step, 0
            if c.save_best:
                self.checkpoints.export("best", self.module, metrics)
        else:
            self.evals_since_best += 1
        return c.early_stopping is not None and self.evals_since_best >= c.early_stopping

    # -- checkpoints (attnlab.training.checkpointing) -------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything but the weights that resuming needs (see :class:`TrainerCheckpoints`)."""
        return self.checkpoints.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.checkpoints.load_state_dict(state)

    def save(self) -> Path:
        """Write a checkpoint of the current step to the run directory."""
        return self.checkpoints.save()

    def resume(self) -> bool:
        """Load the newest checkpoint that loads; returns whether one was loaded. A later
        ``fit(resume=True)`` continues from it without loading again (so a caller can refuse
        a run, or record its session, between the two)."""
        self._resumed = self.checkpoints.resume()
        return self._resumed

    # -- the loop --------------------------------------------------------------------------

    def _budget_hit(self) -> str | None:
        c = self.config
        if c.steps is not None and self.step >= c.steps:
            return "steps"
        # every process must take the same branch, so "timed out" is decided together
        timed = c.max_minutes is not None and self.elapsed >= 60 * c.max_minutes
        if any_rank(timed, self.dist):
            return "minutes"
        epoch = self.stream.epoch
        if c.max_epochs is not None and epoch is not None and epoch >= c.max_epochs:
            return "epochs"
        # a run resumed from the checkpoint of the step where early stopping fired (an
        # interrupt there skips the end-of-run work) ends as the uninterrupted run did
        if c.early_stopping is not None and self.evals_since_best >= c.early_stopping:
            return "early_stopping"
        return None

    def fit(self, *, resume: bool = False, until: int | None = None) -> FitResult:
        """Train until a budget is reached (or until step ``until``, checkpointing there: an
        interrupted run), evaluating, logging and checkpointing on the way.

        Args:
            resume: first load the newest checkpoint of the run directory that loads (none
                yet: start fresh; damaged ones are skipped with a warning).

        Raises:
            TrainingInterrupted: on SIGINT or SIGTERM in a single process, after the step
                under way finished and its checkpoint was written (see the module docstring);
                a second signal raises ``KeyboardInterrupt`` at once, saving nothing more.
            NonFiniteLossError: when the loss becomes NaN or infinite.
            RunOwnedError: when another process owns (writes) the run directory.
            RunDirError: when resuming a directory whose checkpoints all fail to load.
            NewerVersionError: when resuming from a checkpoint of a newer attnlab.
        """
        c, main = self.config, self.dist.is_main
        if c.max_epochs is not None and self.stream.epoch is None:
            raise ValueError("max_epochs needs a recipe whose data has epochs; use steps")
        # a fresh run; a resumed or continued one keeps its RNG state. Other processes always
        # re-seed: their dropout must differ from rank 0's.
        if self.step == 0 and (c.reseed_dropout or self.dist.rank > 0):
            torch.manual_seed(rank_seed(c.seed, self.dist.rank))
        was_deterministic = torch.are_deterministic_algorithms_enabled()
        warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        if c.deterministic:  # restored when fit returns
            torch.use_deterministic_algorithms(True, warn_only=True)
        # the steps reuse the pages their predecessors freed (attnlab.allocator); what is kept
        # free goes back to the system when fit returns
        retained = c.retain_cpu_memory and self.device.type == "cpu" and retain_freed_memory()
        owner, log = None, None
        try:
            owner = self._own_run()  # before anything of the run is read or written
            resumed = resume and (self._resumed if self._resumed is not None else self.resume())
            if self.run is not None and main:  # only rank 0 writes files
                log = MetricsLogger(self.run.path, tensorboard=c.tensorboard,
                                    resume_step=self.step if resumed else None)  # fmt: skip
            result = FitResult(step=self.step)
            self._loop(result, log, until)
        finally:
            if log is not None:
                log.close()
            if owner is not None:
                owner.release()
            torch.use_deterministic_algorithms(was_deterministic, warn_only=warn_only)
            if retained:
                release_freed_memory()
        result.step, result.elapsed_s = self.step, self.elapsed
        result.best_value, result.best_step = self.best_value, self.best_step
        result.compile_s, result.setup = self.compile_s, self.setup_info()
        return result

    def _catches_signals(self) -> bool:
        """Whether ``fit`` stops at a step boundary on SIGINT/SIGTERM: a single process (see
        the module docstring on torchrun) in the main thread (the only one signals reach)."""
        return not self.dist.enabled and threading.current_thread() is threading.main_thread()

    def _own_run(self) -> RunLock | None:
        """Rank 0 owns the run directory for the session (:mod:`attnlab.training.runlock`;
        re-entrant: ``train_recipe`` took it already); every process learns together whether
        it was refused, so that none waits in a collective for a rank that stopped."""
        lock, refused = None, None
        if self.run is None:
            return None
        if self.dist.is_main:
            try:
                lock = acquire(self.run.path)
            except RunOwnedError as e:
                refused = e
        if any_rank(refused is not None, self.dist):
            raise refused or RunOwnedError(f"{self.run.path} is owned by another process")
        return lock

    def _loop(self, result: FitResult, log: MetricsLogger | None, until: int | None) -> None:
        c, start = self.config, time.monotonic()
        base, saved_step, saved_at = self.elapsed, -1, self.elapsed
        stopped = self._budget_hit()
        progress = Progress(c, self.stream, initial_step=self.step, initial_s=self.elapsed,
                            enabled=c.progress and self.dist.is_main)  # fmt: skip
        compiled_now = c.compile and self.compile_s is None and stopped is None
        if compiled_now:  # before the clock of the step times starts
            self.compile_s = self._compile_warm_up()
        last_log, tokens_since_log = time.monotonic(), 0
        with progress, _InterruptGuard(self._catches_signals()) as interrupt:
            while stopped is None and (until is None or self.step < until):
                lr = self.optimizer.param_groups[0]["lr"]
                loss, tokens, grad_norm = self.train_step()
                self.elapsed, self.tokens = base + time.monotonic() - start, self.tokens + tokens
                result.losses.append(loss)
                tokens_since_log += tokens
                progress.update(self.step, self.elapsed, loss=loss, lr=lr)
                stopped = self._budget_hit()
                if self.step % c.log_every == 0 or stopped is not None or self.step == until:
                    now = time.monotonic()
                    tok_s = tokens_since_log / max(now - last_log, 1e-9)
                    last_log, tokens_since_log = now, 0
                    extra = self._train_extras()  # every process: they are summed over them
                    if compiled_now:  # the first record of a session that compiled
                        extra["compile_s"], compiled_now = round(self.compile_s or 0.0, 3), False
                    if log is not None:
                        log.log(_record("train", self.step, self.elapsed, {
                            "loss": loss, "lr": lr, "tokens": self.tokens,
                            "grad_norm": grad_norm if math.isfinite(grad_norm) else None,
                            "tokens_per_s": tok_s, "epoch": self.stream.epoch,
                            **extra}))  # fmt: skip
                if (c.eval_every and self.step % c.eval_every == 0) or stopped is not None:
                    if self._evaluate(result, log):
                        stopped = "early_stopping"
                    self.elapsed = base + time.monotonic() - start
                minutes = c.checkpoint_every_minutes
                due = (c.checkpoint_every and self.step % c.checkpoint_every == 0) or (
                    minutes is not None and self.elapsed - saved_at >= 60 * minutes
                )
                if self.run is not None and due and stopped is None:
                    result.checkpoint, saved_step = self.checkpoints.save(), self.step
                    saved_at = self.elapsed
                if interrupt.signal_name is not None:  # the step boundary: stop here
                    break
            result.stopped_by, result.seconds = stopped, time.monotonic() - start
            # still guarded: a second signal aborts this save (the checkpoint is atomic)
            off_schedule = interrupt.signal_name is not None and stopped is None
            if self.run is not None and saved_step != self.step:
                result.checkpoint = self.checkpoints.save(interrupted=off_schedule)
            if interrupt.signal_name is not None:  # the end-of-run work is left to a resume
                result.stopped_by, result.step, result.elapsed_s = None, self.step, self.elapsed
                raise TrainingInterrupted(
                    self.step, result.checkpoint, interrupt.signal_name, result
                )
        if stopped is not None:
            last = {k: v for k, v in (result.evals[-1] if result.evals else {}).items()}
            last.pop("step", None)
            result.final = self.checkpoints.finish(log, last)


def _record(split: str, step: int, elapsed: float, values: dict[str, Any]) -> dict[str, Any]:
    """A metrics line (``val_`` prefixes dropped, ``None`` values left out)."""
    body = {k.removeprefix("val_"): v for k, v in values.items() if v is not None}
    return {"split": split, "step": step, **body, "elapsed_s": round(elapsed, 3)}


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


__all__ = [
    "Callback",
    "FitResult",
    "NonFiniteLossError",
    "Trainer",
    "TrainingInterrupted",
    "clip_gradients",
]
