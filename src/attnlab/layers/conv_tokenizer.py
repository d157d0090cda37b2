"""The convolutional tokenizer and sequence pooling of Compact Convolutional Transformers
(Hassani et al. 2021, "Escaping the Big Data Paradigm with Compact Transformers", §3).

:class:`ConvTokenizer` replaces ViT's patch embedding with ``n`` blocks of
``conv(k x k, stride 1, padding k//2, no bias) -> ReLU -> max-pool(3, stride 2, padding 1)``; the
last block outputs ``d_model`` channels and every pixel of its map is a token. Overlapping
kernels and pooling give the tokens local context and translation equivariance that
non-overlapping patches lack: an inductive bias that a transformer would otherwise have to learn
from many more images. Two blocks take 32x32 to 8x8: 64 tokens, as many as ViT with 4x4 patches.

:class:`SequencePooling` replaces the [CLS] token: a linear map scores every output token,
a softmax over the sequence turns the scores into weights, and the pooled vector is the weighted
sum of the tokens, ``z = softmax(g(x_L)ᵀ) · x_L`` (eq. 2-3 of the paper). The weights say which
tokens the classification reads, one value per token (:meth:`SequencePooling.weights`).

Shapes: B batch, C channels, H x W pixels, P tokens (= pixels of the last map), E d_model.

Deviations from the paper: none (its code also has no bias in the tokenizer convolutions).
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor, nn


def pooled_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """The side of a map after ``nn.MaxPool2d(kernel, stride, padding)`` (floor mode)."""
    return (size + 2 * padding - kernel) // stride + 1


class ConvTokenizer(nn.Module):
    """Images -> tokens by ``n_layers`` conv-ReLU-max-pool blocks.

    Args:
        in_channels: C of the images. d_model: E, channels of the last block.
        n_layers: blocks. hidden_channels: channels of the blocks before the last.
        kernel_size: k of the convolutions (odd, so ``padding = k // 2`` keeps the size).
        pool_kernel, pool_stride, pool_padding: of the max-pooling after each convolution.

    Raises:
        ValueError: for non-positive sizes or an even kernel.
    """

    def __init__(
        self,
        in_channels: int,
        d_model: int,
        *,
        n_layers: int = 2,
        hidden_channels: int = 64,
        kernel_size: int = 3,
        pool_kernel: int = 3,
        pool_stride: int = 2,
        pool_padding: int = 1,
    ) -> None:
        super().__init__()
        sizes = (
            in_channels,
            d_model,
            n_layers,
            hidden_channels,
            kernel_size,
            pool_kernel,
            pool_stride,
        )
        if min(sizes) <= 0 or pool_padding < 0:
            raise ValueError(f"tokenizer sizes must be positive, got {sizes}, {pool_padding=}")
        if kernel_size % 2 == 0:
            raise ValueError(
                f"kernel_size must be odd (padding k // 2 keeps the size), got {kernel_size}"
            )
        widths = [in_channels] + [hidden_channels] * (n_layers - 1) + [d_model]
        blocks = []
        for c_in, c_out in itertools.pairwise(widths):
            blocks += [
                nn.Conv2d(c_in, c_out, kernel_size, 1, padding=kernel_size // 2, bias=False),
                nn.ReLU(),
                nn.MaxPool2d(pool_kernel, pool_stride, pool_padding),
            ]
        self.blocks = nn.Sequential(*blocks)
        self.n_layers, self.in_channels = n_layers, in_channels
        self.pool = (pool_kernel, pool_stride, pool_padding)

    def grid_size(self, image_size: int) -> int:
        """The side of the token grid for ``image_size x image_size`` images."""
        for _ in range(self.n_layers):
            image_size = pooled_size(image_size, *self.pool)
        return image_size

    def forward(self, images: Tensor) -> Tensor:
        """images ``(B, C, H, W)`` -> tokens ``(B, P, E)``, row-major over the last map.

        Raises:
            ValueError: for images of the wrong rank or channel count.
        """
        if images.dim() != 4 or images.shape[1] != self.in_channels:
            raise ValueError(
                f"images must be (B, {self.in_channels}, H, W), got {tuple(images.shape)}"
            )
        x = self.blocks(images)  # (B, E, H', W')
        return x.flatten(2).transpose(1, 2)  # (B, P, E)


class SequencePooling(nn.Module):
    """Attention-weighted mean of the tokens: ``z = softmax(x Wᵀ + b over P)ᵀ x``.

    Args:
        d_model: E.
    """

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.score = nn.Linear(d_model, 1)

    def weights(self, x: Tensor) -> Tensor:
        """The pooling weights of tokens ``(B, P, E)``: ``(B, P)``, rows summing to 1."""
        return torch.softmax(self.score(x).squeeze(-1).float(), dim=-1).to(x.dtype)  # (B, P)

    def forward(self, x: Tensor) -> Tensor:
        """tokens ``(B, P, E)`` -> pooled ``(B, E)``."""
        w = self.weights(x)  # (B, P)
        return torch.einsum("bp,bpe->be", w, x)  # (B, E)


__all__ = ["ConvTokenizer", "SequencePooling", "pooled_size"]
