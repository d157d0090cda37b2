"""Multi-head attention (§3.2.2), self- and cross-attention, with grouped-query attention.

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

The h per-head projections are one ``(E, H·D)`` linear each (``q_proj``, ``k_proj``, ``v_proj``)
reshaped into heads; ``out_proj`` is W^O. With ``n_kv_heads < n_heads`` several query heads share
one key/value head (GQA; ``n_kv_heads=1`` is multi-query attention).

Shapes: B batch, T queries, S keys, E d_model, H heads, H_kv kv heads, D = E / H head dim.
Masks: bool True = may attend, float additive, broadcastable to (B, H, T, S); a 2-D mask is
``(T, S)`` (shared by the batch), so per-sequence key padding must be passed as ``(B, 1, 1, S)``
(see :func:`attnlab.layers.masks.as_attention_mask`).

Hook sites (:mod:`attnlab.layers.hooks`): ``q`` ``(B, H, T, D)``, ``k``/``v`` ``(B, H_kv, ·, D)``
of the tokens this call projects (after RoPE, before the cache), ``scores``/``weights``
``(B, H, T, S)`` (the math path, see :meth:`MultiHeadAttention._attention_with_weights`), ``z``
the per-head outputs ``(B, T, H, D)`` before W^O, ``out`` ``(B, T, E)``.
"""

from __future__ import annotations

import warnings
from typing import ClassVar, cast

import torch
from torch import Tensor, nn

from attnlab.layers.attention import scaled_dot_product_attention
from attnlab.layers.attention_backends import AttentionBackend, get_attention_backend
from attnlab.layers.hooks import ActivationHook
from attnlab.layers.kv_cache import CrossKVCache, LayerKVCache, positions_for
from attnlab.layers.masks import combine_masks
from attnlab.layers.positional import PositionalEncoding


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention.

    Args:
        d_model: E. n_heads: H (must divide E).
        n_kv_heads: H_kv (must divide H); default H.
        dropout: dropout on the attention weights.
        bias: biases on the four projections. qkv_bias: biases on q/k/v only (``None``: as
            ``bias``; Qwen2 has q/k/v biases and none on ``out_proj``).
        backend: attention backend name (``ATTENTION_BACKENDS``) or a callable of that signature.
        rotary: a positional encoding whose ``rotate`` is applied to q and k in self-attention
            (RoPE); ``None`` for none.

    Raises:
        ValueError: for sizes that are not positive integers, if ``n_heads`` does not divide
            ``d_model`` or ``n_kv_heads`` does not divide ``n_heads``, or for an unknown backend.
    """

    # Hook sites (attnlab.layers.hooks): None costs one attribute read per site.
    activation_hook: ActivationHook | None = None
    HOOK_SITES: ClassVar[tuple[str, ...]] = ("q", "k", "v", "scores", "weights", "z", "out")

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        n_kv_heads: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        backend: str | AttentionBackend = "sdpa",
        rotary: PositionalEncoding | None = None,
        qkv_bias: bool | None = None,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        for name, value in (("d_model", d_model), ("n_heads", n_heads), ("n_kv_heads", n_kv_heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                # d_model=0 would make a head dim of 0 (ZeroDivisionError in the math backend)
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if d_model % n_heads != 0:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        if n_heads % n_kv_heads != 0:
            raise ValueError(f"n_heads={n_heads} must be a multiple of n_kv_heads={n_kv_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.d_head = d_model // n_heads
        self.dropout = dropout
        self.backend_name = (
            backend if isinstance(backend, str) else getattr(backend, "__name__", "custom")
        )
        self.backend = get_attention_backend(backend)
        in_bias = bias if qkv_bias is None else qkv_bias
        self.q_proj = nn.Linear(d_model, n_heads * self.d_head, bias=in_bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=in_bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=in_bias)
        self.out_proj = nn.Linear(n_heads * self.d_head, d_model, bias=bias)
        self.rotary = rotary

    def _heads(self, x: Tensor, n: int) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, n, self.d_head).transpose(1, 2)  # (B, n, L, D)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Deprecated (it was a seam for patching decode copies in): the input projections of
        self-attention, x W^Q, x W^K, x W^V.

        Shapes:
            x ``(B, T, E)`` -> q ``(B, T, H·D)``, k and v ``(B, T, H_kv·D)``.
        """
        warnings.warn(
            "MultiHeadAttention.project_qkv is deprecated: call q_proj, k_proj and v_proj",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def _self_projections(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q ``(B, H, T, D)``, k and v ``(B, H_kv, T, D)`` of self-attention."""
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)  # (B, T, H·D | H_kv·D)
        return (
            self._heads(q, self.n_heads),
            self._heads(k, self.n_kv_heads),
            self._heads(v, self.n_kv_heads),
        )

    def _cross_keys_values(
        self, memory: Tensor | None, cache: CrossKVCache | None, B: int
    ) -> tuple[Tensor, Tensor]:
        """k, v ``(B, H_kv, S, D)`` of the memory: from a filled cache, or projected (cached)."""
        if cache is not None and cache.is_set:
            return cast(Tensor, cache.k), cast(Tensor, cache.v)
        if memory is None:
            raise ValueError("cross-attention needs memory (or a filled CrossKVCache)")
        if memory.dim() != 3 or memory.shape[0] != B or memory.shape[-1] != self.d_model:
            raise ValueError(
                f"memory must be ({B}, S, {self.d_model}), got shape {tuple(memory.shape)}"
            )
        k = self._heads(self.k_proj(memory), self.n_kv_heads)  # (B, H_kv, S, D)
        v = self._heads(self.v_proj(memory), self.n_kv_heads)  # (B, H_kv, S, D)
        hook = self.activation_hook
        if hook is not None:
            k, v = hook("k", k), hook("v", v)
        if cache is not None:
            cache.set(k, v)
        return k, v

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        positions: Tensor | None = None,
        cache: LayerKVCache | None = None,
        cross_cache: CrossKVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Self-attention (``memory=None``) or cross-attention to ``memory``.

        Args:
            x: queries' input. memory: keys/values' input for cross-attention.
            mask: bool (True = may attend) / additive float, broadcastable to (B, H, T, S).
            is_causal: causal mask (bottom-right aligned when T != S, e.g. with a cache).
            need_weights: also return per-head weights, computed by the math path (with the
                backend's sparsity pattern; an error for linear attention).
            positions: absolute positions of x's tokens for RoPE, ``(T,)|(B, T)``; default
                continues after what ``cache`` holds.
            cache: self-attention's :class:`LayerKVCache`, extended in place.
            cross_cache: cross-attention's :class:`CrossKVCache` (filled by the first call,
                then used instead of ``memory``).

        Shapes:
            x ``(B, T, E)``, memory ``(B, S, E)`` -> out ``(B, T, E)``, weights ``(B, H, T, S)``.

        Returns:
            ``(out, weights)``; weights is ``None`` unless ``need_weights`` (the convention of
            ``torch.nn.MultiheadAttention``).
        """
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (B, T, {self.d_model}), got shape {tuple(x.shape)}")
        B, T, _ = x.shape
        hook = self.activation_hook
        cross = memory is not None or cross_cache is not None
        if cross and cache is not None:
            raise ValueError("cross-attention takes cross_cache, not a self-attention cache")
        if not cross:
            q, k, v = self._self_projections(x)  # (B, H, T, D), (B, H_kv, T, D) twice
            if self.rotary is not None:
                if positions is None:
                    positions = positions_for(T, cache, x.device)
                q = self.rotary.rotate(q, positions)
                k = self.rotary.rotate(k, positions)
            if hook is not None:
                q, k, v = hook("q", q), hook("k", k), hook("v", v)
            if cache is not None:
                k, v = cache.update(k, v)  # (B, H_kv, S, D)
        else:
            q = self._heads(self.q_proj(x), self.n_heads)  # (B, H, T, D)
            if hook is not None:
                q = hook("q", q)
            k, v = self._cross_keys_values(memory, cross_cache, B)  # (B, H_kv, S, D) each
        dropout_p = self.dropout if self.training else 0.0
        weights: Tensor | None = None
        if need_weights or (hook is not None and (hook.wants("scores") or hook.wants("weights"))):
            out, weights = self._attention_with_weights(
                q, k, v, mask, is_causal, dropout_p, exact_output=need_weights
            )
        else:
            out = self.backend(q, k, v, mask=mask, is_causal=is_causal, dropout_p=dropout_p)
        out = out.transpose(1, 2)  # (B, T, H, D)
        if hook is not None:
            out = hook("z", out)
        out = self.out_proj(out.reshape(B, T, self.n_heads * self.d_head))  # (B, T, E)
        if hook is not None:
            out = hook("out", out)
        return out, weights if need_weights else None

    def _attention_with_weights(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        is_causal: bool,
        p: float,
        *,
        exact_output: bool = True,
    ) -> tuple[Tensor, Tensor]:
        """The math path, with this backend's sparsity pattern, so weights are the real ones.

        Exact softmax backends (math, sdpa, chunked) need nothing extra; a backend with a
        ``dense_mask`` (sliding window) contributes its pattern as a mask; a backend that computes
        no softmax weights (linear attention, ``softmax = False``) raises ``ValueError``.

        The ``scores`` and ``weights`` hook sites fire here. The output is the math path's
        (``weights @ v``) when ``exact_output`` (``need_weights``) or when a hook replaced the
        scores or weights with other values; otherwise the backend computes it as usual, so that
        reading (or re-writing unchanged) the weights leaves the output bitwise unchanged.
        """
        if getattr(self.backend, "softmax", True) is False:
            raise ValueError(
                f"backend {self.backend_name!r} computes no softmax attention weights; "
                "use a softmax backend (math, sdpa, chunked, sliding_window) for need_weights"
            )
        dense_mask = getattr(self.backend, "dense_mask", None)
        math_mask = mask
        if dense_mask is not None:
            T, S = q.shape[-2], k.shape[-2]
            math_mask = combine_masks(mask, dense_mask(T, S, is_causal=is_causal, device=q.device))
        hook, edited = self.activation_hook, False

        def site(name: str, x: Tensor) -> Tensor:
            nonlocal edited
            y = hook(name, x) if hook is not None else x
            edited = edited or not (y is x or torch.equal(y, x))  # same values: not an edit
            return y

        out, weights = cast(
            tuple[Tensor, Tensor],
            scaled_dot_product_attention(
                q, k, v, mask=math_mask, is_causal=is_causal, dropout_p=p, return_weights=True,
                hook=site,
            ),
        )  # fmt: skip
        if not (exact_output or edited):
            out = self.backend(q, k, v, mask=mask, is_causal=is_causal, dropout_p=p)
        return out, weights

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
            f"backend={self.backend_name!r}"
        )


__all__ = ["MultiHeadAttention"]
