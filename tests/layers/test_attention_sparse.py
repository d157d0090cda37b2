"""Sparse attention backends: Sparse Transformer (strided, fixed), BigBird, Reformer LSH.

Reference: the math path under each backend's own pattern given as a dense boolean mask (for LSH,
the pattern its buckets define, with its shared-QK keys). Exact to float rounding, causal and
not, with padding, GQA, lengths that are no multiple of the block, cached-decoding shapes
(T < S), additive masks; plus gradients, fully masked rows, non-finite inputs, bad options, the
number of scores built and the largest buffer (no T x S tensor).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

from attnlab import GPTConfig, build_model
from attnlab.layers import (
    BigBirdAttention,
    FixedAttention,
    LSHAttention,
    MultiHeadAttention,
    StridedAttention,
    get_attention_backend,
)
from attnlab.layers.attention import repeat_kv, scaled_dot_product_attention
from attnlab.layers.attention_bigbird import bigbird_mask, random_blocks
from attnlab.layers.attention_lsh import lsh_buckets, lsh_keys, lsh_mask
from attnlab.layers.attention_sparse import fixed_mask, strided_mask

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

B, H, H_KV, D = 2, 4, 2, 8

# name -> a backend with small blocks (lengths below are several blocks, and no multiple of them)
FIXED_PATTERNS: dict[str, Callable[[], Any]] = {
    "sparse_strided": lambda: StridedAttention(block=5),
    "sparse_fixed": lambda: FixedAttention(block=6, summary=2),
    "bigbird": lambda: BigBirdAttention(
        4, window_blocks=3, global_blocks=1, random_blocks=2, seed=3
    ),
}
SHAPES = [(37, 37), (1, 37), (9, 37), (4, 4)]  # self-attention, decoding, a query block, tiny


def _qkv(T: int, S: int, dtype: torch.dtype, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=g, dtype=dtype)
    k = torch.randn(B, H_KV, S, D, generator=g, dtype=dtype)
    v = torch.randn(B, H_KV, S, D + 2, generator=g, dtype=dtype)  # Dv != D
    return q, k, v


def _padding(S: int) -> Tensor:
    pad = torch.ones(B, 1, 1, S, dtype=torch.bool)  # (B, 1, 1, S)
    pad[1, ..., -3:] = False  # the second sequence has 3 padded keys
    return pad


TOL = {torch.float64: 1e-10, torch.float32: 1e-5}
PATTERN_CASES = list(itertools.product(FIXED_PATTERNS, SHAPES, [False, True]))
LSH_CASES = list(itertools.product([1, 23, 40], [False, True], [4, 7]))  # T, causal, chunk


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("name", "shape", "causal"), PATTERN_CASES)
def test_fixed_patterns_equal_math_under_their_dense_mask(
    name: str, shape: tuple[int, int], causal: bool, dtype: torch.dtype
) -> None:
    T, S = shape
    backend = FIXED_PATTERNS[name]()
    q, k, v = _qkv(T, S, dtype)
    pad = _padding(S)
    out = backend(q, k, v, mask=pad, is_causal=causal)
    pattern = backend.dense_mask(T, S, is_causal=causal)  # (T, S)
    ref = scaled_dot_product_attention(q, k, v, mask=pattern & pad)
    assert isinstance(ref, Tensor) and out.shape == ref.shape == (B, H, T, D + 2)
    torch.testing.assert_close(out, ref, atol=TOL[dtype], rtol=0)
    if causal and T == S:  # the sparse pattern really is sparse here, and still causal
        assert not pattern.all() and not pattern.triu(1).any()


@pytest.mark.parametrize("name", FIXED_PATTERNS)
def test_additive_float_mask_and_gradients_match_the_dense_path(name: str) -> None:
    T = S = 29
    backend = FIXED_PATTERNS[name]()
    q, k, v = (t.requires_grad_() for t in _qkv(T, S, torch.float64, seed=1))
    bias = torch.randn(1, H, T, S, dtype=torch.float64)  # (1, H, T, S): a per-head score bias
    bias[..., 3] = torch.finfo(torch.float64).min  # key 3 masked by the fill value
    out = backend(q, k, v, mask=bias, is_causal=True)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    pattern = backend.dense_mask(T, S, is_causal=True)
    ref_mask = bias.masked_fill(~pattern, torch.finfo(torch.float64).min)
    ref = scaled_dot_product_attention(q, k, v, mask=ref_mask)
    assert isinstance(ref, Tensor)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)
    for got, want in zip(grads, ref_grads, strict=True):
        assert want.abs().sum() > 0
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", [*FIXED_PATTERNS, "lsh"])
def test_fully_masked_rows_give_zeros_and_finite_gradients(name: str) -> None:
    T = S = 21
    backend = FIXED_PATTERNS[name]() if name != "lsh" else LSHAttention(4, 4, seed=1)
    q, k, v = (t.requires_grad_() for t in _qkv(T, S, torch.float32))
    mask = torch.ones(T, S, dtype=torch.bool)
    mask[[0, 7, 20]] = False  # three queries that may attend to nothing
    out = backend(q, k, v, mask=mask, is_causal=False)
    assert out[:, :, [0, 7, 20]].eq(0).all()
    assert out[:, :, [1, 2, 8]].abs().sum() > 0
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
    if name != "lsh":  # (lsh: query 0 is also a key of the others, shared QK)
        assert q.grad[:, :, 0].eq(0).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("T", "causal", "chunk"), LSH_CASES)
def test_lsh_equals_math_under_the_mask_its_buckets_define(
    T: int, causal: bool, chunk: int, dtype: torch.dtype
) -> None:
    backend = get_attention_backend("lsh", n_buckets=4, chunk_size=chunk, seed=5)
    q, k, v = _qkv(T, T, dtype, seed=2)
    pad = _padding(T) if T > 3 else None
    out = backend(q, k, v, mask=pad, is_causal=causal)
    pattern = backend.pattern(q, is_causal=causal)  # (B, H, T, T)
    mask = pattern if pad is None else pattern & pad
    ref = scaled_dot_product_attention(q, lsh_keys(q), repeat_kv(v, H // H_KV), mask=mask)
    torch.testing.assert_close(out, ref, atol=TOL[dtype], rtol=0)
    assert out.shape == (B, H, T, D + 2)


def test_lsh_pattern_is_buckets_chunks_and_self_only_when_alone() -> None:
    T, c = 40, 5
    q = torch.randn(1, 2, T, D, generator=torch.Generator().manual_seed(3))
    buckets = lsh_buckets(q, n_buckets=4, seed=0)  # (1, 2, T)
    pattern = lsh_mask(q, n_buckets=4, chunk_size=c, seed=0, is_causal=True)  # (1, 2, T, T)
    assert buckets.min() >= 0 and buckets.max() < 4 and len(buckets.unique()) > 1
    same = buckets.unsqueeze(-1) == buckets.unsqueeze(-2)
    assert not (pattern & ~same).any()  # only within a bucket
    assert not pattern.triu(1).any()  # causal
    assert pattern.sum(-1).max() <= 2 * c  # at most the own and the previous chunk
    assert pattern.any(-1).all()  # every query attends to something (itself when alone)
    diag = pattern.diagonal(dim1=-2, dim2=-1)
    others = (pattern & ~torch.eye(T, dtype=torch.bool)).any(-1)
    assert torch.equal(diag, ~others)  # itself exactly when nothing else
    again = lsh_mask(q, n_buckets=4, chunk_size=c, seed=0, is_causal=True)
    assert torch.equal(pattern, again)
    assert not torch.equal(pattern, lsh_mask(q, n_buckets=4, chunk_size=c, seed=1, is_causal=True))


def test_lsh_gradients_match_the_dense_path_and_k_is_not_used() -> None:
    T = 30
    backend = LSHAttention(n_buckets=4, chunk_size=6, seed=2)
    q, k, v = (t.requires_grad_() for t in _qkv(T, T, torch.float64, seed=4))
    out = backend(q, k, v, is_causal=True)
    torch.testing.assert_close(out, backend(q, torch.zeros_like(k), v, is_causal=True))
    gq, gv = torch.autograd.grad(out.square().sum(), (q, v))
    pattern = backend.pattern(q, is_causal=True)
    ref = scaled_dot_product_attention(q, lsh_keys(q), repeat_kv(v, H // H_KV), mask=pattern)
    assert isinstance(ref, Tensor)
    rq, rv = torch.autograd.grad(ref.square().sum(), (q, v))
    torch.testing.assert_close(gq, rq, atol=1e-10, rtol=0)
    torch.testing.assert_close(gv, rv, atol=1e-10, rtol=0)


def test_lsh_gives_the_unused_key_projection_a_zero_gradient() -> None:
    """Shared QK leaves k_proj unused; it still gets a gradient (zeros), as DDP requires of
    every parameter, and the output is unchanged by the zero-weight tie."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, backend="lsh")
    x = torch.randn(2, 12, 16)
    out, _ = mha(x, is_causal=True)
    out.square().sum().backward()
    assert all(p.grad is not None for p in mha.parameters())
    assert mha.k_proj.weight.grad is not None and not mha.k_proj.weight.grad.any()
    assert mha.q_proj.weight.grad is not None and mha.q_proj.weight.grad.abs().sum() > 0
    with torch.no_grad():
        torch.testing.assert_close(mha(x, is_causal=True)[0], out.detach(), atol=0, rtol=0)


def test_lsh_refuses_cross_attention_and_attention_weights() -> None:
    q, k, v = _qkv(3, 7, torch.float32)
    with pytest.raises(ValueError, match=r"needs S == T, got T=3, S=7"):
        LSHAttention()(q, k, v)
    mha = MultiHeadAttention(16, 2, backend="lsh")
    x = torch.randn(1, 5, 16)
    with pytest.raises(ValueError, match="lsh backend's pattern depends on the queries"):
        mha(x, need_weights=True)


@pytest.mark.parametrize("name", FIXED_PATTERNS)
def test_weights_through_multihead_attention_use_the_pattern(name: str) -> None:
    backend = FIXED_PATTERNS[name]()
    mha = MultiHeadAttention(16, 2, backend=backend)
    x = torch.randn(1, 23, 16)
    out, weights = mha(x, is_causal=True, need_weights=True)
    fast, _ = mha(x, is_causal=True)
    assert weights is not None
    pattern = backend.dense_mask(23, 23, is_causal=True)
    assert weights[..., ~pattern].eq(0).all() and weights[..., pattern].gt(0).any()
    torch.testing.assert_close(out, fast, atol=1e-5, rtol=0)


def test_nonfinite_inputs_poison_exactly_the_rows_that_see_them() -> None:
    T = 40
    for name in FIXED_PATTERNS:
        backend = FIXED_PATTERNS[name]()
        q, k, v = _qkv(T, T, torch.float32)
        v[:, :, 9] = float("nan")
        out = backend(q, k, v, is_causal=True)
        sees = backend.dense_mask(T, T, is_causal=True)[:, 9]  # (T,) queries that see key 9
        assert sees.any() and (~sees).any()
        assert out[:, :, sees].isnan().all(), name
        # rows that cannot see it are exact, or NaN where a masked slot of their block holds it
        # (0 · NaN, allowed by the rule of attnlab.layers.attention); some are finite here
        finite = torch.isfinite(out).flatten(-1).all(-1).all(0).all(0)  # (T,)
        assert finite[~sees].any() and not finite[sees].any(), name
        clean = backend(q, k, v.nan_to_num(), is_causal=True)
        torch.testing.assert_close(out[:, :, finite], clean[:, :, finite])
    q, k, v = _qkv(T, T, torch.float32)
    q[0, 1, 4] = float("inf")
    out = LSHAttention(4, 5)(q, k, v)
    assert out[0, 1, 4].isnan().all()


@pytest.mark.parametrize("name", FIXED_PATTERNS)
def test_decoding_one_query_equals_the_last_row(name: str) -> None:
    """Bottom-right alignment: the last query alone (T = 1, S = n) is the full run's last row."""
    backend = FIXED_PATTERNS[name]()
    q, k, v = _qkv(31, 31, torch.float64)
    full = backend(q, k, v, is_causal=True)
    last = backend(q[:, :, -1:], k, v, is_causal=True)
    torch.testing.assert_close(last, full[:, :, -1:], atol=1e-12, rtol=0)


def test_bigbird_random_blocks_are_seeded_and_outside_window_and_globals() -> None:
    a = torch.arange(40)
    kw = {"window": 3, "global_blocks": 2, "random": 3, "is_causal": False}
    blocks, ok = random_blocks(a, 40, seed=7, **kw)  # (40, 3)
    again, _ = random_blocks(a, 40, seed=7, **kw)
    other, _ = random_blocks(a, 40, seed=8, **kw)
    assert torch.equal(blocks, again) and not torch.equal(blocks, other)
    assert ok.all() and (blocks >= 2).all() and ((blocks - a.unsqueeze(1)).abs() > 1).all()
    assert all(len(set(row.tolist())) == 3 for row in blocks)  # distinct blocks per query
    causal, ok_c = random_blocks(a, 40, seed=7, **{**kw, "is_causal": True})
    assert (causal[ok_c] < a.unsqueeze(1).expand_as(causal)[ok_c]).all()  # from the past
    assert not ok_c[:4].any() and ok_c[10:].all()  # too few earlier candidates at first
    m1 = bigbird_mask(64, block=4, seed=7)
    assert torch.equal(m1, bigbird_mask(64, block=4, seed=7))
    assert not torch.equal(m1, bigbird_mask(64, block=4, seed=8))
    assert m1[:8].all() and m1[:, :8].all()  # the two global blocks, rows and columns


def test_pattern_masks_match_the_papers_definitions() -> None:
    p = torch.arange(12).unsqueeze(1)
    j = torch.arange(12).unsqueeze(0)
    strided = strided_mask(12, block=3, is_causal=True)
    assert torch.equal(strided, (j <= p) & ((p - j < 3) | ((p - j) % 3 == 0)))
    fixed = fixed_mask(12, block=4, summary=1, is_causal=False)
    assert torch.equal(fixed, (j // 4 == p // 4) | (j % 4 == 3))
    assert strided_mask(5, 9, block=2, is_causal=True).shape == (5, 9)  # bottom-right
    assert torch.equal(strided_mask(5, 9, block=2), strided_mask(9, block=2)[4:])


@pytest.mark.parametrize(
    ("backend", "n"),
    [(StridedAttention(block=64), 4096), (FixedAttention(block=64), 4096),
     (BigBirdAttention(block=32), 8192), (LSHAttention(8, 32), 4096)],
)  # fmt: skip
def test_no_quadratic_buffers_and_the_score_count(backend: Any, n: int) -> None:
    """Forward and backward never allocate a T x S-sized buffer; the FLOPs of the products are
    those of the advertised number of scores."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.flop_counter import FlopCounterMode

    largest = 0

    class Probe(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                               ) -> Any:  # fmt: skip
            nonlocal largest
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, Tensor):
                    largest = max(largest, t.untyped_storage().nbytes())
            return out

    h, d = 1, 8
    q, k, v = (torch.randn(1, h, n, d, requires_grad=True) for _ in range(3))
    with Probe():
        out = backend(q, k, v, is_causal=True)
        out.sum().backward()
    scores_bytes = h * n * n * 4
    assert 0 < largest < scores_bytes / 16, (largest, scores_bytes)
    count = backend.score_count(n, is_causal=True)
    assert count < n * n / 4
    with torch.no_grad(), FlopCounterMode(display=False) as flops:
        backend(q, k, v, is_causal=True)
    # q·k per score, then weights·v: 2·d FLOPs each (global rows of BigBird: math path, same)
    hashing = 2 * n * d * backend.n_buckets // 2 if isinstance(backend, LSHAttention) else 0
    assert flops.get_total_flops() == 4 * d * h * count + h * hashing


def test_strided_scores_grow_as_n_sqrt_n() -> None:
    counts = {n: StridedAttention(block=int(n**0.5)).score_count(n, is_causal=True)
              for n in (1024, 4096, 16384)}  # fmt: skip
    for n in counts:
        assert counts[n] == n * (2 * int(n**0.5) + int(n**0.5))  # N·l·(2l + n/l) = 3·n·sqrt(n)
    assert counts[4096] == 8 * counts[1024] and counts[16384] == 8 * counts[4096]


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("sparse_strided", {"block": 0}, "block must be a positive integer, got 0"),
        ("sparse_strided", {"block": 2.5}, "block must be a positive integer, got 2.5"),
        ("sparse_fixed", {"block": 4, "summary": 5}, "summary must be at most block=4, got 5"),
        ("sparse_fixed", {"summary": 0}, "summary must be a positive integer, got 0"),
        ("bigbird", {"window_blocks": 2}, "window_blocks must be a positive odd integer, got 2"),
        ("bigbird", {"global_blocks": -1}, "global_blocks must be an integer >= 0, got -1"),
        ("bigbird", {"random_blocks": True}, "random_blocks must be an integer >= 0, got True"),
        ("bigbird", {"seed": -3}, "seed must be an integer >= 0, got -3"),
        ("lsh", {"n_buckets": 3}, "n_buckets must be an even integer >= 2, got 3"),
        ("lsh", {"chunk_size": 0}, "chunk_size must be a positive integer, got 0"),
    ],
)
def test_bad_options_name_the_value(name: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        get_attention_backend(name, **options)


def test_bad_calls_are_refused() -> None:
    q, k, v = _qkv(5, 5, torch.float32)
    for name in (*FIXED_PATTERNS, "lsh"):
        backend = get_attention_backend(name)
        with pytest.raises(ValueError, match="dropout_p must be in"):
            backend(q, k, v, dropout_p=1.5)
        with pytest.raises(ValueError, match="does not broadcast"):
            backend(q, k, v, mask=torch.ones(3, 5, dtype=torch.bool))


@pytest.mark.parametrize("name", [*FIXED_PATTERNS, "lsh"])
def test_a_gpt_trains_with_each_sparse_backend(name: str) -> None:
    cfg = GPTConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=80,
                    eos_id=None, attn_backend=name)  # fmt: skip
    model = build_model(cfg)
    ids = torch.randint(0, 30, (2, 80), generator=torch.Generator().manual_seed(0))
    logits, _ = model(ids)
    assert logits.shape == (2, 80, 30) and torch.isfinite(logits).all()
    logits.logsumexp(-1).mean().backward()
    assert model.lm_head.weight.grad is not None
    # causal: the first 40 positions do not depend on the last 40
    ids2 = ids.clone()
    ids2[:, 40:] = (ids2[:, 40:] + 1) % 30
    with torch.no_grad():
        model.eval()
        a, b = model(ids)[0], model(ids2)[0]
    if name != "lsh":  # lsh: later tokens' buckets move the chunk boundaries (its docstring)
        torch.testing.assert_close(a[:, :40], b[:, :40])


def test_the_attention_benchmark_runs_the_sparse_backends() -> None:
    """``attnlab bench attention``: default backends, per-n options (l = sqrt n), estimates."""
    from dataclasses import asdict

    from attnlab.analysis.attention_bench import (
        DEFAULT_BACKENDS,
        SPARSE_BACKENDS,
        BenchConfig,
        backend_options,
        estimate_peak_bytes,
        measure_case,
    )

    assert set(SPARSE_BACKENDS) <= set(DEFAULT_BACKENDS)
    config = BenchConfig(heads=1, d_head=8, repeats=1, warmup=0)
    assert backend_options("sparse_strided", 4096, config) == {"block": 64}
    assert backend_options("sparse_fixed", 16384, config) == {"block": 128}
    assert backend_options("sparse_strided", 4096, BenchConfig(sparse_block=32)) == {"block": 32}
    for name in SPARSE_BACKENDS:
        small, big = (estimate_peak_bytes(name, n, config, backward=False) for n in (16384, 65536))
        assert big < 16 * small / 2, name  # far from quadratic
        spec = {**asdict(config), "backend": name, "n": 96, "mode": "forward_backward"}
        result = measure_case(spec)
        assert result["time_s"] > 0 and result["peak_mem_bytes"] >= 0, name
    with pytest.raises(ValueError, match="sparse_block must be positive, got 0"):
        BenchConfig(sparse_block=0)


@pytest.mark.parametrize("name", [*FIXED_PATTERNS, "lsh"])
def test_bfloat16_and_dropout(name: str) -> None:
    backend = FIXED_PATTERNS[name]() if name != "lsh" else LSHAttention(4, 5)
    q, k, v = _qkv(26, 26, torch.float32)
    ref = backend(q, k, v, is_causal=True)
    half = backend(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), ref, atol=3e-2, rtol=3e-2)
    torch.manual_seed(0)
    dropped = backend(q, k, v, is_causal=True, dropout_p=0.5)
    assert torch.isfinite(dropped).all() and not torch.allclose(dropped, ref)
