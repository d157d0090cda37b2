"""The CIFAR-10 recipe (exercise 7): a ResNet, a ViT and a CCT on 32x32 colour images.

``attnlab train cifar10 --model resnet20|vit-cifar|cct-cifar``: the data are the shared arrays
(:mod:`attnlab.data.cifar10`; a JPEG re-encoding of CIFAR-10, labelled so next to every
accuracy), 5,000 training images (500 per class) held out as the validation split that training
evaluates and hyper-parameters are chosen on, the official 10,000 test images scored by
``attnlab evaluate``. Training batches are random crops (reflect padding 4) and flips, optionally
RandAugment and mixup/CutMix (:mod:`attnlab.data.augment`); every epoch visits each training
image once, and the sampler position and augmentation generator are checkpointed, so a resumed
run continues bitwise.

Optimisation defaults follow the model: ResNets train with SGD (momentum 0.9, lr 0.1, weight
decay 5e-4, no label smoothing; He et al.), ViT and CCT with AdamW (lr 1e-3, weight decay 0.05,
betas 0.9/0.999, label smoothing 0.1, gradient clipping 1.0), all with batch 128 and a cosine
schedule after a linear warmup of 5% of the steps (at most 500); flags given win. Evaluation runs
on the whole validation split once per epoch (of CIFAR-10's training images that the options
keep: 45,000 by default) unless ``--eval-every`` says otherwise.
``--precision bf16`` runs the model under CPU bfloat16 autocast with the attention kept in
float32 (:func:`attnlab.transforms.float32_attention`): in this recipe it is the trainer's
``precision="bf16-mixed"`` (:mod:`attnlab.training.hardware`), the meaning it had before that
field existed (pure bfloat16 weights: ``--train.precision bf16``); ``--channels-last`` lays
batches and weights out NHWC. ``--train-per-class`` / ``--val-per-class`` /
``--test-per-class`` keep the first images of each class, for smoke runs.

:func:`evaluate_split` scores a trained run on a whole split: accuracy, per-class accuracy and
the confusion matrix (``attnlab evaluate RUN``, ``attnlab viz confusion RUN``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from attnlab.config import Config, check_positive, check_seed
from attnlab.data.augment import AugmentConfig
from attnlab.data.cifar10 import CLASSES, Cifar10
from attnlab.data.common import Split
from attnlab.models import config_for
from attnlab.models.common import StackConfig
from attnlab.tokenizers import Tokenizer
from attnlab.training.config import PrecisionName, TrainConfig
from attnlab.training.image_objective import (
    AugmentedClassificationObjective,
    confusion_matrix,
    predict,
)
from attnlab.training.objectives import Objective
from attnlab.training.recipes.base import RECIPES, Data, Prepared, Recipe

# --model -> the preset it trains
MODELS = {
    "resnet20": "resnet20-cifar",
    "resnet32": "resnet32-cifar",
    "resnet56": "resnet56-cifar",
    "resnet18": "resnet18-cifar",
    "vit-cifar": "vit-cifar",
    "vit-cifar-small": "vit-cifar-small",
    "cct-cifar": "cct-cifar",
    "cct-cifar-small": "cct-cifar-small",
    "cct7-3x1": "cct7-3x1",
}
ModelName = Literal[
    "resnet20",
    "resnet32",
    "resnet56",
    "resnet18",
    "vit-cifar",
    "vit-cifar-small",
    "cct-cifar",
    "cct-cifar-small",
    "cct7-3x1",
]
# the Transformers' optimisation (the TrainConfig below is the ResNets')
TRANSFORMER_TRAIN: dict[str, Any] = {
    "optimizer": "adamw", "lr": 1e-3, "weight_decay": 0.05, "betas": (0.9, 0.999),
    "adam_eps": 1e-8, "label_smoothing": 0.1, "clip_grad_norm": 1.0,
}  # fmt: skip
MAX_WARMUP = 500


@dataclass(frozen=True, kw_only=True)
class Cifar10Options(Config):
    """The model, the data and the augmentation of the cifar10 recipe."""

    model: ModelName = "resnet20"  # the preset trained (MODELS)
    data: str | None = None  # a directory with train.npz/test.npz; None: the data folders
    n_val: int = 5000  # training images held out as the validation split (stratified)
    split_seed: int = 0  # seeds the held-out choice
    train_per_class: int | None = None  # keep the first N training images of each class
    val_per_class: int | None = None
    test_per_class: int | None = None
    sampling: Literal["epoch", "random"] = "epoch"  # each image once per epoch, or i.i.d.
    crop_padding: int = 4  # random crop after padding by this much (0: none)
    pad_mode: Literal["reflect", "zero"] = "reflect"
    flip: bool = True  # random horizontal flips
    randaug_ops: int = 0  # RandAugment ops per image (0: off)
    randaug_magnitude: float = 0.3
    mixup_alpha: float = 0.0  # 0: off
    cutmix_alpha: float = 0.0  # 0: off
    mix_prob: float = 1.0  # probability that a batch is mixed (when mixup/CutMix is on)
    channels_last: bool = False  # NHWC batches and weights (oneDNN's preferred layout)

    def validate(self) -> None:
        """Sizes (the augmentation fields are checked by :class:`AugmentConfig`).

        Raises:
            ValueError: naming the bad value.
        """
        super().validate()
        check_positive(train_per_class=self.train_per_class, val_per_class=self.val_per_class,
                       test_per_class=self.test_per_class)  # fmt: skip
        check_seed(split_seed=self.split_seed)
        if self.n_val < len(CLASSES) or self.n_val % len(CLASSES):
            raise ValueError(
                f"n_val must be a positive multiple of {len(CLASSES)} (the same number of "
                f"images from every class; the trainer evaluates on them), got {self.n_val}"
            )
        self.augment()

    def augment(self) -> AugmentConfig:
        """The :class:`AugmentConfig` of these options."""
        names = [f.name for f in dataclasses.fields(AugmentConfig)]
        return AugmentConfig(**{n: getattr(self, n) for n in names})

    @property
    def n_train(self) -> int:
        """Training images these options keep of CIFAR-10 (balanced: 5,000 per class)."""
        per_class = 5000 - self.n_val // len(CLASSES)
        return len(CLASSES) * min(per_class, self.train_per_class or per_class)


def is_resnet(model_config: Any) -> bool:
    """Whether the config is one of the CNN baselines (they keep SGD's defaults): a model
    without a Transformer stack (its config is no :class:`~attnlab.models.common.StackConfig`,
    the fields every attention stack has)."""
    return not isinstance(model_config, StackConfig)


def _data(options: Cifar10Options, tokenizer: Tokenizer | None, train: TrainConfig) -> Data:
    data = Cifar10.load(options.data, n_val=options.n_val, seed=options.split_seed)
    per_class = {"train": options.train_per_class, "val": options.val_per_class,
                 "test": options.test_per_class}  # fmt: skip
    keep = {split: n for split, n in per_class.items() if n is not None}
    if keep:
        data = data.subset(keep)
    sizes = {f"{split} images": len(data.split(split)[1]) for split in data.splits}  # type: ignore[arg-type]
    info = {"dataset": data.source, **sizes}
    return Data(data, None, info, {"dataset": data.source, "classes": list(CLASSES)})


def _model_config(options: Cifar10Options, data: Data | None) -> Any:
    return config_for(MODELS[options.model])


def _objective(options: Cifar10Options, config: Any, data: Data, train: TrainConfig) -> Objective:
    return AugmentedClassificationObjective(
        data.value, options.augment(), sampling=options.sampling,
        channels_last=options.channels_last,
    )  # fmt: skip


def _transform(options: Cifar10Options, model: nn.Module) -> nn.Module:
    if options.channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    return model


def _precision(value: str) -> dict[str, Any]:
    """This recipe's ``precision``: ``bf16`` is bfloat16 autocast (``bf16-mixed``), as it was
    before the trainer had the field."""
    return {"train.precision": "bf16-mixed" if value == "bf16" else value}


def _adjust(
    options: Cifar10Options, train: TrainConfig, model_config: Any, given: set[str]
) -> TrainConfig:
    """The model family's optimisation, warmup and evaluation period, where not given."""
    changes: dict[str, Any] = {}
    if not is_resnet(model_config):
        changes.update({k: v for k, v in TRANSFORMER_TRAIN.items() if k not in given})
    if "warmup" not in given and train.steps is not None:
        changes["warmup"] = min(MAX_WARMUP, train.steps // 20)
    if "eval_every" not in given:
        changes["eval_every"] = math.ceil(options.n_train / train.batch_size)  # once per epoch
    return dataclasses.replace(train, **changes)


CIFAR10 = Recipe(
    "cifar10",
    "ResNet, ViT or CCT on CIFAR-10 (--model); 5,000 training images held out for validation",
    Cifar10Options(),
    TrainConfig(
        steps=10_000, batch_size=128, optimizer="sgd", lr=0.1, betas=(0.9, 0.999),
        weight_decay=5e-4, schedule="cosine", warmup=0, label_smoothing=0.0,
        best_metric="val_accuracy", checkpoint_every_minutes=5.0, log_every=50,
    ),
    _model_config, _data, _objective,
    adjust=_adjust,
    run_name=lambda o: f"cifar10-{o.model}",
    derived=("n_classes", "in_channels", "image_size"),
    model_transform=_transform,
    aliases={"precision": (_precision, PrecisionName)},
    variants=(Cifar10Options(model="vit-cifar"), Cifar10Options(model="cct-cifar")),
)  # fmt: skip
RECIPES.add(CIFAR10.name, CIFAR10)


@dataclass(frozen=True)
class SplitEvaluation:
    """A trained model scored on a whole split.

    Attributes:
        split, images, dataset: what was scored (``dataset``: the copy, to quote with it).
        accuracy: the fraction right. per_class: each class's accuracy (its recall).
        confusion: ``(K, K)`` counts, row = true class, column = predicted.
    """

    split: str
    images: int
    dataset: str
    accuracy: float
    per_class: dict[str, float]
    confusion: list[list[int]]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def evaluate_split(
    prepared: Prepared, split: Split = "test", *, batch_size: int = 500
) -> SplitEvaluation:
    """Score a cifar10 run's model on the whole ``split`` (as it trained: same precision and
    layout).

    Raises:
        ValueError: for a run of another recipe, or a split the data does not have.
    """
    if prepared.recipe.name != CIFAR10.name:
        raise ValueError(f"evaluate_split needs a cifar10 run, not {prepared.recipe.name!r}")
    data: Cifar10 = prepared.data.value
    options: Cifar10Options = prepared.options
    predicted, labels = predict(
        prepared.model, data, split, batch_size=batch_size,
        autocast=prepared.train.precision, channels_last=options.channels_last,
    )  # fmt: skip
    cm = confusion_matrix(predicted, labels, len(CLASSES))
    totals = cm.sum(dim=1).clamp_min(1)
    per_class = {name: float(cm[i, i] / totals[i]) for i, name in enumerate(CLASSES)}
    accuracy = float(cm.diagonal().sum() / max(len(labels), 1))
    return SplitEvaluation(split, len(labels), data.source, accuracy, per_class, cm.tolist())


__all__ = [
    "CIFAR10",
    "MODELS",
    "TRANSFORMER_TRAIN",
    "Cifar10Options",
    "SplitEvaluation",
    "evaluate_split",
    "is_resnet",
]
