"""Hugging Face GPT-2 (``GPT2Model``, ``GPT2LMHeadModel``) <-> :class:`attnlab.models.GPT`.

GPT-2 stores its projections as ``Conv1D`` modules, whose weights are ``(in, out)``: the
transpose of ``nn.Linear``'s ``(out, in)``. Its attention input projection ``attn.c_attn`` is one
fused ``(E, 3E)`` weight, q, k and v side by side along the output dimension; attnlab keeps three
separate linears. ``ln_1``/``ln_2``/``ln_f`` are the pre-norms and the final norm.

Not supported (an error says so): ``scale_attn_weights=False``,
``scale_attn_by_inverse_layer_idx``, cross-attention.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import torch
from torch import Tensor

from attnlab.interop.family import HFConfig, HFFamily, hf_activation, require
from attnlab.interop.keymap import Entry, KeyMap, params, per_layer, same, transposed
from attnlab.models.gpt import GPT, GPTConfig

NAME = "GPT-2"


def _split_qkv(ts: Sequence[Tensor]) -> list[Tensor]:
    """Conv1D ``(E, 3E)`` weight -> three ``(E, E)`` linear weights; ``(3E,)`` bias -> three."""
    w = ts[0]
    if w.dim() == 2:
        return [part.t() for part in w.chunk(3, dim=1)]  # (E, E) each, as (out, in)
    return list(w.chunk(3, dim=0))


def _join_qkv(ts: Sequence[Tensor]) -> list[Tensor]:
    if ts[0].dim() == 2:
        return [torch.cat([t.t() for t in ts], dim=1)]  # (E, 3E)
    return [torch.cat(list(ts), dim=0)]  # (3E,)


def _qkv(what: str) -> Entry:
    ours = tuple(f"layers.{{i}}.self_attn.{p}_proj.{what}" for p in "qkv")
    return Entry(ours, (f"h.{{i}}.attn.c_attn.{what}",), _split_qkv, _join_qkv)


_LAYER = [
    _qkv("weight"),
    _qkv("bias"),
    transposed("layers.{i}.self_attn.out_proj.weight", "h.{i}.attn.c_proj.weight"),
    same("layers.{i}.self_attn.out_proj.bias", "h.{i}.attn.c_proj.bias"),
    transposed("layers.{i}.ffn.up_proj.weight", "h.{i}.mlp.c_fc.weight"),
    same("layers.{i}.ffn.up_proj.bias", "h.{i}.mlp.c_fc.bias"),
    transposed("layers.{i}.ffn.down_proj.weight", "h.{i}.mlp.c_proj.weight"),
    same("layers.{i}.ffn.down_proj.bias", "h.{i}.mlp.c_proj.bias"),
    *params("layers.{i}.self_attn_norm", "h.{i}.ln_1"),
    *params("layers.{i}.ffn_norm", "h.{i}.ln_2"),
]


def keymap(c: GPTConfig) -> KeyMap:
    """The GPT-2 key map for ``c`` (keys without the ``transformer.`` prefix)."""
    entries = [
        same("tok_embed.weight", "wte.weight"),
        same("pos_encoding.weight", "wpe.weight"),
        *per_layer(c.n_layers, _LAYER),
        *params("final_norm", "ln_f"),
    ]
    duplicates = {}
    if c.tie_output:
        duplicates["lm_head.weight"] = "wte.weight"
    else:
        entries.append(same("lm_head.weight", "lm_head.weight"))
    # Old checkpoints saved the causal-mask buffers.
    return KeyMap(entries, ignore=(r"h\.\d+\.attn\.(masked_)?bias",), duplicates=duplicates)


def config_from_hf(h: HFConfig, keys: Collection[str]) -> GPTConfig:
    """An attnlab :class:`GPTConfig` for a Hugging Face GPT-2 config."""
    h.expect("scale_attn_weights", {True, None})
    h.expect("scale_attn_by_inverse_layer_idx", {False, None})
    h.expect("add_cross_attention", {False, None})
    d_model = h.get("n_embd", "hidden_size")
    vocab = h.get("vocab_size")
    return GPTConfig(
        vocab_size=vocab,
        d_model=d_model,
        n_heads=h.get("n_head", "num_attention_heads"),
        n_layers=h.get("n_layer", "num_hidden_layers"),
        d_ff=h.get("n_inner", default=4 * d_model),
        dropout=h.get("resid_pdrop", default=0.1),
        attn_dropout=h.get("attn_pdrop", default=0.1),
        max_seq_len=h.get("n_positions", "max_position_embeddings"),
        norm_eps=h.get("layer_norm_epsilon", default=1e-5),
        activation=h.activation("activation_function", default="gelu_new"),
        tie_output=h.get("tie_word_embeddings", default=True),
        init_std=h.get("initializer_range", default=0.02),
        pad_id=h.token_id("pad_token_id", vocab),
        bos_id=h.token_id("bos_token_id", vocab),
        eos_id=h.token_id("eos_token_id", vocab),
    )


def config_to_hf(c: GPTConfig) -> dict[str, Any]:
    """The ``config.json`` of the Hugging Face GPT-2 that ``c`` is.

    Raises:
        UnsupportedCheckpointError: for options GPT-2 does not have.
    """
    require(c.pos_encoding == "learned", NAME, f"pos_encoding {c.pos_encoding!r} (learned only)")
    require(c.norm == "layernorm" and c.norm_position == "pre", NAME, "pre-norm LayerNorm only")
    require(c.use_final_norm and not c.embed_norm, NAME, "a final norm and no embedding norm")
    require(c.n_kv_heads in (None, c.n_heads), NAME, "grouped-query attention")
    require(c.bias, NAME, "bias=False")
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": c.vocab_size,
        "n_embd": c.d_model,
        "n_head": c.n_heads,
        "n_layer": c.n_layers,
        "n_inner": c.d_ff,
        "n_positions": c.max_seq_len,
        "activation_function": hf_activation(c.activation, NAME),
        "resid_pdrop": c.dropout,
        "embd_pdrop": c.dropout,
        "attn_pdrop": c.dropout if c.attn_dropout is None else c.attn_dropout,
        "layer_norm_epsilon": c.norm_eps,
        "initializer_range": c.init_std,
        "tie_word_embeddings": c.tie_output,
        "bos_token_id": c.bos_id,
        "eos_token_id": c.eos_id,
        "pad_token_id": c.pad_id,
    }


FAMILY = HFFamily(
    name=NAME,
    model_types=("gpt2",),
    prefix="transformer",
    head_keys=("lm_head.",),
    base_architecture="GPT2Model",
    model_class=GPT,
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    keymap=keymap,
)
