"""The selective scan of Mamba (Gu & Dao 2023, Algorithm 2 and §3.3): discretise, then run the
linear recurrence, three ways.

Per channel ``e`` and state dimension ``n`` (Mamba's "S6"), with the input-dependent step size
Δ (B, T, E), the input-dependent B, C (B, T, N) and the fixed A (E, N, negative):

    zero-order hold:  Ā_t = exp(Δ_t · A)         (eq. 4; every entry in (0, 1])
    Mamba's B̄:        B̄_t = Δ_t · B_t             (the simplification of §3.5 / Appendix)
    recurrence:       h_t = Ā_t ⊙ h_{t-1} + B̄_t x_t
    read-out:         y_t = C_t · h_t + D ⊙ x_t   (sum over n; D is the skip)

Three implementations of the recurrence over a whole sequence, all returning every state
``(B, T, E, N)`` so they are interchangeable (:data:`SCANS`):

- :func:`scan_parallel`: the training path. Recursive doubling (an associative scan): pairs of
  neighbouring steps compose into one step, ``(a₂, b₂) ∘ (a₁, b₁) = (a₂a₁, a₂b₁ + b₂)``, which
  halves the sequence; the half-length sequence is scanned the same way (its states are the
  states at the odd positions); the even positions follow in one vectorised step from their
  odd neighbour. log₂ T levels of tensor operations, no Python loop over time steps, O(T) work
  and O(T) memory (the levels shrink geometrically: T/2 + T/4 + ... < T). Any length works: an
  odd length leaves its last step unpaired and gets it in the even fix-up. Its backward is the
  adjoint recurrence, the same scan run backwards in time (:class:`_DoublingScan`), so training
  keeps only Ā and the states.
- :func:`scan_sequential`: the naive reference, a Python loop over time (the recurrence as
  written); used by the tests and the speed benchmark.
- :func:`selective_step`: one step with a constant-size state, for decoding.

Numerics (why this formulation): the popular "cumulative sum of log-decays" trick writes
``h_t = exp(S_t) · Σ_{s≤t} exp(-S_s) B̄_s x_s`` with ``S_t = Σ_{r≤t} Δ_r A``. In float32
``exp(-S_s)`` overflows as soon as the decay accumulated inside a block passes ~e^-88 (a few
steps of Δ·A ≈ -30 are enough; trained Mamba models reach such Δ), and the difference of two
large cumulative sums loses ``eps·|S|`` of absolute precision in the exponent. Recursive
doubling never exponentiates a sum and never divides by a decay: each Ā_t is ``exp`` of one
step's ``Δ_t·A ≤ 0``, and the scan only multiplies numbers in [0, 1] and adds. A product can
underflow to 0, which is the true limit (a contribution decayed beyond float32's range), never
inf or NaN; every state is a tree of log₂ T products and sums instead of a chain of T, so its
rounding error is no larger than the sequential loop's. The read-out and discretisation run in
float32 whatever the input dtype.

Shapes: B batch, T time steps, E channels (Mamba's d_inner), N state size (d_state).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from attnlab.registry import Registry

Scan = Callable[[Tensor, Tensor, "Tensor | None"], Tensor]  # (decay, u, h0) -> states


def discretize(x: Tensor, delta: Tensor, A: Tensor, B: Tensor) -> tuple[Tensor, Tensor]:
    """Zero-order hold: ``Ā = exp(Δ·A)`` and the input term ``B̄ x = (Δ·x) B``, in float32.

    Shapes:
        x, delta ``(B, T, E)``; A ``(E, N)``; B ``(B, T, N)`` -> decay, u ``(B, T, E, N)``.
    """
    delta = delta.float()
    decay = torch.exp(delta[..., None] * A.float())  # (B, T, E, N)
    u = (delta * x.float())[..., None] * B.float()[:, :, None, :]  # (B, T, E, N)
    return decay, u


def scan_parallel(decay: Tensor, u: Tensor, h0: Tensor | None = None) -> Tensor:
    """Every state of ``h_t = decay_t ⊙ h_{t-1} + u_t`` by recursive doubling (see the module).

    Differentiable (:class:`_DoublingScan`): the backward is the same scan run backwards in time.

    Args:
        decay: Ā ``(B, T, E, N)``, entries in [0, 1]. u: B̄x ``(B, T, E, N)``.
        h0: the state before the first step ``(B, E, N)`` (default zeros).

    Shapes:
        returns ``(B, T, E, N)``: ``h_1 .. h_T``.

    Raises:
        ValueError: for mismatched shapes or an empty sequence.
    """
    _check(decay, u, h0)
    if h0 is None:
        return _DoublingScan.apply(decay, u)
    return _DoublingScan.apply(decay, u, h0.to(u.dtype))


class _DoublingScan(torch.autograd.Function):
    """Recursive doubling with its adjoint as the backward.

    Autograd through the strided halves of :func:`_doubling` would allocate a zero tensor of the
    full size for every slice of every level; the adjoint is cheaper and keeps only Ā and the
    states. With ``g_t = dL/dh_t`` (the total, through every later state),

        g_t = ∂L/∂h_t + Ā_{t+1} ⊙ g_{t+1}     (the recurrence backwards in time, g_T = ∂L/∂h_T)
        dL/du_t = g_t,   dL/dĀ_t = g_t ⊙ h_{t-1},   dL/dh0 = Ā_1 ⊙ g_1,

    so the backward is one more doubling scan, over the reversed sequence.
    """

    @staticmethod
    def forward(ctx: Any, decay: Tensor, u: Tensor, h0: Tensor | None = None) -> Tensor:
        with torch.no_grad():
            h = _doubling(decay, u, h0)
        ctx.save_for_backward(decay, h, h0)
        return h

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_h: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        decay, h, h0 = ctx.saved_tensors
        decay_next = torch.cat([decay[:, 1:], torch.zeros_like(decay[:, :1])], dim=1)
        g = _doubling(decay_next.flip(1), grad_h.flip(1), None).flip(1)  # (B, T, E, N)
        first = torch.zeros_like(h[:, :1]) if h0 is None else h0[:, None]
        grad_decay = g * torch.cat([first, h[:, :-1]], dim=1)  # g_t ⊙ h_{t-1}
        grad_h0 = decay[:, 0] * g[:, 0] if h0 is not None else None
        return grad_decay, g, grad_h0


def _doubling(a: Tensor, b: Tensor, h0: Tensor | None) -> Tensor:
    T = a.shape[1]
    if T == 1:
        return b if h0 is None else a * h0[:, None] + b
    n = T // 2  # pairs (0, 1), (2, 3), ...; an odd T leaves step T - 1 unpaired
    a_even, a_odd = a[:, 0 : 2 * n : 2], a[:, 1 : 2 * n : 2]  # (B, n, E, N) each
    # A pair is one step from h_{2i-1} to h_{2i+1}: decay a₂a₁, input a₂b₁ + b₂.
    h_odd = _doubling(a_odd * a_even, a_odd * b[:, 0 : 2 * n : 2] + b[:, 1 : 2 * n : 2], h0)
    # The state before each even step is its odd neighbour's (h0, or zeros, before step 0).
    first = torch.zeros_like(h_odd[:, :1]) if h0 is None else h0[:, None].to(h_odd.dtype)
    prev = torch.cat([first, h_odd[:, : (T + 1) // 2 - 1]], dim=1)  # (B, ceil(T/2), E, N)
    h_even = a[:, 0::2] * prev + b[:, 0::2]  # (B, ceil(T/2), E, N)
    h = torch.empty_like(b)  # (B, T, E, N)
    h[:, 0::2] = h_even
    h[:, 1::2] = h_odd
    return h


def scan_sequential(decay: Tensor, u: Tensor, h0: Tensor | None = None) -> Tensor:
    """The same states by the plain loop over time (the reference; slow in Python).

    Arguments and shapes as :func:`scan_parallel`.
    """
    _check(decay, u, h0)
    h = torch.zeros_like(u[:, 0]) if h0 is None else h0.to(u.dtype)  # (B, E, N)
    states = []
    # unbind, not decay[:, t]: the backward of T unbound views is one stack (O(T) in all),
    # where each indexed view's backward would scatter into a zero (B, T, E, N) tensor: O(T²)
    for a_t, u_t in zip(decay.unbind(1), u.unbind(1), strict=True):
        h = a_t * h + u_t
        states.append(h)
    return torch.stack(states, dim=1)  # (B, T, E, N)


def _check(decay: Tensor, u: Tensor, h0: Tensor | None) -> None:
    if decay.shape != u.shape or decay.dim() != 4 or decay.shape[1] == 0:
        raise ValueError(
            f"decay and u must both be (B, T, E, N) with T >= 1, got {tuple(decay.shape)} "
            f"and {tuple(u.shape)}"
        )
    if h0 is not None and h0.shape != (u.shape[0], *u.shape[2:]):
        raise ValueError(
            f"h0 must be (B, E, N) = {(u.shape[0], *u.shape[2:])}, got {tuple(h0.shape)}"
        )


SCANS: Registry[Scan] = Registry("scan")
SCANS.add("parallel", scan_parallel)
SCANS.add("sequential", scan_sequential)


def selective_scan(
    x: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    *,
    h0: Tensor | None = None,
    scan: str | Scan = "parallel",
) -> tuple[Tensor, Tensor]:
    """The selective SSM over a sequence: discretise, scan, read out, add the D skip.

    Args:
        x: the input ``(B, T, E)`` (after Mamba's convolution and SiLU).
        delta: Δ ``(B, T, E)``, already through softplus (> 0).
        A: ``(E, N)``, negative (``-exp(A_log)``). B, C: ``(B, T, N)``. D: ``(E,)`` or ``None``.
        h0: the state before the first step ``(B, E, N)`` (default zeros).
        scan: a :data:`SCANS` name (``"parallel"``, ``"sequential"``) or a scan function.

    Shapes:
        returns ``(y (B, T, E) in x's dtype, the last state (B, E, N) float32)``.

    Raises:
        ValueError: for an unknown scan name or mismatched shapes.
    """
    fn = SCANS.get(scan) if isinstance(scan, str) else scan
    decay, u = discretize(x, delta, A, B)  # (B, T, E, N) each
    h = fn(decay, u, h0)  # (B, T, E, N)
    y = torch.einsum("bten,btn->bte", h, C.float())  # (B, T, E)
    if D is not None:
        y = y + x.float() * D.float()
    return y.to(x.dtype), h[:, -1]


def selective_step(
    h: Tensor, x: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """One recurrent step with a constant-size state (decoding).

    Shapes:
        h ``(B, E, N)``; x, delta ``(B, E)``; A ``(E, N)``; B, C ``(B, N)``; D ``(E,)`` ->
        ``(y (B, E) in x's dtype, new h (B, E, N) float32)``.
    """
    delta = delta.float()
    decay = torch.exp(delta[..., None] * A.float())  # (B, E, N)
    h = decay * h.float() + (delta * x.float())[..., None] * B.float()[:, None, :]  # (B, E, N)
    y = torch.einsum("ben,bn->be", h, C.float())  # (B, E)
    if D is not None:
        y = y + x.float() * D.float()
    return y.to(x.dtype), h


__all__ = [
    "SCANS",
    "Scan",
    "discretize",
    "scan_parallel",
    "scan_sequential",
    "selective_scan",
    "selective_step",
]
