"""Fixtures of the viz tests: tiny random models, and a PNG size reader.

Plot tests need matplotlib (the ``[viz]`` extra, in ``[dev]``) and skip without it; the data
tests (captured weights, rollout, positional tables, masks) run either way.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch

from attnlab import BERT, GPT, BERTConfig, EncoderDecoderTransformer, build_model


@pytest.fixture
def mpl() -> None:
    """Skip the test without matplotlib."""
    pytest.importorskip("matplotlib")


@pytest.fixture
def tiny_bert() -> BERT:
    torch.manual_seed(0)
    config = BERTConfig(
        vocab_size=50,
        d_model=32,
        n_heads=4,
        n_layers=2,
        d_ff=64,
        max_seq_len=32,
        dropout=0.0,
        mlm_head=False,
        cls_id=1,
        sep_id=2,
        mask_id=3,
    )
    return BERT(config).eval()


@pytest.fixture
def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    model = build_model("gpt-char-baby", n_layers=2, dropout=0.0)
    assert isinstance(model, GPT)
    return model.eval()


@pytest.fixture
def tiny_seq2seq() -> EncoderDecoderTransformer:
    torch.manual_seed(0)
    model = build_model("transformer-tiny", dropout=0.0)
    assert isinstance(model, EncoderDecoderTransformer)
    return model.eval()


def png_size(path: Path) -> tuple[int, int]:
    """``(width, height)`` in pixels of a PNG file; fails for anything else."""
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.fixture
def check_png():
    """``check_png(path, fig)``: a valid PNG of the figure's size at the saving dpi."""

    def check(path: Path, fig: object, dpi: int = 110) -> None:
        width, height = fig.get_size_inches() * dpi  # type: ignore[attr-defined]
        assert Path(path).stat().st_size > 1000
        w, h = png_size(path)
        assert abs(w - width) <= 1 and abs(h - height) <= 1, ((w, h), (width, height))

    return check
