"""Training recipes: data + model config + :class:`TrainConfig` defaults that learn real data.

- ``shakespeare-char``: a character-level GPT on Tiny Shakespeare, nanoGPT's "baby GPT" CPU
  setting (4 layers, 4 heads, d_model 128, context 64, batch 12, dropout 0, 2000 iterations,
  AdamW lr 1e-3 with 100 warmup steps and cosine decay to 1e-4). ``arch=modern`` swaps in RoPE,
  SwiGLU (d_ff 346, the same parameter count) and RMSNorm, still pre-norm.
- ``shakespeare-mlm``: a BERT masked LM on the same characters (plus [PAD], [CLS], [SEP],
  [MASK]), BERT's 15% / 80-10-10 masking rule; the metric is masked-token accuracy.
- ``digits``: ViT on scikit-learn's 8x8 digits (2x2 patches): 20% held out as the test split
  (scored once, at the end), 10% of the rest as the validation split that training evaluates and
  hyperparameters are chosen on; ``model=cnn`` trains the
  :class:`~attnlab.training.baselines.CNNClassifier` baseline with the same budget.

Every field of the recipe's :class:`RecipeOptions`, :class:`TrainConfig` and model config can be
overridden by name (:func:`prepare`); unknown names are rejected. A run directory records
everything (``train_config.json``: recipe, options, model config, train config) so
:func:`load_run` can rebuild the run for ``attnlab sample`` / ``attnlab evaluate``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from attnlab.config import (
    check_choice,
    check_positive,
    check_probability,
    config_from_dict,
    config_to_dict,
)
from attnlab.models import build_model, config_from_json_dict
from attnlab.models.bert import BERTConfig
from attnlab.models.gpt import GPTConfig
from attnlab.models.vit import ViTConfig
from attnlab.training.baselines import CNNClassifier, CNNConfig
from attnlab.training.config import TrainConfig
from attnlab.training.data import ArrayImageDataset, TokenStream, load_digits, load_text
from attnlab.training.objectives import (
    CausalLMObjective,
    ClassificationObjective,
    MaskedLMObjective,
    Objective,
)
from attnlab.training.state import latest_checkpoint, load_training_state
from attnlab.training.tokenizers import (
    BERT_SPECIALS,
    BPETokenizer,
    CharTokenizer,
    Tokenizer,
    load_tokenizer,
)

TOKENIZER_NAME = "tokenizer.json"
RUN_CONFIG_NAME = "train_config.json"


@dataclass(frozen=True, kw_only=True)
class RecipeOptions:
    """Data and architecture choices of a recipe (all overridable like the configs)."""

    data: str | None = None  # text file; None: Tiny Shakespeare ($ATTNLAB_DATA or download)
    tokenizer: Literal["char", "bpe"] = "char"
    bpe_vocab_size: int = 512
    val_fraction: float = 0.1
    arch: Literal["classic", "modern"] = "classic"  # modern: RoPE + SwiGLU + RMSNorm
    mask_prob: float = 0.15  # masked LM selection rate
    model: Literal["vit", "cnn"] = "vit"  # digits: ViT or the CNN baseline
    test_fraction: float = 0.2  # digits: held-out test split (reported once, at the end)
    digits_val_fraction: float = 0.1  # digits: of the rest, the validation split (tuning)
    split_seed: int = 1  # digits: seeds the test/val/train split

    def __post_init__(self) -> None:
        check_choice("tokenizer", self.tokenizer, ["char", "bpe"])
        check_choice("arch", self.arch, ["classic", "modern"])
        check_choice("model", self.model, ["vit", "cnn"])
        check_positive(bpe_vocab_size=self.bpe_vocab_size)
        check_probability(mask_prob=self.mask_prob)
        for name, value in (("val_fraction", self.val_fraction),
                            ("test_fraction", self.test_fraction),
                            ("digits_val_fraction", self.digits_val_fraction)):  # fmt: skip
            if not 0.0 < value < 1.0:
                raise ValueError(f"{name} must be in (0, 1), got {value}")


@dataclass
class Prepared:
    """A recipe made concrete: the model, what it learns, and what to record."""

    recipe: str
    model: nn.Module
    objective: Objective
    train: TrainConfig
    options: RecipeOptions
    model_config: Any
    tokenizer: Tokenizer | None = None
    data: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def run_config(self) -> dict[str, Any]:
        """What ``train_config.json`` records besides the train config."""
        return {
            "recipe": self.recipe,
            "options": dataclasses.asdict(self.options),
            "model": config_to_dict(self.model_config),
        }


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    train: TrainConfig
    options: RecipeOptions
    model_config: Callable[[RecipeOptions, Any], Any]  # (options, data) -> default model config
    data: Callable[[RecipeOptions, Tokenizer | None], tuple[Any, Tokenizer | None]]
    objective: Callable[[RecipeOptions, Any, Any, Tokenizer | None], Objective]


# -- text ---------------------------------------------------------------------------------------


def _text_data(
    options: RecipeOptions, tokenizer: Tokenizer | None, specials: tuple[str, ...]
) -> tuple[Any, Tokenizer]:
    text = load_text(options.data)
    if tokenizer is None and options.tokenizer == "bpe":
        n_train = int(len(text) * (1 - options.val_fraction))
        tokenizer = BPETokenizer.train(
            [text[:n_train]], vocab_size=options.bpe_vocab_size, specials=specials
        )
    elif tokenizer is None:
        tokenizer = CharTokenizer.from_text(text, specials=specials)
    stream = TokenStream(tokenizer.encode(text), val_fraction=options.val_fraction)
    return stream, tokenizer


def _gpt_config(options: RecipeOptions, data: Any) -> GPTConfig:
    base = GPTConfig(
        vocab_size=65, d_model=128, n_heads=4, n_layers=4, d_ff=512, max_seq_len=64, dropout=0.0,
        bias=False, activation="gelu", eos_id=None,
    )  # fmt: skip
    if options.arch == "modern":  # same parameter count: 3·E·346 ≈ 2·E·512 + the position table
        base = dataclasses.replace(
            base, pos_encoding="rope", activation="swiglu", norm="rmsnorm", d_ff=346
        )
    return base


def _bert_config(options: RecipeOptions, data: Any) -> BERTConfig:
    base = BERTConfig(
        vocab_size=69, d_model=128, n_heads=4, n_layers=4, d_ff=512, max_seq_len=64, dropout=0.0,
        pooler=False, pad_id=0, cls_id=1, sep_id=2, mask_id=3, norm_eps=1e-5,
    )  # fmt: skip
    if options.arch == "modern":
        base = dataclasses.replace(
            base, pos_encoding="rope", activation="swiglu", norm="rmsnorm", d_ff=346,
            norm_position="pre",
        )  # fmt: skip
    return base


def _lm_objective(
    options: RecipeOptions, config: Any, data: Any, tokenizer: Tokenizer | None
) -> Objective:
    return CausalLMObjective(data, block_size=config.max_seq_len)


def _mlm_objective(
    options: RecipeOptions, config: Any, data: Any, tokenizer: Tokenizer | None
) -> Objective:
    return MaskedLMObjective(
        data, config.max_seq_len, vocab_size=config.vocab_size, mask_id=config.mask_id,
        special_ids=config.special_ids, mask_prob=options.mask_prob,
        ignore_index=config.ignore_index,
    )  # fmt: skip


# -- images -------------------------------------------------------------------------------------


def _digits_data(options: RecipeOptions, tokenizer: Tokenizer | None) -> tuple[Any, None]:
    images, labels = load_digits()
    data = ArrayImageDataset(
        images,
        labels,
        test_fraction=options.test_fraction,
        val_fraction=options.digits_val_fraction,
        seed=options.split_seed,
    )
    return data, None


def _digits_config(options: RecipeOptions, data: Any) -> Any:
    if options.model == "cnn":
        return CNNConfig(in_channels=1, n_classes=10, channels=32, dropout=0.1)
    return ViTConfig(
        image_size=8, patch_size=2, in_channels=1, n_classes=10, d_model=64, n_heads=4,
        n_layers=4, d_ff=128, dropout=0.1, norm_eps=1e-6, pool="mean",
    )  # fmt: skip


def _digits_objective(
    options: RecipeOptions, config: Any, data: Any, tokenizer: Tokenizer | None
) -> Objective:
    return ClassificationObjective(data)


_LM_TRAIN = TrainConfig(
    steps=2000, batch_size=12, optimizer="adamw", lr=1e-3, betas=(0.9, 0.99), adam_eps=1e-8,
    weight_decay=0.1, schedule="cosine", warmup=100, min_lr_ratio=0.1, label_smoothing=0.0,
    clip_grad_norm=1.0, eval_every=250, eval_batches=20, checkpoint_every=500,
)  # fmt: skip

RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "shakespeare-char",
            "character-level GPT on Tiny Shakespeare (nanoGPT's baby-GPT CPU setting)",
            _LM_TRAIN, RecipeOptions(),
            _gpt_config, lambda o, t: _text_data(o, t, ()), _lm_objective,
        ),
        Recipe(
            "shakespeare-mlm",
            "BERT masked LM on Tiny Shakespeare characters (15% masked, 80/10/10)",
            dataclasses.replace(_LM_TRAIN, batch_size=32), RecipeOptions(),
            _bert_config, lambda o, t: _text_data(o, t, BERT_SPECIALS), _mlm_objective,
        ),
        Recipe(
            "digits",
            "ViT (or model=cnn, a CNN baseline) on scikit-learn's 8x8 digits; 20% test, 10% val",
            # lr chosen on the val split from {5e-4, 1e-3, 2e-3} (digits_val_sweep.json)
            TrainConfig(
                steps=3000, batch_size=64, optimizer="adamw", lr=5e-4, betas=(0.9, 0.99),
                adam_eps=1e-8, weight_decay=0.05, schedule="cosine", warmup=100,
                label_smoothing=0.1, clip_grad_norm=1.0, eval_every=250, eval_batches=6,
                checkpoint_every=500,
            ),
            RecipeOptions(),
            _digits_config, _digits_data, _digits_objective,
        ),
    )
}  # fmt: skip


def get_recipe(name: str) -> Recipe:
    """The recipe ``name``.

    Raises:
        ValueError: for an unknown name, listing the valid ones.
    """
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; valid: {', '.join(RECIPES)}")
    return RECIPES[name]


def _split_overrides(
    overrides: dict[str, Any], targets: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """Route each ``key`` (or ``"section.key"``) to the one section having that field."""
    routed: dict[str, dict[str, Any]] = {name: {} for name in targets}
    for key, value in overrides.items():
        section, _, name = key.rpartition(".")
        owners = [s for s, obj in targets.items() if name in _field_names(obj)]
        if section:
            owners = [s for s in owners if s == section]
        if not owners:
            valid = sorted({n for obj in targets.values() for n in _field_names(obj)})
            raise ValueError(f"unknown key {key!r}; valid keys: {', '.join(valid)}")
        if len(owners) > 1:
            raise ValueError(f"{key!r} is ambiguous: prefix it with one of {owners} and a dot")
        routed[owners[0]][name] = value
    return routed


def _field_names(obj: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(obj)}


def field_types(recipe: str, options: RecipeOptions | None = None) -> dict[str, str]:
    """``{field name: annotation}`` over the recipe's options, train config and model config
    (for the CLI's parsing of ``--key=value``)."""
    r = get_recipe(recipe)
    opts = options or r.options
    model_cls = type(r.model_config(opts, None))
    types: dict[str, str] = {}
    for cls in (RecipeOptions, TrainConfig, model_cls):
        for f in dataclasses.fields(cls):
            types.setdefault(f.name, str(f.type))
    return types


def prepare(
    recipe: str,
    overrides: dict[str, Any] | None = None,
    *,
    check: Callable[[Any, TrainConfig], None] | None = None,
) -> Prepared:
    """Build the data, model and train config of ``recipe`` with ``overrides`` applied.

    The model is initialised under ``torch.manual_seed(train.seed)``. ``check(model_config,
    train)`` runs before the model is built (the CLI's memory check); what it raises propagates.

    Raises:
        ValueError: for an unknown recipe or key, or an invalid value.
    """
    r = get_recipe(recipe)
    overrides = dict(overrides or {})
    option_keys = {k: v for k, v in overrides.items() if k.rpartition(".")[2] in ("model", "arch")
                   and k.rpartition(".")[0] in ("", "options")}  # fmt: skip
    options = dataclasses.replace(
        r.options, **{k.rpartition(".")[2]: v for k, v in option_keys.items()}
    )
    default_model = r.model_config(options, None)
    routed = _split_overrides(
        overrides, {"options": options, "train": r.train, "model": default_model}
    )
    options = dataclasses.replace(options, **routed["options"])
    train = dataclasses.replace(r.train, **routed["train"])
    data, tokenizer = r.data(options, None)
    model_fields = dict(routed["model"])
    if tokenizer is not None:  # the vocabulary is the tokenizer's
        model_fields["vocab_size"] = tokenizer.vocab_size
    model_config = dataclasses.replace(default_model, **model_fields)
    if check is not None:
        check(model_config, train)
    model = _build(model_config, seed=train.seed)
    objective = r.objective(options, model_config, data, tokenizer)
    return Prepared(recipe, model, objective, train, options, model_config, tokenizer, data)


def _build(model_config: Any, *, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    if isinstance(model_config, CNNConfig):
        return CNNClassifier(model_config)
    return build_model(model_config)


def save_run_files(prepared: Prepared, run_dir: str | os.PathLike[str]) -> None:
    """Write the tokenizer (if any) into ``run_dir``."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    if prepared.tokenizer is not None:
        prepared.tokenizer.save(Path(run_dir) / TOKENIZER_NAME)


def load_run(run_dir: str | os.PathLike[str]) -> Prepared:
    """Rebuild a run from its directory: data, objective, and the newest checkpoint's weights.

    Raises:
        FileNotFoundError: without ``train_config.json`` or a checkpoint.
        ValueError: for a config that does not parse.
    """
    run_dir = Path(run_dir)
    config_file = run_dir / RUN_CONFIG_NAME
    try:
        saved = json.loads(config_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{config_file} is not valid JSON: {e}") from None
    missing = [k for k in ("recipe", "options", "train", "model") if k not in saved]
    if not isinstance(saved, dict) or missing:
        raise ValueError(
            f"{config_file} is not a run config: missing {missing or 'everything'} "
            "(expected keys recipe, options, train, model)"
        )
    r = get_recipe(saved["recipe"])
    options = config_from_dict(RecipeOptions, saved["options"])
    train = TrainConfig.from_dict(saved["train"])
    model_data = saved["model"]
    if model_data.get("model_type") == CNNConfig.model_type:
        model_config: Any = config_from_dict(CNNConfig, model_data)
    else:
        model_config = config_from_json_dict(model_data)
    tokenizer_file = run_dir / TOKENIZER_NAME
    tokenizer: Tokenizer | None = None
    if tokenizer_file.is_file():
        tokenizer = load_tokenizer(tokenizer_file)
    data, tokenizer = r.data(options, tokenizer)
    model = _build(model_config, seed=train.seed)
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        raise FileNotFoundError(f"no checkpoint in {run_dir}")
    load_training_state(checkpoint, model)
    objective = r.objective(options, model_config, data, tokenizer)
    return Prepared(r.name, model.eval(), objective, train, options, model_config, tokenizer,
                    data, {"checkpoint": str(checkpoint)})  # fmt: skip


__all__ = [
    "RECIPES",
    "Prepared",
    "Recipe",
    "RecipeOptions",
    "field_types",
    "get_recipe",
    "load_run",
    "prepare",
    "save_run_files",
]
