"""Numerical edge cases of the attention stack, every backend.

- very large logits (scores at the dtype's max, both signs), including a masked key whose score
  would cancel an additive ``finfo.min`` fill;
- float16/bfloat16 masking: additive fills never overflow to -inf/NaN, models run in half;
- empty sequences: ``T = 0`` gives an empty output, ``S = 0`` zeros (no key to attend to), both
  differentiable, in every backend and in ``MultiHeadAttention``;
- length-1 sequences; ``T != S`` causal alignment (bottom-right) in every backend;
- RoPE at positions far beyond the trained context (finite, norm-preserving, still relative);
- ALiBi with many heads (96, 100: not powers of two) against the paper's reference code.

The behaviour these tests pin down is written up in ``docs/validation.md`` ("Numerical edge
cases").
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import Tensor

from attnlab import BERTConfig, GPTConfig, TransformerConfig, build_model
from attnlab.layers import (
    ALiBi,
    MultiHeadAttention,
    RotaryEmbedding,
    SlidingWindowAttention,
    alibi_slopes,
    combine_masks,
    get_attention_backend,
    scaled_dot_product_attention,
    to_additive,
)
from attnlab.layers.masks import causal_mask

BACKENDS = ["math", "sdpa", "chunked", "sliding_window", "linear"]
SOFTMAX_BACKENDS = ["math", "sdpa", "chunked", "sliding_window"]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _backend(name: str, window: int = 1024) -> Any:
    """The registered backend; sliding windows wide enough to cover every key (exact)."""
    if name == "sliding_window":
        return SlidingWindowAttention(window=window, block_size=4)
    return get_attention_backend(name)


def _grads(out: Tensor, inputs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    grads = torch.autograd.grad(out.float().square().sum(), inputs, allow_unused=True)
    return tuple(
        torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads, strict=True)
    )


# ---------------------------------------------------------------------------- large logits


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", SOFTMAX_BACKENDS)
def test_scores_at_the_dtype_max_give_one_hot_weights(name: str, dtype: torch.dtype) -> None:
    """Scores of +max, -max and max/2 in one row: the softmax is one-hot on the largest, the
    output is finite and exact, gradients finite (zero through a saturated softmax)."""
    big = torch.finfo(dtype).max
    q = torch.ones(1, 1, 2, 1, dtype=dtype, requires_grad=True)
    k = torch.tensor([big, -big, big / 2], dtype=dtype).view(1, 1, 3, 1).requires_grad_()
    v = torch.tensor([1.0, 2.0, 3.0], dtype=dtype).view(1, 1, 3, 1).requires_grad_()
    out = _backend(name)(q, k, v, scale=1.0)
    assert out.dtype == dtype and torch.equal(out, torch.ones_like(out))
    for g in _grads(out, (q, k, v)):
        assert torch.isfinite(g).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", SOFTMAX_BACKENDS)
@pytest.mark.parametrize("fill", ["min", "-inf", "bool"])
def test_masked_key_at_the_dtype_max_stays_masked(name: str, dtype: torch.dtype, fill: str) -> None:
    """A masked key whose score is the dtype's max: ``max + finfo.min == 0`` would let it through
    if the fill were only added (a bug the sdpa wrapper had); it must get zero weight."""
    info = torch.finfo(dtype)
    q = torch.ones(1, 1, 1, 1, dtype=dtype)
    k = torch.tensor([info.max, 0.0], dtype=dtype).view(1, 1, 2, 1)
    v = torch.tensor([100.0, 1.0], dtype=dtype).view(1, 1, 2, 1)
    keep = torch.tensor([False, True])
    mask = keep if fill == "bool" else to_additive(keep, dtype)
    if fill == "-inf":
        mask = mask.masked_fill(~keep, -math.inf)
    out = _backend(name)(q, k, v, mask=mask, scale=1.0)
    assert torch.equal(out, torch.ones_like(out))


def test_linear_attention_with_huge_inputs_is_finite() -> None:
    """elu features of 1e19-sized inputs overflow float32 sums unless normalised (fixed)."""
    q = torch.full((1, 1, 2, 1), 1e19, requires_grad=True)
    k = torch.tensor([3e19, -3e19, 1e19]).view(1, 1, 3, 1).requires_grad_()
    v = torch.tensor([1.0, 2.0, 3.0]).view(1, 1, 3, 1).requires_grad_()
    for causal in (False, True):
        out = get_attention_backend("linear")(q, k, v, is_causal=causal)
        # weights ∝ φ(q)·φ(k) = [3, ~0, 1] · 1e38 for every query that sees all keys.
        torch.testing.assert_close(out[0, 0, -1], torch.tensor([1.5]))
        assert all(torch.isfinite(g).all() for g in _grads(out, (q, k, v)))


@pytest.mark.parametrize("name", BACKENDS)
def test_large_half_precision_logits_stay_finite_and_close(name: str) -> None:
    """fp16 q·k products far beyond fp16's max (scores computed in float32 internally)."""
    g = torch.Generator().manual_seed(0)
    q = (torch.randn(1, 2, 6, 16, generator=g) * 60).half()
    k = (torch.randn(1, 2, 6, 16, generator=g) * 60).half()
    v = torch.randn(1, 2, 6, 16, generator=g).half()
    out = _backend(name)(q, k, v, is_causal=True)
    assert torch.isfinite(out).all()
    if name != "linear":
        ref = scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


# ---------------------------------------------------------------------------- half masking


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_additive_masks_never_overflow(dtype: torch.dtype) -> None:
    """Fills at finfo.min added together, plus ALiBi biases beyond the dtype's range, clamp at
    finfo.min instead of reaching -inf; a fully masked row is still recognised."""
    T = 5
    causal = to_additive(causal_mask(T), dtype)  # (T, T) 0 / finfo.min
    pad = to_additive(torch.tensor([True, True, False, True, False]), dtype)  # (S,)
    far = torch.arange(T, dtype=torch.float32) * 1e5  # positions 1e5 apart
    alibi = ALiBi(4).score_bias(far, far).to(dtype)  # (H, T, T): -1e5·m overflows fp16 -> -inf
    mask = combine_masks(causal, pad, alibi, causal)
    assert mask is not None and mask.dtype == dtype
    assert not torch.isinf(mask).any() and not torch.isnan(mask).any()
    assert (mask >= torch.finfo(dtype).min).all()
    q = torch.randn(1, 4, T, 8).to(dtype)
    k, v = torch.randn(2, 1, 4, T, 8).to(dtype)
    dead_row = torch.zeros(T, dtype=torch.bool)
    mask[..., 3, :] = torch.finfo(dtype).min  # a query that may attend to nothing
    dead_row[3] = True
    for name in SOFTMAX_BACKENDS:
        out = _backend(name)(q, k, v, mask=mask)
        assert torch.isfinite(out).all(), name
        assert torch.equal(out[..., 3, :], torch.zeros_like(out[..., 3, :])), name
        # Upcast, finfo(dtype).min is only a bias: the masked entries must become -inf.
        ref_mask = mask.float().masked_fill(mask <= torch.finfo(dtype).min, -math.inf)
        ref = scaled_dot_product_attention(q.float(), k.float(), v.float(), mask=ref_mask)
        torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("pos_encoding", ["alibi", "rope", "learned"])
def test_gpt_in_half_precision_with_padding_is_finite(
    dtype: torch.dtype, pos_encoding: str
) -> None:
    config = GPTConfig(
        vocab_size=40, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=16,
        dropout=0.0, pos_encoding=pos_encoding, eos_id=None,
    )  # fmt: skip
    model = build_model(config).eval().to(dtype)
    ids = torch.randint(0, 40, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, :4] = False  # left padding
    with torch.no_grad():
        logits, _ = model(ids, mask=mask)
        ref, _ = model.float()(ids, mask=mask)
    assert logits.dtype == dtype and torch.isfinite(logits).all()
    torch.testing.assert_close(logits.float()[1, 4:], ref[1, 4:], atol=0.1, rtol=0.1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_multihead_attention_in_half_precision_with_masked_rows(dtype: torch.dtype) -> None:
    mha = MultiHeadAttention(16, 4, n_kv_heads=2, backend="sdpa").eval().to(dtype)
    x = torch.randn(2, 5, 16).to(dtype)
    keep = torch.rand(2, 1, 5, 5) > 0.4
    keep[0, 0, 2] = False
    with torch.no_grad():
        for backend in SOFTMAX_BACKENDS:
            mha.backend = _backend(backend)
            out, _ = mha(x, mask=keep)
            assert torch.isfinite(out).all(), backend
        _, weights = mha(x, mask=keep, need_weights=True)
    assert weights is not None and torch.equal(weights[0, :, 2], torch.zeros_like(weights[0, :, 2]))


# ---------------------------------------------------------------------------- empty sequences


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize(("T", "S"), [(0, 0), (0, 5), (5, 0)])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_empty_sequences(name: str, T: int, S: int, mask_kind: str, is_causal: bool) -> None:
    """T = 0: an empty (B, H, 0, Dv) output. S = 0: zeros (nothing to attend to), as for a fully
    masked row. Both are differentiable (zero gradients) in every backend."""
    B, H, H_kv, D, Dv = 2, 4, 2, 8, 6
    q = torch.randn(B, H, T, D, requires_grad=True)
    k = torch.randn(B, H_kv, S, D, requires_grad=True)
    v = torch.randn(B, H_kv, S, Dv, requires_grad=True)
    mask: Tensor | None = None
    if mask_kind != "none":
        mask = torch.ones(B, 1, 1, S, dtype=torch.bool)  # key padding: every backend takes it
        if mask_kind == "float":
            mask = to_additive(mask, torch.float32)
    out = _backend(name)(q, k, v, mask=mask, is_causal=is_causal)
    assert out.shape == (B, H, T, Dv) and out.dtype == q.dtype
    assert torch.equal(out, torch.zeros_like(out))
    for x, g in zip((q, k, v), _grads(out, (q, k, v)), strict=True):
        assert g.shape == x.shape and torch.equal(g, torch.zeros_like(g))


@pytest.mark.parametrize("name", BACKENDS)
def test_multihead_attention_with_empty_inputs(name: str) -> None:
    mha = MultiHeadAttention(16, 4, backend=_backend(name)).eval()
    out, _ = mha(torch.randn(2, 0, 16))
    assert out.shape == (2, 0, 16)
    out, _ = mha(torch.randn(2, 3, 16), torch.randn(2, 0, 16))  # cross-attention to no memory
    torch.testing.assert_close(out, mha.out_proj.bias.expand(2, 3, 16))  # zeros through W^O


def test_models_with_empty_sequences() -> None:
    """GPT and the encoder-decoder accept T = 0 (empty logits) and S = 0 (a decoder that
    attends to no memory); BERT needs [CLS] and rejects T = 0 (see docs/validation.md)."""
    gpt = build_model(
        GPTConfig(
            vocab_size=30, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=8, eos_id=None
        )
    ).eval()
    logits, _ = gpt(torch.zeros(2, 0, dtype=torch.long))
    assert logits.shape == (2, 0, 30)
    tr = build_model(
        TransformerConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=1, d_ff=32)
    ).eval()
    logits, _ = tr(torch.zeros(2, 0, dtype=torch.long), torch.ones(2, 3, dtype=torch.long))
    assert logits.shape == (2, 3, 30) and torch.isfinite(logits).all()
    bert = build_model(BERTConfig(vocab_size=110, d_model=16, n_heads=2, n_layers=1, d_ff=32))
    with pytest.raises(ValueError, match=r"at least one token"):
        bert(torch.zeros(2, 0, dtype=torch.long))


# ---------------------------------------------------------------------------- length 1, T != S


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("is_causal", [False, True])
def test_length_one_attends_to_its_only_key(name: str, is_causal: bool) -> None:
    q, k = torch.randn(2, 4, 1, 8), torch.randn(2, 2, 1, 8)
    v = torch.randn(2, 2, 1, 5)
    out = _backend(name)(q, k, v, is_causal=is_causal)
    torch.testing.assert_close(out, v.repeat_interleave(2, dim=1), atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", BACKENDS)
def test_single_query_decoding_sees_every_key(name: str) -> None:
    """T = 1 < S with is_causal: bottom-right alignment puts the query last, so it sees all."""
    q, k, v = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    b = _backend(name)
    torch.testing.assert_close(b(q, k, v, is_causal=True), b(q, k, v), atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize(("T", "S"), [(3, 8), (8, 3), (1, 6), (6, 1), (5, 5)])
def test_causal_alignment_is_bottom_right(name: str, T: int, S: int) -> None:
    """With one-hot values (v_j = e_j) the output row of query i is its weight row: positive
    exactly on keys j <= i + S - T (rows with no such key are zero), in every backend."""
    q = torch.randn(1, 1, T, 4, dtype=torch.float64)
    k = torch.randn(1, 1, S, 4, dtype=torch.float64)
    v = torch.eye(S, dtype=torch.float64).view(1, 1, S, S)
    out = _backend(name)(q, k, v, is_causal=True)[0, 0]  # (T, S): the weights
    allowed = torch.arange(S).view(1, S) <= torch.arange(T).view(T, 1) + (S - T)
    assert torch.equal(out > 0, allowed)
    assert torch.equal(out[~allowed], torch.zeros_like(out[~allowed]))
    rows = allowed.any(dim=1)
    torch.testing.assert_close(out.sum(dim=1)[rows], torch.ones_like(out.sum(dim=1)[rows]))


# ---------------------------------------------------------------------------- RoPE far away


@pytest.mark.parametrize("scaling", ["none", "linear", "ntk", "dynamic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_far_beyond_the_trained_context(scaling: str, dtype: torch.dtype) -> None:
    """Positions up to 2^31 - 1 (trained context 2048): angles are computed in float64, so the
    rotated vectors are finite, keep their norms, and scores still depend on m - n only."""
    rope = RotaryEmbedding(64, max_seq_len=2048, scaling=scaling, factor=4.0)  # type: ignore[arg-type]
    x = torch.randn(1, 2, 1, 64, dtype=torch.float64)
    y = torch.randn(1, 2, 1, 64, dtype=torch.float64)
    pos = torch.tensor([0, 2047, 10**4, 10**6, 10**8, 2**31 - 1])
    rx = rope.rotate(x.expand(1, 2, len(pos), 64).to(dtype), pos)
    assert rx.dtype == dtype and torch.isfinite(rx).all()
    tol = 1e-12 if dtype == torch.float64 else (1e-5 if dtype == torch.float32 else 1e-2)
    torch.testing.assert_close(
        rx.double().norm(dim=-1), x.to(dtype).double().norm(dim=-1).expand(1, 2, len(pos)),
        atol=0, rtol=tol * 10,
    )  # fmt: skip
    if scaling == "dynamic":
        return  # the base depends on the longest position: not relative across calls
    for m, n in [(10**6 + 7, 10**6), (10**8 + 3, 10**8 + 40), (2**31 - 1, 2**31 - 9)]:
        far = _rope_score(rope, x, y, m, n)
        near = _rope_score(rope, x, y, m - n + 100, 100)
        torch.testing.assert_close(far, near, atol=1e-6, rtol=1e-6)


def _rope_score(rope: RotaryEmbedding, x: Tensor, y: Tensor, m: int, n: int) -> Tensor:
    qm = rope.rotate(x, torch.tensor([m]))
    kn = rope.rotate(y, torch.tensor([n]))
    return (qm * kn).sum(-1)


@pytest.mark.parametrize("pos_encoding", ["rope", "alibi", "sinusoidal"])
def test_gpt_runs_past_max_seq_len_without_a_learned_table(pos_encoding: str) -> None:
    """Encodings defined for any position accept sequences past ``max_seq_len`` (the learned
    table rejects them: see docs/validation.md); logits stay finite."""
    config = GPTConfig(
        vocab_size=30, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=8,
        pos_encoding=pos_encoding, eos_id=None,
    )  # fmt: skip
    model = build_model(config).eval()
    with torch.no_grad():
        logits, _ = model(torch.randint(0, 30, (1, 64)))
    assert logits.shape == (1, 64, 30) and torch.isfinite(logits).all()


# ---------------------------------------------------------------------------- ALiBi, many heads


def _reference_slopes(n: int) -> list[float]:
    """``get_slopes`` of the ALiBi authors' reference code (Press et al., 2022)."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + _reference_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("n", [1, 3, 5, 12, 24, 80, 96, 100, 128, 255])
def test_alibi_slopes_for_many_heads_match_the_reference(n: int) -> None:
    slopes = alibi_slopes(n)
    assert slopes.shape == (n,) and torch.isfinite(slopes).all()
    assert ((slopes > 0) & (slopes < 1)).all() and len(set(slopes.tolist())) == n
    assert slopes.tolist() == pytest.approx(_reference_slopes(n), rel=1e-6)


def test_alibi_96_heads_far_positions_and_every_backend() -> None:
    """96 heads (not a power of two), distances up to 10^6: the bias is finite in float32, and
    every softmax backend agrees with math on an ALiBi-biased causal attention."""
    alibi = ALiBi(96)
    bias = alibi.score_bias(torch.tensor([10**6]), torch.arange(0, 10**6 + 1, 1000))
    assert bias.shape == (96, 1, 1001) and torch.isfinite(bias).all()
    assert (bias <= 0).all() and bias[:, 0, -1].eq(0).all()  # distance 0: no bias
    T = 12
    pos = torch.arange(T) * 50
    mask = alibi.score_bias(pos, pos)  # (H, T, T)
    q, k, v = torch.randn(3, 1, 96, T, 4, dtype=torch.float64)
    ref = scaled_dot_product_attention(q, k, v, mask=mask, is_causal=True)
    for name in SOFTMAX_BACKENDS:
        out = _backend(name)(q, k, v, mask=mask, is_causal=True)
        torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)


def test_gpt_with_96_alibi_heads() -> None:
    config = GPTConfig(
        vocab_size=30, d_model=192, n_heads=96, n_layers=1, d_ff=64, max_seq_len=8,
        pos_encoding="alibi", dropout=0.0, eos_id=None,
    )  # fmt: skip
    model = build_model(config).eval()
    ids = torch.randint(0, 30, (1, 40))
    with torch.no_grad():
        logits, _ = model(ids)
        # Causality survives the bias: a prefix gives the same logits.
        prefix, _ = model(ids[:, :17])
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(prefix, logits[:, :17], atol=1e-5, rtol=1e-5)
