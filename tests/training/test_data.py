"""Tokenizers (char, byte-level BPE), Tiny Shakespeare loading, blocks, MLM batches, images."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.tokenizers import BPETokenizer, CharTokenizer, load_tokenizer
from attnlab.training.data import ArrayImageDataset, TokenStream, load_text
from attnlab.training.objectives import CausalLMObjective, MaskedLMObjective

SHAKESPEARE = Path(__file__).resolve().parents[3] / "shared" / "data" / "tinyshakespeare.txt"
needs_data = pytest.mark.skipif(not SHAKESPEARE.is_file(), reason="shared data missing")


@needs_data
def test_tiny_shakespeare_from_a_path_and_from_attnlab_data(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text, file = load_text(SHAKESPEARE)
    assert len(text) == 1_115_394 and len(set(text)) == 65 and file == SHAKESPEARE
    monkeypatch.setenv("ATTNLAB_DATA", str(SHAKESPEARE.parent))
    assert load_text(download=False) == (text, SHAKESPEARE)


def test_missing_file_without_download_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATTNLAB_DATA", str(tmp_path))
    monkeypatch.setattr("attnlab.io._checkout_data", lambda: None)  # as an installed package
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(FileNotFoundError, match=r"ATTNLAB_DATA=DIR.*--data=FILE"):
        load_text(download=False)


@needs_data
def test_data_is_found_beside_the_checkout_without_any_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ATTNLAB_DATA", raising=False)
    assert load_text(download=False)[1] == SHAKESPEARE  # ../shared/data, offline first


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


def test_token_stream_split_and_contiguous_blocks() -> None:
    stream = TokenStream(torch.arange(100), val_fraction=0.1)
    assert len(stream.split("train")) == 90 and stream.split("val")[0] == 90
    blocks = stream.blocks("train", 5, 9, torch.Generator().manual_seed(0))
    assert blocks.shape == (5, 9)
    assert (blocks.diff(dim=1) == 1).all() and (blocks < 90).all()
    x, y = CausalLMObjective(stream, 8).sample("val", 3, torch.Generator().manual_seed(0))
    assert torch.equal(x[:, 1:], y[:, :-1]) and (x >= 90).all()
    with pytest.raises(ValueError, match="fewer than"):
        stream.blocks("val", 1, 11, torch.Generator())


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


def test_array_image_dataset_split_and_normalisation() -> None:
    images = np.random.default_rng(0).random((50, 8, 8)) * 16
    labels = np.arange(50) % 10
    data = ArrayImageDataset(images, labels, test_fraction=0.2, seed=0)
    x_train, _ = data.split("train")
    x_test, _ = data.split("val")
    assert x_train.shape == (40, 1, 8, 8) and x_test.shape == (10, 1, 8, 8)
    assert data.n_classes == 10 and data.image_shape == (1, 8, 8)
    assert abs(float(x_train.mean())) < 1e-5
    xb, yb = data.batch("train", 7, torch.Generator().manual_seed(0))
    assert xb.shape == (7, 1, 8, 8) and yb.shape == (7,)
    with pytest.raises(ValueError, match="need images"):
        ArrayImageDataset(images, labels[:3])


def test_image_dataset_three_way_split_is_disjoint_and_keeps_the_test_split() -> None:
    images = torch.arange(100, dtype=torch.float32).reshape(100, 1, 1, 1).expand(100, 1, 2, 2)
    labels = torch.arange(100) % 10
    plain = ArrayImageDataset(images, labels, test_fraction=0.2, seed=3, normalize=False)
    three = ArrayImageDataset(
        images, labels, test_fraction=0.2, val_fraction=0.25, seed=3, normalize=False
    )
    names = ("train", "val", "test")
    ids = {name: set(three.split(name)[0][:, 0, 0, 0].tolist()) for name in names}
    assert [len(ids[n]) for n in names] == [60, 20, 20]
    assert ids["train"] | ids["val"] | ids["test"] == set(range(100))
    assert not (ids["train"] & ids["val"] or ids["train"] & ids["test"] or ids["val"] & ids["test"])
    # the test split does not depend on whether a validation split is carved out
    assert torch.equal(plain.split("test")[0], three.split("test")[0])
    assert torch.equal(plain.split("val")[0], plain.split("test")[0])
    with pytest.raises(ValueError, match="val_fraction must be in"):
        ArrayImageDataset(images, labels, val_fraction=1.0)
