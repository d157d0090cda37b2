"""Image classification with on-the-fly augmentation: the trainer's objective for CIFAR-10.

:class:`AugmentedClassificationObjective` is :class:`~attnlab.training.objectives.
ClassificationObjective` for data kept as uint8 (:class:`~attnlab.data.cifar10.Cifar10`):
a training batch is gathered as uint8, augmented and normalised on the fly
(:func:`~attnlab.data.augment.augment_batch`), and its loss handles mixed labels,
``λ·CE(y_a) + (1-λ)·CE(y_b)`` (label-smoothed, summed). Evaluation batches are the whole
validation split in order, normalised, never augmented.

The training data stream (:class:`AugmentedImageStream`) owns two things, and its
:meth:`~AugmentedImageStream.state_dict` (the *data position* a checkpoint stores) holds both:

- the sampler position ``drawn`` (training images consumed so far). Sampling ``"epoch"``
  (default) visits every training image once per epoch, in an order that is a pure function of
  ``(seed, epoch)``, so the position is enough to continue an epoch exactly; ``"random"`` draws
  with replacement from the generator below;
- the augmentation generator (``torch.Generator`` seeded with the trainer's seed), which every
  random crop, flip, RandAugment op and mixup/CutMix draw comes from.

A resumed run therefore draws bitwise the batches the uninterrupted run would. The time spent
making training batches accumulates in :attr:`AugmentedImageStream.loader_seconds`, so a driver
can split a step into loader time and model time.

With ``autocast=True`` the model runs under ``torch.autocast("cpu", bfloat16)`` (the loss stays
float32); combine it with :func:`attnlab.transforms.float32_attention` (PyTorch's CPU attention
backward is slow in bfloat16). With ``channels_last=True`` every batch is laid out NHWC, the
layout oneDNN's convolutions prefer (build the model with ``.to(memory_format=
torch.channels_last)`` too).

Shapes: B batch, C channels, H x W pixels, K classes, N images of a split.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any, Literal

import torch
from torch import Tensor, nn

from attnlab.data.augment import AugmentConfig, MixedBatch, augment_batch
from attnlab.data.cifar10 import Cifar10
from attnlab.data.common import Split
from attnlab.training.losses import label_smoothed_cross_entropy
from attnlab.training.moe import model_aux_loss
from attnlab.training.objectives import LossTerms

Sampling = Literal["epoch", "random"]
_EPOCH_SEED_STRIDE = 1_000_003  # the order of epoch e: randperm under seed * stride + e + 1


def model_context(
    autocast: bool | str, device_type: str = "cpu"
) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast(device_type, bfloat16)`` when ``autocast`` is ``True`` or
    ``"bf16-mixed"``, float16 for ``"fp16-mixed"``, else a no-op (a trainer precision name:
    ``"fp32"``, ``"bf16"`` run without autocast)."""
    if autocast is True or autocast == "bf16-mixed":
        return torch.autocast(device_type, dtype=torch.bfloat16)
    if autocast == "fp16-mixed":
        return torch.autocast(device_type, dtype=torch.float16)
    return contextlib.nullcontext()


def _layout(images: Tensor, channels_last: bool) -> Tensor:
    return images.contiguous(memory_format=torch.channels_last) if channels_last else images


def _unmixed(images: Tensor, labels: Tensor) -> MixedBatch:
    return MixedBatch(images, labels, labels, torch.ones(len(labels)))


class AugmentedImageStream:
    """Training batches of :class:`Cifar10`-like data: sampled, augmented, normalised.

    Args:
        data: splits of uint8 images with :meth:`~Cifar10.normalize`.
        augment: what to do to the batches (``None``: normalise only).
        batch_size: images per batch. seed: seeds the augmentation generator and the epoch
            orders. sampling: ``"epoch"`` or ``"random"`` (module docstring).
        channels_last: lay batches out NHWC.

    Raises:
        ValueError: for an unknown ``sampling`` or an empty training split.
    """

    def __init__(
        self,
        data: Cifar10,
        augment: AugmentConfig | None,
        batch_size: int,
        seed: int,
        *,
        sampling: Sampling = "epoch",
        channels_last: bool = False,
    ) -> None:
        if sampling not in ("epoch", "random"):
            raise ValueError(f"sampling={sampling!r} is not valid; choose one of epoch, random")
        self.data, self.augment, self.batch_size = data, augment, batch_size
        self.seed, self.sampling, self.channels_last = seed, sampling, channels_last
        self.n_train = len(data.split("train")[1])
        if self.n_train == 0:
            raise ValueError("the training split has no images")
        self.generator = torch.Generator().manual_seed(seed)
        self.drawn = 0  # training images drawn so far
        self.loader_seconds = 0.0
        self._order: tuple[int, Tensor] | None = None  # (epoch, its permutation)

    def epoch_order(self, epoch: int) -> Tensor:
        """The permutation of the training images visited in epoch ``epoch`` ``(N,)``."""
        if self._order is None or self._order[0] != epoch:
            g = torch.Generator().manual_seed((self.seed * _EPOCH_SEED_STRIDE + epoch + 1) % 2**64)
            self._order = (epoch, torch.randperm(self.n_train, generator=g))
        return self._order[1]

    def next_index(self) -> Tensor:
        """Indices of the next batch's training images ``(B,)`` (advances the position; an
        ``"epoch"`` batch may span two epochs)."""
        if self.sampling == "random":
            self.drawn += self.batch_size
            return torch.randint(self.n_train, (self.batch_size,), generator=self.generator)
        parts, need = [], self.batch_size
        while need:
            epoch, offset = divmod(self.drawn, self.n_train)
            take = min(need, self.n_train - offset)
            parts.append(self.epoch_order(epoch)[offset : offset + take])
            self.drawn += take
            need -= take
        return torch.cat(parts)

    def next_batch(self) -> MixedBatch:
        """The next training batch: images float32 ``(B, C, H, W)``, labels ``(B,)`` (twice)
        and the mixing weights ``(B,)``."""
        start = time.perf_counter()
        images, labels = self.data.split("train")
        index = self.next_index()
        x, y = images[index], labels[index]  # uint8 (B, C, H, W), (B,)
        if self.augment is None:
            out = _unmixed(self.data.normalize(x), y)
        else:
            out = augment_batch(x, y, self.generator, self.augment, self.data.normalize)
        out = out._replace(images=_layout(out.images, self.channels_last))
        self.loader_seconds += time.perf_counter() - start
        return out

    def state_dict(self) -> dict[str, Any]:
        """The data position: images drawn and the augmentation generator's state."""
        return {"drawn": self.drawn, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`.

        Raises:
            ValueError: for a negative position.
        """
        drawn = int(state["drawn"])
        if drawn < 0:
            raise ValueError(f"drawn must be >= 0, got {drawn}")
        self.drawn = drawn
        self.generator.set_state(state["generator"])

    @property
    def epoch(self) -> float:
        """Passes over the training images so far."""
        return self.drawn / self.n_train

    @property
    def batches_per_epoch(self) -> int:
        """Batches that make one epoch (for the progress bar)."""
        return math.ceil(self.n_train / self.batch_size)


class AugmentedClassificationObjective:
    """Classification on :class:`Cifar10`-like data with augmented training batches.

    Args:
        data: splits of uint8 images with :meth:`~Cifar10.normalize`.
        augment: what to do to training batches (``None``: normalise only).
        sampling: ``"epoch"`` or ``"random"`` (module docstring).
        autocast: run the model in bfloat16 autocast.
        channels_last: lay every batch out NHWC.

    Raises:
        ValueError: for an unknown ``sampling``.
    """

    def __init__(
        self,
        data: Cifar10,
        augment: AugmentConfig | None = None,
        *,
        sampling: Sampling = "epoch",
        autocast: bool = False,
        channels_last: bool = False,
    ) -> None:
        if sampling not in ("epoch", "random"):
            raise ValueError(f"sampling={sampling!r} is not valid; choose one of epoch, random")
        self.data, self.augment, self.sampling = data, augment, sampling
        self.autocast, self.channels_last = autocast, channels_last
        self.stream: AugmentedImageStream | None = None  # the last one made (its loader time)

    def train_stream(self, batch_size: int, seed: int) -> AugmentedImageStream:
        """The training batches from the start (the trainer restores the position)."""
        self.stream = AugmentedImageStream(
            self.data, self.augment, batch_size, seed,
            sampling=self.sampling, channels_last=self.channels_last,
        )  # fmt: skip
        return self.stream

    def val_batches(self, batch_size: int, n_batches: int, seed: int) -> list[MixedBatch]:
        """The whole validation split, in order, in batches of ``batch_size`` (``n_batches``
        and ``seed`` are not needed: the split is fixed)."""
        return split_batches(self.data, "val", batch_size, channels_last=self.channels_last)

    def count(self, batch: Any) -> int:
        return int(batch.labels.numel())

    def n_tokens(self, batch: Any) -> int:
        return int(batch.labels.numel())

    def loss(self, model: nn.Module, batch: Any, *, label_smoothing: float) -> LossTerms:
        """Summed ``λ·CE(y_a) + (1-λ)·CE(y_b)``; "correct" counts the label with the larger
        weight."""
        images, labels, labels_b, lam = batch
        with model_context(self.autocast):
            logits = model(images)  # (B, K)
        logits = logits.float()
        per_a = label_smoothed_cross_entropy(
            logits, labels, epsilon=label_smoothing, ignore_index=None, reduction="none"
        )
        loss = lam * per_a  # (B,)
        mixed = lam < 1
        if bool(mixed.any()):
            per_b = label_smoothed_cross_entropy(
                logits, labels_b, epsilon=label_smoothing, ignore_index=None, reduction="none"
            )
            loss = loss + (1 - lam) * per_b
        target = torch.where(lam >= 0.5, labels, labels_b)
        correct = int((logits.detach().argmax(-1) == target).sum())
        return LossTerms(loss.sum(), int(labels.numel()), correct, model_aux_loss(model))


def split_batches(
    data: Cifar10, split: Split, batch_size: int, *, channels_last: bool = False
) -> list[MixedBatch]:
    """All of ``split`` in order, normalised, in batches of ``batch_size`` (the last smaller).

    Raises:
        ValueError: for a split the data does not have, or a non-positive ``batch_size``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    x, y = data.split(split)
    return [
        _unmixed(
            _layout(data.normalize(x[i : i + batch_size]), channels_last), y[i : i + batch_size]
        )
        for i in range(0, len(x), batch_size)
    ]


@torch.no_grad()
def predict(
    model: nn.Module,
    data: Cifar10,
    split: Split,
    *,
    batch_size: int = 500,
    autocast: bool | str = False,
    channels_last: bool = False,
    limit: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Predicted and true labels of the whole ``split`` in order (or its first ``limit``
    images), in eval mode (restored afterwards): ``(N,)``, ``(N,)``. ``autocast``: as
    :func:`model_context`; images are given on the device and in the dtype of the model's
    weights."""
    was_training = model.training
    model.eval()
    x, y = data.split(split)
    if limit is not None:
        x, y = x[:limit], y[:limit]
    preds = []
    weight = next(iter(model.parameters()))
    try:
        for i in range(0, len(x), batch_size):
            images = _layout(data.normalize(x[i : i + batch_size]), channels_last)  # (b, C, H, W)
            images = images.to(device=weight.device, dtype=weight.dtype)
            with model_context(autocast, weight.device.type):
                logits = model(images)  # (b, K)
            preds.append(logits.float().argmax(-1).cpu())
    finally:
        model.train(was_training)
    return torch.cat(preds), y


def confusion_matrix(predicted: Tensor, labels: Tensor, n_classes: int) -> Tensor:
    """``(K, K)`` counts: row = true class, column = predicted class.

    Raises:
        ValueError: for shapes that differ or a label outside ``[0, n_classes)``.
    """
    if predicted.shape != labels.shape:
        raise ValueError(f"predicted {tuple(predicted.shape)} and labels {tuple(labels.shape)}")
    for name, t in (("predicted", predicted), ("labels", labels)):
        if t.numel() and not 0 <= int(t.min()) <= int(t.max()) < n_classes:
            raise ValueError(f"{name} must be in [0, {n_classes}), got [{t.min()}, {t.max()}]")
    index = labels.long() * n_classes + predicted.long()
    return torch.bincount(index, minlength=n_classes * n_classes).view(n_classes, n_classes)


__all__ = [
    "AugmentedClassificationObjective",
    "AugmentedImageStream",
    "Sampling",
    "confusion_matrix",
    "model_context",
    "predict",
    "split_batches",
]
