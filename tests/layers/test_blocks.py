"""Encoder and decoder layers (§3.1): parity with ``torch.nn``, gradcheck, variants, errors."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from attnlab.layers import (
    DecoderLayer,
    EncoderLayer,
    FeedForward,
    MultiHeadAttention,
    build_norm,
    padding_mask_from_lengths,
)
from attnlab.viz.capture import record_attention

E, H, F_DIM = 16, 4, 32


def _parts(
    d_model: int,
    n_heads: int,
    d_ff: int,
    *,
    n_kv_heads: int | None = None,
    dropout: float = 0.0,
    activation: str = "relu",
    norm: str = "layernorm",
    bias: bool = True,
    backend: str = "sdpa",
    rotary: object = None,
) -> dict:
    """Builders' work by hand: the attention, FFN and norms of a layer from sizes."""

    def mha(rot: object = None) -> MultiHeadAttention:
        return MultiHeadAttention(
            d_model, n_heads, n_kv_heads=n_kv_heads, dropout=dropout, bias=bias, backend=backend,
            rotary=rot,  # type: ignore[arg-type]
        )  # fmt: skip

    def nrm() -> nn.Module:
        return build_norm(norm, d_model, bias=bias)

    def ffn() -> nn.Module:
        return FeedForward(d_model, d_ff, activation=activation, bias=bias)

    return {"mha": mha, "norm": nrm, "ffn": ffn, "rotary": rotary, "dropout": dropout}


def enc_layer(*sizes: int, norm_position: str = "post", **kw: object) -> EncoderLayer:
    p = _parts(*sizes, **kw)  # type: ignore[arg-type]
    attn, attn_norm = p["mha"](p["rotary"]), p["norm"]()
    ffn, ffn_norm = p["ffn"](), p["norm"]()
    return EncoderLayer(
        attn,
        ffn,
        attn_norm,
        ffn_norm,
        dropout=p["dropout"],
        norm_position=norm_position,  # type: ignore[arg-type]
    )


def dec_layer(
    *sizes: int, norm_position: str = "post", cross_attention: bool = True, **kw: object
) -> DecoderLayer:
    p = _parts(*sizes, **kw)  # type: ignore[arg-type]
    attn, attn_norm = p["mha"](p["rotary"]), p["norm"]()
    cross, cross_norm = (p["mha"](), p["norm"]()) if cross_attention else (None, None)
    ffn, ffn_norm = p["ffn"](), p["norm"]()
    return DecoderLayer(
        attn, ffn, attn_norm, ffn_norm, cross_attn=cross, cross_attn_norm=cross_norm,
        dropout=p["dropout"], norm_position=norm_position,  # type: ignore[arg-type]
    )  # fmt: skip


def _randomise_norms(module: nn.Module) -> None:
    """torch initialises LayerNorm to (1, 0); random values make the copy meaningful."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.normal_(1.0, 0.2)
                m.bias.normal_(0.0, 0.2)
            if isinstance(m, nn.MultiheadAttention):
                m.in_proj_bias.normal_(0.0, 0.2)
                m.out_proj.bias.normal_(0.0, 0.2)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_matches_torch(
    copy_encoder_layer: Callable[[nn.Module, nn.TransformerEncoderLayer], None],
    activation: str,
    norm_first: bool,
    backend: str,
) -> None:
    ref = nn.TransformerEncoderLayer(
        E, H, F_DIM, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    )
    _randomise_norms(ref)
    ours = enc_layer(
        E,
        H,
        F_DIM,
        activation=activation,
        norm_position="pre" if norm_first else "post",
        backend=backend,
    )
    copy_encoder_layer(ours, ref)
    ref.eval()
    ours.eval()
    x = torch.randn(3, 5, E)
    keep = padding_mask_from_lengths(torch.tensor([5, 3, 1]), 5)  # (B, 1, 1, S)
    x_ref = x.clone().requires_grad_(True)
    x_ours = x.clone().requires_grad_(True)
    # Grad enabled: torch takes its reference (non-fast) path.
    y_ref = ref(x_ref, src_key_padding_mask=~keep[:, 0, 0])
    y_ours = ours(x_ours, mask=keep)
    assert (y_ours - y_ref).abs().max() <= 1e-5
    y_ref.pow(2).sum().backward()
    y_ours.pow(2).sum().backward()
    assert (x_ours.grad - x_ref.grad).abs().max() <= 1e-4
    # Causal self-attention (a decoder-only stack of encoder layers).
    tm = nn.Transformer.generate_square_subsequent_mask(5)
    y_ref = ref(x, src_mask=tm, is_causal=True)
    y_ours = ours(x, is_causal=True)
    assert (y_ours - y_ref).abs().max() <= 1e-5


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_decoder_layer_matches_torch(
    copy_decoder_layer: Callable[[nn.Module, nn.TransformerDecoderLayer], None],
    activation: str,
    norm_first: bool,
    backend: str,
) -> None:
    ref = nn.TransformerDecoderLayer(
        E, H, F_DIM, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    )
    _randomise_norms(ref)
    ours = dec_layer(
        E,
        H,
        F_DIM,
        activation=activation,
        norm_position="pre" if norm_first else "post",
        backend=backend,
    )
    copy_decoder_layer(ours, ref)
    ref.eval()
    ours.eval()
    B, T, S = 3, 4, 6
    x, memory = torch.randn(B, T, E), torch.randn(B, S, E)
    src_keep = padding_mask_from_lengths(torch.tensor([6, 4, 2]), S)  # (B, 1, 1, S)
    tgt_keep = padding_mask_from_lengths(torch.tensor([4, 4, 3]), T)  # (B, 1, 1, T)
    tm = nn.Transformer.generate_square_subsequent_mask(T)
    y_ref = ref(
        x,
        memory,
        tgt_mask=tm,
        tgt_is_causal=True,
        tgt_key_padding_mask=torch.zeros(B, T).masked_fill(~tgt_keep[:, 0, 0], float("-inf")),
        memory_key_padding_mask=~src_keep[:, 0, 0],
    )
    y_ours = ours(x, memory, mask=tgt_keep, memory_mask=src_keep)
    assert (y_ours - y_ref).abs().max() <= 1e-5
    with record_attention(ours) as records:  # the weights, from hooks on the attention modules
        y_w = ours(x, memory, mask=tgt_keep, memory_mask=src_keep)
    assert (y_w - y_ref).abs().max() <= 1e-5
    (w_self,), (w_cross,) = records["self_attn"], records["cross_attn"]
    assert w_self.shape == (B, H, T, T) and w_cross.shape == (B, H, T, S)
    assert (w_self.triu(1) == 0).all()  # causal
    assert (w_cross[2, :, :, 2:] == 0).all()  # padded source keys


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_gradcheck_encoder_layer(norm_position: str) -> None:
    layer = enc_layer(8, 2, 12, activation="gelu", norm_position=norm_position).double()
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    keep = padding_mask_from_lengths(torch.tensor([3, 2]), 3)
    assert torch.autograd.gradcheck(lambda t: layer(t, mask=keep), (x,))


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_gradcheck_decoder_layer(norm_position: str) -> None:
    layer = dec_layer(8, 2, 12, activation="gelu", norm_position=norm_position).double()
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    memory = torch.randn(2, 4, 8, dtype=torch.float64, requires_grad=True)
    src_keep = padding_mask_from_lengths(torch.tensor([4, 2]), 4)
    assert torch.autograd.gradcheck(lambda t, m: layer(t, m, memory_mask=src_keep), (x, memory))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"norm": "rmsnorm", "activation": "swiglu", "bias": False, "norm_position": "pre"},
        {"n_kv_heads": 2, "activation": "geglu"},
        {"n_kv_heads": 1, "dropout": 0.1},
    ],
)
def test_variants_forward_backward(kwargs: dict) -> None:
    enc = enc_layer(E, H, F_DIM, **kwargs)
    dec = dec_layer(E, H, F_DIM, **kwargs)
    x, memory = torch.randn(2, 5, E), torch.randn(2, 7, E)
    out = dec(enc(x), memory)
    out.pow(2).mean().backward()
    assert torch.isfinite(out).all()
    for name, p in [*enc.named_parameters(), *dec.named_parameters()]:
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_decoder_only_block_has_no_cross_attention() -> None:
    block = dec_layer(E, H, F_DIM, cross_attention=False)
    assert block.cross_attn is None and block.cross_attn_norm is None
    x = torch.randn(1, 4, E)
    out = block(x)
    assert out.shape == x.shape
    # Causal by default: changing the last token leaves the first three outputs unchanged.
    x2 = x.clone()
    x2[:, -1] = torch.randn(E)
    torch.testing.assert_close(block(x2)[:, :3], out[:, :3])


def test_decoder_needs_memory() -> None:
    with pytest.raises(ValueError, match="pass the encoder memory"):
        dec_layer(E, H, F_DIM)(torch.randn(1, 3, E))


def test_bad_layer_arguments() -> None:
    with pytest.raises(ValueError, match=r"norm_position must be 'pre' or 'post', got 'middle'"):
        enc_layer(E, H, F_DIM, norm_position="middle")
    with pytest.raises(ValueError, match=r"n_heads=5 must divide d_model=16"):
        enc_layer(E, 5, F_DIM)
    with pytest.raises(
        ValueError, match=r"unknown norm 'groupnorm'; valid: batchnorm, layernorm, rmsnorm"
    ):
        dec_layer(E, H, F_DIM, norm="groupnorm")
    with pytest.raises(ValueError, match=r"unknown activation 'mish'; valid: .*swiglu"):
        dec_layer(E, H, F_DIM, activation="mish")
    mha, ffn = MultiHeadAttention(E, H), FeedForward(E, F_DIM)
    with pytest.raises(ValueError, match="both cross_attn and cross_attn_norm, or neither"):
        DecoderLayer(
            mha, ffn, nn.LayerNorm(E), nn.LayerNorm(E), cross_attn=MultiHeadAttention(E, H)
        )
