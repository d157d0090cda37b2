"""Multi-head attention (§3.2.2), self- and cross-attention, with grouped-query attention.

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

The h per-head projections are one ``(E, H·D)`` linear each (``q_proj``, ``k_proj``, ``v_proj``)
reshaped into heads; ``out_proj`` is W^O. With ``n_kv_heads < n_heads`` several query heads share
one key/value head (GQA; ``n_kv_heads=1`` is multi-query attention). While autograd records (a
training step), self-attention multiplies x once by the three weights stacked, as nanoGPT's one
``c_attn`` does, rather than three times; the parameters stay three modules
(:meth:`MultiHeadAttention._stacked_in_weights` says when, and when not).

Two later additions, both off unless their modules are passed:

- QK-norm (Dehghani et al. 2023, "Scaling Vision Transformers to 22 Billion Parameters", §2.1;
  Wortsman et al. 2023; OLMo 2, Qwen3, the modded-nanogpt speedrun): ``q_norm`` and ``k_norm``
  normalise each head's query and key over the head dimension D, after the projection and before
  RoPE, so the attention logits no longer grow with the scale of the projected q and k (the
  instability Dehghani et al. met at scale); in self- and cross-attention.
- Value embeddings (the modded-nanogpt speedrun, Keller Jordan et al. 2024): with
  ``value_embed=True`` the layer owns two learned scalars ``value_lambdas = (a, b)``, initially
  ``(0.5, 0.5)``, and its forward takes ``value_embed``, a per-token vector of the values' width
  (a row of a token-embedding table the model looks up), mixed into the values of the tokens it
  projects: ``v = a·v + b·ve`` (before the KV cache, so cached values are the mixed ones).

Shapes: B batch, T queries, S keys, E d_model, H heads, H_kv kv heads, D = E / H head dim.
Masks: bool True = may attend, float additive, broadcastable to (B, H, T, S); a 2-D mask is
``(T, S)`` (shared by the batch), so per-sequence key padding must be passed as ``(B, 1, 1, S)``
(see :func:`attnlab.layers.masks.as_attention_mask`).

Hook sites (:mod:`attnlab.layers.hooks`): ``q`` ``(B, H, T, D)``, ``k``/``v`` ``(B, H_kv, ·, D)``
of the tokens this call projects (after QK-norm and RoPE, v with its value embedding mixed in;
before the cache), ``scores``/``weights`` ``(B, H, T, S)`` (the math path, see
:meth:`MultiHeadAttention._attention_with_weights`), ``z``
the per-head outputs ``(B, T, H, D)`` before W^O, ``out`` ``(B, T, E)``.
"""

from __future__ import annotations

import warnings
from typing import ClassVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as torch_module

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
        q_norm, k_norm: QK-norm: modules applied to q ``(B, H, T, D)`` and k ``(B, H_kv, S, D)``
            over D after the projections, before RoPE (both or neither); ``None``: none.
        value_embed: the layer mixes a value embedding into its values (see the module doc).

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
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
        value_embed: bool = False,
    ) -> None:
        super().__init__()
        if (q_norm is None) != (k_norm is None):
            raise ValueError("pass both q_norm and k_norm (QK-norm), or neither")
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
        self.q_norm, self.k_norm = q_norm, k_norm
        self.value_lambdas = nn.Parameter(torch.tensor([0.5, 0.5])) if value_embed else None

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

    def _self_projections(
        self, x: Tensor, value_embed: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """q ``(B, H, T, D)``, k and v ``(B, H_kv, T, D)`` of self-attention (q and k
        normalised with QK-norm, the value embedding ``(B, T, H_kv·D)`` mixed into v)."""
        stacked = self._stacked_in_weights(x.shape[0] * x.shape[1])
        if stacked is None:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)  # (B, T, H·D | H_kv·D)
        else:  # one product for the three (a training step's forward and backward)
            kv = self.n_kv_heads * self.d_head
            q, k, v = F.linear(x, *stacked).split([self.n_heads * self.d_head, kv, kv], dim=-1)
        v = self.mix_values(v, value_embed)
        return (
            self.norm_q(self._heads(q, self.n_heads)),
            self.norm_k(self._heads(k, self.n_kv_heads)),
            self._heads(v, self.n_kv_heads),
        )

    def _stacked_in_weights(self, tokens: int) -> tuple[Tensor, Tensor | None] | None:
        """W^Q, W^K and W^V stacked ``(H·D + 2·H_kv·D, E)`` with their biases, so that a
        training step projects its ``tokens`` (B·T) rows of x once (one matrix product forward,
        two backward, where three linears take three and six and add up three input gradients);
        ``None`` where the three are called as modules.

        The stacked weight is a copy, and autograd keeps it for the backward pass. So they are
        stacked only while autograd records (not when decoding, where each token would pay for
        the copy), only when the copy is no larger than the input x it multiplies (``tokens >=
        H·D + 2·H_kv·D``: at most one more ``(B, T, E)`` tensor per layer, of the dozen or so a
        layer keeps; a large model trained on few tokens is not charged a quarter of its
        weights again), and only for three plain ``nn.Linear`` modules that nothing observes or
        replaces: no module hooks on them (nor global ones), no instance-level ``forward``; a
        quantized or LoRA projection is another type and is called as it is. The parameters
        stay three, so checkpoints, converters and optimizers see the same names and shapes;
        their gradients reach each one through the stacking's backward.
        """
        if not torch.is_grad_enabled():  # decoding: nothing more to read
            return None
        if tokens < self.q_proj.out_features + 2 * self.k_proj.out_features:
            return None
        projections = (self.q_proj, self.k_proj, self.v_proj)
        for m in projections:
            if (
                type(m) is not nn.Linear
                or m._forward_hooks
                or m._forward_pre_hooks
                or m._backward_hooks
                or m._backward_pre_hooks
                or "forward" in m.__dict__
            ):
                return None
        if (
            torch_module._global_forward_hooks
            or torch_module._global_forward_pre_hooks
            or torch_module._global_backward_hooks
            or torch_module._global_backward_pre_hooks
        ):
            return None
        linears = cast(tuple[nn.Linear, nn.Linear, nn.Linear], projections)
        weight = torch.cat([m.weight for m in linears])  # (H·D + 2·H_kv·D, E)
        biases = [m.bias for m in linears]
        if any(b is None for b in biases):
            return None if any(b is not None for b in biases) else (weight, None)
        return weight, torch.cat(cast(list[Tensor], biases))

    def norm_q(self, q: Tensor) -> Tensor:
        """QK-norm of the queries ``(B, H, T, D)`` over D (the identity without it)."""
        return q if self.q_norm is None else self.q_norm(q)

    def norm_k(self, k: Tensor) -> Tensor:
        """QK-norm of the keys ``(B, H_kv, S, D)`` over D (the identity without it)."""
        return k if self.k_norm is None else self.k_norm(k)

    def mix_values(self, v: Tensor, value_embed: Tensor | None) -> Tensor:
        """``a·v + b·value_embed`` for a layer with value embeddings, else ``v``.

        Shapes:
            v and value_embed ``(B, T, H_kv·D)`` -> ``(B, T, H_kv·D)``.

        Raises:
            ValueError: for a value embedding given to a layer without them, or missing (or of
                another shape) for a layer with them.
        """
        lambdas = self.value_lambdas
        if lambdas is None:
            if value_embed is not None:
                raise ValueError("this attention has no value embeddings (value_embed=False)")
            return v
        if value_embed is None or value_embed.shape != v.shape:
            got = None if value_embed is None else tuple(value_embed.shape)
            raise ValueError(
                f"this attention mixes a value embedding into its values: pass value_embed of "
                f"shape {tuple(v.shape)}, got {got}"
            )
        return lambdas[0] * v + lambdas[1] * value_embed

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
        k = self.norm_k(self._heads(self.k_proj(memory), self.n_kv_heads))  # (B, H_kv, S, D)
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
        value_embed: Tensor | None = None,
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
            value_embed: ``(B, T, H_kv·D)`` the value embedding of x's tokens (self-attention
                of a layer built with ``value_embed=True``; required there).

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
        if cross and (cache is not None or value_embed is not None):
            raise ValueError(
                "cross-attention takes cross_cache (not a self-attention cache) and no value_embed"
            )
        if not cross:
            q, k, v = self._self_projections(x, value_embed)  # (B, H, T, D), (B, H_kv, T, D) twice
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
            q = self.norm_q(self._heads(self.q_proj(x), self.n_heads))  # (B, H, T, D)
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
        extra = ", value_embed=True" if self.value_lambdas is not None else ""
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
            f"backend={self.backend_name!r}{extra}"
        )


__all__ = ["MultiHeadAttention"]
