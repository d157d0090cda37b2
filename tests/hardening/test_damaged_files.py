"""Damaged files through every command that reads them (issue 19, class 5).

A file can be damaged in ways a parser meets before attnlab's own checks: invalid UTF-8, JSON
nested a hundred thousand levels deep (Python's parser recurses), an integer of 5,000 digits
(Python refuses to convert more than 4,300), a file cut short, a ``.gz`` cut short, a ``.bin`` or
``.npz`` cut short. Each must end in exit 2 with one ``error:`` line that names the file — never a
traceback (RecursionError, EOFError, zipfile.BadZipFile, the tokenizers library's bare
``Exception``) and never a message that leaves the user guessing which file is bad.
"""

from __future__ import annotations

import gzip
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab import GPTConfig, build_model
from attnlab.io import read_json
from attnlab.tokenizers import CharTokenizer, load_tokenizer
from attnlab.training.metrics import read_metrics
from testkit import run_cli as _run

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

TINY = GPTConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=16,
                 eos_id=None)  # fmt: skip

DAMAGED_JSON: dict[str, bytes] = {
    "invalid_utf8": b'{"model_type": "gpt", "name": "\xff\xfe"}',
    "deeply_nested": b"[" * 100_000 + b"]" * 100_000,
    "huge_integer": b'{"model_type": "gpt", "d_model": ' + b"9" * 5000 + b"}",
    "truncated": b'{"model_type": "gpt", "d_mo',
}


def _refused(argv: list[str], names: str) -> str:
    """Run ``argv``; it must exit 2 with one error line naming ``names`` (a file's name)."""
    code, _, err = _run(argv)  # an uncaught exception fails the test right here
    assert code == 2, f"{argv}: exit {code}\n{err[-2000:]}"
    assert "Traceback" not in err, err[-2000:]
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    assert names in lines[0], f"the error does not name {names}: {lines[0]}"
    return lines[0]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT model directory with attnlab's character tokenizer."""
    root = tmp_path_factory.mktemp("damaged") / "model"
    torch.manual_seed(0)
    build_model(TINY).save_pretrained(root)
    CharTokenizer.from_text("abcdefghijklmnopqrstuvwxyz .,\n").save(root / "tokenizer.json")
    return root


@pytest.fixture
def damaged_copy(model_dir: Path, tmp_path: Path) -> Iterator[Path]:
    copy = tmp_path / "model"
    shutil.copytree(model_dir, copy)
    yield copy


COMMANDS = {
    "generate": lambda d: ["generate", str(d), "--prompt", "ab", "--max-new-tokens", "2"],
    "inspect": lambda d: ["inspect", str(d), "--text", "ab", "--lens"],
    "viz attention": lambda d: [
        *("viz", "attention", str(d), "--text", "ab", "--out", str(d.parent / "a.png"))
    ],
    "quantize": lambda d: ["quantize", str(d), "--bits", "8", "--out", str(d.parent / "q")],
}


@pytest.mark.parametrize("damage", list(DAMAGED_JSON))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_damaged_config_json_is_named(damaged_copy: Path, command: str, damage: str) -> None:
    (damaged_copy / "config.json").write_bytes(DAMAGED_JSON[damage])
    _refused(COMMANDS[command](damaged_copy), "config.json")


@pytest.mark.parametrize("damage", list(DAMAGED_JSON))
@pytest.mark.parametrize("command", ["generate", "inspect", "viz attention"])
def test_a_damaged_tokenizer_json_is_named(damaged_copy: Path, command: str, damage: str) -> None:
    (damaged_copy / "tokenizer.json").write_bytes(DAMAGED_JSON[damage])
    _refused(COMMANDS[command](damaged_copy), "tokenizer.json")


@pytest.mark.parametrize("damage", list(DAMAGED_JSON))
def test_analyze_names_a_damaged_config_file(tmp_path: Path, damage: str) -> None:
    file = tmp_path / "model.json"
    file.write_bytes(DAMAGED_JSON[damage])
    _refused(["analyze", str(file)], "model.json")


def test_a_tokenizers_library_file_the_library_refuses_is_named(damaged_copy: Path) -> None:
    """Valid JSON with a ``model`` the ``tokenizers`` library cannot read (it raises a plain
    ``Exception``)."""
    pytest.importorskip("tokenizers")
    (damaged_copy / "tokenizer.json").write_text('{"model": {"type": "NoSuchModel"}}')
    _refused(COMMANDS["generate"](damaged_copy), "tokenizer.json")
    from attnlab.interop.tokenizer import load_tokenizer as load_library_tokenizer
    from attnlab.translation.tokenizer import TranslationTokenizer

    for load in (load_library_tokenizer, TranslationTokenizer.load, load_tokenizer):
        with pytest.raises(ValueError, match=r"tokenizer\.json"):
            load(damaged_copy)


def test_a_truncated_pytorch_bin_is_named(tmp_path: Path) -> None:
    """A Hugging Face directory whose ``pytorch_model.bin`` was cut short."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    d = tmp_path / "hf"
    model = transformers.GPT2LMHeadModel(cfg)
    model.save_pretrained(d)
    (d / "model.safetensors").unlink()
    weights = d / "pytorch_model.bin"
    torch.save(model.state_dict(), weights)
    weights.write_bytes(weights.read_bytes()[:3000])
    _refused(["generate", str(d), "--ids", "1,2", "--max-new-tokens", "2"], "pytorch_model.bin")


def _multi30k(root: Path) -> Path:
    d = root / "multi30k"
    d.mkdir()
    for split in ("train", "val", "test_2016_flickr"):
        for lang in ("de", "en"):
            text = "".join(f"{lang} satz {i}\n" for i in range(20))
            (d / f"{split}.{lang}.gz").write_bytes(gzip.compress(text.encode()))
    return d


@pytest.mark.parametrize("damage", ["truncated", "not_gzip", "invalid_utf8"])
def test_a_damaged_multi30k_gz_is_named(tmp_path: Path, damage: str) -> None:
    d = _multi30k(tmp_path)
    file = d / "train.de.gz"
    if damage == "truncated":
        file.write_bytes(file.read_bytes()[:-12])  # the deflate stream and trailer cut short
    elif damage == "not_gzip":
        file.write_bytes(b"this is not gzip\n")
    else:
        file.write_bytes(gzip.compress(b"ein satz\n\xff\xfe kaputt\n"))
    line = _refused(
        ["train", "translate", "--data", str(d), "--max-steps", "1", "--out", f"{tmp_path}/run"],
        "train.de.gz",
    )
    assert not (tmp_path / "run" / "checkpoints").exists(), line


def test_a_truncated_cifar10_npz_is_named(tmp_path: Path) -> None:
    from attnlab.data.cifar10 import load_cifar10

    d = tmp_path / "cifar10"
    d.mkdir()
    for split, n in (("train", 20), ("test", 10)):
        images = np.zeros((n, 32, 32, 3), dtype=np.uint8)
        np.savez(d / f"{split}.npz", images=images, labels=np.arange(n, dtype=np.uint8) % 10)
        data = (d / f"{split}.npz").read_bytes()
        (d / f"{split}.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"train\.npz|test\.npz"):
        load_cifar10(d)


@pytest.mark.parametrize("damage", list(DAMAGED_JSON))
def test_damaged_metrics_lines_are_skipped_not_fatal(tmp_path: Path, damage: str) -> None:
    """A JSON-lines file keeps its good lines whatever one bad line holds."""
    file = tmp_path / "metrics.jsonl"
    good = '{"split": "train", "step": 1, "loss": 2.0, "elapsed": 0.1}\n'
    file.write_bytes(good.encode() + DAMAGED_JSON[damage] + b"\n" + good.replace("1", "2").encode())
    records = read_metrics(file)
    assert [r["step"] for r in records] == [1, 2]
    code, out, err = _run(["viz", "curves", str(file), "--out", str(tmp_path / "c.png")])
    assert code == 0, err
    assert "1 lines skipped" in out, out


@pytest.mark.parametrize("damage", list(DAMAGED_JSON))
def test_read_json_names_the_file_for_every_damage(tmp_path: Path, damage: str) -> None:
    file = tmp_path / "thing.json"
    file.write_bytes(DAMAGED_JSON[damage])
    with pytest.raises(ValueError, match=r"thing\.json"):
        read_json(file, what="thing", expect=dict)


def test_the_damages_are_what_they_claim() -> None:
    """Guards the fixtures: each damage really trips the parser it is meant to trip."""
    import json

    with pytest.raises(RecursionError):
        json.loads(DAMAGED_JSON["deeply_nested"])
    with pytest.raises(ValueError, match="4300"):
        json.loads(DAMAGED_JSON["huge_integer"])
    with pytest.raises(UnicodeDecodeError):
        DAMAGED_JSON["invalid_utf8"].decode("utf-8")
    assert os.environ.get("PYTHONINTMAXSTRDIGITS", "") in ("", "4300")
