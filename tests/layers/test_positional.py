"""Positional encodings: sinusoid values (§3.5), learned table, RoPE (relative, scalings, layouts),
ALiBi slopes and biases, registry."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.layers import (
    POSITIONAL_ENCODINGS,
    ALiBi,
    LearnedPositionalEmbedding,
    NoPositionalEncoding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    alibi_slopes,
    build_positional_encoding,
    sinusoidal_table,
)

# ---------------------------------------------------------------------------------------------
# Sinusoidal
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("d_model", [16, 512])
@pytest.mark.parametrize("pos", [0, 1, 7, 50, 999])
def test_sinusoid_values_match_formula(d_model: int, pos: int) -> None:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    table = sinusoidal_table(torch.tensor([pos]), d_model)[0]
    assert table.shape == (d_model,) and table.dtype == torch.float32
    for i in sorted({0, 1, 2, d_model // 4, d_model // 2 - 1}):
        angle = pos / 10000 ** (2 * i / d_model)
        assert table[2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
        assert table[2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoid_known_values() -> None:
    t = sinusoidal_table(torch.arange(3), 4)
    # d=4: frequencies 1 and 1/100.
    expected = torch.tensor(
        [
            [0.0, 1.0, 0.0, 1.0],
            [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)],
            [math.sin(2), math.cos(2), math.sin(0.02), math.cos(0.02)],
        ]
    )
    torch.testing.assert_close(t, expected, atol=1e-7, rtol=0)


def test_sinusoid_odd_width_and_batched_positions() -> None:
    t = sinusoidal_table(torch.tensor([[3, 4]]), 5)
    assert t.shape == (1, 2, 5)
    assert t[0, 0, 4].item() == pytest.approx(math.sin(3 / 10000 ** (4 / 5)), abs=1e-6)


def test_sinusoidal_embed_adds_table() -> None:
    pe = SinusoidalPositionalEncoding(8)
    x = torch.randn(2, 5, 8)
    pos = torch.arange(3, 8)
    torch.testing.assert_close(pe.embed(x, pos), x + sinusoidal_table(pos, 8))
    per_seq = torch.stack([torch.arange(5), torch.arange(2, 7)])  # (B, T)
    out = pe.embed(x, per_seq)
    torch.testing.assert_close(out[1], x[1] + sinusoidal_table(torch.arange(2, 7), 8))
    assert pe.rotate(x[:, None], pos) is not None and pe.score_bias(pos, pos) is None


def test_learned_embedding() -> None:
    pe = LearnedPositionalEmbedding(4, max_seq_len=6)
    x = torch.zeros(1, 3, 4)
    torch.testing.assert_close(pe.embed(x, torch.tensor([0, 2, 5]))[0], pe.weight[[0, 2, 5]])
    with pytest.raises(
        ValueError, match=r"position 6 is outside the learned table of max_seq_len=6"
    ):
        pe.embed(torch.zeros(1, 7, 4), torch.arange(7))


def test_none_is_identity() -> None:
    pe = NoPositionalEncoding()
    x = torch.randn(2, 3, 4)
    assert torch.equal(pe.embed(x, torch.arange(3)), x)
    assert pe.score_bias(torch.arange(3), torch.arange(3)) is None


# ---------------------------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------------------------

ROPES = [
    ("half", "none", 1.0),
    ("interleaved", "none", 1.0),
    ("half", "linear", 2.0),
    ("interleaved", "linear", 4.0),
    ("half", "ntk", 2.0),
    ("interleaved", "ntk", 3.0),
    ("half", "dynamic", 2.0),
    ("interleaved", "dynamic", 2.0),
]


@pytest.mark.parametrize(("layout", "scaling", "factor"), ROPES)
def test_rope_scores_depend_only_on_offset(layout: str, scaling: str, factor: float) -> None:
    """q rotated to position m, k rotated to position n: q_m·k_n depends only on m - n."""
    D, L = 16, 40
    # max_seq_len below L, so "dynamic" scaling is active.
    rope = RotaryEmbedding(D, scaling=scaling, factor=factor, layout=layout, max_seq_len=16)
    q, k = torch.randn(D), torch.randn(D)
    pos = torch.arange(L)
    qr = rope.rotate(q.expand(1, 1, L, D), pos)[0, 0]  # (L, D): q at every position
    kr = rope.rotate(k.expand(1, 1, L, D), pos)[0, 0]
    scores = qr @ kr.T  # scores[m, n] = q_m · k_n
    for m, n in [(0, 0), (3, 1), (1, 3), (10, 2), (5, 17)]:
        for shift in (1, 7, 20):
            assert scores[m + shift, n + shift].item() == pytest.approx(
                scores[m, n].item(), abs=1e-5
            )
    # ... and it really depends on the offset.
    assert abs(scores[5, 0] - scores[5, 5]) > 1e-3
    # A rotation: norms are preserved, position 0 is the identity.
    torch.testing.assert_close(qr.norm(dim=-1), q.norm().expand(L), atol=1e-5, rtol=0)
    torch.testing.assert_close(qr[0], q)


def test_rope_linear_scaling_is_position_interpolation() -> None:
    D = 8
    x = torch.randn(2, 3, 10, D)
    pos = torch.arange(10)
    scaled = RotaryEmbedding(D, scaling="linear", factor=2.0).rotate(x, pos)
    plain = RotaryEmbedding(D).rotate(x, pos.double() / 2)
    torch.testing.assert_close(scaled, plain)


def test_rope_frequencies_and_scalings() -> None:
    D = 8
    base = RotaryEmbedding(D).inv_freq()
    torch.testing.assert_close(
        base, torch.tensor([10000 ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64)
    )
    ntk = RotaryEmbedding(D, scaling="ntk", factor=4.0).inv_freq()
    b = 10000 * 4.0 ** (D / (D - 2))
    torch.testing.assert_close(
        ntk, torch.tensor([b ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64)
    )
    dyn = RotaryEmbedding(D, scaling="dynamic", factor=2.0, max_seq_len=16)
    torch.testing.assert_close(dyn.inv_freq(16), base)  # within the trained context: unscaled
    grow = 2.0 * 32 / 16 - 1.0
    b = 10000 * grow ** (D / (D - 2))
    torch.testing.assert_close(
        dyn.inv_freq(32),
        torch.tensor([b ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64),
    )


def test_rope_angles_per_pair() -> None:
    """Position p rotates pair i by p·θ_i: check one pair of each layout by hand."""
    D = 4
    x = torch.zeros(1, 1, 1, D)
    x[..., 0] = 1.0  # first element of pair 0 in both layouts
    p = 3
    for layout, partner in (("half", D // 2), ("interleaved", 1)):
        out = RotaryEmbedding(D, layout=layout).rotate(x, torch.tensor([p]))[0, 0, 0]
        assert out[0].item() == pytest.approx(math.cos(p), abs=1e-6)
        assert out[partner].item() == pytest.approx(math.sin(p), abs=1e-6)


def test_rope_layouts_are_permutations_of_each_other() -> None:
    D = 8
    x = torch.randn(2, 2, 5, D)
    pos = torch.arange(5)
    inter = RotaryEmbedding(D, layout="interleaved").rotate(x, pos)
    to_half = torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])  # interleaved -> half
    half = RotaryEmbedding(D, layout="half").rotate(x[..., to_half], pos)
    torch.testing.assert_close(half, inter[..., to_half])


def test_rope_batched_positions() -> None:
    rope = RotaryEmbedding(8)
    x = torch.randn(2, 3, 4, 8)
    pos = torch.stack([torch.arange(4), torch.arange(5, 9)])  # (B, T)
    out = rope.rotate(x, pos)
    torch.testing.assert_close(out[1:], rope.rotate(x[1:], torch.arange(5, 9)))
    torch.testing.assert_close(out[:1], rope.rotate(x[:1], torch.arange(4)))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"d_head": 7}, "even head dim"),
        ({"d_head": 8, "scaling": "yarn"}, r"unknown rope scaling 'yarn'; valid: none, linear"),
        ({"d_head": 8, "factor": 0.5}, "factor must be >= 1"),
        ({"d_head": 8, "layout": "zigzag"}, r"unknown rope layout 'zigzag'; valid: half"),
    ],
)
def test_rope_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RotaryEmbedding(**kwargs)


# ---------------------------------------------------------------------------------------------
# ALiBi
# ---------------------------------------------------------------------------------------------


def test_alibi_slopes_8_heads() -> None:
    expected = [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256]
    assert alibi_slopes(8).tolist() == pytest.approx(expected, rel=1e-6)


def test_alibi_slopes_non_power_of_two() -> None:
    """12 heads (paper's reference code): the 8-head slopes, then every other 16-head slope.

    The 16-head sequence is 2^-0.5, 2^-1, 2^-1.5, ..., 2^-8; every other one from the first is
    2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5, ...; the first 12 - 8 = 4 of those complete the list.
    """
    eight = [2.0**-k for k in range(1, 9)]
    extra = [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    assert alibi_slopes(12).tolist() == pytest.approx(eight + extra, rel=1e-6)
    assert alibi_slopes(16).tolist() == pytest.approx([2.0 ** (-k / 2) for k in range(1, 17)])
    assert alibi_slopes(1).tolist() == pytest.approx([2.0**-8])
    with pytest.raises(ValueError, match="n_heads must be >= 1"):
        alibi_slopes(0)


def test_alibi_bias_12_heads() -> None:
    alibi = ALiBi(12)
    q_pos, k_pos = torch.arange(2, 5), torch.arange(5)  # T=3 queries at the end of S=5 keys
    bias = alibi.score_bias(q_pos, k_pos)
    assert bias.shape == (12, 3, 5)
    slopes = alibi_slopes(12)
    for h in (0, 7, 8, 11):
        for t in range(3):
            for s in range(5):
                expected = -slopes[h].item() * abs((t + 2) - s)
                assert bias[h, t, s].item() == pytest.approx(expected, abs=1e-6)
    assert (bias[:, torch.arange(3), torch.arange(2, 5)] == 0).all()  # no bias on the diagonal
    batched = alibi.score_bias(torch.stack([q_pos, q_pos + 1]), torch.stack([k_pos, k_pos + 1]))
    assert batched.shape == (2, 12, 3, 5)
    torch.testing.assert_close(batched[0], bias)
    torch.testing.assert_close(batched[1], bias)  # shifting both leaves the bias unchanged


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sinusoidal", "learned", "rope", "alibi", "none"])
def test_build_every_encoding(name: str) -> None:
    assert name in POSITIONAL_ENCODINGS
    pe = build_positional_encoding(name, d_model=16, n_heads=4, max_seq_len=8)
    assert isinstance(pe, POSITIONAL_ENCODINGS.get(name))
    if name == "rope":
        assert isinstance(pe, RotaryEmbedding) and pe.d_head == 4
    if name == "alibi":
        assert isinstance(pe, ALiBi) and pe.slopes.shape == (4,)


def test_unknown_encoding_lists_valid_keys() -> None:
    with pytest.raises(
        ValueError,
        match=r"unknown positional encoding 'xpos'; valid: alibi, learned, none, rope, sinusoidal",
    ):
        build_positional_encoding("xpos", d_model=16, n_heads=4, max_seq_len=8)
