"""``TrainConfig``: the optimisation settings of :class:`attnlab.training.Trainer`.

Separate from the model configs (a model config says *what* is trained, this says *how*). The
defaults are the paper's recipe where it gives one (§5.3: Adam β = (0.9, 0.98), ε = 1e-9, the
eq. (3) schedule with 4000 warmup steps; §5.4: label smoothing 0.1); the recipes in
:mod:`attnlab.training.recipes` override them (e.g. AdamW + warmup/cosine for the GPT recipe).

Like the model configs it is a frozen, keyword-only :class:`~attnlab.config.Config`: every field
is type-checked (floats finite), then :meth:`TrainConfig.validate` checks ranges; it serialises
with :meth:`~attnlab.config.Config.to_dict` and loads with ``from_dict``, which rejects unknown
keys.

Budgets: a run stops at the first of ``steps`` (optimizer updates in total), ``max_minutes``
(training wall time in total, evaluation included, summed over resumed sessions) and
``max_epochs`` (passes over the data, for recipes whose data has epochs); at least one is set.
With ``schedule_clock="time"`` the cosine or WSD schedule follows the further along of its two
clocks (updates over ``steps``, training time over ``max_minutes``), so a time-budgeted run whose
steps turned out slower than planned still reaches the end of its decay when the clock stops it.

Deviations from the paper: ``lr`` multiplies the Noam schedule (1.0 is eq. (3) exactly); weight
decay, accumulation, clipping, early stopping and checkpoint averaging options are modern
additions (averaging is §6.1's, as an option).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from attnlab.config import Config, check_positive, check_probability, check_seed

ScheduleName = Literal["noam", "cosine", "wsd", "constant"]
WsdDecay = Literal["linear", "sqrt", "cosine"]
ScheduleClock = Literal["steps", "time"]
OptimizerName = Literal["adam", "adamw", "sgd", "muon"]
OptimizerImpl = Literal["auto", "fused", "foreach", "for-loop"]
PrecisionName = Literal["fp32", "bf16-mixed", "fp16-mixed", "bf16"]
DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


@dataclass(frozen=True, kw_only=True)
class TrainConfig(Config):
    """How to train: budget, batches, optimizer, schedule, regularisation, evaluation, files.

    A step is one optimizer update over ``grad_accum`` micro-batches of ``batch_size`` examples
    each (so ``batch_size * grad_accum`` examples per update; recipes whose batches are sized in
    tokens, like translation, say so).

    Under ``torchrun`` (:mod:`attnlab.training.distributed`) these stay the *global* numbers:
    each of the N processes computes ``batch_size / N`` examples of every micro-batch (so N must
    divide ``batch_size``), and one update still sees ``batch_size * grad_accum`` examples.
    """

    # -- budget and batches
    steps: int | None = 1000  # optimizer updates in total (None: another budget decides)
    max_minutes: float | None = None  # training time in total, over resumed sessions too
    max_epochs: int | None = None  # passes over the data (recipes with epochs)
    batch_size: int = 32  # examples per micro-batch
    grad_accum: int = 1  # micro-batches per update
    # -- optimizer (§5.3 defaults)
    optimizer: OptimizerName = "adam"
    optimizer_impl: OptimizerImpl = "auto"  # auto: fused where it applies, else for-loop
    lr: float = 1.0  # peak rate; for "noam" a multiplier of eq. (3)
    betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    # muon (attnlab.training.muon): Muon for the hidden matrices at muon_lr, AdamW at lr (with
    # betas, adam_eps) for embeddings, the head, norms and biases; weight_decay for both
    muon_lr: float = 0.02
    muon_momentum: float = 0.95
    muon_ns_steps: int = 5  # Newton-Schulz iterations per update (5 in the speedrun)
    # the iteration's number format: bfloat16 is the speedrun's (GPUs), and several times
    # faster on CPUs with native bfloat16 products (AVX512-BF16, AMX); float32 elsewhere
    muon_ns_dtype: Literal["float32", "bfloat16"] = "float32"
    decay_norms_and_biases: bool = False  # by default biases and norm gains are not decayed
    decay_embeddings: bool = False  # nor embeddings (token, position, patch position tables)
    # -- schedule (attnlab.training.schedules)
    schedule: ScheduleName = "noam"
    warmup: int = 4000
    min_lr_ratio: float = 0.0  # cosine and wsd floor, as a fraction of lr
    decay_fraction: float = 0.2  # wsd: the last fraction of the steps decays
    wsd_decay: WsdDecay = "linear"  # wsd: the decay's shape (linear, sqrt: 1 - sqrt, cosine)
    # "time": cosine or wsd runs on whichever is further along, steps/steps or training time/
    # max_minutes, so a run that the clock stops early still ends decayed (time budgets)
    schedule_clock: ScheduleClock = "steps"
    # (wsd with wsd_decay="linear" is the "trapezoidal" schedule: linear warmup, flat, linear
    # cooldown; Xing et al. 2018, Zhai et al. 2022, the modded-nanogpt speedrun)
    # -- batch and sequence warmup (attnlab.training.schedules.warmup_size): the first
    # batch_warmup updates use the first b(step) examples of each micro-batch, growing linearly
    # from batch_warmup_start to batch_size in multiples of batch_warmup_multiple (under N
    # processes both must be multiples of N: the global batch does not depend on N); the first
    # seq_warmup updates the first L(step) positions of each sequence, from seq_warmup_start to
    # the full length in multiples of seq_warmup_multiple. 0: off (the default). Objectives
    # that can cut their batches only (causal and masked LM, images for the batch); the data
    # drawn is the same, so resume stays exact
    batch_warmup: int = 0
    batch_warmup_start: int = 1
    batch_warmup_multiple: int = 1
    seq_warmup: int = 0
    seq_warmup_start: int = 16
    seq_warmup_multiple: int = 8
    # -- regularisation
    label_smoothing: float = 0.1  # §5.4 ε_ls
    clip_grad_norm: float | None = None  # None: no clipping
    # -- evaluation, early stopping, the best model
    eval_every: int = 0  # steps between evaluations; 0: only at the end
    eval_batches: int = 10  # micro-batches per evaluation (recipes with a fixed val set: all)
    best_metric: str = "val_loss"  # what early stopping and best/ follow ("val_<name>")
    early_stopping: int | None = None  # stop after this many evaluations without a new best
    save_best: bool = False  # write the best model's directory to best/ when it improves
    export_last: bool = False  # at the end, write the last model's directory to last/
    # -- checkpoints, averaging and logging
    checkpoint_every: int = 0  # steps between checkpoints; 0: only at the end
    checkpoint_every_minutes: float | None = None  # also after this much training time
    keep_checkpoints: int = 2  # newest checkpoints kept on disk
    average_last: int = 0  # §6.1: at the end, average the last N checkpoints into averaged/
    log_every: int = 10  # steps between metrics.jsonl lines
    progress: bool = True  # tqdm bar with loss, lr and tokens/s
    tensorboard: bool = False  # also log through torch.utils.tensorboard (when installed)
    # -- hardware (attnlab.training.hardware; docs/training_hardware.md)
    device: str | None = None  # cpu, cuda, cuda:N, mps, auto; None: where the model is
    precision: PrecisionName = "fp32"  # -mixed: autocast, float32 weights and optimizer state
    compile: bool = False  # torch.compile the model trained (compile time reported apart)
    activation_checkpointing: int = 0  # recompute every k-th block in the backward; 0: off
    # on the CPU with glibc: fit keeps freed memory for the next step (attnlab.allocator;
    # the process's malloc setting, from then on) and returns it at the end; False: glibc's own
    retain_cpu_memory: bool = True
    # -- distributed (under torchrun with 2+ processes; a single process warns, the CLI refuses)
    fsdp: bool = False  # shard parameters, gradients and optimizer state (FSDP2); else DDP
    # -- reproducibility
    seed: int = 0  # seeds data order, masking and dropout
    # a fresh run re-seeds torch's RNG (dropout) with seed; False: dropout draws continue from
    # the state the model's initialisation (under seed) left, as attnlab 0.1's translation did
    reseed_dropout: bool = True
    deterministic: bool = True  # torch.use_deterministic_algorithms(True, warn_only=True)

    def validate(self) -> None:
        """Ranges and rules between the fields.

        Raises:
            ValueError: naming the field, its value and what is expected.
        """
        super().validate()
        check_positive(
            steps=self.steps, batch_size=self.batch_size, grad_accum=self.grad_accum,
            max_minutes=self.max_minutes, max_epochs=self.max_epochs, lr=self.lr,
            adam_eps=self.adam_eps, clip_grad_norm=self.clip_grad_norm,
            eval_batches=self.eval_batches, early_stopping=self.early_stopping,
            keep_checkpoints=self.keep_checkpoints, log_every=self.log_every,
            checkpoint_every_minutes=self.checkpoint_every_minutes, muon_lr=self.muon_lr,
            batch_warmup_start=self.batch_warmup_start, seq_warmup_start=self.seq_warmup_start,
            batch_warmup_multiple=self.batch_warmup_multiple,
            seq_warmup_multiple=self.seq_warmup_multiple,
        )  # fmt: skip
        if self.batch_warmup_start > self.batch_size:
            raise ValueError(
                f"batch_warmup_start={self.batch_warmup_start} is larger than batch_size="
                f"{self.batch_size} (the warmup grows the batch up to batch_size)"
            )
        if not 0.0 <= self.muon_momentum < 1.0:
            raise ValueError(f"muon_momentum must be in [0, 1), got {self.muon_momentum}")
        if self.muon_ns_steps < 1:
            raise ValueError(f"muon_ns_steps must be >= 1, got {self.muon_ns_steps}")
        if self.optimizer == "muon" and self.fsdp:
            raise ValueError(
                "optimizer='muon' needs whole matrices for its Newton-Schulz step; FSDP shards "
                "them: train with DDP (fsdp=False) or another optimizer"
            )
        if self.steps is None and self.max_minutes is None and self.max_epochs is None:
            raise ValueError("give a training budget: steps, max_minutes or max_epochs")
        check_probability(label_smoothing=self.label_smoothing)
        check_seed(seed=self.seed)
        for name, beta in zip(("beta1", "beta2"), self.betas, strict=True):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {beta}")
        for name, value in (
            ("warmup", self.warmup),
            ("weight_decay", self.weight_decay),
            ("eval_every", self.eval_every),
            ("checkpoint_every", self.checkpoint_every),
            ("average_last", self.average_last),
            ("batch_warmup", self.batch_warmup),
            ("seq_warmup", self.seq_warmup),
            ("activation_checkpointing", self.activation_checkpointing),
        ):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if self.device is not None and not DEVICE_PATTERN.fullmatch(self.device):
            raise ValueError(
                f"device={self.device!r} is not valid; choose cpu, cuda, cuda:N, mps or auto "
                "(or None: the device the model is on)"
            )
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if not self.best_metric.startswith("val_"):
            raise ValueError(
                f"best_metric must name a validation metric such as 'val_loss' or "
                f"'val_accuracy', got {self.best_metric!r}"
            )
        if self.average_last > self.keep_checkpoints:
            raise ValueError(
                f"average_last={self.average_last} needs keep_checkpoints >= {self.average_last}"
                f" (the checkpoints averaged), got {self.keep_checkpoints}"
            )
        if self.schedule == "noam" and self.warmup == 0:
            raise ValueError("schedule='noam' needs warmup > 0 (eq. (3) divides by it)")
        if not 0.0 < self.decay_fraction <= 1.0:
            raise ValueError(f"decay_fraction must be in (0, 1], got {self.decay_fraction}")
        if self.schedule == "wsd":
            if self.steps is None:
                raise ValueError("schedule='wsd' needs steps (it decays over the last ones)")
            decay_steps = max(1, round(self.decay_fraction * self.steps))
            if self.warmup > self.steps - decay_steps:
                raise ValueError(
                    f"schedule='wsd' needs warmup <= steps - decay steps, got warmup="
                    f"{self.warmup}, steps={self.steps}, decay steps={decay_steps} "
                    f"(decay_fraction={self.decay_fraction})"
                )
        if self.schedule == "cosine":
            if self.steps is None:
                raise ValueError("schedule='cosine' needs steps (it decays to the last one)")
            if self.warmup >= self.steps:
                raise ValueError(
                    f"schedule='cosine' needs warmup < steps, got warmup={self.warmup}, "
                    f"steps={self.steps}"
                )
        timed = self.schedule in ("cosine", "wsd")
        if self.schedule_clock == "time" and (not timed or not self.max_minutes):
            raise ValueError(
                "schedule_clock='time' needs schedule='cosine' or 'wsd' and max_minutes (the "
                f"time the schedule decays over), got schedule={self.schedule!r}, "
                f"max_minutes={self.max_minutes}"
            )

    @property
    def best_mode(self) -> Literal["min", "max"]:
        """Whether a lower (losses, perplexities) or higher (accuracy, BLEU) ``best_metric``
        is better."""
        name = self.best_metric
        return "min" if name.endswith(("loss", "ppl", "perplexity")) else "max"

    @property
    def examples_per_step(self) -> int:
        """Examples per optimizer update, over all processes (``batch_size * grad_accum``)."""
        return self.batch_size * self.grad_accum

    def per_rank_batch_size(self, world_size: int) -> int:
        """Examples of each micro-batch that one of ``world_size`` processes computes.

        Raises:
            ValueError: if ``world_size`` does not divide ``batch_size``.
        """
        if world_size < 1:
            raise ValueError(f"world_size must be positive, got {world_size}")
        if self.batch_size % world_size:
            raise ValueError(
                f"batch_size={self.batch_size} (the global micro-batch) is not divisible by the "
                f"world size {world_size}; pick a batch_size that is a multiple of {world_size} "
                f"(per-process batch x world size x grad_accum = the global batch of "
                f"{self.examples_per_step} examples per step)"
            )
        return self.batch_size // world_size


__all__ = [
    "OptimizerImpl",
    "OptimizerName",
    "PrecisionName",
    "ScheduleName",
    "TrainConfig",
    "WsdDecay",
]
