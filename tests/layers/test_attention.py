"""Scaled dot-product attention (eq. 1) and its backends.

Closed form (exercise 1), math == sdpa (forward and input gradients) over every mask shape the
library uses, fully masked rows (zeros, no NaN, also in half precision), gradcheck, bad input.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.layers import (
    ATTENTION_BACKENDS,
    causal_mask,
    get_attention_backend,
    padding_mask_from_lengths,
    scaled_dot_product_attention,
    to_additive,
)
from attnlab.layers.attention_backends import math_attention, sdpa_attention


def exercise_1_expected() -> Tensor:
    r"""The self-attention output of exercise 1, in closed form.

    x1 = [1, 0], x2 = [0, 1], x3 = [1, 1]; W^Q = W^K = W^V = I, d_k = 2, so Q = K = V = X.

    Scores QKᵀ/√2, with a = 1/√2::

        [[a, 0, a ],
         [0, a, a ],
         [a, a, 2a]]

    Softmax rows (e = exp):

        row 1: [e^a, 1, e^a] / (2e^a + 1)
        row 2: [1, e^a, e^a] / (2e^a + 1)
        row 3: [e^a, e^a, e^{2a}] / (2e^a + e^{2a}) = [1, 1, e^a] / (2 + e^a)

    Outputs (weights @ V, with V rows [1,0], [0,1], [1,1]):

        out1 = [2e^a, 1 + e^a] / (2e^a + 1)
        out2 = [1 + e^a, 2e^a] / (2e^a + 1)
        out3 = [1 + e^a, 1 + e^a] / (2 + e^a)

    Numerically e^a ≈ 2.0281: out1 ≈ [0.8022, 0.5989], out3 ≈ [0.7517, 0.7517].
    """
    ea = math.exp(1 / math.sqrt(2))
    return torch.tensor(
        [
            [2 * ea / (2 * ea + 1), (1 + ea) / (2 * ea + 1)],
            [(1 + ea) / (2 * ea + 1), 2 * ea / (2 * ea + 1)],
            [(1 + ea) / (2 + ea), (1 + ea) / (2 + ea)],
        ],
        dtype=torch.float64,
    )


def exercise_1_weights() -> Tensor:
    ea = math.exp(1 / math.sqrt(2))
    return torch.tensor(
        [
            [ea / (2 * ea + 1), 1 / (2 * ea + 1), ea / (2 * ea + 1)],
            [1 / (2 * ea + 1), ea / (2 * ea + 1), ea / (2 * ea + 1)],
            [1 / (2 + ea), 1 / (2 + ea), ea / (2 + ea)],
        ],
        dtype=torch.float64,
    )


X_EX1 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])


def test_exercise_1_numbers_are_the_documented_ones() -> None:
    exp = exercise_1_expected()
    assert exp[0].tolist() == pytest.approx([0.8022, 0.5989], abs=1e-4)
    assert exp[2].tolist() == pytest.approx([0.7517, 0.7517], abs=1e-4)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_exercise_1_closed_form(backend: str) -> None:
    x = X_EX1[None, None]  # (1, 1, 3, 2): Q = K = V = X W with W = I
    out = get_attention_backend(backend)(x, x, x)
    torch.testing.assert_close(out[0, 0].double(), exercise_1_expected(), atol=1e-6, rtol=0)


def test_exercise_1_weights_closed_form() -> None:
    x = X_EX1[None, None]
    out, w = scaled_dot_product_attention(x, x, x, return_weights=True)
    torch.testing.assert_close(w[0, 0].double(), exercise_1_weights(), atol=1e-6, rtol=0)
    torch.testing.assert_close(out[0, 0].double(), exercise_1_expected(), atol=1e-6, rtol=0)


def test_matches_naive_softmax_formula() -> None:
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 6)
    ref = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1) @ v
    out = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)
    out_scaled = scaled_dot_product_attention(q, k, v, scale=0.3)
    ref_scaled = torch.softmax(q @ k.transpose(-2, -1) * 0.3, dim=-1) @ v
    torch.testing.assert_close(out_scaled, ref_scaled, atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# math == sdpa
# ---------------------------------------------------------------------------------------------


def _padding(B: int, S: int) -> Tensor:
    lengths = torch.tensor([S, max(1, S - 2), max(1, S - 3)][:B])
    return padding_mask_from_lengths(lengths, S)  # (B, 1, 1, S)


# name -> (B, H, H_kv, T, S, mask factory (B, H, T, S) -> mask|None, is_causal)
MaskFn = Callable[[int, int, int, int], "Tensor | None"]
CASES: dict[str, tuple[int, int, int, int, int, MaskFn, bool]] = {
    "no_mask": (2, 2, 2, 5, 5, lambda B, H, T, S: None, False),
    "causal": (2, 2, 2, 5, 5, lambda B, H, T, S: None, True),
    "padding": (3, 2, 2, 5, 5, lambda B, H, T, S: _padding(B, S), False),
    "padding_causal": (3, 2, 2, 5, 5, lambda B, H, T, S: _padding(B, S), True),
    "tgt_padding_causal_2d": (2, 2, 2, 5, 5, lambda B, H, T, S: causal_mask(T, S), False),
    "cross": (2, 2, 2, 3, 6, lambda B, H, T, S: None, False),
    "cross_padding": (3, 2, 2, 3, 6, lambda B, H, T, S: _padding(B, S), False),
    "cross_causal_T_lt_S": (2, 2, 2, 3, 6, lambda B, H, T, S: None, True),
    "cross_causal_T_lt_S_padding": (3, 2, 2, 3, 6, lambda B, H, T, S: _padding(B, S), True),
    "causal_T_gt_S": (2, 2, 2, 6, 3, lambda B, H, T, S: None, True),
    "gqa": (2, 4, 2, 5, 5, lambda B, H, T, S: None, False),
    "gqa_causal_padding": (3, 4, 2, 5, 5, lambda B, H, T, S: _padding(B, S), True),
    "mqa_cross_causal": (2, 4, 1, 2, 5, lambda B, H, T, S: None, True),
    "float_additive": (2, 2, 2, 4, 5, lambda B, H, T, S: torch.randn(B, H, T, S), False),
    "float_additive_causal": (2, 2, 2, 4, 5, lambda B, H, T, S: torch.randn(1, H, T, S), True),
    "float_padding": (
        3,
        2,
        2,
        5,
        5,
        lambda B, H, T, S: to_additive(_padding(B, S), torch.float32),
        True,
    ),
    "float_neg_inf": (
        2,
        2,
        2,
        4,
        4,
        lambda B, H, T, S: torch.zeros(T, S).masked_fill(~causal_mask(T, S), float("-inf")),
        False,
    ),
    "float_bias_gqa": (2, 4, 2, 3, 5, lambda B, H, T, S: torch.randn(H, T, S), True),
}


def _qkv(
    B: int, H: int, H_kv: int, T: int, S: int, D: int = 8, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor, Tensor]:
    q = torch.randn(B, H, T, D, dtype=dtype, requires_grad=True)
    k = torch.randn(B, H_kv, S, D, dtype=dtype, requires_grad=True)
    v = torch.randn(B, H_kv, S, D, dtype=dtype, requires_grad=True)
    return q, k, v


def _run(fn: Callable[..., Tensor], q: Tensor, k: Tensor, v: Tensor, **kw: object) -> list[Tensor]:
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v, **kw)
    # A fixed random cotangent so every output element matters for the gradients.
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * g).sum().backward()
    return [out.detach(), q.grad, k.grad, v.grad]


@pytest.mark.parametrize("case", list(CASES))
def test_math_equals_sdpa(case: str) -> None:
    B, H, H_kv, T, S, mask_fn, is_causal = CASES[case]
    q, k, v = _qkv(B, H, H_kv, T, S)
    mask = mask_fn(B, H, T, S)
    a = _run(math_attention, q, k, v, mask=mask, is_causal=is_causal)
    b = _run(sdpa_attention, q, k, v, mask=mask, is_causal=is_causal)
    for name, x, y in zip(["out", "dq", "dk", "dv"], a, b, strict=True):
        assert torch.isfinite(x).all(), name
        torch.testing.assert_close(x, y, atol=1e-5, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


def test_math_equals_sdpa_with_scale_and_value_dim() -> None:
    q, k, v = _qkv(2, 4, 2, 3, 5)
    v = torch.randn(2, 2, 5, 6, requires_grad=True)  # Dv != D
    kw = {"mask": _padding(2, 5), "is_causal": True, "scale": 0.3}
    for x, y in zip(
        _run(math_attention, q, k, v, **kw), _run(sdpa_attention, q, k, v, **kw), strict=True
    ):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=0)


def test_causal_bottom_right_semantics() -> None:
    """Query i of T sees keys j <= i + (S - T): checked against a per-row reference."""
    B, H, T, S, D = 1, 1, 3, 6, 4
    q, k, v = (t.detach() for t in _qkv(B, H, H, T, S, D))
    out = scaled_dot_product_attention(q, k, v, is_causal=True)
    for i in range(T):
        last = i + (S - T)
        ref = scaled_dot_product_attention(
            q[:, :, i : i + 1], k[:, :, : last + 1], v[:, :, : last + 1]
        )
        torch.testing.assert_close(out[:, :, i : i + 1], ref, atol=1e-6, rtol=0)


def test_gqa_uses_kv_head_h_div_rep() -> None:
    """With H=4, H_kv=2 query heads 0,1 use kv head 0 and heads 2,3 use kv head 1."""
    q, k, v = (t.detach() for t in _qkv(2, 4, 2, 3, 5))
    out = scaled_dot_product_attention(q, k, v)
    k_full = k.repeat_interleave(2, dim=1)
    v_full = v.repeat_interleave(2, dim=1)
    torch.testing.assert_close(out, scaled_dot_product_attention(q, k_full, v_full))


def test_weights_are_masked_and_normalised() -> None:
    q, k, v = (t.detach() for t in _qkv(3, 2, 2, 5, 5))
    pad = _padding(3, 5)
    _, w = scaled_dot_product_attention(q, k, v, mask=pad, is_causal=True, return_weights=True)
    allowed = pad & causal_mask(5, 5)  # (B, 1, 5, 5)
    assert (w.masked_select(~allowed.expand_as(w)) == 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 2, 5))


# ---------------------------------------------------------------------------------------------
# Fully masked rows
# ---------------------------------------------------------------------------------------------


def _half_supported(dtype: torch.dtype) -> bool:
    try:
        x = torch.randn(1, 1, 2, 2).to(dtype)
        F.scaled_dot_product_attention(x, x, x)
    except RuntimeError:
        return False
    return True


DTYPES = [
    torch.float32,
    pytest.param(
        torch.float16,
        marks=pytest.mark.skipif(not _half_supported(torch.float16), reason="no CPU fp16 SDPA"),
    ),
    pytest.param(
        torch.bfloat16,
        marks=pytest.mark.skipif(not _half_supported(torch.bfloat16), reason="no CPU bf16 SDPA"),
    ),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("mask_kind", ["bool", "additive_min", "additive_neg_inf", "causal"])
def test_fully_masked_row_is_zero_without_nan(
    backend: str, dtype: torch.dtype, mask_kind: str
) -> None:
    """A query that may attend to nothing outputs exactly 0 and has finite (zero) gradients.

    Logits are large (|score| in the thousands), so adding the fill value naively in half
    precision would overflow to -inf.
    """
    B, H, T, S, D = 2, 2, 4, 4, 8
    q = (torch.randn(B, H, T, D) * 30).to(dtype).requires_grad_(True)
    k = (torch.randn(B, H, S, D) * 30).to(dtype).requires_grad_(True)
    v = torch.randn(B, H, S, D).to(dtype).requires_grad_(True)
    keep = torch.ones(B, 1, T, S, dtype=torch.bool)
    keep[:, :, 1] = False  # query 1 sees nothing
    keep[1, :, 3, :2] = False  # partly masked row for contrast
    is_causal = False
    dead = torch.zeros(B, 1, T, 1, dtype=torch.bool)
    dead[:, :, 1] = True
    if mask_kind == "bool":
        mask: Tensor | None = keep
    elif mask_kind == "additive_min":
        mask = to_additive(keep, dtype)
    elif mask_kind == "additive_neg_inf":
        mask = torch.zeros(B, 1, T, S, dtype=dtype).masked_fill(~keep, float("-inf"))
    else:  # causal with T > S: the first T - S queries see no key
        k = k[:, :, :2].detach().requires_grad_(True)
        v = v[:, :, :2].detach().requires_grad_(True)
        mask, is_causal = None, True
        dead = torch.zeros(1, 1, T, 1, dtype=torch.bool)
        dead[:, :, :2] = True
    fn = get_attention_backend(backend)
    out = fn(q, k, v, mask=mask, is_causal=is_causal)
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    dead_rows = out.masked_select(dead.expand_as(out))
    assert dead_rows.numel() > 0 and (dead_rows == 0).all()
    live = out.masked_select(~dead.expand_as(out))
    assert (live != 0).any()
    out.float().sum().backward()
    for name, t in (("q", q), ("k", k), ("v", v)):
        assert t.grad is not None and torch.isfinite(t.grad).all(), name
    assert (q.grad.masked_select(dead.expand_as(q.grad)) == 0).all()


@pytest.mark.parametrize("mask_kind", ["additive_min", "additive_neg_inf"])
def test_fully_masked_float_rows_agree_between_backends(mask_kind: str) -> None:
    q, k, v = _qkv(2, 2, 2, 3, 4)
    mask = torch.zeros(2, 1, 3, 4)
    fill = torch.finfo(torch.float32).min if mask_kind == "additive_min" else float("-inf")
    mask[0, :, 0] = fill
    a = _run(math_attention, q, k, v, mask=mask)
    b = _run(sdpa_attention, q, k, v, mask=mask)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=0)
    assert (a[0][0, :, 0] == 0).all()


def test_half_precision_large_logits_close_to_float32() -> None:
    q, k, v = (t.detach() for t in _qkv(1, 2, 2, 4, 6))
    q, k = q * 20, k * 20
    mask = _padding(1, 6)
    ref = scaled_dot_product_attention(q, k, v, mask=mask, is_causal=True)
    out = scaled_dot_product_attention(
        q.bfloat16(), k.bfloat16(), v.bfloat16(), mask=mask, is_causal=True
    )
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, atol=0.1, rtol=0.05)


# ---------------------------------------------------------------------------------------------
# gradcheck, dropout, bad input
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_gradcheck_float64(backend: str) -> None:
    fn = get_attention_backend(backend)
    q = torch.randn(2, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 1, 5, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 1, 5, 4, dtype=torch.float64, requires_grad=True)
    pad = padding_mask_from_lengths(torch.tensor([5, 3]), 5)
    bias = torch.randn(2, 3, 5, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda a, b, c: fn(a, b, c, mask=pad, is_causal=True), (q, k, v)
    )
    assert torch.autograd.gradcheck(lambda a, b, c: fn(a, b, c, mask=bias), (q, k, v))


def test_gradcheck_weights_float64() -> None:
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 3, 4, dtype=torch.float64, requires_grad=True)

    def weights(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
        return scaled_dot_product_attention(a, b, c, is_causal=True, return_weights=True)[1]

    assert torch.autograd.gradcheck(weights, (q, k, v))


def test_dropout_only_when_asked() -> None:
    q, k, v = (t.detach() for t in _qkv(1, 2, 2, 6, 6))
    base = scaled_dot_product_attention(q, k, v)
    dropped = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert not torch.allclose(base, dropped)
    with pytest.raises(ValueError, match="dropout_p"):
        scaled_dot_product_attention(q, k, v, dropout_p=1.0)


def test_backend_registry_keys() -> None:
    assert {"math", "sdpa"} <= set(ATTENTION_BACKENDS.keys())
    with pytest.raises(ValueError, match=r"unknown attention backend 'flash3'.*math.*sdpa"):
        get_attention_backend("flash3")


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize(
    ("shapes", "match"),
    [
        (((2, 3, 8), (2, 1, 3, 8), (2, 1, 3, 8)), r"q must have 4 dims.*\(2, 3, 8\)"),
        (((2, 1, 3, 8), (1, 3, 8), (2, 1, 3, 8)), r"k must have 4 dims"),
        (((2, 1, 3, 8), (2, 1, 3, 8), (2, 1, 3, 8, 1)), r"v must have 4 dims"),
        (((2, 1, 3, 8), (3, 1, 3, 8), (3, 1, 3, 8)), r"batch sizes differ"),
        (((2, 1, 3, 8), (2, 1, 3, 4), (2, 1, 3, 4)), r"head dims differ: 8 vs 4"),
        (((2, 1, 3, 8), (2, 1, 5, 8), (2, 1, 4, 8)), r"k and v must share"),
        (((2, 4, 3, 8), (2, 3, 5, 8), (2, 3, 5, 8)), r"H=4 must be a multiple of .*H_kv=3"),
    ],
)
def test_bad_qkv_shapes(backend: str, shapes: tuple, match: str) -> None:
    q, k, v = (torch.randn(s) for s in shapes)
    with pytest.raises(ValueError, match=match):
        get_attention_backend(backend)(q, k, v)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_bad_masks(backend: str) -> None:
    fn = get_attention_backend(backend)
    q, k, v = (t.detach() for t in _qkv(2, 2, 2, 3, 5))
    with pytest.raises(ValueError, match=r"does not broadcast to \(B, H, T, S\) = \(2, 2, 3, 5\)"):
        fn(q, k, v, mask=torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="does not broadcast"):
        fn(q, k, v, mask=torch.ones(3, 1, 1, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="at most 4"):
        fn(q, k, v, mask=torch.ones(1, 2, 2, 3, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"bool.*floating.*got dtype torch.int64"):
        fn(q, k, v, mask=torch.ones(2, 1, 1, 5, dtype=torch.long))


def test_bad_dtypes() -> None:
    q = torch.randn(1, 1, 2, 4)
    with pytest.raises(TypeError, match="floating point"):
        scaled_dot_product_attention(q.long(), q.long(), q.long())
    with pytest.raises(TypeError, match="dtypes differ"):
        scaled_dot_product_attention(q, q.double(), q)
