"""Augmentation: crops are exact windows of the padded image, flips exact mirrors, labels kept,
mixup/CutMix exact convex/pasted mixtures, every draw seeded (the trainer's objective on top of
it: tests/training/test_image_objective.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.data.augment import (
    RAND_AUGMENT_OPS,
    AugmentConfig,
    augment_batch,
    crop_flip,
    crop_flip_params,
    mix_batch,
    rand_augment,
    random_crop_flip,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def images(B: int = 16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (B, 3, 32, 32), generator=g, dtype=torch.uint8)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


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
