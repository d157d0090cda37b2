"""The verification step of speculative decoding: which draft tokens the target keeps, and the
token that follows them.

A draft model proposes ``k`` tokens ``x_1 .. x_k``; one forward of the target over them gives its
next-token distributions ``p_1 .. p_{k+1}`` (``p_j`` conditions on the prefix and ``x_1 ..
x_{j-1}``). Two rules decide how many proposals ``n`` are kept and which token comes after them:

- **greedy** (:func:`greedy_acceptance`): keep ``x_j`` while it is the target's arg-max; the next
  token is the target's arg-max at the first mismatch (or after the last proposal). The output is
  the target's own greedy decoding, whatever the draft proposes.
- **sampling** (:func:`rejection_acceptance`): Leviathan et al. 2023 ("Fast Inference from
  Transformers via Speculative Decoding", §2.3, Algorithm 1) and Chen et al. 2023 ("Accelerating
  Large Language Model Decoding with Speculative Sampling", Algorithm 2). With ``q_j`` the
  draft's distribution that ``x_j`` was drawn from, keep ``x_j`` with probability
  ``min(1, p_j(x_j) / q_j(x_j))``; at the first rejection draw the next token from the residual
  ``norm(max(0, p_j - q_j))``; when all ``k`` are kept draw a bonus token from ``p_{k+1}``. Each
  emitted token is then distributed exactly as ``p_j`` given everything before it, so the output
  is a sample of the target itself (the draft only changes the speed).

``p`` and ``q`` are the distributions *after* the same logits processors (temperature, top-k,
top-p, min-p), so the output follows the target's processed distribution, as plain sampling does.

Shapes: B rows, k proposals, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check(draft_tokens: Tensor, target: Tensor) -> tuple[int, int]:
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be (B, k), got shape {tuple(draft_tokens.shape)}")
    B, k = draft_tokens.shape
    if target.dim() != 3 or target.shape[:2] != (B, k + 1):
        raise ValueError(
            f"the target's scores must be (B, k + 1, V) = ({B}, {k + 1}, V), "
            f"got shape {tuple(target.shape)}"
        )
    return B, k


def accepted_count(accept: Tensor) -> Tensor:
    """Length of the all-True prefix of each row. ``(B, k)`` bool -> ``(B,)`` int64 in
    ``[0, k]``."""
    return accept.long().cumprod(dim=-1).sum(dim=-1)


def greedy_acceptance(draft_tokens: Tensor, target_logits: Tensor) -> tuple[Tensor, Tensor]:
    """Keep the proposals that equal the target's arg-max; the next token is the target's.

    Args:
        draft_tokens: ``(B, k)`` the proposals.
        target_logits: ``(B, k + 1, V)`` the target's (processed) logits at each proposal and
            after the last one.

    Returns:
        ``(accepted, next_tokens)``: ``(B,)`` int64 ``n`` in ``[0, k]``, and ``(B,)`` the
        target's arg-max after the ``n`` kept proposals.

    Raises:
        ValueError: for shapes that do not fit together.
    """
    _check(draft_tokens, target_logits)
    best = target_logits.argmax(dim=-1)  # (B, k + 1)
    n = accepted_count(draft_tokens == best[:, :-1])  # (B,)
    return n, best.gather(1, n[:, None]).squeeze(1)


def rejection_acceptance(
    draft_tokens: Tensor,
    draft_probs: Tensor,
    target_probs: Tensor,
    *,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """The speculative-sampling rule: keep ``x_j`` with probability ``min(1, p_j(x_j) /
    q_j(x_j))``, then draw the next token from the residual (or from ``p_{k+1}``).

    Args:
        draft_tokens: ``(B, k)`` the proposals, each drawn from its row of ``draft_probs``.
        draft_probs: ``(B, k, V)`` the draft's distributions ``q_j`` (rows sum to 1).
        target_probs: ``(B, k + 1, V)`` the target's distributions ``p_j`` (rows sum to 1).
        generator: a seeded ``torch.Generator`` (the uniforms and the draws).

    Returns:
        ``(accepted, next_tokens)``: ``(B,)`` int64 ``n`` in ``[0, k]``, and ``(B,)`` the token
        after the ``n`` kept proposals: a residual draw at the rejected position, or a draw from
        ``p_{k+1}`` when all were kept.

    Raises:
        ValueError: for shapes that do not fit together.
    """
    B, k = _check(draft_tokens, target_probs)
    if draft_probs.shape != (B, k, target_probs.shape[-1]):
        raise ValueError(
            f"draft_probs must be (B, k, V) = ({B}, {k}, {target_probs.shape[-1]}), "
            f"got shape {tuple(draft_probs.shape)}"
        )
    index = draft_tokens[..., None]  # (B, k, 1)
    p_x = target_probs[:, :k].gather(-1, index).squeeze(-1)  # (B, k)
    q_x = draft_probs.gather(-1, index).squeeze(-1)  # (B, k), > 0: x was drawn from q
    u = torch.rand(B, k, generator=generator, device=p_x.device, dtype=p_x.dtype)
    n = accepted_count(u * q_x < p_x)  # u < p/q without dividing; p >= q always keeps
    # The distribution of the next token: the residual at position n, or p_{k+1} when n = k.
    rows = torch.arange(B, device=n.device)
    p_n = target_probs[rows, n]  # (B, V)
    padded_q = torch.cat((draft_probs, torch.zeros_like(p_n)[:, None]), dim=1)  # (B, k + 1, V)
    residual = (p_n - padded_q[rows, n]).clamp_min(0)  # (B, V); p_n itself when n = k
    # A residual of mass 0 means p = q at that position, where nothing is ever rejected; the
    # guard only keeps a rounding accident from reaching torch.multinomial.
    empty = residual.sum(dim=-1, keepdim=True) <= 0
    residual = torch.where(empty, p_n, residual)
    nxt = torch.multinomial(residual, 1, generator=generator).squeeze(-1)  # (B,)
    return n, nxt


__all__ = ["accepted_count", "greedy_acceptance", "rejection_acceptance"]
