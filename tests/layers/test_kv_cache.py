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


def test_truncate_forgets_positions_and_refuses_bad_lengths() -> None:
    cache = LayerKVCache(max_len=6)
    k = torch.randn(1, 2, 5, 4)
    cache.update(k, k)
    cache.truncate(2)
    assert cache.length == 2 and cache.key_start == 0
    k2 = torch.randn(1, 2, 3, 4)
    keys, _ = cache.update(k2, k2)
    torch.testing.assert_close(keys, torch.cat([k[:, :, :2], k2], dim=2), rtol=0, atol=0)
    for bad in (-1, 6, 1.5):
        with pytest.raises(ValueError, match=r"cannot truncate to|length must be an integer"):
            cache.truncate(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rollback must be a non-negative integer"):
        LayerKVCache(4, window=2, rollback=-1)


def test_window_cache_truncates_as_far_as_its_rollback() -> None:
    """A window-4 cache keeps 3 keys + ``rollback``; it can step back that far, no further."""
    k = torch.arange(8.0).view(1, 1, 8, 1)
    cache = LayerKVCache(16, window=4, rollback=2)
    cache.update(k[:, :, :6], k[:, :, :6])
    assert cache.key_start == 1  # positions 1..5 kept (3 + 2)
    cache.truncate(4)  # a query at 4 sees keys 1..3: all kept
    assert cache.key_start == 1 and cache.length == 4
    keys, _ = cache.update(k[:, :, 6:7], k[:, :, 6:7])
    assert keys.flatten().tolist() == [1.0, 2.0, 3.0, 6.0]
    assert cache.key_positions(0).tolist() == [1, 2, 3, 4]
    plain = LayerKVCache(16, window=4)
    plain.update(k[:, :, :6], k[:, :, :6])
    with pytest.raises(ValueError, match="needs rollback >= 2"):
        plain.truncate(4)  # it kept keys 3..5 only; a query at 4 needs key 1
    plain.truncate(6)  # no-op
    plain.truncate(0)  # forgetting everything always works
    assert plain.length == 0 and plain.k is None


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"pos_encoding": "rope", "n_kv_heads": 1},
        {"pos_encoding": "alibi", "attn_backend": "sliding_window", "attn_window": 4},
    ],
    ids=["learned", "rope-gqa", "sliding-window"],
)
def test_rolled_back_cache_equals_a_fresh_cache_of_the_prefix(kw: dict[str, object]) -> None:
    """Feed 9 tokens, truncate to 5 (as after rejected draft tokens): the cached keys/values and
    the next logits equal those of a cache that only ever saw the 5."""
    from attnlab import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=23, d_model=16, n_heads=2, n_layers=2, d_ff=32,
                          max_seq_len=32, dropout=0.0, eos_id=None, **kw)).eval()  # type: ignore[arg-type]  # fmt: skip
    ids = torch.randint(0, 23, (2, 12))
    with torch.no_grad():
        rolled = model.new_cache(16, rollback=4)
        model(ids[:, :3], cache=rolled)
        model(ids[:, 3:9], cache=rolled)  # 6 at once, as a verification forward
        rolled.truncate(5)
        fresh = model.new_cache(16)
        model(ids[:, :5], cache=fresh)
        assert rolled.seq_len == fresh.seq_len == 5
        for a, b in zip(rolled.self_attn, fresh.self_attn, strict=True):
            assert a.k is not None and b.k is not None and a.v is not None and b.v is not None
            seen = b.key_positions(0)  # what a query at position 5 may attend to
            n = a.length - a.key_start
            got_k, want_k = a.k[:, :, n - len(seen) : n], b.k[:, :, : len(seen)]
            if a.window is None:
                got_k, want_k = a.k[:, :, :5], b.k[:, :, :5]
                torch.testing.assert_close(a.v[:, :, :5], b.v[:, :, :5], atol=1e-6, rtol=0)
            torch.testing.assert_close(got_k, want_k, atol=1e-6, rtol=0)
        after_rolled, _ = model(ids[:, 5:12], cache=rolled)
        after_fresh, _ = model(ids[:, 5:12], cache=fresh)
    torch.testing.assert_close(after_rolled, after_fresh, atol=1e-5, rtol=0)
