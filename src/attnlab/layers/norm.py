"""Normalisation layers: LayerNorm (Ba et al., the paper's choice), RMSNorm (Zhang & Sennrich)
and, for comparison only, BatchNorm (Ioffe & Szegedy) over the feature dim.

LayerNorm: y = (x - mean) / sqrt(var + eps) · γ + β over the last dim.
RMSNorm:   y = x / sqrt(mean(x²) + eps) · γ (no centring, no bias); computed in float32.
BatchNorm: the same formula as LayerNorm, but the mean and variance of each feature are taken
           over every other dim (the batch *and* the tokens) in training, and are the running
           averages of those statistics in eval mode. No padding mask: padded tokens count.

Shapes: (..., E) -> (..., E).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.registry import Registry


def _check_eps(name: str, eps: float) -> None:
    """``eps`` must be a finite positive number: NaN, an infinity or a negative one would make
    every output NaN (or zero) silently."""
    if (
        isinstance(eps, bool)
        or not isinstance(eps, int | float)
        or not (math.isfinite(eps) and eps > 0)
    ):
        raise ValueError(f"{name} eps must be a finite positive number, got {eps!r}")


def _check_last_dim(x: Tensor, d_model: int, name: str) -> None:
    if x.dim() == 0 or x.shape[-1] != d_model:
        raise ValueError(
            f"{name}({d_model}) needs inputs (..., {d_model}), got shape {tuple(x.shape)}"
        )


class LayerNorm(nn.Module):
    """Layer normalisation with an optional bias (GPT-style models drop it)."""

    def __init__(self, d_model: int, *, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        _check_eps("LayerNorm", eps)
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
        _check_eps("RMSNorm", eps)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        _check_last_dim(x, self.weight.shape[0], "RMSNorm")
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


class BatchNorm(nn.Module):
    """Batch normalisation of each feature over the batch and the tokens (``(..., E)`` inputs).

    For the LayerNorm-vs-BatchNorm comparison (docs/course): in training a token's output depends
    on the other sequences of the batch (and, in a causal LM, on later tokens of its own), and
    eval mode uses running statistics instead, so the two modes disagree.

    Shapes:
        x ``(..., E)`` -> ``(..., E)``; the statistics are over every position of ``x``.
    """

    def __init__(
        self, d_model: int, *, eps: float = 1e-5, bias: bool = True, momentum: float = 0.1
    ) -> None:
        super().__init__()
        _check_eps("BatchNorm", eps)
        if (
            isinstance(momentum, bool)
            or not isinstance(momentum, int | float)
            or not (0.0 <= momentum <= 1.0)
        ):
            raise ValueError(f"BatchNorm momentum must be a number in [0, 1], got {momentum!r}")
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None
        self.running_mean: Tensor
        self.running_var: Tensor
        self.register_buffer("running_mean", torch.zeros(d_model))
        self.register_buffer("running_var", torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        _check_last_dim(x, self.weight.shape[0], "BatchNorm")
        flat = x.reshape(-1, x.shape[-1])  # (N, E): every token of the batch is one sample
        y = F.batch_norm(
            flat, self.running_mean, self.running_var, self.weight, self.bias,
            training=self.training, momentum=self.momentum, eps=self.eps,
        )  # fmt: skip
        return y.reshape(x.shape)


NORMS: Registry[type[LayerNorm] | type[RMSNorm] | type[BatchNorm]] = Registry("norm")
NORMS.add("layernorm", LayerNorm)
NORMS.add("rmsnorm", RMSNorm)
NORMS.add("batchnorm", BatchNorm)


def build_norm(name: str, d_model: int, *, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """Build a registered norm (``"layernorm"``, ``"rmsnorm"`` or ``"batchnorm"``; RMSNorm
    ignores ``bias``)."""
    cls = NORMS.get(name)
    if cls is RMSNorm:
        return RMSNorm(d_model, eps=eps)
    if cls is BatchNorm:
        return BatchNorm(d_model, eps=eps, bias=bias)
    return LayerNorm(d_model, eps=eps, bias=bias)
