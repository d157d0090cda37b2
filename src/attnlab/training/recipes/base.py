"""What a recipe is, and how one is made concrete (:func:`prepare`) or rebuilt (:func:`load_run`).

A :class:`Recipe` is data + objective + defaults: its own options dataclass (data paths, the
tokenizer, architecture switches: only what this recipe reads), a :class:`TrainConfig` and a
model config. Every field of the three sections can be overridden by name
(``{"steps": 500, "d_model": 64}``, or ``"train.steps"`` where a name is in two sections);
unknown names are rejected with the valid ones, and ``aliases`` keep the older names of a
recipe's options working (``max_steps`` for ``steps``). A run shorter than the recipe's default
warmup (``steps <= warmup``, the warmup not given, a cosine schedule) warms up for a tenth of its
steps instead (:func:`short_run_warmup`).

:func:`prepare` loads the data (and trains or reads the tokenizer), fixes the model config
(the vocabulary is the tokenizer's), runs a check before anything is built (the command line's
memory check), builds the model under ``torch.manual_seed(train.seed)`` and the objective;
:func:`load_run` rebuilds all of it from a run directory's ``run.json`` and loads the newest
checkpoint's weights.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.config import config_from_dict, config_to_dict
from attnlab.models import build_model, config_from_json_dict
from attnlab.pretrained import load_weights
from attnlab.registry import Registry
from attnlab.tokenizers import Tokenizer, load_tokenizer
from attnlab.training.config import TrainConfig
from attnlab.training.hardware import prepare_for_precision
from attnlab.training.objectives import Objective
from attnlab.training.rundir import TOKENIZER_NAME, RunDir, latest_checkpoint
from attnlab.training.state import read_training_state
from attnlab.training.trainer import Callback

# an older name: the new one, or (value -> {name: value, ...}, the value's type annotation)
Alias = str | tuple[Callable[[Any], dict[str, Any]], Any]


@dataclass
class Data:
    """A recipe's loaded data: whatever its objective needs, its tokenizer, and facts for
    ``run.json`` (``info``) and for exported models (``export``)."""

    value: Any
    tokenizer: Tokenizer | None = None
    info: dict[str, Any] = field(default_factory=dict)
    export: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Recipe:
    """A task attnlab trains: data + objective (+ callbacks) + defaults.

    Attributes:
        name, description: for the command line.
        options: the recipe's own options (a :class:`~attnlab.config.Config`), defaults.
        train: the default :class:`TrainConfig`.
        model_config: ``(options, data) -> model config`` (the default; data may be ``None``
            when only the fields are needed).
        data: ``(options, tokenizer or None, train) -> Data`` (a saved tokenizer when rebuilding).
        objective: ``(options, model config, data, train) -> Objective``.
        callbacks: ``(options, model config, data) -> callbacks`` (extra evaluation).
        adjust: ``(options, train, model config, keys given) -> train`` after the overrides
            (derived rates).
        run_name: ``options -> default run name`` (under ``runs/``).
        aliases: older option names -> a field name, or a function of the value.
        derived: model fields the recipe sets itself (not overridable; the vocabulary of a
            tokenizer, a task's sequence length).
        memory_batch: ``(options, train) -> sequences`` of the largest micro-batch, for the
            memory check (default ``train.batch_size``; translation sizes batches in tokens).
        memory_seq_len: ``(options, model config) -> tokens`` per sequence for the memory
            check, or ``None`` for the model's context (a model without one needs it).
        model_transform: ``(options, model) -> model``, applied to the built model (before a
            checkpoint's weights are loaded): transforms from outside such as a memory layout
            or float32 attention under autocast.
        variants: other options (e.g. each ``model`` choice) whose model configs take flags
            too; the command line accepts the union of their keys, :func:`prepare` checks them
            against the model actually built.
    """

    name: str
    description: str
    options: Any
    train: TrainConfig
    model_config: Callable[[Any, Data | None], Any]
    data: Callable[[Any, Tokenizer | None, TrainConfig], Data]
    objective: Callable[[Any, Any, Data, TrainConfig], Objective]
    callbacks: Callable[[Any, Any, Data], list[Callback]] = lambda o, m, d: []
    adjust: Callable[[Any, TrainConfig, Any, set[str]], TrainConfig] = lambda o, t, m, k: t
    run_name: Callable[[Any], str] | None = None
    aliases: Mapping[str, Alias] = field(default_factory=dict)
    derived: tuple[str, ...] = ("vocab_size",)
    memory_batch: Callable[[Any, TrainConfig], int] = lambda o, t: t.batch_size
    memory_seq_len: Callable[[Any, Any], int | None] = lambda o, m: None
    model_transform: Callable[[Any, nn.Module], nn.Module] = lambda o, m: m
    variants: tuple[Any, ...] = ()

    def default_run_name(self, options: Any) -> str:
        return self.run_name(options) if self.run_name is not None else self.name

    def sections(self, options: Any | None = None) -> dict[str, Any]:
        """``{"options", "train", "model"}``: the three overridable dataclass instances."""
        opts = options if options is not None else self.options
        return {"options": opts, "train": self.train, "model": self.model_config(opts, None)}

    def keys(self, options: Any | None = None) -> dict[str, set[str]]:
        """The overridable field names of each section (the model's derived ones left out)."""
        out = {name: _field_names(obj) for name, obj in self.sections(options).items()}
        out["model"] -= set(self.derived)
        return out


RECIPES: Registry[Recipe] = Registry("recipe")


def get_recipe(name: str) -> Recipe:
    """The recipe ``name``.

    Raises:
        ValueError: for an unknown name, listing the valid ones.
    """
    return RECIPES.get(name)


@dataclass
class Prepared:
    """A recipe made concrete: the model, what it learns, and what to record."""

    recipe: Recipe
    model: nn.Module
    objective: Objective
    train: TrainConfig
    options: Any
    model_config: Any
    data: Data
    callbacks: list[Callback] = field(default_factory=list)
    checkpoint: Path | None = None

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self.data.tokenizer

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in {id(p): p for p in self.model.parameters()}.values())

    def record(self) -> dict[str, Any]:
        """What ``run.json`` holds about the run (the sessions are added by the run dir)."""
        return {
            "recipe": self.recipe.name,
            "options": config_to_dict(self.options),
            "model": config_to_dict(self.model_config),
            "train": self.train.to_dict(),
            "n_params": self.n_params,
            "data": self.data.info,
            "export": self.data.export,
        }


def _field_names(obj: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(obj)}


_ITEM = re.compile(r"(?P<name>\w+)\[(?P<index>\d+)\]")


def expand_aliases(recipe: Recipe, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``overrides`` with the recipe's older names turned into field names; an alias may set
    one item of a tuple field (``"betas[1]"``), merged into the recipe's default tuple."""
    out: dict[str, Any] = {}
    items: dict[str, dict[int, Any]] = {}
    for key, value in overrides.items():
        alias = recipe.aliases.get(key)
        expanded = {key: value} if alias is None else (
            {alias: value} if isinstance(alias, str) else alias[0](value)
        )  # fmt: skip
        for name, v in expanded.items():
            m = _ITEM.fullmatch(name)
            if m is None:
                out[name] = v
            else:
                items.setdefault(m["name"], {})[int(m["index"])] = v
    for name, parts in items.items():
        default = out.get(name)
        if default is None:
            owner = next((obj for obj in recipe.sections().values() if hasattr(obj, name)), None)
            default = getattr(owner, name, ())
        values = list(default or ())
        for i, v in parts.items():
            if i >= len(values):
                raise ValueError(f"{name} has {len(values)} items, not an item {i}")
            values[i] = v
        out[name] = tuple(values)
    return out


def route_overrides(
    overrides: Mapping[str, Any], sections: Mapping[str, set[str]]
) -> dict[str, dict[str, Any]]:
    """Send each ``key`` (or ``"section.key"``) to the one section having that field.

    Raises:
        ValueError: for an unknown key (listing the valid ones) or an ambiguous one.
    """
    routed: dict[str, dict[str, Any]] = {name: {} for name in sections}
    for key, value in overrides.items():
        section, _, name = key.rpartition(".")
        owners = [s for s, names in sections.items() if name in names]
        if section:
            owners = [s for s in owners if s == section]
        if not owners:
            valid = sorted({n for names in sections.values() for n in names})
            raise ValueError(f"unknown key {key!r}; valid keys: {', '.join(valid)}")
        if len(owners) > 1:
            raise ValueError(f"{key!r} is ambiguous: prefix it with one of {owners} and a dot")
        routed[owners[0]][name] = value
    return routed


def stored_aliases(recipe: Recipe, saved: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"options": {...}, "train": {...}}``: what the older option names stored in a run
    record (``run.json``'s ``options``) mean now, e.g. cifar10's ``precision`` (now the
    trainer's); names that are still fields of the options are left to them."""
    fields = _field_names(recipe.options)
    old = {k: v for k, v in saved.get("options", {}).items()
           if k in recipe.aliases and k not in fields}  # fmt: skip
    out: dict[str, dict[str, Any]] = {"options": {}, "train": {}}
    for key, value in expand_aliases(recipe, old).items():
        section, _, name = key.rpartition(".")
        out["train" if section == "train" or name not in fields else "options"][name] = value
    return out


def _build(model_config: Any, *, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(model_config)


def prepare(
    recipe: str | Recipe,
    overrides: Mapping[str, Any] | None = None,
    *,
    check: Callable[[Any, TrainConfig, int, int | None], None] | None = None,
    tokenizer: Tokenizer | None = None,
) -> Prepared:
    """Build the data, model and train config of ``recipe`` with ``overrides`` applied.

    The model is initialised under ``torch.manual_seed(train.seed)``. ``check(model_config,
    train, batch, seq_len)`` (the command line's memory check, ``batch`` the sequences of the
    largest micro-batch, ``seq_len`` their tokens or ``None`` for the model's context) runs before
    any data is read (on the model config the options imply) and again before the model is built
    (with the data's vocabulary); what it raises propagates.
    ``tokenizer``: use this one instead of making one (a resumed run's own).

    Raises:
        ValueError / TypeError: for an unknown recipe or key, or an invalid value.
        FileNotFoundError: for data that cannot be found.
    """
    r = recipe if isinstance(recipe, Recipe) else get_recipe(recipe)
    options, train, routed = _settings(r, overrides)
    if check is not None:  # before the data: a config that cannot fit stops here
        provisional = dataclasses.replace(r.model_config(options, None), **routed["model"])
        batch = r.memory_batch(options, train)
        check(provisional, train, batch, r.memory_seq_len(options, provisional))
    data = r.data(options, tokenizer, train)
    model_config = _model_config(r, options, data, routed["model"])
    train = r.adjust(options, train, model_config, set(routed["train"]))
    if check is not None:
        batch = r.memory_batch(options, train)
        check(model_config, train, batch, r.memory_seq_len(options, model_config))
    model = r.model_transform(options, _build(model_config, seed=train.seed))
    objective = r.objective(options, model_config, data, train)
    return Prepared(r, model, objective, train, options, model_config, data,
                    r.callbacks(options, model_config, data))  # fmt: skip


def _settings(
    r: Recipe, overrides: Mapping[str, Any] | None
) -> tuple[Any, TrainConfig, dict[str, dict[str, Any]]]:
    """The recipe's options and train config with ``overrides`` applied, and the overrides
    routed to their sections (validated: every config checks its fields when made)."""
    overrides = expand_aliases(r, dict(overrides or {}))
    # options first: they decide which model config the other keys are checked against
    keys = r.keys()
    only_options = keys["options"] - keys["train"]
    early = {k.rpartition(".")[2]: v for k, v in overrides.items()
             if k.rpartition(".")[2] in only_options and k.rpartition(".")[0] in ("", "options")
             and k.rpartition(".")[2] not in r.keys(r.options)["model"]}  # fmt: skip
    options = dataclasses.replace(r.options, **early)
    routed = route_overrides(overrides, r.keys(options))
    options = dataclasses.replace(options, **routed["options"])
    train = dataclasses.replace(r.train, **short_run_warmup(r.train, routed["train"]))
    return options, train, routed


SHORT_RUN_WARMUP = 10  # a run shorter than its recipe's warmup warms up for steps // this


def short_run_warmup(default: TrainConfig, given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` (train fields set by name), with a warmup that fits a short run.

    A recipe's default warmup (100 steps for most) is sized for its default budget; a quick
    ``--steps 5`` would be refused by the cosine schedule (``warmup < steps``) or never leave
    its warmup. So when ``warmup`` is not given, the schedule is ``cosine`` and ``steps`` is at
    most the default warmup, the warmup becomes ``steps // 10`` (0 below 10 steps). A run whose
    steps exceed the default warmup keeps it unchanged, and a warmup given is always kept (an
    explicit ``warmup >= steps`` is refused, naming both).
    """
    merged = {f: given.get(f, getattr(default, f)) for f in ("steps", "schedule", "warmup")}
    steps = merged["steps"]
    if "warmup" in given or merged["schedule"] != "cosine" or not isinstance(steps, int):
        return dict(given)
    if steps < 1 or merged["warmup"] < steps:  # (a bad steps is refused by the config)
        return dict(given)
    return {**given, "warmup": steps // SHORT_RUN_WARMUP}


def check_settings(recipe: str | Recipe, overrides: Mapping[str, Any] | None = None) -> None:
    """Validate ``overrides`` for ``recipe`` without reading data or touching a file: the
    options, the train config and the model config they imply (before the data sets the
    vocabulary). A command checks its flags with this before it looks at the file system.

    Raises:
        ValueError / TypeError: for an unknown key or an invalid value, as :func:`prepare`.
    """
    r = recipe if isinstance(recipe, Recipe) else get_recipe(recipe)
    options, _, routed = _settings(r, overrides)
    dataclasses.replace(r.model_config(options, None), **routed["model"])


def _model_config(r: Recipe, options: Any, data: Data, fields: dict[str, Any]) -> Any:
    """The default model config with ``fields`` replaced (the derived fields stay the
    recipe's: the default model config computes them from the options and the data)."""
    return dataclasses.replace(r.model_config(options, data), **fields)


def save_run_files(prepared: Prepared, run_dir: str | os.PathLike[str]) -> None:
    """Write the tokenizer (if any) into ``run_dir``."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    if prepared.tokenizer is not None:
        prepared.tokenizer.save(Path(run_dir) / TOKENIZER_NAME)


def load_run(run_dir: str | os.PathLike[str], *, weights: bool = True) -> Prepared:
    """Rebuild a run from its directory: data, objective, and the newest checkpoint's weights.

    Args:
        run_dir: the run directory (``run.json``, or attnlab 0.1's ``train_config.json``).
        weights: load the newest checkpoint (``False``: the freshly initialised model).

    Raises:
        FileNotFoundError: without a run record or (with ``weights``) a checkpoint.
        ValueError: for a record that does not parse.
    """
    run = RunDir(run_dir)
    saved = run.read_record()
    r = get_recipe(saved["recipe"])
    option_fields = _field_names(r.options)
    options = config_from_dict(
        type(r.options), {k: v for k, v in saved["options"].items() if k in option_fields}
    )  # attnlab 0.1 wrote every recipe's options into every run; this recipe's are kept
    train_data = {k: v for k, v in saved["train"].items() if k in _field_names(r.train)}
    train_data.update(stored_aliases(r, saved)["train"])
    train = TrainConfig.from_dict(train_data)
    model_config = config_from_json_dict(saved["model"])
    tokenizer_file = run.path / TOKENIZER_NAME
    tokenizer = load_tokenizer(tokenizer_file) if tokenizer_file.is_file() else None
    data = r.data(options, tokenizer, train)
    model = r.model_transform(options, _build(model_config, seed=train.seed))
    prepare_for_precision(model, train.precision)  # evaluated as it trained (on the CPU)
    checkpoint = None
    if weights:
        checkpoint = latest_checkpoint(run.path)
        if checkpoint is None:
            raise FileNotFoundError(f"no checkpoint in {run.path}")
        read_training_state(checkpoint)  # a checkpoint, not any model directory
        load_weights(model, checkpoint)  # checked against its digests (attnlab.integrity)
    objective = r.objective(options, model_config, data, train)
    return Prepared(r, model.eval(), objective, train, options, model_config, data,
                    r.callbacks(options, model_config, data), checkpoint)  # fmt: skip


__all__ = [
    "RECIPES",
    "Data",
    "Prepared",
    "Recipe",
    "check_settings",
    "expand_aliases",
    "get_recipe",
    "load_run",
    "prepare",
    "route_overrides",
    "save_run_files",
    "short_run_warmup",
    "stored_aliases",
]
