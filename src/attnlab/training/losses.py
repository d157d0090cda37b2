"""Label-smoothed cross-entropy (§5.4, "Label Smoothing", ε_ls = 0.1).

"During training, we employed label smoothing of value ε_ls = 0.1. This hurts perplexity, as the
model learns to be more unsure, but improves accuracy and BLEU score." The target distribution is
the one-hot label mixed with the uniform distribution over the V classes::

    q = (1 - ε) · onehot(y) + ε / V
    loss = -Σ_v q_v log p_v = (1 - ε) · (-log p_y) + ε · mean_v(-log p_v)

which is exactly ``torch.nn.functional.cross_entropy(..., label_smoothing=ε)``. Positions whose
target is ``ignore_index`` (padding) contribute nothing, and the mean is over the others.

Shapes: N positions (any leading dims), V classes.

Deviations from the paper: none that the paper specifies; the smoothing mass also goes to the pad
class (torch's convention), unlike implementations that spread ε over V - 2 classes.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Reduction = Literal["mean", "sum", "none"]


def label_smoothed_cross_entropy(
    logits: Tensor,
    targets: Tensor,
    *,
    epsilon: float = 0.1,
    ignore_index: int | None = -100,
    reduction: Reduction = "mean",
) -> Tensor:
    """Cross-entropy against ``(1 - ε) · onehot + ε / V``, skipping ``ignore_index`` targets.

    Args:
        logits: unnormalised scores, classes in the last dim.
        targets: class ids, the shape of ``logits`` without its last dim.
        epsilon: ε_ls; 0 gives the plain cross-entropy.
        ignore_index: target id to skip (the pad id), or ``None`` to skip nothing.
        reduction: ``"mean"`` over non-ignored positions (NaN when there are none, like torch),
            ``"sum"``, or ``"none"`` (per position, 0 where ignored).

    Shapes:
        logits ``(..., V)``, targets ``(...)`` -> scalar, or ``(...)`` for ``"none"``.

    Raises:
        ValueError: for ε outside [0, 1], mismatched shapes, or an unknown reduction.
    """
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"targets {tuple(targets.shape)} must be logits {tuple(logits.shape)} without the "
            "last (class) dim"
        )
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction={reduction!r} is not valid; choose one of mean, sum, none")
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # (..., V), fp32 for stability
    keep = (
        targets != ignore_index
        if ignore_index is not None
        else torch.ones_like(targets, dtype=torch.bool)
    )  # (...)
    safe_targets = targets.masked_fill(~keep, 0)  # any valid id; masked out below
    nll = -log_probs.gather(-1, safe_targets.unsqueeze(-1)).squeeze(-1)  # (...) -log p_y
    uniform = -log_probs.mean(dim=-1)  # (...) mean_v -log p_v
    loss = ((1.0 - epsilon) * nll + epsilon * uniform).masked_fill(~keep, 0.0)  # (...)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / keep.sum()


__all__ = ["label_smoothed_cross_entropy"]
