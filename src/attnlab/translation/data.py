"""Parallel data for translation: Multi30k files, encoding, token-based batches, padding masks.

Multi30k task 1 (Elliott et al., 2016): image captions in English with German (and French)
translations; splits ``train`` (29,000 pairs), ``val`` (1,014), ``test_2016_flickr`` (1,000).
Files are ``<split>.<lang>.gz`` (or uncompressed ``<split>.<lang>``), raw and cased, one sentence
per line, aligned by line number. :func:`download_multi30k` fetches them for users with a network
(checking the sha256 of the copies this project was built with); tests never download.

Sequences (§3, the decoder "consumes the previously generated symbols"):

- source: ``subwords + [EOS]``;
- decoder input: ``[BOS] + subwords``; target: ``subwords + [EOS]`` (the input shifted by one).

Length policy (no silent truncation): a pair whose source or target sequence is longer than the
model's ``max_len`` is **dropped from training/validation-loss data with a counted warning**
(:attr:`EncodedPairs.dropped`, also logged by the trainer); translation of a too-long source
raises ``ValueError`` instead, so test scores always cover every sentence. Empty lines: a split
with more than 1% of its pairs empty on one side is refused as damaged or misaligned; fewer are
kept with a warning that counts them (:func:`load_pairs`).

Batching (§5.1: "sentence pairs were batched together by approximate sequence length"): pairs
are sorted by length (ties in random order), cut greedily into batches whose padded size
``n_pairs · max(longest source, longest target)`` stays within ``max_tokens`` (a single pair
longer than that forms a batch of its own; none is ever split), and the batch order is shuffled.
The order is a pure function of ``(seed, epoch)``, which makes resuming exact.

Shapes: B pairs, S source length, T target length.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import urllib.request
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from attnlab.io import atomic_write_bytes, data_dirs, find_data_file
from attnlab.translation.tokenizer import TranslationTokenizer

logger = logging.getLogger(__name__)

DATA_ENV = "ATTNLAB_DATA"
# A split may hold a few empty sentences (kept, with a warning); more than this fraction of pairs
# with an empty (or blank) source or target means damaged or misaligned files: refused.
MAX_EMPTY_FRACTION = 0.01
SPLITS = ("train", "val", "test_2016_flickr")
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
# sha256 of the files this project was built and tested with (../shared/data/multi30k).
MULTI30K_SHA256 = {
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
}


def resolve_data_dir(path: str | os.PathLike[str] | None) -> Path:
    """``path``, or ``multi30k/`` in the data folders (:func:`attnlab.io.data_dirs`) when
    ``path`` is ``None``.

    Raises:
        FileNotFoundError: if the directory does not exist (or none is found), saying where
            it was looked for.
    """
    if path is None:
        found = find_data_file("multi30k")
        if found is None:
            searched = ", ".join(str(d) for d in data_dirs())
            raise FileNotFoundError(
                f"no multi30k/ folder in the data folders ({searched}): pass --data DIR, set "
                f"${DATA_ENV}, or fetch the files with attnlab.translation.download_multi30k(DIR)"
            )
        path = found
    directory = Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(
            f"data directory {directory} does not exist (expected Multi30k files such as "
            "train.de.gz; attnlab.translation.download_multi30k fetches them)"
        )
    return directory


def _split_file(directory: Path, split: str, lang: str) -> Path | None:
    for name in (f"{split}.{lang}.gz", f"{split}.{lang}"):
        if (directory / name).is_file():
            return directory / name
    return None


def available(directory: str | os.PathLike[str]) -> dict[str, list[str]]:
    """``split -> sorted languages`` of the ``<split>.<lang>[.gz]`` files in ``directory``."""
    found: dict[str, set[str]] = {}
    for p in Path(directory).iterdir():
        name = p.name.removesuffix(".gz")
        split, dot, lang = name.rpartition(".")
        if p.is_file() and dot and split and lang.isalpha():
            found.setdefault(split, set()).add(lang)
    return {s: sorted(v) for s, v in sorted(found.items())}


def read_lines(directory: str | os.PathLike[str] | None, split: str, lang: str) -> list[str]:
    """The sentences of ``<split>.<lang>[.gz]`` (line ends removed, nothing else changed).

    Raises:
        FileNotFoundError: for a missing directory, or a missing file (listing what exists).
        ValueError: for a damaged file (a truncated ``.gz``, invalid UTF-8), naming it.
    """
    directory = resolve_data_dir(directory)
    file = _split_file(directory, split, lang)
    if file is None:
        have = available(directory)
        if split not in have:
            raise FileNotFoundError(
                f"no split {split!r} in {directory}; splits there: {', '.join(have) or 'none'}"
            )
        raise ValueError(
            f"unknown language {lang!r} for split {split!r} in {directory}; "
            f"available: {', '.join(have[split])}"
        )
    opener = gzip.open if file.suffix == ".gz" else open
    try:
        with opener(file, "rt", encoding="utf-8", newline="\n") as f:
            return f.read().splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(f"{file} is not valid UTF-8 text (byte {e.start})") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:  # truncated or not gzip at all
        raise ValueError(f"{file} is a damaged gzip file ({e}); download it again") from None


def load_pairs(
    directory: str | os.PathLike[str] | None,
    split: str,
    src: str,
    tgt: str,
    *,
    limit: int | None = None,
) -> list[tuple[str, str]]:
    """Aligned ``(source, target)`` sentences of one split (the first ``limit`` if given).

    Empty lines: a pair whose source or target is empty (or only blanks) teaches nothing and
    scores nothing; Multi30k has none. Up to :data:`MAX_EMPTY_FRACTION` (1%) of the pairs read
    may be such pairs: they are kept (a test set is scored on every line), and a warning says
    how many and where the first ones are. More than that means damaged or misaligned files
    (a blank line shifting one side, a file of blank lines) and is refused.

    Raises:
        ValueError: for ``src == tgt``, an unknown language, files of different lengths, or
            more than 1% of the pairs with an empty side (naming the files, the counts and the
            first line numbers).
        FileNotFoundError: for a missing directory or split.
    """
    if src == tgt:
        raise ValueError(f"source and target language are both {src!r}")
    sources, targets = read_lines(directory, split, src), read_lines(directory, split, tgt)
    if len(sources) != len(targets):
        raise ValueError(
            f"{split}.{src} has {len(sources)} lines but {split}.{tgt} has {len(targets)}"
        )
    pairs = list(zip(sources, targets, strict=True))
    pairs = pairs if limit is None else pairs[:limit]
    _check_empty(pairs, resolve_data_dir(directory), split, src, tgt)
    return pairs


def _check_empty(
    pairs: Sequence[tuple[str, str]], directory: Path, split: str, src: str, tgt: str
) -> None:
    """Warn about pairs with an empty side, or refuse more than :data:`MAX_EMPTY_FRACTION` of
    them (see :func:`load_pairs`)."""
    empty = [i for i, (s, t) in enumerate(pairs) if not s.strip() or not t.strip()]
    if not empty:
        return
    n_src = sum(not s.strip() for s, _ in pairs)
    n_tgt = sum(not t.strip() for _, t in pairs)
    lines = ", ".join(str(i + 1) for i in empty[:5]) + (", ..." if len(empty) > 5 else "")
    what = (
        f"{len(empty)} of {len(pairs)} pairs of {split}.{src} / {split}.{tgt} in {directory} "
        f"have an empty side ({n_src} empty {src} lines, {n_tgt} empty {tgt} lines; lines "
        f"{lines})"
    )
    if len(empty) > MAX_EMPTY_FRACTION * len(pairs):
        raise ValueError(
            f"{what}: more than {MAX_EMPTY_FRACTION:.0%} of the pairs, so the files are "
            "damaged or misaligned; remove the empty lines from both files (line by line)"
        )
    logger.warning("%s: kept (at most %.0f%% may be)", what, 100 * MAX_EMPTY_FRACTION)


def download_multi30k(
    directory: str | os.PathLike[str],
    *,
    languages: Sequence[str] = ("de", "en"),
    splits: Sequence[str] = SPLITS,
    base_url: str = MULTI30K_URL,
) -> Path:
    """Download the Multi30k task-1 raw files into ``directory`` (skipping present ones).

    Raises:
        OSError: on network errors. ValueError: if a file's sha256 differs from the known one.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for split in splits:
        for lang in languages:
            name = f"{split}.{lang}.gz"
            if (out / name).is_file():
                continue
            with urllib.request.urlopen(base_url + name, timeout=60) as r:
                data = r.read()
            digest = hashlib.sha256(data).hexdigest()
            if name in MULTI30K_SHA256 and digest != MULTI30K_SHA256[name]:
                raise ValueError(f"{name}: sha256 {digest} differs from the expected one")
            atomic_write_bytes(out / name, data)
    return out


@dataclass(frozen=True)
class EncodedPairs:
    """Token ids of parallel sentences (see the module docstring for the layout).

    Attributes:
        src: per pair, ``subwords + [EOS]``. tgt: per pair, ``subwords + [EOS]``.
        index: per pair, its line number in the split. dropped: pairs left out as too long.
    """

    src: list[list[int]]
    tgt: list[list[int]]
    index: list[int]
    dropped: int = 0

    def __len__(self) -> int:
        return len(self.src)

    @property
    def src_lengths(self) -> np.ndarray:
        return np.array([len(s) for s in self.src], dtype=np.int64)

    @property
    def tgt_lengths(self) -> np.ndarray:
        return np.array([len(t) for t in self.tgt], dtype=np.int64)


def encode_pairs(
    tokenizer: TranslationTokenizer,
    pairs: Sequence[tuple[str, str]],
    *,
    max_len: int,
    too_long: Literal["drop", "raise"] = "drop",
    what: str = "data",
) -> EncodedPairs:
    """Encode pairs, dropping (with a counted warning) or rejecting those over ``max_len``.

    Raises:
        ValueError: with ``too_long="raise"``, naming the first pair that does not fit.
    """
    if max_len < 2:
        raise ValueError(f"max_len must be >= 2 (a token and EOS), got {max_len}")
    eos = tokenizer.eos_id
    srcs = tokenizer.encode_batch([s for s, _ in pairs])
    tgts = tokenizer.encode_batch([t for _, t in pairs])
    out_s, out_t, index = [], [], []
    for i, (s, t) in enumerate(zip(srcs, tgts, strict=True)):
        if len(s) + 1 > max_len or len(t) + 1 > max_len:
            if too_long == "raise":
                raise ValueError(
                    f"{what} pair {i} has {len(s) + 1} source / {len(t) + 1} target tokens, "
                    f"more than max_len={max_len}"
                )
            continue
        out_s.append([*s, eos])
        out_t.append([*t, eos])
        index.append(i)
    dropped = len(pairs) - len(index)
    if dropped:
        logger.warning(
            "%s: dropped %d of %d pairs longer than max_len=%d tokens",
            what,
            dropped,
            len(pairs),
            max_len,
        )
    return EncodedPairs(out_s, out_t, index, dropped)


def token_batches(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    *,
    max_tokens: int,
    seed: int | None = None,
    epoch: int = 0,
) -> list[list[int]]:
    """Group pair indices into length-sorted batches of at most ``max_tokens`` padded tokens.

    Args:
        src_lengths, tgt_lengths: ``(N,)`` sequence lengths.
        max_tokens: bound on ``len(batch) · max(longest source, longest target)``.
        seed: shuffle ties and the batch order with ``(seed, epoch)``; ``None`` keeps them sorted
            (evaluation).

    Returns:
        Batches of indices; every index in ``range(N)`` is in exactly one batch.

    Raises:
        ValueError: for ``max_tokens < 1`` or lengths of different sizes.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if len(src_lengths) != len(tgt_lengths):
        raise ValueError(f"{len(src_lengths)} source but {len(tgt_lengths)} target lengths")
    n = len(src_lengths)
    rng = np.random.default_rng([seed, epoch]) if seed is not None else None
    order = rng.permutation(n) if rng is not None else np.arange(n)
    longest = np.maximum(src_lengths, tgt_lengths)[order]
    order = order[np.lexsort((src_lengths[order], longest))]  # stable: ties stay random
    batches: list[list[int]] = []
    current: list[int] = []
    width = 0
    for i in order.tolist():
        w = max(width, int(src_lengths[i]), int(tgt_lengths[i]))
        if current and (len(current) + 1) * w > max_tokens:
            batches.append(current)
            current, w = [], max(int(src_lengths[i]), int(tgt_lengths[i]))
        current.append(i)
        width = w
    if current:
        batches.append(current)
    if rng is not None:
        batches = [batches[j] for j in rng.permutation(len(batches)).tolist()]
    return batches


@dataclass(frozen=True)
class Batch:
    """One padded batch.

    Attributes:
        src: ``(B, S)`` ids. src_mask: ``(B, S)`` bool, True = real token (may be attended).
        tgt_in: ``(B, T)`` decoder input ``[BOS] + subwords``.
        tgt_out: ``(B, T)`` targets ``subwords + [EOS]``, ``pad_id`` where padded.
        index: ``(B,)`` positions of the pairs in the :class:`EncodedPairs`.
    """

    src: Tensor
    src_mask: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    index: list[int]

    @property
    def n_src_tokens(self) -> int:
        return int(self.src_mask.sum())


def _pad(rows: Sequence[Sequence[int]], pad_id: int) -> Tensor:
    out = torch.full((len(rows), max(len(r) for r in rows)), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out


def collate(data: EncodedPairs, index: Sequence[int], *, pad_id: int, bos_id: int) -> Batch:
    """Pad the pairs ``index`` of ``data`` into a :class:`Batch` (right padding)."""
    if not index:
        raise ValueError("cannot collate an empty batch")
    src = _pad([data.src[i] for i in index], pad_id)  # (B, S)
    tgt_out = _pad([data.tgt[i] for i in index], pad_id)  # (B, T)
    tgt_in = _pad([[bos_id, *data.tgt[i][:-1]] for i in index], pad_id)  # (B, T)
    return Batch(src, src != pad_id, tgt_in, tgt_out, list(index))


__all__ = [
    "DATA_ENV",
    "MULTI30K_SHA256",
    "SPLITS",
    "Batch",
    "EncodedPairs",
    "available",
    "collate",
    "download_multi30k",
    "encode_pairs",
    "load_pairs",
    "read_lines",
    "resolve_data_dir",
    "token_batches",
]
