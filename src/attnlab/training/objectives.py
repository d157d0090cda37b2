"""What a model learns from a batch: causal LM (GPT), masked LM (BERT), classification (ViT).

An objective draws batches with an explicit generator and turns (model, batch) into a *summed*
loss and the number of terms in it. The trainer divides by the total count of all micro-batches
of an update, so k micro-batches give exactly the gradient of one k-times larger batch even when
the counts differ (masked LM). Losses are label-smoothed cross-entropies (§5.4,
:func:`attnlab.training.losses.label_smoothed_cross_entropy`).

Shapes: B batch, T tokens, V vocabulary, K classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from attnlab.models.bert import mask_tokens
from attnlab.training.data import ArrayImageDataset, Split, TokenStream
from attnlab.training.losses import label_smoothed_cross_entropy


@dataclass
class LossTerms:
    """A summed loss, how many terms it sums, and how many of them were predicted right."""

    loss_sum: Tensor
    count: int
    correct: int


class Objective(Protocol):
    """The trainer's view of a task."""

    def batch(self, split: Split, batch_size: int, generator: torch.Generator) -> Any:
        """A random batch of ``split``."""
        ...

    def count(self, batch: Any) -> int:
        """The number of loss terms in ``batch`` (targets that are not ignored)."""
        ...

    def n_tokens(self, batch: Any) -> int:
        """Input tokens (or images) in ``batch``, for throughput."""
        ...

    def loss(self, model: nn.Module, batch: Any, *, label_smoothing: float) -> LossTerms:
        """The summed loss of ``model`` on ``batch``."""
        ...


def _terms(logits: Tensor, targets: Tensor, ignore_index: int, eps: float) -> LossTerms:
    loss_sum = label_smoothed_cross_entropy(
        logits.float(), targets, epsilon=eps, ignore_index=ignore_index, reduction="sum"
    )
    keep = targets != ignore_index
    correct = int(((logits.detach().argmax(-1) == targets) & keep).sum())
    return LossTerms(loss_sum, int(keep.sum()), correct)


class CausalLMObjective:
    """Next-token prediction on random blocks of a :class:`TokenStream` (GPT).

    A batch is ``(x, y)``, both ``(B, T)``, with ``y`` the block shifted left by one.
    """

    def __init__(self, data: TokenStream, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.data, self.block_size = data, block_size

    def batch(self, split: Split, batch_size: int, generator: torch.Generator) -> Any:
        block = self.data.blocks(split, batch_size, self.block_size + 1, generator)  # (B, T+1)
        return block[:, :-1], block[:, 1:]

    def count(self, batch: Any) -> int:
        return int(batch[1].numel())

    def n_tokens(self, batch: Any) -> int:
        return int(batch[0].numel())

    def loss(self, model: nn.Module, batch: Any, *, label_smoothing: float) -> LossTerms:
        x, y = batch
        logits, _ = model(x)  # (B, T, V)
        return _terms(logits, y, -100, label_smoothing)


class MaskedLMObjective:
    """BERT's masked LM on random blocks of a :class:`TokenStream`.

    Each block is corrupted with :func:`attnlab.models.bert.mask_tokens` (15% selected; of those
    80% ``[MASK]``, 10% random, 10% unchanged) using the trainer's generator, so masks are
    reproducible and resumable. A batch is ``(inputs, targets)``, both ``(B, T)``.

    Args:
        data: the token stream. block_size: T.
        vocab_size, mask_id: of the model. special_ids: never selected. mask_prob: selection rate.

    """

    def __init__(
        self,
        data: TokenStream,
        block_size: int,
        *,
        vocab_size: int,
        mask_id: int,
        special_ids: tuple[int, ...] = (),
        mask_prob: float = 0.15,
        ignore_index: int = -100,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.data, self.block_size = data, block_size
        self.vocab_size, self.mask_id, self.special_ids = vocab_size, mask_id, special_ids
        self.mask_prob, self.ignore_index = mask_prob, ignore_index

    def batch(self, split: Split, batch_size: int, generator: torch.Generator) -> Any:
        ids = self.data.blocks(split, batch_size, self.block_size, generator)  # (B, T)
        return mask_tokens(
            ids,
            vocab_size=self.vocab_size,
            mask_id=self.mask_id,
            special_ids=self.special_ids,
            mask_prob=self.mask_prob,
            ignore_index=self.ignore_index,
            generator=generator,
        )

    def count(self, batch: Any) -> int:
        return int((batch[1] != self.ignore_index).sum())

    def n_tokens(self, batch: Any) -> int:
        return int(batch[0].numel())

    def loss(self, model: nn.Module, batch: Any, *, label_smoothing: float) -> LossTerms:
        inputs, targets = batch
        logits = model(inputs).logits  # (B, T, V)
        return _terms(logits, targets, self.ignore_index, label_smoothing)


class ClassificationObjective:
    """Image classification on an :class:`ArrayImageDataset` (ViT, or the CNN baseline).

    A batch is ``(images (B, C, H, W), labels (B,))``; the model returns logits ``(B, K)``.
    """

    def __init__(self, data: ArrayImageDataset) -> None:
        self.data = data

    def batch(self, split: Split, batch_size: int, generator: torch.Generator) -> Any:
        return self.data.batch(split, batch_size, generator)

    def count(self, batch: Any) -> int:
        return int(batch[1].numel())

    def n_tokens(self, batch: Any) -> int:
        return int(batch[1].numel())

    def loss(self, model: nn.Module, batch: Any, *, label_smoothing: float) -> LossTerms:
        images, labels = batch
        return _terms(model(images), labels, -100, label_smoothing)


@torch.no_grad()
def classification_accuracy(
    model: nn.Module, data: ArrayImageDataset, split: Split = "val", batch_size: int = 512
) -> float:
    """The fraction of ``split`` that ``model`` classifies correctly (whole split, in order)."""
    was_training = model.training
    model.eval()
    x, y = data.split(split)
    correct = sum(
        int((model(x[i : i + batch_size]).argmax(-1) == y[i : i + batch_size]).sum())
        for i in range(0, len(x), batch_size)
    )
    model.train(was_training)
    return correct / len(x)


__all__ = [
    "CausalLMObjective",
    "ClassificationObjective",
    "LossTerms",
    "MaskedLMObjective",
    "Objective",
    "classification_accuracy",
]
