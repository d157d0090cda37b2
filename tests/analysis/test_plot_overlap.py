"""``attnlab analyze --plot``: curves that coincide are found and drawn so both stay visible."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from attnlab.analysis.scaling import crossover, sweep_seq_len
from attnlab.analysis.sweep_plot import coinciding_curves, plot_sweep, sweep_figure
from attnlab.models import PRESETS


def test_coinciding_curves_groups_equal_ones_within_the_tolerance() -> None:
    curves = {
        "a": [1.0, 2.0, 3.0],
        "b": [5.0, 5.0, 5.0],
        "c": [1.2, 2.0, 2.9],
        "d": [1.0, 2.0, 4.0],
    }
    assert coinciding_curves(curves, 0.25) == [["a", "c"]]  # d parts from a at the last point
    assert coinciding_curves(curves, 0.1) == []
    assert coinciding_curves(curves, 1.0) == [["a", "c", "d"]]
    assert coinciding_curves({"x": [0.0], "y": [0.0], "z": [0.0]}, 0.0) == [["x", "y", "z"]]


@pytest.mark.parametrize("tol", [-1.0, float("nan"), float("inf")])
def test_bad_tolerance(tol: float) -> None:
    with pytest.raises(ValueError, match="tol must be a finite number >= 0"):
        coinciding_curves({"a": [1.0]}, tol)


def test_curves_of_different_lengths() -> None:
    with pytest.raises(ValueError, match="one length each"):
        coinciding_curves({"a": [1.0], "b": [1.0, 2.0]}, 0.5)


def lines(fig: Any) -> dict[str, Any]:
    return {
        ln.get_label(): ln for ln in fig.axes[0].get_lines() if not ln.get_label().startswith("_")
    }


@pytest.mark.parametrize(
    ("preset", "first", "second"),
    [("transformer-base", "projections", "other"), ("vit-digits", "projections", "ffn")],
)
def test_coinciding_shares_are_marked(preset: str, first: str, second: str) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    config = PRESETS[preset]
    rows = sweep_seq_len(config)
    fig = sweep_figure(rows, crossover=crossover(config))
    try:
        drawn = lines(fig)
        a, b = drawn[first], drawn[f"{second} (= {first})"]
        assert max(abs(x - y) for x, y in zip(a.get_ydata(), b.get_ydata(), strict=True)) <= 1.0
        assert a.get_linestyle() == "-" and b.get_linestyle() == "--"  # dashed on top of solid
        assert b.get_zorder() > a.get_zorder()
        assert b.get_markersize() > a.get_markersize() and b.get_markerfacecolor() == "none"
        assert a.get_marker() != b.get_marker()
        title = fig.axes[0].get_legend().get_title().get_text()
        assert title == f"{first} = {second} (within 1 pp)"
    finally:
        plt.close(fig)


def test_curves_apart_are_not_marked() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    fig = sweep_figure(sweep_seq_len(PRESETS["gpt2-small"]))
    try:
        assert set(lines(fig)) == {"projections", "attention", "ffn", "other"}
        assert fig.axes[0].get_legend().get_title().get_text() == ""
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="no rows"):
        sweep_figure([])


def test_plot_sweep_writes_the_file(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = plot_sweep(sweep_seq_len(PRESETS["vit-digits"]), tmp_path / "shares.png")
    assert out == tmp_path / "shares.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
