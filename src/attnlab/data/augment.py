"""Image augmentation on whole batches with tensor ops, driven by an explicit generator.

No per-image Python loop anywhere: every random choice is drawn for the whole batch at once from
the ``torch.Generator`` passed in (the trainer's, whose state a checkpoint stores), and the same
number of values is drawn whatever the outcomes, so a batch is a pure function of the images and
the generator state: reproducible, and resumable bitwise.

- :func:`random_crop_flip`: pad by ``padding`` pixels, take a random ``H x W`` window, mirror it
  horizontally with probability 1/2 (He et al. 2016, §4.2: "4 pixels are padded on each side, and
  a 32x32 crop is randomly sampled from the padded image or its horizontal flip"). Padding is
  ``"reflect"`` by default (the edge is not repeated, as ``torch.nn.functional.pad``'s
  ``"reflect"``; no black borders, the fast CIFAR trainers' choice) or ``"zero"`` (black pixels
  before normalisation: the paper's and torchvision's ``RandomCrop(32, padding=4)``). Crop and flip
  are one ``gather`` of precomputed source indices on the uint8 images: the padded image is never
  materialised.
- :func:`rand_augment`: a RandAugment-style policy (Cubuk et al. 2020): each image gets ``n_ops``
  operations drawn uniformly from :data:`RAND_AUGMENT_OPS` at one global magnitude, with a random
  sign for the signed ones. Applied on float images in [0, 255]; geometric ops fill with grey 128.
- :func:`mix_batch`: mixup (Zhang et al. 2018; ``x = λ·x_i + (1-λ)·x_j``) or CutMix (Yun et al.
  2019; a box of area ``1-λ`` pasted from ``x_j``, λ recomputed from the clipped box), λ ~
  Beta(α, α), partners by a random permutation. The labels come back as ``(y_a, y_b, λ)`` per
  image: the loss is ``λ·CE(y_a) + (1-λ)·CE(y_b)``.
- :func:`augment_batch`: the pipeline crop/flip -> RandAugment -> normalise -> mix.

Deviations: RandAugment here has no ``equalize`` and no ``translate`` (the random crop already
translates); λ of mixup/CutMix is one value per batch (as in both papers' code).

Shapes: B batch, C channels, H x W pixels, b images an op applies to.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.config import Config

PadMode = Literal["reflect", "zero"]


@dataclass(frozen=True, kw_only=True)
class AugmentConfig(Config):
    """What :func:`augment_batch` does to a training batch (defaults: crop + flip only)."""

    crop_padding: int = 4  # 0: no crop
    pad_mode: PadMode = "reflect"
    flip: bool = True
    randaug_ops: int = 0  # RandAugment ops per image (0: off)
    randaug_magnitude: float = 0.3  # fraction of each op's strongest setting (9/30 of timm's M)
    mixup_alpha: float = 0.0  # 0: off
    cutmix_alpha: float = 0.0  # 0: off; with both on, each mixed batch picks one at random
    mix_prob: float = 1.0  # probability that a batch is mixed

    def validate(self) -> None:
        """Ranges (the types are checked from the annotations).

        Raises:
            ValueError: naming the field, its value and the valid range.
        """
        super().validate()
        for name in ("crop_padding", "randaug_ops"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name, hi in (("randaug_magnitude", 1.0), ("mix_prob", 1.0),
                         ("mixup_alpha", math.inf), ("cutmix_alpha", math.inf)):  # fmt: skip
            value = getattr(self, name)
            if not 0 <= value <= hi:
                raise ValueError(f"{name} must be in [0, {hi}], got {value}")

    @property
    def mixes(self) -> bool:
        """Whether batches may be mixed (mixup or CutMix on)."""
        return self.mix_prob > 0 and (self.mixup_alpha > 0 or self.cutmix_alpha > 0)


class MixedBatch(NamedTuple):
    """A classification batch with (possibly) mixed labels: the loss of image ``i`` is
    ``lam[i]·CE(labels[i]) + (1 - lam[i])·CE(labels_b[i])``; unmixed: ``labels_b == labels``,
    ``lam == 1``."""

    images: Tensor  # (B, C, H, W) float
    labels: Tensor  # (B,) int64
    labels_b: Tensor  # (B,) int64
    lam: Tensor  # (B,) float32


# -- crop and flip ------------------------------------------------------------------------------


def crop_flip_params(
    batch: int, padding: int, flip: bool, generator: torch.Generator
) -> tuple[Tensor, Tensor, Tensor]:
    """Random window offsets ``dy, dx`` in ``[0, 2·padding]`` and flip flags, each ``(B,)``."""
    offsets = torch.randint(2 * padding + 1, (2, batch), generator=generator)
    flips = torch.rand(batch, generator=generator) < 0.5
    return offsets[0], offsets[1], flips & flip


def _source_index(offset: Tensor, size: int, padding: int, mode: PadMode) -> tuple[Tensor, Tensor]:
    """Source pixel of each output position ``(B, size)``, and whether it lies in the image."""
    pos = offset[:, None] + torch.arange(size) - padding  # (B, size) in padded coords - padding
    inside = (pos >= 0) & (pos < size)
    if mode == "reflect":  # -k -> k, size-1+k -> size-1-k (the edge pixel is not repeated)
        pos = pos.abs()
        pos = torch.where(pos > size - 1, 2 * (size - 1) - pos, pos)
    return pos.clamp(0, size - 1), inside


def crop_flip(
    images: Tensor,
    dy: Tensor,
    dx: Tensor,
    flips: Tensor,
    *,
    padding: int,
    pad_mode: PadMode = "reflect",
) -> Tensor:
    """The ``H x W`` windows at ``(dy, dx)`` of the images padded by ``padding``, mirrored
    left-right where ``flips``; any dtype (uint8 stays uint8).

    Shapes:
        images ``(B, C, H, W)``; dy, dx, flips ``(B,)`` -> ``(B, C, H, W)``.
    """
    B, C, H, W = images.shape
    rows, row_in = _source_index(dy, H, padding, pad_mode)  # (B, H)
    cols, col_in = _source_index(dx, W, padding, pad_mode)  # (B, W)
    cols = torch.where(flips[:, None], cols.flip(1), cols)  # a flip reverses the window
    col_in = torch.where(flips[:, None], col_in.flip(1), col_in)
    index = (rows[:, :, None] * W + cols[:, None, :]).view(B, 1, H * W)  # (B, 1, H·W)
    out = images.reshape(B, C, H * W).gather(2, index.expand(B, C, H * W)).view(B, C, H, W)
    if pad_mode == "zero" and padding:
        inside = (row_in[:, :, None] & col_in[:, None, :])[:, None]  # (B, 1, H, W)
        out = out * inside.to(out.dtype)
    return out


def random_crop_flip(
    images: Tensor,
    generator: torch.Generator,
    *,
    padding: int = 4,
    pad_mode: PadMode = "reflect",
    flip: bool = True,
) -> Tensor:
    """:func:`crop_flip` at random offsets and flips drawn from ``generator``.

    Shapes:
        ``(B, C, H, W)`` -> ``(B, C, H, W)``.
    """
    dy, dx, flips = crop_flip_params(images.shape[0], padding, flip, generator)
    return crop_flip(images, dy, dx, flips, padding=padding, pad_mode=pad_mode)


# -- RandAugment ----------------------------------------------------------------------------------
# Each op: (x float (b, C, H, W) in [0, 255], s (b,) signed strength in [-1, 1]) -> same shape.


def _blend(x: Tensor, degenerate: Tensor, factor: Tensor) -> Tensor:
    """PIL ImageEnhance: ``degenerate + factor·(x - degenerate)``, clamped to [0, 255]."""
    return (degenerate + factor.view(-1, 1, 1, 1) * (x - degenerate)).clamp(0, 255)


def _gray(x: Tensor) -> Tensor:
    r, g, b = x.unbind(1)
    return (0.299 * r + 0.587 * g + 0.114 * b)[:, None]  # (b, 1, H, W)


def _affine(x: Tensor, theta: Tensor) -> Tensor:
    """Resample ``x`` through ``theta`` ``(b, 2, 3)`` (normalised coordinates), grey fill."""
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x - 128.0, grid, align_corners=False) + 128.0


def _rotate(x: Tensor, s: Tensor) -> Tensor:
    a = s * math.radians(30.0)
    c, n = torch.cos(a), torch.sin(a)
    z = torch.zeros_like(a)
    return _affine(x, torch.stack([torch.stack([c, -n, z], 1), torch.stack([n, c, z], 1)], 1))


def _shear(x: Tensor, s: Tensor, axis: int) -> Tensor:
    one, z, k = torch.ones_like(s), torch.zeros_like(s), 0.3 * s
    rows = [[one, k, z], [z, one, z]] if axis == 0 else [[one, z, z], [k, one, z]]
    return _affine(x, torch.stack([torch.stack(r, 1) for r in rows], 1))


def _sharpness(x: Tensor, s: Tensor) -> Tensor:
    kernel = torch.tensor([[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]]) / 13.0
    C = x.shape[1]
    smooth = F.conv2d(x, kernel.expand(C, 1, 3, 3).to(x.dtype), padding=1, groups=C)
    smooth[..., 0, :], smooth[..., -1, :] = x[..., 0, :], x[..., -1, :]  # PIL keeps the border
    smooth[..., :, 0], smooth[..., :, -1] = x[..., :, 0], x[..., :, -1]
    return _blend(x, smooth, 1.0 + 0.9 * s)


def _autocontrast(x: Tensor, s: Tensor) -> Tensor:
    lo = x.amin(dim=(2, 3), keepdim=True)  # (b, C, 1, 1)
    hi = x.amax(dim=(2, 3), keepdim=True)
    span = hi - lo
    scaled = (x - lo) * (255.0 / span.clamp_min(1e-3))
    return torch.where(span > 0, scaled, x)


def _posterize(x: Tensor, s: Tensor) -> Tensor:
    step = torch.exp2(torch.round(4.0 * s.abs())).view(-1, 1, 1, 1)  # drop 0-4 low bits
    return torch.floor(x / step) * step


RAND_AUGMENT_OPS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "identity": lambda x, s: x,
    "autocontrast": _autocontrast,
    "rotate": _rotate,
    "solarize": lambda x, s: torch.where(
        x >= (256.0 * (1 - s.abs())).view(-1, 1, 1, 1), 255.0 - x, x
    ),
    "color": lambda x, s: _blend(x, _gray(x), 1.0 + 0.9 * s),
    "posterize": _posterize,
    "contrast": lambda x, s: _blend(x, _gray(x).mean(dim=(1, 2, 3), keepdim=True), 1.0 + 0.9 * s),
    "brightness": lambda x, s: _blend(x, torch.zeros_like(x), 1.0 + 0.9 * s),
    "sharpness": _sharpness,
    "shear_x": lambda x, s: _shear(x, s, 0),
    "shear_y": lambda x, s: _shear(x, s, 1),
}


def rand_augment(
    images: Tensor, generator: torch.Generator, *, n_ops: int = 2, magnitude: float = 0.3
) -> Tensor:
    """Apply ``n_ops`` random :data:`RAND_AUGMENT_OPS` to every image, at strength
    ``±magnitude``; the loop runs over ops, each applied to the images that drew it.

    Shapes:
        float ``(B, C, H, W)`` in [0, 255] -> the same.
    """
    names = list(RAND_AUGMENT_OPS)
    B = images.shape[0]
    choice = torch.randint(len(names), (n_ops, B), generator=generator)
    sign = torch.randint(2, (n_ops, B), generator=generator).float() * 2 - 1
    x = images.clone()
    for step in range(n_ops):
        for k, name in enumerate(names[1:], start=1):
            rows = (choice[step] == k).nonzero().squeeze(1)
            if len(rows):
                x[rows] = RAND_AUGMENT_OPS[name](x[rows], magnitude * sign[step, rows])
    return x


# -- mixup and CutMix -----------------------------------------------------------------------------


def mix_batch(
    images: Tensor,
    labels: Tensor,
    generator: torch.Generator,
    *,
    mixup_alpha: float = 0.0,
    cutmix_alpha: float = 0.0,
    prob: float = 1.0,
) -> MixedBatch:
    """Mixup or CutMix of ``images`` with a random permutation of themselves.

    Every call draws the same random values (the mixing decision, the method, λ, the
    permutation, the box), so the generator advances identically whatever is chosen.

    Shapes:
        images float ``(B, C, H, W)``, labels ``(B,)`` -> :class:`MixedBatch`.
    """
    B, _, H, W = images.shape
    u = torch.rand(2, generator=generator)  # mix this batch?, which method?
    seed = int(torch.randint(2**62, (1,), generator=generator))
    perm = torch.randperm(B, generator=generator)
    centre = torch.rand(2, generator=generator)
    methods = [(m, a) for m, a in (("mixup", mixup_alpha), ("cutmix", cutmix_alpha)) if a > 0]
    ones = torch.ones(B)
    if not methods or float(u[0]) >= prob:
        return MixedBatch(images, labels, labels, ones)
    method, alpha = methods[min(int(float(u[1]) * len(methods)), len(methods) - 1)]
    lam = float(np.random.default_rng(seed).beta(alpha, alpha))
    if method == "mixup":
        mixed = lam * images + (1.0 - lam) * images[perm]
    else:
        r = math.sqrt(1.0 - lam)
        cut_h, cut_w = int(H * r), int(W * r)
        cy, cx = int(float(centre[0]) * H), int(float(centre[1]) * W)
        y0, y1 = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, H)
        x0, x1 = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, W)
        mixed = images.clone()
        mixed[:, :, y0:y1, x0:x1] = images[perm, :, y0:y1, x0:x1]
        lam = 1.0 - (y1 - y0) * (x1 - x0) / (H * W)
    return MixedBatch(mixed, labels, labels[perm], ones * lam)


# -- the pipeline ---------------------------------------------------------------------------------


def augment_batch(
    images: Tensor,
    labels: Tensor,
    generator: torch.Generator,
    config: AugmentConfig,
    normalize: Callable[[Tensor], Tensor],
) -> MixedBatch:
    """Crop/flip (on the uint8 images) -> RandAugment (float, [0, 255]) -> ``normalize`` ->
    mixup/CutMix, every draw from ``generator``.

    Shapes:
        images uint8 ``(B, C, H, W)``, labels ``(B,)`` -> :class:`MixedBatch` of float images.
    """
    c = config
    if c.crop_padding or c.flip:
        images = random_crop_flip(
            images, generator, padding=c.crop_padding, pad_mode=c.pad_mode, flip=c.flip
        )
    if c.randaug_ops:
        images = rand_augment(
            images.float(), generator, n_ops=c.randaug_ops, magnitude=c.randaug_magnitude
        )
    x = normalize(images)
    if not c.mixes:
        return MixedBatch(x, labels, labels, torch.ones(len(labels)))
    return mix_batch(
        x,
        labels,
        generator,
        mixup_alpha=c.mixup_alpha,
        cutmix_alpha=c.cutmix_alpha,
        prob=c.mix_prob,
    )


__all__ = [
    "RAND_AUGMENT_OPS",
    "AugmentConfig",
    "MixedBatch",
    "PadMode",
    "augment_batch",
    "crop_flip",
    "crop_flip_params",
    "mix_batch",
    "rand_augment",
    "random_crop_flip",
]
