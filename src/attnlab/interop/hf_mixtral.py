"""Hugging Face Mixtral (``MixtralForCausalLM``) <-> :class:`attnlab.models.GPT` with MoE FFNs.

A Mixtral is a Llama (RoPE in the ``rotate_half`` layout, RMSNorm, GQA, no biases) whose every
FFN is a sparse MoE block: a bias-free router ``block_sparse_moe.gate`` (E x D) and E SwiGLU
experts ``w1`` (gate), ``w3`` (up), ``w2`` (down), top-k with a softmax over the k chosen logits
(transformers computes softmax -> top-k -> renormalise, the same weights): attnlab's
``moe_routing="topk_softmax"``. Keys are those of the released checkpoints, which transformers 5
also writes (it fuses the experts into 3-D tensors only in memory).

``router_aux_loss_coef`` is ``aux_loss_weight``. Not supported (an error says so): a
``sliding_window``, other RoPE types than default/linear/dynamic, a ``head_dim`` other than
``hidden_size / num_attention_heads``. ``router_jitter_noise`` (training-time input noise) is
not reproduced. On export: shared experts, a capacity factor, bias balancing or dense layers have
no Mixtral equivalent.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from attnlab.interop.family import HFConfig, HFFamily, UnsupportedCheckpointError, require
from attnlab.interop.hf_llama import _GATE_ACT, _rope, ends
from attnlab.interop.keymap import Entry, KeyMap, per_layer, same
from attnlab.layers.feedforward import GATED
from attnlab.models.common import moe_layer_indices
from attnlab.models.gpt import GPT, GPTConfig

NAME = "Mixtral"
# attnlab expert module -> Mixtral's name for it
EXPERT_NAMES = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def attention_rows(qkv_bias: bool = False) -> list[Entry]:
    """The Llama-style attention and norm rows of layer ``{i}`` (shared with Qwen2-MoE)."""
    rows = []
    for ours, theirs in (("q_proj", "q_proj"), ("k_proj", "k_proj"), ("v_proj", "v_proj")):
        for p in ("weight", "bias") if qkv_bias else ("weight",):
            rows.append(
                same(f"layers.{{i}}.self_attn.{ours}.{p}", f"layers.{{i}}.self_attn.{theirs}.{p}")
            )
    rows += [
        same("layers.{i}.self_attn.out_proj.weight", "layers.{i}.self_attn.o_proj.weight"),
        same("layers.{i}.self_attn_norm.weight", "layers.{i}.input_layernorm.weight"),
        same("layers.{i}.ffn_norm.weight", "layers.{i}.post_attention_layernorm.weight"),
    ]
    return rows


def keymap(c: GPTConfig) -> KeyMap:
    """The Mixtral key map for ``c`` (keys without the ``model.`` prefix)."""
    moe = "layers.{i}.block_sparse_moe"
    layer = [*attention_rows(), same("layers.{i}.ffn.router.weight", f"{moe}.gate.weight")]
    for j in range(c.n_experts):
        for ours, theirs in EXPERT_NAMES.items():
            layer.append(
                same(
                    f"layers.{{i}}.ffn.experts.{j}.{ours}.weight",
                    f"{moe}.experts.{j}.{theirs}.weight",
                )
            )
    return ends(c, per_layer(c.n_layers, layer))


def check_head_dim(h: HFConfig, family: str) -> tuple[int, int]:
    """``(hidden_size, num_attention_heads)``, after checking ``head_dim`` is their ratio."""
    d_model, n_heads = h.get("hidden_size"), h.get("num_attention_heads")
    head_dim = h.get("head_dim", default=d_model // n_heads)
    if head_dim * n_heads != d_model:
        raise UnsupportedCheckpointError(
            f"{family} head_dim={head_dim} != hidden_size / num_attention_heads "
            f"= {d_model} / {n_heads}; attnlab derives the head dim"
        )
    return d_model, n_heads


def gated_activation(h: HFConfig, family: str) -> str:
    """attnlab's gated FFN for ``hidden_act`` (silu -> swiglu)."""
    act = h.get("hidden_act", default="silu")
    if act not in _GATE_ACT:
        raise UnsupportedCheckpointError(
            f"{family} hidden_act {act!r} is not supported (supported: {sorted(_GATE_ACT)})"
        )
    return _GATE_ACT[act]


def common_fields(h: HFConfig, family: str, eps: float) -> dict[str, Any]:
    """The GPTConfig fields every Llama-like MoE family shares."""
    d_model, n_heads = check_head_dim(h, family)
    base, scaling, factor = _rope(h)
    vocab = h.get("vocab_size")
    return dict(
        vocab_size=vocab,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=h.get("num_key_value_heads", default=None),
        n_layers=h.get("num_hidden_layers"),
        dropout=0.0,
        attn_dropout=h.get("attention_dropout", default=0.0),
        max_seq_len=h.get("max_position_embeddings", default=4096),
        norm="rmsnorm",
        norm_eps=h.get("rms_norm_eps", default=eps),
        activation=gated_activation(h, family),
        pos_encoding="rope",
        rope_base=base,
        rope_scaling=scaling,
        rope_factor=factor,
        bias=False,
        tie_output=h.get("tie_word_embeddings", default=False),
        init_std=h.get("initializer_range", default=0.02),
        pad_id=h.token_id("pad_token_id", vocab),
        bos_id=h.token_id("bos_token_id", vocab),
        eos_id=h.token_id("eos_token_id", vocab),
        aux_loss_weight=h.get("router_aux_loss_coef", default=0.001),
    )


def config_from_hf(h: HFConfig, keys: Collection[str]) -> GPTConfig:
    """An attnlab :class:`GPTConfig` for a Hugging Face Mixtral config."""
    if h.data.get("sliding_window") is not None:
        raise UnsupportedCheckpointError(
            f"{NAME} sliding_window={h.data['sliding_window']} (only null)"
        )
    return GPTConfig(
        **common_fields(h, NAME, 1e-5),
        d_ff=h.get("intermediate_size"),
        n_experts=h.get("num_local_experts"),
        top_k=h.get("num_experts_per_tok", default=2),
        moe_routing="topk_softmax",
    )


def common_to_hf(c: GPTConfig, family: str) -> dict[str, Any]:
    """The ``config.json`` fields of a Llama-like MoE family; raises for what none of them has."""
    require(c.n_experts > 0, family, "a dense model (n_experts=0); use Llama")
    require(c.pos_encoding == "rope", family, f"pos_encoding {c.pos_encoding!r} (rope only)")
    require(c.rope_scaling != "ntk", family, "rope_scaling 'ntk' (none, linear or dynamic)")
    require(c.norm == "rmsnorm" and c.norm_position == "pre", family, "pre-norm RMSNorm only")
    require(c.use_final_norm and not c.embed_norm, family, "a final norm and no embedding norm")
    require(c.activation in GATED, family, f"activation {c.activation!r} (a gated FFN only)")
    require(not c.bias, family, "biases on the projections and FFNs")
    require(c.capacity_factor is None, family, "a capacity factor (the HF model is dropless)")
    require(not c.router_bias_balancing, family, "router bias balancing")
    rope_type = {"none": "default", "linear": "linear", "dynamic": "dynamic"}[c.rope_scaling]
    rope: dict[str, Any] = {"rope_type": rope_type, "rope_theta": c.rope_base}
    if rope_type != "default":
        rope["factor"] = c.rope_factor
    return {
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads or c.n_heads,
        "head_dim": c.d_head,
        "num_hidden_layers": c.n_layers,
        "hidden_act": {"silu": "silu", "gelu": "gelu", "relu": "relu"}[GATED[c.activation]],
        "max_position_embeddings": c.max_seq_len,
        "rms_norm_eps": c.norm_eps,
        "rope_parameters": rope,  # transformers 5; transformers 4 reads the next two
        "rope_theta": c.rope_base,
        "rope_scaling": None if rope_type == "default" else {**rope, "type": rope_type},
        "attention_dropout": c.dropout if c.attn_dropout is None else c.attn_dropout,
        "initializer_range": c.init_std,
        "tie_word_embeddings": c.tie_output,
        "bos_token_id": c.bos_id,
        "eos_token_id": c.eos_id,
        "pad_token_id": c.pad_id,
        "num_experts_per_tok": c.top_k,
        "router_aux_loss_coef": c.aux_loss_weight,
        "output_router_logits": False,
    }


def config_to_hf(c: GPTConfig) -> dict[str, Any]:
    """The ``config.json`` of the Hugging Face Mixtral that ``c`` is.

    Raises:
        UnsupportedCheckpointError: for options Mixtral does not have.
    """
    out = common_to_hf(c, NAME)
    every = len(moe_layer_indices(c)) == c.n_layers
    require(every, NAME, "dense layers (every FFN is MoE in Mixtral; use Qwen2-MoE)")
    require(not c.n_shared_experts, NAME, "shared experts (use Qwen2-MoE)")
    require(c.qkv_bias in (None, False), NAME, "q/k/v biases")
    softmax_weights = c.moe_routing == "topk_softmax" or c.norm_topk_prob
    require(softmax_weights, NAME, "softmax_topk routing without norm_topk_prob")
    return {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        **out,
        "intermediate_size": c.moe_d_ff or c.d_ff,
        "num_local_experts": c.n_experts,
        "sliding_window": None,
        "router_jitter_noise": 0.0,
    }


FAMILY = HFFamily(
    name=NAME,
    model_types=("mixtral",),
    prefix="model",
    head_keys=("lm_head.",),
    base_architecture="MixtralModel",
    model_class=GPT,
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    keymap=keymap,
)
