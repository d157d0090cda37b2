"""Attention in float32 inside a bfloat16-autocast model: a transform applied from outside.

``torch.autocast("cpu", dtype=torch.bfloat16)`` runs a model's matrix products in bfloat16,
which on CPUs with AMX or AVX-512 BF16 makes convolutions and linears several times faster.
PyTorch's fused CPU attention is the exception: its bfloat16 *backward* was ~7x slower than
float32 in a one-off profile of ``vit-cifar`` (1 thread: 228 ms vs 33 ms per call), which ate
the whole gain. :func:`float32_attention` wraps the backend of every
:class:`~attnlab.layers.multihead.MultiHeadAttention` of a built model so that it computes in
float32 with autocast switched off, and returns its output in the query's dtype; projections,
FFNs and convolutions stay under autocast. Outside autocast (float32 inputs) the wrapped backend
computes exactly what the backend does.

The swap is not part of the model: it is not saved in checkpoints, and a model rebuilt from a
checkpoint gets it again from whoever applies it (the ``cifar10`` recipe with ``precision=bf16``).

Shapes: q ``(B, H, T, D)``, k, v ``(B, H_kv, S, D)`` -> ``(B, H, T, D)``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.layers.attention_backends import AttentionBackend
from attnlab.layers.multihead import MultiHeadAttention


class Float32Attention:
    """An attention backend run in float32 with autocast off (same signature and mask
    convention as every backend: bool True = may attend, float masks additive).

    Attributes of the wrapped backend (``softmax``, ``dense_mask``, ``window``, ...) are
    read through, so code asking a backend what it can do gets the same answers.
    """

    def __init__(self, backend: AttentionBackend) -> None:
        self.backend = backend

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
    ) -> Tensor:
        with torch.autocast(q.device.type, enabled=False):
            out = self.backend(
                q.float(), k.float(), v.float(), mask=mask, is_causal=is_causal,
                dropout_p=dropout_p, scale=scale,
            )  # fmt: skip
        return out.to(q.dtype)

    def __getattr__(self, name: str) -> Any:
        if name == "backend":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.backend, name)


def float32_attention(model: nn.Module, *, skip: Collection[AttentionBackend] = ()) -> nn.Module:
    """Make every :class:`MultiHeadAttention` of ``model`` compute its attention in float32
    (in place; applying it twice changes nothing); returns ``model``.

    Args:
        skip: backends left as they are (compared by identity, e.g.
            ``attention_backends.math_attention``, whose products autocast like any matmul and
            whose softmax is float32 already).
    """
    for m in model.modules():
        if not isinstance(m, MultiHeadAttention) or isinstance(m.backend, Float32Attention):
            continue
        if not any(m.backend is b for b in skip):
            m.backend = Float32Attention(m.backend)
    return model


__all__ = ["Float32Attention", "float32_attention"]
