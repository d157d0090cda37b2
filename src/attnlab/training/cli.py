"""``attnlab train <recipe>``, ``attnlab sample`` and ``attnlab evaluate``.

    attnlab train shakespeare-char [--steps=2000 --lr=1e-3 --d_model=128 ... --name NAME]
    attnlab train shakespeare-mlm  [--key=value ...] [--resume]
    attnlab train digits --model=cnn
    attnlab sample runs/shakespeare-char --prompt "ROMEO:" --max-new-tokens 300
    attnlab evaluate runs/digits

Any field of the recipe's options, :class:`~attnlab.training.TrainConfig` or model config is
set with ``--key=value`` or ``--key value`` (dashes or underscores; ``--section.key`` when a name
is in two sections; booleans also as bare ``--key`` / ``--no-key``); unknown keys exit with
status 2 and the list of valid ones. A run writes ``runs/<name>/`` (metrics.jsonl, checkpoints,
tokenizer); ``--resume`` continues it from its newest checkpoint. A run whose estimated memory
(:mod:`attnlab.analysis.memory_check`) exceeds the available RAM exits with status 2 before the
model is built, unless ``--ignore-memory-check`` is given.

The same command runs data-parallel under torchrun (docs/scaling_out.md)::

    torchrun --nproc_per_node=4 -m attnlab train shakespeare-char --batch_size=48 [--fsdp]

Every process runs it; the batch size stays the global one, only rank 0 prints, logs and
writes checkpoints, and a checkpoint resumes with any number of processes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch.distributed.elastic.multiprocessing.errors import record

from attnlab.analysis.memory_check import IGNORE_FLAG, check_training_fits
from attnlab.training.config import TrainConfig
from attnlab.training.distributed import (
    _env_int,
    init_distributed,
    launched_by_torchrun,
    shutdown_distributed,
)
from attnlab.training.recipes import RECIPES, RUN_CONFIG_NAME, field_types, load_run, prepare
from attnlab.training.recipes import save_run_files as _save_run_files
from attnlab.training.trainer import Trainer

_NONE = ("none", "null")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _error(args: argparse.Namespace, message: str) -> NoReturn:
    """Exit with status 2 and ``message`` through the sub-command's parser."""
    parser: argparse.ArgumentParser = args.parser
    parser.error(message)


def coerce(text: str, annotation: str) -> Any:
    """Parse ``text`` as a value of the dataclass field annotation ``annotation``.

    Raises:
        ValueError: when ``text`` is not such a value.
    """
    parts = [p.strip() for p in annotation.split("|")]
    if text.lower() in _NONE and "None" in parts:
        return None
    base = parts[0]
    if base == "bool":
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        raise ValueError(f"expected a boolean, got {text!r}")
    if base.startswith("tuple["):
        element = base[len("tuple[") :].split(",")[0].strip()
        return tuple(coerce(t, element) for t in text.replace(",", " ").split())
    try:
        if base == "int":
            return int(text)
        if base == "float":
            return float(text)
    except ValueError:
        raise ValueError(f"expected {base}, got {text!r}") from None
    return text


def parse_overrides(tokens: list[str], types: dict[str, str]) -> dict[str, Any]:
    """``["--steps=5", "--lr", "1e-3", "--tensorboard"]`` -> ``{"steps": 5, "lr": 0.001, ...}``.

    Raises:
        ValueError: for a token that is not an option, an unknown key, or a bad value.
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--") or token == "--":
            raise ValueError(f"expected --key=value, got {token!r}")
        key, eq, value = token[2:].partition("=")
        key = key.replace("-", "_")
        name = key.rpartition(".")[2]
        negated = not eq and name.startswith("no_") and name[3:] in types
        if negated:
            key, name = key[: len(key) - len(name)] + name[3:], name[3:]
        if name not in types:
            raise ValueError(f"unknown key '--{key}'; valid keys: {', '.join(sorted(types))}")
        if not eq:
            is_bool = types[name].split("|")[0].strip() == "bool"
            if is_bool and (i + 1 == len(tokens) or tokens[i + 1].startswith("--")):
                value = "false" if negated else "true"
            elif i + 1 < len(tokens):
                i += 1
                value = tokens[i]
            else:
                raise ValueError(f"{token} needs a value")
        try:
            out[key] = coerce(value, types[name])
        except ValueError as e:
            raise ValueError(f"--{key}: {e}") from None
        i += 1
    return out


def add_recipe_parsers(tasks: Any) -> None:
    """Add one ``train <recipe>`` parser per recipe (they accept ``--key=value`` overrides)."""
    for name, recipe in RECIPES.items():
        p = tasks.add_parser(
            name,
            help=recipe.description.replace("%", "%%"),
            allow_abbrev=False,
            description=(
                f"{recipe.description}. Any recipe-option, TrainConfig or model-config field can "
                "be set with --key=value (e.g. --steps=500 --lr=3e-4 --d_model=64); unknown keys "
                "are rejected with the list of valid ones."
            ),
        )
        p.add_argument("--name", help=f"run name (default {name}); files go to RUNS_DIR/NAME")
        p.add_argument("--runs-dir", default="runs", help="where run directories go")
        p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
        p.add_argument(
            IGNORE_FLAG, action="store_true", help="train even if the memory estimate exceeds RAM"
        )
        p.set_defaults(func=run_recipe, parser=p, recipe=name, accepts_overrides=True)


def run_recipe(args: argparse.Namespace) -> int:
    """Train ``args.recipe`` with ``args.overrides`` (the extra ``--key=value`` tokens); under
    torchrun every process runs this, joined through :func:`init_distributed`."""
    if launched_by_torchrun():  # a failing process's error goes into torchrun's report
        return int(record(_run_recipe)(args) or 0)
    return _run_recipe(args)


def _run_recipe(args: argparse.Namespace) -> int:
    start = time.monotonic()
    try:
        overrides = parse_overrides(list(args.overrides), field_types(args.recipe))
        fits = None if args.ignore_memory_check else _check_memory
        prepared = prepare(args.recipe, overrides, check=fits)
    except (ValueError, FileNotFoundError) as e:
        _error(args, str(e))
    run_name = args.name or (
        f"{args.recipe}-{prepared.options.model}" if args.recipe == "digits" else args.recipe
    )
    run_dir = Path(args.runs_dir) / run_name
    if args.resume:
        _check_same_run(args.parser, run_dir, prepared.train.to_dict())
    ctx = init_distributed()  # a single process unless launched by torchrun
    main = ctx.is_main  # only rank 0 prints and writes files
    if main:
        _save_run_files(prepared, run_dir)
        n_params = sum(p.numel() for p in prepared.model.parameters())
        where = f" on {ctx.world_size} processes ({ctx.backend})" if ctx.enabled else ""
        print(
            f"{args.recipe}: {type(prepared.model).__name__} with {n_params:,} parameters"
            f"{where} -> {run_dir}"
        )
    try:
        trainer = Trainer(
            prepared.model, prepared.objective, prepared.train, run_dir=run_dir,
            d_model=getattr(prepared.model_config, "d_model", None),
            extra_config=prepared.run_config(), distributed=ctx,
        )  # fmt: skip
    except ValueError as e:  # e.g. a batch size the world size does not divide
        _error(args, str(e))
    # On an error the process group is left alone: the launcher stops the other processes
    # (tearing it down here could wait for them forever).
    result = trainer.fit(resume=args.resume)
    last = result.evals[-1] if result.evals else trainer.evaluate()
    shutdown_distributed(ctx)
    if main:
        stopped = " (stopped early)" if result.stopped_early else ""
        print(
            f"trained to step {result.step} in {result.seconds:.1f} s{stopped}; val loss "
            f"{last['val_loss']:.4f}, val accuracy {last['val_accuracy']:.2%}"
        )
        print(f"checkpoint: {result.checkpoint} ({time.monotonic() - start:.1f} s total)")
    return 0


def _check_memory(model_config: Any, train: TrainConfig) -> None:
    """Refuse a run whose estimate exceeds the available memory: under torchrun each process
    computes its slice of every micro-batch, so the activations are those of
    ``train.per_rank_batch_size(world_size)`` sequences (raises ``ValueError`` when the world
    size does not divide the batch)."""
    world_size = _env_int("WORLD_SIZE", 1) if launched_by_torchrun() else 1
    check_training_fits(model_config, train.per_rank_batch_size(world_size))


# settings a resumed run may change (checkpoints load into any world size, DDP or FSDP)
_VOLATILE = ("progress", "tensorboard", "max_minutes", "steps", "fsdp")


def _check_same_run(parser: argparse.ArgumentParser, run_dir: Path, train: dict[str, Any]) -> None:
    file = run_dir / RUN_CONFIG_NAME
    if not file.is_file():
        return
    try:
        saved = json.loads(file.read_text(encoding="utf-8"))["train"]
    except (json.JSONDecodeError, KeyError, TypeError):  # torn by a kill while it was written
        print(f"warning: {file} is unreadable; not compared, rewritten", file=sys.stderr)
        return
    changed = sorted(k for k in train if k not in _VOLATILE and saved.get(k) != train[k])
    if changed:
        parser.error(f"--resume with other settings than the run's ({', '.join(changed)})")


def add_sample_subparser(commands: Any) -> None:
    p = commands.add_parser("sample", help="sample text from a trained language-model run")
    p.add_argument("run", help="run directory (runs/NAME) or one of its checkpoints")
    p.add_argument("--prompt", default="\n", help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run_sample, parser=p)


def run_sample(args: argparse.Namespace) -> int:
    from attnlab.generation import generate

    try:
        run = load_run(args.run)
    except (ValueError, FileNotFoundError) as e:
        _error(args, str(e))
    tokenizer = run.tokenizer
    if tokenizer is None or not hasattr(run.model, "new_cache"):
        _error(args, f"{args.run} is not a language-model run (recipe {run.recipe})")
    try:
        prompt = tokenizer.encode(args.prompt)
    except ValueError as e:
        _error(args, str(e))
    out = generate(
        run.model, torch.tensor([prompt]), max_new_tokens=args.max_new_tokens, do_sample=True,
        temperature=args.temperature, top_k=args.top_k, eos_id=(),
        generator=torch.Generator().manual_seed(args.seed),
    )  # fmt: skip
    print(args.prompt + tokenizer.decode(out[0].tolist()))
    return 0


def add_evaluate_subparser(commands: Any) -> None:
    p = commands.add_parser("evaluate", help="evaluate a trained run on its validation split")
    p.add_argument("run", help="run directory (runs/NAME)")
    p.add_argument("--batches", type=int, default=None, help="validation batches (default: run's)")
    p.set_defaults(func=run_evaluate, parser=p)


def run_evaluate(args: argparse.Namespace) -> int:
    from attnlab.training.objectives import classification_accuracy

    try:
        run = load_run(args.run)
    except (ValueError, FileNotFoundError) as e:
        _error(args, str(e))
    metrics = Trainer(run.model, run.objective, run.train).evaluate(args.batches)
    print(f"{run.recipe} ({run.extra['checkpoint']}):")
    print(f"val loss {metrics['val_loss']:.4f}, val accuracy {metrics['val_accuracy']:.2%}")
    if run.recipe == "digits":
        for split in ("val", "test"):
            accuracy = classification_accuracy(run.model, run.data, split)
            print(f"{split} accuracy (whole split): {accuracy:.2%}")
    if run.recipe == "shakespeare-mlm":
        print(mlm_fill_sample(run))
    return 0


def mlm_fill_sample(run: Any, *, seed: int = 0) -> str:
    """One masked validation block, shown with ``_`` at the masks, the model's fill-in and the
    original text."""
    inputs, targets = run.objective.batch("val", 1, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        predicted = run.model(inputs).logits.argmax(-1)  # (1, T)
    selected = targets[0] != -100
    tok = run.tokenizer
    if tok is None:
        raise ValueError(f"recipe {run.recipe!r} has no tokenizer; masked samples need text")
    shown = "".join(
        "_" if s else tok.decode([int(i)]) for i, s in zip(inputs[0], selected, strict=True)
    )
    filled = torch.where(selected, predicted[0], inputs[0])
    original = torch.where(selected, targets[0], inputs[0])
    right = int((predicted[0] == targets[0])[selected].sum())
    return (
        f"masked : {shown!r}\nfilled : {tok.decode(filled.tolist())!r}\n"
        f"truth  : {tok.decode(original.tolist())!r}\n({right}/{int(selected.sum())} masks right)"
    )


__all__ = [
    "add_evaluate_subparser",
    "add_recipe_parsers",
    "add_sample_subparser",
    "coerce",
    "parse_overrides",
    "run_recipe",
]
