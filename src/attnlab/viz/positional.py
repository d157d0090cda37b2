"""Pictures of positional information: sinusoidal (§3.5), learned, RoPE and ALiBi.

:func:`positional_data` computes what is drawn, with the library's own encodings
(:mod:`attnlab.layers.positional`); :func:`plot_positional` draws it:

- ``sinusoidal``: the ``position x dimension`` table of §3.5 (exercise 3), and the dot products
  ``PE_m · PE_n``, which depend only on ``m - n``;
- ``learned``: a checkpoint's trained position table, and the cosine similarity of its rows;
- ``rope``: ``cos(m·θ_i)``, the rotation angle of each dimension pair at each position, and the
  relative-position score pattern: the score ``<R_m q, R_n k> / D`` of a constant query and key
  (``q = k = 1``), which is ``mean_i cos((m - n)·θ_i)`` — a function of ``m - n`` only, decaying
  with distance (RoFormer §3.4.3);
- ``alibi``: no embedding at all, only the score bias ``-m_h·|i - j|`` of each head, its whole
  pattern for the steepest and the gentlest head, and the bias against distance for every head.

Shapes: L positions, E d_model, D head dim (rotated by RoPE), H heads.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.layers.positional import (
    ALiBi,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    sinusoidal_table,
)
from attnlab.viz._mpl import heatmap, new_figure, save_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

POSITIONAL_KINDS = ("sinusoidal", "learned", "rope", "alibi")


def learned_table(model: nn.Module) -> Tensor:
    """The trained position table ``(max_seq_len, E)`` of a model's learned positions.

    Raises:
        ValueError: if the model has no :class:`LearnedPositionalEmbedding`.
    """
    for module in model.modules():
        if isinstance(module, LearnedPositionalEmbedding):
            return module.weight.detach()
    raise ValueError(
        f"{type(model).__name__} has no learned position table (its positions are "
        f"{getattr(getattr(model, 'config', None), 'pos_encoding', 'not learned')})"
    )


def positional_data(
    kind: str,
    *,
    d_model: int = 128,
    max_len: int = 200,
    n_heads: int = 8,
    d_head: int | None = None,
    base: float = 10000.0,
    model: nn.Module | None = None,
) -> dict[str, Tensor]:
    """The arrays behind :func:`plot_positional` (float32, on the CPU).

    Args:
        kind: ``"sinusoidal"``, ``"learned"``, ``"rope"`` or ``"alibi"``.
        d_model: E (sinusoidal). max_len: L positions 0..L-1 (capped at a learned table's size).
        n_heads: H (ALiBi). d_head: D rotated by RoPE (default ``d_model``). base: θ base.
        model: ``learned`` only: the model whose table to show.

    Returns:
        ``sinusoidal``/``learned``: ``table (L, E)``, ``similarity (L, L)`` (dot products /
        cosine similarities). ``rope``: ``cos (L, D/2)``, ``scores (L, L)``,
        ``relative (L,)`` (score at distance 0..L-1), ``inv_freq (D/2,)``. ``alibi``:
        ``bias (H, L, L)``, ``slopes (H,)``.

    Raises:
        ValueError: for an unknown kind (listing the valid ones), non-positive sizes, or
            ``learned`` without a model that has a learned table.
    """
    if kind not in POSITIONAL_KINDS:
        raise ValueError(f"unknown positional kind {kind!r}; valid: {', '.join(POSITIONAL_KINDS)}")
    for name, value in (("d_model", d_model), ("max_len", max_len), ("n_heads", n_heads)):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    pos = torch.arange(max_len)  # (L,)
    if kind == "sinusoidal":
        table = sinusoidal_table(pos, d_model, base)  # (L, E)
        return {"table": table, "similarity": table @ table.T}
    if kind == "learned":
        if model is None:
            raise ValueError("kind 'learned' shows a trained table: pass a model (--model DIR)")
        table = learned_table(model).float().cpu()[:max_len]  # (L, E)
        unit = F.normalize(table, dim=-1)
        return {"table": table, "similarity": unit @ unit.T}
    if kind == "rope":
        D = d_model if d_head is None else d_head
        rope = RotaryEmbedding(D, base=base)  # raises for an odd D
        cos = rope.angles(pos).cos()  # (L, D/2)
        rotated = rope.rotate(torch.ones(1, 1, max_len, D, dtype=torch.float64), pos)[0, 0]
        scores = rotated @ rotated.T / D  # (L, L)
        return {
            "cos": cos.float(),
            "scores": scores.float(),
            "relative": scores[0].float(),
            "inv_freq": rope.inv_freq().float(),
        }
    alibi = ALiBi(n_heads)
    return {"bias": alibi.score_bias(pos, pos), "slopes": alibi.slopes.clone()}


def _draw_table(fig: Figure, kind: str, data: dict[str, Tensor], base: float, model: Any) -> None:
    """Sinusoidal or learned: the table and its position-position similarity."""
    table, sim = data["table"].numpy(), data["similarity"].numpy()
    L, E = table.shape
    ax_t, ax_s = fig.subplots(1, 2, width_ratios=[1.3, 1])
    # A trained table has a few outlier values: scale the colours to the 99th percentile.
    lim = 1.0 if kind == "sinusoidal" else float(np.quantile(np.abs(table), 0.99))
    im = heatmap(ax_t, table, cmap="RdBu_r", vmin=-lim, vmax=lim)
    ax_t.set(xlabel="dimension i", ylabel="position", title=f"{kind} encoding ({L} x {E})")
    fig.colorbar(im, ax=ax_t, shrink=0.85).set_label("value")
    what = "PE_m · PE_n" if kind == "sinusoidal" else "cosine similarity"
    im = heatmap(ax_s, sim, cmap="viridis", aspect="equal")
    ax_s.set(xlabel="position n", ylabel="position m", title=what)
    fig.colorbar(im, ax=ax_s, shrink=0.85).set_label(what)
    head = (
        f"Sinusoidal positional encoding (§3.5): PE(pos, 2i) = sin(pos / {base:g}^(2i/d)), "
        f"PE(pos, 2i+1) = cos(...), d_model = {E}"
        if kind == "sinusoidal"
        else f"Learned position table of {type(model).__name__}: first {L} positions "
        "(colours clipped at the 99th percentile of |value|)"
    )
    fig.suptitle(head, fontsize=11)


def _draw_rope(fig: Figure, data: dict[str, Tensor], base: float, L: int) -> None:
    """RoPE: the rotation angles, the scores of q = k = 1, and their relative-distance curve."""
    cos, scores, rel = data["cos"].numpy(), data["scores"].numpy(), data["relative"].numpy()
    D = 2 * cos.shape[1]
    ax_c, ax_s, ax_r = fig.subplots(1, 3, width_ratios=[1.1, 1, 1])
    im = heatmap(ax_c, cos, cmap="RdBu_r", vmin=-1, vmax=1)
    ax_c.set(
        xlabel="dimension pair i (θ_i = base^(-2i/D))",
        ylabel="position m",
        title="rotation cos(m·θ_i)",
    )
    fig.colorbar(im, ax=ax_c, shrink=0.85)
    im = heatmap(ax_s, scores, cmap="RdBu_r", vmin=-1, vmax=1, aspect="equal")
    ax_s.set(
        xlabel="key position n",
        ylabel="query position m",
        title="score <R_m q, R_n k> / D, q = k = 1",
    )
    fig.colorbar(im, ax=ax_s, shrink=0.85).set_label("score")
    ax_r.plot(range(len(rel)), rel, lw=1.2)
    ax_r.axhline(0, color="grey", lw=0.6)
    ax_r.set(
        xlabel="relative distance m - n",
        ylabel="score",
        title="depends on m - n only: mean_i cos((m-n)·θ_i)",
    )
    ax_r.grid(alpha=0.3)
    fig.suptitle(f"RoPE: head dim D = {D}, base = {base:g}, positions 0..{L - 1}", fontsize=11)


def _draw_alibi(fig: Figure, data: dict[str, Tensor], L: int) -> None:
    """ALiBi: the bias of the first and last head, and every head's bias against distance."""
    bias, slopes = data["bias"].numpy(), data["slopes"].numpy()
    H = bias.shape[0]
    axes = fig.subplots(1, 3, width_ratios=[1, 1, 1.1])
    for ax, h in zip(axes[:2], (0, H - 1), strict=True):
        lo = min(float(bias[h].min()), -1e-6)  # each head on its own scale
        im = heatmap(ax, bias[h], cmap="magma", vmin=lo, vmax=0.0, aspect="equal")
        ax.set(
            xlabel="key position j",
            ylabel="query position i",
            title=f"head {h}: -m·|i - j|, m = {slopes[h]:.4g}",
        )
        fig.colorbar(im, ax=ax, shrink=0.85).set_label("score bias")
    for h in range(H):
        axes[2].plot(range(L), bias[h, 0], lw=1, label=f"head {h} (m={slopes[h]:.3g})")
    axes[2].set(
        xlabel="distance |i - j|",
        ylabel="bias added to the score",
        title="bias vs distance, every head",
    )
    axes[2].grid(alpha=0.3)
    axes[2].legend(fontsize=6, ncol=2 if H > 8 else 1)
    fig.suptitle(
        f"ALiBi: no position embedding, a linear score bias per head (H = {H}; slopes "
        "m_h = 2^(-8(h+1)/H) for H a power of two)",
        fontsize=11,
    )


def plot_positional(
    kind: str,
    *,
    d_model: int = 128,
    max_len: int = 200,
    n_heads: int = 8,
    d_head: int | None = None,
    base: float = 10000.0,
    model: nn.Module | None = None,
    path: str | os.PathLike[str] | None = None,
) -> Figure:
    """Draw :func:`positional_data` (same arguments): 2 axes for sinusoidal/learned, 3 for
    rope/alibi (each heatmap with its colour bar)."""
    data = positional_data(
        kind,
        d_model=d_model,
        max_len=max_len,
        n_heads=n_heads,
        d_head=d_head,
        base=base,
        model=model,
    )
    if kind in ("sinusoidal", "learned"):
        fig = new_figure(12, 5)
        _draw_table(fig, kind, data, base, model)
    elif kind == "rope":
        fig = new_figure(15, 4.8)
        _draw_rope(fig, data, base, max_len)
    else:
        fig = new_figure(15, 4.8)
        _draw_alibi(fig, data, max_len)
    if path is not None:
        save_figure(fig, path)
    return fig


__all__ = ["POSITIONAL_KINDS", "learned_table", "plot_positional", "positional_data"]
