"""Normalisation layers: LayerNorm (Ba et al., the paper's choice) and RMSNorm (Zhang & Sennrich).

LayerNorm: y = (x - mean) / sqrt(var + eps) · γ + β over the last dim.
RMSNorm:   y = x / sqrt(mean(x²) + eps) · γ (no centring, no bias); computed in float32.

Shapes: (..., E) -> (..., E).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.registry import Registry


def _check_last_dim(x: Tensor, d_model: int, name: str) -> None:
    if x.dim() == 0 or x.shape[-1] != d_model:
        raise ValueError(
            f"{name}({d_model}) needs inputs (..., {d_model}), got shape {tuple(x.shape)}"
        )


class LayerNorm(nn.Module):
    """Layer normalisation with an optional bias (GPT-style models drop it)."""

    def __init__(self, d_model: int, *, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        _check_last_dim(x, self.weight.shape[0], "LayerNorm")
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """Root-mean-square normalisation (Llama, T5)."""

    def __init__(self, d_model: int, *, eps: float = 1e-6, bias: bool = False) -> None:
        super().__init__()
        if bias:
            raise ValueError("RMSNorm has no bias; pass bias=False")
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        _check_last_dim(x, self.weight.shape[0], "RMSNorm")
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


NORMS: Registry[type[LayerNorm] | type[RMSNorm]] = Registry("norm")
NORMS.add("layernorm", LayerNorm)
NORMS.add("rmsnorm", RMSNorm)


def build_norm(name: str, d_model: int, *, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """Build a registered norm (``"layernorm"`` or ``"rmsnorm"``; RMSNorm ignores ``bias``)."""
    cls = NORMS.get(name)
    if cls is RMSNorm:
        return RMSNorm(d_model, eps=eps)
    return LayerNorm(d_model, eps=eps, bias=bias)
