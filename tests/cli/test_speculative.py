"""``--draft`` on ``attnlab generate`` and ``attnlab sample``: the model's own greedy output, the
acceptance statistics on stderr, and one-line errors for drafts that cannot serve."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab import GPT, GPTConfig
from attnlab.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

WORDS = ["<eos>", "the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far"]


def save(directory: Path, seed: int, words: list[str] = WORDS, **kw: object) -> Path:
    tokenizers = pytest.importorskip("tokenizers")
    torch.manual_seed(seed)
    fields: dict[str, object] = dict(vocab_size=len(words), d_model=16, n_heads=2, n_layers=1,
                                     d_ff=32, max_seq_len=32, dropout=0.0, eos_id=0)  # fmt: skip
    cfg = GPTConfig(**{**fields, **kw})  # type: ignore[arg-type]
    model = GPT(cfg)
    with torch.no_grad():  # large weights, norm weights near 1: varied, tie-free greedy tokens
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name and name.endswith("weight") else 0.0, 0.3)
    model.save_pretrained(directory)
    vocab = {w: i for i, w in enumerate(words)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token=words[1]))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.add_special_tokens([words[0]])
    tok.save(str(directory / "tokenizer.json"))
    return directory


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    return save(tmp_path / "target", 0), save(tmp_path / "draft", 1, d_model=8, n_heads=1)


def test_generate_with_a_draft_prints_the_models_own_tokens(
    pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    target, draft = pair
    args = ["generate", str(target), "--ids", "1,2,3", "--ids", "4", "--max-new-tokens", "12",
            "--no-eos"]  # fmt: skip
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert len(set(plain.split())) > 4  # not a degenerate repetition
    assert main([*args, "--draft", str(draft), "--num-draft-tokens", "3"]) == 0
    out = capsys.readouterr()
    assert out.out == plain
    assert re.search(r"^speculative decoding: k=3, acceptance rate \d\.\d{3} \(\d+/\d+ draft",
                     out.err, re.M), out.err  # fmt: skip
    assert out.err.startswith("engine: ")  # the header: which decode engine runs
    expected = attnlab.generate(attnlab.from_pretrained(target), [[1, 2, 3]], max_new_tokens=12,
                                eos_id=())[0].tolist()  # fmt: skip
    # Streamed text (one prompt with a tokenizer): the same words, the statistics after them.
    assert main(["generate", str(target), "--prompt", "the cat sat", "--max-new-tokens", "12",
                 "--no-eos", "--draft", str(draft)]) == 0  # fmt: skip
    out = capsys.readouterr()
    words = " ".join(WORDS[i] for i in expected if i != 0)
    assert out.out.split() == ("the cat sat " + words).split()
    assert "\nspeculative decoding: k=4, " in out.err  # the default k


def test_sample_with_a_draft(pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    target, draft = pair
    args = ["sample", str(target), "--prompt", "the dog", "--max-new-tokens", "10", "--greedy"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main([*args, "--draft", str(draft), "--num-draft-tokens", "2"]) == 0
    out = capsys.readouterr()
    assert out.out == plain and "speculative decoding: k=2" in out.err
    # Sampling with a seed: reproducible.
    sampled = ["sample", str(target), "--prompt", "the", "--max-new-tokens", "10", "--seed", "3",
               "--draft", str(draft)]  # fmt: skip
    assert main(sampled) == 0
    first = capsys.readouterr().out
    assert main(sampled) == 0
    assert capsys.readouterr().out == first


def test_errors(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target, draft = pair
    wide = save(tmp_path / "wide", 2, words=[*WORDS, "extra"])
    other = save(tmp_path / "other", 3, words=[WORDS[0], *reversed(WORDS[1:])])
    base = ["generate", str(target), "--ids", "1,2", "--max-new-tokens", "4"]
    cases = [
        (["--num-draft-tokens", "3"], "--num-draft-tokens needs --draft"),
        (["--draft", str(draft), "--num-beams", "2"], "does not combine with beam search"),
        (["--draft", str(draft), "--no-cache"], "drop --no-cache"),
        (
            ["--draft", str(draft), "--num-draft-tokens", "0"],
            "--num-draft-tokens must be at least 1",
        ),
        (["--draft", str(wide)], "vocabulary of 11 tokens, the model 10"),
        (["--draft", str(other)], "another tokenizer than the model"),
        (["--draft", str(tmp_path / "missing")], "does not exist"),
    ]
    for extra, message in cases:
        assert main([*base, *extra]) == 2, extra
        err = capsys.readouterr().err
        assert err.startswith("attnlab generate: error:") and message in err, err
    assert main(["sample", str(target), "--num-draft-tokens", "2"]) == 2
    assert "--num-draft-tokens needs --draft" in capsys.readouterr().err
