"""Memory: per-parameter training bytes, activations against a measurement of what autograd
saves, and KV-cache bytes against the tensors a real cache holds after decoding."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnlab import PRESETS, build_model, count_params
from attnlab.analysis.measure import example_inputs, measure_activation_bytes
from attnlab.analysis.memory import (
    activation_bytes,
    kv_cache_bytes,
    kv_cache_bytes_per_token,
    training_memory,
)
from attnlab.layers import MultiHeadAttention

BABY = dataclasses.replace(PRESETS["gpt-char-baby"], dropout=0.0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sixteen_bytes_per_parameter(dtype: str) -> None:
    m = training_memory(PRESETS["gpt2-small"], 1024, dtype=dtype)
    N = count_params(PRESETS["gpt2-small"])
    assert m.weights + m.gradients + m.optimizer == 16 * N
    assert m.total == 16 * N + m.activations


ACTIVATION_CASES = {
    "gpt": BABY,
    "llama-gqa": dataclasses.replace(
        BABY, n_kv_heads=2, activation="swiglu", norm="rmsnorm", bias=False, tie_output=False
    ),
    "bert": dataclasses.replace(PRESETS["bert-tiny"], dropout=0.0, vocab_size=512),
    "vit": dataclasses.replace(PRESETS["vit-digits"], dropout=0.0),
    "encoder-decoder": dataclasses.replace(PRESETS["transformer-tiny"], dropout=0.0),
}


@pytest.mark.parametrize("name", sorted(ACTIVATION_CASES))
def test_activation_estimate_matches_saved_tensors(name: str) -> None:
    """Within 1%: the estimate leaves out tensors that do not grow with the batch (boolean
    masks of T·S bytes, a few scalars); everything else is counted element by element."""
    config = ACTIVATION_CASES[name]
    n = None if name == "vit" else 16
    model = build_model(config).train()
    args, kwargs = example_inputs(config, batch=4, seq_len=n)
    if name in ("gpt", "llama-gqa", "bert"):
        kwargs = {"targets": torch.randint(3, config.vocab_size, args[0].shape)}
    elif name == "encoder-decoder":
        kwargs = {"targets": torch.randint(3, config.vocab_size, args[1].shape)}
    measured = measure_activation_bytes(model, args, kwargs)
    estimate = activation_bytes(config, n, batch=4)
    assert estimate["total"] == pytest.approx(measured, rel=0.01)


@pytest.mark.parametrize("name", ["gpt", "llama-gqa", "bert", "encoder-decoder"])
def test_activation_estimate_counts_the_stacked_qkv_weights(name: str) -> None:
    """With as many tokens as the stacked q/k/v weight has rows, a training step stacks the
    weights of every self-attention (not cross-attention) and keeps the copy for its backward:
    the estimate counts it (within 1%, as above), and one token fewer per batch row drops it."""
    config = ACTIVATION_CASES[name]
    n = 16
    model = build_model(config).train()
    attention = next(m for m in model.modules() if isinstance(m, MultiHeadAttention))
    rows = attention.q_proj.out_features + 2 * attention.k_proj.out_features
    batch = -(-rows // n)  # B·T >= rows
    with torch.enable_grad():
        assert attention._stacked_in_weights(batch * n) is not None
        assert attention._stacked_in_weights(rows - 1) is None
    args, _ = example_inputs(config, batch=batch, seq_len=n)
    index = 1 if name == "encoder-decoder" else 0
    kwargs = {"targets": torch.randint(3, config.vocab_size, args[index].shape)}
    measured = measure_activation_bytes(model, args, kwargs)
    estimate = activation_bytes(config, n, batch=batch)
    assert estimate["total"] == pytest.approx(measured, rel=0.01)
    self_attentions = [
        m for name, m in model.named_modules() if name.endswith("self_attn") and m is not None
    ]
    assert self_attentions
    for m in self_attentions:  # a hook makes them call their three linears: no copies
        for linear in (m.q_proj, m.k_proj, m.v_proj):
            linear.register_forward_pre_hook(lambda module, args: None)
    unstacked = measure_activation_bytes(model, args, kwargs)
    copies = len(self_attentions) * rows * config.d_model * 4  # float32, one per self-attention
    assert measured - unstacked == copies


def test_attention_scores_grow_quadratically() -> None:
    a1 = activation_bytes(PRESETS["gpt2-small"], 512)
    a2 = activation_bytes(PRESETS["gpt2-small"], 1024)
    assert a2["attention_scores"] == 4 * a1["attention_scores"]
    assert a1["attention_scores"] == 12 * 3 * 12 * 512 * 512 * 4  # layers·3·H·n²·fp32


def _cache_bytes(cache: object) -> int:
    total = 0
    for layer in cache.self_attn:  # type: ignore[attr-defined]
        total += layer.k.nbytes + layer.v.nbytes
    for layer in cache.cross_attn or []:  # type: ignore[attr-defined]
        total += layer.k.nbytes + layer.v.nbytes
    return total


@torch.no_grad()
def test_kv_cache_bytes_gpt_gqa_after_decoding() -> None:
    config = dataclasses.replace(BABY, n_kv_heads=2, n_layers=3)
    model = build_model(config).eval()
    B, prompt, N = 2, 5, 12
    ids = torch.randint(3, config.vocab_size, (B, N))
    cache = model.new_cache(max_len=N)
    model(ids[:, :prompt], cache=cache)
    for t in range(prompt, N):
        model(ids[:, t : t + 1], cache=cache)
    assert cache.seq_len == N
    assert _cache_bytes(cache) == kv_cache_bytes(config, N, batch=B)
    per_token = 2 * 3 * 2 * (128 // 4) * 4  # k and v, layers, H_kv, D, float32
    assert kv_cache_bytes_per_token(config) == per_token
    assert kv_cache_bytes(config, N, batch=B) == B * N * per_token
    assert kv_cache_bytes(config, N, batch=B, dtype="bfloat16") == B * N * per_token // 2


@torch.no_grad()
def test_kv_cache_bytes_encoder_decoder() -> None:
    config = dataclasses.replace(PRESETS["transformer-tiny"], n_kv_heads=2, dropout=0.0)
    model = build_model(config).eval()
    B, S, N = 2, 7, 6
    src = torch.randint(3, config.vocab_size, (B, S))
    memory = model.encode(src)
    cache = model.new_cache(N)
    tgt = torch.randint(3, config.vocab_size, (B, N))
    for t in range(N):
        model.decode(tgt[:, t : t + 1], memory, cache=cache)
    assert _cache_bytes(cache) == kv_cache_bytes(config, N, batch=B, src_len=S)


def test_kv_cache_window_and_bad_input() -> None:
    c = PRESETS["llama2-7b"]
    assert kv_cache_bytes_per_token(c) == 2 * 32 * 4096 * 4  # 1 MiB in float32
    assert kv_cache_bytes(c, 4096, window=1024) == kv_cache_bytes(c, 1024)
    assert kv_cache_bytes(c, 512, window=1024) == kv_cache_bytes(c, 512)
    with pytest.raises(ValueError, match="BERTConfig has no KV cache: it is no decoder"):
        kv_cache_bytes(PRESETS["bert-base"], 128)
    with pytest.raises(ValueError, match="context_len must be a positive integer"):
        kv_cache_bytes(c, 0)
    with pytest.raises(ValueError, match="window must be a positive integer"):
        kv_cache_bytes(c, 16, window=-1)
    with pytest.raises(ValueError, match="unknown dtype"):
        kv_cache_bytes(c, 16, dtype="int3")
    with pytest.raises(ValueError, match="seq_len must be a positive integer"):
        activation_bytes(c, -1)
