"""Translate sentences with a trained model and score them with sacreBLEU.

:func:`translate` encodes the sources, sorts them by length, decodes batches with beam search
(§6.1: beam size 4, length penalty α = 0.6, GNMT's ``lp``; "maximum output length during inference
to input length + 50") or greedily, and detokenises back to plain text, in the input order.

:func:`score_bleu` runs ``sacrebleu`` on detokenised text against the raw references: cased
BLEU (sacreBLEU's default, tokenizer 13a) and lowercased BLEU (what most Multi30k papers report),
with their signatures, so every number can be reproduced.

Shapes: B sentences per batch, S source length, N new tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from attnlab.generation.generate import generate
from attnlab.models.transformer import EncoderDecoderTransformer
from attnlab.progress import Counter
from attnlab.translation.tokenizer import TranslationTokenizer

EXTRA_OUTPUT_TOKENS = 50  # §6.1: maximum output length = input length + 50


@torch.no_grad()
def translate(
    model: EncoderDecoderTransformer,
    tokenizer: TranslationTokenizer,
    sentences: Sequence[str],
    *,
    beam: int = 4,
    alpha: float = 0.6,
    batch_size: int = 64,
    extra_tokens: int = EXTRA_OUTPUT_TOKENS,
    progress: bool = False,
    memory_check: bool = True,
) -> list[str]:
    """Translate ``sentences`` (plain text) to plain text, in order.

    Args:
        beam: beam size K (1 = greedy decoding). alpha: GNMT length penalty α (beam only).
        batch_size: sentences decoded together (sorted by length first).
        extra_tokens: the output may be this many tokens longer than the source (capped by
            the model's ``max_seq_len``).
        progress: show progress on stderr: a tqdm bar on a terminal; elsewhere (a file, a
            pipe) a plain line each tenth of the sentences, not a bar's redraws.
        memory_check: refuse a batch whose decoding cannot fit in memory before allocating
            (:mod:`attnlab.generation.memory`); ``False`` skips the check.

    Returns:
        One translation per sentence; an empty (or blank) sentence gives ``""``.

    Raises:
        ValueError: for a source longer than the model's ``max_seq_len`` (EOS included), a
            beam or batch size < 1, or (``MemoryLimitError``) a batch of beams that cannot fit.
    """
    if beam < 1 or batch_size < 1:
        raise ValueError(f"beam and batch_size must be >= 1, got {beam}, {batch_size}")
    cfg = model.config
    encoded = tokenizer.encode_batch(list(sentences))
    for i, ids in enumerate(encoded):
        if len(ids) + 1 > cfg.max_seq_len:
            raise ValueError(
                f"sentence {i} has {len(ids) + 1} tokens with EOS, more than the model's "
                f"max_seq_len={cfg.max_seq_len}"
            )
    out = [""] * len(encoded)
    todo = sorted((i for i, ids in enumerate(encoded) if ids), key=lambda i: len(encoded[i]))
    bar = Counter(len(todo), "translating", "sentence") if progress else None
    for start in range(0, len(todo), batch_size):
        chunk = todo[start : start + batch_size]
        sources = [[*encoded[i], tokenizer.eos_id] for i in chunk]
        longest = max(len(s) for s in sources)
        new = generate(
            model,
            sources,
            max_new_tokens=min(cfg.max_seq_len, longest + extra_tokens),
            num_beams=beam,
            length_penalty=alpha,
            memory_check=memory_check,
        )  # (B, N)
        for i, row in zip(chunk, new.tolist(), strict=True):
            out[i] = tokenizer.decode(row)
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()
    return out


@dataclass(frozen=True)
class BleuScores:
    """Corpus BLEU of detokenised hypotheses against raw references."""

    bleu: float  # cased
    bleu_lowercase: float
    signature: str
    signature_lowercase: str
    detail: str  # sacreBLEU's full string of the cased score (n-gram precisions, BP, ratio)
    detail_lowercase: str
    n_sentences: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def score_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> BleuScores:
    """sacreBLEU corpus scores, cased and lowercased (default 13a tokenisation, one reference).

    Raises:
        ImportError: without ``sacrebleu`` (``pip install 'attnlab[translate]'``).
        ValueError: for lists of different lengths or no sentences.
    """
    try:
        from sacrebleu.metrics import BLEU
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("BLEU needs sacrebleu: pip install 'attnlab[translate]'") from e
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        raise ValueError("cannot score an empty list of sentences")
    hyps, refs = list(hypotheses), [list(references)]
    cased, lower = BLEU(), BLEU(lowercase=True)
    c, lc = cased.corpus_score(hyps, refs), lower.corpus_score(hyps, refs)
    return BleuScores(
        bleu=float(c.score),
        bleu_lowercase=float(lc.score),
        signature=str(cased.get_signature()),
        signature_lowercase=str(lower.get_signature()),
        detail=str(c),
        detail_lowercase=str(lc),
        n_sentences=len(hyps),
    )


__all__ = ["EXTRA_OUTPUT_TOKENS", "BleuScores", "score_bleu", "translate"]
