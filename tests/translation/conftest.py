"""Fixtures for the translation tests: a tiny Multi30k-layout directory cut from the real data
(300 training, 40 validation, 30 test pairs, de/en) and a tiny recipe config."""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Any

import pytest

from attnlab.translation import TranslateConfig

_ROOT = os.environ.get("ATTNLAB_DATA") or Path(__file__).resolve().parents[3] / "shared" / "data"
MULTI30K = Path(_ROOT) / "multi30k"
SIZES = {"train": 300, "val": 40, "test_2016_flickr": 30}


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with train/val/test_2016_flickr .de/.en files (first lines of Multi30k)."""
    if not (MULTI30K / "train.de.gz").is_file():
        pytest.skip(f"Multi30k is not at {MULTI30K}")
    out = tmp_path_factory.mktemp("multi30k")
    for split, n in SIZES.items():
        for lang in ("de", "en"):
            with gzip.open(MULTI30K / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = f.read().splitlines()[:n]
            with gzip.open(out / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in lines))
    return out


def tiny_config(**overrides: Any) -> TranslateConfig:
    """A model and budget small enough for a few seconds of training at one thread."""
    values: dict[str, Any] = dict(
        vocab_size=400,
        d_model=32,
        n_layers=1,
        n_heads=2,
        d_ff=64,
        dropout=0.1,
        max_len=128,
        max_tokens=512,
        warmup=10,
        lr_factor=2.0,
        max_steps=8,
        eval_every=4,
        save_every=2,
        average_last=3,
        eval_bleu_sentences=8,
        log_every=1,
        progress=False,
    )
    values.update(overrides)
    return TranslateConfig(**values)


@pytest.fixture(scope="session")
def tiny_run(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny run directory (30 steps): last/, best/, averaged/, snapshots."""
    from attnlab.translation import train_translation

    out = tmp_path_factory.mktemp("run") / "de-en"
    train_translation(tiny_config(max_steps=30, eval_every=10, save_every=5), tiny_data, out)
    return out
