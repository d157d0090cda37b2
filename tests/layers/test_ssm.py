"""The selective scan and the Mamba mixer: the parallel scan equals the sequential recurrence
(forward and gradients) for lengths 1..1024, stays finite where the cumulative-sum form
overflows, the one-token step equals a scan step, and the mixer's stateful calls (prefix by scan,
then tokens one at a time, then a chunk) equal one full call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.layers.ssm import MambaLayerState, MambaMixer, MambaState
from attnlab.layers.ssm_scan import (
    SCANS,
    discretize,
    scan_parallel,
    scan_sequential,
    selective_scan,
    selective_step,
)

pytestmark = pytest.mark.usefixtures("one_thread")

# Odd lengths at every level of the recursion, powers of two and their neighbours.
LENGTHS = [1, 2, 3, 5, 8, 15, 16, 17, 31, 33, 64, 100, 127, 128, 129, 255, 257, 500, 513]
LENGTHS += [1023, 1024]
GRAD_LENGTHS = [1, 2, 3, 7, 16, 17, 64, 129, 500, 1024]
ATOL = 1e-5


def inputs(T: int, B: int = 2, E: int = 4, N: int = 3, seed: int = 0) -> list[Tensor]:
    """x, Δ (softplus, 0.05..4), A (-0.1..-6), B, C, D, h0, as trained Mamba layers have them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, E, generator=g)
    delta = F.softplus(torch.randn(B, T, E, generator=g) * 1.5)
    A = -torch.arange(1.0, N + 1).repeat(E, 1) * (0.1 + 2 * torch.rand(E, 1, generator=g))
    Bm, C = torch.randn(B, T, N, generator=g), torch.randn(B, T, N, generator=g)
    D, h0 = torch.randn(E, generator=g), torch.randn(B, E, N, generator=g)
    return [x, delta, A, Bm, C, D, h0]


@pytest.mark.parametrize("T", LENGTHS)
def test_parallel_scan_equals_sequential(T: int) -> None:
    x, delta, A, Bm, C, D, h0 = inputs(T)
    for start in (None, h0):
        y_p, h_p = selective_scan(x, delta, A, Bm, C, D, h0=start, scan="parallel")
        y_s, h_s = selective_scan(x, delta, A, Bm, C, D, h0=start, scan="sequential")
        assert y_p.shape == (2, T, 4) and h_p.shape == (2, 4, 3)
        assert (y_p - y_s).abs().max() <= ATOL
        assert (h_p - h_s).abs().max() <= ATOL


@pytest.mark.parametrize("T", GRAD_LENGTHS)
def test_parallel_scan_gradients_equal_sequential(T: int) -> None:
    """Gradients of every input, to 1e-5 of their scale (they sum over up to 1024 steps)."""
    grads = {}
    w = torch.randn(2, T, 4, generator=torch.Generator().manual_seed(5))
    for scan in ("parallel", "sequential"):
        ins = [t.clone().requires_grad_() for t in inputs(T)]
        y, h = selective_scan(*ins[:6], h0=ins[6], scan=scan)
        grads[scan] = torch.autograd.grad((y * w).sum() + h.sum(), ins)
    names = ["x", "delta", "A", "B", "C", "D", "h0"]
    for name, gp, gs in zip(names, grads["parallel"], grads["sequential"], strict=True):
        scale = max(1.0, gs.abs().max().item())
        assert (gp - gs).abs().max() <= ATOL * scale, name


def test_sequential_backward_is_linear_in_length() -> None:
    """The loop's graph reads each step's inputs by unbind (one stack in the backward), not by
    indexing: each indexed view's backward scatters into a zero (B, T, E, N) tensor, so the
    backward over T steps would allocate T full-size gradients, O(T²) time and traffic."""
    decay = torch.rand(1, 50, 2, 3, requires_grad=True)
    u = torch.randn(1, 50, 2, 3, requires_grad=True)
    seen, stack = set(), [scan_sequential(decay, u).grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    names = [type(node).__name__ for node in seen]
    assert not [n for n in names if n.startswith(("Select", "Index", "Slice"))], names
    assert sum(n.startswith("Unbind") for n in names) == 2


def test_states_match_float64() -> None:
    """Both float32 scans stay within 1e-5 of a float64 recurrence over 1024 steps."""
    x, delta, A, Bm, _, _, h0 = inputs(1024)
    decay, u = discretize(x.double(), delta.double(), A.double(), Bm.double())
    reference = scan_sequential(decay, u, h0.double())
    for fn in (scan_parallel, scan_sequential):
        assert (fn(decay.float(), u.float(), h0) - reference).abs().max() <= ATOL


def test_extreme_decays_stay_finite() -> None:
    """Δ·A from about -6e4 to -1e-4 per step: the exp of the cumulative sums overflows float32, the
    product form does not, and both scans agree (a fully decayed state is exactly 0)."""
    x, _, A, Bm, C, D, _ = inputs(300)
    delta = torch.rand(2, 300, 4, generator=torch.Generator().manual_seed(1))
    delta = 10 ** (7 * delta - 6) * 1000  # 1e-3 .. 1e4
    log_decay = delta[..., None] * A  # (B, T, E, N)
    assert torch.isinf(torch.exp(-log_decay.cumsum(1))).any()  # what the cumsum form would need
    y_p, h_p = selective_scan(x, delta, A, Bm, C, D, scan="parallel")
    y_s, h_s = selective_scan(x, delta, A, Bm, C, D, scan="sequential")
    assert torch.isfinite(y_p).all() and torch.isfinite(h_p).all()
    assert (y_p - y_s).abs().max() <= ATOL * max(1.0, y_s.abs().max().item())
    assert (h_p - h_s).abs().max() <= ATOL * max(1.0, h_s.abs().max().item())


def test_step_equals_one_scan_step() -> None:
    x, delta, A, Bm, C, D, h0 = inputs(1)
    y, h = selective_step(h0, x[:, 0], delta[:, 0], A, Bm[:, 0], C[:, 0], D)
    y_ref, h_ref = selective_scan(x, delta, A, Bm, C, D, h0=h0, scan="sequential")
    assert torch.allclose(y, y_ref[:, 0], atol=1e-6) and torch.allclose(h, h_ref, atol=1e-6)


def test_scan_checks_shapes_and_names() -> None:
    decay = torch.rand(2, 5, 4, 3)
    with pytest.raises(ValueError, match="decay and u"):
        scan_parallel(decay, decay[:, :4])
    with pytest.raises(ValueError, match="h0 must be"):
        scan_sequential(decay, decay, torch.zeros(2, 4))
    with pytest.raises(ValueError, match="T >= 1"):
        scan_parallel(decay[:, :0], decay[:, :0])
    with pytest.raises(ValueError, match="unknown scan 'fast'"):
        selective_scan(*inputs(3)[:6], scan="fast")
    assert set(SCANS.keys()) == {"parallel", "sequential"}


def mixer(d_conv: int = 4, bias: bool = True, seed: int = 0) -> MambaMixer:
    torch.manual_seed(seed)
    m = MambaMixer(8, 16, 4, d_conv, 2, bias=bias)
    with torch.no_grad():  # larger values than the init, so that every part shows
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return m.eval()


@pytest.mark.parametrize("d_conv", [1, 2, 4])
@torch.no_grad()
def test_mixer_stateful_calls_equal_full_call(d_conv: int) -> None:
    m = mixer(d_conv)
    u = torch.randn(3, 23, 8)
    full = m(u)
    state = m.new_state(3)
    parts = [m(u[:, :9], state)]  # a prefix (parallel scan from zeros)
    parts += [m(u[:, t : t + 1], state) for t in range(9, 15)]  # one-token steps
    parts.append(m(u[:, 15:], state))  # a chunk continuing from the state
    assert (torch.cat(parts, 1) - full).abs().max() <= ATOL
    assert state.conv.shape == (3, 16, d_conv - 1) and state.ssm.dtype == torch.float32


@torch.no_grad()
def test_mixer_scans_agree_and_check_input() -> None:
    m = mixer(bias=False)
    u = torch.randn(2, 37, 8)
    y = m(u)
    m.scan = SCANS.get("sequential")
    assert (m(u) - y).abs().max() <= ATOL
    with pytest.raises(ValueError, match=r"needs \(B, T, 8\)"):
        m(torch.randn(2, 5, 7))
    with pytest.raises(ValueError, match="dt_min"):
        MambaMixer(8, 16, 4, 4, 2, dt_min=0.2, dt_max=0.1)


def test_mixer_init_is_the_reference() -> None:
    m = MambaMixer(8, 16, 4, 4, 2, dt_min=1e-3, dt_max=0.1)
    assert torch.allclose(-torch.exp(m.A_log), -torch.arange(1.0, 5).repeat(16, 1))
    assert torch.equal(m.D, torch.ones(16))
    dt = F.softplus(m.dt_proj.bias)
    assert (dt >= 1e-3 - 1e-7).all() and (dt <= 0.1 + 1e-6).all()


def test_state_reorder_and_cat() -> None:
    layers = [MambaLayerState(torch.randn(3, 5, 2), torch.randn(3, 5, 4)) for _ in range(2)]
    state = MambaState([MambaLayerState(s.conv.clone(), s.ssm.clone()) for s in layers])
    state.reorder(torch.tensor([2, 0, 0, 1]))
    assert state.batch_size == 4 and torch.equal(state.layer(1).ssm[1], layers[1].ssm[0])
    both = MambaState.cat([state, state])
    assert both.batch_size == 8 and torch.equal(both.layer(0).conv[4:], state.layer(0).conv)
    assert both.nbytes() == 2 * state.nbytes() == 2 * 4 * 2 * (5 * 2 + 5 * 4) * 4
    with pytest.raises(ValueError, match="same number of layers"):
        MambaState.cat([state, MambaState(state.layers[:1])])


@pytest.mark.parametrize("T", [1, 2, 5, 8])
def test_doubling_backward_passes_gradcheck(T: int) -> None:
    """The hand-derived adjoint of the doubling scan against finite differences (float64)."""
    g = torch.Generator().manual_seed(T)
    a = torch.rand(2, T, 3, 2, generator=g, dtype=torch.float64).requires_grad_()
    b = torch.randn(2, T, 3, 2, generator=g, dtype=torch.float64).requires_grad_()
    h0 = torch.randn(2, 3, 2, generator=g, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(scan_parallel, (a, b, h0))
    assert torch.autograd.gradcheck(lambda a, b: scan_parallel(a, b), (a, b))
