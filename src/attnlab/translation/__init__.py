"""Machine translation, the paper's own task: German->English on Multi30k, end to end.

- :mod:`~attnlab.translation.tokenizer`: a joint source+target BPE tokenizer (``tokenizers``),
  byte fallback, exact detokenisation up to NFKC/whitespace normalisation;
- :mod:`~attnlab.translation.data`: Multi30k files, encoding with a counted length filter,
  token-based length-bucketed batches, padding masks;
- :mod:`~attnlab.translation.train`: the §5 recipe (Adam 0.9/0.98/1e-9, warmup schedule, label
  smoothing, dropout, clipping), periodic validation (loss + greedy BLEU), best/last checkpoints,
  checkpoint averaging (§6.1), exact resume, time and step budgets;
- :mod:`~attnlab.translation.evaluate`: beam search / greedy translation and sacreBLEU scores
  (cased and lowercased, with signatures);
- ``attnlab train translate`` and ``attnlab translate`` (:mod:`~attnlab.translation.cli`).
"""

from attnlab.translation.checkpoints import average_checkpoints, latest_snapshot
from attnlab.translation.config import TranslateConfig
from attnlab.translation.data import (
    Batch,
    EncodedPairs,
    collate,
    download_multi30k,
    encode_pairs,
    load_pairs,
    token_batches,
)
from attnlab.translation.evaluate import (
    BleuScores,
    Translator,
    load_translator,
    score_bleu,
    translate,
)
from attnlab.translation.loop import validate
from attnlab.translation.tokenizer import TranslationTokenizer
from attnlab.translation.train import TranslationRun, train_translation

__all__ = [
    "Batch",
    "BleuScores",
    "EncodedPairs",
    "TranslateConfig",
    "TranslationRun",
    "TranslationTokenizer",
    "Translator",
    "average_checkpoints",
    "collate",
    "download_multi30k",
    "encode_pairs",
    "latest_snapshot",
    "load_pairs",
    "load_translator",
    "score_bleu",
    "token_batches",
    "train_translation",
    "translate",
    "validate",
]
