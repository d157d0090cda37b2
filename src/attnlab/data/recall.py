"""Synthetic long-range tasks: the answer is the token ``d`` positions back, among distractors.

The chapter's claim that recurrent models lose information over long distances needs a task
where nothing but that distance changes. Two, both sequences of fixed length with one scored
position, the last (a query):

- ``"copy"`` (selective copy at distance d): noise everywhere, one *signal* token ``d``
  positions before the query; the answer is the signal. It tests retention over ``d`` steps.
- ``"associative"`` (associative recall, as in H3 / Zoology): ``n_pairs`` key-value pairs
  (distinct keys) somewhere in noise, the query is one of the keys, the answer its value, which
  sits exactly ``d`` positions before the query (the queried pair is drawn at random from those
  that fit, and the noise gap before the query makes up the rest of the distance). It tests
  retention plus content-based lookup.

Vocabulary (``vocab_size`` >= ``2·n_symbols + 2``; 65 by default, Tiny Shakespeare's, so the
language-model configs are reused unchanged): ``0`` the query marker (copy), ``1..n_symbols``
signals and values, ``n_symbols + 1 .. 2·n_symbols`` keys, the rest noise. Chance accuracy is
``1 / n_symbols``.

Every batch is drawn from the ``torch.Generator`` it is given (the data position). The trainer's
view of a task (its loss and accuracy) is :class:`attnlab.training.recall.RecallObjective`.

Shapes: B batch, T sequence length (``length``, default ``d + 2·n_pairs + 2``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from attnlab.config import check_choice

IGNORE = -100  # the target of every position but the query
QUERY = 0


@dataclass(frozen=True, kw_only=True)
class RecallTask:
    """One synthetic task: its kind, distance ``d`` and alphabet sizes (see the module).

    Raises:
        ValueError: for an unknown kind, ``distance < 1``, a vocabulary too small for the
            alphabets, more pairs than keys, or a length too short for the distance.
    """

    kind: Literal["copy", "associative"] = "copy"
    distance: int = 16
    vocab_size: int = 65
    n_symbols: int = 16  # signals / values, and as many keys
    n_pairs: int = 4  # associative only
    length: int | None = None  # None: distance + 2·n_pairs + 2

    def __post_init__(self) -> None:
        check_choice("kind", self.kind, ["copy", "associative"])
        if self.distance < 1 or self.n_symbols < 2 or self.n_pairs < 1:
            raise ValueError(
                f"need distance >= 1, n_symbols >= 2, n_pairs >= 1; got distance="
                f"{self.distance}, n_symbols={self.n_symbols}, n_pairs={self.n_pairs}"
            )
        if self.vocab_size < 2 * self.n_symbols + 2:
            raise ValueError(
                f"vocab_size={self.vocab_size} is too small for {self.n_symbols} symbols and "
                f"keys plus noise (need >= {2 * self.n_symbols + 2})"
            )
        if self.n_pairs > self.n_symbols:
            raise ValueError(f"n_pairs={self.n_pairs} exceeds the {self.n_symbols} keys")
        minimum = self.distance + 1 + (2 * self.n_pairs if self.kind == "associative" else 0)
        if self.length is not None and self.length < minimum:
            raise ValueError(f"length={self.length} is shorter than {minimum} for this distance")

    @property
    def seq_len(self) -> int:
        """T, the length of every sequence."""
        return self.length or self.distance + 2 * self.n_pairs + 2

    def sample(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """``(x, y)``, both ``(B, T)`` int64; ``y`` is ``-100`` except at the last position."""
        B, T, k = batch_size, self.seq_len, self.n_symbols
        x = torch.randint(2 * k + 1, self.vocab_size, (B, T), generator=generator)  # noise
        rows = torch.arange(B)
        if self.kind == "copy":
            answer = torch.randint(1, k + 1, (B,), generator=generator)
            x[:, T - 1 - self.distance] = answer
            x[:, T - 1] = QUERY
        else:
            answer = self._pairs(x, generator)
        y = torch.full((B, T), IGNORE, dtype=torch.long)
        y[rows, T - 1] = answer
        return x, y

    def _pairs(self, x: Tensor, generator: torch.Generator) -> Tensor:
        """Write the pairs and the query into the noise ``x`` in place; return the answers."""
        B, T, k, M, d = x.shape[0], x.shape[1], self.n_symbols, self.n_pairs, self.distance
        # Pair i from the end (i = 0: the last pair) has its value at distance gap + 1 + 2i.
        fits = min(M, (d - 1) // 2 + 1)
        i = torch.randint(fits, (B,), generator=generator)  # (B,)
        keys = torch.rand(B, k, generator=generator).argsort(dim=1)[:, :M] + k + 1  # (B, M)
        values = torch.randint(1, k + 1, (B, M), generator=generator)  # (B, M)
        block_end = T - 1 - (d - 1 - 2 * i)  # (B,) one past the last pair's value
        start = block_end - 2 * M  # (B,)
        cols = start[:, None] + torch.arange(2 * M)  # (B, 2M)
        block = torch.stack([keys, values], dim=2).flatten(1)  # (B, 2M): k1 v1 k2 v2 ...
        x.scatter_(1, cols, block)
        queried = M - 1 - i  # (B,)
        rows = torch.arange(B)
        x[:, T - 1] = keys[rows, queried]
        return values[rows, queried]


__all__ = ["IGNORE", "QUERY", "RecallTask"]
