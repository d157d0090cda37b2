"""Hugging Face Llama (``LlamaModel``, ``LlamaForCausalLM``) <-> :class:`attnlab.models.GPT`.

A Llama is attnlab's GPT with RoPE, RMSNorm, a gated FFN (SwiGLU), no biases and (usually) an
untied head; grouped-query attention when ``num_key_value_heads < num_attention_heads``. The
names already match attnlab's closely (``q_proj``..., ``gate_proj``/``up_proj``/``down_proj``).

RoPE: Hugging Face's Llama rotates with ``rotate_half``, pairing dimension ``i`` with ``i + D/2``
(its conversion script permuted Meta's interleaved q/k rows once, at conversion), which is
attnlab's ``"half"`` layout, so q/k weights are copied without permutation. ``rope_theta`` is
``rope_base``; ``rope_scaling``/``rope_parameters`` of type ``linear`` and ``dynamic`` map to
``rope_scaling``/``rope_factor`` (both transformers 4's and 5's spellings are read).

Not supported (an error says so): other RoPE types (llama3, yarn, longrope), a ``head_dim`` other
than ``hidden_size / num_attention_heads``, partial rotary factors, ``attention_bias`` differing
from ``mlp_bias``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from attnlab.interop.family import (
    HFConfig,
    HFFamily,
    UnsupportedCheckpointError,
    require,
)
from attnlab.interop.keymap import Entry, KeyMap, params, per_layer, same
from attnlab.layers.feedforward import GATED
from attnlab.models.gpt import GPT, GPTConfig

NAME = "Llama"
_ROPE_TYPES = {"default": "none", "linear": "linear", "dynamic": "dynamic"}
_GATE_ACT = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu", "relu": "reglu"}


def keymap(c: GPTConfig) -> KeyMap:
    """The Llama key map for ``c`` (keys without the ``model.`` prefix)."""
    b = c.bias
    layer = [
        *params("layers.{i}.self_attn.q_proj", "layers.{i}.self_attn.q_proj", bias=b),
        *params("layers.{i}.self_attn.k_proj", "layers.{i}.self_attn.k_proj", bias=b),
        *params("layers.{i}.self_attn.v_proj", "layers.{i}.self_attn.v_proj", bias=b),
        *params("layers.{i}.self_attn.out_proj", "layers.{i}.self_attn.o_proj", bias=b),
        *params("layers.{i}.ffn.gate_proj", "layers.{i}.mlp.gate_proj", bias=b),
        *params("layers.{i}.ffn.up_proj", "layers.{i}.mlp.up_proj", bias=b),
        *params("layers.{i}.ffn.down_proj", "layers.{i}.mlp.down_proj", bias=b),
        same("layers.{i}.self_attn_norm.weight", "layers.{i}.input_layernorm.weight"),
        same("layers.{i}.ffn_norm.weight", "layers.{i}.post_attention_layernorm.weight"),
    ]
    return ends(c, per_layer(c.n_layers, layer))


def ends(c: GPTConfig, body: list[Entry]) -> KeyMap:
    """Embedding + ``body`` + final norm (+ untied head), and the keys transformers may add
    (Llama and the families built on it: Mixtral, Qwen2-MoE)."""
    entries = [
        same("tok_embed.weight", "embed_tokens.weight"),
        *body,
        same("final_norm.weight", "norm.weight"),
    ]
    duplicates = {}
    if c.tie_output:
        duplicates["lm_head.weight"] = "embed_tokens.weight"
    else:
        entries.append(same("lm_head.weight", "lm_head.weight"))
    # transformers 4 saved the RoPE frequencies of some models as buffers.
    ignore = (r"(layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq",)
    return KeyMap(entries, ignore=ignore, duplicates=duplicates)


def _rope(h: HFConfig) -> tuple[float, str, float]:
    """``(rope_base, rope_scaling, rope_factor)`` from transformers 5's ``rope_parameters`` or
    transformers 4's ``rope_theta`` + ``rope_scaling``."""
    new = h.data.get("rope_parameters") or {}
    old = h.data.get("rope_scaling") or {}
    rope_type = new.get("rope_type") or old.get("rope_type") or old.get("type") or "default"
    if rope_type not in _ROPE_TYPES:
        raise UnsupportedCheckpointError(
            f"{NAME} RoPE type {rope_type!r} is not supported by attnlab "
            f"(supported: {sorted(_ROPE_TYPES)})"
        )
    partial = new.get("partial_rotary_factor", h.data.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise UnsupportedCheckpointError(f"{NAME} partial_rotary_factor={partial} (only 1.0)")
    base = new.get("rope_theta", h.data.get("rope_theta", 10000.0))
    factor = 1.0 if rope_type == "default" else float(new.get("factor", old.get("factor", 1.0)))
    return float(base), _ROPE_TYPES[rope_type], factor


def config_from_hf(h: HFConfig, keys: Collection[str]) -> GPTConfig:
    """An attnlab :class:`GPTConfig` for a Hugging Face Llama config."""
    d_model, n_heads = h.get("hidden_size"), h.get("num_attention_heads")
    head_dim = h.get("head_dim", default=d_model // n_heads)
    if head_dim * n_heads != d_model:
        raise UnsupportedCheckpointError(
            f"{NAME} head_dim={head_dim} != hidden_size / num_attention_heads "
            f"= {d_model} / {n_heads}; attnlab derives the head dim"
        )
    attention_bias = h.get("attention_bias", default=False)
    if attention_bias != h.get("mlp_bias", default=False):
        raise UnsupportedCheckpointError(
            f"{NAME} attention_bias={attention_bias} with mlp_bias={h.get('mlp_bias')}: "
            "attnlab has one bias switch"
        )
    act = h.get("hidden_act", default="silu")
    if act not in _GATE_ACT:
        raise UnsupportedCheckpointError(
            f"{NAME} hidden_act {act!r} is not supported (supported: {sorted(_GATE_ACT)})"
        )
    base, scaling, factor = _rope(h)
    vocab = h.get("vocab_size")
    return GPTConfig(
        vocab_size=vocab,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=h.get("num_key_value_heads", default=None),
        n_layers=h.get("num_hidden_layers"),
        d_ff=h.get("intermediate_size"),
        dropout=0.0,
        attn_dropout=h.get("attention_dropout", default=0.0),
        max_seq_len=h.get("max_position_embeddings", default=2048),
        norm="rmsnorm",
        norm_eps=h.get("rms_norm_eps", default=1e-6),
        activation=_GATE_ACT[act],
        pos_encoding="rope",
        rope_base=base,
        rope_scaling=scaling,  # type: ignore[arg-type]
        rope_factor=factor,
        bias=attention_bias,
        tie_output=h.get("tie_word_embeddings", default=False),
        init_std=h.get("initializer_range", default=0.02),
        pad_id=h.token_id("pad_token_id", vocab),
        bos_id=h.token_id("bos_token_id", vocab),
        eos_id=h.token_id("eos_token_id", vocab),
    )


def config_to_hf(c: GPTConfig) -> dict[str, Any]:
    """The ``config.json`` of the Hugging Face Llama that ``c`` is.

    Raises:
        UnsupportedCheckpointError: for options Llama does not have.
    """
    require(c.pos_encoding == "rope", NAME, f"pos_encoding {c.pos_encoding!r} (rope only)")
    require(c.rope_scaling != "ntk", NAME, "rope_scaling 'ntk' (none, linear or dynamic)")
    require(c.norm == "rmsnorm" and c.norm_position == "pre", NAME, "pre-norm RMSNorm only")
    require(c.use_final_norm and not c.embed_norm, NAME, "a final norm and no embedding norm")
    require(c.activation in GATED, NAME, f"activation {c.activation!r} (a gated FFN only)")
    act = {"silu": "silu", "gelu": "gelu", "relu": "relu"}[GATED[c.activation]]
    rope_type = {"none": "default", "linear": "linear", "dynamic": "dynamic"}[c.rope_scaling]
    rope: dict[str, Any] = {"rope_type": rope_type, "rope_theta": c.rope_base}
    if rope_type != "default":
        rope["factor"] = c.rope_factor
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads or c.n_heads,
        "head_dim": c.d_head,
        "num_hidden_layers": c.n_layers,
        "intermediate_size": c.d_ff,
        "hidden_act": act,
        "max_position_embeddings": c.max_seq_len,
        "rms_norm_eps": c.norm_eps,
        # transformers 5 reads rope_parameters; transformers 4 reads the last two.
        "rope_parameters": rope,
        "rope_theta": c.rope_base,
        "rope_scaling": None if rope_type == "default" else {**rope, "type": rope_type},
        "attention_bias": c.bias,
        "mlp_bias": c.bias,
        "attention_dropout": c.dropout if c.attn_dropout is None else c.attn_dropout,
        "initializer_range": c.init_std,
        "tie_word_embeddings": c.tie_output,
        "bos_token_id": c.bos_id,
        "eos_token_id": c.eos_id,
        "pad_token_id": c.pad_id,
    }


FAMILY = HFFamily(
    name=NAME,
    model_types=("llama",),
    prefix="model",
    head_keys=("lm_head.",),
    base_architecture="LlamaModel",
    model_class=GPT,
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    keymap=keymap,
)
