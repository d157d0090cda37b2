"""The efficient attention backends: chunked (online softmax), sliding window, linear.

References: the math path (chunked; sliding window with the equivalent dense banded mask) and
linear attention's own quadratic form computed naively. Plus: bad inputs raise, and neither
sliding_window nor chunked nor linear ever allocates an n x n buffer.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import torch
from torch import Tensor

from attnlab.layers import (
    ATTENTION_BACKENDS,
    ChunkedAttention,
    LinearAttention,
    MultiHeadAttention,
    SlidingWindowAttention,
    chunked_attention,
    get_attention_backend,
    linear_attention,
    sliding_window_attention,
    sliding_window_mask,
)
from attnlab.layers.attention import repeat_kv, scaled_dot_product_attention
from attnlab.layers.attention_chunked import _forward
from attnlab.layers.attention_linear import favor_projection, linear_attention_features
from attnlab.layers.masks import causal_mask

ATOL = 1e-5


def _qkv(
    B: int, H: int, H_kv: int, T: int, S: int, D: int = 8, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(T * 1000 + S)
    q = torch.randn(B, H, T, D, generator=g, dtype=dtype).requires_grad_()
    k = torch.randn(B, H_kv, S, D, generator=g, dtype=dtype).requires_grad_()
    v = torch.randn(B, H_kv, S, D, generator=g, dtype=dtype).requires_grad_()
    return q, k, v


def _math(q: Tensor, k: Tensor, v: Tensor, **kw: Any) -> Tensor:
    out = scaled_dot_product_attention(q, k, v, **kw)
    assert isinstance(out, Tensor)
    return out


def _assert_same(a: Tensor, b: Tensor, inputs: tuple[Tensor, ...], atol: float = ATOL) -> None:
    """Same forward and same gradients w.r.t. ``inputs`` for one random output gradient."""
    torch.testing.assert_close(a, b, atol=atol, rtol=0)
    grad = torch.randn(a.shape, generator=torch.Generator().manual_seed(1), dtype=a.dtype)
    ga = torch.autograd.grad(a, inputs, grad, retain_graph=True)
    gb = torch.autograd.grad(b, inputs, grad, retain_graph=True)
    for x, y in zip(ga, gb, strict=True):
        torch.testing.assert_close(x, y, atol=atol, rtol=0)


def _mask(kind: str, B: int, H: int, T: int, S: int) -> Tensor | None:
    g = torch.Generator().manual_seed(7)
    if kind == "none":
        return None
    if kind == "bool":
        m = torch.rand(B, 1, T, S, generator=g) > 0.3
        m[0, 0, min(2, T - 1)] = False  # one fully masked query row
        return m
    if kind == "padding":
        return torch.rand(B, 1, 1, S, generator=g) > 0.3
    if kind == "float":  # additive biases plus some -inf and finfo.min entries
        m = torch.randn(1, H, T, S, generator=g)
        m[..., 0] = -math.inf
        m[..., -1] = torch.finfo(m.dtype).min
        return m
    raise AssertionError(kind)


# ---------------------------------------------------------------- chunked == math


@pytest.mark.parametrize(
    ("mask_kind", "is_causal", "T", "S"),
    [
        *itertools.product(["none", "bool", "padding", "float"], [False, True], [11], [11]),
        ("none", True, 5, 17),  # causal, T < S (decoding with a cache): bottom-right aligned
        ("bool", True, 1, 9),
        ("float", True, 7, 12),
        ("none", True, 9, 4),  # T > S: the first queries see nothing -> zeros
        ("padding", False, 6, 13),
    ],
)
def test_chunked_equals_math(mask_kind: str, is_causal: bool, T: int, S: int) -> None:
    B, H, H_kv = 2, 4, 2  # grouped-query attention
    q, k, v = _qkv(B, H, H_kv, T, S)
    mask = _mask(mask_kind, B, H, T, S)
    out = chunked_attention(q, k, v, mask=mask, is_causal=is_causal, block_q=4, block_k=3)
    ref = _math(q, k, v, mask=mask, is_causal=is_causal)
    _assert_same(out, ref, (q, k, v))


def test_chunked_fully_masked_rows_are_zero_with_finite_grads() -> None:
    q, k, v = _qkv(1, 2, 2, 6, 6)
    mask = torch.ones(6, 6, dtype=torch.bool)
    mask[1] = False
    out = chunked_attention(q, k, v, mask=mask, block_q=2, block_k=4)
    assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1]))
    out.sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


def test_chunked_learned_float_bias_gets_gradients() -> None:
    q, k, v = _qkv(1, 2, 1, 5, 7)
    bias = torch.randn(1, 2, 5, 7, requires_grad=True)
    out = chunked_attention(q, k, v, mask=bias, is_causal=True, block_q=2, block_k=3)
    ref = _math(q, k, v, mask=bias, is_causal=True)
    _assert_same(out, ref, (q, k, v, bias))


def test_chunked_dropout_is_reproducible_and_recomputed_exactly_in_backward() -> None:
    q, k, v = _qkv(1, 2, 1, 9, 9)
    torch.manual_seed(0)
    a = chunked_attention(q, k, v, is_causal=True, dropout_p=0.5, block_q=4, block_k=4)
    torch.manual_seed(0)
    b = chunked_attention(q, k, v, is_causal=True, dropout_p=0.5, block_q=4, block_k=4)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert not torch.allclose(a, chunked_attention(q, k, v, is_causal=True, block_q=4, block_k=4))
    # The recomputing backward regenerates each tile's dropout mask: it equals plain autograd
    # through the blocked forward with the same seed.
    torch.manual_seed(0)
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    ref, _ = _forward(q, k, v, None, True, 0.5, 1 / math.sqrt(8), seed, 4, 4)
    _assert_same(a, ref, (q, k, v))


def test_chunked_has_no_double_backward() -> None:
    q, k, v = _qkv(1, 1, 1, 4, 4)
    (gq,) = torch.autograd.grad(chunked_attention(q, k, v).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError):
        gq.sum().backward()


def test_chunked_half_precision_matches_float32_math() -> None:
    q, k, v = _qkv(1, 2, 2, 10, 10, dtype=torch.bfloat16)
    out = chunked_attention(q, k, v, is_causal=True, block_q=4, block_k=4)
    assert out.dtype == torch.bfloat16
    ref = _math(q.float(), k.float(), v.float(), is_causal=True)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=0)


# ---------------------------------------------------------------- sliding window == math


@pytest.mark.parametrize(
    ("T", "S", "window", "is_causal", "global_tokens", "block_size"),
    [
        (13, 13, 4, True, None, 4),  # n not a multiple of the block
        (13, 13, 4, False, None, 4),
        (37, 37, 5, True, [0, 20], None),
        (37, 37, 6, False, [0, 20, 36], 8),
        (50, 50, 1, True, None, 16),  # window 1: each query sees itself only
        (1, 23, 6, True, [2], None),  # one decoding step against a cache
        (5, 23, 6, True, None, 3),  # a few decoding steps
        (8, 8, 64, True, [3], None),  # window wider than the sequence: full causal attention
        (9, 6, 3, True, None, 2),  # T > S: the first queries see nothing
    ],
)
@pytest.mark.parametrize("mask_kind", ["none", "padding", "float"])
def test_sliding_window_equals_math_with_banded_mask(
    T: int,
    S: int,
    window: int,
    is_causal: bool,
    global_tokens: list[int] | None,
    block_size: int | None,
    mask_kind: str,
) -> None:
    B, H, H_kv = 2, 4, 2
    q, k, v = _qkv(B, H, H_kv, T, S)
    mask = _mask(mask_kind, B, H, T, S)
    out = sliding_window_attention(
        q,
        k,
        v,
        window=window,
        global_tokens=global_tokens,
        mask=mask,
        is_causal=is_causal,
        block_size=block_size,
    )
    band = sliding_window_mask(
        T, S, window=window, is_causal=is_causal, global_tokens=global_tokens
    )
    if mask is None:
        dense: Tensor = band
    elif mask.dtype == torch.bool:
        dense = mask & band
    else:
        dense = mask.masked_fill(~band, -math.inf)
    ref = _math(q, k, v, mask=dense)
    _assert_same(out, ref, (q, k, v))


def test_sliding_window_mask_pattern() -> None:
    causal = sliding_window_mask(5, window=2, is_causal=True)
    assert causal.int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 1, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 0, 1, 1],
    ]
    both = sliding_window_mask(5, window=2, is_causal=False, global_tokens=[4])
    assert both.int().tolist() == [
        [1, 1, 0, 0, 1],
        [1, 1, 1, 0, 1],
        [0, 1, 1, 1, 1],
        [0, 0, 1, 1, 1],
        [1, 1, 1, 1, 1],
    ]


def test_sliding_window_backend_dense_mask_for_weights() -> None:
    """Weights of the windowed pattern come from the math path with the backend's dense mask."""
    backend = SlidingWindowAttention(window=3, global_tokens=[0])
    q, k, v = _qkv(1, 2, 2, 9, 9)
    dense = backend.dense_mask(9, is_causal=True)
    out, weights = scaled_dot_product_attention(q, k, v, mask=dense, return_weights=True)
    torch.testing.assert_close(backend(q, k, v, is_causal=True), out, atol=ATOL, rtol=0)
    assert torch.equal(weights > 0, dense.expand_as(weights))


def test_sliding_window_decoding_needs_only_the_last_window_keys() -> None:
    """What a sliding-window KV cache relies on: dropping keys older than the window is exact."""
    window = 6
    q, k, v = _qkv(1, 2, 2, 1, 20)
    full = sliding_window_attention(q, k, v, window=window, is_causal=True)
    kept = sliding_window_attention(
        q, k[:, :, -window:], v[:, :, -window:], window=window, is_causal=True
    )
    torch.testing.assert_close(full, kept, atol=ATOL, rtol=0)


def test_sliding_window_fully_masked_rows_and_dropout() -> None:
    q, k, v = _qkv(1, 2, 2, 10, 10)
    mask = torch.ones(10, 10, dtype=torch.bool)
    mask[4] = False
    out = sliding_window_attention(q, k, v, window=3, mask=mask, is_causal=True)
    assert torch.equal(out[:, :, 4], torch.zeros_like(out[:, :, 4]))
    torch.manual_seed(0)
    dropped = sliding_window_attention(q, k, v, window=3, is_causal=True, dropout_p=0.5)
    assert torch.isfinite(dropped).all()
    assert not torch.allclose(dropped, sliding_window_attention(q, k, v, window=3, is_causal=True))


# ---------------------------------------------------------------- linear == its quadratic form


def _linear_quadratic(
    q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, is_causal: bool, **feat: Any
) -> Tensor:
    """φ(Q)φ(K)ᵀ (masked), normalised by its row sums, times V: built naively as T x S."""
    H, T, S = q.shape[1], q.shape[2], k.shape[2]
    key_keep = None if keep is None else keep.reshape(keep.shape[0], 1, S)
    phi_q, phi_k = linear_attention_features(q, k, key_keep=key_keep, **feat)
    rep = H // k.shape[1]
    a = phi_q @ repeat_kv(phi_k, rep).transpose(-2, -1)  # (B, H, T, S)
    if is_causal:
        a = a * causal_mask(T, S)
    den = a.sum(dim=-1, keepdim=True)
    out = (a / torch.where(den > 0, den, 1.0)) @ repeat_kv(v, rep)
    return out.to(q.dtype)


@pytest.mark.parametrize("feature_map", ["elu", "favor"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize(("T", "S", "padded"), [(13, 13, False), (13, 13, True), (5, 19, True)])
def test_linear_equals_its_quadratic_form(
    feature_map: str, is_causal: bool, T: int, S: int, padded: bool
) -> None:
    B, H, H_kv = 2, 4, 2
    q, k, v = _qkv(B, H, H_kv, T, S, dtype=torch.float64)
    keep = _mask("padding", B, H, T, S) if padded else None
    proj = favor_projection(8, 32, seed=3, dtype=torch.float64) if feature_map == "favor" else None
    feat: dict[str, Any] = {"feature_map": feature_map, "projection": proj}
    out = linear_attention(q, k, v, mask=keep, is_causal=is_causal, chunk_size=4, **feat)
    ref = _linear_quadratic(q, k, v, keep, is_causal, **feat)
    _assert_same(out, ref, (q, k, v), atol=1e-10)


def test_linear_causal_t_greater_than_s_and_float_padding_mask() -> None:
    q, k, v = _qkv(1, 2, 1, 9, 4, dtype=torch.float64)
    out = linear_attention(q, k, v, is_causal=True, chunk_size=2)
    ref = _linear_quadratic(q, k, v, None, True)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)
    assert torch.equal(out[:, :, :5], torch.zeros_like(out[:, :, :5]))  # nothing to attend to
    keep = torch.tensor([True, False, True, True]).view(1, 1, 1, 4)
    additive = torch.zeros(1, 1, 1, 4, dtype=torch.float64).masked_fill(~keep, -math.inf)
    torch.testing.assert_close(
        linear_attention(q, k, v, mask=keep), linear_attention(q, k, v, mask=additive)
    )


def test_favor_features_approximate_softmax_attention() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=g) * s for s in (0.5, 0.5, 1.0))
    backend = LinearAttention(feature_map="favor", n_features=2048, seed=0)
    err = (backend(q, k, v) - _math(q, k, v)).abs().mean()
    assert err < 0.02, err
    proj = backend.projection(16, q.device)
    assert proj is not None and proj is backend.projection(16, q.device)  # drawn once, cached
    again = LinearAttention(feature_map="favor", n_features=2048, seed=0).projection(16, q.device)
    assert again is not None and torch.equal(proj, again)  # seeded


# ---------------------------------------------------------------- registry, module, errors


@pytest.mark.parametrize("name", ["chunked", "sliding_window", "linear"])
def test_backends_registered_and_usable_in_multihead_attention(name: str) -> None:
    assert name in ATTENTION_BACKENDS
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, n_kv_heads=2, backend=name)
    x = torch.randn(2, 10, 32)
    out, _ = mha(x, is_causal=True)
    assert out.shape == (2, 10, 32)
    if name != "linear":  # exact backends: the default window (256) covers all 10 tokens
        mha_math = MultiHeadAttention(32, 4, n_kv_heads=2, backend="math")
        mha_math.load_state_dict(mha.state_dict())
        torch.testing.assert_close(out, mha_math(x, is_causal=True)[0], atol=ATOL, rtol=0)


def test_get_attention_backend_with_options() -> None:
    sw = get_attention_backend("sliding_window", window=3, global_tokens=[0])
    assert isinstance(sw, SlidingWindowAttention) and sw.window == 3
    assert sw.global_tokens == (0,)
    ch = get_attention_backend("chunked", block_q=8, block_k=16)
    assert isinstance(ch, ChunkedAttention) and (ch.block_q, ch.block_k) == (8, 16)
    lin = get_attention_backend("linear", feature_map="favor", n_features=16)
    assert isinstance(lin, LinearAttention) and lin.feature_map == "favor"
    # None-valued options are dropped, so models can always pass window=config.attn_window.
    assert get_attention_backend("math", window=None) is ATTENTION_BACKENDS.get("math")
    with pytest.raises(ValueError, match="takes no options"):
        get_attention_backend("math", window=4)
    with pytest.raises(ValueError, match="valid"):
        get_attention_backend("nope", window=4)
    with pytest.raises(ValueError, match="callable"):
        get_attention_backend(sw, window=4)
    with pytest.raises(TypeError):
        get_attention_backend("sliding_window", windw=4)


def test_bad_inputs_raise_clear_errors() -> None:
    q, k, v = _qkv(1, 2, 2, 6, 6)
    with pytest.raises(ValueError, match="window"):
        SlidingWindowAttention(window=0)
    with pytest.raises(ValueError, match="window"):
        sliding_window_attention(q, k, v, window=-1)
    with pytest.raises(ValueError, match="global_tokens"):
        SlidingWindowAttention(window=4, global_tokens=[-1])
    with pytest.raises(ValueError, match="block"):
        ChunkedAttention(block_q=0)
    with pytest.raises(ValueError, match="feature_map"):
        LinearAttention(feature_map="relu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="key-padding"):
        linear_attention(q, k, v, mask=causal_mask(6))
    with pytest.raises(ValueError, match="biases"):
        linear_attention(q, k, v, mask=torch.randn(1, 1, 1, 6))
    with pytest.raises(ValueError, match="projection"):
        linear_attention(q, k, v, feature_map="favor")
    for backend in ("chunked", "sliding_window", "linear"):
        fn = ATTENTION_BACKENDS.get(backend)
        with pytest.raises(ValueError, match="multiple"):
            fn(torch.randn(1, 3, 6, 8), k, v)  # 3 query heads cannot share 2 kv heads
        with pytest.raises(ValueError, match="dropout_p"):
            fn(q, k, v, dropout_p=1.0)
        with pytest.raises(ValueError, match="broadcast"):
            fn(q, k, v, mask=torch.ones(5, 6, dtype=torch.bool))


# ---------------------------------------------------------------- no n x n buffers


class _LargestBuffer:
    """Record the largest storage any op creates (views share storage, so expand is free)."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        outer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(
                self, func: Any, types: Any, args: Any = (), kwargs: Any = None
            ) -> Any:
                out = func(*args, **(kwargs or {}))
                for t in tree_flatten(out)[0]:
                    if isinstance(t, Tensor):
                        outer.largest = max(outer.largest, t.untyped_storage().nbytes())
                return out

        self.largest = 0
        self.mode = Mode()


@pytest.mark.parametrize(
    ("backend", "n"),
    [
        (SlidingWindowAttention(window=32), 4096),
        (LinearAttention(chunk_size=32), 4096),
        (ChunkedAttention(block_q=128, block_k=128), 1024),
    ],
)
def test_no_quadratic_buffers(backend: Any, n: int) -> None:
    """Forward and backward never allocate anything close to the n x n score matrix."""
    H, D = 2, 8
    q, k, v = _qkv(1, H, H, n, n, D=D)
    probe = _LargestBuffer()
    with probe.mode:
        out = backend(q, k, v, is_causal=True)
        out.sum().backward()
    scores_bytes = H * n * n * 4
    assert probe.largest > 0
    assert probe.largest < scores_bytes / 16, (probe.largest, scores_bytes)
