"""Multi30k loading, the length filter, token-based batching and padding."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import numpy as np
import pytest

from attnlab.translation import TranslationTokenizer, collate, encode_pairs, load_pairs
from attnlab.translation.data import token_batches


@pytest.fixture(scope="module")
def tok(tiny_data: Path) -> TranslationTokenizer:
    pairs = load_pairs(tiny_data, "train", "de", "en")
    return TranslationTokenizer.train([s for p in pairs for s in p], vocab_size=400)


def test_load_pairs(tiny_data: Path) -> None:
    pairs = load_pairs(tiny_data, "val", "de", "en")
    assert len(pairs) == 40
    assert pairs[0][1].startswith("A group of men")
    assert len(load_pairs(tiny_data, "train", "en", "de", limit=7)) == 7


def test_bad_data_input(tiny_data: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown language 'xx'.*available: de, en"):
        load_pairs(tiny_data, "train", "xx", "en")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_pairs(tmp_path / "missing", "train", "de", "en")
    with pytest.raises(FileNotFoundError, match=r"no split 'test2018'"):
        load_pairs(tiny_data, "test2018", "de", "en")
    with pytest.raises(ValueError, match="both 'de'"):
        load_pairs(tiny_data, "train", "de", "de")
    (tmp_path / "train.de").write_text("a\nb\n")
    (tmp_path / "train.en").write_text("a\n")
    with pytest.raises(ValueError, match=r"has 2 lines but train\.en has 1"):
        load_pairs(tmp_path, "train", "de", "en")


def test_batches_cover_every_pair_once_without_truncation(
    tok: TranslationTokenizer, tiny_data: Path
) -> None:
    pairs = load_pairs(tiny_data, "train", "de", "en")
    data = encode_pairs(tok, pairs, max_len=200)
    assert len(data) == 300 and data.dropped == 0
    batches = token_batches(data.src_lengths, data.tgt_lengths, max_tokens=300, seed=3, epoch=1)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(300))
    seen = 0
    for index in batches:
        b = collate(data, index, pad_id=0, bos_id=1)
        width = max(b.src.shape[1], b.tgt_in.shape[1])
        assert len(index) * width <= 300 or len(index) == 1
        for row, i in enumerate(index):  # every token of every pair is in the batch
            n_src, n_tgt = len(data.src[i]), len(data.tgt[i])
            assert b.src[row, :n_src].tolist() == data.src[i]
            assert b.src_mask[row].sum() == n_src and not b.src_mask[row, n_src:].any()
            assert b.tgt_out[row, :n_tgt].tolist() == data.tgt[i]
            assert b.tgt_in[row, :n_tgt].tolist() == [1, *data.tgt[i][:-1]]
            assert (b.tgt_out[row, n_tgt:] == 0).all()
            seen += 1
    assert seen == 300
    assert data.src[0][-1] == tok.eos_id and data.tgt[0][-1] == tok.eos_id


def test_batch_order_depends_on_seed_and_epoch_only() -> None:
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(3, 40, 500), rng.integers(3, 40, 500)
    a = token_batches(src, tgt, max_tokens=400, seed=1, epoch=0)
    assert a == token_batches(src, tgt, max_tokens=400, seed=1, epoch=0)
    assert a != token_batches(src, tgt, max_tokens=400, seed=1, epoch=1)
    # similar lengths batched together: the batches cut the length-sorted pairs into runs
    ranges = sorted(
        (int(np.maximum(src[b], tgt[b]).min()), int(np.maximum(src[b], tgt[b]).max())) for b in a
    )
    assert all(hi <= lo for (_, hi), (lo, _) in itertools.pairwise(ranges))
    ordered = token_batches(src, tgt, max_tokens=400)
    widths = [int(np.maximum(src[b], tgt[b]).max()) for b in ordered]
    assert widths == sorted(widths)
    one = token_batches(np.array([50]), np.array([60]), max_tokens=10)
    assert one == [[0]]  # a pair over the budget is a batch of its own, never split
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        token_batches(src, tgt, max_tokens=0)


def test_too_long_pairs_are_dropped_with_a_count_or_raise(
    tok: TranslationTokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    long = " ".join(["Hund"] * 40)
    pairs = [("Ein Hund.", "A dog."), (long, "Dogs."), ("Eine Katze.", "A cat.")]
    with caplog.at_level(logging.WARNING):
        data = encode_pairs(tok, pairs, max_len=20, what="train")
    assert data.dropped == 1 and data.index == [0, 2]
    assert "dropped 1 of 3 pairs longer than max_len=20" in caplog.text
    with pytest.raises(ValueError, match=r"pair 1 has .* more than max_len=20"):
        encode_pairs(tok, pairs, max_len=20, too_long="raise")
