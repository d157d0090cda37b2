"""Logit soft-capping: ``cap · tanh(logits / cap)`` (Gemma 2, Gemma Team 2024, §2; the
modded-nanogpt speedrun's LM head).

The tanh keeps every logit inside ``(-cap, cap)`` while leaving small ones almost unchanged
(``cap·tanh(z/cap) = z - z³/(3·cap²) + ...``), so no logit can run away during training.
:class:`SoftCappedLinear` is an ``nn.Linear`` whose output is capped: a model's ``lm_head``
built as one gives capped logits to every caller of ``model.lm_head(h)`` (the forward pass,
generation sessions, decode engines, the logit lens), while its parameters stay ``weight`` (and
``bias``), so weight tying and checkpoints are those of a plain head.

Shapes: ``(..., in_features) -> (..., out_features)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def soft_cap(x: Tensor, cap: float) -> Tensor:
    """``cap · tanh(x / cap)`` elementwise (any shape).

    Raises:
        ValueError: for a cap that is not a positive finite number.
    """
    _check_cap(cap)
    return cap * torch.tanh(x / cap)


def _check_cap(cap: float) -> None:
    if isinstance(cap, bool) or not isinstance(cap, int | float):
        raise ValueError(f"the soft cap must be a positive number, got {cap!r}")
    if not (math.isfinite(cap) and cap > 0):
        raise ValueError(f"the soft cap must be a positive finite number, got {cap}")


class SoftCappedLinear(nn.Linear):
    """``soft_cap(x Wᵀ + b, softcap)``: a linear map whose outputs are soft-capped.

    Args:
        in_features, out_features, bias: as ``nn.Linear``.
        softcap: the cap (> 0).

    Raises:
        ValueError: for a cap that is not a positive finite number.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        softcap: float,
        bias: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        _check_cap(softcap)
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.softcap = float(softcap)

    def forward(self, x: Tensor) -> Tensor:
        """x ``(..., in_features)`` -> capped outputs ``(..., out_features)``."""
        return soft_cap(F.linear(x, self.weight, self.bias), self.softcap)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, softcap={self.softcap}"


__all__ = ["SoftCappedLinear", "soft_cap"]
