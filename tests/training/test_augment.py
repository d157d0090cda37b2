"""Augmentation: crops are exact windows of the padded image, flips exact mirrors, labels kept,
mixup/CutMix exact convex/pasted mixtures, every draw seeded; the objective's batches and loss."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.training.augment import (
    RAND_AUGMENT_OPS,
    AugmentConfig,
    augment_batch,
    crop_flip,
    crop_flip_params,
    mix_batch,
    rand_augment,
    random_crop_flip,
)
from attnlab.training.cifar10 import Cifar10, Cifar10Arrays
from attnlab.training.image_objective import (
    AugmentedClassificationObjective,
    confusion_matrix,
    predict,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def images(B: int = 16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (B, 3, 32, 32), generator=g, dtype=torch.uint8)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def fake_data(n_train: int = 20, n_test: int = 10, n_val: int = 0) -> Cifar10:
    rng = np.random.default_rng(0)
    make = lambda n: rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)  # noqa: E731
    labels = lambda n: np.arange(n, dtype=np.uint8) % 10  # noqa: E731
    arrays = Cifar10Arrays(make(n_train), labels(n_train), make(n_test), labels(n_test), "fake")
    return Cifar10(arrays, n_val=n_val)


@pytest.mark.parametrize("mode", ["reflect", "zero"])
def test_crops_are_exact_windows_of_the_padded_image_and_flips_exact_mirrors(mode: str) -> None:
    x = images()
    dy, dx, flips = crop_flip_params(len(x), 4, True, gen(1))
    assert flips.any() and (~flips).any() and dy.max() <= 8 and dx.min() >= 0
    out = crop_flip(x, dy, dx, flips, padding=4, pad_mode=mode)  # type: ignore[arg-type]
    assert out.dtype == torch.uint8 and out.shape == x.shape
    padded = F.pad(x.float(), (4, 4, 4, 4), mode="reflect" if mode == "reflect" else "constant")
    for i in range(len(x)):
        window = padded[i, :, dy[i] : dy[i] + 32, dx[i] : dx[i] + 32]
        expected = window.flip(-1) if flips[i] else window
        assert torch.equal(out[i].float(), expected), i


def test_flip_without_crop_is_the_mirror_image() -> None:
    x = images(4)
    zero = torch.zeros(4, dtype=torch.long)
    out = crop_flip(x, zero, zero, torch.tensor([True, False, True, False]), padding=0)
    assert torch.equal(out[0], x[0].flip(-1)) and torch.equal(out[1], x[1])
    assert torch.equal(out[2].flip(-1), x[2])


def test_augmentation_is_seeded_reproducible_and_advances_the_generator_alike() -> None:
    x = images()
    a, b = random_crop_flip(x, gen(5)), random_crop_flip(x, gen(5))
    assert torch.equal(a, b) and not torch.equal(a, random_crop_flip(x, gen(6)))
    config = AugmentConfig(randaug_ops=2, mixup_alpha=0.2, cutmix_alpha=1.0, mix_prob=0.5)
    labels = torch.arange(16)
    g1, g2 = gen(7), gen(7)
    first = augment_batch(x, labels, g1, config, lambda t: t.float())
    again = augment_batch(x, labels, g2, config, lambda t: t.float())
    assert all(torch.equal(u, v) for u, v in zip(first, again, strict=True))
    assert torch.equal(g1.get_state(), g2.get_state())
    # the draws do not depend on the outcomes: mixed or not, the generator ends in one state
    ends = set()
    for prob in (0.0, 1.0):
        g = gen(8)
        mix_batch(x.float(), labels, g, mixup_alpha=0.2, prob=prob)
        ends.add(bytes(g.get_state().numpy()))
    assert len(ends) == 1


def test_labels_and_shapes_are_kept_without_mixing() -> None:
    x, labels = images(), torch.arange(16) % 10
    out = augment_batch(x, labels, gen(), AugmentConfig(randaug_ops=2), lambda t: t.float())
    assert out.images.shape == x.shape and out.images.dtype == torch.float32
    assert torch.equal(out.labels, labels) and torch.equal(out.labels_b, labels)
    assert torch.equal(out.lam, torch.ones(16))


def test_mixup_is_the_convex_combination_with_a_permutation() -> None:
    x, labels = images().float(), torch.arange(16)  # label i names image i
    out = mix_batch(x, labels, gen(2), mixup_alpha=0.4)
    lam = float(out.lam[0])
    assert 0 < lam < 1 and torch.equal(out.labels, labels)
    assert sorted(out.labels_b.tolist()) == list(range(16))
    torch.testing.assert_close(out.images, lam * x + (1 - lam) * x[out.labels_b])


def test_cutmix_pastes_one_box_and_lambda_is_its_complement() -> None:
    x, labels = images().float(), torch.arange(16)
    out = mix_batch(x, labels, gen(3), cutmix_alpha=1.0)
    partner = x[out.labels_b]
    from_partner = (out.images == partner) & (out.images != x)  # (B, C, H, W)
    box = from_partner.any(dim=(0, 1))  # (H, W): the pasted box, the same for every image
    rows, cols = box.any(1).nonzero().squeeze(1), box.any(0).nonzero().squeeze(1)
    assert box.sum() == len(rows) * len(cols)  # a rectangle
    assert float(out.lam[0]) == pytest.approx(1 - box.float().mean().item())
    outside = ~box
    assert torch.equal(out.images[..., outside], x[..., outside])


def test_rand_augment_ops_are_identities_at_zero_strength() -> None:
    x = images(8).float()
    x[:, :, 0, 0], x[:, :, 0, 1] = 0.0, 255.0  # so autocontrast has nothing to stretch
    for name, op in RAND_AUGMENT_OPS.items():
        torch.testing.assert_close(op(x, torch.zeros(8)), x, atol=1e-3, rtol=0, msg=name)
    out = rand_augment(x, gen(), n_ops=3, magnitude=0.5)
    assert out.shape == x.shape and out.min() >= 0 and out.max() <= 255
    assert not torch.equal(out, x) and torch.equal(
        out, rand_augment(x, gen(), n_ops=3, magnitude=0.5)
    )


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="pad_mode='edge' is not valid"):
        AugmentConfig(pad_mode="edge")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mix_prob"):
        AugmentConfig(mix_prob=1.5)
    with pytest.raises(ValueError, match="crop_padding"):
        AugmentConfig(crop_padding=-1)


# -- the objective --------------------------------------------------------------------------------


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
