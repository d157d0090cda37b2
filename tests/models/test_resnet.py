"""CIFAR ResNets (He et al. 2016, §4.2): parameter counts, shortcuts, FLOPs counted by
FlopCounterMode against the closed form, a 64-image overfit, checkpoints, validation."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attnlab import build_model
from attnlab.analysis.measure import count_flops
from attnlab.analysis.params import count_params
from attnlab.models.resnet import PRESETS, BasicBlock, ResNet, ResNetConfig

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ResNetConfig(stage_channels=(8, 16, 32), blocks_per_stage=(1, 1, 1))


def closed_form(c: ResNetConfig, size: int = 32) -> tuple[int, int]:
    """(parameters, forward FLOPs per image): 3x3 convs without bias, BN (2 per channel),
    option-B 1x1 projections, the linear head; FLOPs 2·H·W·C_out·C_in·k² per conv."""
    params, flops = 9 * c.in_channels * c.stage_channels[0], 0
    flops += 2 * size * size * c.stage_channels[0] * c.in_channels * 9
    params += 2 * c.stage_channels[0]
    width = c.stage_channels[0]
    for i, (ch, n) in enumerate(zip(c.stage_channels, c.blocks_per_stage, strict=True)):
        for j in range(n):
            if i > 0 and j == 0:
                size //= 2
            params += 9 * width * ch + 9 * ch * ch + 4 * ch
            flops += 2 * size * size * ch * 9 * (width + ch)
            if c.shortcut == "B" and (width != ch or (i > 0 and j == 0)):
                params += width * ch + 2 * ch
                flops += 2 * size * size * ch * width
            width = ch
    return params + width * c.n_classes + c.n_classes, flops + 2 * width * c.n_classes


@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("resnet20-cifar", 0.27e6),
        ("resnet32-cifar", 0.46e6),
        ("resnet56-cifar", 0.85e6),
        ("resnet18-cifar", 11.17e6),
    ],
)
def test_preset_parameter_counts(name: str, published: float) -> None:
    config = PRESETS[name]
    model = build_model(name, device="meta")
    n = count_params(model)
    assert n == count_params(config) == closed_form(config)[0]
    assert abs(n / published - 1) < 0.01  # §4.2's 0.27M / 0.46M / 0.85M; ResNet-18's 11.17M
    assert config.depth == {"resnet20-cifar": 20, "resnet32-cifar": 32}.get(name, config.depth)


def test_exact_counts_of_the_paper_models() -> None:
    assert count_params(PRESETS["resnet20-cifar"]) == 269_722
    assert count_params(PRESETS["resnet56-cifar"]) == 853_018
    assert count_params(PRESETS["resnet18-cifar"]) == 11_173_962


@pytest.mark.parametrize("shortcut", ["A", "B"])
def test_flops_per_image_counted_by_flop_counter_mode(shortcut: str) -> None:
    config = dataclasses.replace(PRESETS["resnet20-cifar"], shortcut=shortcut)
    model = ResNet(config).eval()
    measured = count_flops(model, (torch.randn(1, 3, 32, 32),))
    assert measured.forward == closed_form(config)[1]
    if shortcut == "A":  # 40.55M multiply-adds: the ~41M usually quoted for ResNet-20
        assert measured.forward == 2 * 40_550_400 + 2 * 64 * 10


def test_option_a_shortcut_is_the_zero_padded_subsampled_identity() -> None:
    block = BasicBlock(4, 8, stride=2, shortcut="A")
    x = torch.randn(2, 4, 6, 6)
    out = block.shortcut(x)
    assert out.shape == (2, 8, 3, 3)
    torch.testing.assert_close(out[:, :4], x[:, :, ::2, ::2])
    assert not out[:, 4:].any()
    assert sum(p.numel() for p in block.parameters()) == 9 * 4 * 8 + 9 * 8 * 8 + 4 * 8
    projected = BasicBlock(4, 8, stride=2, shortcut="B")
    assert projected.projection is not None and projected.shortcut(x).shape == (2, 8, 3, 3)
    assert BasicBlock(8, 8, shortcut="B").projection is None  # identity when shapes agree


def test_overfits_one_batch_of_64_images() -> None:
    torch.manual_seed(0)
    model = ResNet(TINY).train()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 3, 32, 32, generator=g), torch.randint(10, (64,), generator=g)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(40):
        logits = model(x)
        if (logits.argmax(-1) == y).all():
            break
        opt.zero_grad()
        F.cross_entropy(logits, y).backward()
        opt.step()
    assert (model(x).argmax(-1) == y).float().mean() == 1.0  # train mode: batch statistics


def test_zero_init_residual_and_features() -> None:
    model = ResNet(dataclasses.replace(TINY, zero_init_residual=True))
    blocks = [m for m in model.modules() if isinstance(m, BasicBlock)]
    assert blocks and all(not b.bn2.weight.any() for b in blocks)
    assert all(b.bn1.weight.eq(1).all() for b in blocks)
    assert model.features(torch.randn(2, 3, 16, 16)).shape == (2, 32)  # any image size
    with pytest.raises(ValueError, match=r"images must be \(B, 3, H, W\)"):
        model(torch.randn(2, 1, 32, 32))


def test_checkpoint_round_trip_keeps_batch_norm_statistics(tmp_path: Path) -> None:
    model = ResNet(TINY).train()
    model(torch.randn(8, 3, 32, 32))  # move the running statistics
    model.eval()
    model.save_pretrained(tmp_path / "m")
    loaded = ResNet.from_pretrained(tmp_path / "m").eval()
    x = torch.randn(2, 3, 32, 32)
    assert loaded.config == TINY and torch.equal(loaded(x), model(x))


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="shortcut='C' is not valid"):
        ResNetConfig(shortcut="C")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="same length"):
        ResNetConfig(stage_channels=(16, 32), blocks_per_stage=(3, 3, 3))
    with pytest.raises(ValueError, match=r"blocks_per_stage\[1\] must be positive, got 0"):
        ResNetConfig(blocks_per_stage=(3, 0, 3))
    with pytest.raises(TypeError, match=r"blocks_per_stage\[1\] must be an integer"):
        ResNetConfig(blocks_per_stage=(3, 2.0, 3))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"bn_momentum must be in \(0, 1\]"):
        ResNetConfig(bn_momentum=1.5)
    with pytest.raises(ValueError, match="bn_eps must be a finite number"):
        ResNetConfig(bn_eps=float("nan"))
    with pytest.raises(ValueError, match="non-decreasing"):
        ResNetConfig(stage_channels=(32, 16, 64))
    assert ResNetConfig(stage_channels=[16, 32, 64]).stage_channels == (16, 32, 64)  # type: ignore[arg-type]
