"""The reverse task: a synthetic sequence-to-sequence task generated in-process.

The reverse task is the "first end-to-end run" of the encoder-decoder Transformer (§3): no data
files, seeded with a ``torch.Generator``, and learnable in a couple of minutes on a CPU. A sample
is a random sequence ``x_1 .. x_L`` of content tokens; the model must output ``x_L .. x_1``.

Batch layout (:class:`~attnlab.data.batches.Seq2SeqBatch`; special ids follow
:class:`attnlab.models.TransformerConfig`: pad 0, BOS 1, EOS 2, content tokens from 3)::

    src      x_1 .. x_L EOS pad ..       (B, L_max + 1)   encoder input
    src_mask True .. True False ..       (B, L_max + 1)   real source tokens
    tgt      BOS x_L .. x_1 pad ..       (B, L_max + 1)   decoder input (teacher forcing)
    targets  x_L .. x_1 EOS pad ..       (B, L_max + 1)   what the decoder must predict

Like fairseq, the source ends with EOS; it marks where the reversed output starts.

Splits: the ``"heldout"`` split is drawn with its own seed and, unless ``heldout_buckets`` is
``None``, from a disjoint part of the sequence space: a sequence belongs to the held-out split iff
a fixed polynomial hash of it is ``0 mod heldout_buckets``; the ``"train"`` split rejects those
sequences. This costs no memory and keeps the splits exactly disjoint even for tiny vocabularies.

The recipe that trains on it is :mod:`attnlab.training.recipes.reverse`.

Shapes: B batch, L sequence length, N number of sequences.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal

import torch
from torch import Tensor

from attnlab.data.batches import Seq2SeqBatch

ReverseSplit = Literal["train", "heldout"]  # the reverse task's own splits

_HASH_MOD = 2**31 - 1  # a Mersenne prime: keeps every intermediate product inside int64
_HASH_MUL = 1_000_003


class ReverseTask:
    """Reverse a random token sequence.

    Args:
        vocab_size: the whole vocabulary, special ids included (content ids are
            ``[first_token, vocab_size)``).
        min_len, max_len: inclusive range of sequence lengths (uniform).
        pad_id, bos_id, eos_id: special ids (those of :class:`TransformerConfig`).
        heldout_buckets: one hash bucket in this many is reserved for the held-out split
            (``None``: no reservation, the splits differ only by seed).

    Raises:
        ValueError: for non-positive or inconsistent lengths, a vocabulary without content
            tokens, or special ids at or above the first content token.
    """

    def __init__(
        self,
        *,
        vocab_size: int = 32,
        min_len: int = 8,
        max_len: int = 16,
        pad_id: int = 0,
        bos_id: int = 1,
        eos_id: int = 2,
        heldout_buckets: int | None = 64,
    ) -> None:
        if min_len < 1 or max_len < min_len:
            raise ValueError(
                f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}"
            )
        specials = {"pad_id": pad_id, "bos_id": bos_id, "eos_id": eos_id}
        if len(set(specials.values())) != 3 or min(specials.values()) < 0:
            raise ValueError(f"special ids must be distinct and non-negative, got {specials}")
        self.first_token = max(specials.values()) + 1
        if vocab_size <= self.first_token:
            raise ValueError(
                f"vocab_size={vocab_size} leaves no content tokens (ids {self.first_token}+ are "
                "content)"
            )
        if heldout_buckets is not None and heldout_buckets < 2:
            raise ValueError(f"heldout_buckets must be >= 2 or None, got {heldout_buckets}")
        self.vocab_size, self.min_len, self.max_len = vocab_size, min_len, max_len
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.heldout_buckets = heldout_buckets

    @property
    def seq_len(self) -> int:
        """The longest ``src``/``tgt`` a batch can have (``max_len`` + EOS or BOS)."""
        return self.max_len + 1

    def _draw(self, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """``n`` random sequences: tokens ``(N, max_len)`` (pad after the length) and lengths."""
        lengths = torch.randint(self.min_len, self.max_len + 1, (n,), generator=generator)
        tokens = torch.randint(
            self.first_token, self.vocab_size, (n, self.max_len), generator=generator
        )
        real = torch.arange(self.max_len) < lengths[:, None]  # (N, max_len)
        return tokens.masked_fill(~real, self.pad_id), lengths

    @staticmethod
    def _in_heldout(tokens: Tensor, buckets: int) -> Tensor:
        """Whether each row of ``tokens`` ``(N, max_len)`` lies in the held-out split. ``(N,)``"""
        h = torch.zeros(tokens.shape[0], dtype=torch.int64)
        for col in tokens.unbind(1):  # fixed width max_len: the hash depends on the sequence only
            h = (h * _HASH_MUL + col + 1) % _HASH_MOD
        return h % buckets == 0

    def sample(
        self, n: int, generator: torch.Generator, *, split: ReverseSplit = "train"
    ) -> Seq2SeqBatch:
        """``n`` random samples of ``split`` as one padded batch.

        Raises:
            ValueError: for an unknown split, ``n < 1``, or a held-out split too small to fill.
        """
        if split not in ("train", "heldout"):
            raise ValueError(f"split={split!r} is not valid; choose one of ['train', 'heldout']")
        if n < 1:
            raise ValueError(f"n must be positive, got {n}")
        if self.heldout_buckets is None:
            return self._make_batch(*self._draw(n, generator))
        want_heldout = split == "heldout"
        # Draw in rounds until enough sequences fall on the wanted side of the hash partition.
        per_round = n * (self.heldout_buckets + 8) if want_heldout else n + n // 8 + 8
        kept_tokens, kept_lengths, have = [], [], 0
        for _ in range(64):
            tokens, lengths = self._draw(per_round, generator)
            keep = self._in_heldout(tokens, self.heldout_buckets) == want_heldout
            kept_tokens.append(tokens[keep])
            kept_lengths.append(lengths[keep])
            have += int(keep.sum())
            if have >= n:
                tokens, lengths = torch.cat(kept_tokens)[:n], torch.cat(kept_lengths)[:n]
                return self._make_batch(tokens, lengths)
        raise ValueError(
            f"could not draw {n} {split} sequences: the sequence space (vocab_size="
            f"{self.vocab_size}, lengths {self.min_len}-{self.max_len}) is too small for a "
            "disjoint split; use heldout_buckets=None"
        )

    def batches(
        self,
        batch_size: int,
        *,
        seed: int,
        split: ReverseSplit = "train",
        n_batches: int | None = None,
    ) -> Iterator[Seq2SeqBatch]:
        """A seeded stream of batches (endless unless ``n_batches`` is given)."""
        generator = torch.Generator().manual_seed(seed)
        i = 0
        while n_batches is None or i < n_batches:
            yield self.sample(batch_size, generator, split=split)
            i += 1

    def heldout(
        self, n_sequences: int, *, batch_size: int = 500, seed: int = 1
    ) -> list[Seq2SeqBatch]:
        """A fixed held-out set of ``n_sequences`` sequences, in batches of ``batch_size``."""
        if n_sequences < 1 or batch_size < 1:
            raise ValueError(
                f"n_sequences and batch_size must be positive, got {n_sequences}, {batch_size}"
            )
        generator = torch.Generator().manual_seed(seed)
        sizes = [min(batch_size, n_sequences - i) for i in range(0, n_sequences, batch_size)]
        return [self.sample(s, generator, split="heldout") for s in sizes]

    def encode(self, sequences: Sequence[Sequence[int]]) -> Seq2SeqBatch:
        """The batch for explicit content sequences (e.g. ``[[3, 4, 5]]``).

        Raises:
            ValueError: for an empty sequence or ids outside the content range.
        """
        if not sequences or any(len(s) == 0 for s in sequences):
            raise ValueError("encode needs at least one non-empty sequence")
        width = max(len(s) for s in sequences)
        tokens = torch.full((len(sequences), width), self.pad_id, dtype=torch.int64)
        for i, s in enumerate(sequences):
            tokens[i, : len(s)] = torch.tensor(list(s), dtype=torch.int64)
        lengths = torch.tensor([len(s) for s in sequences])
        real = torch.arange(width) < lengths[:, None]
        if ((tokens < self.first_token) | (tokens >= self.vocab_size))[real].any():
            raise ValueError(f"content ids must lie in [{self.first_token}, {self.vocab_size})")
        return self._make_batch(tokens, lengths)

    def _make_batch(self, tokens: Tensor, lengths: Tensor) -> Seq2SeqBatch:
        """Build ``src``/``tgt``/``targets`` from tokens ``(N, W)`` (pad after each length)."""
        N = tokens.shape[0]
        L = int(lengths.max())
        tokens = tokens[:, :L]  # (N, L): trim to the longest sequence of this batch
        pos = torch.arange(L + 1)  # (L+1,)
        real = pos[:L] < lengths[:, None]  # (N, L)
        # Reversal as a gather: output position t reads input position length - 1 - t.
        src_index = (lengths[:, None] - 1 - pos[:L]).clamp_min(0)  # (N, L)
        reversed_ = tokens.gather(1, src_index).masked_fill(~real, self.pad_id)  # (N, L)
        pad_col = torch.full((N, 1), self.pad_id, dtype=torch.int64)
        is_eos = pos == lengths[:, None]  # (N, L+1): the slot right after the last token
        src = torch.cat([tokens, pad_col], 1).masked_fill(is_eos, self.eos_id)  # (N, L+1)
        targets = torch.cat([reversed_, pad_col], 1).masked_fill(is_eos, self.eos_id)  # (N, L+1)
        bos_col = torch.full((N, 1), self.bos_id, dtype=torch.int64)
        tgt = torch.cat([bos_col, reversed_], 1)  # (N, L+1)
        return Seq2SeqBatch(src, tgt, targets, src != self.pad_id)


__all__ = ["ReverseSplit", "ReverseTask"]
