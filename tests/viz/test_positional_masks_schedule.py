"""The data behind the positional, mask and schedule pictures equal their closed forms."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab import BERT
from attnlab.layers.attention_sliding import sliding_window_mask
from attnlab.layers.masks import causal_mask
from attnlab.training.schedules import noam, warmup_cosine
from attnlab.viz.masks import mask_data, plot_masks
from attnlab.viz.positional import plot_positional, positional_data
from attnlab.viz.schedule import plot_schedule, schedule_curves


def _image(ax: Any) -> torch.Tensor:
    return torch.as_tensor(ax.images[0].get_array().data)


def test_sinusoidal_data_is_the_formula() -> None:
    data = positional_data("sinusoidal", d_model=16, max_len=30)
    table = data["table"]
    assert table.shape == (30, 16)
    for pos in (0, 1, 7, 29):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    torch.testing.assert_close(data["similarity"], table @ table.T)
    # PE_m · PE_n depends on m - n only: sum_i cos((m - n)·w_i).
    sim = data["similarity"]
    torch.testing.assert_close(sim[3, 10], sim[13, 20], atol=1e-4, rtol=0)


def test_rope_scores_depend_on_distance_only() -> None:
    data = positional_data("rope", d_model=32, max_len=40)
    D = 32
    inv = 1.0 / 10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    assert data["cos"].shape == (40, D // 2)
    torch.testing.assert_close(data["cos"][5], torch.cos(5 * inv).float())
    scores = data["scores"]
    for m, n in ((0, 0), (9, 3), (3, 9), (39, 0)):
        want = torch.cos((m - n) * inv).mean().item()
        assert scores[m, n].item() == pytest.approx(want, abs=1e-5)
    torch.testing.assert_close(scores[7, 2], scores[30, 25])
    assert data["relative"][0].item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="even head dim"):
        positional_data("rope", d_head=7)


def test_alibi_bias_is_minus_slope_times_distance() -> None:
    data = positional_data("alibi", n_heads=4, max_len=10)
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / 4) for h in range(4)])
    torch.testing.assert_close(data["slopes"], slopes)
    i = torch.arange(10)
    dist = (i[:, None] - i[None, :]).abs().float()
    torch.testing.assert_close(data["bias"], -slopes[:, None, None] * dist)


def test_learned_needs_a_model(tiny_bert: BERT) -> None:
    data = positional_data("learned", max_len=20, model=tiny_bert)
    torch.testing.assert_close(data["table"], tiny_bert.pos_encoding.weight[:20].detach())
    torch.testing.assert_close(data["similarity"].diagonal(), torch.ones(20))
    with pytest.raises(ValueError, match="pass a model"):
        positional_data("learned")
    with pytest.raises(ValueError, match="no learned position table"):
        positional_data("learned", model=torch.nn.Linear(2, 2))


def test_positional_bad_kind_and_sizes() -> None:
    with pytest.raises(ValueError, match="unknown positional kind 'xpos'; valid: sinusoidal"):
        positional_data("xpos")
    with pytest.raises(ValueError, match="max_len must be positive"):
        positional_data("sinusoidal", max_len=0)


@pytest.mark.usefixtures("mpl")
@pytest.mark.parametrize(("kind", "n_axes"), [("sinusoidal", 4), ("rope", 5), ("alibi", 5)])
def test_plot_positional(kind: str, n_axes: int, tmp_path: Path, check_png) -> None:
    fig = plot_positional(kind, d_model=32, max_len=50, path=tmp_path / f"{kind}.png")
    assert len(fig.axes) == n_axes  # heatmaps + their colour bars (+ rope/alibi line plot)
    data = positional_data(kind, d_model=32, max_len=50)
    first = {"sinusoidal": data.get("table"), "rope": data.get("cos")}.get(kind)
    if kind == "alibi":
        first = data["bias"][0]
    torch.testing.assert_close(_image(fig.axes[0]), first)
    check_png(tmp_path / f"{kind}.png", fig)


@pytest.mark.usefixtures("mpl")
def test_plot_learned(tiny_bert: BERT, tmp_path: Path, check_png) -> None:
    fig = plot_positional("learned", max_len=32, model=tiny_bert, path=tmp_path / "l.png")
    torch.testing.assert_close(_image(fig.axes[0]), tiny_bert.pos_encoding.weight.detach())
    check_png(tmp_path / "l.png", fig)


def test_mask_data_uses_the_library_convention() -> None:
    masks = mask_data(
        ["causal", "padding", "sliding_window", "combined", "cached"],
        seq_len=8,
        length=5,
        window=3,
        query_len=2,
    )
    torch.testing.assert_close(masks["causal"], causal_mask(8))
    pad = torch.arange(8) < 5
    assert torch.equal(masks["padding"], pad.expand(8, 8))
    assert torch.equal(masks["sliding_window"], sliding_window_mask(8, window=3))
    assert torch.equal(masks["combined"], causal_mask(8) & pad)
    assert masks["cached"].shape == (2, 8)
    assert masks["cached"][0].tolist() == [True] * 7 + [False]  # bottom-right aligned
    with pytest.raises(ValueError, match=r"unknown mask kind.*valid: causal, padding"):
        mask_data(["diagonal"])
    with pytest.raises(ValueError, match=r"length must be in 0\.\.8"):
        mask_data(seq_len=8, length=9)


@pytest.mark.usefixtures("mpl")
def test_plot_masks(tmp_path: Path, check_png) -> None:
    fig = plot_masks(seq_len=10, length=7, window=3, path=tmp_path / "masks.png")
    assert len(fig.axes) == 4
    masks = mask_data(seq_len=10, length=7, window=3)
    for ax, mask in zip(fig.axes, masks.values(), strict=True):
        assert torch.equal(_image(ax), mask.int())
    check_png(tmp_path / "masks.png", fig)


def test_schedule_data_is_the_schedule() -> None:
    curves = schedule_curves("noam", steps=300, d_model=[512, 64], warmup=[100])
    assert list(curves) == ["d_model=512, warmup=100", "d_model=64, warmup=100"]
    xs, ys = curves["d_model=512, warmup=100"]
    assert xs == list(range(1, 301))
    assert ys == [noam(s, d_model=512, warmup=100) for s in xs]
    assert max(range(300), key=ys.__getitem__) + 1 == 100  # peak at warmup
    xs, ys = schedule_curves("cosine", steps=50, warmup=[10], lr=0.1)["warmup=10, total=50"]
    assert ys == pytest.approx([0.1 * warmup_cosine(s, warmup=10, total_steps=50) for s in xs])
    with pytest.raises(ValueError, match=r"unknown schedule 'step'; valid: .*noam"):
        schedule_curves("step")


@pytest.mark.usefixtures("mpl")
def test_plot_schedule(tmp_path: Path, check_png) -> None:
    fig = plot_schedule("noam", steps=400, warmup=[100, 200], path=tmp_path / "s.png")
    (ax,) = fig.axes
    lines = [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 1]
    assert len(lines) == 2
    want = [noam(s, d_model=512, warmup=100) for s in range(1, 401)]
    assert list(lines[0].get_ydata()) == want
    check_png(tmp_path / "s.png", fig)
