"""Residual sublayers and the encoder/decoder layers of §3.1.

Each sublayer (attention or FFN) is wrapped in a residual connection with dropout and a norm:

    post-norm (the paper):  x = Norm(x + Dropout(Sublayer(x)))
    pre-norm (GPT-2 on):    x = x + Dropout(Sublayer(Norm(x)))

``EncoderLayer``: self-attention + FFN. ``DecoderLayer``: masked self-attention + cross-attention
to the encoder memory + FFN (``cross_attention=False`` gives the decoder-only GPT block).
Module names follow ``torch.nn``'s order: ``self_attn``/``self_attn_norm``,
``cross_attn``/``cross_attn_norm``, ``ffn``/``ffn_norm``.

Shapes: B batch, T target length, S source length, E d_model, H heads.
Masks: bool True = may attend, float additive, broadcastable to (B, H, T, S).
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor, nn

from attnlab.layers.attention_backends import AttentionBackend
from attnlab.layers.feedforward import FeedForward
from attnlab.layers.kv_cache import CrossKVCache, LayerKVCache
from attnlab.layers.multihead import MultiHeadAttention
from attnlab.layers.norm import build_norm
from attnlab.layers.positional import PositionalEncoding

NormPosition = Literal["pre", "post"]


class _ResidualBlock(nn.Module):
    """Shared residual plumbing: ``enter`` before a sublayer, ``leave`` after it."""

    def __init__(self, dropout: float, norm_position: NormPosition) -> None:
        super().__init__()
        if norm_position not in ("pre", "post"):
            raise ValueError(f"norm_position must be 'pre' or 'post', got {norm_position!r}")
        self.pre_norm = norm_position == "pre"
        self.dropout = nn.Dropout(dropout)

    def enter(self, x: Tensor, norm: nn.Module) -> Tensor:
        """The sublayer's input: ``Norm(x)`` for pre-norm, ``x`` for post-norm."""
        return norm(x) if self.pre_norm else x

    def leave(self, x: Tensor, out: Tensor, norm: nn.Module) -> Tensor:
        """Residual add with dropout, then ``Norm`` for post-norm."""
        x = x + self.dropout(out)
        return x if self.pre_norm else norm(x)


class EncoderLayer(_ResidualBlock):
    """Self-attention + position-wise FFN, each in a residual sublayer.

    Args:
        d_model, n_heads, d_ff: sizes. n_kv_heads: GQA kv heads (default n_heads).
        dropout: residual dropout on each sublayer's output (§5.4). attn_dropout: dropout on
            attention weights (default ``dropout``). ffn_dropout: dropout on the FFN's hidden
            activations (default 0: the paper, GPT-2, BERT and ViT have none; ``torch.nn``'s
            layers use ``dropout`` there).
        activation: FFN activation. norm: ``"layernorm"``/``"rmsnorm"``. norm_eps: its epsilon.
        norm_position: ``"post"`` (paper) or ``"pre"``. bias: biases in linears and LayerNorm.
        backend: attention backend. rotary: RoPE module applied to q/k (or ``None``).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        *,
        n_kv_heads: int | None = None,
        dropout: float = 0.0,
        attn_dropout: float | None = None,
        ffn_dropout: float = 0.0,
        activation: str = "relu",
        norm: str = "layernorm",
        norm_eps: float = 1e-5,
        norm_position: NormPosition = "post",
        bias: bool = True,
        backend: str | AttentionBackend = "sdpa",
        rotary: PositionalEncoding | None = None,
    ) -> None:
        super().__init__(dropout, norm_position)
        attn_p = dropout if attn_dropout is None else attn_dropout
        self.self_attn = MultiHeadAttention(
            d_model,
            n_heads,
            n_kv_heads=n_kv_heads,
            dropout=attn_p,
            bias=bias,
            backend=backend,
            rotary=rotary,
        )
        self.self_attn_norm = build_norm(norm, d_model, eps=norm_eps, bias=bias)
        self.ffn = FeedForward(d_model, d_ff, activation=activation, dropout=ffn_dropout, bias=bias)
        self.ffn_norm = build_norm(norm, d_model, eps=norm_eps, bias=bias)

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        positions: Tensor | None = None,
        cache: LayerKVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """x ``(B, T, E)`` -> ``((B, T, E), weights (B, H, T, S) or None)``."""
        a, w = self.self_attn(
            self.enter(x, self.self_attn_norm),
            mask=mask,
            is_causal=is_causal,
            positions=positions,
            cache=cache,
            need_weights=need_weights,
        )
        x = self.leave(x, a, self.self_attn_norm)
        x = self.leave(x, self.ffn(self.enter(x, self.ffn_norm)), self.ffn_norm)
        return x, w


class DecoderLayer(_ResidualBlock):
    """Masked self-attention + cross-attention to ``memory`` + FFN (§3.1, "Decoder").

    Same arguments as :class:`EncoderLayer`, plus ``cross_attention`` (``False`` drops the
    encoder-decoder attention, giving the decoder-only block of GPT).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        *,
        cross_attention: bool = True,
        n_kv_heads: int | None = None,
        dropout: float = 0.0,
        attn_dropout: float | None = None,
        ffn_dropout: float = 0.0,
        activation: str = "relu",
        norm: str = "layernorm",
        norm_eps: float = 1e-5,
        norm_position: NormPosition = "post",
        bias: bool = True,
        backend: str | AttentionBackend = "sdpa",
        rotary: PositionalEncoding | None = None,
    ) -> None:
        super().__init__(dropout, norm_position)
        attn_p = dropout if attn_dropout is None else attn_dropout

        def mha(rot: PositionalEncoding | None) -> MultiHeadAttention:
            return MultiHeadAttention(
                d_model,
                n_heads,
                n_kv_heads=n_kv_heads,
                dropout=attn_p,
                bias=bias,
                backend=backend,
                rotary=rot,
            )

        self.self_attn = mha(rotary)
        self.self_attn_norm = build_norm(norm, d_model, eps=norm_eps, bias=bias)
        self.cross_attn = mha(None) if cross_attention else None
        self.cross_attn_norm = (
            build_norm(norm, d_model, eps=norm_eps, bias=bias) if cross_attention else None
        )
        self.ffn = FeedForward(d_model, d_ff, activation=activation, dropout=ffn_dropout, bias=bias)
        self.ffn_norm = build_norm(norm, d_model, eps=norm_eps, bias=bias)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        is_causal: bool = True,
        positions: Tensor | None = None,
        cache: LayerKVCache | None = None,
        cross_cache: CrossKVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, tuple[Tensor | None, Tensor | None]]:
        """Decode.

        Args:
            x: target-side input. memory: encoder output (required with cross-attention).
            mask: self-attention mask (padding, ALiBi bias); combined with ``is_causal``.
            memory_mask: cross-attention mask, e.g. source key padding ``(B, 1, 1, S)``.

        Shapes:
            x ``(B, T, E)``, memory ``(B, S, E)`` -> ``(B, T, E)`` and the weights
            ``(self (B, H, T, T'), cross (B, H, T, S))`` (each ``None`` unless ``need_weights``).
        """
        a, w_self = self.self_attn(
            self.enter(x, self.self_attn_norm),
            mask=mask,
            is_causal=is_causal,
            positions=positions,
            cache=cache,
            need_weights=need_weights,
        )
        x = self.leave(x, a, self.self_attn_norm)
        w_cross: Tensor | None = None
        if self.cross_attn is not None and self.cross_attn_norm is not None:
            if memory is None and not (cross_cache is not None and cross_cache.is_set):
                raise ValueError("this decoder layer has cross-attention: pass the encoder memory")
            c, w_cross = self.cross_attn(
                self.enter(x, self.cross_attn_norm),
                memory,
                mask=memory_mask,
                cache=cross_cache,
                need_weights=need_weights,
            )
            x = self.leave(x, c, self.cross_attn_norm)
        x = self.leave(x, self.ffn(self.enter(x, self.ffn_norm)), self.ffn_norm)
        return x, (w_self, w_cross)
