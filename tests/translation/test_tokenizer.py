"""The joint BPE tokenizer: exact round trip (up to NFKC/whitespace), specials, save/load."""

from __future__ import annotations

import gzip
import unicodedata
from pathlib import Path

import pytest

from attnlab.translation import TranslationTokenizer
from attnlab.translation.data import read_lines


@pytest.fixture(scope="module")
def tok(tiny_data: Path) -> TranslationTokenizer:
    texts = read_lines(tiny_data, "train", "de") + read_lines(tiny_data, "train", "en")
    return TranslationTokenizer.train(texts, vocab_size=500)


def test_round_trip_every_sentence(tok: TranslationTokenizer, tiny_data: Path) -> None:
    n = 0
    for file in sorted(tiny_data.glob("*.gz")):
        with gzip.open(file, "rt", encoding="utf-8") as f:
            for line in f.read().splitlines():
                expected = " ".join(unicodedata.normalize("NFKC", line).split())
                assert tok.decode(tok.encode(line)) == tok.normalize(line) == expected
                n += 1
    assert n == 2 * (300 + 40 + 30)


def test_unseen_characters_fall_back_to_bytes(tok: TranslationTokenizer) -> None:
    text = "Zoë sieht 🙂 und 東京 <s> </s> <unk> <0x41> ein Café."
    ids = tok.encode(text)
    assert tok.unk_id not in ids and tok.bos_id not in ids and tok.eos_id not in ids
    assert tok.decode(ids) == text


def test_normalisation_is_documented_behaviour(tok: TranslationTokenizer) -> None:
    messy = "  Ein\tMann▁  fährt\n Ｆahrrad. "  # fullwidth F -> F under NFKC; ▁ -> space
    assert tok.normalize(messy) == "Ein Mann fährt Fahrrad."
    assert tok.decode(tok.encode(messy)) == "Ein Mann fährt Fahrrad."


def test_special_ids_and_decode_stops_at_eos(tok: TranslationTokenizer) -> None:
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok.tokens([0, 1, 2, 3]) == ["<pad>", "<s>", "</s>", "<unk>"]
    ids = tok.encode("A dog runs.")
    assert tok.decode([tok.bos_id, *ids, tok.eos_id, *tok.encode("junk"), 0]) == "A dog runs."


def test_save_load_same_ids(tok: TranslationTokenizer, tmp_path: Path) -> None:
    tok.save(tmp_path)
    again = TranslationTokenizer.load(tmp_path / "tokenizer.json")
    text = "Zwei Hunde spielen im Schnee 🙂."
    assert again.encode(text) == tok.encode(text)
    assert again.vocab_size == tok.vocab_size <= 500
    assert again.decode(again.encode(text)) == text


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="vocab_size must be >= 261"):
        TranslationTokenizer.train(["a b c"], vocab_size=100)
    with pytest.raises(FileNotFoundError, match=r"no tokenizer\.json"):
        TranslationTokenizer.load("/nonexistent/dir")
