"""BERT pre-training on Tiny Shakespeare's sentence pairs: masked LM + next-sentence prediction.

- ``shakespeare-bert``: BERT's two pre-training tasks at once (Devlin et al. §3.1) on pairs of
  Tiny Shakespeare's non-empty lines, ``[CLS] A [SEP] B [SEP]`` with segment ids 0/1: half the
  time B is the line after A (IsNext), otherwise a random other line of the same split
  (NotNext); the tokens are masked by BERT's 15% / 80-10-10 rule. The model is
  ``shakespeare-mlm``'s BERT (4 layers, 4 heads, d_model 128) with the pooler and the
  next-sentence head, and a context of 128 (two lines). It reports the masked-token loss and
  accuracy (``val_loss``, ``val_accuracy``) and the next-sentence accuracy and loss
  (``val_nsp_accuracy``, ``val_nsp_loss``; chance is 50%).

The last ``val_fraction`` of the lines is the validation split; no pair mixes the splits. The
pairing is a function of the seed and resumes exactly (the sampler's generator is the data
position). ``data`` names another text file (one sentence per line); ``tokenizer=bpe`` trains a
byte-level BPE on the training lines.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from attnlab.config import check_probability
from attnlab.data.pairs import SentencePairs
from attnlab.data.text import load_text
from attnlab.models.bert import BERTConfig
from attnlab.tokenizers import BERT_SPECIALS, BPETokenizer, CharTokenizer, Tokenizer
from attnlab.training.config import TrainConfig
from attnlab.training.nsp import MLMNSPObjective, NSPMetrics
from attnlab.training.objectives import Objective
from attnlab.training.recipes.base import RECIPES, Data, Recipe
from attnlab.training.recipes.text import LM_TRAIN, TextData
from attnlab.training.trainer import Callback


@dataclass(frozen=True, kw_only=True)
class PairOptions(TextData):
    """``shakespeare-bert``'s options: the text, its tokenizer and BERT's masking rate."""

    mask_prob: float = 0.15

    def validate(self) -> None:
        super().validate()
        check_probability(mask_prob=self.mask_prob)


def text_lines(text: str) -> list[str]:
    """The non-empty lines of ``text`` (whitespace-only lines count as empty), in order."""
    return [line for line in text.splitlines() if line.strip()]


def _data(options: PairOptions, tokenizer: Tokenizer | None, train: TrainConfig) -> Data:
    text, source = load_text(options.data)
    lines = text_lines(text)
    n_train = int(len(lines) * (1 - options.val_fraction))
    if tokenizer is None and options.tokenizer == "bpe":
        tokenizer = BPETokenizer.train(
            ["\n".join(lines[:n_train])], vocab_size=options.bpe_vocab_size,
            specials=BERT_SPECIALS,
        )  # fmt: skip
    elif tokenizer is None:
        tokenizer = CharTokenizer.from_text(text, specials=BERT_SPECIALS)
    ids = [tokenizer.encode(line) for line in lines]
    info = {"file": str(source), "characters": len(text), "lines": len(lines),
            "train_lines": n_train, "tokens": sum(len(x) for x in ids)}  # fmt: skip
    # the pairs need the model's special ids and context: SentencePairs is made by _objective
    return Data({"lines": ids, "val_fraction": options.val_fraction}, tokenizer, info)


def _model_config(options: Any, data: Data | None) -> BERTConfig:
    vocab = data.tokenizer.vocab_size if data is not None and data.tokenizer else 69
    return BERTConfig(
        vocab_size=vocab, d_model=128, n_heads=4, n_layers=4, d_ff=512, max_seq_len=128,
        dropout=0.0, pooler=True, mlm_head=True, nsp_head=True, pad_id=0, cls_id=1, sep_id=2,
        mask_id=3, norm_eps=1e-5,
    )  # fmt: skip


def _pairs(config: BERTConfig, data: Data) -> SentencePairs:
    if config.pad_id is None:
        raise ValueError("shakespeare-bert pads its pairs: the model needs a pad_id")
    return SentencePairs(
        data.value["lines"], cls_id=config.cls_id, sep_id=config.sep_id, pad_id=config.pad_id,
        max_len=config.max_seq_len, val_fraction=data.value["val_fraction"],
    )  # fmt: skip


def _objective(options: Any, config: Any, data: Data, train: TrainConfig) -> Objective:
    return MLMNSPObjective(
        _pairs(config, data), vocab_size=config.vocab_size, mask_id=config.mask_id,
        special_ids=config.special_ids, mask_prob=options.mask_prob,
        ignore_index=config.ignore_index,
    )  # fmt: skip


def _callbacks(options: Any, config: Any, data: Data) -> list[Callback]:
    return [NSPMetrics()]


SHAKESPEARE_BERT = Recipe(
    "shakespeare-bert",
    "BERT pre-training on Tiny Shakespeare line pairs: masked LM (15% masked, 80/10/10) + "
    "next-sentence prediction (50% IsNext)",
    PairOptions(), dataclasses.replace(LM_TRAIN, batch_size=32), _model_config, _data,
    _objective, _callbacks,
    derived=("vocab_size", "mlm_head", "nsp_head"),  # both heads are the task
)  # fmt: skip
RECIPES.add(SHAKESPEARE_BERT.name, SHAKESPEARE_BERT)

__all__ = ["SHAKESPEARE_BERT", "PairOptions", "text_lines"]
