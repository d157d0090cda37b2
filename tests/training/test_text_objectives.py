"""Tokenizers (char, byte-level BPE) and the language-model objectives' batches: causal LM
blocks, BERT's masked-LM rule (the text data themselves: tests/data/test_text.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnlab.data.text import TokenStream
from attnlab.tokenizers import BPETokenizer, CharTokenizer, load_tokenizer
from attnlab.training.objectives import CausalLMObjective, MaskedLMObjective


def test_char_tokenizer_round_trip_and_save(tmp_path: Path) -> None:
    tok = CharTokenizer.from_text("hello world", specials=["[PAD]", "[MASK]"])
    assert tok.vocab_size == 2 + 8 and tok.token_id("[MASK]") == 1
    assert tok.decode(tok.encode("low")) == "low"
    with pytest.raises(ValueError, match="'z' is not in the vocabulary"):
        tok.encode("z")
    tok.save(tmp_path / "t.json")
    again = load_tokenizer(tmp_path / "t.json")
    assert again.encode("hello") == tok.encode("hello") and again.vocab_size == tok.vocab_size


def test_bpe_tokenizer_trains_and_round_trips(tmp_path: Path) -> None:
    text = "the quick brown fox jumps over the lazy dog. " * 50
    tok = BPETokenizer.train([text], vocab_size=300, specials=["[PAD]"])
    assert tok.vocab_size <= 300 and tok.token_id("[PAD]") == 0
    ids = tok.encode("the lazy fox")
    assert len(ids) < len("the lazy fox")  # merges learned
    assert tok.decode(ids) == "the lazy fox"
    tok.save(tmp_path / "bpe.json")
    assert load_tokenizer(tmp_path / "bpe.json").encode("the lazy fox") == ids


def test_causal_lm_batches_are_shifted_blocks_of_the_split() -> None:
    stream = TokenStream(torch.arange(100), val_fraction=0.1)
    x, y = CausalLMObjective(stream, 8).sample("val", 3, torch.Generator().manual_seed(0))
    assert torch.equal(x[:, 1:], y[:, :-1]) and (x >= 90).all()


def test_mlm_batches_follow_berts_masking_rule() -> None:
    stream = TokenStream(
        torch.randint(4, 50, (20_000,), generator=torch.Generator().manual_seed(0))
    )
    objective = MaskedLMObjective(stream, 64, vocab_size=50, mask_id=3, special_ids=(0, 1, 2, 3))
    inputs, targets = objective.sample("train", 64, torch.Generator().manual_seed(0))
    selected = targets != -100
    assert 0.13 < selected.float().mean() < 0.17
    masked = (inputs == 3) & selected
    assert 0.75 < masked.sum() / selected.sum() < 0.85
    ids = stream.blocks("train", 64, 64, torch.Generator().manual_seed(0))  # same draws
    assert torch.equal(inputs[~selected], ids[~selected])
    assert torch.equal(targets[selected], ids[selected])
    again = objective.sample("train", 64, torch.Generator().manual_seed(0))
    assert torch.equal(again[0], inputs) and torch.equal(again[1], targets)
