"""A minimal training loop for the encoder-decoder Transformer, and exact-match evaluation.

The recipe of §5.3-§5.4: Adam with β1 = 0.9, β2 = 0.98, ε = 1e-9; the learning rate of eq. (3)
(:func:`attnlab.training.schedules.noam`); label smoothing ε_ls = 0.1
(:func:`attnlab.training.losses.label_smoothed_cross_entropy`). Gradient-norm clipping is optional.
Residual dropout (§5.4) lives in the model's config.

``schedule="cosine"`` keeps eq. (3)'s warmup and peak, ``lr_factor · d_model^-0.5 ·
warmup^-0.5``, but then follows a cosine down to 0 at the last step instead of eq. (3)'s
``step^-0.5`` decay. On small synthetic tasks Adam tends to spike once the loss is near its floor
(the gradients, and so Adam's second moments, shrink and its effective step grows); a rate that
reaches 0 at the end makes the final model reliably the converged one.

Deliberately small: one device, one batch per step, no accumulation, mixed precision, or
evaluation during training; a later trainer grows from here.

Deviations from the paper: the optional ``lr_factor`` scales eq. (3); optional gradient clipping
(the paper mentions none); the optional cosine decay.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

import torch
from tqdm.auto import tqdm

from attnlab.config import check_choice, check_positive, check_probability
from attnlab.generation.greedy import greedy_decode
from attnlab.models.transformer import EncoderDecoderTransformer
from attnlab.training.losses import label_smoothed_cross_entropy
from attnlab.training.schedules import Schedule, lambda_lr, make_schedule, noam
from attnlab.training.tasks import Seq2SeqBatch


@dataclass(frozen=True, kw_only=True)
class LoopConfig:
    """Optimisation settings of :func:`train` (defaults: the paper's where it gives them)."""

    steps: int = 1000
    warmup: int = 4000  # §5.3 warmup_steps
    lr_factor: float = 1.0  # multiplies eq. (3)
    schedule: Literal["noam", "cosine"] = "noam"  # eq. (3), or its warmup + peak then cosine to 0
    betas: tuple[float, float] = (0.9, 0.98)  # §5.3
    adam_eps: float = 1e-9  # §5.3
    label_smoothing: float = 0.1  # §5.4 ε_ls
    clip_grad_norm: float | None = None  # None: no clipping
    seed: int = 0  # seeds dropout (build the model under your own seed)
    progress: bool = True  # tqdm bar with loss and lr
    max_minutes: float | None = None  # stop early once this much wall time has passed

    def __post_init__(self) -> None:
        check_positive(
            steps=self.steps,
            warmup=self.warmup,
            lr_factor=self.lr_factor,
            adam_eps=self.adam_eps,
            clip_grad_norm=self.clip_grad_norm,
            max_minutes=self.max_minutes,
        )
        check_probability(label_smoothing=self.label_smoothing)
        check_choice("schedule", self.schedule, ["noam", "cosine"])
        if self.schedule == "cosine" and self.steps <= self.warmup:
            raise ValueError(
                f"the cosine schedule needs steps > warmup, got steps={self.steps}, "
                f"warmup={self.warmup}"
            )
        for name, beta in zip(("beta1", "beta2"), self.betas, strict=True):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {beta}")


@dataclass
class TrainResult:
    """What :func:`train` did: updates made, last loss, wall time, and the loss per step."""

    steps: int
    loss: float
    seconds: float
    stopped_early: bool
    losses: list[float] = field(default_factory=list)


def learning_rate_schedule(config: LoopConfig, *, d_model: int) -> Schedule:
    """The learning rate at each (1-based) step that :func:`train` uses for ``config``.

    ``"noam"``: eq. (3) times ``lr_factor``. ``"cosine"``: the same warmup to the same peak,
    ``lr_factor · d_model^-0.5 · warmup^-0.5``, then a cosine to 0 at ``config.steps``.
    """
    noam_schedule = make_schedule(
        "noam", d_model=d_model, warmup=config.warmup, factor=config.lr_factor
    )
    if config.schedule == "noam":
        return noam_schedule
    peak = noam(config.warmup, d_model=d_model, warmup=config.warmup, factor=config.lr_factor)
    cosine = make_schedule("cosine", warmup=config.warmup, total_steps=config.steps)
    return lambda step: peak * cosine(step)


def train(
    model: EncoderDecoderTransformer, batches: Iterable[Seq2SeqBatch], config: LoopConfig
) -> TrainResult:
    """Train ``model`` in place on ``batches`` for ``config.steps`` updates.

    Stops early when ``batches`` runs out or after ``config.max_minutes``. The model is left in
    train mode. The loss is label-smoothed cross-entropy over non-pad target positions.

    Args:
        model: an encoder-decoder model (``model(src, tgt) -> (logits, _)``).
        batches: padded batches; ``src``, ``tgt``, ``targets`` on the model's device.
        config: the optimisation settings.
    """
    torch.manual_seed(config.seed)
    model.train()
    optimizer = torch.optim.Adam(
        model.parameters(), lr=1.0, betas=config.betas, eps=config.adam_eps
    )  # lr=1.0: the Noam schedule gives absolute rates
    scheduler = lambda_lr(optimizer, learning_rate_schedule(config, d_model=model.config.d_model))
    pad = model.config.pad_id
    deadline = None if config.max_minutes is None else time.monotonic() + 60 * config.max_minutes
    start, losses, stopped_early = time.monotonic(), [], False
    bar = tqdm(total=config.steps, desc="train", unit="step", disable=not config.progress)
    batch_iter = iter(batches)
    with bar:
        for _ in range(config.steps):
            batch = next(batch_iter, None)
            if batch is None or (deadline is not None and time.monotonic() > deadline):
                stopped_early = True
                break
            logits, _ = model(batch.src, batch.tgt)  # (B, T, V)
            loss = label_smoothed_cross_entropy(
                logits, batch.targets, epsilon=config.label_smoothing, ignore_index=pad
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.clip_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad_norm)
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
            bar.update(1)
            if len(losses) % 10 == 0 or len(losses) == config.steps:
                bar.set_postfix(loss=f"{losses[-1]:.3f}", lr=f"{lr:.2e}", refresh=False)
    return TrainResult(
        steps=len(losses),
        loss=losses[-1] if losses else float("nan"),
        seconds=time.monotonic() - start,
        stopped_early=stopped_early,
        losses=losses,
    )


def evaluate_exact_match(
    model: EncoderDecoderTransformer, batches: Iterable[Seq2SeqBatch]
) -> float:
    """The fraction of sequences whose greedy decoding equals the target exactly (EOS included).

    Each batch is decoded with :func:`attnlab.generation.greedy_decode` for at most
    ``targets.shape[1]`` tokens (the longest target + EOS).

    Raises:
        ValueError: if ``batches`` is empty.
    """
    correct = total = 0
    pad = model.config.pad_id if model.config.pad_id is not None else model.config.eos_id
    for batch in batches:
        width = batch.targets.shape[1]
        pred = greedy_decode(model, batch.src, max_len=width)  # (B, <= width)
        pred = torch.nn.functional.pad(pred, (0, width - pred.shape[1]), value=pad)  # (B, width)
        correct += int((pred == batch.targets).all(dim=1).sum())
        total += batch.targets.shape[0]
    if total == 0:
        raise ValueError("evaluate_exact_match got no batches")
    return correct / total


__all__ = ["LoopConfig", "TrainResult", "evaluate_exact_match", "learning_rate_schedule", "train"]
