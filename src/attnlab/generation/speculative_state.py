"""The state of a speculative decoding call: the shared token columns, each model's cache over
them (fed, rolled back, restarted), and the acceptance statistics.

:class:`Columns` holds the left-padded prompts and the new tokens of every row, with the key
mask and per-row positions of padded batches (as :class:`~attnlab.generation.session.
DecoderOnlySession` computes them). A :class:`Decoder` is one model's KV cache over columns
``start .. fed - 1``: :meth:`Decoder.feed` runs the columns not yet cached (any number at once:
the draft's catch-up, the target's ``k + 1`` verified positions), :meth:`Decoder.rewind` truncates
the cache to the columns that were kept, :meth:`Decoder.restart` begins the cache again at a later
column (a draft whose context is full; positions then count from that column, as a cropped
prompt's do), and :meth:`Decoder.window_logits` recomputes the last ``max_seq_len`` columns without
a cache (the sliding context of plain decoding).

Shapes: B rows, P prompt length, N max new tokens, T fed columns, V vocabulary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from attnlab.generation.prompts import Prompts


class Columns:
    """The token columns both models read: prompts (left-padded), then the new tokens.

    Attributes:
        ids: ``(B, P + N)``; ``length`` columns are filled (the proposals of a round sit past
            it until they are kept).
        mask: ``(B, P + N)`` True for real tokens, or ``None`` when no prompt is padded.
        positions: ``(B, P + N)`` each column's position from its row's first real token.
    """

    def __init__(self, prompts: Prompts, max_new_tokens: int) -> None:
        B, P = prompts.ids.shape
        self.total = P + max_new_tokens
        device = prompts.ids.device
        self.ids = torch.zeros(B, self.total, dtype=torch.long, device=device)  # (B, P + N)
        self.ids[:, :P] = prompts.ids
        self.length = P
        self.mask: Tensor | None = None
        self.positions: Tensor | None = None
        if prompts.mask is not None:
            self.mask = torch.ones(B, self.total, dtype=torch.bool, device=device)  # (B, P + N)
            self.mask[:, :P] = prompts.mask
            positions = torch.empty(B, self.total, dtype=torch.long, device=device)  # (B, P + N)
            positions[:, :P] = (prompts.mask.long().cumsum(dim=1) - 1).clamp_min(0)
            positions[:, P:] = prompts.lengths[:, None] + torch.arange(
                max_new_tokens, device=device
            )
            self.positions = positions

    def model_inputs(self, start: int, begin: int, end: int) -> tuple[Tensor | None, Tensor | None]:
        """The key mask of columns ``start .. end - 1`` and the positions of ``begin .. end - 1``
        counted from column ``start`` (``(None, None)`` for an unpadded batch, whose positions
        follow the cache)."""
        if self.mask is None or self.positions is None:
            return None, None
        before = self.mask[:, :start].sum(dim=1, keepdim=True)  # (B, 1) real tokens cut off
        return self.mask[:, start:end], (self.positions[:, begin:end] - before).clamp_min(0)


class Decoder:
    """One causal LM's KV cache over :class:`Columns` ``start .. fed - 1``.

    Args:
        model: the model (in eval mode, under ``inference_mode``).
        columns: the shared columns.
        rollback: how far :meth:`rewind` must reach back (windowed layers keep that many extra
            keys).
        runner: what runs ``hidden_states`` and ``lm_head`` (a decode engine); default the
            model itself.
    """

    def __init__(self, model: Any, columns: Columns, *, rollback: int, runner: Any = None) -> None:
        self.model: Any = model
        self.columns = columns
        self.runner: Any = model if runner is None else runner
        self.context = model.config.max_seq_len
        self.cache = model.new_cache(min(columns.total, self.context), rollback=rollback)
        self.start = 0  # the column the cache begins at

    @property
    def fed(self) -> int:
        """The first column not in the cache."""
        return self.start + self.cache.seq_len

    def feed(self, end: int, *, last_only: bool = False) -> Tensor:
        """Run columns ``fed .. end - 1`` through the model, extending the cache.

        Shapes:
            returns ``(B, end - fed, V)``: the next-token logits after each column (``(B, 1,
            V)``, the last column's, with ``last_only``).
        """
        begin, cols = self.fed, self.columns
        if not begin < end <= self.start + self.context:
            raise RuntimeError(f"cannot feed columns {begin}..{end - 1} from {self.start}")
        mask, positions = cols.model_inputs(self.start, begin, end)
        h = self.runner.hidden_states(
            cols.ids[:, begin:end], mask=mask, positions=positions, cache=self.cache
        )  # (B, T, E)
        return self.runner.lm_head(h[:, -1:] if last_only else h)  # (B, T or 1, V)

    def rewind(self, end: int) -> None:
        """Forget the cached columns from ``end`` on (rejected proposals)."""
        if end < self.fed:
            self.cache.truncate(max(0, end - self.start))

    def restart(self, start: int) -> None:
        """Empty the cache; the next :meth:`feed` begins at column ``start``."""
        self.cache.truncate(0)
        self.start = start

    def window_logits(self, end: int) -> Tensor:
        """The logits after column ``end - 1`` from the last ``max_seq_len`` columns alone, no
        cache, positions from the window's first column (nanoGPT's cropping). ``(B, V)``."""
        start = max(0, end - self.context)
        mask, positions = self.columns.model_inputs(start, start, end)
        h = self.runner.hidden_states(
            self.columns.ids[:, start:end], mask=mask, positions=positions
        )  # (B, W, E)
        return self.runner.lm_head(h[:, -1])  # (B, V)


@dataclass
class SpeculativeStats:
    """Acceptance statistics of a speculative decoding call.

    Attributes:
        num_draft_tokens: ``k``, the most proposals per round.
        rounds: target forwards that verified proposals (each yields ``accepted + 1`` tokens).
        row_rounds: rounds summed over the rows still decoding in each.
        proposed: draft tokens proposed, summed over those rows.
        accepted: draft tokens kept, summed over those rows.
        draft_forwards: draft forward calls (a batch counts once).
        plain_steps: tokens decoded without the draft (past the target's context).
        histogram: ``histogram[n]`` rounds that kept ``n`` proposals (``n = 0 .. k``).
    """

    num_draft_tokens: int
    rounds: int = 0
    row_rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    draft_forwards: int = 0
    plain_steps: int = 0
    histogram: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.histogram:
            self.histogram = [0] * (self.num_draft_tokens + 1)

    def record(self, proposed: int, accepted: int, *, active: int) -> None:
        """Count one round of ``proposed`` proposals of which ``accepted`` were kept, over
        ``active`` unfinished rows."""
        self.rounds += 1
        self.row_rounds += active
        self.proposed += proposed * active
        self.accepted += accepted * active
        self.histogram[accepted] += 1

    @property
    def acceptance_rate(self) -> float:
        """Kept / proposed draft tokens (0 when none were proposed)."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_round(self) -> float:
        """Tokens per row per target forward in the speculative rounds (``1 + k`` at best)."""
        return (self.accepted + self.row_rounds) / self.row_rounds if self.row_rounds else 0.0

    def summary(self) -> str:
        """One line for logs and command lines."""
        line = (
            f"k={self.num_draft_tokens}, acceptance rate {self.acceptance_rate:.3f} "
            f"({self.accepted}/{self.proposed} draft tokens kept), "
            f"{self.tokens_per_round:.2f} tokens per target forward over {self.rounds} rounds"
        )
        if self.plain_steps:
            line += f", {self.plain_steps} tokens past the context without the draft"
        return line

    def to_dict(self) -> dict[str, Any]:
        """The fields and the derived rates, JSON-ready."""
        out = asdict(self)
        out.update(acceptance_rate=self.acceptance_rate, tokens_per_round=self.tokens_per_round)
        return out


__all__ = ["Columns", "Decoder", "SpeculativeStats"]
