"""The augmented image objective: epoch and random sampling with a bitwise-resumable position,
the mixed loss, whole-split evaluation batches, predictions and the confusion matrix, and a
resumed trainer run (the augmentation itself: tests/data/test_augment.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.data.augment import AugmentConfig
from attnlab.data.cifar10 import Cifar10, Cifar10Arrays
from attnlab.training.image_objective import (
    AugmentedClassificationObjective,
    confusion_matrix,
    predict,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def fake_data(n_train: int = 20, n_test: int = 10, n_val: int = 0) -> Cifar10:
    rng = np.random.default_rng(0)
    make = lambda n: rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)  # noqa: E731
    labels = lambda n: np.arange(n, dtype=np.uint8) % 10  # noqa: E731
    arrays = Cifar10Arrays(make(n_train), labels(n_train), make(n_test), labels(n_test), "fake")
    return Cifar10(arrays, n_val=n_val)


def test_epoch_sampling_visits_every_image_once_and_resumes_bitwise() -> None:
    data = fake_data(20)
    obj = AugmentedClassificationObjective(data, AugmentConfig(randaug_ops=1, mixup_alpha=0.5))
    stream = obj.train_stream(8, seed=1)
    seen = torch.cat([stream.next_index() for _ in range(5)])  # 40 = two epochs
    assert sorted(seen[:20].tolist()) == list(range(20)) == sorted(seen[20:].tolist())
    assert not torch.equal(seen[:20], seen[20:])  # a new order each epoch
    assert stream.epoch == 2.0 and stream.batches_per_epoch == 3
    # resume: the state (position + augmentation generator) gives the same next batches,
    # one of them spanning two epochs
    stream.next_batch()
    state = stream.state_dict()
    expected = [stream.next_batch() for _ in range(3)]
    fresh = obj.train_stream(8, seed=1)
    fresh.load_state_dict(state)
    got = [fresh.next_batch() for _ in range(3)]
    for a, b in zip(expected, got, strict=True):
        assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    assert stream.loader_seconds > 0
    other = obj.train_stream(8, seed=2)
    assert not torch.equal(other.next_index(), obj.train_stream(8, seed=1).next_index())
    with pytest.raises(ValueError, match="drawn must be >= 0"):
        fresh.load_state_dict({**state, "drawn": -1})


def test_random_sampling_draws_with_replacement_from_the_stream_generator() -> None:
    obj = AugmentedClassificationObjective(fake_data(20), None, sampling="random")
    a, b = obj.train_stream(30, seed=0), obj.train_stream(30, seed=0)
    index = a.next_index()
    assert torch.equal(index, b.next_index()) and len(set(index.tolist())) < 20  # repeats
    assert a.epoch == 1.5
    with pytest.raises(ValueError, match="sampling='cyclic' is not valid"):
        AugmentedClassificationObjective(fake_data(), sampling="cyclic")  # type: ignore[arg-type]


def test_mixed_loss_is_the_weighted_cross_entropy() -> None:
    data = fake_data()
    obj = AugmentedClassificationObjective(data, AugmentConfig(mixup_alpha=1.0))
    batch = obj.train_stream(8, seed=4).next_batch()
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))
    terms = obj.loss(model, batch, label_smoothing=0.0)
    logits = model(batch.images)
    lam = batch.lam
    assert (lam < 1).all()
    expected = (
        lam * F.cross_entropy(logits, batch.labels, reduction="none")
        + (1 - lam) * F.cross_entropy(logits, batch.labels_b, reduction="none")
    ).sum()
    torch.testing.assert_close(terms.loss_sum, expected)
    assert terms.count == 8 and 0 <= terms.correct <= 8


def test_val_batches_are_the_whole_split_in_order_normalised() -> None:
    data = fake_data(20, n_val=10)
    obj = AugmentedClassificationObjective(data, AugmentConfig(mixup_alpha=1.0))
    batches = obj.val_batches(4, n_batches=1, seed=0)  # the whole split whatever n_batches
    assert [len(b.labels) for b in batches] == [4, 4, 2]
    x, y = data.split("val")
    assert torch.equal(torch.cat([b.labels for b in batches]), y)
    assert torch.equal(torch.cat([b.images for b in batches]), data.normalize(x))
    assert all(torch.equal(b.lam, torch.ones(len(b.labels))) for b in batches)


def test_predict_and_confusion_matrix() -> None:
    data = fake_data()
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))
    pred, labels = predict(model, data, "test", batch_size=3)
    assert pred.shape == labels.shape == (10,) and model.training
    cm = confusion_matrix(torch.tensor([0, 1, 1, 2]), torch.tensor([0, 1, 2, 2]), 3)
    assert cm.tolist() == [[1, 0, 0], [0, 1, 0], [0, 1, 1]]


@pytest.mark.parametrize("sampling", ["random", "epoch"])
def test_trainer_resume_of_an_augmented_cifar_run_is_bitwise(sampling: str, tmp_path: Path) -> None:
    """The trainer checkpoints the stream's state: the augmentation generator and the
    sampler's position (6 batches of 8 over 40 images: a batch spans two epochs)."""
    from attnlab.models.resnet import ResNet, ResNetConfig
    from attnlab.training.config import TrainConfig
    from attnlab.training.trainer import Trainer

    data = fake_data(40, n_val=10)
    config = TrainConfig(steps=6, batch_size=8, optimizer="sgd", lr=0.05, schedule="cosine",
                         warmup=1, label_smoothing=0.1, progress=False, eval_batches=1)  # fmt: skip
    augment = AugmentConfig(randaug_ops=1, mixup_alpha=0.5, mix_prob=0.5)

    def trainer(run: str) -> Trainer:
        torch.manual_seed(0)
        model = ResNet(ResNetConfig(stage_channels=(4, 8), blocks_per_stage=(1, 1)))
        objective = AugmentedClassificationObjective(data, augment, sampling=sampling)  # type: ignore[arg-type]
        return Trainer(model, objective, config, run_dir=tmp_path / run)

    full = trainer("full")
    losses = full.fit().losses
    first = trainer("split").fit(until=3).losses
    resumed = trainer("split")
    second = resumed.fit(resume=True).losses  # the checkpoint holds the stream's position
    assert first + second == losses
    for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values(),
                    strict=True):  # fmt: skip
        assert torch.equal(a, b)
