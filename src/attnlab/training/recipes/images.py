"""Image recipes: ViT (or a CNN baseline) on scikit-learn's 8x8 digits.

``digits``: 20% held out as the test split (scored once, at the end), 10% of the rest as the
validation split that training evaluates and hyperparameters are chosen on; ``model=cnn``
trains the :class:`~attnlab.models.cnn.CNNClassifier` baseline with the same budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from attnlab.config import Config, check_seed
from attnlab.data.images import ArrayImageDataset, load_digits
from attnlab.models.cnn import CNNConfig
from attnlab.models.vit import ViTConfig
from attnlab.tokenizers import Tokenizer
from attnlab.training.config import TrainConfig
from attnlab.training.objectives import ClassificationObjective, Objective
from attnlab.training.recipes.base import RECIPES, Data, Recipe


@dataclass(frozen=True, kw_only=True)
class DigitsOptions(Config):
    """The model and the splits of the digits recipe."""

    model: Literal["vit", "cnn"] = "vit"  # the ViT or the CNN baseline
    test_fraction: float = 0.2  # held-out test split (reported once, at the end)
    val_fraction: float = 0.1  # of the rest, the validation split (tuning)
    split_seed: int = 1  # seeds the test/val/train split

    def validate(self) -> None:
        super().validate()
        check_seed(split_seed=self.split_seed)
        for name in ("test_fraction", "val_fraction"):
            value = getattr(self, name)
            if not 0.0 < value < 1.0:
                raise ValueError(f"{name} must be in (0, 1), got {value}")


def _digits_data(options: DigitsOptions, tokenizer: Tokenizer | None, train: TrainConfig) -> Data:
    images, labels = load_digits()
    data = ArrayImageDataset(
        images, labels, test_fraction=options.test_fraction, val_fraction=options.val_fraction,
        seed=options.split_seed,
    )  # fmt: skip
    return Data(data, None, {"dataset": "scikit-learn digits", "images": len(images)})


# the digits recipe's two models (its ``model`` option): the ViT and the CNN baseline
DIGITS_MODELS: dict[str, Any] = {
    "vit": ViTConfig(
        image_size=8, patch_size=2, in_channels=1, n_classes=10, d_model=64, n_heads=4,
        n_layers=4, d_ff=128, dropout=0.1, norm_eps=1e-6, pool="mean",
    ),
    "cnn": CNNConfig(in_channels=1, n_classes=10, channels=32, dropout=0.1),
}  # fmt: skip


def _digits_config(options: Any, data: Data | None) -> Any:
    return DIGITS_MODELS[options.model]


def _digits_objective(options: Any, config: Any, data: Data, train: TrainConfig) -> Objective:
    return ClassificationObjective(data.value)


DIGITS = Recipe(
    "digits",
    "ViT (or model=cnn, a CNN baseline) on scikit-learn's 8x8 digits; 20% test, 10% val",
    DigitsOptions(),
    # lr chosen on the val split from {5e-4, 1e-3, 2e-3} (benchmarks/results/digits_val_sweep.json)
    TrainConfig(
        steps=3000, batch_size=64, optimizer="adamw", lr=5e-4, betas=(0.9, 0.99), adam_eps=1e-8,
        weight_decay=0.05, schedule="cosine", warmup=100, label_smoothing=0.1, clip_grad_norm=1.0,
        eval_every=250, eval_batches=6, checkpoint_every=500,
    ),
    _digits_config, _digits_data, _digits_objective,
    run_name=lambda o: f"digits-{o.model}",
    aliases={"digits_val_fraction": "val_fraction"},
    derived=(),
)  # fmt: skip
RECIPES.add(DIGITS.name, DIGITS)

__all__ = ["DigitsOptions"]
