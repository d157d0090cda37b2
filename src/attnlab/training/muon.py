"""Muon: momentum whose update is orthogonalised, for the hidden matrices; AdamW for the rest.

Muon (Keller Jordan et al., 2024, "Muon: An optimizer for hidden layers in neural networks";
the optimizer of the modded-nanogpt speedrun) keeps SGD's momentum buffer for a weight matrix
``W (m, n)``, but instead of stepping along the buffer ``M`` it steps along the orthogonal
matrix nearest to it, ``U V^T`` for ``M = U S V^T``: every singular direction of the update gets
the same size, so the rare directions a gradient barely excites are not drowned by the dominant
ones. ``U V^T`` is approximated by a few steps of a quintic Newton-Schulz iteration
(:func:`newton_schulz`), which needs only matrix products.

Muon is meant for the 2-D weights of the hidden layers. Embedding tables, the output head,
norm gains, biases and other scalars keep AdamW (the speedrun's split): their gradients are
sparse (embeddings) or their rows are per-class (head), where orthogonalising has no meaning.
:class:`Muon` is one optimizer over both kinds of parameter group, so a trainer, a checkpoint
and a learning-rate scheduler see one object; its state is the usual ``state_dict``.

One step for a Muon group (``g`` the gradient, ``mu`` the momentum, ``lr`` the rate, ``wd`` the
decoupled weight decay):

    buf <- mu * buf + g
    u   <- g + mu * buf            (Nesterov; plain momentum: u <- buf)
    O   <- newton_schulz(u)        (singular values brought near 1)
    W   <- W * (1 - lr * wd) - lr * sqrt(max(1, m / n)) * O

The factor ``sqrt(max(1, m / n))`` is the speedrun's: a tall matrix (more rows than columns)
has an orthogonal update of larger RMS per column. Matrices of 3 or more dimensions (a
convolution's kernel) are viewed as ``(shape[0], -1)``.

The AdamW groups follow Loshchilov & Hutter's decoupled decay, written out here (not torch's
kernel) so that the one optimizer's arithmetic is all in this file and resumes bitwise.

Under DDP every process holds the same all-reduced gradients, so every process computes the same
update: Muon needs nothing more. Sharded parameters (FSDP2) would need each whole matrix
gathered before the iteration; :class:`Muon` refuses them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

# The quintic's coefficients (Jordan et al.): chosen to grow small singular values fast (slope
# 3.4445 at 0) rather than to converge to exactly 1. Five steps map every singular value of
# g / ||g||_F that is at least NS_FLOOR into NS_BAND (the polynomial's five-fold composition on
# [0.002, 1] has range [0.682, 1.202]); smaller ones stay below it.
NS_COEFFICIENTS: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)
NS_BAND: tuple[float, float] = (0.68, 1.21)
NS_FLOOR: float = 0.002
# the band in bfloat16 (dtype=torch.bfloat16): each product rounds to 8 bits of mantissa
NS_BAND_BF16: tuple[float, float] = (0.66, 1.22)
# Muon's ns_dtype option: the names a config may give
NS_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def newton_schulz(
    g: Tensor, steps: int = 5, *, eps: float = 1e-7, dtype: torch.dtype = torch.float32
) -> Tensor:
    """The orthogonal factor ``U V^T`` of ``g = U S V^T``, approximately, by the quintic iteration.

    ``X <- a X + b (X X^T) X + c (X X^T)^2 X`` from ``X = g / ||g||_F`` (so every singular value
    starts in [0, 1]), with ``(a, b, c) = NS_COEFFICIENTS``. Each step maps a singular value
    ``s`` to ``a s + b s^3 + c s^5``; five steps drive every ``s >= NS_FLOOR`` (relative to
    the Frobenius norm) into ``NS_BAND``. Runs in ``dtype``: float32 by default (exact to
    compare); ``torch.bfloat16`` is the speedrun's choice on GPUs, and on a CPU with native
    bfloat16 products (AVX512-BF16, AMX) it is several times faster (the norm is still taken in
    float32; bfloat16's 8-bit mantissa widens the band by about 1%, :data:`NS_BAND_BF16`).

    Args:
        g: ``(m, n)`` matrix (a gradient or momentum), or a stack ``(..., m, n)`` of them, each
            orthogonalised on its own (one batched product per step), any float dtype.
        steps: iterations (5 in the speedrun).
        eps: added to the norm, so a zero matrix stays zero.
        dtype: the iteration's number format (``torch.float32`` or ``torch.bfloat16``).

    Returns:
        ``g``'s shape, in ``g``'s dtype.

    Raises:
        ValueError: for a tensor of fewer than 2 dimensions, ``steps < 0`` or another dtype.
    """
    if g.ndim < 2:
        raise ValueError(f"newton_schulz takes a matrix (..., m, n), got shape {tuple(g.shape)}")
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"newton_schulz runs in torch.float32 or torch.bfloat16, got {dtype}")
    a, b, c = NS_COEFFICIENTS
    x = g.to(torch.float32)
    tall = x.shape[-2] > x.shape[-1]
    if tall:  # iterate on the short side: X X^T is min(m, n) square
        x = x.mT
    x = x / (torch.linalg.matrix_norm(x, keepdim=True) + eps)  # each matrix's Frobenius norm
    x = x.to(dtype)
    for _ in range(steps):
        xxt = x @ x.mT  # (k, k), k = min(m, n)
        x = a * x + (b * xxt + c * (xxt @ xxt)) @ x
    if tall:
        x = x.mT
    return x.to(g.dtype)


class Muon(Optimizer):
    """Muon for the parameter groups marked ``use_muon=True``, AdamW for the others; one object.

    Group options (defaults from the constructor): Muon groups take ``lr``, ``momentum``,
    ``nesterov``, ``ns_steps``, ``ns_dtype``, ``weight_decay``; AdamW groups take ``lr``,
    ``betas``, ``eps``, ``weight_decay``. A scheduler multiplies every group's ``lr`` alike, so
    the two rates keep their ratio.

    Args:
        params: parameter groups (dicts with ``"params"`` and ``"use_muon"``), or an iterable of
            tensors (all Muon).
        lr: Muon's rate (0.02 in the speedrun, in units of an orthogonal step per update).
        momentum, nesterov, ns_steps: Muon's momentum and its Newton-Schulz iterations.
        ns_dtype: the iteration's number format, ``"float32"`` or ``"bfloat16"`` (a name, so
            that it sits in the state dict as text).
        adam_lr, betas, eps: the AdamW groups' rate, moment decays and epsilon.
        weight_decay: decoupled decay for groups that do not set their own.

    Raises:
        ValueError: for a bad option, a Muon parameter with fewer than 2 dimensions, or a
            sharded (DTensor) parameter.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        *,
        lr: float = 0.02,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        ns_dtype: str = "float32",
        adam_lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if not all(0.0 <= beta < 1.0 for beta in betas):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        if lr <= 0 or adam_lr <= 0 or eps <= 0 or weight_decay < 0 or ns_steps < 1:
            raise ValueError(
                f"Muon needs lr > 0, adam_lr > 0, eps > 0, weight_decay >= 0, ns_steps >= 1; "
                f"got lr={lr}, adam_lr={adam_lr}, eps={eps}, weight_decay={weight_decay}, "
                f"ns_steps={ns_steps}"
            )
        if ns_dtype not in NS_DTYPES:
            raise ValueError(f"ns_dtype must be one of {sorted(NS_DTYPES)}, got {ns_dtype!r}")
        self._adam_lr = adam_lr
        defaults = dict(
            lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps, ns_dtype=ns_dtype,
            betas=betas, eps=eps, weight_decay=weight_decay, use_muon=True,
        )  # fmt: skip
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group; an AdamW group with no ``lr`` of its own takes ``adam_lr``."""
        if not param_group.get("use_muon", True) and "lr" not in param_group:
            param_group["lr"] = self._adam_lr
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for p in group["params"]:
            if type(p) not in (torch.Tensor, torch.nn.Parameter):
                raise ValueError(
                    f"Muon takes plain tensors; got a {type(p).__name__} (sharded parameters "
                    "need the whole matrix for the iteration: train with DDP, not FSDP)"
                )
            if group["use_muon"] and p.ndim < 2:
                raise ValueError(
                    f"a Muon group holds a parameter of shape {tuple(p.shape)}; Muon updates "
                    "matrices (2+ dimensions): put vectors and scalars in a use_muon=False group"
                )

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One update of every parameter that has a gradient (see the module's equations)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["use_muon"]:
                self._muon_group(group)
            else:
                self._adamw_group(group)
        return loss

    def _muon_group(self, group: dict[str, Any]) -> None:
        lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
        # matrices of one shape (a layer's q, k, v and output projections, every layer's) are
        # orthogonalised together: one batched product per iteration instead of one each
        by_shape: dict[tuple[int, ...], list[tuple[Tensor, Tensor]]] = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            g = p.grad.reshape(p.shape[0], -1)  # (m, n): conv kernels flattened
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(g)
            buf = state["momentum_buffer"]
            buf.mul_(mu).add_(g)
            update = g.add(buf, alpha=mu) if group["nesterov"] else buf
            by_shape.setdefault((*g.shape, g.dtype.itemsize), []).append((p, update))
        for pairs in by_shape.values():
            stacked = torch.stack([u for _, u in pairs])  # (k, m, n)
            ortho = newton_schulz(
                stacked, group["ns_steps"], dtype=NS_DTYPES[group.get("ns_dtype", "float32")]
            )
            m, n = stacked.shape[-2:]
            scale = math.sqrt(max(1.0, m / n))
            for (p, _), o in zip(pairs, ortho, strict=True):
                if wd:
                    p.mul_(1.0 - lr * wd)
                p.add_(o.reshape(p.shape), alpha=-lr * scale)

    def _adamw_group(self, group: dict[str, Any]) -> None:
        lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
        beta1, beta2 = group["betas"]
        for p in group["params"]:
            if p.grad is None:
                continue
            g = p.grad
            state = self.state[p]
            if "step" not in state:
                state["step"] = torch.zeros((), dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            state["step"] += 1
            t = float(state["step"])
            m, v = state["exp_avg"], state["exp_avg_sq"]
            m.lerp_(g, 1.0 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
            if wd:
                p.mul_(1.0 - lr * wd)
            denom = (v / (1.0 - beta2**t)).sqrt_().add_(eps)
            p.addcdiv_(m, denom, value=-lr / (1.0 - beta1**t))


__all__: list[str] = [
    "NS_BAND",
    "NS_BAND_BF16",
    "NS_COEFFICIENTS",
    "NS_DTYPES",
    "NS_FLOOR",
    "Muon",
    "newton_schulz",
]
