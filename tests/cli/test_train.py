"""Recipes through the CLI: smoke runs of each (tiny step counts), overrides, resume, sample and
evaluate, and rejection of unknown keys."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.cli.overrides import coerce, parse_overrides
from attnlab.cli.train import recipe_types
from attnlab.training.recipes import get_recipe, prepare

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_data = pytest.mark.skipif(
    not (DATA / "tinyshakespeare.txt").is_file(), reason="shared data missing"
)
SMALL_LM = ["--steps=4", "--warmup=1", "--eval_every=2", "--eval_batches=2", "--d_model=32",
            "--n_layers=1", "--d_ff=64", "--max_seq_len=16", "--batch_size=4",
            "--no-progress", "--checkpoint_every=2"]  # fmt: skip


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("ATTNLAB_DATA", str(DATA))
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_coerce_and_parse_overrides() -> None:
    assert coerce("3", int) == 3 and coerce("none", float | None) is None
    assert coerce("0.9,0.99", tuple[float, float]) == (0.9, 0.99)
    assert coerce("off", bool) is False
    types = recipe_types(get_recipe("shakespeare-char"))
    assert parse_overrides(["--lr", "1e-3", "--d-model=64", "--tensorboard", "--no-progress"],
                           types) == {"lr": 1e-3, "d_model": 64, "tensorboard": True,
                                      "progress": False}  # fmt: skip
    with pytest.raises(ValueError, match="unknown option '--bogus'"):
        parse_overrides(["--bogus=1"], types)
    assert parse_overrides(["--d_model=64"], types) == {"d_model": 64}  # the old spelling
    with pytest.raises(ValueError, match="expected int"):
        parse_overrides(["--steps=ten"], types)


@needs_data
def test_prepare_rejects_unknown_and_invalid_values() -> None:
    with pytest.raises(ValueError, match="unknown key 'bogus'"):
        prepare("shakespeare-char", {"bogus": 1})
    with pytest.raises(ValueError, match="steps must be positive"):
        prepare("shakespeare-char", {"steps": 0})
    with pytest.raises(ValueError, match="unknown recipe"):
        prepare("nope")


@needs_data
def test_shakespeare_char_smoke_resume_sample_evaluate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = ["train", "shakespeare-char", *SMALL_LM, "--runs-dir", str(tmp_path)]
    assert main(run) == 0
    out = capsys.readouterr().out
    assert "trained to step 4" in out and "validation: loss" in out
    run_dir = tmp_path / "shakespeare-char"
    assert (run_dir / "tokenizer.json").is_file() and (run_dir / "run.json").is_file()
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if m["split"] == "val"] == [2, 4]
    assert main(run) == 2  # a second run into the same directory is refused...
    assert "already holds a run" in capsys.readouterr().err
    assert main([*run, "--steps=6", "--resume"]) == 0  # ...it resumes with the run's settings
    assert "trained to step 6" in capsys.readouterr().out
    assert main([*run, "--lr=0.5", "--resume"]) == 2
    assert "--resume with other settings than the run's (lr)" in capsys.readouterr().err
    assert main(["sample", str(run_dir), "--prompt", "ROMEO:", "--max-new-tokens", "10"]) == 0
    assert capsys.readouterr().out.startswith("ROMEO:")
    assert main(["generate", str(run_dir), "--prompt", "ROMEO:", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("ROMEO:")  # the run's own char tokenizer
    assert main(["evaluate", str(run_dir), "--batches", "1"]) == 0
    assert "val loss" in capsys.readouterr().out


@needs_data
def test_shakespeare_mlm_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "shakespeare-mlm", *SMALL_LM, "--runs-dir", str(tmp_path),
                 "--arch=modern"]) == 0  # fmt: skip
    assert main(["evaluate", str(tmp_path / "shakespeare-mlm"), "--batches", "1"]) == 0
    assert "masks right" in capsys.readouterr().out


@pytest.mark.parametrize("model", ["vit", "cnn"])
def test_digits_smoke(model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("sklearn")
    args = ["train", "digits", f"--model={model}", "--steps=3", "--warmup=1", "--no-progress",
            "--eval_batches=1", "--runs-dir", str(tmp_path)]  # fmt: skip
    assert main(args) == 0
    assert main(["evaluate", str(tmp_path / f"digits-{model}")]) == 0
    assert "test accuracy (whole split)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "shakespeare-char", "--bogus=1"], "unknown option '--bogus'"),
        (["train", "digits", "--model=rnn", "--steps=1", "--no-progress"], "expected one of vit"),
        (
            ["train", "digits", "--steps=2", "--warmup=1", "--no-progress", "--n_heads=3"],
            "does not divide",
        ),
        (["train", "shakespeare-char", "--steps"], "--steps needs a value"),
        (["train", "reverse", "--bogus"], "unknown option '--bogus'"),
    ],
)
def test_bad_overrides_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["train", "--help"], ["train", "shakespeare-mlm", "--help"]])
def test_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    assert "15% masked" in capsys.readouterr().out
