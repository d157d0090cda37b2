"""Property-based tests (hypothesis) over the attention stack.

Random shapes ``(B, H, H_kv | H, T, S, D)`` (T and S from 0), random masks of every accepted
form (bool ``(B, H, T, S)``, ``(B, 1, 1, S)``, ``(T, S)``; additive float with biases and keys at
``finfo.min`` or ``-inf``), with forced fully masked query rows and key columns, ``is_causal``
with ``T != S``, float32 and float64 (bfloat16 and float16 in their own property, with looser
tolerances). Properties:

- the math path matches an independent float64 softmax formula, its outputs are finite, masked
  keys get *exactly* zero weight, rows with a key sum to one, and rows without one are zero;
- ``sdpa``, ``chunked`` (random tile sizes) and ``sliding_window`` (random window, global tokens
  and block size, against math with the equivalent dense mask) agree with math, forward and
  gradients;
- ``linear`` (key-padding masks only; elu and FAVOR+ features) agrees with its naive quadratic
  form written from the paper's formula;
- gradients of every backend are finite, fully masked rows included;
- in bfloat16/float16 every backend stays finite and close to float32 math.

Examples per CI run (``derandomize=True``, no example database, so CI is deterministic):
:data:`EXAMPLES` per test, **1100** in all. ``benchmarks/property_nightly.py`` runs the same
tests with ``ATTNLAB_PROPERTY_SCALE`` times as many examples and random seeds (see
``docs/validation.md``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor

from attnlab.layers import (
    ChunkedAttention,
    LinearAttention,
    SlidingWindowAttention,
    get_attention_backend,
    scaled_dot_product_attention,
)
from attnlab.layers.attention_linear import favor_projection
from attnlab.layers.masks import causal_mask, combine_masks

# Examples per property in CI; the nightly target multiplies them by ATTNLAB_PROPERTY_SCALE.
EXAMPLES: dict[str, int] = {
    "test_math_matches_naive_softmax_and_masks_exactly": 300,
    "test_exact_backends_agree_with_math": 300,
    "test_linear_agrees_with_its_naive_form": 150,
    "test_gradients_are_finite": 150,
    "test_half_precision_is_finite_and_close_to_float32": 200,
}
TOTAL_EXAMPLES = sum(EXAMPLES.values())
SCALE = int(os.environ.get("ATTNLAB_PROPERTY_SCALE", "1"))
NIGHTLY = SCALE > 1


def _settings(test: str) -> Callable[[Any], Any]:
    """CI: a fixed number of examples, derandomized, no database. Nightly: more, random seeds."""
    return settings(
        max_examples=EXAMPLES[test] * SCALE,
        derandomize=not NIGHTLY,
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


TOL = {torch.float64: 1e-10, torch.float32: 2e-5}

# ---------------------------------------------------------------------------- strategies


@dataclass
class Case:
    """One drawn attention problem."""

    q: Tensor  # (B, H, T, D)
    k: Tensor  # (B, H_kv, S, D)
    v: Tensor  # (B, H_kv, S, Dv)
    mask: Tensor | None  # broadcastable to (B, H, T, S)
    is_causal: bool
    keep: Tensor  # (B, H, T, S) bool: what the mask and causality allow

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        B, H, T, _ = self.q.shape
        return B, H, self.k.shape[1], T, self.k.shape[2]


MASK_KINDS = ("none", "bool_full", "bool_key", "bool_ts", "float_full", "float_key")
KEY_PADDING_KINDS = ("none", "bool_key", "float_key_plain")


def _make_mask(
    kind: str,
    shape: tuple[int, int, int, int],
    g: torch.Generator,
    p_keep: float,
    dead_rows: list[int],
    dead_cols: list[int],
    dtype: torch.dtype,
    fill: float,
) -> Tensor | None:
    """A mask of ``kind`` with ``dead_rows`` queries and ``dead_cols`` keys fully masked."""
    B, H, T, S = shape
    if kind == "none":
        return None
    mshape = {
        "bool_full": (B, H, T, S),
        "float_full": (B, H, T, S),
        "bool_ts": (T, S),
        "bool_key": (B, 1, 1, S),
        "float_key": (B, 1, 1, S),
        "float_key_plain": (B, 1, 1, S),
    }[kind]
    keep = torch.rand(mshape, generator=g) < p_keep
    if mshape[-2] == T:  # masks with a query dim can kill whole rows
        for r in dead_rows:
            keep[..., r, :] = False
    for c in dead_cols:
        keep[..., c] = False
    if kind.startswith("bool"):
        return keep
    bias = (
        torch.zeros(mshape, dtype=dtype)
        if kind == "float_key_plain"
        else torch.randn(mshape, generator=g, dtype=torch.float64).to(dtype)
    )
    return bias.masked_fill(~keep, fill)


@st.composite
def cases(
    draw: st.DrawFn,
    *,
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float64),
    mask_kinds: tuple[str, ...] = MASK_KINDS,
    min_len: int = 0,
    magnitudes: tuple[float, ...] = (0.1, 1.0, 4.0),
    requires_grad: bool = False,
) -> Case:
    B = draw(st.integers(1, 2))
    H_kv = draw(st.integers(1, 3))
    H = H_kv * draw(st.integers(1, 3))
    T = draw(st.integers(min_len, 9))
    S = draw(st.integers(min_len, 9))
    D = draw(st.integers(1, 8))
    Dv = draw(st.sampled_from([D, max(1, D - 1), D + 2]))
    dtype = draw(st.sampled_from(dtypes))
    is_causal = draw(st.booleans())
    kind = draw(st.sampled_from(mask_kinds))
    p_keep = draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))
    dead_rows = draw(st.lists(st.integers(0, T - 1), max_size=2)) if T else []
    dead_cols = draw(st.lists(st.integers(0, S - 1), max_size=2)) if S else []
    magnitude = draw(st.sampled_from(magnitudes))
    fill = draw(st.sampled_from(["min", "-inf"]))
    seed = draw(st.integers(0, 2**31 - 1))

    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, H, T, D, generator=g, dtype=torch.float64) * magnitude).to(dtype)
    k = (torch.randn(B, H_kv, S, D, generator=g, dtype=torch.float64) * magnitude).to(dtype)
    v = torch.randn(B, H_kv, S, Dv, generator=g, dtype=torch.float64).to(dtype)
    mask_dtype = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    fill_value = torch.finfo(mask_dtype).min if fill == "min" else -math.inf
    mask = _make_mask(kind, (B, H, T, S), g, p_keep, dead_rows, dead_cols, mask_dtype, fill_value)
    if requires_grad:
        q, k, v = (x.requires_grad_() for x in (q, k, v))
    return Case(q, k, v, mask, is_causal, _keep(mask, is_causal, (B, H, T, S)))


def _keep(mask: Tensor | None, is_causal: bool, shape: tuple[int, int, int, int]) -> Tensor:
    """``(B, H, T, S)`` bool: True where a query may attend a key."""
    keep = torch.ones(shape, dtype=torch.bool)
    if is_causal:
        keep = keep & causal_mask(shape[2], shape[3])
    if mask is not None:
        allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min
        keep = keep & allowed
    return keep


# ---------------------------------------------------------------------------- references


def _repeat(x: Tensor, H: int) -> Tensor:
    """``(B, H_kv, S, ·)`` -> ``(B, H, S, ·)``: query head h uses kv head h // (H / H_kv)."""
    return x.repeat_interleave(H // x.shape[1], dim=1)


def naive_softmax_attention(case: Case) -> tuple[Tensor, Tensor]:
    """Eq. (1) in float64 from scratch: masked scores -> -inf, softmax, empty rows -> 0."""
    q, k, v = (x.detach().double() for x in (case.q, case.k, case.v))
    H, D = q.shape[1], q.shape[-1]
    scores = q @ _repeat(k, H).transpose(-2, -1) / math.sqrt(D)  # (B, H, T, S)
    if case.mask is not None and case.mask.is_floating_point():
        scores = scores + case.mask.double().clamp_min(-1e300)  # biases (masked keys: below)
    scores = scores.masked_fill(~case.keep, -math.inf)
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # all -inf rows: NaN -> 0
    return weights @ _repeat(v, H), weights


def naive_linear_attention(case: Case, phi: Callable[[Tensor], Tensor]) -> Tensor:
    """``out_i = Σ_j φ(q_i)·φ(k_j) v_j / Σ_j φ(q_i)·φ(k_j)`` over the allowed keys, in float64."""
    q, k, v = (x.detach().double() for x in (case.q, case.k, case.v))
    H = q.shape[1]
    a = phi(q) @ phi(_repeat(k, H)).transpose(-2, -1) * case.keep  # (B, H, T, S)
    den = a.sum(dim=-1, keepdim=True)
    return torch.where(den > 0, (a @ _repeat(v, H)) / torch.where(den > 0, den, 1.0), 0.0)


def _elu_features(x: Tensor) -> Tensor:
    return F.elu(x) + 1.0


def _favor_features(w: Tensor) -> Callable[[Tensor], Tensor]:
    """FAVOR+ ``exp(ωᵀx' - |x'|²/2) / sqrt(M)`` with ``x' = x · D^-1/4`` (no stabilising shift:
    in float64 and at these magnitudes exp stays in range, and shifts cancel in the ratio)."""

    def phi(x: Tensor) -> Tensor:
        x = x * x.shape[-1] ** -0.25
        return torch.exp(x @ w.T - x.pow(2).sum(-1, keepdim=True) / 2) / math.sqrt(w.shape[0])

    return phi


def _math(case: Case, mask: Tensor | None = None, *, weights: bool = False) -> Any:
    return scaled_dot_product_attention(
        case.q,
        case.k,
        case.v,
        mask=case.mask if mask is None else mask,
        is_causal=case.is_causal,
        return_weights=weights,
    )


def _close(a: Tensor, b: Tensor, dtype: torch.dtype, scale: float = 1.0) -> None:
    tol = TOL[dtype] * scale
    torch.testing.assert_close(a, b.to(a.dtype), atol=tol, rtol=tol)


# ---------------------------------------------------------------------------- properties


@_settings("test_math_matches_naive_softmax_and_masks_exactly")
@given(case=cases())
def test_math_matches_naive_softmax_and_masks_exactly(case: Case) -> None:
    out, w = _math(case, weights=True)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    assert out.shape == (*case.q.shape[:3], case.v.shape[-1]) and out.dtype == case.q.dtype
    keep = case.keep.expand(w.shape)
    assert torch.equal(w[~keep], torch.zeros_like(w[~keep]))  # exactly zero, not just small
    alive = keep.any(dim=-1)  # (B, H, T): rows with at least one key
    tol = TOL[case.q.dtype]
    torch.testing.assert_close(
        w.sum(-1)[alive], torch.ones_like(w.sum(-1)[alive]), atol=tol, rtol=0
    )
    dead_out = out.masked_select(~alive.unsqueeze(-1))
    assert torch.equal(dead_out, torch.zeros_like(dead_out))
    ref_out, ref_w = naive_softmax_attention(case)
    _close(w, ref_w, case.q.dtype)
    _close(out, ref_out, case.q.dtype, scale=10.0)


def _sliding(draw: Callable[..., Any], case: Case) -> tuple[SlidingWindowAttention, Tensor]:
    """A sliding-window backend and the mask that makes math compute the same thing."""
    _, _, _, T, S = case.shape
    window = draw(st.integers(1, 10))
    glob = draw(st.lists(st.integers(0, 10), max_size=2))
    block = draw(st.sampled_from([None, 1, 2, 3, 5]))
    backend = SlidingWindowAttention(window=window, global_tokens=glob, block_size=block)
    dense = backend.dense_mask(T, S, is_causal=case.is_causal)  # (T, S)
    mask = combine_masks(case.mask, dense)
    assert mask is not None
    return backend, mask


@_settings("test_exact_backends_agree_with_math")
@given(case=cases(requires_grad=True), name=st.sampled_from(["sdpa", "chunked", "sliding_window"]),
       data=st.data())  # fmt: skip
def test_exact_backends_agree_with_math(case: Case, name: str, data: st.DataObject) -> None:
    """Forward and gradients of the exact softmax backends equal math's (same inputs)."""
    ref_mask = case.mask
    backend: Any = get_attention_backend(name)
    if name == "chunked":
        backend = ChunkedAttention(
            block_q=data.draw(st.integers(1, 5)), block_k=data.draw(st.integers(1, 5))
        )
    elif name == "sliding_window":
        backend, ref_mask = _sliding(data.draw, case)
    out = backend(case.q, case.k, case.v, mask=case.mask, is_causal=case.is_causal)
    ref = _math(case, ref_mask)
    assert torch.isfinite(out).all()
    _close(out, ref, case.q.dtype, scale=10.0)
    if out.numel() == 0 or not out.requires_grad:
        return
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    inputs = (case.q, case.k, case.v)
    got = torch.autograd.grad(out, inputs, grad, allow_unused=True)
    want = torch.autograd.grad(ref, inputs, grad, allow_unused=True)
    for x, a, b in zip(inputs, got, want, strict=True):
        a = torch.zeros_like(x) if a is None else a  # None: the input did not matter
        b = torch.zeros_like(x) if b is None else b
        assert torch.isfinite(a).all()
        _close(a, b, case.q.dtype, scale=100.0)


@_settings("test_linear_agrees_with_its_naive_form")
@given(
    case=cases(mask_kinds=KEY_PADDING_KINDS),
    feature_map=st.sampled_from(["elu", "favor"]),
    chunk=st.integers(1, 6),
)
def test_linear_agrees_with_its_naive_form(case: Case, feature_map: str, chunk: int) -> None:
    D = case.q.shape[-1]
    phi: Callable[[Tensor], Tensor]
    if feature_map == "elu":
        backend, phi = LinearAttention(chunk_size=chunk), _elu_features
    else:
        backend = LinearAttention(feature_map="favor", n_features=16, seed=1, chunk_size=chunk)
        w = favor_projection(D, 16, seed=1).double()  # the backend draws ω in float32
        phi = _favor_features(w)
    out = backend(case.q, case.k, case.v, mask=case.mask, is_causal=case.is_causal)
    assert torch.isfinite(out).all()
    ref = naive_linear_attention(case, phi)
    # float32 features of the linear path (and FAVOR's shifts) round more than a softmax.
    _close(out, ref, case.q.dtype, scale=10.0 if case.q.dtype == torch.float64 else 50.0)


BACKENDS = ["math", "sdpa", "chunked", "sliding_window", "linear"]


@_settings("test_gradients_are_finite")
@given(case=cases(requires_grad=True), name=st.sampled_from(BACKENDS))
def test_gradients_are_finite(case: Case, name: str) -> None:
    """Every backend's gradients are finite, fully masked rows and columns included."""
    mask = case.mask
    if name == "linear" and mask is not None:
        # Linear attention takes key padding only (other masks: ValueError), without biases.
        key_padding = mask.dim() == 4 and mask.shape[1] == mask.shape[2] == 1
        mask = None if not key_padding else _keep(mask, False, mask.shape)  # type: ignore[arg-type]
    out = get_attention_backend(name)(case.q, case.k, case.v, mask=mask, is_causal=case.is_causal)
    assert torch.isfinite(out).all()
    if out.numel() == 0 or not out.requires_grad:
        return
    grads = torch.autograd.grad(out.square().sum(), (case.q, case.k, case.v), allow_unused=True)
    for g in grads:
        assert g is None or torch.isfinite(g).all()


HALF = (torch.bfloat16, torch.float16)


@_settings("test_half_precision_is_finite_and_close_to_float32")
@given(case=cases(dtypes=HALF, min_len=1, magnitudes=(0.1, 1.0)), name=st.sampled_from(BACKENDS))
def test_half_precision_is_finite_and_close_to_float32(case: Case, name: str) -> None:
    """bf16/fp16 inputs (float32 masks at finfo(float32).min or -inf): finite, zeros for rows
    with nothing to attend to, and close to float32 math on the same rounded inputs."""
    mask = case.mask
    if name == "linear":
        mask = None  # covered in float32/64 above; here: the half-precision arithmetic
    out = get_attention_backend(name)(case.q, case.k, case.v, mask=mask, is_causal=case.is_causal)
    assert out.dtype == case.q.dtype and torch.isfinite(out).all()
    up = Case(
        case.q.float(), case.k.float(), case.v.float(), mask, case.is_causal,
        _keep(mask, case.is_causal, case.keep.shape),  # type: ignore[arg-type]
    )  # fmt: skip
    ref = naive_linear_attention(up, _elu_features) if name == "linear" else _math(up)
    alive = up.keep.any(dim=-1, keepdim=True)  # (B, H, T, 1)
    dead = out.masked_select(~alive)
    assert torch.equal(dead, torch.zeros_like(dead))
    atol = 2e-2 if case.q.dtype == torch.float16 else 6e-2
    torch.testing.assert_close(out.double(), ref.double(), atol=atol, rtol=atol)


def test_documented_example_count() -> None:
    """The count in the module docstring and docs/validation.md is the one CI runs."""
    assert f"**{TOTAL_EXAMPLES}** in all" in (__doc__ or "")
    doc = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "validation.md")
    with open(doc, encoding="utf-8") as f:
        text = f.read()
    assert f"{TOTAL_EXAMPLES} examples" in text, "update the example count in docs/validation.md"
    for test, n in EXAMPLES.items():
        assert f"`{test}` | {n}" in text, f"docs/validation.md: row for {test} with {n} examples"
