"""Text corpora: Tiny Shakespeare found offline first (a path, ``$ATTNLAB_DATA``, the shared
folder beside the checkout), and token streams split into train/val and cut into blocks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnlab.data.text import TokenStream, load_text

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


def test_token_stream_split_and_contiguous_blocks() -> None:
    stream = TokenStream(torch.arange(100), val_fraction=0.1)
    assert len(stream.split("train")) == 90 and stream.split("val")[0] == 90
    blocks = stream.blocks("train", 5, 9, torch.Generator().manual_seed(0))
    assert blocks.shape == (5, 9)
    assert (blocks.diff(dim=1) == 1).all() and (blocks < 90).all()
    with pytest.raises(ValueError, match="fewer than"):
        stream.blocks("val", 1, 11, torch.Generator())
