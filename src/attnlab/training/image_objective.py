"""Image classification with on-the-fly augmentation: the trainer's objective for CIFAR-10.

:class:`AugmentedClassificationObjective` is :class:`~attnlab.training.objectives.
ClassificationObjective` for data kept as uint8 (:class:`~attnlab.training.cifar10.Cifar10`):
a training batch is gathered as uint8, augmented and normalised on the fly
(:func:`~attnlab.training.augment.augment_batch`, every draw from the trainer's generator), and
its loss handles mixed labels, ``λ·CE(y_a) + (1-λ)·CE(y_b)`` (label-smoothed, summed). Evaluation
batches are normalised, never augmented.

Sampling of training images: ``"epoch"`` (default) visits every training image once per epoch,
in an order that is a pure function of ``(seed, epoch)``; the objective's position (images
drawn so far) is its only state (:meth:`state_dict`), so a resumed run must restore it, or call
:meth:`seek` with ``step · batch_size · grad_accum``. ``"random"`` draws with replacement from
the trainer's generator, whose state the trainer already checkpoints (resumable with no more).

The time spent making training batches is accumulated in :attr:`loader_seconds`, so a driver
can split a step into loader time and model time. With ``autocast=True`` the model runs under
``torch.autocast("cpu", bfloat16)`` (the loss stays float32): on CPUs with AMX or AVX-512 BF16
its matrix products run several times faster. PyTorch's CPU SDPA is the exception (its bfloat16
backward was ~7x slower than float32 in a one-off profile of ViT-cifar), so
:func:`attention_in_float32` (applied to a built model from outside) keeps attention in float32.
With ``channels_last=True`` every batch is laid out NHWC, the layout oneDNN's convolutions
prefer (build the model with ``.to(memory_format=torch.channels_last)`` too).

Shapes: B batch, C channels, H x W pixels, K classes, N images of a split.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Literal

import torch
from torch import Tensor, nn

from attnlab.layers.attention_backends import get_attention_backend
from attnlab.layers.multihead import MultiHeadAttention
from attnlab.training.augment import AugmentConfig, MixedBatch, augment_batch
from attnlab.training.cifar10 import Cifar10
from attnlab.training.data import Split
from attnlab.training.losses import label_smoothed_cross_entropy
from attnlab.training.objectives import LossTerms

Sampling = Literal["epoch", "random"]
_EPOCH_SEED_STRIDE = 1_000_003  # the order of epoch e is randperm under seed + e * stride


def model_context(autocast: bool) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast("cpu", bfloat16)`` when ``autocast``, else a no-op."""
    if autocast:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def float32_sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> Tensor:
    """The ``"sdpa"`` backend computed in float32 even under autocast; returns ``q``'s dtype.

    Same signature and mask convention (bool True = may attend) as every attention backend.
    """
    sdpa = get_attention_backend("sdpa")
    with torch.autocast("cpu", enabled=False):
        out = sdpa(
            q.float(),
            k.float(),
            v.float(),
            mask=mask,
            is_causal=is_causal,
            dropout_p=dropout_p,
            scale=scale,
        )
    return out.to(q.dtype)


def attention_in_float32(model: nn.Module) -> nn.Module:
    """Switch every ``"sdpa"`` :class:`MultiHeadAttention` of a built model to
    :func:`float32_sdpa` (in place; not saved in checkpoints); returns the model."""
    sdpa = get_attention_backend("sdpa")
    for m in model.modules():
        if isinstance(m, MultiHeadAttention) and m.backend is sdpa:
            m.backend = float32_sdpa
    return model


class AugmentedClassificationObjective:
    """Classification on :class:`Cifar10`-like data with augmented training batches.

    Args:
        data: splits of uint8 images with :meth:`~Cifar10.normalize`.
        augment: what to do to training batches (``None``: normalise only).
        sampling: ``"epoch"`` or ``"random"`` (module docstring).
        seed: seeds the epoch orders.
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
        seed: int = 0,
        autocast: bool = False,
        channels_last: bool = False,
    ) -> None:
        if sampling not in ("epoch", "random"):
            raise ValueError(f"sampling={sampling!r} is not valid; choose one of epoch, random")
        self.data, self.augment, self.sampling = data, augment, sampling
        self.seed, self.autocast, self.channels_last = seed, autocast, channels_last
        self.drawn = 0  # training images drawn so far (the "epoch" sampler's position)
        self.loader_seconds = 0.0
        self._order: tuple[int, Tensor] | None = None  # (epoch, its permutation)

    # -- sampling ------------------------------------------------------------------------------

    def _epoch_order(self, epoch: int) -> Tensor:
        if self._order is None or self._order[0] != epoch:
            n = len(self.data.split("train")[1])
            g = torch.Generator().manual_seed(self.seed + epoch * _EPOCH_SEED_STRIDE)
            self._order = (epoch, torch.randperm(n, generator=g))
        return self._order[1]

    def train_index(self, batch_size: int, generator: torch.Generator) -> Tensor:
        """Indices of the next ``batch_size`` training images ``(B,)`` (advances the position
        for ``"epoch"`` sampling; a batch may span two epochs)."""
        n = len(self.data.split("train")[1])
        if self.sampling == "random":
            return torch.randint(n, (batch_size,), generator=generator)
        parts, need = [], batch_size
        while need:
            epoch, offset = divmod(self.drawn, n)
            take = min(need, n - offset)
            parts.append(self._epoch_order(epoch)[offset : offset + take])
            self.drawn += take
            need -= take
        return torch.cat(parts)

    def seek(self, drawn: int) -> None:
        """Set the position: ``drawn`` training images already consumed."""
        if drawn < 0:
            raise ValueError(f"drawn must be >= 0, got {drawn}")
        self.drawn = drawn

    def state_dict(self) -> dict[str, int]:
        """The sampler's position (all a resumed ``"epoch"`` run needs besides the trainer's)."""
        return {"drawn": self.drawn}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore :meth:`state_dict`."""
        self.seek(int(state["drawn"]))

    # -- the Objective protocol ------------------------------------------------------------------

    def batch(self, split: Split, batch_size: int, generator: torch.Generator) -> MixedBatch:
        """A batch of ``split``: training batches augmented, others normalised only."""
        if split != "train":
            x, y = self.data.batch(split, batch_size, generator)
            return MixedBatch(self._layout(x), y, y, torch.ones(len(y)))
        start = time.perf_counter()
        images, labels = self.data.split("train")
        index = self.train_index(batch_size, generator)
        x, y = images[index], labels[index]  # uint8 (B, C, H, W), (B,)
        if self.augment is None:
            out = MixedBatch(self.data.normalize(x), y, y, torch.ones(len(y)))
        else:
            out = augment_batch(x, y, generator, self.augment, self.data.normalize)
        out = out._replace(images=self._layout(out.images))
        self.loader_seconds += time.perf_counter() - start
        return out

    def _layout(self, images: Tensor) -> Tensor:
        if self.channels_last:
            return images.contiguous(memory_format=torch.channels_last)
        return images

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
        return LossTerms(loss.sum(), int(labels.numel()), correct)


@torch.no_grad()
def predict(
    model: nn.Module,
    data: Cifar10,
    split: Split,
    *,
    batch_size: int = 500,
    autocast: bool = False,
    channels_last: bool = False,
    limit: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Predicted and true labels of the whole ``split`` in order (or its first ``limit``
    images), in eval mode (restored afterwards): ``(N,)``, ``(N,)``."""
    was_training = model.training
    model.eval()
    x, y = data.split(split)
    if limit is not None:
        x, y = x[:limit], y[:limit]
    preds = []
    try:
        for i in range(0, len(x), batch_size):
            images = data.normalize(x[i : i + batch_size])  # (b, C, H, W)
            if channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            with model_context(autocast):
                logits = model(images)  # (b, K)
            preds.append(logits.float().argmax(-1))
    finally:
        model.train(was_training)
    return torch.cat(preds), y


def confusion_matrix(predicted: Tensor, labels: Tensor, n_classes: int) -> Tensor:
    """``(K, K)`` counts: row = true class, column = predicted class."""
    index = labels.long() * n_classes + predicted.long()
    return torch.bincount(index, minlength=n_classes * n_classes).view(n_classes, n_classes)


__all__ = [
    "AugmentedClassificationObjective",
    "Sampling",
    "attention_in_float32",
    "confusion_matrix",
    "float32_sdpa",
    "model_context",
    "predict",
]
