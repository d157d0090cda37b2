"""Image patches as tokens (ViT, Dosovitskiy et al. 2020, §3.1).

An image ``(C, H, W)`` is cut into ``P = (H / p) · (W / p)`` non-overlapping ``p x p`` patches,
each flattened to ``C · p · p`` values and linearly projected to ``d_model``. A ``Conv2d`` with
kernel = stride = ``p`` is exactly that linear map applied to every patch; :func:`patchify` /
:func:`unpatchify` expose the flattening (order ``(C, p_h, p_w)`` inside a patch, patches in
row-major order) so the equivalence can be checked and images reassembled.

Shapes: B batch, C channels, H/W image height/width, p patch size, P patches, E d_model.

Deviations from the paper: none (the paper's "hybrid" CNN stem is not implemented).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def _check_images(images: Tensor, patch_size: int, channels: int | None = None) -> None:
    if images.dim() != 4:
        raise ValueError(f"images must be (B, C, H, W), got shape {tuple(images.shape)}")
    _, n_channels, H, W = images.shape
    if channels is not None and n_channels != channels:
        raise ValueError(f"expected images with {channels} channels, got {n_channels}")
    if H % patch_size or W % patch_size:
        raise ValueError(f"image size {H}x{W} is not a multiple of the patch size {patch_size}")


def patchify(images: Tensor, patch_size: int) -> Tensor:
    """Cut images into flattened non-overlapping patches, row-major over the patch grid.

    Shapes:
        ``(B, C, H, W)`` -> ``(B, P, C·p·p)`` with ``P = (H/p)·(W/p)``.

    Raises:
        ValueError: if ``images`` is not 4-D or H/W is not a multiple of ``patch_size``.
    """
    _check_images(images, patch_size)
    B, C, H, W = images.shape
    p = patch_size
    x = images.reshape(B, C, H // p, p, W // p, p)  # (B, C, H/p, p, W/p, p)
    x = x.permute(0, 2, 4, 1, 3, 5)  # (B, H/p, W/p, C, p, p)
    return x.reshape(B, (H // p) * (W // p), C * p * p)  # (B, P, C·p·p)


def unpatchify(patches: Tensor, patch_size: int, height: int, width: int) -> Tensor:
    """Inverse of :func:`patchify`: reassemble ``(B, P, C·p·p)`` patches into images.

    Shapes:
        ``(B, P, C·p·p)`` -> ``(B, C, height, width)``.

    Raises:
        ValueError: if the patch count or size does not fit ``height x width``.
    """
    p = patch_size
    if height % p or width % p:
        raise ValueError(f"image size {height}x{width} is not a multiple of the patch size {p}")
    B, n_patches, F = patches.shape
    gh, gw = height // p, width // p
    if n_patches != gh * gw or F % (p * p):
        raise ValueError(
            f"patches of shape {tuple(patches.shape)} do not tile a {height}x{width} image "
            f"with patch size {p}"
        )
    C = F // (p * p)
    x = patches.reshape(B, gh, gw, C, p, p)  # (B, H/p, W/p, C, p, p)
    x = x.permute(0, 3, 1, 4, 2, 5)  # (B, C, H/p, p, W/p, p)
    return x.reshape(B, C, height, width)  # (B, C, H, W)


class PatchEmbedding(nn.Module):
    """Linear projection of flattened patches, as a strided convolution.

    Args:
        image_size: expected square image side (H = W).
        patch_size: p (must divide ``image_size``).
        in_channels: C. d_model: E. bias: bias of the projection.

    Raises:
        ValueError: for sizes that are not positive or an image size not divisible by ``p``.
    """

    def __init__(
        self, image_size: int, patch_size: int, in_channels: int, d_model: int, *, bias: bool = True
    ) -> None:
        super().__init__()
        if min(image_size, patch_size, in_channels, d_model) <= 0:
            raise ValueError(
                f"sizes must be positive, got image_size={image_size}, patch_size={patch_size}, "
                f"in_channels={in_channels}, d_model={d_model}"
            )
        if image_size % patch_size:
            raise ValueError(
                f"image_size={image_size} is not a multiple of patch_size={patch_size}"
            )
        self.image_size, self.patch_size, self.in_channels = image_size, patch_size, in_channels
        self.n_patches = (image_size // patch_size) ** 2
        self.proj = nn.Conv2d(
            in_channels, d_model, kernel_size=patch_size, stride=patch_size, bias=bias
        )

    def forward(self, images: Tensor) -> Tensor:
        """images ``(B, C, H, W)`` -> patch tokens ``(B, P, E)``.

        Raises:
            ValueError: for a wrong rank, channel count or image size.
            TypeError: for images that are not floating point of the projection's dtype.
        """
        _check_images(images, self.patch_size, self.in_channels)
        dtype = self.proj.weight.dtype
        if not images.is_floating_point() or (
            images.dtype != dtype and not torch.is_autocast_enabled(images.device.type)
        ):
            raise TypeError(
                f"images must be {dtype} like the model's weights, got {images.dtype} "
                "(convert the images, or the model with .to(dtype))"
            )
        H, W = images.shape[-2:]
        if (self.image_size, self.image_size) != (H, W):
            raise ValueError(
                f"expected {self.image_size}x{self.image_size} images (the position table has "
                f"{self.n_patches} patches), got {H}x{W}"
            )
        x = self.proj(images)  # (B, E, H/p, W/p)
        return x.flatten(2).transpose(1, 2)  # (B, P, E)

    def extra_repr(self) -> str:
        return f"image_size={self.image_size}, patch_size={self.patch_size}"


__all__ = ["PatchEmbedding", "patchify", "unpatchify"]
