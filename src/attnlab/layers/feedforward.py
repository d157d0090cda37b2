"""Position-wise feed-forward network, eq. (2) §3.3, and its gated (GLU) variants.

    FFN(x) = max(0, x W1 + b1) W2 + b2                 (the paper, activation "relu")
    FFN(x) = (act(x W_gate) ⊙ x W_up) W_down           (GLU variants, Shazeer 2020)

"swiglu" uses SiLU as the gate activation, "geglu" GELU. "relu2" is the squared ReLU,
``relu(x)²`` (So et al. 2021, "Primer", §3; the modded-nanogpt speedrun's FFN). Module names:
``up_proj`` (W1), ``down_proj`` (W2) and, for gated variants, ``gate_proj``.

Shapes: (B, T, E) -> (B, T, E); hidden (B, T, F) with F = d_ff.

Hook sites (:mod:`attnlab.layers.hooks`): ``gate`` ``act(x W_gate)`` (GLU variants) and
``hidden`` (the input of ``down_proj``, after the activation), both ``(B, T, F)``.

Deviations from the paper: optional dropout on the hidden activations (as torch.nn and the
Annotated Transformer do); the paper only applies dropout to sublayer outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.layers.hooks import ActivationHook
from attnlab.registry import Registry

ACTIVATIONS: Registry[Callable[[Tensor], Tensor]] = Registry("activation")
ACTIVATIONS.add("relu", F.relu)
ACTIVATIONS.add("gelu", F.gelu)  # exact (erf) GELU, as BERT and ViT
ACTIVATIONS.add("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"))  # GPT-2's "gelu_new"
ACTIVATIONS.add("silu", F.silu)


def relu_squared(x: Tensor) -> Tensor:
    """Primer's squared ReLU, ``relu(x)²`` (elementwise; any shape)."""
    return F.relu(x).square()


ACTIVATIONS.add("relu2", relu_squared)
# Gated variants: name -> activation applied to the gate branch.
GATED: dict[str, str] = {"swiglu": "silu", "geglu": "gelu", "reglu": "relu"}


def activation_names() -> list[str]:
    """Every accepted ``activation`` value (plain and gated)."""
    return sorted([*ACTIVATIONS.keys(), *GATED])


class FeedForward(nn.Module):
    """Eq. (2) or a GLU variant.

    Args:
        d_model: E. d_ff: F, the hidden width.
        activation: one of :func:`activation_names` (``"relu"`` is the paper's).
        dropout: dropout on the hidden activations.
        bias: whether the linears have biases.

    Raises:
        ValueError: for an unknown activation (listing the valid ones) or non-positive sizes.
    """

    # Hook sites (attnlab.layers.hooks): None costs one attribute read per site.
    activation_hook: ActivationHook | None = None
    HOOK_SITES: ClassVar[tuple[str, ...]] = ("gate", "hidden")

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        *,
        activation: str = "relu",
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if d_model <= 0 or d_ff <= 0:
            raise ValueError(f"d_model and d_ff must be positive, got {d_model}, {d_ff}")
        self.gated = activation in GATED
        if not self.gated and activation not in ACTIVATIONS:
            raise ValueError(
                f"unknown activation {activation!r}; valid: {', '.join(activation_names())}"
            )
        self.activation = activation
        self.act = ACTIVATIONS.get(GATED.get(activation, activation))
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.gate_proj = nn.Linear(d_model, d_ff, bias=bias) if self.gated else None
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x ``(B, T, E)`` -> ``(B, T, E)``."""
        hook = self.activation_hook
        if self.gate_proj is not None:
            g = self.act(self.gate_proj(x))  # (B, T, F)
            if hook is not None:
                g = hook("gate", g)
            h = g * self.up_proj(x)  # (B, T, F)
        else:
            h = self.act(self.up_proj(x))  # (B, T, F)
        if hook is not None:
            h = hook("hidden", h)
        drop = self.dropout  # the identity in eval mode or at p = 0 (no module call then)
        return self.down_proj(drop(h) if drop.training and drop.p > 0 else h)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"
