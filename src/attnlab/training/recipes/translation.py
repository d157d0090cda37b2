"""The translation recipe (``attnlab train translate``): §5's training at a CPU size, on Multi30k.

The data and the measures are :mod:`attnlab.translation`'s (parallel files, the joint BPE
tokenizer, token-based batches, sacreBLEU); the loop is the one trainer:

- a joint BPE vocabulary trained on the training pairs (or the run's, when resuming), shared and
  tied embeddings (§3.4); a post-norm encoder-decoder (d_model 256, 3+3 layers, 4 heads);
- Adam(0.9, 0.98, 1e-9) with eq. (3)'s rate (§5.3) times ``lr`` (0.3, 400 warmup steps), label
  smoothing 0.1 (§5.4), dropout 0.1, gradient clipping at 1.0;
- batches of at most ``max_tokens`` padded tokens of similar lengths (§5.1), in an order that is
  a function of ``(seed, epoch)`` (an :class:`~attnlab.training.objectives.EpochStream`: the
  data position is ``(epoch, batch)``, so a resumed run continues bitwise);
- every ``eval_every`` steps: the validation loss over all validation pairs, perplexity and
  greedy BLEU on the first ``eval_bleu_sentences`` of them; ``best/`` follows BLEU;
- checkpoints every ``checkpoint_every`` steps, ``last/`` at the end, and ``averaged/``: the
  mean of the last ``average_last`` checkpoints (§6.1), evaluated like the others.

``arch``: ``transformer`` (the default, above), ``rnn-attention`` (a recurrent encoder-decoder
with Bahdanau's attention, ``attention=luong`` for Luong's; :mod:`attnlab.models.rnn_seq2seq`)
or ``rnn`` (the same without attention): the same BPE, batches, training and BLEU; their runs go
to ``runs/translate-SRC-TGT-ARCH``.

Budgets: 90 minutes of training by default (``max_minutes``); ``steps`` and ``max_epochs``
also apply. The options of attnlab 0.1's ``train translate`` keep working as aliases
(``max_steps``, ``lr_factor``, ``save_every``, ``adam_beta1``, ``best_metric=bleu``, ...).

Translating with a trained run: :func:`load_translator` (``attnlab translate``).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from torch import nn

from attnlab.config import Config, check_positive
from attnlab.io import find_data_file
from attnlab.models.family import Kind, find_family
from attnlab.models.rnn_seq2seq import RNNSeq2SeqConfig
from attnlab.models.transformer import EncoderDecoderTransformer, TransformerConfig
from attnlab.pretrained import WEIGHTS_NAME, from_pretrained
from attnlab.tokenizers import LibraryTokenizer, Tokenizer
from attnlab.training.config import TrainConfig
from attnlab.training.objectives import EpochStream, Objective, Seq2SeqBatch, Seq2SeqObjective
from attnlab.training.recipes.base import RECIPES, Data, Recipe
from attnlab.training.rundir import EXPORTS, RunDir, read_export_info
from attnlab.training.trainer import Callback, Trainer
from attnlab.translation.data import (
    EncodedPairs,
    available,
    collate,
    encode_pairs,
    load_pairs,
    token_batches,
)
from attnlab.translation.evaluate import score_bleu, translate
from attnlab.translation.tokenizer import TranslationTokenizer

# the recurrent architectures: arch -> its attention (attnlab.models.rnn_seq2seq)
RNN_ATTENTION: dict[str, Literal["bahdanau", "luong", "none"]] = {
    "rnn": "none",
    "rnn-attention": "bahdanau",
}


@dataclass(frozen=True, kw_only=True)
class TranslateOptions(Config):
    """The languages, data and tokenizer of the translation recipe."""

    src: str = "de"
    tgt: str = "en"
    data: str | None = None  # a Multi30k-style folder; None: multi30k/ in the data folders
    vocab_size: int = 8000  # joint BPE vocabulary (4 specials + 256 byte tokens included)
    min_frequency: int = 2  # BPE: least frequency of a merge
    max_len: int = 128  # the model's max_seq_len; longer training pairs are dropped (counted)
    max_tokens: int = 2048  # padded tokens per batch: n_pairs * max(source, target length)
    train_limit: int | None = None  # use only the first N training pairs
    eval_bleu_sentences: int = 200  # greedy BLEU on the first N validation pairs (0: off)
    arch: Literal["transformer", "rnn", "rnn-attention"] = "transformer"
    attention: Literal["bahdanau", "luong"] | None = None  # rnn-attention's; None: bahdanau

    def validate(self) -> None:
        super().validate()
        if self.attention is not None and RNN_ATTENTION.get(self.arch) in (None, "none"):
            raise ValueError(
                f"attention={self.attention!r} applies to arch='rnn-attention', not "
                f"arch={self.arch!r}"
            )
        for name in ("src", "tgt"):
            value = getattr(self, name)
            if not value.isalpha():
                raise ValueError(f"{name} must be a language code such as 'de', got {value!r}")
        if self.src == self.tgt:
            raise ValueError(f"source and target language are both {self.src!r}")
        check_positive(vocab_size=self.vocab_size, min_frequency=self.min_frequency,
                       max_tokens=self.max_tokens, train_limit=self.train_limit)  # fmt: skip
        if self.max_len < 2:
            raise ValueError(f"max_len must be >= 2 (a token and EOS), got {self.max_len}")
        if self.eval_bleu_sentences < 0:
            raise ValueError(f"eval_bleu_sentences must be >= 0, got {self.eval_bleu_sentences}")


def data_directory(options: TranslateOptions) -> Path:
    """The folder of the parallel files: ``options.data``, else ``multi30k/`` in the data
    folders.

    Raises:
        FileNotFoundError: naming what was searched and how to get the files.
        ValueError: for a language the folder has no training data for.
    """
    if options.data is not None:
        directory = Path(options.data)
        if not directory.is_dir():
            raise FileNotFoundError(
                f"data directory {directory} does not exist or is not a directory (expected "
                "Multi30k files such as train.de.gz)"
            )
    else:
        found = find_data_file("multi30k")
        if found is None:
            raise FileNotFoundError(
                "no multi30k/ folder in the data folders ($ATTNLAB_DATA, ../shared/data beside "
                "the checkout, ~/.cache/attnlab): pass --data DIR, or fetch the files with "
                "attnlab.translation.download_multi30k(DIR)"
            )
        directory = found
    langs = available(directory).get("train", [])
    for lang in (options.src, options.tgt):
        if lang not in langs:
            raise ValueError(
                f"unknown language {lang!r}: {directory} has training data for "
                f"{', '.join(langs) or 'no language'}"
            )
    return directory


def _data(options: TranslateOptions, tokenizer: Tokenizer | None, train: TrainConfig) -> Data:
    o = options
    directory = data_directory(o)
    train_pairs = load_pairs(directory, "train", o.src, o.tgt, limit=o.train_limit)
    val_pairs = load_pairs(directory, "val", o.src, o.tgt)
    if not train_pairs or not val_pairs:
        raise ValueError(f"{directory} has no training or no validation pairs ({o.src}-{o.tgt})")
    if isinstance(tokenizer, LibraryTokenizer):  # the run's own, when resuming or rebuilding
        tok = TranslationTokenizer(tokenizer.backend)  # type: ignore[arg-type]
    else:
        texts = [s for pair in train_pairs for s in pair]
        tok = TranslationTokenizer.train(
            texts, vocab_size=o.vocab_size, min_frequency=o.min_frequency
        )
    train_data = encode_pairs(tok, train_pairs, max_len=o.max_len, what="train")
    val_data = encode_pairs(tok, val_pairs, max_len=o.max_len, what="val")
    if not len(train_data):
        raise ValueError(
            f"every training pair is longer than max_len={o.max_len} tokens; raise --max-len"
        )
    bleu_pairs = [val_pairs[i] for i in val_data.index[: o.eval_bleu_sentences]]
    info = {"directory": str(directory), "src": o.src, "tgt": o.tgt,
            "train_pairs": len(train_data), "train_dropped": train_data.dropped,
            "val_pairs": len(val_data), "val_dropped": val_data.dropped}  # fmt: skip
    value = {"train": train_data, "val": val_data, "bleu_pairs": bleu_pairs, "tokenizer": tok}
    return Data(value, tok, info, {"src": o.src, "tgt": o.tgt, "data": str(directory)})


def _model_config(options: Any, data: Data | None) -> Any:
    vocab = data.tokenizer.vocab_size if data is not None and data.tokenizer else options.vocab_size
    attention = RNN_ATTENTION.get(options.arch)
    if attention is not None:  # d_model 256, one bidirectional GRU layer of 512 per direction
        return RNNSeq2SeqConfig(
            vocab_size=vocab, attention=options.attention or attention,
            max_seq_len=options.max_len, pad_id=0, bos_id=1, eos_id=2,
        )  # fmt: skip
    return TransformerConfig(
        vocab_size=vocab, d_model=256, n_heads=4, n_layers=3, d_ff=1024, dropout=0.1,
        max_seq_len=options.max_len, norm_position="post", share_embeddings=True,
        tie_output=True, pad_id=0, bos_id=1, eos_id=2,
    )  # fmt: skip


def _batch(data: EncodedPairs, index: list[int], tok: TranslationTokenizer) -> Seq2SeqBatch:
    b = collate(data, index, pad_id=tok.pad_id, bos_id=tok.bos_id)
    return Seq2SeqBatch(b.src, b.tgt_in, b.tgt_out, b.src_mask)


def _objective(options: Any, config: Any, data: Data, train: TrainConfig) -> Objective:
    d = data.value
    tok, train_data, val_data = d["tokenizer"], d["train"], d["val"]
    lengths = (train_data.src_lengths, train_data.tgt_lengths)

    def stream(batch_size: int, seed: int) -> EpochStream:
        def order(epoch: int) -> list[list[int]]:
            return token_batches(*lengths, max_tokens=options.max_tokens, seed=seed, epoch=epoch)

        return EpochStream(order, lambda index: _batch(train_data, index, tok))

    val_order = token_batches(val_data.src_lengths, val_data.tgt_lengths,
                              max_tokens=options.max_tokens)  # fmt: skip
    val = [_batch(val_data, index, tok) for index in val_order]
    return Seq2SeqObjective(stream, val, pad_id=tok.pad_id)


class TranslationMetrics(Callback):
    """Perplexity, and greedy BLEU on the first validation pairs (sacreBLEU, cased)."""

    def __init__(self, tokenizer: TranslationTokenizer, pairs: list[tuple[str, str]]) -> None:
        self.tokenizer, self.pairs = tokenizer, pairs
        self.names = ("ppl", "bleu") if pairs else ("ppl",)

    def metrics(
        self, trainer: Trainer, model: nn.Module, base: dict[str, float]
    ) -> dict[str, float]:
        out = {"ppl": math.exp(min(base["val_loss"], 50.0))}
        if self.pairs and _is_seq2seq(model):
            hyps = translate(cast(Any, model), self.tokenizer, [s for s, _ in self.pairs], beam=1)
            out["bleu"] = score_bleu(hyps, [t for _, t in self.pairs]).bleu
        return out


def _is_seq2seq(model: nn.Module) -> bool:
    """Whether ``model`` is an encoder-decoder (its family's kind: what translates)."""
    family = find_family(model)
    return family is not None and family.kind is Kind.SEQ2SEQ


def _callbacks(options: Any, config: Any, data: Data) -> list[Callback]:
    return [TranslationMetrics(data.value["tokenizer"], data.value["bleu_pairs"])]


def _adjust(options: Any, train: TrainConfig, model: Any, given: set[str]) -> TrainConfig:
    """Without BLEU (``eval_bleu_sentences=0``) the best model follows the validation loss,
    unless a best metric was asked for."""
    if (
        options.eval_bleu_sentences == 0
        and train.best_metric == "val_bleu"
        and not (given & {"best_metric", "train.best_metric"})
    ):
        return dataclasses.replace(train, best_metric="val_loss")
    return train


def _best_metric(value: Any) -> dict[str, Any]:
    """also ``bleu`` or ``loss``: attnlab 0.1's names of ``val_bleu``, ``val_loss``"""
    return {"best_metric": {"bleu": "val_bleu", "loss": "val_loss"}.get(value, value)}


def _adam_beta1(value: float) -> dict[str, Any]:
    """the first of ``betas``"""
    return {"betas[0]": value}


def _adam_beta2(value: float) -> dict[str, Any]:
    """the second of ``betas``"""
    return {"betas[1]": value}


def _no_label_smoothing(value: bool) -> dict[str, Any]:
    """same as ``--label-smoothing 0``"""
    return {"label_smoothing": 0.0} if value else {}


TRANSLATE = Recipe(
    "translate",
    "train an encoder-decoder translation model (Multi30k de->en by default; the paper's task)",
    TranslateOptions(),
    TrainConfig(
        steps=None, max_minutes=90.0, optimizer="adam", lr=0.3, betas=(0.9, 0.98), adam_eps=1e-9,
        schedule="noam", warmup=400, label_smoothing=0.1, clip_grad_norm=1.0, eval_every=250,
        best_metric="val_bleu", save_best=True, export_last=True, checkpoint_every=250,
        keep_checkpoints=5, average_last=5, log_every=25,
        # as attnlab 0.1's loop, so a fixed-seed run reproduces it bitwise: dropout continues
        # from the RNG state the model's initialisation left, and Adam is the for-loop kernel
        # (fused Adam differs in the last bit, which 600 steps amplify into other BLEU)
        reseed_dropout=False, optimizer_impl="for-loop",
    ),
    _model_config, _data, _objective, _callbacks, _adjust,
    run_name=lambda o: f"translate-{o.src}-{o.tgt}" + (
        f"-{o.arch}" if o.arch in RNN_ATTENTION else ""
    ),
    derived=("vocab_size", "max_seq_len", "attention"),  # --attention is the option's
    variants=(TranslateOptions(arch="rnn-attention"),),
    # the largest batch: max_tokens padded tokens as sequences of the full length
    memory_batch=lambda o, t: max(1, o.max_tokens // o.max_len),
    aliases={
        "max_steps": "steps", "lr_factor": "lr", "save_every": "checkpoint_every",
        "save_every_minutes": "checkpoint_every_minutes", "best_metric": (_best_metric, str),
        "adam_beta1": (_adam_beta1, float), "adam_beta2": (_adam_beta2, float),
        "no_label_smoothing": (_no_label_smoothing, bool),
    },
)  # fmt: skip
RECIPES.add(TRANSLATE.name, TRANSLATE)


# -- translating with a trained run ------------------------------------------------------------


@dataclass(frozen=True)
class Translator:
    """A loaded model directory: the model (eval mode), its tokenizer and its export info."""

    model: EncoderDecoderTransformer
    tokenizer: TranslationTokenizer
    info: dict[str, Any]
    path: Path


def resolve_model_dir(path: str | os.PathLike[str], checkpoint: str | None = None) -> Path:
    """The model directory to load: ``path`` itself when it holds weights, else its
    ``checkpoint`` export (default: the first of averaged, best, last that exists).

    Raises:
        FileNotFoundError: if ``path`` is missing or holds no model.
        ValueError: for an unknown ``checkpoint`` name.
    """
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"model directory {root} does not exist")
    order = ("averaged", "best", "last")
    if checkpoint is not None and checkpoint not in EXPORTS:
        raise ValueError(f"checkpoint={checkpoint!r} is not valid; choose one of {list(order)}")
    if checkpoint is None and (root / WEIGHTS_NAME).is_file():
        return root
    for name in [checkpoint] if checkpoint else order:
        if (root / name / WEIGHTS_NAME).is_file():
            return root / name
    wanted = checkpoint or " / ".join(order)
    raise FileNotFoundError(f"{root} holds no model ({WEIGHTS_NAME}, or {wanted}/{WEIGHTS_NAME})")


def load_translator(path: str | os.PathLike[str], checkpoint: str | None = None) -> Translator:
    """Load a model directory written by ``attnlab train translate`` (see
    :func:`resolve_model_dir`).

    Raises:
        FileNotFoundError: for a missing directory, weights or tokenizer.
        ValueError: for a run of another recipe, if the model is not an encoder-decoder or the
            tokenizer is not a translation run's joint BPE or does not fit the model.
    """
    run = RunDir(path)
    if Path(path).is_dir() and run.holds_run() and not run.is_legacy_translation():
        recipe = run.read_record().get("recipe")
        if recipe != "translate":  # a character-level LM's run has no translation model
            raise ValueError(
                f"{path} is a {recipe!r} run, not a translation run: translate needs the model "
                "and joint BPE tokenizer that 'attnlab train translate' writes"
            )
    directory = resolve_model_dir(path, checkpoint)
    model: Any = from_pretrained(directory)  # NaN/inf refused; a quantized model directory too
    if not _is_seq2seq(model):
        raise ValueError(f"{directory} holds a {type(model).__name__}, not a translation model")
    tokenizer = TranslationTokenizer.load(directory)
    if tokenizer.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"tokenizer has {tokenizer.vocab_size} ids but the model {model.config.vocab_size}"
        )
    return Translator(model, tokenizer, read_export_info(directory), directory)


__all__ = [
    "TranslateOptions",
    "TranslationMetrics",
    "Translator",
    "data_directory",
    "load_translator",
    "resolve_model_dir",
]
