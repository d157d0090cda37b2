"""Models with per-layer attention backends and sliding windows; rolling KV caches stay exact."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab.layers.attention_sliding import SlidingWindowAttention
from attnlab.models.gpt import GPTConfig


def _gpt(**kw: object) -> attnlab.models.gpt.GPT:
    base = dict(vocab_size=50, d_model=32, n_heads=4, n_layers=3, d_ff=64, dropout=0.0, eos_id=None)
    base.update(kw)
    return attnlab.build_model(GPTConfig(max_seq_len=64, **base)).eval()  # type: ignore[arg-type,return-value]


def test_attn_window_and_per_layer_backends_reach_the_layers() -> None:
    model = _gpt(
        attn_backend="sliding_window",
        attn_window=5,
        attn_layer_backends=("sliding_window", "sdpa", "sliding_window"),
    )
    backends = [layer.self_attn.backend for layer in model.layers]
    assert isinstance(backends[0], SlidingWindowAttention) and backends[0].window == 5
    assert not isinstance(backends[1], SlidingWindowAttention)
    assert isinstance(backends[2], SlidingWindowAttention) and backends[2].window == 5


@pytest.mark.parametrize("pos", ["learned", "rope", "alibi"])
def test_rolling_window_cache_equals_full_forward(pos: str) -> None:
    torch.manual_seed(0)
    model = _gpt(
        pos_encoding=pos,
        attn_backend="sliding_window",
        attn_window=4,
        attn_layer_backends=("sliding_window", "sdpa", "sliding_window"),
    )
    ids = torch.randint(0, 50, (2, 20))
    full, _ = model(ids)
    cache = model.new_cache(32)
    steps = [model(ids[:, :7], cache=cache)[0]]  # prefill longer than the window
    steps += [model(ids[:, t : t + 1], cache=cache)[0] for t in range(7, 20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    # Windowed layers hold only window - 1 keys; the full layer holds all 20.
    assert cache.self_attn[0].k is not None and cache.self_attn[0].k.shape[2] == 3
    assert cache.self_attn[1].k is not None and cache.self_attn[1].k.shape[2] >= 20
    assert cache.seq_len == 20


def test_window_cache_with_padding_mask() -> None:
    torch.manual_seed(1)
    model = _gpt(attn_backend="sliding_window", attn_window=3)
    ids = torch.randint(0, 50, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 0] = False  # one masked key inside the first window
    full, _ = model(ids, mask=mask)
    cache = model.new_cache(16)
    steps = [model(ids[:, :1], mask=mask[:, :1], cache=cache)[0]]
    steps += [model(ids[:, t : t + 1], mask=mask[:, : t + 1], cache=cache)[0] for t in range(1, 9)]
    out = torch.cat(steps, dim=1)
    torch.testing.assert_close(out[:, 1:], full[:, 1:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[0], full[0], atol=1e-5, rtol=1e-5)


def test_window_config_errors() -> None:
    with pytest.raises(ValueError, match="needs the 'sliding_window' backend"):
        GPTConfig(attn_window=8)
    with pytest.raises(ValueError, match="one per layer"):
        GPTConfig(n_layers=2, attn_layer_backends=("sdpa",))
    with pytest.raises(ValueError, match="attn_layer_backends entry"):
        GPTConfig(n_layers=1, attn_layer_backends=("nope",))
