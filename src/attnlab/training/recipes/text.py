"""Recipes on Tiny Shakespeare: a character-level GPT and a BERT masked LM.

- ``shakespeare-char``: nanoGPT's "baby GPT" CPU setting (4 layers, 4 heads, d_model 128,
  context 64, batch 12, dropout 0, 2000 iterations, AdamW lr 1e-3 with 100 warmup steps (a tenth
  of the steps in a run of at most 100) and cosine decay to 1e-4). ``arch=modern`` swaps in
  RoPE, SwiGLU (d_ff 346, the same parameter count) and RMSNorm, still pre-norm. ``arch=mamba``,
  ``lstm``, ``gru``: the families before and after attention at the same parameter count
  (``mamba-char-baby``, ``lstm-char-baby``, ``gru-char-baby``: 825k, 792k, 781k against the
  GPT's 804k at 65 characters), same data, objective and training; they have no context length,
  so they train on blocks of ``block_size`` (default 64, the GPT's context) and their runs go to
  ``runs/shakespeare-char-ARCH``.
- ``shakespeare-mlm``: a BERT masked LM on Tiny Shakespeare's characters (plus [PAD], [CLS],
  [SEP], [MASK]), BERT's 15% / 80-10-10 masking rule; the metric is masked-token accuracy.

The text is the file ``data`` names, else Tiny Shakespeare from the data folders
(:func:`attnlab.io.find_data_file`); ``tokenizer=bpe`` trains a byte-level BPE of
``bpe_vocab_size`` on the training split instead of the characters.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import torch

from attnlab.config import Config, check_positive, check_probability
from attnlab.data.text import TokenStream, load_text
from attnlab.models.bert import BERTConfig
from attnlab.models.gpt import GPTConfig
from attnlab.models.mamba import PRESETS as MAMBA_PRESETS
from attnlab.models.rnn import PRESETS as RNN_PRESETS
from attnlab.tokenizers import BERT_SPECIALS, BPETokenizer, CharTokenizer, Tokenizer
from attnlab.training.config import TrainConfig
from attnlab.training.distributed import launched_by_torchrun
from attnlab.training.hardware import native_bf16, resolve_device
from attnlab.training.objectives import CausalLMObjective, MaskedLMObjective, Objective
from attnlab.training.recipes.base import RECIPES, Data, Recipe


@dataclass(frozen=True, kw_only=True)
class TextData(Config):
    """The text and its tokenizer (the fields every Shakespeare recipe shares)."""

    data: str | None = None  # a text file; None: Tiny Shakespeare from the data folders
    tokenizer: Literal["char", "bpe"] = "char"
    bpe_vocab_size: int = 512
    val_fraction: float = 0.1  # the last 10% is the validation split (nanoGPT's)

    def validate(self) -> None:
        super().validate()
        check_positive(bpe_vocab_size=self.bpe_vocab_size)
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction}")


@dataclass(frozen=True, kw_only=True)
class TextOptions(TextData):
    """Data and architecture choices of the Shakespeare recipes."""

    arch: Literal["classic", "modern"] = "classic"  # modern: RoPE + SwiGLU + RMSNorm


# The families without attention, at the baby GPT's size: arch -> its preset.
RECURRENT_ARCHS: dict[str, Any] = {
    "mamba": MAMBA_PRESETS["mamba-char-baby"],
    "lstm": RNN_PRESETS["lstm-char-baby"],
    "gru": RNN_PRESETS["gru-char-baby"],
}
RECURRENT_BLOCK_SIZE = 64  # the baby GPT's context


@dataclass(frozen=True, kw_only=True)
class CharLMOptions(TextData):
    """``shakespeare-char``'s options: the data, and the families before and after attention
    as architectures besides the two GPTs (see the module docstring)."""

    arch: Literal["classic", "modern", "mamba", "lstm", "gru"] = "classic"
    block_size: int | None = None  # training length; None: the GPT's max_seq_len, 64 otherwise
    # speedrun: the fastest recipe to a validation loss found on this CPU (SPEEDRUN_MODEL and
    # SPEEDRUN_TRAIN below, issue 51); fields given by name still win over the preset's
    preset: Literal["none", "speedrun"] = "none"

    def validate(self) -> None:
        super().validate()
        check_positive(block_size=self.block_size)
        if self.preset != "none" and self.arch not in ("classic", "modern"):
            raise ValueError(
                f"preset={self.preset!r} is a GPT recipe; it does not combine with "
                f"arch={self.arch!r} (leave arch out)"
            )


def block_size(options: Any, config: Any) -> int:
    """The length of the training blocks: ``options.block_size``, else the model's
    ``max_seq_len`` (a GPT) or :data:`RECURRENT_BLOCK_SIZE` (a model without a context).

    Raises:
        ValueError: for a block longer than a GPT's ``max_seq_len``.
    """
    context = getattr(config, "max_seq_len", None)
    size = getattr(options, "block_size", None)
    if size is None:
        return int(context) if context is not None else RECURRENT_BLOCK_SIZE
    if context is not None and size > context:
        raise ValueError(f"block_size={size} is longer than the model's max_seq_len={context}")
    return int(size)


@dataclass(frozen=True, kw_only=True)
class MLMOptions(TextOptions):
    """:class:`TextOptions` and BERT's selection rate."""

    mask_prob: float = 0.15

    def validate(self) -> None:
        super().validate()
        check_probability(mask_prob=self.mask_prob)


def _text_data(options: TextData, tokenizer: Tokenizer | None, specials: tuple[str, ...]) -> Data:
    text, source = load_text(options.data)
    if not text:
        raise ValueError(f"{source} is empty: a language model needs text to learn from")
    if tokenizer is None and options.tokenizer == "bpe":
        n_train = int(len(text) * (1 - options.val_fraction))
        tokenizer = BPETokenizer.train(
            [text[:n_train]], vocab_size=options.bpe_vocab_size, specials=specials
        )
    elif tokenizer is None:
        tokenizer = CharTokenizer.from_text(text, specials=specials)
    stream = TokenStream(tokenizer.encode(text), val_fraction=options.val_fraction)
    info = {"file": str(source), "characters": len(text), "tokens": len(stream)}
    return Data(stream, tokenizer, info)


def _gpt_config(options: Any, data: Data | None) -> GPTConfig:
    vocab = data.tokenizer.vocab_size if data is not None and data.tokenizer else 65
    base = GPTConfig(
        vocab_size=vocab, d_model=128, n_heads=4, n_layers=4, d_ff=512, max_seq_len=64,
        dropout=0.0, bias=False, activation="gelu", eos_id=None,
    )  # fmt: skip
    if options.arch == "modern":  # same parameter count: 3·E·346 ≈ 2·E·512 + the position table
        base = dataclasses.replace(
            base, pos_encoding="rope", activation="swiglu", norm="rmsnorm", d_ff=346
        )
    return base


def arch_config(arch: str, vocab_size: int) -> Any:
    """The model config of ``shakespeare-char``'s architecture ``arch`` (``classic``,
    ``modern``, ``mamba``, ``lstm``, ``gru``) with ``vocab_size`` tokens (the GPTs' context: 64).

    Raises:
        ValueError: for an unknown ``arch``.
    """
    recurrent = RECURRENT_ARCHS.get(arch)
    if recurrent is not None:
        return dataclasses.replace(recurrent, vocab_size=vocab_size)
    options = CharLMOptions(arch=arch)  # type: ignore[arg-type]  # checks the name
    return dataclasses.replace(_gpt_config(options, None), vocab_size=vocab_size)


# -- the speedrun preset (issue 51): chosen on the validation split of the training text only,
# measured by benchmarks/time_to_loss.py (docs/time_to_loss.md has the runs and the ablations).
SPEEDRUN_MODEL: dict[str, Any] = {
    "pos_encoding": "rope", "norm": "rmsnorm", "activation": "relu2", "d_ff": 512,
    "qk_norm": True, "logit_softcap": 30.0, "zero_init_proj": True, "tie_output": False,
    "max_seq_len": 128,
}  # fmt: skip
SPEEDRUN_TRAIN: dict[str, Any] = {
    "optimizer": "muon", "muon_lr": 0.02, "lr": 3e-3, "betas": (0.9, 0.95),
    "weight_decay": 0.0, "schedule": "wsd", "warmup": 50, "decay_fraction": 0.3,
    "min_lr_ratio": 0.0, "clip_grad_norm": None,
}  # fmt: skip
# where the device multiplies bfloat16 in hardware (a CPU with AVX512-BF16 or AMX, a CUDA GPU:
# attnlab.training.hardware.native_bf16), the preset also trains in bf16-mixed and runs Muon's
# Newton-Schulz iteration in bfloat16: 1.7x the steps per second on the AVX512-BF16 host of
# docs/time_to_loss.md; elsewhere bfloat16 is emulated, slower than float32, and it stays fp32
SPEEDRUN_BF16: dict[str, Any] = {"precision": "bf16-mixed", "muon_ns_dtype": "bfloat16"}
# technique -> the fields that take it out of the preset (benchmarks/time_to_loss.py --ablate)
SPEEDRUN_ABLATIONS: dict[str, dict[str, Any]] = {
    "bf16": {"precision": "fp32", "muon_ns_dtype": "float32"},
    "muon": {"optimizer": "adamw", "lr": 1e-3},
    "wsd": {"schedule": "cosine", "min_lr_ratio": 0.1},
    "context-128": {"max_seq_len": 64},
    "qk-norm": {"qk_norm": False},
    "relu2": {"activation": "gelu"},
    "softcap": {"logit_softcap": None},
    "zero-init": {"zero_init_proj": False},
    "untied-head": {"tie_output": True},
    "rope": {"pos_encoding": "learned"},
}


def _char_lm_config(options: Any, data: Data | None) -> Any:
    vocab = data.tokenizer.vocab_size if data is not None and data.tokenizer else 65
    config = arch_config(options.arch, vocab)
    if options.preset == "speedrun":
        config = dataclasses.replace(config, **SPEEDRUN_MODEL)
    return config


def speedrun_train_fields(device: str | None = None) -> dict[str, Any]:
    """The preset's training fields on ``device`` (a :class:`TrainConfig` ``device``):
    :data:`SPEEDRUN_TRAIN`, and :data:`SPEEDRUN_BF16` where the device multiplies bfloat16 in
    hardware.

    The device is the one the trainer will use: under torchrun each process's own
    (``cuda:LOCAL_RANK`` where CUDA is available, else the CPU, as
    :func:`~attnlab.training.distributed.init_distributed` chooses); otherwise ``"auto"`` and
    ``None`` as :func:`~attnlab.training.hardware.resolve_device` reads them (``None``: the CPU
    a recipe builds its model on), and a name as given.
    """
    if launched_by_torchrun():
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device in (None, "auto"):
        device = str(resolve_device(device))
    return {**SPEEDRUN_TRAIN, **(SPEEDRUN_BF16 if native_bf16(device) else {})}


def _char_lm_adjust(options: Any, train: TrainConfig, config: Any, given: set[str]) -> TrainConfig:
    """The preset's training fields, except those given by name; a warmup that fits."""
    if options.preset != "speedrun":
        return train
    preset = speedrun_train_fields(train.device)
    if "precision" in given:  # a precision given by name: no bfloat16 from the preset at all
        preset = {k: v for k, v in preset.items() if k not in SPEEDRUN_BF16}
    fields = {k: v for k, v in preset.items() if k not in given}
    if "warmup" in fields and train.steps is not None:
        decay = max(1, round(fields.get("decay_fraction", train.decay_fraction) * train.steps))
        fields["warmup"] = min(fields["warmup"], max(0, train.steps - decay) // 2)
    return dataclasses.replace(train, **fields)


def _bert_config(options: Any, data: Data | None) -> BERTConfig:
    vocab = data.tokenizer.vocab_size if data is not None and data.tokenizer else 69
    base = BERTConfig(
        vocab_size=vocab, d_model=128, n_heads=4, n_layers=4, d_ff=512, max_seq_len=64,
        dropout=0.0, pooler=False, pad_id=0, cls_id=1, sep_id=2, mask_id=3, norm_eps=1e-5,
    )  # fmt: skip
    if options.arch == "modern":
        base = dataclasses.replace(
            base, pos_encoding="rope", activation="swiglu", norm="rmsnorm", d_ff=346,
            norm_position="pre",
        )  # fmt: skip
    return base


def _lm_objective(options: Any, config: Any, data: Data, train: TrainConfig) -> Objective:
    return CausalLMObjective(data.value, block_size=block_size(options, config))


def _mlm_objective(options: Any, config: Any, data: Data, train: TrainConfig) -> Objective:
    return MaskedLMObjective(
        data.value, config.max_seq_len, vocab_size=config.vocab_size, mask_id=config.mask_id,
        special_ids=config.special_ids, mask_prob=options.mask_prob,
        ignore_index=config.ignore_index,
    )  # fmt: skip


LM_TRAIN = TrainConfig(
    steps=2000, batch_size=12, optimizer="adamw", lr=1e-3, betas=(0.9, 0.99), adam_eps=1e-8,
    weight_decay=0.1, schedule="cosine", warmup=100, min_lr_ratio=0.1, label_smoothing=0.0,
    clip_grad_norm=1.0, eval_every=250, eval_batches=20, checkpoint_every=500,
)  # fmt: skip

SHAKESPEARE_CHAR = Recipe(
    "shakespeare-char",
    "character-level GPT on Tiny Shakespeare (nanoGPT's baby-GPT CPU setting); "
    "--arch mamba, lstm or gru for the families before and after attention",
    CharLMOptions(), LM_TRAIN, _char_lm_config, lambda o, t, _: _text_data(o, t, ()),
    _lm_objective,
    adjust=_char_lm_adjust,
    run_name=lambda o: "shakespeare-char"
    + (f"-{o.arch}" if o.arch in RECURRENT_ARCHS else "")
    + (f"-{o.preset}" if o.preset != "none" else ""),
    derived=("vocab_size", "cell"),  # the arch says which cell
    variants=(CharLMOptions(arch="mamba"), CharLMOptions(arch="lstm")),  # gru: lstm's fields
    memory_seq_len=block_size,
)  # fmt: skip
SHAKESPEARE_MLM = Recipe(
    "shakespeare-mlm",
    "BERT masked LM on Tiny Shakespeare characters (15% masked, 80/10/10)",
    MLMOptions(), dataclasses.replace(LM_TRAIN, batch_size=32), _bert_config,
    lambda o, t, _: _text_data(o, t, BERT_SPECIALS), _mlm_objective,
)  # fmt: skip
for _recipe in (SHAKESPEARE_CHAR, SHAKESPEARE_MLM):
    RECIPES.add(_recipe.name, _recipe)

__all__ = [
    "LM_TRAIN",
    "RECURRENT_ARCHS",
    "RECURRENT_BLOCK_SIZE",
    "SPEEDRUN_ABLATIONS",
    "SPEEDRUN_BF16",
    "SPEEDRUN_MODEL",
    "SPEEDRUN_TRAIN",
    "CharLMOptions",
    "MLMOptions",
    "TextData",
    "TextOptions",
    "arch_config",
    "block_size",
    "speedrun_train_fields",
]
