"""Mixture-of-experts from the command line: ``attnlab train shakespeare-char --n-experts ...``
(help lists the keys, the run logs the load), ``attnlab viz experts``, ``attnlab analyze`` on an
MoE preset and config file, and bad MoE values exiting 2 with one line naming the flag."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from attnlab import PRESETS
from attnlab.cli import main

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_data = pytest.mark.skipif(
    not (DATA / "tinyshakespeare.txt").is_file(), reason="shared data missing"
)
TINY_MOE = ["--steps=3", "--warmup=1", "--eval-batches=1", "--d-model=16", "--n-heads=2",
            "--n-layers=2", "--d-ff=32", "--max-seq-len=16", "--batch-size=2", "--no-progress",
            "--log-every=1", "--n-experts", "4", "--top-k", "2", "--moe-every", "0,1",
            "--moe-d-ff=24"]  # fmt: skip


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("ATTNLAB_DATA", str(DATA))
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_train_help_lists_the_moe_keys(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["train", "shakespeare-char", "--help"])
    assert exc.value.code == 0
    lines = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()
             if line.strip().startswith("--")}  # fmt: skip
    expected = {
        "--n-experts": ["int", "default:", "0"],
        "--top-k": ["int", "default:", "2"],
        "--moe-every": ["int|int,...", "default:", "1"],
        "--capacity-factor": ["float|none", "default:", "None"],
        "--aux-loss-weight": ["float", "default:", "0.01"],
        "--z-loss-weight": ["float", "default:", "0.0"],
        "--moe-routing": ["{topk_softmax,softmax_topk}", "default:", "topk_softmax"],
        "--router-bias-balancing": ["bool", "default:", "False"],
    }
    for flag, words in expected.items():
        assert lines[flag] == words, flag


@needs_data
def test_train_an_moe_gpt_then_draw_its_expert_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "moe"
    assert main(["train", "shakespeare-char", *TINY_MOE, "--out", str(run)]) == 0
    out = capsys.readouterr().out
    assert "active per token" in out and "trained to step 3" in out
    config = json.loads((run / "run.json").read_text())["model"]
    assert config["n_experts"] == 4 and config["moe_every"] == [0, 1]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    loads = [r["moe_load"] for r in lines if r["split"] == "train"]
    assert len(loads) == 3 and all(set(x) == {"layers.0.ffn", "layers.1.ffn"} for x in loads)
    assert all(sum(c) == 2 * 16 * 2 for x in loads for c in x.values())  # B·T·k per layer
    png = tmp_path / "experts.png"
    assert main(["viz", "experts", str(run), "--out", str(png)]) == 0
    out = capsys.readouterr().out
    assert "layers.0.ffn: 4 experts, 3 logged steps" in out and png.stat().st_size > 0
    assert main(["viz", "experts", str(run), "--out", str(png), "--layers", "layers.1.ffn"]) == 0
    assert "layers.0.ffn" not in capsys.readouterr().out
    assert main(["evaluate", str(run), "--batches", "1"]) == 0  # rebuilt from run.json
    assert "val loss" in capsys.readouterr().out


def test_viz_experts_refuses_a_dense_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"split": "train", "step": 1, "loss": 2.0}\n')
    assert main(["viz", "experts", str(tmp_path), "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "moe_load" in err[0] and "mixture-of-experts run" in err[0]
    assert main(["viz", "experts", str(tmp_path / "none"), "--out", "x.png"]) == 2
    assert "no such run directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--n-experts=4", "--top-k=5"], "--top-k=5 must be in [1, --n-experts=4]"),
        (
            ["--n-experts=4", "--moe-every=0,9"],
            "--moe-every=[0, 9] must list distinct layer indices in [0, 4)",
        ),
        (["--n-experts=4", "--capacity-factor=0"], "--capacity-factor must be positive"),
        (["--n-experts=two"], "--n-experts: expected int"),
    ],
)
def test_bad_moe_values_exit_2(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["train", "shakespeare-char", "--steps=2", "--warmup=1", "--no-progress", *extra]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_analyze_prints_total_and_active(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["analyze", "mixtral-8x7b", "--seq-len", "128"]) == 0
    out = capsys.readouterr().out
    assert "total parameters                  46,702,792,704" in out
    assert "active per token                  12,879,925,248" in out
    config = PRESETS["gpt-moe-tiny"].to_dict() | {"n_experts": 8, "top_k": 1}
    path = tmp_path / "moe.json"
    path.write_text(json.dumps(config))
    assert main(["analyze", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    moe = report["moe"]
    assert moe["n_experts"] == 8 and moe["top_k"] == 1
    assert moe["total_params"] - moe["active_params"] == 2 * 7 * moe["expert_params"]
    assert main(["analyze", "gpt-char-baby", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["moe"] is None
