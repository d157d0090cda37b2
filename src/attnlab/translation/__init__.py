"""Machine translation, the paper's own task: what is translation's own (floor 4, below training).

- :mod:`~attnlab.translation.tokenizer`: a joint source+target BPE tokenizer (``tokenizers``),
  byte fallback, exact detokenisation up to NFKC/whitespace normalisation;
- :mod:`~attnlab.translation.data`: Multi30k files, encoding with a counted length filter,
  token-based length-bucketed batches (§5.1), padding masks, the download;
- :mod:`~attnlab.translation.evaluate`: beam search / greedy translation of plain text and
  sacreBLEU scores (cased and lowercased, with signatures).

Training is the one trainer's ``translate`` recipe (:mod:`attnlab.training.recipes.translation`:
``attnlab train translate``), which also loads trained runs for ``attnlab translate``.
"""

from attnlab.translation.data import (
    Batch,
    EncodedPairs,
    collate,
    download_multi30k,
    encode_pairs,
    load_pairs,
    token_batches,
)
from attnlab.translation.evaluate import BleuScores, score_bleu, translate
from attnlab.translation.tokenizer import TranslationTokenizer

__all__ = [
    "Batch",
    "BleuScores",
    "EncodedPairs",
    "TranslationTokenizer",
    "collate",
    "download_multi30k",
    "encode_pairs",
    "load_pairs",
    "score_bleu",
    "token_batches",
    "translate",
]
