"""Input validation sweep: every public entry point and what it rejects, one test per row.

:data:`ROWS` is the table of ``docs/validation.md`` ("Input validation"): entry point, the input
it rejects, the exception class and its exact message. ``test_rejects`` runs each row and checks
the class and the message *as documented* (read back from the doc), and
``test_doc_table_is_current`` renders the table from :data:`ROWS` and compares it with the doc,
so the two cannot drift. After changing a row or a message, regenerate the doc's table with::

    ATTNLAB_UPDATE_DOCS=1 python -m pytest tests/hardening/test_validation_sweep.py

Errors must name the bad value and what was expected; no row may be an ``AssertionError``.
Checkpoint, training and command-line rows run in a scratch directory (relative paths, so
messages are reproducible). A command-line row runs ``attnlab ...`` in process and must exit with
status 2 and an ``error:`` line (:class:`CLIExitError` carries both; the table shows ``exit 2``).
"""
# ruff: noqa: E501  (the table keeps one row per line)

from __future__ import annotations

import contextlib
import functools
import gzip
import io
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import attnlab
from attnlab import (
    BERT,
    GPT,
    BERTConfig,
    GPTConfig,
    TransformerConfig,
    ViTConfig,
    build_model,
    viz,
)
from attnlab import analysis as an
from attnlab import data as DATA
from attnlab import explore as EX
from attnlab import generation as G
from attnlab import layers as L
from attnlab import tokenizers as TK
from attnlab import training as TR
from attnlab.analysis import memory_check as mc
from attnlab.cli import main as cli_main
from attnlab.config import config_from_dict
from attnlab.explore import lm as EXLM
from attnlab.explore import panels as EXP
from attnlab.generation import ContextLengthError
from attnlab.generation.processors import NonFiniteLogitsError
from attnlab.interop import CheckpointMismatchError, load_tokenizer, save_hf
from attnlab.layers.attention_linear import favor_projection
from attnlab.layers.patch_embedding import PatchEmbedding, patchify, unpatchify
from attnlab.models import config_for, config_from_json_dict
from attnlab.models.mamba import MambaConfig
from attnlab.models.rnn import RNNConfig
from attnlab.pretrained import NonFiniteWeightsError
from attnlab.sentence import embed
from attnlab.tokenizers import load_tokenizer as load_any_tokenizer
from attnlab.translation.data import load_pairs
from attnlab.viz.capture import fuse_heads

DOC = Path(__file__).resolve().parents[2] / "docs" / "validation.md"
BEGIN, END = "<!-- validation-table:begin -->", "<!-- validation-table:end -->"


@dataclass(frozen=True)
class Row:
    """One documented rejection: ``call()`` must raise exactly ``error``."""

    area: str
    entry: str
    rejects: str
    call: Callable[[], Any]
    error: type[BaseException]

    @property
    def key(self) -> str:
        return f"{self.entry}: {self.rejects}"


# ---------------------------------------------------------------------------- inputs


def t(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)


def ids(*shape: int, value: int = 1) -> torch.Tensor:
    return torch.full(shape, value, dtype=torch.long)


def sdpa(**kw: Any) -> Any:
    """Attention on ``(2, 4, 3, 8)`` queries and ``(2, 2, 5, 8)`` keys/values, with overrides."""
    args: dict[str, Any] = {"q": t(2, 4, 3, 8), "k": t(2, 2, 5, 8), "v": t(2, 2, 5, 8)}
    args.update(kw)
    return L.scaled_dot_product_attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def backend(name: str, **kw: Any) -> Any:
    args: dict[str, Any] = {"q": t(2, 4, 3, 8), "k": t(2, 2, 5, 8), "v": t(2, 2, 5, 8)}
    args.update(kw)
    return L.get_attention_backend(name)(args.pop("q"), args.pop("k"), args.pop("v"), **args)


TINY_GPT = GPTConfig(
    vocab_size=50, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=8, eos_id=None
)
TINY_BERT = BERTConfig(
    vocab_size=110, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=8, mlm_head=False
)
TINY_VIT = ViTConfig(image_size=8, patch_size=4, n_classes=3, d_model=16, n_heads=2, n_layers=1,
                     d_ff=32)  # fmt: skip
TINY_TR = TransformerConfig(vocab_size=50, d_model=16, n_heads=2, n_layers=1, d_ff=32)
TINY_MAMBA = MambaConfig(vocab_size=50, d_model=16, n_layers=1, d_state=4)
TINY_RNN = RNNConfig(vocab_size=50, d_model=16, n_layers=1)


@functools.cache
def model(name: str) -> Any:
    config = {"gpt": TINY_GPT, "bert": TINY_BERT, "vit": TINY_VIT, "transformer": TINY_TR,
              "mamba": TINY_MAMBA, "rnn": TINY_RNN}[name]  # fmt: skip
    return build_model(config).eval()


@functools.cache
def explorer(name: str) -> Any:
    """Explorers of tiny random models for the ``explore`` rows (a GPT with ``max_tokens`` 8)."""
    torch.manual_seed(0)
    if name == "gpt":
        return EX.Explorer(
            build_model("gpt-char-baby", n_layers=1, vocab_size=32), limits=EX.Limits(max_tokens=8)
        )
    if name == "vit":
        return EX.Explorer(build_model("vit-digits", n_layers=1))
    if name == "big-vit":
        return EX.Explorer(build_model("vit-digits", n_layers=1, image_size=32, patch_size=2))
    return EX.Explorer(build_model("cct-cifar", n_layers=1))


def gpt_cfg(**kw: Any) -> GPTConfig:
    return GPTConfig(**{**TINY_GPT.__dict__, **kw})


def mha(**kw: Any) -> L.MultiHeadAttention:
    return L.MultiHeadAttention(16, 4, **kw)


class CLIExitError(Exception):
    """A command line that exited with a non-zero status; the message is its ``error:`` line."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def cli(*argv: str, available: int | None = None) -> None:
    """Run ``attnlab argv`` in process; raise :class:`CLIExitError` unless it succeeds.

    ``available``: pretend this many bytes of RAM are free (the memory-check rows), so that the
    message does not depend on the machine.
    """
    err = io.StringIO()
    with contextlib.ExitStack() as stack:
        stack.enter_context(contextlib.redirect_stderr(err))
        stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        if available is not None:
            mp = stack.enter_context(pytest.MonkeyPatch.context())
            mp.setattr(mc, "available_memory", lambda: (available, "MemAvailable"))
        try:
            code = cli_main(list(argv))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    lines = [x for x in err.getvalue().splitlines() if "error:" in x]
    if code:
        raise CLIExitError(code, lines[-1] if lines else err.getvalue().strip())


def gen(**kw: Any) -> Any:
    """``generate`` on the tiny GPT with a (1, 3) prompt, with overrides."""
    args: dict[str, Any] = {"input_ids": ids(1, 3), "max_new_tokens": 2}
    args.update(kw)
    return G.generate(model("gpt"), args.pop("input_ids"), **args)


def stream_of(n: int) -> DATA.TokenStream:
    return DATA.TokenStream(torch.arange(n) % 7)


def trainer(**kw: Any) -> TR.Trainer:
    config = TR.TrainConfig(**{"schedule": "constant", "progress": False, **kw})
    objective = TR.CausalLMObjective(stream_of(100), block_size=4)
    return TR.Trainer(build_model(TINY_GPT), objective, config)


SHAKESPEARE = ("train", "shakespeare-char", "--data=corpus.txt", "--runs-dir", "runs")
HUGE = ("--d_model=65536", "--n_heads=512", "--n_layers=512", "--d_ff=262144")


def lay_out_checkpoints(root: Path) -> None:
    """The bad checkpoint directories the ``from_pretrained`` rows load (relative to root)."""
    ck = root / "ckpt"

    def config(name: str, data: Any, text: str | None = None) -> Path:
        d = ck / name
        d.mkdir(parents=True)
        (d / "config.json").write_text(text if text is not None else json.dumps(data))
        return d

    (ck / "no_config").mkdir(parents=True)
    for name, raw in [  # damaged config files, with weights so that the config is what fails
        ("deep_config", b"[" * 100_000 + b"]" * 100_000),
        ("huge_int_config", b'{"model_type": "gpt", "d_model": ' + b"9" * 5000 + b"}"),
        ("latin1_config", '{"model_type": "gpt", "name": "Müller"}'.encode("latin-1")),
    ]:
        (ck / name).mkdir(parents=True)
        (ck / name / "config.json").write_bytes(raw)
        save_file({"x": torch.zeros(1)}, ck / name / "model.safetensors")
    save_hf(model("gpt"), ck / "hf_bin_truncated")
    state = load_file(ck / "hf_bin_truncated" / "model.safetensors")
    (ck / "hf_bin_truncated" / "model.safetensors").unlink()
    torch.save(state, ck / "hf_bin_truncated" / "pytorch_model.bin")
    data = (ck / "hf_bin_truncated" / "pytorch_model.bin").read_bytes()
    (ck / "hf_bin_truncated" / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    (ck / "bad_library_tokenizer").mkdir(parents=True)
    (ck / "bad_library_tokenizer" / "tokenizer.json").write_text('{"model": {"type": "Nope"}}')
    m30k = root / "m30k_truncated"
    m30k.mkdir()
    for split in ("train", "val", "test_2016_flickr"):
        for lang in ("de", "en"):
            text = "".join(f"{lang} {i}\n" for i in range(20)).encode()
            (m30k / f"{split}.{lang}.gz").write_bytes(gzip.compress(text, mtime=0))
    packed = (m30k / "train.de.gz").read_bytes()
    (m30k / "train.de.gz").write_bytes(packed[:-12])
    config("not_json", None, "{not json")
    config("a_list", [1, 2])
    config("t5", {"model_type": "t5", "d_model": 8})
    config("no_type", {"hidden_size": 8})
    config("no_weights", attnlab.config.config_to_dict(TINY_GPT))
    for name, data in [
        ("bad_key", {"model_type": "gpt", "d_modle": 8}),
        ("string_size", {**attnlab.config.config_to_dict(TINY_GPT), "d_model": "16"}),
    ]:  # with weights, so that the config is what fails
        save_file({"x": torch.zeros(1)}, config(name, data) / "model.safetensors")
    config("hf_no_weights", {"model_type": "gpt2", "n_embd": 16, "n_layer": 1, "n_head": 2})
    model("gpt").save_pretrained(ck / "mismatch")
    cfg = json.loads((ck / "mismatch" / "config.json").read_text())
    (ck / "mismatch" / "config.json").write_text(json.dumps({**cfg, "d_ff": 48}))
    model("bert").save_pretrained(ck / "a_bert")
    save_hf(model("gpt"), ck / "hf_missing")
    tensors = load_file(ck / "hf_missing" / "model.safetensors")
    tensors.pop("transformer.h.0.mlp.c_fc.weight")
    save_file(tensors, ck / "hf_missing" / "model.safetensors")
    save_hf(model("bert"), ck / "hf_option")
    cfg = json.loads((ck / "hf_option" / "config.json").read_text())
    cfg["position_embedding_type"] = "relative_key"
    (ck / "hf_option" / "config.json").write_text(json.dumps(cfg))
    d = config("escape", {"model_type": "gpt2", "n_embd": 16, "n_layer": 1, "n_head": 2})
    index = {"weight_map": {"wte.weight": "../outside.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    (root / "a_file").write_text("not a directory")
    (root / "metrics_dir").mkdir()
    model("gpt").save_pretrained(ck / "a_gpt")
    model("transformer").save_pretrained(ck / "a_transformer")
    (root / "corpus.txt").write_text("To be, or not to be, that is the question.\n" * 20)
    (root / "not_a_tokenizer.json").write_text('{"hello": 1}')
    run = TR.prepare("shakespeare-char", {"data": "corpus.txt"})  # a run with the defaults
    (root / "runs" / "old").mkdir(parents=True)
    (root / "runs" / "old" / "run.json").write_text(json.dumps(run.record()))  # killed before
    # its first checkpoint
    (root / "runs" / "no_checkpoint").mkdir()
    # round 2 (issue 19): non-finite weights, a config claiming a huge model, a lost history
    nan = build_model(TINY_GPT)
    with torch.no_grad():
        nan.tok_embed.weight[0, 0] = float("nan")
    nan.save_pretrained(ck / "nan_gpt")
    save_hf(model("gpt"), ck / "hf_bomb")
    cfg = json.loads((ck / "hf_bomb" / "config.json").read_text())
    (ck / "hf_bomb" / "config.json").write_text(json.dumps({**cfg, "n_layer": 10**6}))
    (root / "runs" / "lost").mkdir()
    (root / "runs" / "lost" / "run.json").write_text(json.dumps(run.record()))
    (root / "runs" / "lost" / "metrics.jsonl").write_text(
        '{"split": "train", "step": 1000, "loss": 1.5}\n'
    )  # trained past its first checkpoint (step 500), whose directory is gone


# ---------------------------------------------------------------------------- the table


def parts() -> tuple[Any, Any, Any, Any]:
    """A block's parts: attention, FFN and two norms (d_model 8, 2 heads, d_ff 16)."""
    return L.MultiHeadAttention(8, 2), L.FeedForward(8, 16), L.LayerNorm(8), L.LayerNorm(8)


# fmt: off
ROWS: list[Row] = [
    # -- layers: attention (eq. 1) and its backends
    Row("layers", "scaled_dot_product_attention", "q with 3 dims", lambda: sdpa(q=t(2, 3, 8)), ValueError),
    Row("layers", "scaled_dot_product_attention", "integer q, k, v", lambda: sdpa(q=t(2, 4, 3, 8, dtype=torch.long)), TypeError),
    Row("layers", "scaled_dot_product_attention", "q, k, v of different dtypes", lambda: sdpa(k=t(2, 2, 5, 8, dtype=torch.float64)), TypeError),
    Row("layers", "scaled_dot_product_attention", "different batch sizes", lambda: sdpa(k=t(1, 2, 5, 8)), ValueError),
    Row("layers", "scaled_dot_product_attention", "q and k head dims differ", lambda: sdpa(k=t(2, 2, 5, 4)), ValueError),
    Row("layers", "scaled_dot_product_attention", "k and v lengths differ", lambda: sdpa(v=t(2, 2, 6, 8)), ValueError),
    Row("layers", "scaled_dot_product_attention", "H not a multiple of H_kv", lambda: sdpa(k=t(2, 3, 5, 8), v=t(2, 3, 5, 8)), ValueError),
    Row("layers", "scaled_dot_product_attention", "dropout_p = 1", lambda: sdpa(dropout_p=1.0), ValueError),
    Row("layers", "scaled_dot_product_attention", "integer mask", lambda: sdpa(mask=t(3, 5, dtype=torch.long)), TypeError),
    Row("layers", "scaled_dot_product_attention", "mask with 5 dims", lambda: sdpa(mask=t(1, 2, 4, 3, 5, dtype=torch.bool)), ValueError),
    Row("layers", "scaled_dot_product_attention", "mask that does not broadcast to (B, H, T, S)", lambda: sdpa(mask=t(3, 4, dtype=torch.bool)), ValueError),
    Row("layers", "get_attention_backend", "unknown name", lambda: L.get_attention_backend("flash"), ValueError),
    Row("layers", "get_attention_backend", "options with a callable", lambda: L.get_attention_backend(L.chunked_attention, window=4), ValueError),
    Row("layers", "get_attention_backend", "options for a backend that takes none", lambda: L.get_attention_backend("math", window=4), ValueError),
    Row("layers", "backend \"sdpa\"", "key length differs from value length", lambda: backend("sdpa", v=t(2, 2, 4, 8)), ValueError),
    Row("layers", "backend \"chunked\"", "mask that does not broadcast", lambda: backend("chunked", mask=t(2, 3, 3, 5, dtype=torch.bool)), ValueError),
    Row("layers", "chunked_attention", "block_q = 0", lambda: L.chunked_attention(t(1, 1, 2, 4), t(1, 1, 2, 4), t(1, 1, 2, 4), block_q=0), ValueError),
    Row("layers", "ChunkedAttention", "fractional block size", lambda: L.ChunkedAttention(block_q=1.5), ValueError),  # type: ignore[arg-type]
    Row("layers", "backend \"sliding_window\"", "integer q, k, v", lambda: backend("sliding_window", q=t(2, 4, 3, 8, dtype=torch.int32)), TypeError),
    Row("layers", "sliding_window_attention", "window = 0", lambda: L.sliding_window_attention(t(1, 1, 2, 4), t(1, 1, 2, 4), t(1, 1, 2, 4), window=0), ValueError),
    Row("layers", "SlidingWindowAttention", "window = True", lambda: L.SlidingWindowAttention(window=True), ValueError),
    Row("layers", "SlidingWindowAttention", "negative global token", lambda: L.SlidingWindowAttention(global_tokens=[-1]), ValueError),
    Row("layers", "SlidingWindowAttention", "block_size = 0", lambda: L.SlidingWindowAttention(block_size=0), ValueError),
    Row("layers", "backend \"linear\"", "a per-query (T, S) mask", lambda: backend("linear", mask=t(3, 5, dtype=torch.bool)), ValueError),
    Row("layers", "backend \"linear\"", "an additive mask with biases", lambda: backend("linear", mask=torch.ones(2, 1, 1, 5)), ValueError),
    Row("layers", "linear_attention", "chunk_size = 0", lambda: L.linear_attention(t(1, 1, 2, 4), t(1, 1, 2, 4), t(1, 1, 2, 4), chunk_size=0), ValueError),
    Row("layers", "linear_attention", "\"favor\" without a projection", lambda: L.linear_attention(t(1, 1, 2, 4), t(1, 1, 2, 4), t(1, 1, 2, 4), feature_map="favor"), ValueError),
    Row("layers", "LinearAttention", "unknown feature map", lambda: L.LinearAttention(feature_map="relu"), ValueError),  # type: ignore[arg-type]
    Row("layers", "LinearAttention", "n_features = 0", lambda: L.LinearAttention(n_features=0), ValueError),
    Row("layers", "favor_projection", "d_head = 0", lambda: favor_projection(0, 4), ValueError),
    # -- layers: multi-head attention
    Row("layers", "MultiHeadAttention", "n_heads that does not divide d_model", lambda: L.MultiHeadAttention(16, 3), ValueError),
    Row("layers", "MultiHeadAttention", "n_kv_heads that does not divide n_heads", lambda: mha(n_kv_heads=3), ValueError),
    Row("layers", "MultiHeadAttention", "dropout = 1", lambda: mha(dropout=1.0), ValueError),
    Row("layers", "MultiHeadAttention", "unknown backend", lambda: mha(backend="flash"), ValueError),
    Row("layers", "MultiHeadAttention.forward", "x of the wrong width", lambda: mha()(t(2, 3, 8)), ValueError),
    Row("layers", "MultiHeadAttention.forward", "memory with another batch size", lambda: mha()(t(2, 3, 16), t(3, 5, 16)), ValueError),
    Row("layers", "MultiHeadAttention.forward", "need_weights with linear attention", lambda: mha(backend="linear")(t(2, 3, 16), need_weights=True), ValueError),
    Row("layers", "MultiHeadAttention.forward", "positions of another length (RoPE)", lambda: mha(rotary=L.RotaryEmbedding(4))(t(2, 3, 16), positions=torch.arange(5)), ValueError),
    # -- layers: masks
    Row("layers", "causal_mask", "negative length", lambda: L.causal_mask(-1), ValueError),
    Row("layers", "padding_mask_from_lengths", "float lengths", lambda: L.padding_mask_from_lengths(torch.tensor([1.0, 2.0])), ValueError),
    Row("layers", "padding_mask_from_lengths", "a length above max_len", lambda: L.padding_mask_from_lengths(torch.tensor([3, 7]), 5), ValueError),
    Row("layers", "padding_mask_from_lengths", "a negative length", lambda: L.padding_mask_from_lengths(torch.tensor([-1, 2])), ValueError),
    Row("layers", "padding_mask_from_ids", "1-D ids", lambda: L.padding_mask_from_ids(ids(5), 0), ValueError),
    Row("layers", "as_attention_mask", "a 3-D mask", lambda: L.as_attention_mask(t(2, 3, 4, dtype=torch.bool)), ValueError),
    Row("layers", "combine_masks", "shapes that do not broadcast", lambda: L.combine_masks(t(2, 3, dtype=torch.bool), t(4, dtype=torch.bool)), ValueError),
    Row("layers", "to_additive", "an integer dtype", lambda: L.to_additive(t(3, dtype=torch.bool), torch.int64), TypeError),
    # -- layers: positional encodings
    Row("layers", "RotaryEmbedding", "odd head dim", lambda: L.RotaryEmbedding(7), ValueError),
    Row("layers", "RotaryEmbedding", "unknown scaling", lambda: L.RotaryEmbedding(8, scaling="yarn"), ValueError),  # type: ignore[arg-type]
    Row("layers", "RotaryEmbedding", "scaling factor below 1", lambda: L.RotaryEmbedding(8, factor=0.5), ValueError),
    Row("layers", "RotaryEmbedding", "unknown layout", lambda: L.RotaryEmbedding(8, layout="pairs"), ValueError),  # type: ignore[arg-type]
    Row("layers", "RotaryEmbedding.rotate", "head dim other than d_head", lambda: L.RotaryEmbedding(8).rotate(t(1, 2, 3, 6), torch.arange(3)), ValueError),
    Row("layers", "RotaryEmbedding.rotate", "positions of another length", lambda: L.RotaryEmbedding(8).rotate(t(1, 2, 3, 8), torch.arange(4)), ValueError),
    Row("layers", "SinusoidalPositionalEncoding.embed", "positions of another length", lambda: L.SinusoidalPositionalEncoding(8).embed(t(2, 3, 8), torch.arange(4)), ValueError),
    Row("layers", "LearnedPositionalEmbedding.embed", "a position beyond the table", lambda: L.LearnedPositionalEmbedding(8, 4).embed(t(1, 5, 8), torch.arange(5)), ValueError),
    Row("layers", "alibi_slopes / ALiBi", "n_heads = 0", lambda: L.ALiBi(0), ValueError),
    Row("layers", "build_positional_encoding", "unknown name", lambda: L.build_positional_encoding("xpos", d_model=8, n_heads=2, max_seq_len=4), ValueError),
    # -- layers: embeddings, FFN, norms, patches, blocks, KV cache
    Row("layers", "TokenEmbedding", "vocab_size = 0", lambda: L.TokenEmbedding(0, 8), ValueError),
    Row("layers", "TokenEmbedding", "padding_idx outside the vocabulary", lambda: L.TokenEmbedding(10, 8, padding_idx=10), ValueError),
    Row("layers", "TokenEmbedding.forward", "float ids", lambda: L.TokenEmbedding(10, 8)(t(2, 3)), ValueError),
    Row("layers", "TokenEmbedding.forward", "an id >= vocab_size", lambda: L.TokenEmbedding(10, 8)(ids(2, 3, value=10)), ValueError),
    Row("layers", "TokenEmbedding.forward", "a negative id", lambda: L.TokenEmbedding(10, 8)(ids(2, 3, value=-1)), ValueError),
    Row("layers", "tie_weights", "weights of different shapes", lambda: L.tie_weights(nn.Linear(8, 9), L.TokenEmbedding(10, 8)), ValueError),
    Row("layers", "FeedForward", "unknown activation", lambda: L.FeedForward(8, 16, activation="tanh"), ValueError),
    Row("layers", "FeedForward", "d_ff = 0", lambda: L.FeedForward(8, 0), ValueError),
    Row("layers", "FeedForward", "dropout = 1.5", lambda: L.FeedForward(8, 16, dropout=1.5), ValueError),
    Row("layers", "build_norm", "unknown norm", lambda: L.build_norm("groupnorm", 8), ValueError),
    Row("layers", "RMSNorm", "bias=True", lambda: L.RMSNorm(8, bias=True), ValueError),
    Row("layers", "RMSNorm.forward", "inputs of another width", lambda: L.RMSNorm(8)(t(2, 4)), ValueError),
    Row("layers", "LayerNorm.forward", "inputs of another width", lambda: L.LayerNorm(8)(t(2, 4)), ValueError),
    Row("layers", "PatchEmbedding", "image size not a multiple of the patch size", lambda: PatchEmbedding(10, 4, 3, 8), ValueError),
    Row("layers", "PatchEmbedding", "a non-positive size", lambda: PatchEmbedding(8, 4, 0, 8), ValueError),
    Row("layers", "patchify", "3-D images", lambda: patchify(t(3, 8, 8), 4), ValueError),
    Row("layers", "unpatchify", "patches that do not tile the image", lambda: unpatchify(t(1, 3, 48), 4, 8, 8), ValueError),
    Row("layers", "EncoderLayer", "unknown norm_position", lambda: L.EncoderLayer(*parts(), norm_position="middle"), ValueError),  # type: ignore[arg-type]
    Row("layers", "DecoderLayer.forward", "no memory for a cross-attention layer", lambda: L.DecoderLayer(*parts(), cross_attn=L.MultiHeadAttention(8, 2), cross_attn_norm=L.LayerNorm(8))(t(1, 2, 8)), ValueError),
    Row("layers", "DecoderLayer", "cross_attn without its norm", lambda: L.DecoderLayer(*parts(), cross_attn=L.MultiHeadAttention(8, 2)), ValueError),
    Row("layers", "LayerKVCache", "max_len = 0", lambda: L.LayerKVCache(0), ValueError),
    Row("layers", "LayerKVCache.update", "more tokens than max_len", lambda: L.LayerKVCache(2).update(t(1, 1, 3, 4), t(1, 1, 3, 4)), ValueError),
    Row("layers", "KVCache", "one window per layer expected", lambda: L.KVCache(2, 8, windows=[None]), ValueError),
    # -- models: configs (also what a config.json can hold)
    Row("models", "GPTConfig", "n_heads that does not divide d_model", lambda: gpt_cfg(n_heads=3), ValueError),
    Row("models", "GPTConfig", "n_heads not a multiple of n_kv_heads", lambda: gpt_cfg(n_kv_heads=3), ValueError),
    Row("models", "GPTConfig", "dropout = 1", lambda: gpt_cfg(dropout=1.0), ValueError),
    Row("models", "GPTConfig", "unknown norm", lambda: gpt_cfg(norm="groupnorm"), ValueError),
    Row("models", "GPTConfig", "unknown activation", lambda: gpt_cfg(activation="tanh"), ValueError),
    Row("models", "GPTConfig", "unknown pos_encoding", lambda: gpt_cfg(pos_encoding="xpos"), ValueError),
    Row("models", "GPTConfig", "unknown attn_backend", lambda: gpt_cfg(attn_backend="flash"), ValueError),
    Row("models", "GPTConfig", "attn_window without the sliding_window backend", lambda: gpt_cfg(attn_window=4), ValueError),
    Row("models", "GPTConfig", "an option the backend does not take", lambda: gpt_cfg(attn_backend="bigbird", attn_options={"bigbird": {"blok": 8}}), ValueError),
    Row("models", "GPTConfig", "a backend option out of range", lambda: gpt_cfg(attn_backend="lsh", attn_options={"lsh": {"n_buckets": 3}}), ValueError),
    Row("models", "GPTConfig", "options for a backend the model does not use", lambda: gpt_cfg(attn_options={"bigbird": {"block": 8}}), ValueError),
    Row("checkpoints", "save_hf", "a sparse attention backend", lambda: save_hf(build_model(gpt_cfg(attn_backend="sparse_fixed")), "out"), attnlab.interop.UnsupportedCheckpointError),
    Row("models", "GPTConfig", "attn_layer_backends of the wrong length", lambda: gpt_cfg(attn_layer_backends=("math", "sdpa")), ValueError),
    Row("models", "GPTConfig", "rope with an odd head dim", lambda: gpt_cfg(d_model=18, n_heads=2, pos_encoding="rope"), ValueError),
    Row("models", "GPTConfig", "rope_factor below 1", lambda: gpt_cfg(rope_factor=0.5), ValueError),
    Row("models", "GPTConfig", "eos_id outside the vocabulary", lambda: gpt_cfg(eos_id=50), ValueError),
    Row("models", "GPTConfig", "vocab_size = 0", lambda: gpt_cfg(vocab_size=0), ValueError),
    Row("models", "GPTConfig", "a string where an integer belongs", lambda: gpt_cfg(d_model="16"), TypeError),
    Row("models", "GPTConfig", "a fractional layer count", lambda: gpt_cfg(n_layers=2.5), TypeError),
    Row("models", "GPTConfig", "a bool where an integer belongs", lambda: gpt_cfg(n_layers=True), TypeError),
    Row("models", "GPTConfig", "a string where a flag belongs", lambda: gpt_cfg(bias="false"), TypeError),
    Row("models", "BERTConfig", "type_vocab_size = 0", lambda: BERTConfig(type_vocab_size=0), ValueError),
    Row("models", "BERTConfig", "cls_id outside the vocabulary", lambda: BERTConfig(vocab_size=100), ValueError),
    Row("models", "ViTConfig", "image size not a multiple of the patch size", lambda: ViTConfig(image_size=30), ValueError),
    Row("models", "ViTConfig", "n_classes = -1", lambda: ViTConfig(n_classes=-1), ValueError),
    Row("models", "ViTConfig", "unknown pool", lambda: ViTConfig(pool="max"), ValueError),  # type: ignore[arg-type]
    Row("models", "ViTConfig", "pos_encoding other than learned/none", lambda: ViTConfig(pos_encoding="rope"), ValueError),  # type: ignore[arg-type]
    Row("models", "TransformerConfig", "shared embeddings with two vocabularies", lambda: TransformerConfig(tgt_vocab_size=100), ValueError),
    Row("models", "TransformerConfig", "attn_layer_backends with unequal stacks", lambda: TransformerConfig(n_layers=2, n_decoder_layers=3, attn_layer_backends=("math", "sdpa")), ValueError),
    Row("models", "TransformerConfig", "bos_id outside the vocabulary", lambda: TransformerConfig(vocab_size=1), ValueError),
    # -- models: forward passes
    Row("models", "GPT.forward", "1-D ids", lambda: model("gpt")(ids(5)), ValueError),
    Row("models", "GPT.forward", "float ids", lambda: model("gpt")(t(2, 3)), ValueError),
    Row("models", "GPT.forward", "an id >= vocab_size", lambda: model("gpt")(ids(2, 3, value=50)), ValueError),
    Row("models", "GPT.forward", "a negative id", lambda: model("gpt")(ids(2, 3, value=-1)), ValueError),
    Row("models", "GPT.forward", "a sequence longer than max_seq_len (learned positions)", lambda: model("gpt")(ids(1, 9)), ValueError),
    Row("models", "GPT.forward", "a mask of the wrong shape", lambda: model("gpt")(ids(2, 3), mask=t(2, 4)), ValueError),
    Row("models", "GPT.forward", "targets of the wrong shape", lambda: model("gpt")(ids(2, 3), targets=ids(2, 4)), ValueError),
    Row("models", "GPT.forward", "positions of the wrong shape", lambda: model("gpt")(ids(2, 3), positions=torch.arange(4)), ValueError),
    Row("models", "GPT.forward", "more tokens than the cache holds", lambda: model("gpt")(ids(1, 3), cache=model("gpt").new_cache(2)), ValueError),
    Row("models", "BERT.forward", "3-D ids", lambda: model("bert")(ids(1, 2, 3)), ValueError),
    Row("models", "BERT.forward", "an empty sequence", lambda: model("bert")(ids(2, 0)), ValueError),
    Row("models", "BERT.forward", "a sequence longer than max_seq_len", lambda: model("bert")(ids(1, 9)), ValueError),
    Row("models", "BERT.forward", "token_type_ids of the wrong shape", lambda: model("bert")(ids(2, 3), token_type_ids=ids(2, 4, value=0)), ValueError),
    Row("models", "BERT.forward", "token_type_ids >= type_vocab_size", lambda: model("bert")(ids(2, 3), token_type_ids=ids(2, 3, value=2)), ValueError),
    Row("models", "BERT.forward", "a mask of the wrong shape", lambda: model("bert")(ids(2, 3), mask=t(2, 4)), ValueError),
    Row("models", "BERT.forward", "targets without an MLM head", lambda: model("bert")(ids(2, 3), targets=ids(2, 3)), ValueError),
    Row("models", "BERT.forward (MLM head)", "targets of the wrong shape", lambda: BERT(BERTConfig(**{**TINY_BERT.__dict__, "mlm_head": True}))(ids(2, 3), targets=ids(2, 4)), ValueError),
    Row("models", "mask_tokens", "float ids", lambda: attnlab.mask_tokens(t(2, 3), vocab_size=10, mask_id=3), ValueError),
    Row("models", "mask_tokens", "mask_prob = 1.5", lambda: attnlab.mask_tokens(ids(2, 3), vocab_size=10, mask_id=3, mask_prob=1.5), ValueError),
    Row("models", "ViT.forward", "images of the wrong size", lambda: model("vit")(t(2, 3, 12, 12)), ValueError),
    Row("models", "ViT.forward", "the wrong channel count", lambda: model("vit")(t(2, 1, 8, 8)), ValueError),
    Row("models", "ViT.forward", "3-D images", lambda: model("vit")(t(3, 8, 8)), ValueError),
    Row("models", "ViT.forward", "float64 images for a float32 model", lambda: model("vit")(t(2, 3, 8, 8, dtype=torch.float64)), TypeError),
    Row("models", "ViT.forward", "integer images", lambda: model("vit")(t(2, 3, 8, 8, dtype=torch.uint8)), TypeError),
    Row("models", "EncoderDecoderTransformer.forward", "1-D source ids", lambda: model("transformer")(ids(3), ids(2, 3)), ValueError),
    Row("models", "EncoderDecoderTransformer.forward", "1-D target ids", lambda: model("transformer")(ids(2, 3), ids(3)), ValueError),
    Row("models", "EncoderDecoderTransformer.forward", "source and target batch sizes differ", lambda: model("transformer")(ids(2, 3), ids(3, 3)), ValueError),
    Row("models", "EncoderDecoderTransformer.forward", "a source id >= vocab_size", lambda: model("transformer")(ids(2, 3, value=50), ids(2, 3)), ValueError),
    Row("models", "EncoderDecoderTransformer.forward", "a source mask of the wrong shape", lambda: model("transformer")(ids(2, 3), ids(2, 3), src_mask=t(2, 5)), ValueError),
    Row("models", "EncoderDecoderTransformer.forward", "targets of the wrong shape", lambda: model("transformer")(ids(2, 3), ids(2, 3), targets=ids(2, 4)), ValueError),
    # -- models: building
    Row("models", "build_model / config_for", "unknown preset", lambda: build_model("gpt5"), ValueError),
    Row("models", "build_model / config_for", "unknown override of a preset", lambda: config_for("gpt-char-baby", d_modle=8), ValueError),
    Row("models", "build_model", "unknown override of a config", lambda: build_model(TINY_VIT, d_modle=8), ValueError),
    Row("models", "build_model", "an object that is not a config", lambda: build_model({"model_type": "gpt"}), ValueError),
    Row("models", "config_from_dict", "unknown key", lambda: config_from_dict(ViTConfig, {"patch": 4}), ValueError),
    Row("models", "config_from_dict", "another model's model_type", lambda: config_from_dict(ViTConfig, {"model_type": "gpt"}), ValueError),
    Row("models", "config_from_json_dict", "no model_type", lambda: config_from_json_dict({"d_model": 8}), ValueError),
    Row("models", "config_from_json_dict", "unknown model_type", lambda: config_from_json_dict({"model_type": "t5"}), ValueError),
    # -- checkpoints (paths relative to the scratch directory)
    Row("checkpoints", "from_pretrained", "a missing directory", lambda: attnlab.from_pretrained("ckpt/nowhere"), FileNotFoundError),
    Row("checkpoints", "from_pretrained", "a directory without config.json", lambda: attnlab.from_pretrained("ckpt/no_config"), FileNotFoundError),
    Row("checkpoints", "from_pretrained", "config.json that is not JSON", lambda: attnlab.from_pretrained("ckpt/not_json"), ValueError),
    Row("checkpoints", "from_pretrained", "config.json that is not an object", lambda: attnlab.from_pretrained("ckpt/a_list"), ValueError),
    Row("checkpoints", "from_pretrained", "unknown model_type", lambda: attnlab.from_pretrained("ckpt/t5"), attnlab.interop.UnsupportedCheckpointError),
    Row("checkpoints", "from_pretrained", "no model_type", lambda: attnlab.from_pretrained("ckpt/no_type"), attnlab.interop.UnsupportedCheckpointError),
    Row("checkpoints", "from_pretrained", "unknown key in an attnlab config", lambda: attnlab.from_pretrained("ckpt/bad_key"), ValueError),
    Row("checkpoints", "from_pretrained", "a string size in an attnlab config", lambda: attnlab.from_pretrained("ckpt/string_size"), TypeError),
    Row("checkpoints", "from_pretrained", "an attnlab config without weights", lambda: attnlab.from_pretrained("ckpt/no_weights"), FileNotFoundError),
    Row("checkpoints", "from_pretrained", "attnlab weights of other shapes than the config", lambda: attnlab.from_pretrained("ckpt/mismatch"), attnlab.interop.CheckpointMismatchError),
    Row("checkpoints", "from_pretrained", "a Hugging Face config without weights", lambda: attnlab.from_pretrained("ckpt/hf_no_weights"), FileNotFoundError),
    Row("checkpoints", "from_pretrained", "a Hugging Face checkpoint missing a tensor", lambda: attnlab.from_pretrained("ckpt/hf_missing"), attnlab.interop.CheckpointMismatchError),
    Row("checkpoints", "from_pretrained", "an unsupported Hugging Face option", lambda: attnlab.from_pretrained("ckpt/hf_option"), attnlab.interop.UnsupportedCheckpointError),
    Row("checkpoints", "from_pretrained", "a shard index naming a file outside the directory", lambda: attnlab.from_pretrained("ckpt/escape"), ValueError),
    Row("checkpoints", "GPT.from_pretrained", "a directory that holds a BERT", lambda: GPT.from_pretrained("ckpt/a_bert"), TypeError),
    Row("checkpoints", "save_pretrained", "a model without .config", lambda: attnlab.save_pretrained(nn.Linear(2, 2), "out"), ValueError),
    Row("checkpoints", "save_pretrained", "a path that is a file", lambda: attnlab.save_pretrained(model("gpt"), "a_file"), NotADirectoryError),
    Row("checkpoints", "save_hf", "a model without .config", lambda: save_hf(nn.Linear(2, 2), "out"), ValueError),
    Row("checkpoints", "save_hf", "a model with no Hugging Face equivalent", lambda: save_hf(build_model(gpt_cfg(pos_encoding="sinusoidal")), "out"), attnlab.interop.UnsupportedCheckpointError),
    Row("checkpoints", "load_tokenizer", "a directory without tokenizer.json", lambda: load_tokenizer("ckpt/no_config"), FileNotFoundError),
    Row("checkpoints", "embed", "batch_size = 0", lambda: embed(["a"], model("bert"), batch_size=0), ValueError),
    Row("checkpoints", "embed", "a model object without its tokenizer", lambda: embed(["a"], model("bert")), ValueError),
    # -- analysis
    Row("analysis", "forward_flops", "seq_len = 0", lambda: an.forward_flops(TINY_GPT, 0), ValueError),
    Row("analysis", "forward_flops", "seq_len = True", lambda: an.forward_flops(TINY_GPT, True), ValueError),
    Row("analysis", "forward_flops", "batch = 0", lambda: an.forward_flops(TINY_GPT, batch=0), ValueError),
    Row("analysis", "forward_flops", "src_len for a decoder-only model", lambda: an.forward_flops(TINY_GPT, 4, src_len=4), ValueError),
    Row("analysis", "forward_flops", "a ViT length below 2", lambda: an.forward_flops(TINY_VIT, 1), ValueError),
    Row("analysis", "forward_flops", "an object that is not a config", lambda: an.forward_flops(object()), ValueError),
    Row("analysis", "activation_bytes", "unknown dtype", lambda: an.activation_bytes(TINY_GPT, dtype="float8"), ValueError),
    Row("analysis", "training_memory", "negative seq_len", lambda: an.training_memory(TINY_GPT, -1), ValueError),
    Row("analysis", "kv_cache_bytes", "an encoder-only config", lambda: an.kv_cache_bytes(TINY_BERT), ValueError),
    Row("analysis", "kv_cache_bytes", "window = 0", lambda: an.kv_cache_bytes(TINY_GPT, window=0), ValueError),
    Row("analysis", "kv_cache_bytes", "src_len for a decoder-only model", lambda: an.kv_cache_bytes(TINY_GPT, src_len=4), ValueError),
    Row("analysis", "kv_cache_bytes_per_token", "unknown dtype", lambda: an.kv_cache_bytes_per_token(TINY_GPT, dtype="int3"), ValueError),
    Row("analysis", "mfu", "step time 0", lambda: an.mfu(1e9, 0.0, 1e12), ValueError),
    Row("analysis", "count_params / param_breakdown", "an object that is not a config", lambda: an.param_breakdown(object()), ValueError),
    Row("analysis", "analyze", "a module without .config", lambda: an.analyze(nn.Linear(2, 2)), ValueError),
    Row("analysis", "crossover", "an object that is not a config", lambda: an.crossover(object()), ValueError),
    Row("analysis", "sweep_seq_len", "length 0", lambda: an.sweep_seq_len(TINY_GPT, [0]), ValueError),
    Row("analysis", "measure_flops", "a device other than cpu/meta", lambda: an.measure_flops(TINY_GPT, device="cuda"), ValueError),
    # -- viz (data functions; the plot functions validate the same way before drawing)
    Row("viz", "mask_data / plot_masks", "unknown kind", lambda: viz.mask_data(["diagonal"]), ValueError),
    Row("viz", "mask_data / plot_masks", "seq_len = 0", lambda: viz.mask_data(seq_len=0), ValueError),
    Row("viz", "mask_data / plot_masks", "padding length above seq_len", lambda: viz.mask_data(seq_len=4, length=5), ValueError),
    Row("viz", "mask_data / plot_masks", "window = 0", lambda: viz.mask_data(window=0), ValueError),
    Row("viz", "mask_data / plot_masks", "query_len = 0", lambda: viz.mask_data(query_len=0), ValueError),
    Row("viz", "positional_data / plot_positional", "unknown kind", lambda: viz.positional_data("xpos"), ValueError),
    Row("viz", "positional_data / plot_positional", "d_model = 0", lambda: viz.positional_data("sinusoidal", d_model=0), ValueError),
    Row("viz", "positional_data / plot_positional", "\"learned\" without a model", lambda: viz.positional_data("learned"), ValueError),
    Row("viz", "positional_data / plot_positional", "\"rope\" with an odd head dim", lambda: viz.positional_data("rope", d_head=7), ValueError),
    Row("viz", "plot_attention", "heads out of range", lambda: viz.plot_attention(t(2, 3, 3), ["a", "b", "c"], heads=[2]), ValueError),
    Row("viz", "plot_attention", "4-D weights", lambda: viz.plot_attention(t(1, 2, 3, 3), ["a", "b", "c"]), ValueError),
    Row("viz", "plot_rollout", "a non-square rollout", lambda: viz.plot_rollout(t(2, 3), ["a", "b"]), ValueError),
    Row("viz", "attention_rollout", "residual = 2", lambda: viz.attention_rollout([t(2, 3, 3)], residual=2.0), ValueError),
    Row("viz", "attention_rollout", "no layers", lambda: viz.attention_rollout([]), ValueError),
    Row("viz", "attention_rollout", "non-square weights", lambda: viz.attention_rollout([t(2, 3, 4)]), ValueError),
    Row("viz", "fuse_heads", "unknown fusion", lambda: fuse_heads(t(2, 3, 3), "median"), ValueError),  # type: ignore[arg-type]
    Row("viz", "head_scores", "query out of range", lambda: viz.head_scores([t(2, 3, 3)], 3, [0]), ValueError),
    Row("viz", "head_scores", "no key indices", lambda: viz.head_scores([t(2, 3, 3)], 0, []), ValueError),
    Row("viz", "find_token", "a word not in the sequence", lambda: viz.find_token(["the", "cat"], "dog"), ValueError),
    Row("viz", "collect_attention", "a model without attention", lambda: viz.collect_attention(nn.Linear(2, 2), t(1, 2)), ValueError),
    Row("viz", "read_metrics", "a missing path", lambda: viz.read_metrics("no_such_run"), FileNotFoundError),
    Row("viz", "read_metrics", "a directory without metrics", lambda: viz.read_metrics("metrics_dir"), FileNotFoundError),
    Row("viz", "load_benchmark", "a missing file", lambda: viz.load_benchmark("no_such.json"), FileNotFoundError),
    Row("viz", "plot_curves", "no runs", lambda: viz.plot_curves([]), ValueError),
    Row("viz", "plot_benchmark", "rows without positive values", lambda: viz.plot_benchmark([{"n": 0, "time_s": 0}]), ValueError),
    # -- training
    Row("training", "TrainConfig", "steps = 0", lambda: TR.TrainConfig(steps=0), ValueError),
    Row("training", "TrainConfig", "negative lr", lambda: TR.TrainConfig(lr=-1.0), ValueError),
    Row("training", "TrainConfig", "unknown optimizer", lambda: TR.TrainConfig(optimizer="lion"), ValueError),  # type: ignore[arg-type]
    Row("training", "TrainConfig", "unknown schedule", lambda: TR.TrainConfig(schedule="linear"), ValueError),  # type: ignore[arg-type]
    Row("training", "TrainConfig", "label_smoothing = 1.5", lambda: TR.TrainConfig(label_smoothing=1.5), ValueError),
    Row("training", "TrainConfig", "beta2 = 1", lambda: TR.TrainConfig(betas=(0.9, 1.0)), ValueError),
    Row("training", "TrainConfig", "three betas", lambda: TR.TrainConfig(betas=(0.9, 0.99, 0.999)), ValueError),  # type: ignore[arg-type]
    Row("training", "TrainConfig", "negative warmup", lambda: TR.TrainConfig(warmup=-1), ValueError),
    Row("training", "TrainConfig", "negative checkpoint_every", lambda: TR.TrainConfig(checkpoint_every=-1), ValueError),
    Row("training", "TrainConfig", "min_lr_ratio = 2", lambda: TR.TrainConfig(min_lr_ratio=2.0), ValueError),
    Row("training", "TrainConfig", "noam without warmup", lambda: TR.TrainConfig(schedule="noam", warmup=0), ValueError),
    Row("training", "TrainConfig", "cosine with warmup >= steps", lambda: TR.TrainConfig(schedule="cosine", steps=10, warmup=10), ValueError),
    Row("training", "TrainConfig", "keep_checkpoints = 0", lambda: TR.TrainConfig(keep_checkpoints=0), ValueError),
    Row("training", "TrainConfig.from_dict", "unknown key", lambda: TR.TrainConfig.from_dict({"stepz": 10}), ValueError),
    Row("training", "TrainConfig", "label_smoothing = -0.1", lambda: TR.TrainConfig(label_smoothing=-0.1), ValueError),
    Row("training", "TrainConfig", "an infinite lr", lambda: TR.TrainConfig(lr=float("inf")), ValueError),
    Row("training", "TrainConfig", "a NaN clip_grad_norm", lambda: TR.TrainConfig(clip_grad_norm=float("nan")), ValueError),
    Row("training", "TrainConfig", "no budget at all", lambda: TR.TrainConfig(steps=None), ValueError),
    Row("training", "TrainConfig", "batch_warmup_start > batch_size", lambda: TR.TrainConfig(batch_size=4, batch_warmup=10, batch_warmup_start=8), ValueError),
    Row("training", "TrainConfig", "negative seq_warmup", lambda: TR.TrainConfig(seq_warmup=-1), ValueError),
    Row("training", "warmup_size", "start above full", lambda: TR.schedules.warmup_size(0, start=9, full=8, steps=4), ValueError),
    Row("training", "TrainConfig", "average_last above keep_checkpoints", lambda: TR.TrainConfig(average_last=3), ValueError),
    Row("training", "TrainConfig", "a best_metric that is not a validation metric", lambda: TR.TrainConfig(best_metric="loss"), ValueError),
    Row("training", "TrainConfig", "an unknown optimizer_impl", lambda: TR.TrainConfig(optimizer_impl="magic"), ValueError),  # type: ignore[arg-type]
    Row("training", "Trainer", "noam for a model without d_model", lambda: TR.Trainer(nn.Linear(2, 2), TR.CausalLMObjective(stream_of(100), 4), TR.TrainConfig()), ValueError),
    Row("training", "Trainer.save", "no run_dir", lambda: trainer().save(), ValueError),
    Row("training", "TokenStream", "2-D ids", lambda: DATA.TokenStream(ids(2, 50)), ValueError),
    Row("training", "TokenStream", "val_fraction = 1", lambda: DATA.TokenStream(torch.arange(50), val_fraction=1.0), ValueError),
    Row("training", "TokenStream", "too few tokens to split", lambda: stream_of(3), ValueError),
    Row("training", "TokenStream.blocks", "unknown split", lambda: stream_of(100).blocks("test", 2, 4, torch.Generator()), ValueError),
    Row("training", "TokenStream.blocks", "blocks longer than the split", lambda: stream_of(100).blocks("val", 2, 20, torch.Generator()), ValueError),
    Row("training", "CausalLMObjective", "block_size = 0", lambda: TR.CausalLMObjective(stream_of(100), block_size=0), ValueError),
    Row("training", "ArrayImageDataset", "fewer labels than images", lambda: DATA.ArrayImageDataset(t(10, 1, 8, 8), torch.zeros(9)), ValueError),
    Row("training", "ArrayImageDataset", "test_fraction = 0", lambda: DATA.ArrayImageDataset(t(10, 1, 8, 8), torch.zeros(10), test_fraction=0.0), ValueError),
    Row("training", "noam", "d_model = 0", lambda: TR.noam(1, d_model=0), ValueError),
    Row("training", "noam", "a negative step", lambda: TR.noam(-1, d_model=8), ValueError),
    Row("training", "warmup_cosine", "warmup >= total_steps", lambda: TR.warmup_cosine(1, warmup=10, total_steps=10), ValueError),
    Row("training", "make_schedule", "unknown name", lambda: TR.make_schedule("linear"), ValueError),
    Row("training", "parameter_groups", "negative weight_decay", lambda: TR.parameter_groups(nn.Linear(2, 2), weight_decay=-0.1), ValueError),
    Row("training", "label_smoothed_cross_entropy", "epsilon = 1.5", lambda: TR.label_smoothed_cross_entropy(t(2, 5), ids(2), epsilon=1.5), ValueError),
    Row("training", "label_smoothed_cross_entropy", "targets of the wrong shape", lambda: TR.label_smoothed_cross_entropy(t(2, 5), ids(3)), ValueError),
    Row("training", "label_smoothed_cross_entropy", "unknown reduction", lambda: TR.label_smoothed_cross_entropy(t(2, 5), ids(2), reduction="max"), ValueError),  # type: ignore[arg-type]
    Row("training", "CharTokenizer", "repeated characters", lambda: TK.CharTokenizer(["a", "a"]), ValueError),
    Row("training", "CharTokenizer", "a multi-character token", lambda: TK.CharTokenizer(["ab"]), ValueError),
    Row("training", "CharTokenizer.encode", "a character outside the vocabulary", lambda: TK.CharTokenizer(["a", "b"]).encode("abc"), ValueError),
    Row("training", "tokenizers.load_tokenizer", "a JSON file that is no tokenizer", lambda: load_any_tokenizer("not_a_tokenizer.json"), ValueError),
    Row("training", "ReverseTask", "min_len > max_len", lambda: DATA.ReverseTask(min_len=5, max_len=3), ValueError),
    Row("training", "ReverseTask", "a vocabulary with no content tokens", lambda: DATA.ReverseTask(vocab_size=3), ValueError),
    Row("training", "load_text", "a missing file", lambda: DATA.load_text("no_such.txt", download=False), FileNotFoundError),
    Row("training", "prepare", "unknown recipe", lambda: TR.prepare("gpt-9"), ValueError),
    Row("training", "prepare", "unknown arch", lambda: TR.prepare("shakespeare-char", {"arch": "rnn"}), ValueError),
    Row("training", "load_run", "a directory without run.json", lambda: TR.load_run("runs/no_checkpoint"), FileNotFoundError),
    Row("training", "load_training_state", "a checkpoint without trainer state", lambda: TR.load_training_state("ckpt/a_gpt", build_model(TINY_GPT)), FileNotFoundError),
    Row("training", "estimate_generation", "prompt_len = 0", lambda: mc.estimate_generation(TINY_GPT, batch=1, prompt_len=0, max_new_tokens=1), ValueError),
    Row("training", "check_fits", "an estimate above the available memory", lambda: mc.check_fits(mc.estimate_training(TINY_GPT, batch=2), available=(1024, "MemAvailable")), mc.MemoryLimitError),
    # -- generation
    Row("generation", "generate", "a model that does not generate", lambda: G.generate(model("bert"), ids(1, 3), max_new_tokens=2), TypeError),
    Row("generation", "generate", "max_new_tokens = 0", lambda: gen(max_new_tokens=0), ValueError),
    Row("generation", "generate", "max_new_tokens = 2.5", lambda: gen(max_new_tokens=2.5), TypeError),
    Row("generation", "generate", "sampling options without do_sample", lambda: gen(top_k=5, temperature=0.7), ValueError),
    Row("generation", "generate", "num_return_sequences > 1 when greedy", lambda: gen(num_return_sequences=2), ValueError),
    Row("generation", "generate", "num_return_sequences = 0", lambda: gen(do_sample=True, num_return_sequences=0), ValueError),
    Row("generation", "generate", "a negative temperature", lambda: gen(do_sample=True, temperature=-1.0), ValueError),
    Row("generation", "generate", "top_k = 0", lambda: gen(do_sample=True, top_k=0), ValueError),
    Row("generation", "generate", "top_p = 1.5", lambda: gen(do_sample=True, top_p=1.5), ValueError),
    Row("generation", "generate", "min_p = 2", lambda: gen(do_sample=True, min_p=2.0), ValueError),
    Row("generation", "generate", "num_beams = 0", lambda: gen(num_beams=0), ValueError),
    Row("generation", "generate", "beam search with do_sample", lambda: gen(num_beams=2, do_sample=True), ValueError),
    Row("generation", "generate", "an id >= vocab_size", lambda: gen(input_ids=ids(1, 3, value=50)), ValueError),
    Row("generation", "generate", "a negative id", lambda: gen(input_ids=[[1, -2]]), ValueError),
    Row("generation", "generate", "an empty prompt", lambda: gen(input_ids=[[1, 2], []]), ValueError),
    Row("generation", "generate", "no prompts", lambda: gen(input_ids=[]), ValueError),
    Row("generation", "generate", "3-D ids", lambda: gen(input_ids=ids(1, 2, 3)), ValueError),
    Row("generation", "generate", "float ids", lambda: gen(input_ids=t(1, 3)), ValueError),
    Row("generation", "generate", "an attention mask with a list of prompts", lambda: gen(input_ids=[[1, 2]], attention_mask=torch.ones(1, 2, dtype=torch.bool)), ValueError),
    Row("generation", "generate", "an attention mask of another shape", lambda: gen(attention_mask=torch.ones(1, 4, dtype=torch.bool)), ValueError),
    Row("generation", "generate", "prompt + new tokens beyond max_seq_len (context='error')", lambda: gen(input_ids=ids(1, 6), max_new_tokens=5, context="error"), ContextLengthError),
    Row("generation", "generate", "a prompt that fills the context (context='truncate')", lambda: gen(input_ids=ids(1, 8), context="truncate"), ContextLengthError),
    Row("generation", "generate", "an unknown context policy", lambda: gen(context="wrap"), ValueError),
    Row("generation", "generate", "an unknown option", lambda: gen(num_beam=2), ValueError),
    Row("generation", "generate", "eos_id as a string", lambda: gen(eos_id="19"), TypeError),
    Row("generation", "generate", "a fractional pad_id", lambda: gen(pad_id=1.5), TypeError),
    Row("generation", "generate", "num_return_sequences as a float", lambda: gen(do_sample=True, num_return_sequences=2.0), TypeError),
    Row("generation", "generate", "a NaN length_penalty", lambda: gen(num_beams=2, length_penalty=float("nan")), ValueError),
    Row("generation", "generate", "an infinite temperature", lambda: gen(do_sample=True, temperature=float("inf")), ValueError),
    Row("generation", "generate", "an eos id outside the vocabulary", lambda: gen(eos_id=99), ValueError),
    Row("generation", "generate", "a pad id outside the vocabulary", lambda: gen(pad_id=-1), ValueError),
    Row("generation", "generate (encoder-decoder)", "new tokens beyond max_seq_len (context='error')", lambda: G.generate(model("transformer"), ids(1, 3), max_new_tokens=TINY_TR.max_seq_len + 1, context="error"), ContextLengthError),
    Row("generation", "beam_search", "num_return_sequences > num_beams", lambda: G.beam_search(model("gpt"), ids(1, 3), max_new_tokens=2, num_beams=2, num_return_sequences=3), ValueError),
    Row("generation", "beam_search", "unknown length_norm", lambda: G.beam_search(model("gpt"), ids(1, 3), max_new_tokens=2, length_norm="linear"), ValueError),
    Row("generation", "generate (encoder-decoder)", "max_new_tokens = 0", lambda: G.generate(model("transformer"), ids(1, 3), max_new_tokens=0), ValueError),
    Row("generation", "Temperature", "temperature = 0", lambda: G.Temperature(0.0), ValueError),
    Row("generation", "TopK", "k = 0", lambda: G.TopK(0), ValueError),
    Row("generation", "TopP", "p = 0", lambda: G.TopP(0.0), ValueError),
    Row("generation", "MinP", "p = 1.5", lambda: G.MinP(1.5), ValueError),
    Row("generation", "TopK.__call__", "3-D logits", lambda: G.TopK(2)(t(1, 2, 5)), ValueError),
    # -- the command line (status 2 and one "error:" line; paths relative to the scratch directory)
    Row("cli", "attnlab", "no command", lambda: cli(), CLIExitError),
    Row("cli", "attnlab train", "no task", lambda: cli("train"), CLIExitError),
    Row("cli", "attnlab train shakespeare-char", "unknown key", lambda: cli(*SHAKESPEARE, "--stepz=10"), CLIExitError),
    Row("cli", "attnlab train shakespeare-char", "a value of the wrong type", lambda: cli(*SHAKESPEARE, "--steps=ten"), CLIExitError),
    Row("cli", "attnlab train shakespeare-char", "a key without a value", lambda: cli(*SHAKESPEARE, "--steps"), CLIExitError),
    Row("cli", "attnlab train shakespeare-char", "a token that is not --key=value", lambda: cli(*SHAKESPEARE, "steps=10"), CLIExitError),
    Row("cli", "attnlab train shakespeare-char", "a bad boolean", lambda: cli(*SHAKESPEARE, "--progress=maybe"), CLIExitError),
    Row("cli", "attnlab train shakespeare-char", "an invalid value (steps = 0)", lambda: cli(*SHAKESPEARE, "--steps=0"), CLIExitError),
    Row("cli", "attnlab train shakespeare-char", "an invalid model size", lambda: cli(*SHAKESPEARE, "--n_heads=3"), CLIExitError),
    Row("cli", "attnlab train shakespeare-char", "a missing data file", lambda: cli("train", "shakespeare-char", "--data=no_such.txt"), CLIExitError),
    Row("cli", "attnlab train shakespeare-char", "--resume with other settings", lambda: cli(*SHAKESPEARE, "--name", "old", "--resume", "--lr=0.01"), CLIExitError),
    Row("cli", "attnlab train shakespeare-char", "a model that cannot fit in RAM (16 GiB available)", lambda: cli(*SHAKESPEARE, *HUGE, available=16 * 2**30), CLIExitError),
    Row("cli", "attnlab train reverse", "steps = 0", lambda: cli("train", "reverse", "--steps", "0"), CLIExitError),
    Row("cli", "attnlab train reverse", "an unknown flag", lambda: cli("train", "reverse", "--stepz", "10"), CLIExitError),
    Row("cli", "attnlab train reverse", "heads that do not divide d_model", lambda: cli("train", "reverse", "--heads", "3"), CLIExitError),
    Row("cli", "attnlab generate", "no prompt", lambda: cli("generate", "ckpt/a_gpt"), CLIExitError),
    Row("cli", "attnlab generate", "a missing checkpoint", lambda: cli("generate", "ckpt/nowhere", "--ids", "1"), CLIExitError),
    Row("cli", "attnlab generate", "ids that are not integers", lambda: cli("generate", "ckpt/a_gpt", "--ids", "1,x"), CLIExitError),
    Row("cli", "attnlab generate", "--prompt without a tokenizer", lambda: cli("generate", "ckpt/a_gpt", "--prompt", "hi"), CLIExitError),
    Row("cli", "attnlab generate", "--prompt and --ids together", lambda: cli("generate", "ckpt/a_gpt", "--prompt", "hi", "--ids", "1"), CLIExitError),
    Row("cli", "attnlab generate", "--seed without sampling", lambda: cli("generate", "ckpt/a_gpt", "--ids", "1", "--seed", "1"), CLIExitError),
    Row("cli", "attnlab generate", "beam search with sampling options", lambda: cli("generate", "ckpt/a_gpt", "--ids", "1", "--num-beams", "2", "--top-k", "5"), CLIExitError),
    Row("cli", "attnlab generate", "--top-p 1.5", lambda: cli("generate", "ckpt/a_gpt", "--ids", "1", "--top-p", "1.5"), CLIExitError),
    Row("cli", "attnlab generate", "an id outside the vocabulary", lambda: cli("generate", "ckpt/a_gpt", "--ids", "50"), CLIExitError),
    Row("cli", "attnlab generate", "more tokens than the context (--context error)", lambda: cli("generate", "ckpt/a_gpt", "--ids", "1,2", "--max-new-tokens", "10", "--context", "error"), CLIExitError),
    Row("cli", "attnlab generate", "an unknown --length-norm", lambda: cli("generate", "ckpt/a_gpt", "--ids", "1", "--length-norm", "linear"), CLIExitError),
    Row("cli", "attnlab generate", "a run that cannot fit in RAM (1 KiB available)", lambda: cli("generate", "ckpt/a_gpt", "--ids", "1", available=1024), CLIExitError),
    Row("cli", "attnlab sample", "a missing run", lambda: cli("sample", "runs/nowhere"), CLIExitError),
    Row("cli", "attnlab sample", "a run without a checkpoint", lambda: cli("sample", "runs/old"), CLIExitError),
    Row("cli", "attnlab evaluate", "a run without a checkpoint", lambda: cli("evaluate", "runs/old"), CLIExitError),
    Row("cli", "attnlab evaluate", "--batches that is not a number", lambda: cli("evaluate", "runs/old", "--batches", "two"), CLIExitError),
    Row("cli", "attnlab analyze", "unknown preset", lambda: cli("analyze", "gpt-9"), CLIExitError),
    Row("cli", "attnlab analyze", "seq-len 0", lambda: cli("analyze", "gpt2-small", "--seq-len", "0"), CLIExitError),
    Row("cli", "attnlab viz masks", "unknown mask kind", lambda: cli("viz", "masks", "--kinds", "diagonal"), CLIExitError),
    Row("cli", "attnlab embed", "no --text", lambda: cli("embed", "ckpt/a_bert"), CLIExitError),
    # round 2 (issue 19)
    Row("checkpoints", "from_pretrained", "a parameter holding NaN", lambda: attnlab.from_pretrained("ckpt/nan_gpt"), NonFiniteWeightsError),
    Row("checkpoints", "from_pretrained", "a Hugging Face config claiming a million layers", lambda: attnlab.from_pretrained("ckpt/hf_bomb"), CheckpointMismatchError),
    Row("generation", "generate", "a model whose logits are NaN", lambda: G.generate(attnlab.from_pretrained("ckpt/nan_gpt", allow_non_finite=True), ids(1, 3), max_new_tokens=2), NonFiniteLogitsError),
    Row("generation", "beam_search", "a model whose logits are NaN", lambda: G.beam_search(attnlab.from_pretrained("ckpt/nan_gpt", allow_non_finite=True), ids(1, 3), max_new_tokens=2, num_beams=2), NonFiniteLogitsError),
    Row("generation", "generate", "a list prompt of floats", lambda: gen(input_ids=[[1.5, 2.0]]), ValueError),
    Row("generation", "generate", "a list prompt of bools", lambda: gen(input_ids=[[True, False]]), ValueError),
    Row("generation", "generate", "attention_mask value 0.5", lambda: gen(attention_mask=torch.tensor([[0.5, 1.0, 1.0]])), ValueError),
    Row("generation", "generate", "attention_mask value 2", lambda: gen(attention_mask=torch.tensor([[2, 1, 1]])), ValueError),
    Row("generation", "generate", "input_ids on the meta device", lambda: gen(input_ids=ids(1, 3).to("meta")), ValueError),
    Row("layers", "scaled_dot_product_attention", "q on meta, k and v on the CPU", lambda: sdpa(q=t(2, 4, 3, 8).to("meta")), ValueError),
    Row("models", "GPT.forward", "ids on the meta device, weights on the CPU", lambda: model("gpt")(ids(1, 3).to("meta")), ValueError),
    Row("models", "GPT.forward", "float targets", lambda: model("gpt")(ids(1, 3), targets=t(1, 3)), ValueError),
    Row("models", "GPT.forward", "a target outside the vocabulary", lambda: model("gpt")(ids(1, 3), targets=ids(1, 3, value=50)), ValueError),
    Row("cli", "attnlab viz positional", "--out where no file can be written (/proc)", lambda: cli("viz", "positional", "--kind", "sinusoidal", "--out", "/proc/x.png"), CLIExitError),
    Row("cli", "attnlab analyze", "--plot where no file can be written (/proc)", lambda: cli("analyze", "gpt2-small", "--sweep-seq-len", "--plot", "/proc/x.png"), CLIExitError),
    Row("cli", "attnlab generate", "a checkpoint holding NaN", lambda: cli("generate", "ckpt/nan_gpt", "--ids", "1"), CLIExitError),
    Row("cli", "attnlab train shakespeare-char", "--resume of a run whose checkpoints are gone", lambda: cli("train", "shakespeare-char", "--data=corpus.txt", "--out", "runs/lost", "--resume"), CLIExitError),
    Row("models", "MambaLM.forward", "float targets", lambda: model("mamba")(ids(1, 3), targets=t(1, 3)), ValueError),
    Row("models", "RNNLM.forward", "a target outside the vocabulary", lambda: model("rnn")(ids(1, 3), targets=ids(1, 3, value=50)), ValueError),
    Row("checkpoints", "from_pretrained", "config.json nested 100,000 levels deep", lambda: attnlab.from_pretrained("ckpt/deep_config"), ValueError),
    Row("checkpoints", "from_pretrained", "config.json with a 5,000-digit integer", lambda: attnlab.from_pretrained("ckpt/huge_int_config"), ValueError),
    Row("checkpoints", "from_pretrained", "config.json that is not UTF-8", lambda: attnlab.from_pretrained("ckpt/latin1_config"), ValueError),
    Row("checkpoints", "from_pretrained", "a truncated pytorch_model.bin", lambda: attnlab.from_pretrained("ckpt/hf_bin_truncated"), ValueError),
    Row("checkpoints", "interop.load_tokenizer", "a tokenizer.json the tokenizers library refuses", lambda: load_tokenizer("ckpt/bad_library_tokenizer"), ValueError),
    Row("training", "translation.load_pairs", "a truncated .gz data file", lambda: load_pairs("m30k_truncated", "train", "de", "en"), ValueError),
    Row("cli", "attnlab analyze", "a config file nested 100,000 levels deep", lambda: cli("analyze", "ckpt/deep_config/config.json"), CLIExitError),
    Row("cli", "attnlab train translate", "a truncated .gz data file", lambda: cli("train", "translate", "--data", "m30k_truncated", "--max-steps", "1", "--out", "runs/m30k"), CLIExitError),
    Row("explore", "Explorer", "a model family it does not show (CCT)", lambda: explorer("cct"), TypeError),
    Row("explore", "Explorer", "a ViT with more tokens per image than max_tokens", lambda: explorer("big-vit"), ValueError),
    Row("explore", "Limits", "max_tokens = 0", lambda: EX.Limits(max_tokens=0), ValueError),
    Row("explore", "Explorer.encode", "more tokens than max_tokens", lambda: explorer("gpt").encode(ids=[1] * 9), ValueError),
    Row("explore", "Explorer.encode", "an id outside the vocabulary", lambda: explorer("gpt").encode(ids=[1, 99]), ValueError),
    Row("explore", "Explorer.encode", "ids that are not a list", lambda: explorer("gpt").encode(ids="123"), TypeError),
    Row("explore", "Explorer.neuron", "a head out of range", lambda: explorer("gpt").neuron([1, 2], 0, 9, 0, 0), ValueError),
    Row("explore", "Explorer.read_image", "an image of another size", lambda: explorer("vit").read_image(image={"shape": [9, 8, 1], "data": ""}), ValueError),
    Row("explore", "Explorer.read_image", "image data that is not base64", lambda: explorer("vit").read_image(image={"shape": [8, 8, 1], "data": "!!!!"}), ValueError),
    Row("explore", "Explorer.read_image", "a sample index out of range", lambda: explorer("vit").read_image(sample=10**6), ValueError),
    Row("explore", "Explorer.read_image", "an image for a GPT", lambda: explorer("gpt").read_image(sample=0), ValueError),
    Row("explore", "lm.Sampling.from_request", "temperature -1", lambda: EXLM.Sampling.from_request({"temperature": -1}), ValueError),
    Row("explore", "lm.Sampling.from_request", "top_p 0", lambda: EXLM.Sampling.from_request({"top_p": 0}), ValueError),
    Row("explore", "panels.positional_view", "an unknown kind", lambda: EXP.positional_view("spiral"), ValueError),
    Row("cli", "attnlab explore", "a port out of range", lambda: cli("explore", "gpt-char-baby", "--port", "70000"), CLIExitError),
    Row("cli", "attnlab explore", "--html without --text", lambda: cli("explore", "gpt-char-baby", "--html", "x.html"), CLIExitError),
    Row("cli", "attnlab explore", "text for a ViT", lambda: cli("explore", "vit-digits", "--text", "hi", "--html", "x.html"), CLIExitError),
]
# fmt: on

# ---------------------------------------------------------------------------- running rows


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory with the bad checkpoints, as the working directory of the rows."""
    root = tmp_path_factory.mktemp("sweep")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        torch.manual_seed(0)
        lay_out_checkpoints(root)
        yield root


def run(row: Row) -> BaseException:
    """The exception ``row.call()`` raises (fails the test if it raises none)."""
    try:
        row.call()
    except Exception as e:  # the point is to capture whatever is raised
        return e
    pytest.fail(f"{row.key}: nothing was raised")


def cell(text: str) -> str:
    """A Markdown table cell: one line, pipes escaped."""
    return text.replace("|", "\\|").replace("\n", "⏎ ")


def raised(e: BaseException) -> str:
    """The "Raises" cell: the exception class, or ``exit N`` for a command line."""
    return f"exit {e.code}" if isinstance(e, CLIExitError) else type(e).__name__


def render(rows: list[Row], errors: list[BaseException]) -> str:
    lines = [
        "| # | Area | Entry point | Rejects | Raises | Message |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for i, (row, e) in enumerate(zip(rows, errors, strict=True), 1):
        lines.append(
            f"| {i} | {row.area} | `{row.entry}` | {cell(row.rejects)} | "
            f"`{raised(e)}` | {cell(str(e))} |"
        )
    return "\n".join(lines)


def documented() -> dict[str, tuple[str, str]]:
    """``entry: rejects`` -> (exception name, message) from the doc's table."""
    text = DOC.read_text(encoding="utf-8")
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    out: dict[str, tuple[str, str]] = {}
    for line in block.strip().splitlines()[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        _, _, entry, rejects, error, message = cells
        out[f"{entry.strip('`')}: {rejects}"] = (error.strip("`"), message)
    return out


def test_rows_are_unique_and_every_area_is_covered() -> None:
    keys = [r.key for r in ROWS]
    assert len(keys) == len(set(keys)), [k for k in keys if keys.count(k) > 1]
    areas = {"layers", "models", "checkpoints", "analysis", "viz", "training", "generation", "cli",
             "explore"}  # fmt: skip
    assert {r.area for r in ROWS} == areas


@pytest.mark.parametrize("row", ROWS, ids=[r.key for r in ROWS])
def test_rejects(row: Row, scratch: Path) -> None:
    """The row's call raises the documented class with the documented message."""
    e = run(row)
    assert type(e) is row.error, f"{row.key}: {type(e).__name__}: {e}"
    assert not isinstance(e, AssertionError)
    if isinstance(e, CLIExitError):  # usage errors exit 2, with the error on one line
        assert e.code == 2 and "error:" in str(e), f"{row.key}: exit {e.code}: {e}"
    doc = documented()
    assert row.key in doc, f"{row.key} is not in docs/validation.md: regenerate the table"
    assert (raised(e), cell(str(e))) == doc[row.key], "regenerate docs/validation.md"


def test_doc_table_is_current(scratch: Path) -> None:
    """docs/validation.md holds exactly the table :data:`ROWS` renders (set
    ``ATTNLAB_UPDATE_DOCS=1`` to rewrite it)."""
    table = render(ROWS, [run(r) for r in ROWS])
    text = DOC.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    current = rest.split(END, 1)[0].strip()
    if os.environ.get("ATTNLAB_UPDATE_DOCS") == "1":
        DOC.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}", encoding="utf-8")
        current = table
    assert current == table, "docs/validation.md is stale: ATTNLAB_UPDATE_DOCS=1 pytest " + __file__
    count = f"{len(ROWS)} rejected inputs"
    assert count in text, f"docs/validation.md should say '{count}'"
