"""MultiHeadAttention: exercise 1, backend agreement, parity with ``nn.MultiheadAttention``, GQA.

``nn.MultiheadAttention``'s boolean masks have the opposite polarity (True = ignore), so they are
inverted at the boundary; float masks are additive in both.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from attnlab.layers import MultiHeadAttention, causal_mask, padding_mask_from_lengths
from attnlab.layers.kv_cache import CrossKVCache, LayerKVCache


def test_exercise_1_through_mha() -> None:
    """One head, identity projections without bias: the closed form of exercise 1.

    With X = [[1,0],[0,1],[1,1]] and Q = K = V = X, the outputs are (a = 1/√2, e = exp)
    [2e^a, 1+e^a]/(2e^a+1), [1+e^a, 2e^a]/(2e^a+1) and [1+e^a, 1+e^a]/(2+e^a); the derivation
    is in ``tests/layers/test_attention.py::exercise_1_expected``. W^O = I leaves them unchanged.
    """
    ea = math.exp(1 / math.sqrt(2))
    expected = torch.tensor(
        [
            [2 * ea / (2 * ea + 1), (1 + ea) / (2 * ea + 1)],
            [(1 + ea) / (2 * ea + 1), 2 * ea / (2 * ea + 1)],
            [(1 + ea) / (2 + ea), (1 + ea) / (2 + ea)],
        ]
    )
    x = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])  # (1, 3, 2)
    for backend in ("math", "sdpa"):
        mha = MultiHeadAttention(2, 1, bias=False, backend=backend)
        with torch.no_grad():
            for proj in (mha.q_proj, mha.k_proj, mha.v_proj, mha.out_proj):
                proj.weight.copy_(torch.eye(2))
        out, w = mha(x)
        assert w is None
        torch.testing.assert_close(out[0], expected, atol=1e-6, rtol=0)
        out_w, w = mha(x, need_weights=True)
        torch.testing.assert_close(out_w[0], expected, atol=1e-6, rtol=0)
        assert w is not None and w.shape == (1, 1, 3, 3)
        torch.testing.assert_close(w[0, 0, 2], torch.tensor([1, 1, ea]) / (2 + ea))


# name -> (n_heads, n_kv_heads, T, S (None: self-attention), mask factory, is_causal)
MHA_CASES: dict[
    str, tuple[int, int, int, int | None, Callable[[int, int, int], Tensor | None], bool]
] = {
    "self": (4, 4, 5, None, lambda B, T, S: None, False),
    "self_causal_padding": (
        4,
        4,
        5,
        None,
        lambda B, T, S: padding_mask_from_lengths(torch.tensor([5, 3]), S),
        True,
    ),
    "cross_padding": (
        4,
        4,
        3,
        6,
        lambda B, T, S: padding_mask_from_lengths(torch.tensor([6, 2]), S),
        False,
    ),
    "gqa_causal": (4, 2, 5, None, lambda B, T, S: None, True),
    "mqa_cross_float": (4, 1, 3, 6, lambda B, T, S: torch.randn(B, 1, T, S), False),
    "self_2d_bool": (2, 2, 4, None, lambda B, T, S: causal_mask(T, S), False),
}


@pytest.mark.parametrize("case", list(MHA_CASES))
def test_mha_backends_agree(case: str) -> None:
    H, H_kv, T, S, mask_fn, is_causal = MHA_CASES[case]
    B, E = 2, 16
    math_mha = MultiHeadAttention(E, H, n_kv_heads=H_kv, backend="math")
    sdpa_mha = MultiHeadAttention(E, H, n_kv_heads=H_kv, backend="sdpa")
    sdpa_mha.load_state_dict(math_mha.state_dict())
    x = torch.randn(B, T, E)
    memory = None if S is None else torch.randn(B, S, E)
    mask = mask_fn(B, T, T if S is None else S)
    grads = []
    outs = []
    for mha in (math_mha, sdpa_mha):
        xi = x.clone().requires_grad_(True)
        out, _ = mha(xi, memory, mask=mask, is_causal=is_causal)
        out.pow(2).sum().backward()
        outs.append(out.detach())
        grads.append([xi.grad, *(p.grad for p in mha.parameters())])
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=0)
    for g0, g1 in zip(*grads, strict=True):
        torch.testing.assert_close(g0, g1, atol=1e-5, rtol=1e-5)
    # need_weights goes through the math path whatever the backend, with the same output.
    out_w, w = sdpa_mha(x, memory, mask=mask, is_causal=is_causal, need_weights=True)
    torch.testing.assert_close(out_w, outs[1], atol=1e-5, rtol=0)
    assert w is not None and w.shape == (B, H, T, T if S is None else S)


def _torch_mha(E: int, H: int, bias: bool = True) -> nn.MultiheadAttention:
    ref = nn.MultiheadAttention(E, H, dropout=0.0, bias=bias, batch_first=True)
    if bias:  # torch zero-initialises biases; randomise them so the copy is really tested
        with torch.no_grad():
            ref.in_proj_bias.normal_()
            ref.out_proj.bias.normal_()
    return ref.eval()


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("kind", ["self", "cross"])
@pytest.mark.parametrize("mask_kind", ["none", "key_padding", "attn_bool", "attn_float", "both"])
def test_parity_with_torch_multihead_attention(
    copy_mha: Callable[[nn.Module, nn.MultiheadAttention], None],
    backend: str,
    kind: str,
    mask_kind: str,
) -> None:
    B, T, E, H = 3, 4, 16, 4
    S = T if kind == "self" else 6
    ref = _torch_mha(E, H)
    ours = MultiHeadAttention(E, H, backend=backend).eval()
    copy_mha(ours, ref)
    x = torch.randn(B, T, E)
    memory = x if kind == "self" else torch.randn(B, S, E)
    lengths = torch.tensor([S, S - 1, 2])
    keep_keys = padding_mask_from_lengths(lengths, S)  # (B, 1, 1, S), True = real token
    torch_kpm = ~keep_keys[:, 0, 0]  # (B, S), torch: True = ignore
    allowed = torch.rand(T, S) > 0.3
    allowed[:, 0] = True  # every query keeps a key, else torch returns NaN
    float_mask = torch.randn(T, S)

    ours_mask: Tensor | None = None
    torch_kw: dict[str, Tensor] = {}
    if mask_kind == "key_padding":
        ours_mask = keep_keys
        torch_kw["key_padding_mask"] = torch_kpm
    elif mask_kind == "attn_bool":
        ours_mask = allowed
        torch_kw["attn_mask"] = ~allowed  # opposite polarity
    elif mask_kind == "attn_float":
        ours_mask = float_mask
        torch_kw["attn_mask"] = float_mask
    elif mask_kind == "both":
        # Torch merges a (float) key padding mask and a bias itself; ours takes one additive
        # mask with the padding at the library's fill value finfo.min.
        torch_kw["key_padding_mask"] = torch.zeros(B, S).masked_fill(torch_kpm, float("-inf"))
        torch_kw["attn_mask"] = float_mask
        ours_mask = float_mask.masked_fill(~keep_keys, torch.finfo(torch.float32).min)

    ref_out, ref_w = ref(
        x, memory, memory, need_weights=True, average_attn_weights=False, **torch_kw
    )
    out, _ = ours(x, None if kind == "self" else memory, mask=ours_mask)
    out_w, w = ours(x, None if kind == "self" else memory, mask=ours_mask, need_weights=True)
    assert (out - ref_out).abs().max() <= 1e-5
    assert (out_w - ref_out).abs().max() <= 1e-5
    assert w is not None and w.shape == ref_w.shape == (B, H, T, S)
    assert (w - ref_w).abs().max() <= 1e-5


def test_parity_with_torch_mha_causal_no_bias(
    copy_mha: Callable[[nn.Module, nn.MultiheadAttention], None],
) -> None:
    B, T, E, H = 2, 5, 12, 3
    ref = _torch_mha(E, H, bias=False)
    ours = MultiHeadAttention(E, H, bias=False)
    copy_mha(ours, ref)
    x = torch.randn(B, T, E)
    tm = nn.Transformer.generate_square_subsequent_mask(T)  # float, -inf above the diagonal
    ref_out, _ = ref(x, x, x, attn_mask=tm, is_causal=True, need_weights=False)
    out, _ = ours(x, is_causal=True)
    assert (out - ref_out).abs().max() <= 1e-5


def test_gqa_equals_mha_with_repeated_kv_weights() -> None:
    """GQA with H_kv=2 of H=4 equals full MHA whose k/v heads are duplicated per group."""
    E, H, H_kv, D = 16, 4, 2, 4
    gqa = MultiHeadAttention(E, H, n_kv_heads=H_kv)
    full = MultiHeadAttention(E, H)
    with torch.no_grad():
        full.q_proj.load_state_dict(gqa.q_proj.state_dict())
        full.out_proj.load_state_dict(gqa.out_proj.state_dict())
        for name in ("k_proj", "v_proj"):
            src, dst = getattr(gqa, name), getattr(full, name)
            w = src.weight.view(H_kv, D, E).repeat_interleave(H // H_kv, dim=0)  # (H, D, E)
            dst.weight.copy_(w.reshape(H * D, E))
            dst.bias.copy_(src.bias.view(H_kv, D).repeat_interleave(H // H_kv, 0).reshape(-1))
    assert gqa.k_proj.weight.shape == (H_kv * D, E)
    x = torch.randn(2, 5, E)
    torch.testing.assert_close(gqa(x, is_causal=True)[0], full(x, is_causal=True)[0])


def test_cross_attention_uses_cross_cache() -> None:
    mha = MultiHeadAttention(8, 2)
    x, memory = torch.randn(1, 2, 8), torch.randn(1, 4, 8)
    cc = CrossKVCache()
    ref, _ = mha(x, memory)
    out1, _ = mha(x, memory, cross_cache=cc)
    assert cc.is_set and cc.k is not None and cc.k.shape == (1, 2, 4, 4)
    out2, _ = mha(x, None, cross_cache=cc)  # memory no longer needed
    with pytest.raises(ValueError, match="cross-attention takes cross_cache"):
        mha(x, memory, cache=LayerKVCache(4))
    torch.testing.assert_close(out1, ref)
    torch.testing.assert_close(out2, ref)


def test_dropout_only_in_training() -> None:
    mha = MultiHeadAttention(16, 4, dropout=0.5)
    x = torch.randn(2, 6, 16)
    mha.eval()
    a, b = mha(x)[0], mha(x)[0]
    torch.testing.assert_close(a, b)
    mha.train()
    assert not torch.allclose(mha(x)[0], a)


def test_bad_construction() -> None:
    with pytest.raises(ValueError, match=r"n_heads=3 must divide d_model=16"):
        MultiHeadAttention(16, 3)
    with pytest.raises(ValueError, match=r"n_heads=4 must be a multiple of n_kv_heads=3"):
        MultiHeadAttention(16, 4, n_kv_heads=3)
    with pytest.raises(ValueError, match=r"unknown attention backend 'nope'; valid: .*math.*sdpa"):
        MultiHeadAttention(16, 4, backend="nope")
    with pytest.raises(ValueError, match="dropout"):
        MultiHeadAttention(16, 4, dropout=1.5)


def test_bad_inputs() -> None:
    mha = MultiHeadAttention(16, 4)
    with pytest.raises(ValueError, match=r"x must be \(B, T, 16\), got shape \(2, 5, 12\)"):
        mha(torch.randn(2, 5, 12))
    with pytest.raises(ValueError, match=r"x must be \(B, T, 16\)"):
        mha(torch.randn(5, 16))
    with pytest.raises(ValueError, match=r"memory must be \(2, S, 16\), got shape \(3, 4, 16\)"):
        mha(torch.randn(2, 5, 16), torch.randn(3, 4, 16))
    with pytest.raises(ValueError, match="does not broadcast"):
        mha(torch.randn(2, 5, 16), mask=torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"got dtype torch\.int64"):
        mha(torch.randn(2, 5, 16), mask=torch.ones(5, 5, dtype=torch.long))


def test_need_weights_follows_the_backend_pattern() -> None:
    """Weights come from the math path with the backend's own pattern, never silently wrong."""
    from attnlab.layers import get_attention_backend, sliding_window_mask

    torch.manual_seed(0)
    sw = MultiHeadAttention(16, 2, backend=get_attention_backend("sliding_window", window=3))
    x = torch.randn(1, 7, 16)
    out_fast, none = sw(x, is_causal=True)
    out_w, w = sw(x, is_causal=True, need_weights=True)
    assert none is None and w is not None
    torch.testing.assert_close(out_w, out_fast, atol=1e-5, rtol=1e-5)
    banned = ~sliding_window_mask(7, 7, window=3, is_causal=True)
    assert torch.all(w[..., banned] == 0)

    lin = MultiHeadAttention(16, 2, backend="linear")
    with pytest.raises(ValueError, match="no softmax attention weights"):
        lin(x, need_weights=True)
