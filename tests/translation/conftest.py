"""Fixtures for the translation tests: a tiny Multi30k-layout directory cut from the real data
(300 training, 40 validation, 30 test pairs, de/en) and a tiny recipe config."""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Any

import pytest

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


def tiny_config(**overrides: Any) -> dict[str, Any]:
    """Overrides of the translate recipe small enough for seconds of training at one thread
    (written with attnlab 0.1's option names where they had them: the aliases keep working)."""
    values: dict[str, Any] = dict(
        vocab_size=400, d_model=32, n_layers=1, n_heads=2, d_ff=64, dropout=0.1, max_len=128,
        max_tokens=512, warmup=10, lr_factor=2.0, max_steps=8, max_minutes=None, eval_every=4,
        save_every=2, average_last=3, keep_checkpoints=3, eval_bleu_sentences=8, log_every=1,
        progress=False,
    )  # fmt: skip
    values.update(overrides)
    return values


def train(data: Path, out: Path, resume: bool = False, **overrides: Any) -> Any:
    """``attnlab train translate`` of the tiny config (the library side): the FitResult."""
    from attnlab.training.recipes import train_recipe

    _, result = train_recipe(
        "translate", out, {**tiny_config(**overrides), "data": str(data)}, resume=resume
    )
    return result


@pytest.fixture(scope="session")
def tiny_run(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny run directory (30 steps): last/, best/, averaged/, checkpoints."""
    out = tmp_path_factory.mktemp("run") / "de-en"
    train(tiny_data, out, max_steps=30, eval_every=10, save_every=5)
    return out
