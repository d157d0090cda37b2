"""A small convolutional classifier: the baseline the ``digits`` recipe compares ViT with
(the lesson's exercise 7: "does attention beat a CNN on tiny images?").

Two 3x3 conv blocks (conv, batch norm, ReLU), the second followed by 2x2 max-pooling, then global
average pooling and a linear head. Not a Transformer, but a model like the others: a config, a
``model_type`` (``"cnn"``), checkpoints, ``build_model``.

Shapes: B batch, C channels, H x W pixels, K classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor, nn

from attnlab.config import Config, check_positive, check_probability
from attnlab.models.base import PretrainedModel
from attnlab.models.common import image_inputs
from attnlab.models.family import Family, Kind, register_family


@dataclass(frozen=True, kw_only=True)
class CNNConfig(Config):
    """Hyper-parameters of :class:`CNNClassifier`."""

    model_type: ClassVar[str] = "cnn"

    in_channels: int = 1
    n_classes: int = 10
    channels: int = 32  # first block; the second has twice as many
    dropout: float = 0.1

    def validate(self) -> None:
        super().validate()
        check_positive(in_channels=self.in_channels, n_classes=self.n_classes,
                       channels=self.channels)  # fmt: skip
        check_probability(dropout=self.dropout)


class CNNClassifier(PretrainedModel):
    """``forward(images (B, C, H, W)) -> logits (B, K)``."""

    def __init__(self, config: CNNConfig) -> None:
        super().__init__()
        c = self.config = config
        width = 2 * c.channels
        self.features = nn.Sequential(
            nn.Conv2d(c.in_channels, c.channels, 3, padding=1),
            nn.BatchNorm2d(c.channels),
            nn.ReLU(),
            nn.Conv2d(c.channels, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.dropout = nn.Dropout(c.dropout)
        self.head = nn.Linear(width, c.n_classes)

    def forward(self, images: Tensor) -> Tensor:
        """images ``(B, C, H, W)`` -> logits ``(B, K)``."""
        h = self.features(images)  # (B, 2C, H/2, W/2)
        return self.head(self.dropout(h.mean(dim=(2, 3))))  # (B, K)


FAMILY = register_family(
    Family(
        name="cnn",
        config=CNNConfig,
        model=CNNClassifier,
        kind=Kind.IMAGE_CLASSIFIER,
        presets={},
        description="a small CNN classifier, the digits recipe's baseline",
        example_inputs=image_inputs(8),  # the digits recipe's images; any size works
    )
)


__all__ = ["CNNClassifier", "CNNConfig"]
