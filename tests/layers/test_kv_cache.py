"""KV cache: the cache objects, and cached decoding == full teacher-forced recompute."""

from __future__ import annotations

import pytest
import torch

from attnlab.layers import (
    CrossKVCache,
    DecoderLayer,
    FeedForward,
    KVCache,
    LayerKVCache,
    LayerNorm,
    MultiHeadAttention,
    RotaryEmbedding,
)
from attnlab.models import EncoderDecoderTransformer, TransformerConfig


def test_layer_cache_appends_and_returns_prefix() -> None:
    cache = LayerKVCache(max_len=5)
    k1, v1 = torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4)
    k, v = cache.update(k1, v1)
    assert cache.length == 3 and torch.equal(k, k1) and torch.equal(v, v1)
    assert cache.k is not None and cache.k.shape == (2, 1, 5, 4)  # preallocated
    k2, v2 = torch.randn(2, 1, 2, 4), torch.randn(2, 1, 2, 4)
    k, v = cache.update(k2, v2)
    assert cache.length == 5
    torch.testing.assert_close(k, torch.cat([k1, k2], dim=2))
    torch.testing.assert_close(v, torch.cat([v1, v2], dim=2))


def test_layer_cache_overflow_and_shape_change() -> None:
    cache = LayerKVCache(max_len=4)
    cache.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))
    with pytest.raises(ValueError, match=r"KV cache overflow: 3 cached \+ 2 new > max_len=4"):
        cache.update(torch.randn(1, 2, 2, 4), torch.randn(1, 2, 2, 4))
    with pytest.raises(ValueError, match="cache holds"):
        cache.update(torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4))
    with pytest.raises(ValueError, match="max_len must be positive"):
        LayerKVCache(0)


def test_reorder_selects_batch_rows() -> None:
    cache = KVCache(2, 4, cross_attention=True)
    sc, cc = cache.layer(1)
    assert cc is not None
    k = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 1, 2, 1)
    sc.update(k, k)
    cc.set(k, k)
    assert cache.seq_len == 0  # layer 0 untouched
    cache.reorder(torch.tensor([2, 2, 0]))
    assert sc.k is not None and sc.k[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]
    assert cc.k is not None and cc.k[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]
    assert KVCache(3, 4).layer(0)[1] is None


def test_decoder_layer_cache_with_rope_continues_positions() -> None:
    """Without explicit positions, RoPE positions continue after what the cache holds."""
    rope = RotaryEmbedding(4)
    attn = MultiHeadAttention(8, 2, rotary=rope)
    layer = DecoderLayer(attn, FeedForward(8, 16), LayerNorm(8), LayerNorm(8)).eval()
    x = torch.randn(2, 5, 8)
    full = layer(x)
    cache = LayerKVCache(8)
    steps = [layer(x[:, :3], cache=cache)]
    steps += [layer(x[:, t : t + 1], cache=cache) for t in (3, 4)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


def _tiny(pos: str, backend: str = "sdpa", n_kv_heads: int | None = None) -> TransformerConfig:
    return TransformerConfig(
        vocab_size=23,
        d_model=16,
        n_heads=4,
        n_kv_heads=n_kv_heads,
        n_layers=2,
        d_ff=32,
        dropout=0.0,
        max_seq_len=32,
        pos_encoding=pos,
        attn_backend=backend,
    )


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("pos", ["sinusoidal", "learned", "rope", "alibi", "none"])
def test_cached_decoding_equals_full_forward(pos: str, n_kv_heads: int | None) -> None:
    model = EncoderDecoderTransformer(_tiny(pos, n_kv_heads=n_kv_heads)).eval()
    src = torch.randint(3, 23, (2, 7))
    src[1, 5:] = 0  # padded source
    tgt = torch.randint(3, 23, (2, 6))
    src_mask = src != 0
    full, _ = model(src, tgt)
    memory = model.encode(src, src_mask=src_mask)
    cache = model.new_cache(max_len=6)
    # A prefill of 2 tokens (T > 1 with a cache), then one token at a time.
    steps = [model.decode(tgt[:, :2], memory, src_mask=src_mask, cache=cache)]
    for t in range(2, 6):
        steps.append(model.decode(tgt[:, t : t + 1], memory, src_mask=src_mask, cache=cache))
    assert cache.seq_len == 6
    assert all(c.is_set for c in cache.cross_attn or [])
    kv_heads = n_kv_heads or 4
    assert cache.self_attn[0].k is not None and cache.self_attn[0].k.shape == (2, kv_heads, 6, 4)
    assert (torch.cat(steps, dim=1) - full).abs().max() <= 1e-5


@pytest.mark.parametrize("pos", ["alibi", "rope"])
def test_cached_decoding_math_backend(pos: str) -> None:
    model = EncoderDecoderTransformer(_tiny(pos, backend="math", n_kv_heads=2)).eval()
    src, tgt = torch.randint(3, 23, (1, 5)), torch.randint(3, 23, (1, 4))
    full, _ = model(src, tgt)
    memory = model.encode(src)
    cache = model.new_cache(max_len=4)
    steps = [model.decode(tgt[:, t : t + 1], memory, cache=cache) for t in range(4)]
    assert (torch.cat(steps, dim=1) - full).abs().max() <= 1e-5


def test_cache_overflow_in_model() -> None:
    model = EncoderDecoderTransformer(_tiny("sinusoidal")).eval()
    memory = model.encode(torch.randint(3, 23, (1, 4)))
    cache = model.new_cache(max_len=3)
    model.decode(torch.randint(3, 23, (1, 2)), memory, cache=cache)
    model.decode(torch.randint(3, 23, (1, 1)), memory, cache=cache)
    with pytest.raises(ValueError, match=r"KV cache overflow.*max_len=3"):
        model.decode(torch.randint(3, 23, (1, 1)), memory, cache=cache)


def test_cross_cache_is_computed_once() -> None:
    cc = CrossKVCache()
    assert not cc.is_set
    model = EncoderDecoderTransformer(_tiny("none")).eval()
    memory = model.encode(torch.randint(3, 23, (1, 4)))
    cache = model.new_cache(max_len=4)
    model.decode(torch.randint(3, 23, (1, 1)), memory, cache=cache)
    assert cache.cross_attn is not None
    first = [c.k for c in cache.cross_attn]
    model.decode(torch.randint(3, 23, (1, 1)), memory, cache=cache)
    assert all(a is c.k for a, c in zip(first, cache.cross_attn, strict=True))
