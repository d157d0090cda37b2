"""``attnlab generate`` (generation.cli): ids without a tokenizer, streamed text with one."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab import GPT, GPTConfig
from attnlab.cli import main as cli_main
from attnlab.cli.generate import add_parser as add_generate_subparser


def main(argv: list[str]) -> int:
    return cli_main(["generate", *argv])


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

WORDS = ["<eos>", "the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far"]


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=len(WORDS),
        d_model=16,
        n_heads=2,
        n_layers=1,
        d_ff=32,
        max_seq_len=32,
        dropout=0.0,
        eos_id=0,
    )
    model = GPT(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    model.save_pretrained(tmp_path)
    return tmp_path


def add_tokenizer(directory: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {w: i for i, w in enumerate(WORDS)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="the"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<eos>"])
    tok.save(str(directory / "tokenizer.json"))


def test_ids_without_tokenizer(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = attnlab.from_pretrained(checkpoint)
    expected = attnlab.generate(model, [[1, 2, 3]], max_new_tokens=6, eos_id=())
    assert main([str(checkpoint), "--ids", "1,2,3", "--max-new-tokens", "6", "--no-eos"]) == 0
    assert capsys.readouterr().out.split() == [str(t) for t in expected[0].tolist()]
    # A batch of two prompts: one line each.
    assert main([str(checkpoint), "--ids", "1,2,3", "--ids", "4", "--max-new-tokens", "6"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("[0] ") and lines[1].startswith("[1] ")


def test_streams_text_with_tokenizer(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    add_tokenizer(checkpoint)
    model = attnlab.from_pretrained(checkpoint)
    ids = attnlab.generate(model, [[1, 2, 3]], max_new_tokens=8, eos_id=())[0].tolist()
    words = " ".join(WORDS[i] for i in ids if i != 0)
    assert (
        main([str(checkpoint), "--prompt", "the cat sat", "--max-new-tokens", "8", "--no-eos"]) == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("the cat sat") and out.split() == ("the cat sat " + words).split()


def test_sampling_seed_and_beams(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [str(checkpoint), "--ids", "1,2", "--max-new-tokens", "5", "--top-k", "3"]
    assert main([*args, "--seed", "1"]) == 0
    first = capsys.readouterr().out
    assert main([*args, "--seed", "1"]) == 0
    assert capsys.readouterr().out == first
    beam = [str(checkpoint), "--ids", "1,2", "--num-beams", "3", "--num-return-sequences", "2"]
    assert main([*beam, "--max-new-tokens", "6"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and "score=" in lines[0]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "pass --prompt TEXT or --ids"),
        (["--prompt", "the cat"], "no tokenizer.json"),
        (["--ids", "1", "--top-p", "0"], r"--top-p must be in \(0, 1\]"),
        (["--ids", "1", "--num-beams", "0"], "--num-beams must be positive"),
        (["--ids", "1", "--num-beams", "2", "--temperature", "0.5"], "does not sample"),
        (
            ["--ids", "1", "--max-new-tokens", "40", "--context", "error"],
            "exceed the model's context",
        ),
    ],
)
def test_errors(
    checkpoint: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main([str(checkpoint), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab generate: error:")
    assert re.search(message, err), err


def test_subparser_sets_func() -> None:
    parser = argparse.ArgumentParser()
    add_generate_subparser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["generate", "some/dir", "--ids", "1 2"])
    assert args.ids == [[1, 2]] and callable(args.func)


def test_encoder_decoder_sources_end_with_eos(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from attnlab.models.transformer import EncoderDecoderTransformer, TransformerConfig

    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=12, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                            max_seq_len=16, dropout=0.0, eos_id=2)  # fmt: skip
    model = EncoderDecoderTransformer(cfg)
    model.save_pretrained(tmp_path)
    expected = attnlab.generate(model, torch.tensor([[5, 9, 3, 2]]), max_new_tokens=6)[0]
    printed = []
    for ids in ("5,9,3", "5,9,3,2"):
        assert main([str(tmp_path), "--ids", ids, "--max-new-tokens", "6"]) == 0
        printed.append(capsys.readouterr().out.split())
    row = expected.tolist()
    stop = row.index(2) + 1 if 2 in row else len(row)
    assert printed[0] == printed[1] == [str(t) for t in row[:stop]]
    assert main([str(tmp_path), "--ids", "5,9,3", "--max-new-tokens", "6", "--no-source-eos"]) == 0
    raw = attnlab.generate(model, torch.tensor([[5, 9, 3]]), max_new_tokens=6)[0].tolist()
    stop = raw.index(2) + 1 if 2 in raw else len(raw)
    assert capsys.readouterr().out.split() == [str(t) for t in raw[:stop]]
