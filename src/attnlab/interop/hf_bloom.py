"""Hugging Face BLOOM (``BloomModel``, ``BloomForCausalLM``) <-> :class:`attnlab.models.GPT`.

BLOOM is attnlab's GPT with ALiBi (no position embeddings), a LayerNorm on the token embeddings
(``embed_norm``), a 4x GELU (tanh) FFN and a head tied to the embeddings. Its fused
``self_attention.query_key_value`` weight is laid out per head: rows ``(H, 3, D)``, i.e. head h's
q, k and v rows next to each other, not all q rows first as in GPT-2.

ALiBi: BLOOM adds ``m_h · j`` (key position) to the scores; attnlab adds ``-m_h · |i - j|``. Under
the causal mask both differ by ``m_h · i`` per query row, which softmax ignores. The slopes are
the same geometric sequence (Press et al.), for any head count.

Not supported (an error says so): ``apply_residual_connection_post_layernorm``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import torch
from torch import Tensor

from attnlab.interop.family import HFConfig, HFFamily, require
from attnlab.interop.keymap import Entry, KeyMap, params, per_layer, same
from attnlab.models.gpt import GPT, GPTConfig

NAME = "BLOOM"


def _qkv(what: str, n_heads: int) -> Entry:
    """Fused per-head ``(H·3·D, ...)`` q/k/v <-> three ``(H·D, ...)`` projections."""

    def split(ts: Sequence[Tensor]) -> list[Tensor]:
        w = ts[0]
        grouped = w.reshape(n_heads, 3, -1, *w.shape[1:])  # (H, 3, D, ...)
        return [grouped[:, j].reshape(-1, *w.shape[1:]) for j in range(3)]  # (H·D, ...) each

    def join(ts: Sequence[Tensor]) -> list[Tensor]:
        parts = [t.reshape(n_heads, -1, *t.shape[1:]) for t in ts]  # (H, D, ...) each
        return [torch.stack(parts, dim=1).reshape(-1, *ts[0].shape[1:])]  # (H·3·D, ...)

    ours = tuple(f"layers.{{i}}.self_attn.{p}_proj.{what}" for p in "qkv")
    return Entry(ours, (f"h.{{i}}.self_attention.query_key_value.{what}",), split, join)


def keymap(c: GPTConfig) -> KeyMap:
    """The BLOOM key map for ``c`` (keys without the ``transformer.`` prefix)."""
    layer = [
        _qkv("weight", c.n_heads),
        _qkv("bias", c.n_heads),
        *params("layers.{i}.self_attn.out_proj", "h.{i}.self_attention.dense"),
        *params("layers.{i}.ffn.up_proj", "h.{i}.mlp.dense_h_to_4h"),
        *params("layers.{i}.ffn.down_proj", "h.{i}.mlp.dense_4h_to_h"),
        *params("layers.{i}.self_attn_norm", "h.{i}.input_layernorm"),
        *params("layers.{i}.ffn_norm", "h.{i}.post_attention_layernorm"),
    ]
    entries = [
        same("tok_embed.weight", "word_embeddings.weight"),
        *params("embed_norm", "word_embeddings_layernorm"),
        *per_layer(c.n_layers, layer),
        *params("final_norm", "ln_f"),
    ]
    duplicates = {}
    if c.tie_output:
        duplicates["lm_head.weight"] = "word_embeddings.weight"
    else:
        entries.append(same("lm_head.weight", "lm_head.weight"))
    return KeyMap(entries, duplicates=duplicates)


def config_from_hf(h: HFConfig, keys: Collection[str]) -> GPTConfig:
    """An attnlab :class:`GPTConfig` for a Hugging Face BLOOM config."""
    h.expect("apply_residual_connection_post_layernorm", {False, None})
    d_model = h.get("hidden_size", "n_embed")
    vocab = h.get("vocab_size")
    return GPTConfig(
        vocab_size=vocab,
        d_model=d_model,
        n_heads=h.get("n_head", "num_attention_heads"),
        n_layers=h.get("n_layer", "num_hidden_layers"),
        d_ff=4 * d_model,
        dropout=h.get("hidden_dropout", default=0.0),
        attn_dropout=h.get("attention_dropout", default=0.0),
        # ALiBi has no position table; this only sizes the default KV cache.
        max_seq_len=h.get("seq_length", default=2048),
        norm_eps=h.get("layer_norm_epsilon", default=1e-5),
        embed_norm=True,
        activation="gelu_tanh",
        pos_encoding="alibi",
        tie_output=h.get("tie_word_embeddings", default=True),
        init_std=h.get("initializer_range", default=0.02),
        pad_id=h.token_id("pad_token_id", vocab),
        bos_id=h.token_id("bos_token_id", vocab),
        eos_id=h.token_id("eos_token_id", vocab),
    )


def config_to_hf(c: GPTConfig) -> dict[str, Any]:
    """The ``config.json`` of the Hugging Face BLOOM that ``c`` is.

    Raises:
        UnsupportedCheckpointError: for options BLOOM does not have.
    """
    require(c.pos_encoding == "alibi", NAME, f"pos_encoding {c.pos_encoding!r} (alibi only)")
    require(c.embed_norm and c.use_final_norm, NAME, "an embedding norm and a final norm")
    require(c.norm == "layernorm" and c.norm_position == "pre", NAME, "pre-norm LayerNorm only")
    require(c.activation == "gelu_tanh", NAME, f"activation {c.activation!r} (gelu_tanh only)")
    require(c.d_ff == 4 * c.d_model, NAME, f"d_ff={c.d_ff} (4 x d_model only)")
    require(c.n_kv_heads in (None, c.n_heads), NAME, "grouped-query attention")
    require(c.bias, NAME, "bias=False")
    return {
        "architectures": ["BloomForCausalLM"],
        "model_type": "bloom",
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "n_head": c.n_heads,
        "n_layer": c.n_layers,
        "layer_norm_epsilon": c.norm_eps,
        "hidden_dropout": c.dropout,
        "attention_dropout": c.dropout if c.attn_dropout is None else c.attn_dropout,
        "apply_residual_connection_post_layernorm": False,
        "initializer_range": c.init_std,
        "tie_word_embeddings": c.tie_output,
        "bos_token_id": c.bos_id,
        "eos_token_id": c.eos_id,
        "pad_token_id": c.pad_id,
    }


FAMILY = HFFamily(
    name=NAME,
    model_types=("bloom",),
    prefix="transformer",
    head_keys=("lm_head.",),
    base_architecture="BloomModel",
    model_class=GPT,
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    keymap=keymap,
)
