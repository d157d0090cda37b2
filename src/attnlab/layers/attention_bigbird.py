"""BigBird block-sparse attention: window + global + random blocks (Zaheer et al., 2020).

Keys come in blocks of ``b`` positions, ``[m·b, (m+1)·b)``; query ``i`` sits at position
``p = i + S - T`` (bottom-right aligned) in query block ``a = p // b``. Query block ``a`` attends

- the ``w`` *window* blocks ``a - w//2 .. a + w//2`` (``w`` odd);
- the first ``g`` blocks, the *global* ones, whose queries in turn attend every key;
- ``r`` *random* blocks, drawn among the blocks left over (beyond the window and the global
  ones; when causal, only earlier blocks) by a seeded hash of ``(seed, a, m)``: the same blocks on
  every call, for every batch row and head, on any device.

With ``is_causal`` every set is restricted to ``j <= p``. Cost: ``(w + g + r)·b`` keys per query
plus ``g·b`` full rows, O(n) for fixed sizes. The non-global blocks are computed with the
engine of :mod:`attnlab.layers.attention_blocksparse` (one gathered key list per query block, one
softmax), the global query rows in full by the math path. :func:`bigbird_mask` returns the
pattern as a dense ``(T, S)`` bool mask; the math path under it gives the same output.

Shapes: B batch, H query heads, H_kv key/value heads, T queries, S keys, D head dim, N query
blocks, Nk key blocks, K keys per query block.
Masks (the whole library): bool True = may attend, float additive, broadcastable to (B, H, T, S),
applied on top of the pattern. A query with nothing to attend returns zeros; non-finite inputs
follow :mod:`attnlab.layers.attention`.

Deviations from BigBird: random blocks are shared by all heads and layers (BigBird draws them
per head); the causal variant is ours (BigBird's block-sparse attention is an encoder's); the
global tokens are the first ``g`` blocks (BigBird-ITC), no extra tokens (ETC).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from attnlab.layers.attention_backends import ATTENTION_BACKEND_FACTORIES, ATTENTION_BACKENDS
from attnlab.layers.attention_blocksparse import (
    SparseBackend,
    attend_parts,
    check_call,
    check_int,
    empty_attention,
    full_rows,
    list_part,
    make_grid,
    query_grid,
)

_MOD = 2**31 - 1


def _hash(seed: int, a: Tensor, m: Tensor) -> Tensor:
    """A deterministic pseudo-random int in ``[0, 2**31 - 1)`` per (seed, a, m), on any device.

    Int64 arithmetic kept below 2**62: a few rounds of a multiplicative (Lehmer) mix.
    """
    x = (a * 92821 + m * 68917 + (seed % _MOD) * 7919 + 12345) % _MOD
    for mult in (48271, 69621, 16807):
        x = (x * mult + (x >> 13)) % _MOD
    return x


def random_blocks(
    q_blocks: Tensor,
    Nk: int,
    *,
    window: int,
    global_blocks: int,
    random: int,
    seed: int,
    is_causal: bool,
) -> tuple[Tensor, Tensor]:
    """The random key blocks of each query block, and which of them exist.

    Candidates for query block ``a``: key blocks ``m < Nk`` with ``m >= global_blocks`` and
    ``|m - a| > window // 2`` (causal: also ``m < a``); the ``random`` candidates with the
    smallest hash of ``(seed, a, m)`` are chosen (all of them when fewer).

    Shapes:
        q_blocks ``(N,)`` absolute block indices -> blocks ``(N, random)`` and ok ``(N, random)``.
    """
    N = q_blocks.shape[0]
    if random == 0:
        empty = torch.zeros(N, 0, dtype=torch.long, device=q_blocks.device)
        return empty, empty.bool()
    width = max(Nk, random)
    m = torch.arange(width, device=q_blocks.device).unsqueeze(0)  # (1, width)
    a = q_blocks.unsqueeze(1)  # (N, 1)
    cand = (m < Nk) & (m >= global_blocks) & ((m - a).abs() > window // 2)
    if is_causal:
        cand = cand & (m < a)
    prio = torch.where(cand, _hash(seed, a, m), torch.full_like(m, _MOD))  # (N, width)
    top, blocks = torch.topk(prio, random, dim=1, largest=False)
    return blocks, top < _MOD


def _block_lists(
    q_blocks: Tensor, Nk: int, w: int, g: int, r: int, seed: int, is_causal: bool
) -> tuple[Tensor, Tensor]:
    """Key blocks of each query block (window, then global, then random) and which are real.

    Each key block appears once: window blocks that are global are left to the global list.

    Shapes: ``(N,)`` -> ``(N, w + g + r)`` twice.
    """
    d = torch.arange(-(w // 2), w // 2 + 1, device=q_blocks.device)
    win = q_blocks.unsqueeze(1) + d  # (N, w)
    win_ok = (win >= g) & (win < Nk)
    glob = torch.arange(g, device=q_blocks.device).expand(q_blocks.shape[0], g)  # (N, g)
    rnd, rnd_ok = random_blocks(
        q_blocks, Nk, window=w, global_blocks=g, random=r, seed=seed, is_causal=is_causal
    )
    blocks = torch.cat([win, glob, rnd], dim=1)
    return blocks, torch.cat([win_ok, glob < Nk, rnd_ok], dim=1)


def bigbird_mask(
    T: int,
    S: int | None = None,
    *,
    block: int,
    window_blocks: int = 3,
    global_blocks: int = 2,
    random_blocks: int = 3,
    seed: int = 0,
    is_causal: bool = False,
    device: torch.device | str | None = None,
) -> Tensor:
    """BigBird's pattern as a dense ``(T, S)`` bool mask (True = may attend). O(T·S).

    Raises:
        ValueError: for bad sizes (see :class:`BigBirdAttention`).
    """
    b, w, g, r, seed = _check_options(block, window_blocks, global_blocks, random_blocks, seed)
    S = T if S is None else S
    dev = torch.device("cpu") if device is None else torch.device(device)
    Nk = -(-S // b)
    p = torch.arange(T, device=dev) + (S - T)  # (T,)
    a_all = torch.arange(-(-S // b), device=dev)  # (Nk,) query blocks (p < S)
    blocks, ok = _block_lists(a_all, Nk, w, g, r, seed, is_causal)  # (Nk, w + g + r)
    allowed = torch.zeros(Nk, Nk + 1, dtype=torch.bool, device=dev)  # column Nk: a dump
    allowed.scatter_(1, torch.where(ok, blocks, Nk), True)
    allowed = allowed[:, :Nk]
    allowed[:g] = True  # global queries see everything
    keep = allowed[(p // b).clamp(max=Nk - 1)][:, torch.arange(S, device=dev) // b]  # (T, S)
    if is_causal:
        keep = keep & (torch.arange(S, device=dev) <= p.unsqueeze(1))
    return keep


def bigbird_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    block: int = 64,
    window_blocks: int = 3,
    global_blocks: int = 2,
    random_blocks: int = 3,
    seed: int = 0,
    mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> Tensor:
    """BigBird attention: window, global and seeded random blocks, computed block-sparsely.

    Args:
        block: keys per block ``b``. window_blocks: ``w``, odd. global_blocks: ``g``.
        random_blocks: ``r`` per query block. seed: the random blocks' seed.
        mask: bool (True = may attend) or additive float, broadcastable to (B, H, T, S).
        is_causal: keys ``j <= p`` only (bottom-right aligned). dropout_p, scale: as usual.

    Shapes:
        q ``(B, H, T, D)``, k ``(B, H_kv, S, D)``, v ``(B, H_kv, S, Dv)`` -> ``(B, H, T, Dv)``.

    Raises:
        ValueError / TypeError: bad shapes, dtypes, masks, options or ``dropout_p``.
    """
    b, w, g, r, seed = _check_options(block, window_blocks, global_blocks, random_blocks, seed)
    _, H, H_kv, T, S, D = check_call(q, k, v, mask, dropout_p, scale)
    if T == 0 or S == 0:
        return empty_attention(q, k, v)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    cdt = torch.promote_types(q.dtype, torch.float32)
    grid = make_grid(T, S, b, q.device)
    qg = query_grid(q, grid, H_kv, scale, cdt)
    Nk = -(-S // b)
    q_blocks = grid.pos[:, 0] // b  # (N,)
    blocks, ok = _block_lists(q_blocks, Nk, w, g, r, seed, is_causal)  # (N, Kb)
    j = (blocks.unsqueeze(-1) * b + torch.arange(b, device=q.device)).flatten(1)  # (N, Kb·b)
    ok = (ok.unsqueeze(-1) & (j.view(*blocks.shape, b) < S)).flatten(1)
    keep_fn = (lambda p, jj: jj <= p) if is_causal else (lambda p, jj: torch.ones_like(jj) > 0)
    out = attend_parts(
        [list_part(qg, k, v, grid, j, ok, keep_fn)], grid, mask, dropout_p, v.dtype, H, T
    )
    rows = torch.arange(min(g * b, S), device=q.device) - (S - T)  # global queries' indices
    rows = rows[rows >= 0]
    if rows.numel():
        full = full_rows(
            q, k, v, rows, mask=mask, is_causal=is_causal, dropout_p=dropout_p, scale=scale
        )
        out = out.index_copy(2, rows, full.to(out.dtype))
    return out


def bigbird_score_count(
    T: int,
    S: int | None = None,
    *,
    block: int,
    window_blocks: int = 3,
    global_blocks: int = 2,
    random_blocks: int = 3,
) -> int:
    """Scores :func:`bigbird_attention` builds per (batch, head): ``N·b·(w + g + r)·b`` plus
    ``S`` for each global query row."""
    S = T if S is None else S
    N = -(-((S - T) % block + T) // block)
    n_global = max(0, min(global_blocks * block, S) - (S - T))
    return N * block * (window_blocks + global_blocks + random_blocks) * block + n_global * S


def _check_options(
    block: Any, window: Any, global_: Any, random: Any, seed: Any
) -> tuple[int, int, int, int, int]:
    """Validate BigBird's options; return them as ints."""
    b = check_int("block", block, low=1)
    w = check_int("window_blocks", window, low=1, expected="a positive odd integer")
    if w % 2 == 0:
        raise ValueError(f"window_blocks must be a positive odd integer, got {window!r}")
    g = check_int("global_blocks", global_, low=0)
    r = check_int("random_blocks", random, low=0)
    return b, w, g, r, check_int("seed", seed, low=0)


class BigBirdAttention(SparseBackend):
    """The ``"bigbird"`` backend (see :func:`bigbird_attention`).

    Args:
        block: keys per block (default 64). window_blocks: odd, default 3. global_blocks:
            default 2. random_blocks: default 3. seed: the random blocks' seed (default 0).

    Raises:
        ValueError: for sizes that are not (non-negative, odd where said) integers.
    """

    __name__ = "bigbird"

    def __init__(
        self,
        block: int = 64,
        window_blocks: int = 3,
        global_blocks: int = 2,
        random_blocks: int = 3,
        seed: int = 0,
    ) -> None:
        opts = _check_options(block, window_blocks, global_blocks, random_blocks, seed)
        self.block, self.window_blocks, self.global_blocks, self.random_blocks, self.seed = opts

    def _options(self) -> dict[str, Any]:
        return {
            "block": self.block,
            "window_blocks": self.window_blocks,
            "global_blocks": self.global_blocks,
            "random_blocks": self.random_blocks,
            "seed": self.seed,
        }

    def _fn(self, q: Tensor, k: Tensor, v: Tensor, **kw: Any) -> Tensor:
        return bigbird_attention(q, k, v, **kw)

    def dense_mask(
        self,
        T: int,
        S: int | None = None,
        *,
        is_causal: bool,
        device: torch.device | str | None = None,
    ) -> Tensor:
        """This pattern as a dense ``(T, S)`` bool mask (:func:`bigbird_mask`)."""
        return bigbird_mask(T, S, is_causal=is_causal, device=device, **self._options())

    def score_count(self, T: int, S: int | None = None, *, is_causal: bool) -> int:
        """Scores built per (batch, head) (:func:`bigbird_score_count`)."""
        opts = {k: v for k, v in self._options().items() if k != "seed"}
        return bigbird_score_count(T, S, **opts)


ATTENTION_BACKENDS.add("bigbird", BigBirdAttention())
ATTENTION_BACKEND_FACTORIES.add("bigbird", BigBirdAttention)

__all__ = [
    "BigBirdAttention",
    "bigbird_attention",
    "bigbird_mask",
    "bigbird_score_count",
    "random_blocks",
]
