"""Sentence pairs for BERT's next-sentence prediction (Devlin et al. §3.1, "Task #2").

A text is a sequence of lines (sentences); a pair is ``[CLS] A [SEP] B [SEP]`` where, with
probability 1/2, B is the line right after A (*IsNext*, label 0) and otherwise a random line of
the same split whose text differs from the true next line (*NotNext*, label 1). Segment
(token type) ids are 0 for ``[CLS] A [SEP]`` and 1 for ``B [SEP]``; padding gets segment 0 and
``pad_id``, as Hugging Face's tokenizers do.

The lines are split by position: the first ``1 - val_fraction`` of them train, the rest
validate, and a pair never crosses the split (A, its next line and every random B come from one
split). Every batch is drawn from the ``torch.Generator`` it is given, so the generator's state is
the data position (resumable) and a seed fixes the pairing.

Shapes: B batch, T pair length (the batch's longest pair, at most ``max_len``).

Deviations from the paper: BERT draws the NotNext segment from another *document* and packs
several sentences per segment up to 512 tokens; here a segment is one line and the random line
comes from the same text (whose identical lines, such as a speaker's name, are excluded by
content). Too long a pair loses tokens from the end of its longer segment (BERT: a random end).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from attnlab.data.common import Split

IS_NEXT, NOT_NEXT = 0, 1  # Hugging Face's next_sentence_label convention
SPECIAL_TOKENS_PER_PAIR = 3  # [CLS], [SEP], [SEP]


class PairBatch(NamedTuple):
    """A padded batch of sentence pairs.

    Attributes:
        ids: ``(B, T)`` ``[CLS] A [SEP] B [SEP]`` then ``pad_id``.
        token_type_ids: ``(B, T)`` 0 on ``[CLS] A [SEP]`` and padding, 1 on ``B [SEP]``.
        nsp_labels: ``(B,)`` 0 = IsNext, 1 = NotNext.
    """

    ids: Tensor
    token_type_ids: Tensor
    nsp_labels: Tensor


def truncate_pair(
    a: Sequence[int], b: Sequence[int], max_tokens: int
) -> tuple[list[int], list[int]]:
    """``a`` and ``b`` shortened (from the end of the longer one, ``a`` on a tie) until together
    they hold at most ``max_tokens`` ids; each keeps at least one id when ``max_tokens >= 2``."""
    a, b = list(a), list(b)
    while len(a) + len(b) > max_tokens:
        (a if len(a) >= len(b) else b).pop()
    return a, b


class SentencePairs:
    """The lines of a text as token ids, split train/val, drawn as IsNext/NotNext pairs.

    Args:
        lines: each line's token ids (empty lines should be left out by the caller).
        cls_id, sep_id, pad_id: the special ids of the model.
        max_len: the longest pair, specials included (the model's ``max_seq_len``).
        val_fraction: the last fraction of the lines held out for validation.

    Raises:
        ValueError: for an empty line, ``max_len`` below 5, a fraction outside (0, 1), or a
            split with fewer than 2 distinct lines (no IsNext pair or no NotNext line).
    """

    def __init__(
        self,
        lines: Sequence[Sequence[int]],
        *,
        cls_id: int,
        sep_id: int,
        pad_id: int,
        max_len: int,
        val_fraction: float = 0.1,
    ) -> None:
        if max_len < SPECIAL_TOKENS_PER_PAIR + 2:
            raise ValueError(f"max_len must be at least 5 ([CLS] a [SEP] b [SEP]), got {max_len}")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        empty = next((i for i, line in enumerate(lines) if len(line) == 0), None)
        if empty is not None:
            raise ValueError(f"line {empty} is empty; leave empty lines out")
        self.lines = [torch.as_tensor(list(line), dtype=torch.int64) for line in lines]
        self.cls_id, self.sep_id, self.pad_id, self.max_len = cls_id, sep_id, pad_id, max_len
        n_train = int(len(self.lines) * (1.0 - val_fraction))
        self.ranges: dict[str, tuple[int, int]] = {
            "train": (0, n_train),
            "val": (n_train, len(self.lines)),
        }
        # one id per distinct line text: a NotNext line never reads like the true next line
        texts: dict[tuple[int, ...], int] = {}
        self.content = torch.tensor(
            [texts.setdefault(tuple(t.tolist()), len(texts)) for t in self.lines], dtype=torch.int64
        )  # (N,)
        for split, (lo, hi) in self.ranges.items():
            if hi - lo < 2 or len(set(self.content[lo:hi].tolist())) < 2:
                raise ValueError(
                    f"the {split} split has {hi - lo} lines, fewer than 2 distinct ones: too "
                    f"little text for sentence pairs with {val_fraction=}"
                )

    def __len__(self) -> int:
        return len(self.lines)

    def split_range(self, split: Split) -> tuple[int, int]:
        """``(first, end)``: the line indices of ``split``."""
        if split not in self.ranges:
            raise ValueError(f"split={split!r} is not valid; choose one of {list(self.ranges)}")
        return self.ranges[split]

    def pair_indices(
        self, split: Split, batch_size: int, generator: torch.Generator
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``(first, second, labels)``, each ``(B,)``: the line indices of A and B and the NSP
        labels of ``batch_size`` random pairs of ``split``.

        A is uniform over the lines that have a next line in the split; the label is a fair
        coin; a NotNext B is uniform over the split's lines whose text differs from A's next.
        """
        lo, hi = self.split_range(split)
        first = lo + torch.randint(hi - lo - 1, (batch_size,), generator=generator)  # (B,)
        labels = torch.randint(2, (batch_size,), generator=generator)  # (B,) 0 IsNext, 1 NotNext
        second = torch.randint(lo, hi, (batch_size,), generator=generator)  # (B,)
        true_next = self.content[first + 1]
        redraw = self.content[second] == true_next  # (B,)
        while bool(redraw.any()):  # rejection keeps the draw uniform over the other lines
            fresh = torch.randint(lo, hi, (batch_size,), generator=generator)
            second = torch.where(redraw, fresh, second)
            redraw = self.content[second] == true_next
        second = torch.where(labels == IS_NEXT, first + 1, second)
        return first, second, labels

    def assemble(self, first: Tensor, second: Tensor, labels: Tensor) -> PairBatch:
        """The padded :class:`PairBatch` of the pairs ``lines[first[i]], lines[second[i]]``."""
        rows, segments = [], []
        budget = self.max_len - SPECIAL_TOKENS_PER_PAIR
        for i, j in zip(first.tolist(), second.tolist(), strict=True):
            a, b = truncate_pair(self.lines[i].tolist(), self.lines[j].tolist(), budget)
            rows.append([self.cls_id, *a, self.sep_id, *b, self.sep_id])
            segments.append([0] * (len(a) + 2) + [1] * (len(b) + 1))
        T = max(len(r) for r in rows)
        ids = torch.full((len(rows), T), self.pad_id, dtype=torch.int64)  # (B, T)
        types = torch.zeros((len(rows), T), dtype=torch.int64)  # (B, T)
        for k, (row, seg) in enumerate(zip(rows, segments, strict=True)):
            ids[k, : len(row)] = torch.tensor(row)
            types[k, : len(seg)] = torch.tensor(seg)
        return PairBatch(ids, types, labels.to(torch.int64))

    def sample(self, split: Split, batch_size: int, generator: torch.Generator) -> PairBatch:
        """``batch_size`` random pairs of ``split`` (:meth:`pair_indices`, :meth:`assemble`).

        Raises:
            ValueError: for an unknown split or a batch size below 1.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        return self.assemble(*self.pair_indices(split, batch_size, generator))


__all__ = [
    "IS_NEXT",
    "NOT_NEXT",
    "SPECIAL_TOKENS_PER_PAIR",
    "PairBatch",
    "SentencePairs",
    "truncate_pair",
]
