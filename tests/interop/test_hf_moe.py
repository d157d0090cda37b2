"""MoE families <-> Hugging Face: Mixtral and Qwen2-MoE.

For several small configurations (expert counts, top-k, GQA/MQA, dense layers, shared experts,
norm_topk_prob): a transformers checkpoint loads as an attnlab GPT whose logits and router logits
match at <= 1e-5 (fp32), whose balancing loss equals transformers' ``load_balancing_loss_func``,
and whose 16 greedy tokens are identical; save_hf writes a directory that transformers loads with
the same logits and attnlab reloads bit for bit.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

import attnlab
from attnlab import GPT
from attnlab.interop import save_hf
from attnlab.layers.moe_stats import collect_moe_stats, keep_router_logits

pytestmark = pytest.mark.usefixtures("one_thread")

V = 97
# Measured max abs differences here: 1-2e-6 on logits of magnitude ~3 (std 0.1 weights).
ATOL = 1e-5
STD = 0.1


def mixtral(t: ModuleType, **kw: Any) -> Any:
    kw = {"num_local_experts": 4, "num_experts_per_tok": 2, "num_key_value_heads": 2, **kw}
    cfg = t.MixtralConfig(
        vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, **kw,
    )  # fmt: skip
    return t.MixtralForCausalLM(cfg)


def qwen2_moe(t: ModuleType, **kw: Any) -> Any:
    kw = {"num_experts": 6, "num_experts_per_tok": 2, "num_key_value_heads": 2, **kw}
    cfg = t.Qwen2MoeConfig(
        vocab_size=V, hidden_size=64, intermediate_size=96, moe_intermediate_size=48,
        shared_expert_intermediate_size=80, num_hidden_layers=3, num_attention_heads=4,
        max_position_embeddings=64, bos_token_id=0, eos_token_id=0, **kw,
    )  # fmt: skip
    return t.Qwen2MoeForCausalLM(cfg)


CASES: dict[str, tuple[Any, dict[str, Any]]] = {
    "mixtral-e4-k2-gqa": (mixtral, {}),
    "mixtral-e3-k1-mha": (mixtral, {"num_local_experts": 3, "num_experts_per_tok": 1,
                                    "num_key_value_heads": 4}),
    "mixtral-e8-k3-mqa": (mixtral, {"num_local_experts": 8, "num_experts_per_tok": 3,
                                    "num_key_value_heads": 1}),
    "qwen-e6-k2-dense-layer": (qwen2_moe, {"mlp_only_layers": [1]}),
    "qwen-e4-k3-step2-norm": (qwen2_moe, {"num_experts": 4, "num_experts_per_tok": 3,
                                          "decoder_sparse_step": 2, "norm_topk_prob": True,
                                          "qkv_bias": False, "num_key_value_heads": 1}),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_parity_router_logits_aux_loss_and_greedy(
    transformers: ModuleType, tools: Any, tmp_path: Path, case: str
) -> None:
    build, kw = CASES[case]
    hf = build(transformers, **kw)
    tools.randomise(hf, std=STD)
    model = attnlab.from_pretrained(tools.save(hf, tmp_path))
    assert isinstance(model, GPT) and model.config.n_experts == hf.config.to_dict().get(
        "num_local_experts", hf.config.to_dict().get("num_experts")
    )
    keep_router_logits(model)
    ids = tools.ids(3, 16, V)
    with torch.no_grad():
        ref = hf(ids, output_router_logits=True)
        logits, _ = model(ids)
    assert tools.max_diff(logits, ref.logits) <= ATOL
    stats = collect_moe_stats(model)
    assert len(stats.router_logits) == len(ref.router_logits) > 0
    lb = transformers.models.mixtral.modeling_mixtral.load_balancing_loss_func
    k = model.config.top_k
    for (name, ours), theirs in zip(stats.router_logits.items(), ref.router_logits, strict=True):
        assert tools.max_diff(ours, theirs) <= ATOL, name
        layer = model.get_submodule(name).last_stats
        expected = lb((theirs,), model.config.n_experts, k)
        torch.testing.assert_close(layer.aux_loss, expected, atol=1e-6, rtol=1e-6)
    prompt = ids[:, :6]
    assert torch.equal(tools.greedy_gpt(model, prompt, 16), tools.greedy_hf(hf, prompt, 16))


ROUND_TRIPS: dict[str, dict[str, Any]] = {
    "mixtral": dict(n_experts=4, top_k=2, n_kv_heads=2),
    "qwen2_moe": dict(
        n_experts=5, top_k=2, moe_every=(0, 2), n_layers=3, moe_d_ff=40, qkv_bias=True,
        moe_routing="softmax_topk", norm_topk_prob=False, n_shared_experts=2,
        shared_expert_d_ff=24, shared_expert_gate=True,
    ),
}  # fmt: skip


@pytest.mark.parametrize("family", list(ROUND_TRIPS))
def test_round_trip_through_transformers(
    transformers: ModuleType, tools: Any, tmp_path: Path, family: str
) -> None:
    cfg = attnlab.GPTConfig(
        **{"vocab_size": V, "d_model": 64, "n_heads": 4, "n_layers": 2, "d_ff": 96,
           "max_seq_len": 64, "dropout": 0.0, "eos_id": None, "pos_encoding": "rope",
           "norm": "rmsnorm", "activation": "swiglu", "bias": False, "tie_output": False,
           **ROUND_TRIPS[family]},
    )  # fmt: skip
    model = GPT(cfg).eval()
    tools.randomise(model, std=STD)
    save_hf(model, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert hf.config.model_type == family
    ids = tools.ids(2, 20, V)
    with torch.no_grad():
        assert tools.max_diff(model(ids)[0], hf(ids).logits) <= ATOL
    tools.assert_same_state(model, attnlab.from_pretrained(tmp_path))


def test_moe_options_without_hugging_face_equivalent(tmp_path: Path) -> None:
    for kw, reason in (
        ({"capacity_factor": 1.25}, "capacity factor"),
        ({"router_bias_balancing": True}, "bias balancing"),
    ):
        model = GPT(attnlab.config_for("gpt-moe-tiny", **kw))
        with pytest.raises(ValueError, match="no Hugging Face equivalent") as err:
            save_hf(model, tmp_path)
        assert reason in str(err.value) and "Llama: its tensors differ" in str(err.value)
    dense = GPT(attnlab.config_for("gpt-moe-tiny", n_experts=0))  # a Llama, not a Mixtral
    save_hf(dense, tmp_path)
    assert attnlab.interop.hf.read_config(tmp_path)["model_type"] == "llama"


def test_unsupported_checkpoint_options(
    transformers: ModuleType, tools: Any, tmp_path: Path
) -> None:
    hf = mixtral(transformers, sliding_window=8)
    with pytest.raises(ValueError, match="sliding_window"):
        attnlab.from_pretrained(tools.save(hf, tmp_path / "a"))
    hf = qwen2_moe(transformers, use_sliding_window=True, sliding_window=8)
    with pytest.raises(ValueError, match="use_sliding_window"):
        attnlab.from_pretrained(tools.save(hf, tmp_path / "b"))
