"""What a model learns from its data: the trainer's view of a task, with resumable data streams.

An :class:`Objective` gives the trainer two things:

- the data: :meth:`~Objective.train_stream` returns a :class:`DataStream`, whose
  :meth:`~DataStream.next_batch` yields the next training micro-batch and whose
  :meth:`~DataStream.state_dict` is the *data position* a checkpoint stores, so a resumed run
  draws exactly the batches the uninterrupted run would; :meth:`~Objective.val_batches` the fixed
  validation batches;
- the loss: :meth:`~Objective.loss` turns (model, batch) into a *summed* loss and the number of
  terms in it (:class:`LossTerms`). The trainer divides by the total count of all micro-batches
  of an update, so k micro-batches give exactly the gradient of one k-times larger batch even
  when the counts differ (masked LM, translation). Losses are label-smoothed cross-entropies
  (§5.4, :func:`attnlab.training.losses.label_smoothed_cross_entropy`), plus the model's
  auxiliary loss where it has one (mixture-of-experts balancing: ``LossTerms.aux_loss``).

Two kinds of stream: :class:`SampledStream` draws random batches with its own seeded
``torch.Generator`` (the generator state is the position: LM blocks, masked LM, images, the
reverse task); :class:`EpochStream` walks a fixed order of batches per epoch (translation's
length-bucketed token batches: the position is ``(epoch, batch)``).

Objectives here: :class:`CausalLMObjective` (GPT), :class:`MaskedLMObjective` (BERT),
:class:`ClassificationObjective` (ViT, CNN), :class:`Seq2SeqObjective` (the encoder-decoder:
the reverse task, and with an :class:`EpochStream` translation). The data they draw from is
:mod:`attnlab.data`'s (:class:`~attnlab.data.text.TokenStream`,
:class:`~attnlab.data.images.ArrayImageDataset`; :class:`Seq2SeqBatch` is
:class:`attnlab.data.batches.Seq2SeqBatch`, re-exported here).

Shapes: B batch, T tokens, S source tokens, V vocabulary, K classes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from attnlab.data.batches import Seq2SeqBatch
from attnlab.data.common import Split
from attnlab.data.images import ArrayImageDataset
from attnlab.data.text import TokenStream
from attnlab.models.bert import mask_tokens
from attnlab.training.losses import label_smoothed_cross_entropy
from attnlab.training.moe import model_aux_loss

EVAL_SEED_OFFSET = 1_000_003  # validation batches use their own fixed generator


@dataclass
class LossTerms:
    """A summed loss, how many terms it sums, and how many of them were predicted right.

    ``aux_loss``: the model's own auxiliary loss (a mixture of experts' load-balancing and
    z-losses, :func:`attnlab.training.moe.model_aux_loss`), a *mean* over this batch, or
    ``None``. The trainer adds it to the training loss weighted by ``count / total`` (so k
    micro-batches still average); it is never part of ``val_loss``.
    """

    loss_sum: Tensor
    count: int
    correct: int
    aux_loss: Tensor | None = None


class DataStream(Protocol):
    """An endless source of training batches with a resumable position."""

    def next_batch(self) -> Any:
        """The next micro-batch (advances the position)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The position (tensors and plain values)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position from :meth:`state_dict`."""
        ...

    @property
    def epoch(self) -> float | None:
        """Passes over the data so far (``None`` for a stream without epochs)."""
        ...


class Objective(Protocol):
    """The trainer's view of a task."""

    def train_stream(self, batch_size: int, seed: int) -> DataStream:
        """The training batches, from the start (the trainer restores its position)."""
        ...

    def val_batches(self, batch_size: int, n_batches: int, seed: int) -> list[Any]:
        """The fixed validation batches (the same for every evaluation)."""
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

    # Optional, for TrainConfig's batch and sequence warmups: ``trimmable`` names what
    # ``trim(batch, rows, length)`` can cut ("rows", "length"); the trainer refuses a warmup
    # that the objective cannot apply.


# -- streams -------------------------------------------------------------------------------------


class SampledStream:
    """Random batches: ``draw(batch_size, generator)`` with a generator seeded by ``seed``."""

    def __init__(
        self, draw: Callable[[int, torch.Generator], Any], batch_size: int, seed: int
    ) -> None:
        self.draw, self.batch_size = draw, batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def next_batch(self) -> Any:
        return self.draw(self.batch_size, self.generator)

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])

    @property
    def epoch(self) -> float | None:
        return None


class EpochStream:
    """Epochs of batches in a fixed order: ``order(epoch)`` lists the batches of an epoch (each
    anything ``collate`` turns into a batch); the position is ``(epoch, batch)``.

    Raises:
        ValueError: (at the first batch) if an epoch has no batches.
    """

    def __init__(self, order: Callable[[int], Sequence[Any]], collate: Callable[[Any], Any]):
        self.order, self.collate = order, collate
        self.epoch_index, self.batch_index = 0, 0
        self._cache: tuple[int, Sequence[Any]] | None = None

    def _batches(self) -> Sequence[Any]:
        if self._cache is None or self._cache[0] != self.epoch_index:
            batches = self.order(self.epoch_index)
            if not batches:
                raise ValueError(f"epoch {self.epoch_index} has no batches (no training data?)")
            self._cache = (self.epoch_index, batches)
        return self._cache[1]

    def next_batch(self) -> Any:
        batches = self._batches()
        batch = self.collate(batches[self.batch_index])
        self.batch_index += 1
        if self.batch_index == len(batches):
            self.epoch_index, self.batch_index = self.epoch_index + 1, 0
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch_index, "batch": self.batch_index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch_index, self.batch_index = int(state["epoch"]), int(state["batch"])

    @property
    def epoch(self) -> float | None:
        return self.epoch_index + self.batch_index / max(len(self._batches()), 1)

    @property
    def batches_per_epoch(self) -> int:
        """Batches in the current epoch (for progress totals)."""
        return len(self._batches())


# -- objectives ----------------------------------------------------------------------------------


def _terms(
    logits: Tensor, targets: Tensor, ignore_index: int, eps: float, model: nn.Module
) -> LossTerms:
    """The summed (label-smoothed) cross-entropy of ``logits`` and the auxiliary loss of the
    forward of ``model`` that made them."""
    loss_sum = label_smoothed_cross_entropy(
        logits.float(), targets, epsilon=eps, ignore_index=ignore_index, reduction="sum"
    )
    keep = targets != ignore_index
    correct = int(((logits.detach().argmax(-1) == targets) & keep).sum())
    return LossTerms(loss_sum, int(keep.sum()), correct, model_aux_loss(model))


def cut_pair(batch: Any, rows: int | None, length: int | None) -> Any:
    """The first ``rows`` examples and the first ``length`` positions of a batch ``(x, y)`` of
    two ``(B, T, ...)`` tensors (``None``: all of them); the batch and sequence warmups of
    :class:`~attnlab.training.TrainConfig`."""
    x, y = batch
    rows_slice = slice(None) if rows is None else slice(0, rows)
    if length is None:
        return x[rows_slice], y[rows_slice]
    return x[rows_slice, :length], y[rows_slice, :length]


class SampledObjective:
    """Base of the objectives whose batches are random draws of :meth:`sample`."""

    val_split: Split = "val"

    def sample(self, split: Split, batch_size: int, generator: torch.Generator) -> Any:
        """A random batch of ``split``."""
        raise NotImplementedError

    def train_stream(self, batch_size: int, seed: int) -> DataStream:
        return SampledStream(lambda n, g: self.sample("train", n, g), batch_size, seed)

    def val_batches(self, batch_size: int, n_batches: int, seed: int) -> list[Any]:
        generator = torch.Generator().manual_seed((seed + EVAL_SEED_OFFSET) % 2**64)
        return [self.sample(self.val_split, batch_size, generator) for _ in range(n_batches)]


class CausalLMObjective(SampledObjective):
    """Next-token prediction on random blocks of a :class:`TokenStream` (GPT).

    A batch is ``(x, y)``, both ``(B, T)``, with ``y`` the block shifted left by one.
    """

    def __init__(self, data: TokenStream, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.data, self.block_size = data, block_size

    def sample(self, split: Split, batch_size: int, generator: torch.Generator) -> Any:
        block = self.data.blocks(split, batch_size, self.block_size + 1, generator)  # (B, T+1)
        return block[:, :-1], block[:, 1:]

    # batch and sequence warmup: a block's first L positions are a block of length L
    trimmable = ("rows", "length")

    def trim(self, batch: Any, rows: int | None, length: int | None) -> Any:
        """The first ``rows`` blocks, cut to their first ``length`` positions."""
        return cut_pair(batch, rows, length)

    def count(self, batch: Any) -> int:
        return int(batch[1].numel())

    def n_tokens(self, batch: Any) -> int:
        return int(batch[0].numel())

    def loss(self, model: nn.Module, batch: Any, *, label_smoothing: float) -> LossTerms:
        x, y = batch
        logits, _ = model(x)  # (B, T, V)
        return _terms(logits, y, -100, label_smoothing, model)


class MaskedLMObjective(SampledObjective):
    """BERT's masked LM on random blocks of a :class:`TokenStream`.

    Each block is corrupted with :func:`attnlab.models.bert.mask_tokens` (15% selected; of those
    80% ``[MASK]``, 10% random, 10% unchanged) using the stream's generator, so masks are
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

    def sample(self, split: Split, batch_size: int, generator: torch.Generator) -> Any:
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

    trimmable = ("rows", "length")

    def trim(self, batch: Any, rows: int | None, length: int | None) -> Any:
        """The first ``rows`` blocks, cut to their first ``length`` positions (the masking
        drawn for the cut positions is kept, so the data drawn does not change)."""
        return cut_pair(batch, rows, length)

    def count(self, batch: Any) -> int:
        return int((batch[1] != self.ignore_index).sum())

    def n_tokens(self, batch: Any) -> int:
        return int(batch[0].numel())

    def loss(self, model: nn.Module, batch: Any, *, label_smoothing: float) -> LossTerms:
        inputs, targets = batch
        logits = model(inputs).logits  # (B, T, V)
        return _terms(logits, targets, self.ignore_index, label_smoothing, model)


class ClassificationObjective(SampledObjective):
    """Image classification on an :class:`ArrayImageDataset` (ViT, or a CNN baseline).

    A batch is ``(images (B, C, H, W), labels (B,))``; the model returns logits ``(B, K)``.
    """

    def __init__(self, data: ArrayImageDataset) -> None:
        self.data = data

    def sample(self, split: Split, batch_size: int, generator: torch.Generator) -> Any:
        return self.data.batch(split, batch_size, generator)

    trimmable = ("rows",)

    def trim(self, batch: Any, rows: int | None, length: int | None) -> Any:
        """The first ``rows`` images and labels (images have no sequence to cut)."""
        if length is not None:
            raise ValueError("image classification has no sequence length to warm up")
        return cut_pair(batch, rows, None)

    def count(self, batch: Any) -> int:
        return int(batch[1].numel())

    def n_tokens(self, batch: Any) -> int:
        return int(batch[1].numel())

    def loss(self, model: nn.Module, batch: Any, *, label_smoothing: float) -> LossTerms:
        images, labels = batch
        return _terms(model(images), labels, -100, label_smoothing, model)


class Seq2SeqObjective:
    """Teacher-forced encoder-decoder training (§5): label-smoothed cross-entropy over the
    non-pad target positions.

    Args:
        train_stream: ``(batch_size, seed) -> DataStream`` of :class:`Seq2SeqBatch` es.
        val: the fixed validation batches.
        pad_id: the padding id (ignored by the loss).
    """

    def __init__(
        self,
        train_stream: Callable[[int, int], DataStream],
        val: Sequence[Seq2SeqBatch],
        *,
        pad_id: int,
    ) -> None:
        self._train_stream, self.val, self.pad_id = train_stream, list(val), pad_id

    def train_stream(self, batch_size: int, seed: int) -> DataStream:
        return self._train_stream(batch_size, seed)

    def val_batches(self, batch_size: int, n_batches: int, seed: int) -> list[Any]:
        return list(self.val)

    def count(self, batch: Any) -> int:
        return int((batch.targets != self.pad_id).sum())

    def n_tokens(self, batch: Any) -> int:
        return int(batch.src_mask.sum())

    def loss(self, model: nn.Module, batch: Any, *, label_smoothing: float) -> LossTerms:
        logits, _ = model(batch.src, batch.tgt, src_mask=batch.src_mask)  # (B, T, V)
        return _terms(logits, batch.targets, self.pad_id, label_smoothing, model)


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
    "EVAL_SEED_OFFSET",
    "CausalLMObjective",
    "ClassificationObjective",
    "DataStream",
    "EpochStream",
    "LossTerms",
    "MaskedLMObjective",
    "Objective",
    "SampledObjective",
    "SampledStream",
    "Seq2SeqBatch",
    "Seq2SeqObjective",
    "classification_accuracy",
    "cut_pair",
]
