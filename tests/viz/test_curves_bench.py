"""Training curves from metrics files (a tolerant reader) and the benchmark log-log plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnlab.viz.bench import load_benchmark, plot_benchmark
from attnlab.viz.curves import parse_records, plot_curves, read_metrics


def _write(path: Path, lines: list[object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n",
        encoding="utf-8",
    )
    return path


def test_reader_is_tolerant(tmp_path: Path) -> None:
    file = _write(
        tmp_path / "run1" / "metrics.jsonl",
        [
            {"step": 1, "loss": 4.0, "lr": 1e-4, "tokens_per_s": 10},
            "",
            {"step": 2, "train_loss": 3.5},
            {"step": 2, "split": "val", "loss": 3.9},
            {"step": 3, "loss": 3.0, "val_loss": 3.4},
            {"loss": 9.0},  # no step
            {"step": 4, "loss": float("nan")},  # non-finite
            "not json",
            '{"step": 5, "loss": 2.',  # half-written last line
        ],
    )
    run = read_metrics(tmp_path / "run1")
    assert run.name == "run1"
    assert run.train == [(1, 4.0), (2, 3.5), (3, 3.0)]
    assert run.val == [(2, 3.9), (3, 3.4)]
    assert run.lr == [(1, 1e-4)]
    assert run.skipped == 4
    assert read_metrics(file).name == "run1"  # a metrics.jsonl is named after its directory


def test_other_jsonl_names_and_json_lists(tmp_path: Path) -> None:
    _write(tmp_path / "b" / "train.jsonl", [{"iter": 10, "loss": 1.0}])
    _write(tmp_path / "b" / "val.jsonl", [{"step": 10, "eval_loss": 2.0}])
    run = read_metrics(tmp_path / "b")
    assert run.train == [(10, 1.0)] and run.val == [(10, 2.0)]
    (tmp_path / "c.json").write_text(json.dumps([{"step": 1, "loss": 1.5}]), encoding="utf-8")
    assert read_metrics(tmp_path / "c.json").train == [(1, 1.5)]
    assert parse_records([{"step": True, "loss": 1}]).train == []  # a bool is not a step


def test_reader_reads_the_attnlab_schema(tmp_path: Path) -> None:
    _write(
        tmp_path / "r" / "metrics.jsonl",
        [
            {"step": 10, "split": "train", "loss": 3.0, "lr": 0.1, "elapsed_s": 1.0},
            {"step": 10, "split": "val", "loss": 3.5, "accuracy": 0.2},
            {"step": 10, "split": "final", "model": "averaged", "loss": 3.2},
        ],
    )
    run = read_metrics(tmp_path / "r")
    assert run.train == [(10, 3.0)] and run.val == [(10, 3.5)] and run.lr == [(10, 0.1)]
    assert run.skipped == 1  # the final (averaged) line is no point of a curve


def test_reader_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such run directory"):
        read_metrics(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no metrics\.jsonl"):
        read_metrics(tmp_path / "empty")
    _write(tmp_path / "bad" / "metrics.jsonl", [{"step": 1, "accuracy": 0.5}])
    with pytest.raises(ValueError, match="no usable metrics"):
        read_metrics(tmp_path / "bad")


@pytest.mark.usefixtures("mpl")
def test_plot_curves_overlays_runs(tmp_path: Path, check_png) -> None:
    _write(tmp_path / "a" / "metrics.jsonl", [{"step": s, "loss": 5 - s} for s in range(4)])
    _write(
        tmp_path / "b" / "metrics.jsonl",
        [{"step": s, "loss": 6 - s, "val_loss": 6.5 - s, "lr": 0.1 * s} for s in range(4)],
    )
    fig = plot_curves([tmp_path / "a", tmp_path / "b"], log_y=True, path=tmp_path / "c.png")
    assert len(fig.axes) == 2  # loss, learning rate
    loss_ax = fig.axes[0]
    assert [ln.get_label() for ln in loss_ax.get_lines()] == ["a train", "b train", "b val"]
    assert list(loss_ax.get_lines()[1].get_ydata()) == [6, 5, 4, 3]
    assert loss_ax.get_yscale() == "log"
    check_png(tmp_path / "c.png", fig)
    fig = plot_curves([tmp_path / "a"])
    assert len(fig.axes) == 1  # no learning rate logged
    with pytest.raises(ValueError, match="at least one run"):
        plot_curves([])


ROWS = [
    {"backend": b, "mode": m, "n": n, "status": "ok", "time_s": c * n**p, "peak_mem_bytes": n**p}
    for b, p, c in (("math", 2, 1e-8), ("linear", 1, 1e-6))
    for m in ("forward", "forward_backward")
    for n in (128, 256, 512)
] + [{"backend": "math", "mode": "forward", "n": 1024, "status": "skipped", "time_s": None}]


@pytest.mark.usefixtures("mpl")
def test_plot_benchmark(tmp_path: Path, check_png) -> None:
    file = tmp_path / "results.json"
    file.write_text(json.dumps({"cases": ROWS}), encoding="utf-8")
    rows = load_benchmark(file)
    fig = plot_benchmark(rows, path=tmp_path / "bench.png")
    time_ax, mem_ax = fig.axes
    assert time_ax.get_xscale() == time_ax.get_yscale() == "log"
    labels = [ln.get_label() for ln in time_ax.get_lines()]
    assert "math (forward)" in labels and "∝ n²" in labels and "∝ n" in labels
    math_fwd = time_ax.get_lines()[labels.index("math (forward)")]
    assert list(math_fwd.get_xdata()) == [128, 256, 512]  # the skipped case is left out
    assert list(math_fwd.get_ydata()) == pytest.approx([1e-8 * n**2 for n in (128, 256, 512)])
    assert mem_ax.get_ylabel() == "peak memory (MiB)"
    check_png(tmp_path / "bench.png", fig)
    assert len(plot_benchmark(rows, memory_key=None).axes) == 1
    with pytest.raises(ValueError, match="no benchmark row"):
        plot_benchmark([{"n": 1}])


def test_load_benchmark_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_benchmark(tmp_path / "nope.json")
    (tmp_path / "x.json").write_text('{"meta": 1}', encoding="utf-8")
    with pytest.raises(ValueError, match="list of result rows"):
        load_benchmark(tmp_path / "x.json")
