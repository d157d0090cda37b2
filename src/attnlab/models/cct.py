"""Compact Convolutional Transformer (Hassani et al. 2021, "Escaping the Big Data Paradigm with
Compact Transformers"): the data-efficient ViT variant of exercise 7.

ViT with two changes (§3): the patch embedding becomes a small convolutional tokenizer
(:class:`~attnlab.layers.conv_tokenizer.ConvTokenizer`: conv-ReLU-max-pool blocks whose last
map's pixels are the tokens), and the [CLS] token becomes sequence pooling
(:class:`~attnlab.layers.conv_tokenizer.SequencePooling`: a learned softmax-weighted mean of
the output tokens). The encoder is ViT's: learned positions (or none: the convolutions already
carry position), pre-norm :class:`~attnlab.layers.blocks.EncoderLayer` s, a final norm, a linear
head.

Why it narrows the gap to a CNN on small data: ViT must learn locality and translation
invariance from data, which 50,000 images do not teach well; CCT's tokenizer builds both in
(overlapping 3x3 kernels, pooling), the way the CNN does, and keeps the attention layers for
global mixing. The paper reports its CCTs above ViT-Lite models with the same encoder on
CIFAR-10, and (Fig. 1) 80% on CIFAR-10 after under 30 minutes of training on a desktop CPU.

Preset ``cct-cifar`` is the paper's CCT-6/3x2 shape narrowed for a 30-minute run on two CPU cores
(see the preset's comment); the paper's CCT-7/3x1 is ``cct7-3x1``.

Shapes: B batch, C channels, H = W image side, P tokens, E d_model, K classes.

Deviations from the paper: no stochastic depth; positions are initialised like ViT's (truncated
normal with ``init_std``).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import Tensor, nn

from attnlab.config import check_positive
from attnlab.layers.conv_tokenizer import ConvTokenizer, SequencePooling, pooled_size
from attnlab.layers.positional import (
    LearnedPositionalEmbedding,
    NoPositionalEncoding,
    PositionalEncoding,
)
from attnlab.models.base import PretrainedModel
from attnlab.models.common import StackConfig, encoder_layer, norm
from attnlab.models.costs import Costs, ParamBreakdown, linear_params, norm_params, stack_params
from attnlab.models.family import Family, HookLayout, HookStack, Kind, register_family
from attnlab.models.vit import example_images


@dataclass(frozen=True, kw_only=True)
class CCTConfig(StackConfig):
    """Hyper-parameters of a CCT classifier (defaults: the paper's CCT-7/3x1 for CIFAR-10)."""

    model_type: ClassVar[str] = "cct"

    image_size: int = 32
    in_channels: int = 3
    n_classes: int = 10  # 0: no head; forward returns the pooled features (B, E)
    conv_layers: int = 1  # tokenizer blocks ("3x1": kernel 3, one block)
    conv_kernel: int = 3
    conv_channels: int = 64  # channels of the blocks before the last (which outputs d_model)
    pool_kernel: int = 3
    pool_stride: int = 2
    pool_padding: int = 1
    d_model: int = 256
    n_heads: int = 4
    n_layers: int = 7
    d_ff: int = 512  # the paper's MLP ratio 2
    dropout: float = 0.0
    attn_dropout: float | None = 0.1
    norm_position: Literal["pre", "post"] = "pre"
    final_norm: bool | None = True  # the encoder output is normalised before pooling
    activation: str = "gelu"
    pos_encoding: Literal["learned", "none"] = "learned"
    init_std: float = 0.02

    def validate(self) -> None:
        """The tokenizer first (``max_seq_len``, checked by the stack, depends on it).

        Raises:
            ValueError: naming the bad value.
        """
        self._check_tokenizer()
        super().validate()
        if self.n_classes < 0:
            raise ValueError(f"n_classes must be >= 0 (0: no head), got {self.n_classes}")

    def _check_tokenizer(self) -> None:
        names = ("image_size", "in_channels", "conv_layers", "conv_kernel", "conv_channels",
                 "pool_kernel", "pool_stride")  # fmt: skip
        check_positive(**{name: getattr(self, name) for name in names})
        if self.conv_kernel % 2 == 0:
            raise ValueError(f"conv_kernel must be odd, got {self.conv_kernel}")
        if self.pool_padding < 0 or 2 * self.pool_padding > self.pool_kernel:
            raise ValueError(
                f"pool_padding must be in [0, pool_kernel / 2], got {self.pool_padding}"
            )
        if self.grid_size < 1:
            raise ValueError(
                f"{self.conv_layers} tokenizer blocks leave no token of a {self.image_size}-pixel "
                "image; use fewer conv_layers or larger images"
            )

    @property
    def grid_size(self) -> int:
        """Side of the tokenizer's last map."""
        size = self.image_size
        for _ in range(self.conv_layers):
            size = pooled_size(size, self.pool_kernel, self.pool_stride, self.pool_padding)
        return size

    @property
    def n_patches(self) -> int:
        """P tokens per image (no [CLS])."""
        return self.grid_size**2

    @property
    def max_seq_len(self) -> int:
        """Tokens per image: the tokenizer's P."""
        return self.n_patches


class CCT(PretrainedModel):
    """Compact Convolutional Transformer: ``forward(images) -> logits (B, K)``."""

    def __init__(self, config: CCTConfig) -> None:
        super().__init__()
        c = self.config = config
        self.tokenizer = ConvTokenizer(
            c.in_channels,
            c.d_model,
            n_layers=c.conv_layers,
            hidden_channels=c.conv_channels,
            kernel_size=c.conv_kernel,
            pool_kernel=c.pool_kernel,
            pool_stride=c.pool_stride,
            pool_padding=c.pool_padding,
        )
        self.pos_encoding: PositionalEncoding = (
            LearnedPositionalEmbedding(c.d_model, c.max_seq_len)
            if c.pos_encoding == "learned"
            else NoPositionalEncoding()
        )
        self.dropout = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(encoder_layer(c, i) for i in range(c.n_layers))
        self.final_norm = norm(c) if c.use_final_norm else None
        self.pool = SequencePooling(c.d_model)
        self.head = nn.Linear(c.d_model, c.n_classes) if c.n_classes else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Truncated N(0, init_std) linears and positions, He-normal convolutions (the paper)."""
        std = self.config.init_std
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=std, a=-2 * std, b=2 * std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
        if isinstance(self.pos_encoding, LearnedPositionalEmbedding):
            nn.init.trunc_normal_(self.pos_encoding.weight, std=std, a=-2 * std, b=2 * std)

    def features(self, images: Tensor) -> Tensor:
        """The normalised encoder output ``(B, P, E)``.

        Raises:
            ValueError: for images of the wrong rank, channel count or size.
        """
        size = self.config.image_size
        if images.dim() == 4 and tuple(images.shape[-2:]) != (size, size):
            raise ValueError(
                f"expected {size}x{size} images (the position table has "
                f"{self.config.n_patches} tokens), got {tuple(images.shape)}"
            )
        x = self.tokenizer(images)  # (B, P, E)
        pos = torch.arange(x.shape[1], device=x.device)  # (P,)
        x = self.dropout(self.pos_encoding.embed(x, pos))
        for layer in self.layers:
            x = layer(x)
        return self.final_norm(x) if self.final_norm is not None else x

    def pooling_weights(self, images: Tensor) -> Tensor:
        """How much each token counts in the pooled vector ``(B, P)`` (rows sum to 1); reshape
        to ``(B, grid, grid)`` for a map over the image."""
        return self.pool.weights(self.features(images))

    def forward(self, images: Tensor) -> Tensor:
        """Classify images ``(B, C, H, W)`` -> logits ``(B, K)`` (the pooled features ``(B, E)``
        when ``n_classes`` is 0)."""
        pooled = self.pool(self.features(images))  # (B, E)
        return self.head(pooled) if self.head is not None else pooled


_CCT_CIFAR = CCTConfig(
    conv_layers=2, d_model=128, n_heads=2, n_layers=6, d_ff=256, attn_dropout=0.0
)
PRESETS: dict[str, CCTConfig] = {
    # The paper's CCT-7/3x1: 7 layers, E 256, 4 heads, MLP ratio 2, one 3x3 tokenizer block
    # (16x16 = 256 tokens); ~1.2 GMACs per image: too slow for 2 CPU cores in 30 minutes.
    "cct7-3x1": CCTConfig(),
    # CCT-6/3x2's shape (two 3x3 blocks: 8x8 = 64 tokens, the count of ViT with 4x4 patches)
    # at width 128 with 2 heads (CCT-2/4's width): about ViT-cifar's cost per image.
    "cct-cifar": _CCT_CIFAR,
    # CCT-4/3x2's depth at that width: two thirds of the encoder's cost per image, so more
    # epochs fit a fixed wall-clock budget
    "cct-cifar-small": dataclasses.replace(_CCT_CIFAR, n_layers=4),
}


# -- the family's declaration (attnlab.models.family) -----------------------------------------


def _params(c: CCTConfig) -> ParamBreakdown:
    widths = [c.in_channels] + [c.conv_channels] * (c.conv_layers - 1) + [c.d_model]
    k2 = c.conv_kernel**2
    comp = {"tokenizer.conv": sum(k2 * a * b for a, b in itertools.pairwise(widths))}
    if c.pos_encoding == "learned":
        comp["embedding.position"] = c.max_seq_len * c.d_model
    comp.update(stack_params("layers", c, c.n_layers))
    if c.use_final_norm:
        comp["final_norm"] = norm_params(c.d_model, c.norm, c.bias)
    comp["pool"] = linear_params(c.d_model, 1)  # sequence pooling's scores
    if c.n_classes:
        comp["head"] = linear_params(c.d_model, c.n_classes)
    return ParamBreakdown(comp, {"layers": c.n_layers})


def _hook_layout(model: CCT) -> HookLayout:
    stack = HookStack(
        "", (("embed.patch", model.tokenizer),), model.pos_encoding, model.layers,
        model.final_norm,
    )  # fmt: skip
    return HookLayout((stack,), head=model.head, head_axes=("batch", "class"))


FAMILY = register_family(
    Family(
        name="cct",
        config=CCTConfig,
        model=CCT,
        kind=Kind.IMAGE_CLASSIFIER,
        presets=PRESETS,
        description="Compact Convolutional Transformers: a conv tokenizer, sequence pooling",
        hooks=_hook_layout,
        costs=Costs(params=_params),
        example_inputs=example_images,
    )
)
