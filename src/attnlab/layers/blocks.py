"""Residual sublayers and the encoder/decoder layers of §3.1.

Each sublayer (attention or FFN) is wrapped in a residual connection with dropout and a norm:

    post-norm (the paper):  x = Norm(x + Dropout(Sublayer(x)))
    pre-norm (GPT-2 on):    x = x + Dropout(Sublayer(Norm(x)))

``EncoderLayer``: self-attention + FFN. ``DecoderLayer``: masked self-attention + cross-attention
to the encoder memory + FFN (without ``cross_attn`` it is the decoder-only GPT block). A layer
is assembled from its parts — the attention modules, the FFN and one norm per sublayer — which
the model's builder makes from its config (:mod:`attnlab.models.common`); the layer itself only
wires the residual connections. Module names follow ``torch.nn``'s order:
``self_attn``/``self_attn_norm``, ``cross_attn``/``cross_attn_norm``, ``ffn``/``ffn_norm``.
A layer returns its output only; attention weights are read from the attention modules
(``MultiHeadAttention(need_weights=True)``) or through hook sites.

Hook sites (:mod:`attnlab.layers.hooks`), all ``(B, T, E)``: ``resid_pre`` (the layer's input),
``resid_mid`` (after the self-attention sublayer), ``resid_cross`` (after cross-attention),
``ffn.out`` (the FFN's output, before dropout and the residual add), ``resid_post`` (the output).

Shapes: B batch, T target length, S source length, E d_model, H heads.
Masks: bool True = may attend, float additive, broadcastable to (B, H, T, S).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from torch import Tensor, nn

from attnlab.layers.hooks import ActivationHook
from attnlab.layers.kv_cache import CrossKVCache, LayerKVCache
from attnlab.layers.multihead import MultiHeadAttention

NormPosition = Literal["pre", "post"]


class _ResidualBlock(nn.Module):
    """Shared residual plumbing: ``enter`` before a sublayer, ``leave`` after it."""

    ffn: nn.Module
    ffn_norm: nn.Module
    # Hook sites (attnlab.layers.hooks): None costs one attribute read per site.
    activation_hook: ActivationHook | None = None
    HOOK_SITES: ClassVar[tuple[str, ...]] = (
        "resid_pre", "resid_mid", "resid_cross", "ffn.out", "resid_post",
    )  # fmt: skip

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
        drop = self.dropout
        # dropout is the identity in eval mode or at p = 0: skip the module call (decoding runs
        # this twice per layer and token)
        x = x + (drop(out) if drop.training and drop.p > 0 else out)
        return x if self.pre_norm else norm(x)

    def site(self, name: str, x: Tensor) -> Tensor:
        """Hook site ``name`` (call only when ``activation_hook`` is set)."""
        return x if self.activation_hook is None else self.activation_hook(name, x)

    def feed_forward(self, x: Tensor) -> Tensor:
        """The FFN sublayer (its ``ffn.out`` site included): ``(B, T, E) -> (B, T, E)``."""
        f = self.ffn(self.enter(x, self.ffn_norm))
        if self.activation_hook is not None:
            f = self.activation_hook("ffn.out", f)
        return self.leave(x, f, self.ffn_norm)


class EncoderLayer(_ResidualBlock):
    """Self-attention + position-wise FFN, each in a residual sublayer.

    Args:
        self_attn: the self-attention (its backend, heads, RoPE, attention dropout).
        ffn: the position-wise feed-forward network ``(B, T, E) -> (B, T, E)``.
        self_attn_norm, ffn_norm: the norm of each sublayer.
        dropout: residual dropout on each sublayer's output (§5.4).
        norm_position: ``"post"`` (the paper) or ``"pre"``.

    Raises:
        ValueError: for an unknown ``norm_position``.
    """

    def __init__(
        self,
        self_attn: MultiHeadAttention,
        ffn: nn.Module,
        self_attn_norm: nn.Module,
        ffn_norm: nn.Module,
        *,
        dropout: float = 0.0,
        norm_position: NormPosition = "post",
    ) -> None:
        super().__init__(dropout, norm_position)
        self.self_attn = self_attn
        self.self_attn_norm = self_attn_norm
        self.ffn = ffn
        self.ffn_norm = ffn_norm

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        positions: Tensor | None = None,
        cache: LayerKVCache | None = None,
    ) -> Tensor:
        """x ``(B, T, E)`` -> ``(B, T, E)``; ``mask`` broadcastable to (B, H, T, S)."""
        hooked = self.activation_hook is not None
        if hooked:
            x = self.site("resid_pre", x)
        a, _ = self.self_attn(
            self.enter(x, self.self_attn_norm),
            mask=mask,
            is_causal=is_causal,
            positions=positions,
            cache=cache,
        )
        x = self.leave(x, a, self.self_attn_norm)
        if hooked:
            x = self.site("resid_mid", x)
        x = self.feed_forward(x)
        return self.site("resid_post", x) if hooked else x


class DecoderLayer(_ResidualBlock):
    """Masked self-attention + cross-attention to ``memory`` + FFN (§3.1, "Decoder").

    Args:
        self_attn, ffn, self_attn_norm, ffn_norm, dropout, norm_position: as
            :class:`EncoderLayer`.
        cross_attn, cross_attn_norm: the encoder-decoder attention and its norm (both or
            neither; neither gives the decoder-only block of GPT).

    Raises:
        ValueError: for an unknown ``norm_position``, or only one of the cross-attention parts.
    """

    def __init__(
        self,
        self_attn: MultiHeadAttention,
        ffn: nn.Module,
        self_attn_norm: nn.Module,
        ffn_norm: nn.Module,
        *,
        cross_attn: MultiHeadAttention | None = None,
        cross_attn_norm: nn.Module | None = None,
        dropout: float = 0.0,
        norm_position: NormPosition = "post",
    ) -> None:
        super().__init__(dropout, norm_position)
        if (cross_attn is None) != (cross_attn_norm is None):
            raise ValueError("pass both cross_attn and cross_attn_norm, or neither")
        self.self_attn = self_attn
        self.self_attn_norm = self_attn_norm
        self.cross_attn = cross_attn
        self.cross_attn_norm = cross_attn_norm
        self.ffn = ffn
        self.ffn_norm = ffn_norm

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
        value_embed: Tensor | None = None,
    ) -> Tensor:
        """Decode.

        Args:
            x: target-side input. memory: encoder output (required with cross-attention, unless
                ``cross_cache`` already holds its keys/values).
            mask: self-attention mask (padding, ALiBi bias); combined with ``is_causal``.
            memory_mask: cross-attention mask, e.g. source key padding ``(B, 1, 1, S)``.
            cache: the self-attention's :class:`LayerKVCache`. cross_cache: the
                cross-attention's :class:`CrossKVCache`.
            value_embed: ``(B, T, H_kv·D)`` the value embedding of x's tokens, for a
                self-attention with value embeddings (:class:`MultiHeadAttention`).

        Shapes:
            x ``(B, T, E)``, memory ``(B, S, E)`` -> ``(B, T, E)``.

        Raises:
            ValueError: without ``memory`` (or a filled ``cross_cache``) for a layer with
                cross-attention.
        """
        hooked = self.activation_hook is not None
        if hooked:
            x = self.site("resid_pre", x)
        a, _ = self.self_attn(
            self.enter(x, self.self_attn_norm),
            mask=mask,
            is_causal=is_causal,
            positions=positions,
            cache=cache,
            value_embed=value_embed,
        )
        x = self.leave(x, a, self.self_attn_norm)
        if hooked:
            x = self.site("resid_mid", x)
        if self.cross_attn is not None and self.cross_attn_norm is not None:
            if memory is None and not (cross_cache is not None and cross_cache.is_set):
                raise ValueError("this decoder layer has cross-attention: pass the encoder memory")
            q = self.enter(x, self.cross_attn_norm)
            c, _ = self.cross_attn(q, memory, mask=memory_mask, cross_cache=cross_cache)
            x = self.leave(x, c, self.cross_attn_norm)
            if hooked:
                x = self.site("resid_cross", x)
        x = self.feed_forward(x)
        return self.site("resid_post", x) if hooked else x
