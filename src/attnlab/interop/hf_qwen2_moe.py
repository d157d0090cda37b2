"""Hugging Face Qwen2-MoE (``Qwen2MoeForCausalLM``) <-> :class:`attnlab.models.GPT` with MoE FFNs.

Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B) is a Llama-like decoder with biases on q/k/v only
(``qkv_bias``, attnlab's ``qkv_bias=True`` with ``bias=False``) whose sparse layers hold a router
``mlp.gate`` (E x D), E SwiGLU experts ``mlp.experts.{j}.{gate,up,down}_proj`` of
``moe_intermediate_size`` and one shared expert ``mlp.shared_expert`` of
``shared_expert_intermediate_size`` behind a sigmoid gate ``mlp.shared_expert_gate`` (1 x D).
Routing is softmax over all experts then top-k (``moe_routing="softmax_topk"``), renormalised
when ``norm_topk_prob``.

Which layers are sparse: ``(i + 1) % decoder_sparse_step == 0`` and ``i`` not in
``mlp_only_layers``; the others have a dense SwiGLU MLP of ``intermediate_size`` (attnlab's
``d_ff``). attnlab's ``moe_every = n`` is ``decoder_sparse_step = n``; a tuple of layers is
written as ``decoder_sparse_step = 1`` with the rest in ``mlp_only_layers``.

Not supported (an error says so): ``use_sliding_window``, RoPE types other than
default/linear/dynamic, a ``head_dim`` other than the ratio. On export: several gated shared
experts are written as one shared expert of their summed width (the same function).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from attnlab.interop.family import HFConfig, HFFamily, UnsupportedCheckpointError, require
from attnlab.interop.hf_mixtral import attention_rows, common_fields, common_to_hf, ends
from attnlab.interop.keymap import Entry, KeyMap, same
from attnlab.models.common import moe_layer_indices
from attnlab.models.gpt import GPT, GPTConfig

NAME = "Qwen2-MoE"
_PROJ = ("gate_proj", "up_proj", "down_proj")


def _ffn_rows(ours: str, theirs: str) -> list[Entry]:
    return [same(f"{ours}.{p}.weight", f"{theirs}.{p}.weight") for p in _PROJ]


def keymap(c: GPTConfig) -> KeyMap:
    """The Qwen2-MoE key map for ``c`` (keys without the ``model.`` prefix)."""
    attention = attention_rows(qkv_bias=bool(c.qkv_bias))
    sparse = set(moe_layer_indices(c))
    body: list[Entry] = []
    for i in range(c.n_layers):
        ours, theirs = f"layers.{i}.ffn", f"layers.{i}.mlp"
        rows = [e.format(i=i) for e in attention]
        if i in sparse:
            rows.append(same(f"{ours}.router.weight", f"{theirs}.gate.weight"))
            for j in range(c.n_experts):
                rows += _ffn_rows(f"{ours}.experts.{j}", f"{theirs}.experts.{j}")
            rows += _ffn_rows(f"{ours}.shared_expert", f"{theirs}.shared_expert")
            rows.append(
                same(f"{ours}.shared_expert_gate.weight", f"{theirs}.shared_expert_gate.weight")
            )
        else:
            rows += _ffn_rows(ours, theirs)
        body += rows
    return ends(c, body)


def _sparse_layers(h: HFConfig, n_layers: int) -> tuple[int, ...]:
    if not h.get("num_experts", default=0):
        return ()
    step = h.get("decoder_sparse_step", default=1)
    dense = set(h.get("mlp_only_layers", default=[]))
    return tuple(i for i in range(n_layers) if i not in dense and (i + 1) % step == 0)


def config_from_hf(h: HFConfig, keys: Collection[str]) -> GPTConfig:
    """An attnlab :class:`GPTConfig` for a Hugging Face Qwen2-MoE config."""
    if h.get("use_sliding_window", default=False):
        raise UnsupportedCheckpointError(
            f"{NAME} use_sliding_window=true (attnlab: full attention)"
        )
    fields = common_fields(h, NAME, 1e-6)
    n_layers = fields["n_layers"]
    sparse = _sparse_layers(h, n_layers)
    step = h.get("decoder_sparse_step", default=1)
    if not sparse:  # a dense Qwen2 layout: no experts at all
        every: int | tuple[int, ...] = 1
    elif sparse == tuple(i for i in range(n_layers) if (i + 1) % step == 0):
        every = step
    else:
        every = sparse
    shared = h.get("shared_expert_intermediate_size", default=0)
    if sparse and shared <= 0:
        raise UnsupportedCheckpointError(
            f"{NAME} shared_expert_intermediate_size={shared} (> 0 only)"
        )
    qkv_bias = bool(
        h.get("qkv_bias", default=True)
    )  # Qwen2 always had q/k/v biases before the flag
    return GPTConfig(
        **fields,
        qkv_bias=qkv_bias or None,
        d_ff=h.get("intermediate_size"),
        n_experts=h.get("num_experts") if sparse else 0,
        top_k=h.get("num_experts_per_tok", default=4) if sparse else 2,
        moe_every=every,
        moe_d_ff=h.get("moe_intermediate_size") if sparse else None,
        moe_routing="softmax_topk",
        norm_topk_prob=bool(h.get("norm_topk_prob", default=False)),
        n_shared_experts=1 if sparse else 0,
        shared_expert_d_ff=shared if sparse else None,
        shared_expert_gate=bool(sparse),
    )


def config_to_hf(c: GPTConfig) -> dict[str, Any]:
    """The ``config.json`` of the Hugging Face Qwen2-MoE that ``c`` is.

    Raises:
        UnsupportedCheckpointError: for options Qwen2-MoE does not have.
    """
    out = common_to_hf(c, NAME)
    require(
        c.n_shared_experts > 0 and c.shared_expert_gate, NAME, "MoE without a gated shared expert"
    )
    layers = moe_layer_indices(c)
    if isinstance(c.moe_every, int):
        step, dense = c.moe_every, []
    else:
        step, dense = 1, [i for i in range(c.n_layers) if i not in layers]
    norm = c.norm_topk_prob or c.moe_routing == "topk_softmax"  # the same weights
    expert = c.moe_d_ff or c.d_ff
    return {
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe",
        **out,
        "qkv_bias": bool(c.qkv_bias),
        "intermediate_size": c.d_ff,
        "moe_intermediate_size": expert,
        "shared_expert_intermediate_size": c.n_shared_experts * (c.shared_expert_d_ff or expert),
        "num_experts": c.n_experts,
        "decoder_sparse_step": step,
        "mlp_only_layers": dense,
        "norm_topk_prob": norm,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": c.n_layers,
    }


FAMILY = HFFamily(
    name=NAME,
    model_types=("qwen2_moe",),
    prefix="model",
    head_keys=("lm_head.",),
    base_architecture="Qwen2MoeModel",
    model_class=GPT,
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    keymap=keymap,
)
