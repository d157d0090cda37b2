"""``attnlab train RECIPE``: every recipe, one command.

    attnlab train reverse [--steps 1500 --d-model 64 ...]
    attnlab train shakespeare-char [--steps=2000 --lr=1e-3 --arch=modern ...] [--resume]
    attnlab train shakespeare-char --arch mamba        # or lstm, gru: runs/shakespeare-char-ARCH
    attnlab train digits --model=cnn
    attnlab train translate --src de --tgt en --data DIR --out runs/de-en --max-minutes 90

Any field of the recipe's options, :class:`~attnlab.training.TrainConfig` or model config is a
flag (``attnlab train RECIPE --help`` lists them with their types and defaults; parsing:
:mod:`attnlab.cli.overrides`). A run writes its directory (``--out DIR``, default
``RUNS_DIR/NAME``): run.json, metrics.jsonl, checkpoints, the tokenizer, exports
(:mod:`attnlab.training.rundir`). ``--resume`` continues a run from its newest checkpoint that
loads, with the run's own settings (flags given then may change only its budget and
bookkeeping); a directory that already holds a run is never replaced without ``--overwrite``.
Ctrl-C (SIGINT) or SIGTERM stops a run after the step under way, with a checkpoint there: the
command prints the ``--resume`` command that continues it and exits with status 130 (a second
Ctrl-C stops at once, saving nothing more; see :class:`~attnlab.training.trainer.Trainer`).
A run whose estimated memory exceeds the available RAM exits with status 2 before the model is
built, unless ``--ignore-memory-check`` is given.

The same command runs data-parallel under torchrun (docs/scaling_out.md)::

    torchrun --nproc_per_node=4 -m attnlab train shakespeare-char --batch-size=48 [--fsdp]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import torch

from attnlab.analysis.memory_check import IGNORE_FLAG, check_training_fits
from attnlab.analysis.moe import active_params
from attnlab.cli.common import fail, guarded
from attnlab.cli.helptext import alias_table, recipe_details
from attnlab.cli.overrides import flag, flag_message, help_table, key_types, parse_overrides
from attnlab.config import config_to_dict, field_hints
from attnlab.training.config import TrainConfig
from attnlab.training.distributed import (
    _env_int,
    init_distributed,
    launched_by_torchrun,
    shutdown_distributed,
)
from attnlab.training.hardware import resolve_device
from attnlab.training.recipes import RECIPES, Prepared, Recipe, get_recipe
from attnlab.training.recipes.base import expand_aliases
from attnlab.training.recipes.runner import train_recipe
from attnlab.training.rundir import RunDir, latest_checkpoint
from attnlab.training.trainer import FitResult, TrainingInterrupted


def add_parser(commands: Any) -> None:
    """``attnlab train`` with one sub-command per recipe."""
    train_p = commands.add_parser("train", help="train a model with a recipe")
    tasks = train_p.add_subparsers(dest="task", metavar="RECIPE", required=True)
    for name in RECIPES:
        recipe = RECIPES.get(name)
        sections = recipe.sections()
        p = tasks.add_parser(
            name,
            help=recipe.description.replace("%", "%%"),
            allow_abbrev=False,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            description=f"{recipe.description}.\n\n{_module_doc(recipe)}".rstrip(),
            epilog=(
                "Options of the recipe (--key=value or --key value; --no-key for booleans; "
                "none for empty):\n"
                + help_table(sections, {"model": recipe.derived}).replace("%", "%%")
                + _variant_tables(recipe)
                + _alias_help(recipe)
            ),
        )
        p.add_argument("--out", default=None, help="run directory (default: RUNS_DIR/NAME)")
        p.add_argument("--name", default=None, help=f"run name (default {name})")
        p.add_argument("--runs-dir", default="runs", help="where run directories go")
        p.add_argument("--resume", action="store_true", help="continue the run in its directory")
        p.add_argument("--overwrite", action="store_true", help="replace a run already there")
        p.add_argument("--json", action="store_true", help="end with the summary as JSON")
        p.add_argument(
            IGNORE_FLAG, action="store_true", help="train even if the memory estimate exceeds RAM"
        )
        prog = f"attnlab train {name}"
        p.set_defaults(func=_launcher(prog), recipe=name, accepts_overrides=True, parser=p)


def _variant_tables(recipe: Recipe) -> str:
    """The help tables of the model configs the recipe's other options choose (cifar10's
    ``--model``)."""
    skip = {"model": recipe.derived}
    tables = [help_table({"model": recipe.sections(v)["model"]}, skip) for v in recipe.variants]
    return "".join("\n" + t.replace("%", "%%") for t in tables)


def _module_doc(recipe: Recipe) -> str:
    """The recipe's own part of its module's docstring, as plain text (helptext)."""
    module = sys.modules.get(type(recipe.options).__module__)
    return recipe_details(recipe.name, module.__doc__ if module is not None else None)


def _alias_help(recipe: Recipe) -> str:
    """The recipe's older option names (``--max-steps`` ...), which it accepts too."""
    table = alias_table(recipe.aliases, recipe_types(recipe))
    return "\n\n" + table.replace("%", "%%") if table else ""


def _launcher(prog: str) -> Any:
    body = guarded(prog, run_recipe)
    if launched_by_torchrun():  # a failing process's error goes into torchrun's report
        from torch.distributed.elastic.multiprocessing.errors import record

        return record(body)
    return body


def recipe_types(recipe: Recipe) -> dict[str, Any]:
    """``{key: annotation}`` of every flag of ``recipe`` (its aliases included)."""
    sections = recipe.sections()
    types_ = key_types(sections, {"model": recipe.derived})
    for variant in recipe.variants:  # other model configs the options can choose
        for k, v in key_types(recipe.sections(variant), {"model": recipe.derived}).items():
            types_.setdefault(k, v)
    hints = {k: v for obj in sections.values() for k, v in field_hints(type(obj)).items()}
    for old, alias in recipe.aliases.items():
        types_.setdefault(old, hints.get(alias, str) if isinstance(alias, str) else alias[1])
    return types_


def run_recipe(args: argparse.Namespace) -> int:
    """Train ``args.recipe`` with ``args.overrides``; under torchrun every process runs this."""
    start = time.monotonic()
    recipe = get_recipe(args.recipe)
    overrides = parse_overrides(list(args.overrides), recipe_types(recipe),
                                other_flags=getattr(args, "command_flags", ()))  # fmt: skip
    _check_fsdp(overrides)
    if not args.resume:  # a resumed run's model is the run's own (train_recipe checks it)
        _check_variant_keys(recipe, overrides)
    out = _run_dir(args, recipe, overrides)
    command = "attnlab " + " ".join(sys.argv[1:]) if sys.argv else ""
    joined: list[Any] = []

    def join() -> Any:  # after the memory check: a single process unless under torchrun
        joined.append(init_distributed())
        return joined[0]

    try:
        prepared, result = train_recipe(
            recipe, out, overrides, resume=args.resume, overwrite=args.overwrite,
            check=None if args.ignore_memory_check else _check_memory, distributed=join,
            command=command, on_start=lambda p, run: _print_header(p, run, joined[0], args.resume),
        )  # fmt: skip
    except (ValueError, TypeError) as e:  # the config's words, as the command's flags
        e.args = (flag_message(str(e), recipe_types(recipe)), *e.args[1:])
        raise
    except TrainingInterrupted as e:  # stopped at a step boundary, with a checkpoint there
        saved = f"; checkpoint {e.checkpoint}" if e.checkpoint is not None else ""
        print(f"attnlab train {recipe.name}: interrupted ({e.signal_name}) after step "
              f"{e.step}{saved}\n  continue with: {resume_command(args, out)}",
              file=sys.stderr, flush=True)  # fmt: skip
        return 130
    except KeyboardInterrupt:  # before training, or a second Ctrl-C: nothing more was saved
        latest = None
        if not launched_by_torchrun():  # (torchrun's processes: resume with torchrun)
            with contextlib.suppress(OSError, ValueError):
                latest = latest_checkpoint(out)
        if latest is None:
            raise  # "interrupted" (cli.common.guarded)
        print(f"attnlab train {recipe.name}: interrupted; nothing more was saved, the run "
              f"continues from {latest}\n  continue with: {resume_command(args, out)}",
              file=sys.stderr, flush=True)  # fmt: skip
        return 130
    ctx = joined[0]
    # On an error the process group is left alone: the launcher stops the other processes
    # (tearing it down here could wait for them forever).
    shutdown_distributed(ctx)
    if ctx.is_main:
        _print_summary(prepared, RunDir(out), result, time.monotonic() - start, as_json=args.json)
    return 0


def resume_command(args: argparse.Namespace, out: Path) -> str:
    """The command that continues the run in ``out`` (its settings come from its run.json;
    a memory check skipped then is skipped again)."""
    words = ["attnlab", "train", args.recipe, "--out", str(out), "--resume"]
    if args.ignore_memory_check:
        words.append(IGNORE_FLAG)
    return shlex.join(words)


def _check_fsdp(overrides: dict[str, Any]) -> None:
    """Refuse ``--fsdp`` where it would do nothing: FSDP shards the model over the processes
    torchrun starts, and one process has nobody to shard with (it would train unsharded)."""
    asked = any(k.rpartition(".")[2] == "fsdp" and v is True for k, v in overrides.items())
    processes = _env_int("WORLD_SIZE", 1) if launched_by_torchrun() else 1
    if asked and processes < 2:
        where = "torchrun with WORLD_SIZE=1" if launched_by_torchrun() else "one process"
        fail(f"--fsdp shards the model over the processes of a distributed run, but this is "
             f"{where}: launch it with torchrun --nproc_per_node=N (N >= 2) -m attnlab train "
             "..., or leave out --fsdp")  # fmt: skip


def _given_options(recipe: Recipe, overrides: dict[str, Any]) -> Any:
    """The recipe's options with the flags given (the defaults where they do not parse yet:
    the recipe reports that when it is prepared)."""
    options = recipe.options
    given = {k: v for k, v in expand_aliases(recipe, overrides).items() if hasattr(options, k)}
    with contextlib.suppress(TypeError, ValueError):
        options = dataclasses.replace(options, **given)
    return options


def _check_variant_keys(recipe: Recipe, overrides: dict[str, Any]) -> None:
    """Refuse a model flag of another variant (``--n-heads`` with ``--arch mamba``), naming the
    model's own flags (the command line accepts every variant's flags)."""
    if not recipe.variants:
        return
    options = _given_options(recipe, overrides)
    keys = recipe.keys(options)
    valid = set().union(*keys.values())
    for key in expand_aliases(recipe, overrides):
        name = key.rpartition(".")[2]
        if name not in valid:
            model = recipe.sections(options)["model"]
            fields = ", ".join(sorted(flag(k) for k in keys["model"]))
            fail(f"{flag(name)} is not an option of {type(model).__name__} (the model this "
                 f"recipe builds with these options); its model options: {fields}")  # fmt: skip


def _run_dir(args: argparse.Namespace, recipe: Recipe, overrides: dict[str, Any]) -> Path:
    if args.out is not None and args.name is not None:
        fail("pass --out DIR or --name NAME (under --runs-dir), not both")
    if args.out is not None:
        return Path(args.out)
    runs = Path(args.runs_dir)
    if runs.exists() and not runs.is_dir():
        fail(f"--runs-dir {runs} is a file, not a directory")
    if args.name is not None:
        return runs / args.name
    return runs / recipe.default_run_name(_given_options(recipe, overrides))


def _check_memory(
    model_config: Any, train: TrainConfig, batch: int, seq_len: int | None = None
) -> None:
    """Refuse a run whose estimate exceeds the available memory: under torchrun each process
    computes its slice of every micro-batch of ``batch`` sequences of ``seq_len`` tokens."""
    torchrun = launched_by_torchrun()
    world_size = _env_int("WORLD_SIZE", 1) if torchrun else 1
    train.per_rank_batch_size(world_size)  # raises when the world size does not divide it
    device = None if torchrun else resolve_device(train.device)  # absent: refused here
    check_training_fits(
        model_config, max(1, batch // world_size), seq_len, precision=train.precision,
        activation_checkpointing=train.activation_checkpointing, device=device,
    )  # fmt: skip


def _budget(train: TrainConfig) -> str:
    parts = [f"{train.steps} steps" if train.steps else "",
             f"{train.max_minutes:g} min" if train.max_minutes else "",
             f"{train.max_epochs} epochs" if train.max_epochs else ""]  # fmt: skip
    given = [p for p in parts if p]
    return ("stops at the first of " if len(given) > 1 else "") + " / ".join(given)


def _print_header(prepared: Prepared, run: RunDir, ctx: Any, resume: bool) -> None:
    t = prepared.train
    device = f"{ctx.world_size} processes ({ctx.backend})" if ctx.enabled else str(
        resolve_device(t.device, prepared.model)
    )  # fmt: skip
    what = "resuming" if resume else "training"
    active = ""
    if getattr(prepared.model_config, "n_experts", 0):  # a mixture of experts
        with contextlib.suppress(ValueError):  # a config without closed forms
            active = f" ({active_params(prepared.model_config):,} active per token)"
    print(
        f"{prepared.recipe.name}: {what} {type(prepared.model).__name__} with "
        f"{prepared.n_params:,} parameters{active} on {device}, {torch.get_num_threads()} "
        f"threads -> {run.path}",
        flush=True,
    )
    data = ", ".join(f"{k} {v}" for k, v in prepared.data.info.items())
    print(f"  data: {data}" if data else "  data: -", flush=True)
    rate = (
        f"muon lr {t.muon_lr:g}, adamw lr {t.lr:g}"
        if t.optimizer == "muon"
        else (f"{t.optimizer} lr {t.lr:g}")
    )
    print(
        f"  budget: {_budget(t)}; batch {t.batch_size} x {t.grad_accum}, {rate}"
        f" ({t.schedule}), seed {t.seed}",
        flush=True,
    )
    checkpointing = t.activation_checkpointing
    blocks = "off" if not checkpointing else "every block" if checkpointing == 1 else (
        f"every {checkpointing}th block")  # fmt: skip
    print(
        f"  compute: precision {t.precision}, compile {'on' if t.compile else 'off'}, "
        f"activation checkpointing {blocks}, optimizer {t.optimizer_impl}",
        flush=True,
    )


def _print_summary(
    prepared: Prepared, run: RunDir, result: FitResult, seconds: float, *, as_json: bool
) -> None:
    last = dict(result.evals[-1]) if result.evals else {}
    last.pop("step", None)
    if as_json:
        record = {"recipe": prepared.recipe.name, "run_dir": str(run.path), "step": result.step,
                  "stopped_by": result.stopped_by, "elapsed_s": result.elapsed_s,
                  "session_s": seconds, "n_params": prepared.n_params, "val": last,
                  "best": {"metric": prepared.train.best_metric, "value": result.best_value,
                           "step": result.best_step},
                  "final": result.final, "checkpoint": str(result.checkpoint),
                  "compile_s": result.compile_s, "setup": result.setup,
                  "model": config_to_dict(prepared.model_config)}  # fmt: skip
        print(json.dumps(record, indent=2))
        return
    losses = result.losses
    loss = f"loss {losses[-1]:.4f}" if losses else "no steps this session"
    print(
        f"trained to step {result.step} in {result.seconds:.1f} s this session "
        f"({result.elapsed_s:.1f} s in total; stopped by {result.stopped_by or 'request'}), {loss}"
    )
    setup = result.setup
    if setup:
        blocks = setup["checkpointed_blocks"]
        print(
            f"computed on {setup['device']} in {setup['precision']}, optimizer "
            f"{setup['optimizer']}, {blocks} checkpointed blocks"
        )
    if result.compile_s is not None:
        print(f"compiled in {result.compile_s:.1f} s (before the first step; not in step times)")
    if last:
        print("validation: " + _metrics_line(last))
    for name, metrics in result.final.items():
        print(f"{name}: " + _metrics_line(metrics))
    if result.best_step is not None and prepared.train.save_best:
        print(
            f"best {prepared.train.best_metric} {result.best_value:.4f} at step {result.best_step}"
        )
    print(f"run directory: {run.path} (checkpoint {result.checkpoint}; {seconds:.1f} s in all)")


def _metrics_line(metrics: dict[str, float]) -> str:
    parts = []
    for key, value in metrics.items():
        name = key.removeprefix("val_")
        if name in ("accuracy", "exact_match"):
            parts.append(f"{name.replace('_', ' ')} {value:.2%}")
        elif isinstance(value, float):
            parts.append(f"{name} {value:.4f}" if name != "bleu" else f"BLEU {value:.2f}")
    return ", ".join(parts)


__all__ = ["add_parser", "recipe_types", "resume_command", "run_recipe"]
