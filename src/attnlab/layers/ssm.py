"""The Mamba block (Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective State
Spaces", Figure 3 and Algorithm 2), as Mamba-1 / Hugging Face's ``MambaMixer`` computes it.

For an input ``u (B, T, D)``, with E = expand · D channels inside:

    x, z  = in_proj(u).chunk(2)                 # (B, T, E) each: the SSM branch and the gate
    x     = SiLU(causal depthwise conv1d(x))    # kernel d_conv, one filter per channel
    Δ', B, C = x_proj(x).split(R, N, N)         # input-dependent ("selective") parameters
    Δ     = softplus(dt_proj(Δ'))               # low-rank (R) step size, one per channel
    y     = SSM(A, Δ, B, C, D)(x)               # :mod:`attnlab.layers.ssm_scan`, A = -exp(A_log)
    out   = out_proj(y ⊙ SiLU(z))

:class:`MambaBlock` is the residual block around it, ``u + Mixer(RMSNorm(u))``.

Decoding carries a constant-size :class:`MambaLayerState` per layer: the last ``d_conv - 1``
inputs of the convolution ``(B, E, d_conv - 1)`` and the SSM state ``(B, E, N)``; a call with
one token is :func:`~attnlab.layers.ssm_scan.selective_step`, a longer call continues the
parallel scan from the state. :class:`MambaState` holds every layer's and selects batch rows
(``reorder``) like :class:`~attnlab.layers.kv_cache.KVCache`.

Initialisation follows the reference implementation (``mamba_ssm``): S4D-real A (``A_log =
log(1..N)``), D = 1, Δ's bias the inverse softplus of a log-uniform step in [dt_min, dt_max],
dt_proj's weight uniform in ±R^-1/2; the other projections keep PyTorch's default init.

Deviations: none in the computation. The SSM state is kept in float32 (the reference keeps the
model's dtype); the conv state in the input's dtype.

Shapes: B batch, T time steps, D d_model, E d_inner = expand · D, N d_state, R dt_rank,
K d_conv.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.layers.norm import RMSNorm
from attnlab.layers.ssm_scan import SCANS, Scan, selective_scan, selective_step


@dataclass
class MambaLayerState:
    """One layer's decoding state: ``conv (B, E, K - 1)`` and ``ssm (B, E, N)`` float32."""

    conv: Tensor
    ssm: Tensor


class MambaState:
    """The decoding state of every layer of a Mamba model (constant size in the sequence length).

    Args:
        layers: one :class:`MambaLayerState` per layer.
    """

    def __init__(self, layers: list[MambaLayerState]) -> None:
        self.layers = layers

    @property
    def batch_size(self) -> int:
        return int(self.layers[0].ssm.shape[0]) if self.layers else 0

    def layer(self, i: int) -> MambaLayerState:
        return self.layers[i]

    def reorder(self, index: Tensor) -> None:
        """Keep/reorder/repeat batch rows ``index`` ``(B',)`` (beam search, several samples)."""
        for s in self.layers:
            s.conv = s.conv.index_select(0, index)
            s.ssm = s.ssm.index_select(0, index)

    @classmethod
    def cat(cls, states: Sequence[MambaState]) -> MambaState:
        """The rows of ``states`` stacked in order (rows may have consumed different numbers of
        tokens: a state does not depend on the count).

        Raises:
            ValueError: for no states, or states of different layer counts.
        """
        if not states or len({len(s.layers) for s in states}) != 1:
            raise ValueError("cat needs one or more states with the same number of layers")
        layers = [
            MambaLayerState(
                torch.cat([s.layers[i].conv for s in states]),
                torch.cat([s.layers[i].ssm for s in states]),
            )
            for i in range(len(states[0].layers))
        ]
        return cls(layers)

    def nbytes(self) -> int:
        """Bytes held (the same for any number of tokens consumed)."""
        return sum(t.numel() * t.element_size() for s in self.layers for t in (s.conv, s.ssm))


def _inverse_softplus(y: Tensor) -> Tensor:
    return y + torch.log(-torch.expm1(-y))  # softplus(x) = y  <=>  x = y + log(1 - e^-y)


class MambaMixer(nn.Module):
    """The selective-SSM mixer (see the module docstring).

    Args:
        d_model: D. d_inner: E. d_state: N. d_conv: K. dt_rank: R.
        bias: biases on ``in_proj``/``out_proj``. conv_bias: a bias on the convolution.
        scan: the training scan, a :data:`~attnlab.layers.ssm_scan.SCANS` name or function.
        dt_min, dt_max, dt_init_floor: the range of the initial step size Δ.

    Raises:
        ValueError: for non-positive sizes, an unknown scan or a bad Δ range.
    """

    def __init__(
        self,
        d_model: int,
        d_inner: int,
        d_state: int,
        d_conv: int,
        dt_rank: int,
        *,
        bias: bool = False,
        conv_bias: bool = True,
        scan: str | Scan = "parallel",
        dt_min: float = 1e-3,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
    ) -> None:
        super().__init__()
        sizes = dict(d_model=d_model, d_inner=d_inner, d_state=d_state, d_conv=d_conv)
        for name, v in {**sizes, "dt_rank": dt_rank}.items():
            if v < 1:
                raise ValueError(f"{name} must be positive, got {v}")
        if not 0 < dt_min <= dt_max:
            raise ValueError(f"need 0 < dt_min <= dt_max, got dt_min={dt_min}, dt_max={dt_max}")
        self.scan = SCANS.get(scan) if isinstance(scan, str) else scan
        self.d_inner, self.d_state, self.d_conv, self.dt_rank = d_inner, d_state, d_conv, dt_rank
        self.dt_range = (dt_min, dt_max, dt_init_floor)
        self.in_proj = nn.Linear(d_model, 2 * d_inner, bias=bias)
        self.conv1d = nn.Conv1d(d_inner, d_inner, d_conv, groups=d_inner, bias=conv_bias)
        self.x_proj = nn.Linear(d_inner, dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(dt_rank, d_inner, bias=True)
        self.A_log = nn.Parameter(torch.empty(d_inner, d_state))
        self.D = nn.Parameter(torch.empty(d_inner))
        # log decay rates and the skip are not weight matrices: no weight decay (as the
        # reference marks them; attnlab.training.optim reads the mark)
        self.A_log._no_weight_decay = True  # type: ignore[attr-defined]
        self.D._no_weight_decay = True  # type: ignore[attr-defined]
        self.out_proj = nn.Linear(d_inner, d_model, bias=bias)
        self.reset_ssm_parameters()

    @torch.no_grad()
    def reset_ssm_parameters(self) -> None:
        """S4D-real A, D = 1, and Δ's projection (the reference initialisation)."""
        if self.A_log.is_meta:
            return
        n = torch.arange(1, self.d_state + 1, dtype=torch.float32)
        self.A_log.copy_(torch.log(n).expand(self.d_inner, -1))
        self.D.fill_(1.0)
        bound = self.dt_rank**-0.5
        nn.init.uniform_(self.dt_proj.weight, -bound, bound)
        dt_min, dt_max, floor = self.dt_range
        log_dt = torch.rand(self.d_inner) * (math.log(dt_max) - math.log(dt_min))
        dt = torch.exp(log_dt + math.log(dt_min)).clamp(min=floor)
        self.dt_proj.bias.copy_(_inverse_softplus(dt))

    def new_state(
        self, batch: int, *, device: torch.device | None = None, dtype: torch.dtype | None = None
    ) -> MambaLayerState:
        """A zero state for ``batch`` sequences (conv in ``dtype``, SSM in float32)."""
        # the convolution's weight: the dtype of what it convolves, and never replaced by a
        # transform (a quantized in_proj has no float weight)
        w = self.conv1d.weight
        device, dtype = device or w.device, dtype or w.dtype
        conv = torch.zeros(batch, self.d_inner, self.d_conv - 1, device=device, dtype=dtype)
        ssm = torch.zeros(batch, self.d_inner, self.d_state, device=device, dtype=torch.float32)
        return MambaLayerState(conv, ssm)

    def _conv(self, x: Tensor, state: MambaLayerState | None) -> Tensor:
        """Causal depthwise convolution + SiLU; with a state, its inputs continue the state's."""
        xt = x.transpose(1, 2)  # (B, E, T)
        if state is not None and xt.shape[-1] == 1:
            # One decoding step is K multiply-adds per channel: written out, as the reference's
            # step does without its CUDA kernel (a oneDNN convolution call costs far more here).
            window = torch.cat([state.conv.to(xt.dtype), xt], dim=-1)  # (B, E, K)
            state.conv = window[..., 1:]
            y = (window * self.conv1d.weight[:, 0]).sum(-1)  # (B, E)
            if self.conv1d.bias is not None:
                y = y + self.conv1d.bias
            return F.silu(y)[:, None]  # (B, 1, E)
        if state is None:
            padded = F.pad(xt, (self.d_conv - 1, 0))  # (B, E, K - 1 + T)
        else:
            padded = torch.cat([state.conv.to(xt.dtype), xt], dim=-1)  # (B, E, K - 1 + T)
            state.conv = padded[..., padded.shape[-1] - (self.d_conv - 1) :]
        return F.silu(self.conv1d(padded)).transpose(1, 2)  # (B, T, E)

    def forward(self, u: Tensor, state: MambaLayerState | None = None) -> Tensor:
        """``(B, T, D) -> (B, T, D)``; with a ``state``, continue from it and update it in place.

        Raises:
            ValueError: for an input of the wrong shape.
        """
        if u.dim() != 3 or u.shape[-1] != self.in_proj.in_features:
            raise ValueError(
                f"MambaMixer needs (B, T, {self.in_proj.in_features}), got {tuple(u.shape)}"
            )
        x, z = self.in_proj(u).chunk(2, dim=-1)  # (B, T, E) each
        x = self._conv(x, state)  # (B, T, E)
        dt, B, C = self.x_proj(x).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = F.softplus(self.dt_proj(dt))  # (B, T, E)
        A = -torch.exp(self.A_log.float())  # (E, N)
        if state is not None and u.shape[1] == 1:
            y1, h = selective_step(state.ssm, x[:, 0], delta[:, 0], A, B[:, 0], C[:, 0], self.D)
            y = y1[:, None]  # (B, 1, E)
        else:
            h0 = state.ssm if state is not None else None
            y, h = selective_scan(x, delta, A, B, C, self.D, h0=h0, scan=self.scan)
        if state is not None:
            state.ssm = h
        return self.out_proj(y * F.silu(z))


class MambaBlock(nn.Module):
    """``u + MambaMixer(RMSNorm(u))``; ``residual_in_fp32`` adds in float32 (the reference's
    default for 16-bit models; a no-op in float32)."""

    def __init__(
        self, mixer: MambaMixer, d_model: int, *, eps: float = 1e-5, residual_in_fp32: bool = True
    ) -> None:
        super().__init__()
        self.norm = RMSNorm(d_model, eps=eps)
        self.mixer = mixer
        self.residual_in_fp32 = residual_in_fp32

    def forward(self, u: Tensor, state: MambaLayerState | None = None) -> Tensor:
        residual = u.float() if self.residual_in_fp32 else u
        h = self.mixer(self.norm(u.to(self.norm.weight.dtype)), state)
        return residual + h


__all__ = ["MambaBlock", "MambaLayerState", "MambaMixer", "MambaState"]
