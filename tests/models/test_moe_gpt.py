"""MoE GPT: which layers are MoE, config validation, KV-cache decoding, and the analysis closed
forms (total vs active parameters, FLOPs == FlopCounterMode, Mixtral-8x7B == transformers)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import torch

import attnlab
from attnlab import PRESETS, GPTConfig, build_model, count_params
from attnlab.analysis.flops import forward_flops
from attnlab.analysis.measure import count_flops
from attnlab.analysis.moe import active_params, expert_params, moe_summary
from attnlab.analysis.report import analyze
from attnlab.analysis.text import format_report
from attnlab.config import config_to_dict
from attnlab.layers.feedforward import FeedForward
from attnlab.layers.moe import MoEFeedForward
from attnlab.layers.moe_stats import collect_moe_stats
from attnlab.models import config_from_json_dict
from attnlab.models.common import moe_layer_indices

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = PRESETS["gpt-moe-tiny"]


def tiny(**kw: Any) -> GPTConfig:
    return dataclasses.replace(TINY, **kw)


@pytest.mark.parametrize(
    ("every", "n_layers", "expected"),
    [(1, 4, (0, 1, 2, 3)), (2, 4, (1, 3)), (3, 7, (2, 5)), ((0, 2), 3, (0, 2))],
)
def test_which_layers_are_moe(every: Any, n_layers: int, expected: tuple[int, ...]) -> None:
    c = tiny(moe_every=every, n_layers=n_layers)
    model = build_model(c, device="meta")
    assert moe_layer_indices(c) == expected
    for i, layer in enumerate(model.layers):
        assert isinstance(layer.ffn, MoEFeedForward if i in expected else FeedForward)
    assert moe_layer_indices(tiny(n_experts=0)) == ()


def test_config_json_round_trip_keeps_tuples() -> None:
    c = tiny(moe_every=(0,), n_shared_experts=2, shared_expert_gate=True, capacity_factor=1.5)
    data = json.loads(json.dumps(config_to_dict(c)))
    assert data["moe_every"] == [0]
    assert config_from_json_dict(data) == c


@pytest.mark.parametrize(
    ("kw", "error", "message"),
    [
        (dict(top_k=5), ValueError, "top_k=5"),
        (dict(moe_every=0), ValueError, "moe_every"),
        (dict(moe_every=(0, 0)), ValueError, "distinct layer indices"),
        (dict(moe_every=(2,)), ValueError, "distinct layer indices"),
        (dict(moe_every=1.5), TypeError, "moe_every"),
        (dict(moe_routing="hash"), ValueError, "moe_routing"),
        (dict(capacity_factor=0.0), ValueError, "capacity_factor"),
        (dict(aux_loss_weight=float("inf")), ValueError, "aux_loss_weight"),
        (dict(aux_loss_weight=-0.1), ValueError, "aux_loss_weight must be >= 0"),
        (dict(n_experts=-1), ValueError, "n_experts must be >= 0"),
        (dict(top_k=0, n_experts=0), ValueError, "top_k must be positive"),
        (dict(n_experts="4"), TypeError, "n_experts"),
        (dict(shared_expert_gate=True), ValueError, "shared_expert_gate"),
        (dict(moe_d_ff=0), ValueError, "moe_d_ff"),
        (dict(qkv_bias="yes"), TypeError, "qkv_bias"),
    ],
)
def test_config_validation(kw: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        tiny(**kw)


@pytest.mark.parametrize("kw", [dict(), dict(moe_every=2, n_layers=3, top_k=1, n_shared_experts=1)])
def test_cached_decoding_equals_full_forward(kw: dict[str, Any]) -> None:
    torch.manual_seed(0)
    model = build_model(tiny(**kw)).eval()
    ids = torch.randint(0, TINY.vocab_size, (2, 11))
    with torch.no_grad():
        full, _ = model(ids)
        cache = model.new_cache(16)
        steps = [model(ids[:, :4], cache=cache)[0]]
        steps += [model(ids[:, t : t + 1], cache=cache)[0] for t in range(4, 11)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    prompt = ids[:, :5]
    out = attnlab.generate(model, prompt, max_new_tokens=8)
    seq = prompt
    with torch.no_grad():
        for _ in range(8):  # recompute everything each step, no cache
            seq = torch.cat([seq, model(seq)[0][:, -1:].argmax(-1)], dim=1)
    assert torch.equal(out, seq[:, 5:])  # generate returns the new tokens only


def test_model_stats_reach_the_loss() -> None:
    model = build_model(tiny(aux_loss_weight=0.1, z_loss_weight=0.01)).train()
    ids = torch.randint(0, TINY.vocab_size, (2, 9))
    _, loss = model(ids, targets=ids)
    stats = collect_moe_stats(model)
    assert loss is not None and len(stats.tokens_per_expert) == TINY.n_layers
    assert all(int(c.sum()) == 18 * TINY.top_k for c in stats.tokens_per_expert.values())
    torch.testing.assert_close(stats.loss, 0.1 * stats.aux_loss + 0.01 * stats.z_loss)
    (loss + stats.loss).backward()
    assert all(layer.ffn.router.weight.grad is not None for layer in model.layers)


# -- analysis ------------------------------------------------------------------------------------

VARIANTS: list[dict[str, Any]] = [
    dict(),
    dict(moe_every=2, n_layers=4, moe_d_ff=48, top_k=1),
    dict(n_shared_experts=2, shared_expert_d_ff=40, shared_expert_gate=True, qkv_bias=True),
    dict(moe_every=(0,), bias=True, activation="gelu", norm="layernorm", tie_output=True,
         pos_encoding="learned", n_experts=3, top_k=3),
]  # fmt: skip


@pytest.mark.parametrize("kw", VARIANTS)
def test_closed_forms_match_the_model_and_flop_counter(kw: dict[str, Any]) -> None:
    c = tiny(**kw)
    torch.manual_seed(0)
    model = build_model(c)
    for exclude in (False, True):
        assert count_params(c, exclude_embeddings=exclude) == count_params(
            model, exclude_embeddings=exclude
        )
    # active: run one token; exactly k experts of each MoE layer get a gradient
    model(torch.tensor([[3]]))[0].sum().backward()
    idle = sum(
        p.numel()
        for layer in model.layers
        if isinstance(layer.ffn, MoEFeedForward)
        for e in layer.ffn.experts
        for p in e.parameters()
        if p.grad is None or not p.grad.any()
    )
    assert active_params(c) == count_params(model) - idle
    # dropless dispatch runs N·k expert rows: the measured count equals the closed form
    B, T = 2, 12
    ids = torch.randint(0, c.vocab_size, (B, T))
    measured = count_flops(model, (ids,), backward=True)
    expected = forward_flops(c, T, batch=B)
    assert measured.forward == expected.forward
    assert measured.backward == expected.backward


def test_capacity_makes_the_count_smaller_than_the_bound() -> None:
    c = tiny(capacity_factor=0.5)
    model = build_model(c)
    ids = torch.randint(0, c.vocab_size, (2, 12))
    assert count_flops(model, (ids,)).forward < forward_flops(c, 12, batch=2).forward


def test_mixtral_8x7b_counts_equal_transformers() -> None:
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.MixtralConfig(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, num_local_experts=8,
        num_experts_per_tok=2, max_position_embeddings=32768, rms_norm_eps=1e-5,
        rope_theta=1e6, tie_word_embeddings=False,
    )  # fmt: skip
    with torch.device("meta"):
        hf = transformers.MixtralForCausalLM(hf_config)
    total = sum(p.numel() for p in hf.parameters())
    experts = hf.model.layers[0].mlp.experts
    one = experts.gate_up_proj[0].numel() + experts.down_proj[0].numel()
    c = PRESETS["mixtral-8x7b"]
    assert count_params(c) == total == 46_702_792_704
    assert count_params(build_model(c, device="meta")) == total
    assert expert_params(c) == one
    assert active_params(c) == total - 32 * (8 - 2) * one == 12_879_925_248
    text = format_report(analyze(c, seq_len=128, name="mixtral-8x7b"))
    assert "46,702,792,704" in text and "12,879,925,248" in text


def test_summary_of_dense_models_is_none() -> None:
    assert moe_summary(PRESETS["gpt2-small"]) is None
    assert analyze(PRESETS["gpt-char-baby"]).to_dict()["moe"] is None
    s = moe_summary(TINY)
    assert s is not None and s.moe_layers == {"layers": (0, 1)} and 0 < s.active_fraction < 1
