"""``TrainConfig``: the optimisation settings of :class:`attnlab.training.Trainer`.

Separate from the model configs (a model config says *what* is trained, this says *how*). The
defaults are the paper's recipe where it gives one (§5.3: Adam β = (0.9, 0.98), ε = 1e-9, the
eq. (3) schedule with 4000 warmup steps; §5.4: label smoothing 0.1); the recipes in
:mod:`attnlab.training.recipes` override them (e.g. AdamW + warmup/cosine for the GPT recipe).

Like the model configs it is a frozen, keyword-only dataclass that validates itself, serialises
with ``dataclasses.asdict`` and loads with :meth:`TrainConfig.from_dict`, which rejects unknown
keys.

Deviations from the paper: ``lr`` multiplies the Noam schedule (1.0 is eq. (3) exactly); weight
decay, accumulation, clipping and early stopping are modern additions the paper does not use.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from attnlab.config import check_choice, check_positive, check_probability, config_from_dict

ScheduleName = Literal["noam", "cosine", "constant"]
OptimizerName = Literal["adam", "adamw", "sgd"]


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """How to train: steps, batches, optimizer, schedule, regularisation, evaluation, logging.

    A step is one optimizer update over ``grad_accum`` micro-batches of ``batch_size`` examples
    each (so ``batch_size * grad_accum`` examples per update).

    Under ``torchrun`` (:mod:`attnlab.training.distributed`) these stay the *global* numbers:
    each of the N processes computes ``batch_size / N`` examples of every micro-batch (so N must
    divide ``batch_size``), and one update still sees ``batch_size * grad_accum`` examples.
    """

    # -- budget and batches
    steps: int = 1000  # optimizer updates
    batch_size: int = 32  # examples per micro-batch
    grad_accum: int = 1  # micro-batches per update
    max_minutes: float | None = None  # stop (and checkpoint) once this much wall time passed
    # -- optimizer (§5.3 defaults)
    optimizer: OptimizerName = "adam"
    lr: float = 1.0  # peak rate; for "noam" a multiplier of eq. (3)
    betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    decay_norms_and_biases: bool = False  # by default biases and norm gains are not decayed
    decay_embeddings: bool = False  # nor embeddings (token, position, patch position tables)
    # -- schedule (attnlab.training.schedules)
    schedule: ScheduleName = "noam"
    warmup: int = 4000
    min_lr_ratio: float = 0.0  # cosine floor, as a fraction of lr
    # -- regularisation
    label_smoothing: float = 0.1  # §5.4 ε_ls
    clip_grad_norm: float | None = None  # None: no clipping
    # -- evaluation and early stopping
    eval_every: int = 0  # steps between evaluations; 0: only at the end
    eval_batches: int = 10  # micro-batches per evaluation
    early_stopping: int | None = None  # stop after this many evaluations without improvement
    # -- checkpoints and logging
    checkpoint_every: int = 0  # steps between checkpoints; 0: only at the end
    keep_checkpoints: int = 2  # newest checkpoints kept on disk
    log_every: int = 10  # steps between metrics.jsonl lines
    progress: bool = True  # tqdm bar with loss, lr and tokens/s
    tensorboard: bool = False  # also log through torch.utils.tensorboard (when installed)
    # -- distributed (under torchrun; ignored by a single process)
    fsdp: bool = False  # shard parameters, gradients and optimizer state (FSDP2); else DDP
    # -- reproducibility
    seed: int = 0  # seeds data order, masking and dropout
    deterministic: bool = True  # torch.use_deterministic_algorithms(True, warn_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(self.betas))
        check_positive(
            steps=self.steps, batch_size=self.batch_size, grad_accum=self.grad_accum,
            max_minutes=self.max_minutes, lr=self.lr, adam_eps=self.adam_eps,
            clip_grad_norm=self.clip_grad_norm, eval_batches=self.eval_batches,
            early_stopping=self.early_stopping, keep_checkpoints=self.keep_checkpoints,
            log_every=self.log_every,
        )  # fmt: skip
        check_choice("optimizer", self.optimizer, ["adam", "adamw", "sgd"])
        check_choice("schedule", self.schedule, ["noam", "cosine", "constant"])
        check_probability(label_smoothing=self.label_smoothing)
        if len(self.betas) != 2:
            raise ValueError(f"betas must be a pair, got {self.betas}")
        for name, beta in zip(("beta1", "beta2"), self.betas, strict=True):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {beta}")
        for name, value in (
            ("warmup", self.warmup),
            ("weight_decay", self.weight_decay),
            ("eval_every", self.eval_every),
            ("checkpoint_every", self.checkpoint_every),
        ):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.schedule == "noam" and self.warmup == 0:
            raise ValueError("schedule='noam' needs warmup > 0 (eq. (3) divides by it)")
        if self.schedule == "cosine" and self.warmup >= self.steps:
            raise ValueError(
                f"schedule='cosine' needs warmup < steps, got warmup={self.warmup}, "
                f"steps={self.steps}"
            )

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

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``betas`` as a list)."""
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Build from a dict such as :meth:`to_dict`'s.

        Raises:
            ValueError: naming unknown keys (and the valid ones) or invalid values.
        """
        return config_from_dict(cls, data)


__all__ = ["OptimizerName", "ScheduleName", "TrainConfig"]
