"""Errors that guide and output that fits where it goes (issue 52, items 3 and 4): a mistyped
flag, command or recipe names the closest valid ones (not all of them); a short run scales its
warmup; progress off a terminal is a few plain lines; an empty translation or generation says
why on stderr."""

from __future__ import annotations

import io
import json
import types
from pathlib import Path

import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.cli import main
from attnlab.cli.overrides import close_matches, did_you_mean, parse_overrides
from attnlab.training.config import TrainConfig
from attnlab.training.progress import Progress
from attnlab.training.recipes.base import short_run_warmup

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# a reverse run of seconds: 5,760 parameters, 8 held-out sequences
TINY_REVERSE = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--d-ff", "32",
                "--batch-size", "8", "--eval-size", "8", "--vocab", "12", "--min-len", "2",
                "--max-len", "4"]  # fmt: skip


def _exit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The exit status of ``attnlab ARGV`` and its stderr (argparse's errors exit)."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = int(e.code or 0)
    return code, capsys.readouterr().err


# -- did you mean


def test_close_matches_ignore_dashes_and_underscores() -> None:
    assert close_matches("--stesp", ["--steps", "--lr", "--seed"]) == ["--steps"]
    assert close_matches("d_modle", ["--d-model", "--d-ff"]) == ["--d-model"]
    assert close_matches("--bogus", ["--steps", "--lr"]) == []
    assert (
        did_you_mean("genrate", ["train", "generate"], quote=True) == "; did you mean 'generate'?"
    )
    assert did_you_mean("zzz", ["train"]) == ""


def test_an_unknown_recipe_flag_names_the_closest_not_all(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, err = _exit(["train", "reverse", "--stesp", "100"], capsys)
    assert code == 2
    assert "unknown option '--stesp'; did you mean --steps?" in err
    assert "--help lists every option" in err
    assert "--weight-decay" not in err and len(err) < 200  # not the ~110 flags


def test_an_unknown_flag_may_be_the_commands_own(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _exit(["train", "reverse", "--ouut", "x"], capsys)
    assert code == 2 and "did you mean --out?" in err
    with pytest.raises(ValueError, match=r"did you mean --train\.steps\?"):
        parse_overrides(["--train.stesp", "3"], {"steps": int})
    with pytest.raises(ValueError, match="did you mean --no-tensorboard"):
        parse_overrides(["--no-tensorbord"], {"tensorboard": bool})


def test_a_mistyped_command_or_recipe_says_which_was_meant(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, err = _exit(["genrate"], capsys)
    assert code == 2
    assert "invalid choice: 'genrate'; did you mean 'generate'?" in err
    assert "'quantize'" not in err  # the close one, not the list
    code, err = _exit(["train", "shakspeare-char"], capsys)
    assert code == 2 and "did you mean 'shakespeare-char'" in err
    code, err = _exit(["train", "xyzzy"], capsys)  # nothing close: the list
    assert code == 2 and "invalid choice: 'xyzzy' (choose from 'cifar10'" in err


def test_other_commands_suggest_their_flags_with_a_short_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, err = _exit(["generate", "model", "--promt", "hi"], capsys)
    assert code == 2
    assert (
        "attnlab generate: error: unrecognized arguments: --promt hi; did you mean --prompt?" in err
    )
    lines = err.strip().splitlines()
    assert len(lines) == 2, err  # generate's 19-line usage is left to --help
    assert (
        lines[0]
        == "usage: attnlab generate [options] model  (attnlab generate --help lists the options)"
    )
    code, err = _exit(["generate", "model", "--length-norm", "gnmd"], capsys)
    assert code == 2 and "invalid choice: 'gnmd'; did you mean 'gnmt'?" in err


# -- a short run's warmup


def test_short_run_warmup_scales_only_a_default_that_does_not_fit() -> None:
    default = TrainConfig(steps=2000, schedule="cosine", warmup=100)
    assert short_run_warmup(default, {"steps": 5}) == {"steps": 5, "warmup": 0}
    assert short_run_warmup(default, {"steps": 100}) == {"steps": 100, "warmup": 10}
    assert short_run_warmup(default, {"steps": 101}) == {"steps": 101}  # fits: unchanged
    assert short_run_warmup(default, {"steps": 5, "warmup": 3}) == {"steps": 5, "warmup": 3}
    noam = TrainConfig(steps=2000, schedule="noam", warmup=400)
    assert short_run_warmup(noam, {"steps": 5}) == {"steps": 5}  # eq. (3) allows it


def test_a_quick_run_trains_with_the_default_warmup_scaled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r"
    argv = ["train", "reverse", *TINY_REVERSE, "--steps", "5", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    train = json.loads((out / "run.json").read_text())["train"]
    assert (train["steps"], train["warmup"]) == (5, 0)
    assert train["lr"] == pytest.approx(0.16 * 16**-0.5 * 100**-0.5)  # the default warmup's peak
    capsys.readouterr()
    code, err = _exit(["train", "reverse", "--steps", "5", "--warmup", "10"], capsys)
    assert code == 2 and "--warmup < --steps" in err and "--warmup=10, --steps=5" in err


# -- progress off a terminal


def test_progress_off_a_terminal_is_a_few_plain_lines(capsys: pytest.CaptureFixture[str]) -> None:
    config = TrainConfig(steps=1000, schedule="cosine", warmup=10)
    with Progress(config, None, initial_step=0, initial_s=0.0, enabled=True,
                  interactive=False) as progress:  # fmt: skip
        for step in range(1, 1001):
            progress.update(step, step * 0.01, loss=1.0, lr=1e-3)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "\r" not in err and len(lines) == 10, err  # each tenth, not 1000 redraws
    assert lines[0].startswith("train: 100/1000 steps (10%), loss 1.000, lr 1.00e-03")
    assert lines[-1].startswith("train: 1000/1000 steps (100%)")
    with Progress(config, None, initial_step=0, initial_s=0.0, enabled=False) as progress:
        progress.update(1000, 1.0, loss=1.0, lr=1e-3)  # --no-progress: nothing at all
    assert capsys.readouterr().err == ""


def test_a_run_with_stderr_in_a_file_writes_no_redraws(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["train", "reverse", *TINY_REVERSE, "--steps", "12", "--out", str(tmp_path / "r")]
    assert main(argv) == 0  # progress on (the default); capsys's stderr is not a terminal
    err = capsys.readouterr().err
    assert "\r" not in err and "█" not in err
    lines = [x for x in err.splitlines() if x.startswith("train: ")]
    assert 1 <= len(lines) <= 11 and lines[-1].startswith("train: 12/12 steps (100%)")
    assert len(err) < 2000


# -- empty outputs


def test_an_empty_translation_gets_a_note_and_keeps_the_lines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model that ends every sentence at once (a short training run) translates to ''."""
    import attnlab.training.recipes.translation as recipe
    import attnlab.translation.evaluate as evaluate

    stub = types.SimpleNamespace(model=torch.nn.Identity(), tokenizer=None, info={}, path="run")
    monkeypatch.setattr(recipe, "load_translator", lambda model, checkpoint: stub)
    monkeypatch.setattr(
        evaluate,
        "translate",
        lambda m, t, lines, **kw: ["" if x != "welt" else "world" for x in lines],
    )
    monkeypatch.setattr("sys.stdin", io.StringIO("hallo\n\nwelt\n"))
    assert main(["translate", "run"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "\n\nworld\n"  # one line per input line
    assert "note: the model produced an empty translation for line 1 (" in captured.err
    assert "line 2" not in captured.err  # an empty input line is no surprise
    assert "short training run?" in captured.err


def test_an_empty_generation_gets_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model whose first greedy token is EOS (all weights 0: every logit ties, id 0 wins)."""
    model = GPT(GPTConfig(vocab_size=8, d_model=8, n_heads=2, n_layers=1, d_ff=16,
                          max_seq_len=16, dropout=0.0, eos_id=0))  # fmt: skip
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    model.save_pretrained(tmp_path)
    argv = ["generate", str(tmp_path), "--ids", "1,2", "--ids", "3,4", "--max-new-tokens", "3"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["[0] 0", "[1] 0"]
    assert "note: the model produced empty outputs for output [0], output [1] (" in captured.err
    assert (
        main(["generate", str(tmp_path), "--ids", "1,2", "--max-new-tokens", "3", "--no-eos"]) == 0
    )
    assert "note:" not in capsys.readouterr().err  # tokens came: no note
