"""The reverse task: the first end-to-end run of the paper's encoder-decoder (§3, §5.3, §5.4).

A small encoder-decoder learns to reverse random token sequences
(:class:`~attnlab.data.reverse.ReverseTask`): Adam (β2 0.999: the paper's 0.98 gives recurring
loss spikes on this tiny task) with eq. (3)'s warmup and peak, then a cosine to 0 (or eq. (3)
throughout with ``schedule=noam``), label smoothing 0.1, no dropout. Evaluation: the validation
loss and the exact match of greedy decoding (``attnlab.generate``) on 1,000 held-out sequences,
drawn from a part of the sequence space training never sees. The defaults reach 100% in about a
minute and a half on 2 CPU cores.

``lr_factor`` scales eq. (3): the rate peaks at ``lr_factor · d_model^-0.5 · warmup^-0.5``
(0.16 · 64^-0.5 · 100^-0.5 = 2e-3 by default). A run of at most 100 steps without ``--warmup``
warms up for a tenth of its steps, at the same peak.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnlab.config import Config, check_positive
from attnlab.data.reverse import ReverseTask
from attnlab.generation import generate
from attnlab.models.transformer import TransformerConfig
from attnlab.tokenizers import Tokenizer
from attnlab.training.config import TrainConfig
from attnlab.training.objectives import Objective, SampledStream, Seq2SeqBatch, Seq2SeqObjective
from attnlab.training.recipes.base import RECIPES, Data, Recipe
from attnlab.training.schedules import noam
from attnlab.training.trainer import Callback, Trainer


@dataclass(frozen=True, kw_only=True)
class ReverseOptions(Config):
    """The task's sizes and the learning-rate factor."""

    vocab: int = 32  # vocabulary, pad/BOS/EOS included
    min_len: int = 8  # shortest sequence
    max_len: int = 16  # longest sequence
    eval_size: int = 1000  # held-out sequences
    lr_factor: float = 0.16  # multiplies eq. (3) (and so the peak of the cosine schedule)

    def validate(self) -> None:
        super().validate()
        check_positive(vocab=self.vocab, min_len=self.min_len, max_len=self.max_len,
                       eval_size=self.eval_size, lr_factor=self.lr_factor)  # fmt: skip
        if self.min_len > self.max_len:  # checked with the flags, before any file is looked at
            raise ValueError(
                f"need 1 <= min_len <= max_len, got min_len={self.min_len}, max_len={self.max_len}"
            )


def _task(options: ReverseOptions) -> ReverseTask:
    return ReverseTask(vocab_size=options.vocab, min_len=options.min_len, max_len=options.max_len)


def _data(options: ReverseOptions, tokenizer: Tokenizer | None, train: TrainConfig) -> Data:
    task = _task(options)
    heldout = task.heldout(options.eval_size, seed=(train.seed + 1) % 2**64)
    info = {"task": "reverse", "lengths": [options.min_len, options.max_len]}
    return Data({"task": task, "heldout": heldout}, None, info)


def _model_config(options: Any, data: Data | None) -> TransformerConfig:
    return TransformerConfig(
        vocab_size=options.vocab, d_model=64, n_heads=4, n_layers=2, d_ff=256, dropout=0.0,
        max_seq_len=options.max_len + 1,
    )  # fmt: skip


def _objective(options: Any, config: Any, data: Data, train: TrainConfig) -> Objective:
    task: ReverseTask = data.value["task"]

    def stream(batch_size: int, seed: int) -> SampledStream:
        return SampledStream(lambda n, g: task.sample(n, g, split="train"), batch_size, seed)

    return Seq2SeqObjective(stream, data.value["heldout"], pad_id=task.pad_id)


class ExactMatch(Callback):
    """The fraction of held-out sequences whose greedy decoding is exactly the target (EOS
    included): the task's real measure."""

    names = ("exact_match",)

    def __init__(self, heldout: list[Seq2SeqBatch], pad_id: int) -> None:
        self.heldout, self.pad_id = heldout, pad_id

    def metrics(
        self, trainer: Trainer, model: nn.Module, base: dict[str, float]
    ) -> dict[str, float]:
        return {"exact_match": exact_match(model, self.heldout, pad_id=self.pad_id)}


@torch.no_grad()
def exact_match(model: nn.Module, batches: list[Seq2SeqBatch], *, pad_id: int) -> float:
    """The fraction of sequences whose greedy decoding (:func:`attnlab.generate`, at most
    ``targets.shape[1]`` tokens) equals the target exactly.

    Raises:
        ValueError: if ``batches`` is empty.
    """
    correct = total = 0
    device = next(model.parameters()).device
    for batch in batches:
        width = batch.targets.shape[1]
        src, mask = batch.src.to(device), batch.src_mask.to(device)
        pred = generate(model, src, attention_mask=mask, max_new_tokens=width)  # (B, <= width)
        pred = torch.nn.functional.pad(pred, (0, width - pred.shape[1]), value=pad_id)
        correct += int((pred.cpu() == batch.targets).all(dim=1).sum())
        total += batch.batch_size
    if total == 0:
        raise ValueError("exact_match got no batches")
    return correct / total


def _callbacks(options: Any, config: Any, data: Data) -> list[Callback]:
    return [ExactMatch(data.value["heldout"], data.value["task"].pad_id)]


def _adjust(options: Any, train: TrainConfig, config: Any, given: set[str]) -> TrainConfig:
    """The rate from ``lr_factor`` (eq. (3)), unless ``lr`` was given itself. The peak is
    eq. (3)'s at the warmup given, else at the default warmup: a short run's shortened warmup
    (:func:`~attnlab.training.recipes.base.short_run_warmup`) keeps the default peak."""
    if "lr" in given:
        return train
    if train.schedule == "noam":
        return dataclasses.replace(train, lr=options.lr_factor)
    warmup = train.warmup if "warmup" in given else max(train.warmup, WARMUP)
    if warmup == 0:  # a given warmup of 0: eq. (3)'s rate after one step
        warmup = 1
    peak = noam(warmup, d_model=config.d_model, warmup=warmup, factor=options.lr_factor)
    return dataclasses.replace(train, lr=peak)


WARMUP = 100  # the default warmup, whose eq. (3) peak the cosine schedule starts from


REVERSE = Recipe(
    "reverse",
    "train a small encoder-decoder to reverse random sequences (the first end-to-end run)",
    ReverseOptions(),
    TrainConfig(
        # for-loop Adam: the implementation the task's recorded runs used (fused agrees only to
        # rounding, and Adam amplifies that on the key biases, whose exact gradient is 0)
        steps=1500, batch_size=128, optimizer="adam", optimizer_impl="for-loop", lr=1.0,
        betas=(0.9, 0.999), adam_eps=1e-9,
        schedule="cosine", warmup=WARMUP, label_smoothing=0.1, eval_every=0, eval_batches=1,
        best_metric="val_exact_match",
    ),
    _model_config, _data, _objective, _callbacks, _adjust,
    aliases={"layers": "n_layers", "heads": "n_heads", "clip": "clip_grad_norm",
             "beta2": (lambda v: {"betas[1]": v}, float)},
    derived=("vocab_size", "max_seq_len"),
)  # fmt: skip
RECIPES.add(REVERSE.name, REVERSE)

__all__ = ["ExactMatch", "ReverseOptions", "exact_match"]
