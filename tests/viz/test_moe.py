"""Expert-load heatmaps: the fractions drawn are the logged counts normalised per layer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnlab.viz.moe import expert_load, plot_expert_load, read_expert_load

pytest.importorskip("matplotlib")

RECORDS = [
    {"step": 10, "train_loss": 3.0, "moe_load": {"layers.0.ffn": [6, 2], "layers.1.ffn": [4, 4]}},
    {"step": 15, "val_loss": 2.9},  # no load: skipped
    {"step": 20, "moe_load": {"layers.0.ffn": [1, 7], "layers.1.ffn": [8, 0]}},
]


def test_fractions_and_image(tmp_path: Path) -> None:
    load = expert_load(RECORDS)
    assert load.steps == [10.0, 20.0]
    assert load.layers["layers.0.ffn"] == [[0.75, 0.25], [0.125, 0.875]]
    fig = plot_expert_load(load, path=tmp_path / "load.png")
    assert (tmp_path / "load.png").stat().st_size > 0
    image = fig.axes[0].images[0].get_array()
    assert image.tolist() == [[0.75, 0.125], [0.25, 0.875]]  # (expert, step)
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in RECORDS) + "\n")
    assert read_expert_load(tmp_path).layers == load.layers


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="no record"):
        expert_load([{"step": 1, "loss": 2.0}])
    with pytest.raises(ValueError, match="unknown layers"):
        plot_expert_load(RECORDS, layers=["layers.9.ffn"])
