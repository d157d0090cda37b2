"""Residual networks for 32x32 images (He et al. 2016, "Deep Residual Learning", §4.2).

The CIFAR-10 ResNets of §4.2: a 3x3 convolution with 16 filters, then three stages of ``n``
basic blocks on 32x32, 16x16 and 8x8 maps with 16, 32 and 64 filters (the first block of a stage
halves the map with stride 2), global average pooling and a linear classifier: ``6n + 2`` layers
(``n = 3, 5, 9``: ResNet-20, -32, -56; 0.27M, 0.46M, 0.85M parameters). A basic block is
``relu(x + BN(conv3x3(relu(BN(conv3x3(x))))))``, batch norm after every convolution.

Shortcuts where the shape changes: option ``"A"`` (the paper's choice for CIFAR) is the identity
on every second pixel with the new channels zero-padded, parameter-free; option ``"B"`` is a
strided 1x1 convolution + BN (identity elsewhere). The same blocks with 64-128-256-512 channels
and two blocks per stage give the ResNet-18 used on CIFAR by later work (a 3x3 stem, no max-pool:
"resnet18-cifar"), 11.2M parameters and 0.56 GMACs per image, ~14x ResNet-20's.

Shapes: B batch, C channels, H x W pixels, K classes.

Deviations from the paper: none for ResNet-20/32/56 (weights He-initialised, BN gains 1);
``zero_init_residual`` (off by default) starts each block's last BN gain at 0 (Goyal et al.
2017).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import Config, check_positive
from attnlab.models.base import PretrainedModel
from attnlab.models.common import image_inputs
from attnlab.models.costs import Costs, ParamBreakdown, linear_params
from attnlab.models.family import Family, Kind, register_family


@dataclass(frozen=True, kw_only=True)
class ResNetConfig(Config):
    """Hyper-parameters of a CIFAR ResNet (defaults: ResNet-20, option-A shortcuts)."""

    model_type: ClassVar[str] = "resnet"

    in_channels: int = 3
    n_classes: int = 10
    stage_channels: tuple[int, ...] = (16, 32, 64)  # the stem outputs the first
    blocks_per_stage: tuple[int, ...] = (3, 3, 3)  # n of §4.2 per stage
    shortcut: Literal["A", "B"] = "A"
    bn_eps: float = 1e-5
    bn_momentum: float = 0.1
    zero_init_residual: bool = False

    def validate(self) -> None:
        """Positive sizes, one block count per stage, option A only with widening stages.

        Raises:
            ValueError: naming the bad value.
        """
        super().validate()
        check_positive(in_channels=self.in_channels, n_classes=self.n_classes,
                       bn_eps=self.bn_eps)  # fmt: skip
        if not self.stage_channels or len(self.stage_channels) != len(self.blocks_per_stage):
            raise ValueError(
                f"stage_channels {self.stage_channels} and blocks_per_stage "
                f"{self.blocks_per_stage} must be non-empty and of the same length"
            )
        for i, (c, n) in enumerate(zip(self.stage_channels, self.blocks_per_stage, strict=True)):
            check_positive(**{f"stage_channels[{i}]": c, f"blocks_per_stage[{i}]": n})
        if self.shortcut == "A" and any(
            b < a for a, b in zip(self.stage_channels, self.stage_channels[1:], strict=False)
        ):
            raise ValueError(
                f"shortcut 'A' needs non-decreasing stage_channels, got {self.stage_channels}"
            )
        if not 0 < self.bn_momentum <= 1:
            raise ValueError(f"bn_momentum must be in (0, 1], got {self.bn_momentum}")

    @property
    def depth(self) -> int:
        """Weighted layers: two convolutions per block, the stem and the classifier."""
        return 2 * sum(self.blocks_per_stage) + 2


class BasicBlock(nn.Module):
    """Two 3x3 conv + BN, a shortcut, ReLU after the sum (§3.3, Fig. 2 left).

    Args:
        in_channels, out_channels: C in and out. stride: 2 halves H and W in ``conv1``.
        shortcut: ``"A"`` (zero-padded identity) or ``"B"`` (1x1 projection) when the shape
            changes. bn_eps, bn_momentum: of the batch norms.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        stride: int = 1,
        *,
        shortcut: str = "A",
        bn_eps: float = 1e-5,
        bn_momentum: float = 0.1,
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels, bn_eps, bn_momentum)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels, bn_eps, bn_momentum)
        self.stride, self.pad = stride, out_channels - in_channels
        changes = stride != 1 or in_channels != out_channels
        self.projection: nn.Sequential | None = None
        if changes and shortcut == "B":
            self.projection = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                nn.BatchNorm2d(out_channels, bn_eps, bn_momentum),
            )

    def shortcut(self, x: Tensor) -> Tensor:
        """The identity, subsampled and zero-padded (A), or projected (B): ``(B, C_out, ...)``."""
        if self.projection is not None:
            return self.projection(x)
        if self.stride != 1:
            x = x[:, :, :: self.stride, :: self.stride]  # (B, C_in, H/s, W/s)
        if self.pad:
            x = F.pad(x, (0, 0, 0, 0, 0, self.pad))  # (B, C_out, H/s, W/s): zeros appended
        return x

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(h)) + self.shortcut(x))


class ResNet(PretrainedModel):
    """CIFAR ResNet classifier: ``forward(images (B, C, H, W)) -> logits (B, K)``."""

    def __init__(self, config: ResNetConfig) -> None:
        super().__init__()
        c = self.config = config
        width = c.stage_channels[0]
        self.stem = nn.Sequential(
            nn.Conv2d(c.in_channels, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width, c.bn_eps, c.bn_momentum),
            nn.ReLU(),
        )
        stages = []
        for i, (channels, n) in enumerate(zip(c.stage_channels, c.blocks_per_stage, strict=True)):
            blocks = []
            for j in range(n):
                stride = 2 if i > 0 and j == 0 else 1
                blocks.append(
                    BasicBlock(
                        width,
                        channels,
                        stride,
                        shortcut=c.shortcut,
                        bn_eps=c.bn_eps,
                        bn_momentum=c.bn_momentum,
                    )
                )
                width = channels
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(width, c.n_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """He (fan-out, ReLU) normal convolutions, BN gains 1 and shifts 0, torch's default
        linear head; the last BN of every block at 0 with ``zero_init_residual``."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        for m in self.modules():  # after the loop above, which visits a block before its BNs
            if isinstance(m, BasicBlock) and self.config.zero_init_residual:
                nn.init.zeros_(m.bn2.weight)
        self.head.reset_parameters()

    def features(self, images: Tensor) -> Tensor:
        """The globally average-pooled last feature map ``(B, C_last)``.

        Raises:
            ValueError: for images of the wrong rank or channel count.
        """
        if images.dim() != 4 or images.shape[1] != self.config.in_channels:
            raise ValueError(
                f"images must be (B, {self.config.in_channels}, H, W), got {tuple(images.shape)}"
            )
        return self.stages(self.stem(images)).mean(dim=(2, 3))  # (B, C_last)

    def forward(self, images: Tensor) -> Tensor:
        """Classify images ``(B, C, H, W)`` -> logits ``(B, K)``."""
        return self.head(self.features(images))


def _cifar(n: int) -> ResNetConfig:
    return ResNetConfig(blocks_per_stage=(n, n, n))


PRESETS: dict[str, ResNetConfig] = {
    # §4.2, Table 6: 6n + 2 layers with option-A shortcuts.
    "resnet20-cifar": _cifar(3),
    "resnet32-cifar": _cifar(5),
    "resnet56-cifar": _cifar(9),
    # ResNet-18 (Table 1's widths) with a 3x3 stem and no max-pool, for 32x32 inputs.
    "resnet18-cifar": ResNetConfig(
        stage_channels=(64, 128, 256, 512), blocks_per_stage=(2, 2, 2, 2), shortcut="B"
    ),
}


# -- the family's declaration (attnlab.models.family) -----------------------------------------


def _params(c: ResNetConfig) -> ParamBreakdown:
    """3x3 convolutions without bias, BN gain + shift after each, option-B projections."""
    width = c.stage_channels[0]
    comp = {"stem.conv": 9 * c.in_channels * width, "stem.norm": 2 * width}
    conv = norms = projection = projection_norms = 0
    for i, (channels, n) in enumerate(zip(c.stage_channels, c.blocks_per_stage, strict=True)):
        for j in range(n):
            conv += 9 * width * channels + 9 * channels * channels
            norms += 2 * 2 * channels
            changes = (i > 0 and j == 0) or width != channels
            if changes and c.shortcut == "B":
                projection += width * channels
                projection_norms += 2 * channels
            width = channels
    comp.update({"stages.conv": conv, "stages.norms": norms})
    if projection:
        comp.update({"stages.conv_shortcut": projection, "stages.shortcut_norms": projection_norms})
    comp["head"] = linear_params(width, c.n_classes)
    return ParamBreakdown(comp, {})


FAMILY = register_family(
    Family(
        name="resnet",
        config=ResNetConfig,
        model=ResNet,
        kind=Kind.IMAGE_CLASSIFIER,
        presets=PRESETS,
        description="CIFAR ResNets (He et al. 2016, §4.2)",
        costs=Costs(params=_params),
        example_inputs=image_inputs(32),  # CIFAR's images, which the stages are sized for
    )
)
