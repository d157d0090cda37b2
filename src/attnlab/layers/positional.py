"""Positional information: sinusoidal (§3.5), learned, RoPE (+ scaling), ALiBi, none.

Every encoding is a :class:`PositionalEncoding` with three hooks, so models treat them alike:

- ``embed(x, positions)``: added to the token embeddings (sinusoidal, learned);
- ``rotate(x, positions)``: applied to queries and keys inside self-attention (RoPE);
- ``score_bias(q_positions, k_positions)``: an additive score bias per head (ALiBi), which models
  fold into the additive attention mask.

Encodings that do not use a hook inherit the identity / ``None``. Positions are absolute token
indices, ``(T,)`` shared by the batch or ``(B, T)`` per sequence (left-padded batches, cached
decoding).

Shapes: B batch, T positions, E d_model, H heads, D head dim, S key positions.

Deviations from the paper: none for sinusoidal (sin on even, cos on odd dims, 10000^(2i/d)).
RoPE uses the "half" layout (first half of the head dim paired with the second, as GPT-NeoX and
Llama) by default; "interleaved" pairs (2i, 2i+1) as in RoFormer.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import Tensor, nn

from attnlab.layers.hooks import ActivationHook
from attnlab.registry import Registry

RopeScaling = Literal["none", "linear", "ntk", "dynamic"]


def _check_size(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_base(name: str, base: object) -> None:
    """A frequency base must be a finite positive number: log(0), log(-1) and NaN make every
    angle NaN or infinite."""
    if (
        isinstance(base, bool)
        or not isinstance(base, int | float)
        or not (math.isfinite(base) and base > 0)
    ):
        raise ValueError(f"{name} must be a finite positive number, got {base!r}")


class PositionalEncoding(nn.Module):
    """Base class: every hook is the identity; subclasses override what they use.

    The additive encodings (sinusoidal, learned) have a hook site (:mod:`attnlab.layers.hooks`),
    ``position``: the added term, ``(B, T, E)``.
    """

    # Hook site (attnlab.layers.hooks): None costs one attribute read.
    activation_hook: ActivationHook | None = None

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """Add position information to embeddings. x ``(B, T, E)``, positions ``(T,)|(B, T)``."""
        return x

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate queries or keys. x ``(B, H, T, D)``, positions ``(T,)|(B, T)``."""
        return x

    def score_bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor | None:
        """Additive score bias ``(H, T, S)`` or ``(B, H, T, S)``, or ``None``."""
        return None


def check_positions(positions: Tensor, x: Tensor, seq_dim: int) -> None:
    """Raise ``ValueError`` unless ``positions`` is ``(T,)`` or ``(B, T)`` for ``x``'s tokens.

    Args:
        seq_dim: the dim of ``x`` that holds T (1 for embeddings ``(B, T, E)``, 2 for heads
            ``(B, H, T, D)``); B is dim 0.
    """
    T, B = x.shape[seq_dim], x.shape[0]
    if positions.dim() == 1 and positions.shape[0] == T:
        return
    if positions.dim() == 2 and positions.shape[1] == T and positions.shape[0] in (1, B):
        return
    raise ValueError(
        f"positions must be (T,) = ({T},) or (B, T) = ({B}, {T}) for inputs of shape "
        f"{tuple(x.shape)}, got {tuple(positions.shape)}"
    )


def sinusoidal_table(positions: Tensor, d_model: int, base: float = 10000.0) -> Tensor:
    """§3.5: PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(pos / base^(2i/d)).

    Shapes:
        positions ``(...)`` (any integer or float tensor) -> ``(..., d_model)`` float32.
    """
    _check_size("d_model", d_model)
    _check_base("the sinusoid base", base)
    i = torch.arange(0, d_model, 2, device=positions.device, dtype=torch.float64)  # (ceil(E/2),)
    inv = torch.exp(-math.log(base) * i / d_model)  # 1 / base^(2i/d)
    angles = positions.to(torch.float64).unsqueeze(-1) * inv  # (..., ceil(E/2))
    pe = torch.empty(*positions.shape, d_model, dtype=torch.float64, device=positions.device)
    pe[..., 0::2] = torch.sin(angles)
    pe[..., 1::2] = torch.cos(angles[..., : d_model // 2])
    return pe.to(torch.float32)


class SinusoidalPositionalEncoding(PositionalEncoding):
    """Fixed sinusoids added to the embeddings (§3.5); defined for any position."""

    def __init__(self, d_model: int, base: float = 10000.0) -> None:
        super().__init__()
        _check_size("d_model", d_model)
        _check_base("the sinusoid base", base)
        self.d_model = d_model
        self.base = base

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        check_positions(positions, x, 1)
        pe = sinusoidal_table(positions, self.d_model, self.base).to(x.dtype)  # (T|B,T, E)
        if self.activation_hook is not None:
            pe = self.activation_hook("position", pe.expand_as(x))  # (B, T, E)
        return x + pe


class LearnedPositionalEmbedding(PositionalEncoding):
    """A trained table of ``max_seq_len`` position vectors (BERT, GPT-2, ViT)."""

    def __init__(self, d_model: int, max_seq_len: int) -> None:
        super().__init__()
        _check_size("d_model", d_model)
        _check_size("max_seq_len", max_seq_len)
        self.max_seq_len = max_seq_len
        self.weight = nn.Parameter(torch.empty(max_seq_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        check_positions(positions, x, 1)
        real = positions.numel() and positions.device.type != "meta"
        if real and torch.compiler.is_compiling():  # a value read would break the graph
            torch._assert_async(
                (positions < self.max_seq_len).all(),
                f"a position is outside the learned table of max_seq_len={self.max_seq_len}",
            )
            positions = positions.clamp(max=self.max_seq_len - 1)  # no read out of bounds first
        elif real and int(positions.max()) >= self.max_seq_len:
            raise ValueError(
                f"position {int(positions.max())} is outside the learned table of "
                f"max_seq_len={self.max_seq_len}"
            )
        pe = self.weight[positions].to(x.dtype)  # (T|B,T, E)
        if self.activation_hook is not None:
            pe = self.activation_hook("position", pe.expand_as(x))  # (B, T, E)
        return x + pe


class RotaryEmbedding(PositionalEncoding):
    """RoPE (Su et al.): rotate each (q, k) pair of dims by an angle proportional to position.

    The score q_m·k_n then depends on positions only through m - n.

    Args:
        d_head: head dim D (even).
        base: frequency base θ (10,000).
        max_seq_len: trained context, used by ``"dynamic"`` scaling.
        scaling: ``"none"``; ``"linear"`` (positions / factor, "position interpolation");
            ``"ntk"`` (NTK-aware: base · factor^(D/(D-2))); ``"dynamic"`` (NTK base grown with the
            current length once it exceeds ``max_seq_len``, as in HF transformers).
        factor: the scaling factor (>= 1).
        layout: ``"half"`` (pairs i and i + D/2) or ``"interleaved"`` (pairs 2i and 2i+1).
    """

    def __init__(
        self,
        d_head: int,
        *,
        base: float = 10000.0,
        max_seq_len: int = 2048,
        scaling: RopeScaling = "none",
        factor: float = 1.0,
        layout: Literal["half", "interleaved"] = "half",
    ) -> None:
        super().__init__()
        _check_size("RoPE's d_head", d_head)
        if d_head % 2:
            raise ValueError(f"RoPE needs an even head dim, got d_head={d_head}")
        _check_base("the RoPE base", base)
        _check_size("RoPE's max_seq_len", max_seq_len)
        if scaling not in ("none", "linear", "ntk", "dynamic"):
            raise ValueError(f"unknown rope scaling {scaling!r}; valid: none, linear, ntk, dynamic")
        if (
            isinstance(factor, bool)
            or not isinstance(factor, int | float)
            or not (1.0 <= factor < math.inf)
        ):  # NaN fails the comparison too
            raise ValueError(f"rope scaling factor must be >= 1, got {factor}")
        if layout not in ("half", "interleaved"):
            raise ValueError(f"unknown rope layout {layout!r}; valid: half, interleaved")
        self.d_head, self.base, self.max_seq_len = d_head, base, max_seq_len
        self.scaling, self.factor, self.layout = scaling, factor, layout

    def inv_freq(self, seq_len: int | None = None) -> Tensor:
        """The D/2 rotation frequencies θ_i = base^(-2i/D) (after base scaling), float64."""
        D, base = self.d_head, self.base
        if self.scaling == "ntk":
            base = base * self.factor ** (D / (D - 2))
        elif self.scaling == "dynamic" and seq_len is not None and seq_len > self.max_seq_len:
            grow = self.factor * seq_len / self.max_seq_len - (self.factor - 1)
            base = base * grow ** (D / (D - 2))
        return 1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float64) / D)  # (D/2,)

    def angles(self, positions: Tensor) -> Tensor:
        """Rotation angles. positions ``(T,)|(B, T)`` -> ``(T|B,T, D/2)`` float64."""
        pos = positions.to(torch.float64)
        if self.scaling == "linear":
            pos = pos / self.factor
        seq_len = int(positions.max()) + 1 if positions.numel() else 0
        inv = self.inv_freq(seq_len).to(positions.device)
        return pos.unsqueeze(-1) * inv  # (..., T, D/2)

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate q or k ``(B, H, T, D)`` at ``positions`` ``(T,)|(B, T)``.

        Raises:
            ValueError: if the last dim is not ``d_head`` or positions do not match T.
        """
        if x.dim() != 4 or x.shape[-1] != self.d_head:
            raise ValueError(
                f"RoPE rotates (B, H, T, {self.d_head}) queries/keys, got shape {tuple(x.shape)}"
            )
        check_positions(positions, x, 2)
        ang = self.angles(positions)  # (T, D/2) or (B, T, D/2)
        if ang.dim() == 3:
            ang = ang.unsqueeze(1)  # (B, 1, T, D/2): broadcast over heads
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        if self.layout == "half":
            x1, x2 = x.chunk(2, dim=-1)  # (B, H, T, D/2) each
            return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        x1, x2 = x[..., 0::2], x[..., 1::2]  # (B, H, T, D/2) each
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)  # (..., D/2, 2)
        return out.flatten(-2)  # (B, H, T, D)


def alibi_slopes(n_heads: int) -> Tensor:
    """ALiBi head slopes (Press et al.): a geometric sequence starting at 2^(-8/n).

    For a head count that is not a power of two, take the slopes of the nearest lower power of
    two, then every other slope of twice that power, as in the paper's reference code.

    Shapes:
        returns ``(n_heads,)`` float32.
    """
    if n_heads < 1:
        raise ValueError(f"n_heads must be >= 1, got {n_heads}")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if n_heads & (n_heads - 1) == 0:
        slopes = power_of_two(n_heads)
    else:
        closest = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


class ALiBi(PositionalEncoding):
    """Attention with Linear Biases: score bias ``-m_h · |i - j|`` per head, no embeddings.

    In a causal model only ``j <= i`` survive the mask, where this is the paper's ``m·(j - i)``;
    the symmetric form also serves bidirectional encoders.
    """

    slopes: Tensor

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def score_bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        dist = (q_positions.unsqueeze(-1) - k_positions.unsqueeze(-2)).abs()  # (T, S)|(B, T, S)
        slopes = self.slopes.to(q_positions.device)
        if dist.dim() == 3:
            return -slopes[None, :, None, None] * dist.unsqueeze(1)  # (B, H, T, S)
        return -slopes[:, None, None] * dist  # (H, T, S)


class NoPositionalEncoding(PositionalEncoding):
    """No position information (the encoder is then permutation-equivariant)."""


POSITIONAL_ENCODINGS: Registry[type[PositionalEncoding]] = Registry("positional encoding")
POSITIONAL_ENCODINGS.add("sinusoidal", SinusoidalPositionalEncoding)
POSITIONAL_ENCODINGS.add("learned", LearnedPositionalEmbedding)
POSITIONAL_ENCODINGS.add("rope", RotaryEmbedding)
POSITIONAL_ENCODINGS.add("alibi", ALiBi)
POSITIONAL_ENCODINGS.add("none", NoPositionalEncoding)


def build_positional_encoding(
    name: str,
    *,
    d_model: int,
    n_heads: int,
    max_seq_len: int,
    rope_base: float = 10000.0,
    rope_scaling: RopeScaling = "none",
    rope_factor: float = 1.0,
    **kwargs: Any,
) -> PositionalEncoding:
    """Build a registered encoding from model sizes.

    Raises:
        ValueError: for an unknown ``name`` (listing the valid ones) or bad sizes.
    """
    cls = POSITIONAL_ENCODINGS.get(name)
    if cls is SinusoidalPositionalEncoding:
        return SinusoidalPositionalEncoding(d_model)
    if cls is LearnedPositionalEmbedding:
        return LearnedPositionalEmbedding(d_model, max_seq_len)
    if cls is RotaryEmbedding:
        return RotaryEmbedding(
            d_model // n_heads,
            base=rope_base,
            max_seq_len=max_seq_len,
            scaling=rope_scaling,
            factor=rope_factor,
            **kwargs,
        )
    if cls is ALiBi:
        return ALiBi(n_heads)
    return cls()
