"""Every attention backend treats non-finite inputs the same way (issue 19, class 3).

The contract (module docstring of :mod:`attnlab.layers.attention`): a NaN or inf in q, k or v is
never turned into a finite number. Every output row that may attend to the bad key or value, or
whose query is bad, is non-finite, unless the bad entry's score is -inf, which weighs it 0 like a
mask. Rows that cannot see it are either non-finite or exactly what the clean input gives.

Before this was settled, chunked and linear attention returned zeros where math, sdpa and the
sliding window returned NaN (a ``(1, 1, 3, 4)`` input with an inf in the keys).
"""

from __future__ import annotations

import itertools
import math
import zlib

import pytest
import torch
from torch import Tensor

from attnlab.layers.attention_backends import get_attention_backend

B, H, H_KV, D = 2, 4, 2, 4
WINDOW, BLOCK = 3, 2

BACKENDS = {
    "math": lambda: get_attention_backend("math"),
    "sdpa": lambda: get_attention_backend("sdpa"),
    "chunked": lambda: get_attention_backend("chunked", block_q=3, block_k=2),
    "sliding_window": lambda: get_attention_backend(
        "sliding_window", window=WINDOW, block_size=BLOCK
    ),
    "linear": lambda: get_attention_backend("linear", chunk_size=2),
}


def _allowed(backend: str, T: int, S: int, causal: bool, pad: Tensor | None) -> Tensor:
    """``(B, T, S)`` bool: which keys each query may attend to under ``backend``'s pattern."""
    i = torch.arange(T).unsqueeze(1) + (S - T)  # (T, 1) query positions, bottom-right aligned
    j = torch.arange(S).unsqueeze(0)  # (1, S)
    ok = torch.ones(T, S, dtype=torch.bool)
    if causal:
        ok &= j <= i
    if backend == "sliding_window":
        ok &= (i - WINDOW < j) if causal else ((j - i).abs() <= WINDOW // 2)
    ok = ok.expand(B, T, S).clone()
    if pad is not None:
        ok &= pad.view(B, 1, S)
    return ok


def _inputs(T: int, S: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(B, H, T, D, generator=g) + 0.1  # positive: q·k has the sign of k's entry
    k = torch.randn(B, H_KV, S, D, generator=g)
    v = torch.randn(B, H_KV, S, D, generator=g)
    return q, k, v


CASES = list(
    itertools.product(
        BACKENDS,
        [(7, 7), (3, 7)],  # self-attention and a cached-decoding shape (T < S)
        [False, True],  # causal
        [False, True],  # key padding
    )
)


def _case_id(case: tuple) -> str:
    name, (T, S), causal, pad = case
    return f"{name}-T{T}S{S}-{'causal' if causal else 'full'}{'-pad' if pad else ''}"


BAD_ENTRIES = [("q", math.nan), ("q", math.inf), ("k", math.nan), ("v", math.nan),
               ("v", math.inf), ("k", math.inf)]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
@pytest.mark.parametrize("where, value", BAD_ENTRIES)
def test_a_bad_entry_makes_every_row_that_sees_it_non_finite(
    case: tuple, where: str, value: float
) -> None:
    name, (T, S), causal, padded = case
    fn = BACKENDS[name]()
    q, k, v = _inputs(T, S, seed=zlib.crc32(f"{_case_id(case)}-{where}".encode()) % 1000)
    pad, mask = None, None
    if padded:
        pad = torch.ones(B, S, dtype=torch.bool)
        pad[0, -2:] = False  # batch 0: the last two keys are padding
        mask = pad.view(B, 1, 1, S)
    clean = fn(q, k, v, mask=mask, is_causal=causal)
    assert torch.isfinite(clean).all(), f"{name}: clean input gave non-finite output"
    # key S - 3 is never padding (the last two are), is inside every pattern's reach of the
    # last queries and never the only key of a row; query T - 3 has keys under every pattern
    b, kv_head, j, d = 0, 1, S - 3, 2
    i = T - 3
    bad = {"q": q.clone(), "k": k.clone(), "v": v.clone()}
    if where == "q":
        bad["q"][b, 2, i, d] = value  # query head 2 reads kv head 1
    else:
        bad[where][b, kv_head, j, d] = value
    out = fn(bad["q"], bad["k"], bad["v"], mask=mask, is_causal=causal)

    allowed = _allowed(name, T, S, causal, pad)  # (B, T, S)
    sees = torch.zeros(B, H, T, dtype=torch.bool)
    if where == "q":
        sees[b, 2, i] = allowed[b, i].any()
    else:
        for h in range(H):
            if h // (H // H_KV) == kv_head:
                sees[b, h] = allowed[b, :, j]
    assert sees.any(), "the case must have rows that see the bad entry"
    row_finite = torch.isfinite(out).all(dim=-1)  # (B, H, T)
    hidden = sees & row_finite
    assert not hidden.any(), (
        f"{name}: {where}={value} became finite in rows {hidden.nonzero().tolist()}"
    )
    # Rows that cannot see it: non-finite (allowed) or what the clean input gives.
    other = ~sees & row_finite
    torch.testing.assert_close(out[other], clean[other], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(BACKENDS))
@pytest.mark.parametrize("causal", [False, True])
def test_a_minus_inf_score_weighs_a_key_zero(name: str, causal: bool) -> None:
    """-inf in a key entry, with positive queries, gives a -inf score: the key gets weight 0,
    as if masked; the output is finite and equals a large finite negative entry's."""
    fn = BACKENDS[name]()
    T = S = 7
    q, k, v = _inputs(T, S, seed=3)
    k_inf, k_big = k.clone(), k.clone()
    k_inf[0, 1, 1, 2] = -math.inf
    k_big[0, 1, 1, 2] = -1e4  # score <= -500: exp underflows to exactly 0 in float32
    out = fn(q, k_inf, v, is_causal=causal)
    ref = fn(q, k_big, v, is_causal=causal)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_chunked_and_linear_no_longer_hide_an_inf_key() -> None:
    """The case the issue reported: a (1, 1, 3, 4) input with an inf in the keys."""
    g = torch.Generator().manual_seed(0)
    q = torch.rand(1, 1, 3, 4, generator=g) + 0.1
    k = torch.randn(1, 1, 3, 4, generator=g)
    v = torch.randn(1, 1, 3, 4, generator=g)
    k[0, 0, 1, 0] = math.inf
    for name in BACKENDS:
        out = BACKENDS[name]()(q, k, v)
        assert not torch.isfinite(out).all(dim=-1).any(), f"{name}: {out}"


@pytest.mark.parametrize("name", ["math", "sdpa", "chunked", "sliding_window", "linear"])
def test_fully_masked_rows_stay_zero_with_finite_inputs(name: str) -> None:
    """The other side of the rule: a row with no key (all padding) is zeros, not NaN."""
    fn = BACKENDS[name]()
    q, k, v = _inputs(5, 5, seed=4)
    pad = torch.ones(B, 5, dtype=torch.bool)
    pad[1] = False  # batch 1: every key is padding
    out = fn(q, k, v, mask=pad.view(B, 1, 1, 5))
    assert torch.isfinite(out).all()
    assert (out[1] == 0).all()


@pytest.mark.parametrize("name", list(BACKENDS))
def test_a_row_whose_every_score_is_minus_inf_is_nan(name: str) -> None:
    """Every key -inf in one entry, positive queries: every score is -inf and the softmax is
    0 / 0. NaN on every backend but sdpa, where PyTorch's kernel returns zeros (documented)."""
    fn = BACKENDS[name]()
    q, k, v = _inputs(4, 4, seed=5)
    k[0, :, :, 1] = -math.inf  # batch 0: every key, every kv head
    out = fn(q, k, v)
    if name == "sdpa":
        assert (out[0] == 0).all(), "PyTorch's behaviour changed: update the documented exception"
    elif name == "linear":  # elu features of -inf are 0 in that entry only: still defined
        assert torch.isfinite(out[0]).all()
    else:
        assert out[0].isnan().all(dim=-1).all(), f"{name}: {out[0]}"
    assert torch.isfinite(out[1]).all()
