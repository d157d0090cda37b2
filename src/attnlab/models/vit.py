"""The Vision Transformer (Dosovitskiy et al. 2020, "An Image is Worth 16x16 Words"; lesson §10).

Images are cut into ``p x p`` patches, each linearly projected to ``d_model``
(:class:`~attnlab.layers.patch_embedding.PatchEmbedding`); a learnable [CLS] token is prepended,
learned position embeddings are added, a pre-norm encoder stack and a final norm follow, and a
linear head classifies the [CLS] output (eq. 1-4 of the paper). ``n_classes=0`` drops the head
(a feature extractor); ``pooler`` adds BERT's tanh pooler before it (Hugging Face's ViTModel).

Shapes: B batch, C channels, H = W image side, P patches, E d_model, K classes.

Deviations from the paper: the classification head is a single linear layer (the fine-tuning
head of the paper; pre-training used an MLP with one hidden layer).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from attnlab.config import check_positive
from attnlab.layers.patch_embedding import PatchEmbedding
from attnlab.layers.positional import (
    LearnedPositionalEmbedding,
    NoPositionalEncoding,
    PositionalEncoding,
)
from attnlab.models.base import PretrainedModel
from attnlab.models.common import StackConfig, encoder_layer, final_norm
from attnlab.models.costs import (
    Costs,
    MatmulTerm,
    ParamBreakdown,
    activation_result,
    linear_params,
    norm_elems,
    norm_params,
    stack_activations,
    stack_params,
    stack_terms,
)
from attnlab.models.family import (
    ExplorerSpec,
    Family,
    HookLayout,
    HookStack,
    ImageShape,
    Kind,
    register_family,
)


@dataclass(frozen=True, kw_only=True)
class ViTConfig(StackConfig):
    """Hyper-parameters of a ViT classifier (defaults: ViT-B/16 at 224x224, 1000 classes)."""

    model_type: ClassVar[str] = "vit"

    image_size: int = 224  # square images H = W
    patch_size: int = 16
    in_channels: int = 3
    n_classes: int = 1000  # 0: no head; forward returns the pooled features (B, E)
    d_model: int = 768
    n_heads: int = 12
    n_layers: int = 12
    d_ff: int = 3072
    dropout: float = 0.0
    norm_eps: float = 1e-12
    norm_position: Literal["pre", "post"] = "pre"
    final_norm: bool | None = True  # ViT normalises the encoder output, pre- or post-norm
    activation: str = "gelu"
    pos_encoding: Literal["learned", "none"] = "learned"  # "none": permutation-equivariant
    pool: Literal["cls", "mean"] = "cls"  # classify the [CLS] output or the mean patch output
    pooler: bool = False  # tanh(dense(pooled)) before the head, as BERT's pooler
    init_std: float = 0.02

    def validate(self) -> None:
        super().validate()
        check_positive(
            image_size=self.image_size, patch_size=self.patch_size, in_channels=self.in_channels
        )
        if self.n_classes < 0:
            raise ValueError(f"n_classes must be >= 0 (0: no head), got {self.n_classes}")
        if self.image_size % self.patch_size:
            raise ValueError(
                f"image_size={self.image_size} is not a multiple of patch_size={self.patch_size}"
            )

    @property
    def n_patches(self) -> int:
        """P = (image_size / patch_size)²."""
        return (self.image_size // self.patch_size) ** 2

    @property
    def max_seq_len(self) -> int:
        """Tokens per image: the patches and [CLS]."""
        return self.n_patches + 1


class ViT(PretrainedModel):
    """Vision Transformer classifier: ``forward(images) -> logits (B, K)``."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        c = self.config = config
        self.patch_embed = PatchEmbedding(c.image_size, c.patch_size, c.in_channels, c.d_model)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.d_model))
        self.pos_encoding: PositionalEncoding = (
            LearnedPositionalEmbedding(c.d_model, c.max_seq_len)
            if c.pos_encoding == "learned"
            else NoPositionalEncoding()
        )
        self.dropout = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(encoder_layer(c, i) for i in range(c.n_layers))
        self.final_norm = final_norm(c)
        self.pooler = nn.Linear(c.d_model, c.d_model) if c.pooler else None
        self.head = nn.Linear(c.d_model, c.n_classes) if c.n_classes else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Truncated N(0, init_std) for linears, the patch projection, [CLS] and positions."""
        std = self.config.init_std
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                nn.init.trunc_normal_(m.weight, std=std, a=-2 * std, b=2 * std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        nn.init.trunc_normal_(self.cls_token, std=std, a=-2 * std, b=2 * std)
        if isinstance(self.pos_encoding, LearnedPositionalEmbedding):
            nn.init.trunc_normal_(self.pos_encoding.weight, std=std, a=-2 * std, b=2 * std)

    def features(self, images: Tensor) -> Tensor:
        """The normalised encoder output ``(B, 1 + P, E)`` ([CLS] first).

        Raises:
            ValueError: for images of the wrong rank, channel count or size.
        """
        x = self.patch_embed(images)  # (B, P, E)
        cls = self.cls_token.expand(x.shape[0], -1, -1)  # (B, 1, E)
        x = torch.cat((cls, x), dim=1)  # (B, 1 + P, E)
        pos = torch.arange(x.shape[1], device=x.device)  # (1 + P,)
        x = self.dropout(self.pos_encoding.embed(x, pos))
        for layer in self.layers:
            x = layer(x)
        return self.final_norm(x) if self.final_norm is not None else x

    def forward(self, images: Tensor) -> Tensor:
        """Classify images ``(B, C, H, W)`` -> logits ``(B, K)`` (the pooled features ``(B, E)``
        when ``n_classes`` is 0).

        Raises:
            ValueError: for images of the wrong rank, channel count or size.
        """
        h = self.features(images)  # (B, 1 + P, E)
        pooled = h[:, 0] if self.config.pool == "cls" else h[:, 1:].mean(dim=1)  # (B, E)
        if self.pooler is not None:
            pooled = torch.tanh(self.pooler(pooled))
        return self.head(pooled) if self.head is not None else pooled


def _vit(d_model: int, n_layers: int, n_heads: int, d_ff: int, patch_size: int) -> ViTConfig:
    return ViTConfig(
        d_model=d_model, n_layers=n_layers, n_heads=n_heads, d_ff=d_ff, patch_size=patch_size
    )


_VIT_CIFAR = ViTConfig(
    image_size=32, patch_size=4, in_channels=3, n_classes=10, d_model=192, n_heads=3,
    n_layers=6, d_ff=384, norm_eps=1e-6,
)  # fmt: skip

PRESETS: dict[str, ViTConfig] = {
    # Table 1 of the paper at 224x224 with a 1000-class (ImageNet) head.
    "vit-b16": _vit(768, 12, 12, 3072, 16),
    "vit-l16": _vit(1024, 24, 16, 4096, 16),
    "vit-h14": _vit(1280, 32, 16, 5120, 14),
    # 8x8 grey-scale digits (scikit-learn's load_digits shape), 2x2 patches, 10 classes.
    "vit-digits": ViTConfig(
        image_size=8,
        patch_size=2,
        in_channels=1,
        n_classes=10,
        d_model=64,
        n_heads=4,
        n_layers=4,
        d_ff=128,
        dropout=0.1,
        norm_eps=1e-6,
    ),
    # CIFAR-10 (exercise 7): 32x32 RGB, 4x4 patches (64 + [CLS] tokens), E 192, 3 heads of 64,
    # MLP ratio 2 (ViT-Lite's), 6 layers: sized for 30 minutes on two CPU cores.
    "vit-cifar": _VIT_CIFAR,
    # the same depth and patches at E 128 (4 heads of 32, MLP 256): 0.81M parameters and 116
    # forward MFLOPs per image (0.45x and 0.46x vit-cifar's), about twice the epochs per minute
    "vit-cifar-small": dataclasses.replace(_VIT_CIFAR, d_model=128, n_heads=4, d_ff=256),
}


# -- the family's declaration (attnlab.models.family) -----------------------------------------


def _params(c: ViTConfig) -> ParamBreakdown:
    comp = {
        "embedding.patch": c.in_channels * c.patch_size**2 * c.d_model + c.d_model,
        "embedding.cls": c.d_model,
    }
    if c.pos_encoding == "learned":
        comp["embedding.position"] = c.max_seq_len * c.d_model
    comp.update(stack_params("layers", c, c.n_layers))
    comp["final_norm"] = norm_params(c.d_model, c.norm, c.bias)
    if c.pooler:
        comp["pooler"] = linear_params(c.d_model, c.d_model)
    if c.n_classes:  # 0: a feature extractor without a head
        comp["head"] = linear_params(c.d_model, c.n_classes)
    return ParamBreakdown(comp, {"layers": c.n_layers})


def _flops(c: ViTConfig, B: int, n: int, src: int | None) -> tuple[list[MatmulTerm], int]:
    # The patch projection is a matmul per patch: (C·p·p) inputs -> E; images need no gradient.
    patch_in = c.in_channels * c.patch_size**2
    terms = [MatmulTerm("patch_embed.proj", B * (n - 1), patch_in, c.d_model, 1, True)]
    stack, softmax = stack_terms("layers", c, batch=B, n=n, n_layers=c.n_layers)
    terms += stack
    if c.pooler:
        terms.append(MatmulTerm("pooler", B, c.d_model, c.d_model))  # on the pooled vector
    if c.n_classes:
        terms.append(MatmulTerm("head", B, c.d_model, c.n_classes))
    return terms, softmax


def _activations(
    c: ViTConfig, *, batch: int, seq_len: int, src_len: int | None, a: int, every: int
) -> dict[str, int]:
    B, T, t = batch, seq_len, batch * seq_len
    act, fp32, scores = stack_activations(c, B=B, T=T, n_layers=c.n_layers, masked=False,
                                          every=every)  # fmt: skip
    outside = (t * c.d_model + norm_elems(c, t)) * a  # final norm
    outside += B * (T - 1) * c.in_channels * c.patch_size**2 * a  # images (conv weight grad)
    # what the pooler/head keeps: [CLS] is a view keeping the final hidden state alive, a
    # mean is a new (B, E); a pooler keeps its tanh output too (the head's input)
    if c.pooler or c.n_classes:
        outside += (t if c.pool == "cls" else B) * c.d_model * a
    if c.pooler:
        outside += B * c.d_model * a
    return activation_result(act, fp32, scores, outside, a)


def _notes(c: ViTConfig, n: int) -> list[str]:
    if n != c.max_seq_len:
        return [f"seq_len={n} means {n - 1} patches, another image size than the config's"]
    return []


COSTS = Costs(
    params=_params,
    flops=_flops,
    activations=_activations,
    min_seq_len=2,
    min_seq_len_why="a ViT sequence is [CLS] + at least one patch",
    notes=_notes,
)


def _hook_layout(model: ViT) -> HookLayout:
    stack = HookStack(
        "", (("embed.patch", model.patch_embed),), model.pos_encoding, model.layers,
        model.final_norm,
    )  # fmt: skip
    return HookLayout((stack,), head=model.head, head_axes=("batch", "class"))


def example_images(
    c: Any,
    *,
    batch: int = 1,
    seq_len: int | None = None,
    src_len: int | None = None,
    generator: torch.Generator,
) -> tuple[tuple[Tensor, ...], dict[str, Tensor]]:
    """Random images ``(B, C, H, W)`` of an image classifier's config (its own size only)."""
    if seq_len not in (None, c.max_seq_len):
        raise ValueError(
            f"this {type(c).__name__.removesuffix('Config')} sees {c.max_seq_len} tokens per "
            f"image; change image_size to measure seq_len={seq_len}"
        )
    shape = (batch, c.in_channels, c.image_size, c.image_size)
    return (torch.randn(shape, generator=generator),), {}


FAMILY = register_family(
    Family(
        name="vit",
        config=ViTConfig,
        model=ViT,
        kind=Kind.IMAGE_CLASSIFIER,
        presets=PRESETS,
        description="Vision Transformers: patches, [CLS], an encoder and a linear head",
        hooks=_hook_layout,
        costs=COSTS,
        example_inputs=example_images,
        explorer=ExplorerSpec(
            images=lambda c: ImageShape(c.image_size, c.in_channels, c.patch_size)
        ),
    )
)
