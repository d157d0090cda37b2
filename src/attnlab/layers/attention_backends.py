"""Attention backends: interchangeable implementations of eq. (1) behind one signature.

    fn(q, k, v, *, mask=None, is_causal=False, dropout_p=0.0, scale=None) -> out

q ``(B, H, T, D)``, k/v ``(B, H_kv, S, D)``, out ``(B, H, T, D)``. Masks follow the library's
convention (bool True = may attend, float additive, broadcast to (B, H, T, S)); ``is_causal`` is
bottom-right aligned when T != S. Backends:

- ``"math"``: :func:`attnlab.layers.attention.scaled_dot_product_attention`, the readable path and
  the only one that returns weights.
- ``"sdpa"``: ``torch.nn.functional.scaled_dot_product_attention`` (flash / memory-efficient
  kernels where PyTorch has them).
- ``"chunked"``, ``"sliding_window"``, ``"linear"``: the efficient backends of
  :mod:`attnlab.layers.attention_chunked`, :mod:`attnlab.layers.attention_sliding` and
  :mod:`attnlab.layers.attention_linear`, registered when :mod:`attnlab.layers` is imported.

Backends with options (a window size, a block size, a feature map) also register a factory in
``ATTENTION_BACKEND_FACTORIES``; ``get_attention_backend("sliding_window", window=128)`` builds one.

Deviations from PyTorch's SDPA that this wrapper hides: SDPA's ``is_causal`` is top-left aligned
and cannot be combined with a mask, so for T != S or with a mask we pass an explicit bottom-right
causal mask instead; a row with every key masked returns zeros, not SDPA's average; and a query
row holding a NaN or inf returns NaN (PyTorch's CPU kernel returns zeros there), as every backend
does (the rule is in :mod:`attnlab.layers.attention`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.layers.attention import check_qkv, repeat_kv, scaled_dot_product_attention
from attnlab.layers.masks import causal_mask, check_mask
from attnlab.registry import Registry


class AttentionBackend(Protocol):
    """The signature every backend implements."""

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        dropout_p: float = 0.0,
        scale: float | None = None,
    ) -> Tensor: ...


ATTENTION_BACKENDS: Registry[AttentionBackend] = Registry("attention backend")

# Backends that take options: name -> factory(**options) -> backend. The default instance of each
# is also registered in ATTENTION_BACKENDS under the same name.
ATTENTION_BACKEND_FACTORIES: Registry[Callable[..., AttentionBackend]] = Registry(
    "configurable attention backend"
)

# The backends that compute eq. (1) over every key the mask allows (the others restrict or
# approximate it: a window, a sparse pattern, buckets, a kernel feature map). A model on any of
# these computes the same function, so it has the same Hugging Face equivalent.
FULL_ATTENTION_BACKENDS: tuple[str, ...] = ("math", "sdpa", "chunked")


@ATTENTION_BACKENDS.register("math")
def math_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> Tensor:
    """The readable eq. (1) path (see :func:`scaled_dot_product_attention`)."""
    out = scaled_dot_product_attention(
        q, k, v, mask=mask, is_causal=is_causal, dropout_p=dropout_p, scale=scale
    )
    return cast(Tensor, out)  # return_weights=False returns the output alone


@ATTENTION_BACKENDS.register("sdpa")
def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> Tensor:
    """PyTorch's fused ``scaled_dot_product_attention`` with the library's mask semantics."""
    B, H, H_kv, T, S, _ = check_qkv(q, k, v, scale=scale)
    if mask is not None:
        check_mask(mask, B, H, T, S)
        # PyTorch's SDPA wants at least (T, S); a view with leading ones broadcasts the same.
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))  # (b, h, t, s)
    if H_kv != H:
        k = repeat_kv(k, H // H_kv)  # (B, H, S, D)
        v = repeat_kv(v, H // H_kv)  # (B, H, S, D)
    if is_causal and T == 1:
        is_causal = False  # bottom-right aligned, a single query sees every key (decoding)
    if is_causal and (mask is not None or T != S):
        cm = causal_mask(T, S, device=q.device)  # (T, S)
        if mask is None:
            mask = cm
        elif mask.dtype == torch.bool:
            mask = mask & cm
        else:
            mask = mask.masked_fill(~cm, torch.finfo(mask.dtype).min)
        is_causal = False
    dead: Tensor | None = None  # (..., T, 1): queries whose every key is masked
    if mask is not None and mask.is_floating_point():
        # Masked keys (at finfo.min or -inf) go to -inf: at finfo.min, a score near the dtype's
        # max would cancel the fill and let a masked key through. A row with every key masked
        # would then be NaN: it gets a zero mask instead, and its output is zeroed below (SDPA
        # would average it uniformly; the library, like the math path, returns zeros).
        masked = ~(mask > torch.finfo(mask.dtype).min)
        dead = masked.all(dim=-1, keepdim=True)
        mask = mask.to(q.dtype).clamp_min(torch.finfo(q.dtype).min)
        mask = mask.masked_fill(masked, -math.inf).masked_fill(dead, 0.0)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
    )
    # PyTorch's CPU flash kernel returns zeros for a query row holding a NaN or an inf (torch
    # 2.13); the library's rule is that a non-finite input never becomes a finite output. The
    # row's float32 sum is non-finite exactly then (short of |q| near float32's max), and
    # sum - sum is 0 for a finite sum, NaN otherwise: adding it poisons exactly those rows. Two
    # small ops: isfinite(q).all(-1) cost 13% of the baby GPT's train step, and isfinite +
    # masked_fill of the sum (five dispatches) 4% of a quantized GPT-2 decoding step. The term
    # is 0 (or NaN) whatever q is, so it is built from q detached: its gradient, exactly zero,
    # is left out of the backward pass instead of computed and added to q's (a non-finite q
    # still makes a non-finite output, and so a non-finite loss).
    q_sum = q.detach().sum(dim=-1, keepdim=True, dtype=torch.float32)  # (B, H, T, 1)
    out = out + (q_sum - q_sum).to(out.dtype)
    return out if dead is None else out.masked_fill(dead, 0.0)


def get_attention_backend(backend: str | AttentionBackend, **options: Any) -> AttentionBackend:
    """Resolve a backend name (see ``ATTENTION_BACKENDS.keys()``) or pass a callable through.

    Args:
        backend: a registered name or a callable with the backend signature.
        options: keyword options for a configurable backend (``ATTENTION_BACKEND_FACTORIES``),
            e.g. ``window=128`` for ``"sliding_window"``. Options whose value is ``None`` are
            dropped, so a model can always pass ``window=config.attn_window``.

    Raises:
        ValueError: for an unknown name (listing the valid ones), or options given to a callable
            or to a backend that takes none.
    """
    options = {key: value for key, value in options.items() if value is not None}
    if callable(backend):
        if options:
            raise ValueError(f"options {sorted(options)} given with a backend callable")
        return backend
    if not options:
        return ATTENTION_BACKENDS.get(backend)
    if backend not in ATTENTION_BACKEND_FACTORIES:
        ATTENTION_BACKENDS.get(backend)  # unknown names: the registry's error lists valid keys
        raise ValueError(
            f"attention backend {backend!r} takes no options (got {sorted(options)}); "
            f"configurable: {', '.join(ATTENTION_BACKEND_FACTORIES.keys())}"
        )
    return ATTENTION_BACKEND_FACTORIES.get(backend)(**options)


__all__: list[str] = [
    "ATTENTION_BACKENDS",
    "ATTENTION_BACKEND_FACTORIES",
    "FULL_ATTENTION_BACKENDS",
    "AttentionBackend",
    "get_attention_backend",
    "math_attention",
    "sdpa_attention",
]
