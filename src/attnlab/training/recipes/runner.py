"""Running a recipe into its run directory: the library side of ``attnlab train RECIPE``.

:func:`train_recipe` does what the command does, without printing: it refuses a directory that
holds a run (unless resuming or overwriting), resumes with the run's own settings
(:func:`resumed_overrides`: flags given then may change only the budget and bookkeeping),
builds the recipe (:func:`~attnlab.training.recipes.prepare`), writes ``run.json`` and the
tokenizer, and trains on the one :class:`~attnlab.training.Trainer`.

The writing process (rank 0) owns the run directory for the whole session
(:mod:`attnlab.training.runlock`): it takes the lock before it reads or writes anything
there, so a second writer is refused at once and changes nothing. A resume loads its
checkpoint before anything is written: a refused resume (a newer attnlab's files, no
loadable checkpoint) leaves the directory as it was.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch

from attnlab.config import config_from_dict
from attnlab.tokenizers import load_tokenizer
from attnlab.training.config import TrainConfig
from attnlab.training.distributed import (
    DistributedContext,
    current_context,
    launched_by_torchrun,
)
from attnlab.training.recipes.base import (
    Prepared,
    Recipe,
    check_settings,
    expand_aliases,
    get_recipe,
    prepare,
    save_run_files,
    stored_aliases,
)
from attnlab.training.rundir import TOKENIZER_NAME, RunDir, RunDirError
from attnlab.training.runlock import acquire
from attnlab.training.trainer import FitResult, Trainer

# settings a resumed run may change (its budget and bookkeeping, not its trajectory)
RESUMABLE = {
    "train": ("steps", "max_minutes", "max_epochs", "eval_every", "eval_batches", "log_every",
              "checkpoint_every", "checkpoint_every_minutes", "keep_checkpoints", "progress",
              "tensorboard", "fsdp", "average_last", "early_stopping", "save_best",
              "export_last", "device", "precision", "compile", "activation_checkpointing",
              "retain_cpu_memory"),
    "options": ("eval_bleu_sentences", "eval_size"),
}  # fmt: skip


def _norm(value: Any) -> Any:
    return list(value) if isinstance(value, tuple | list) else value


def resumed_overrides(run: RunDir, recipe: Recipe, given: Mapping[str, Any]) -> dict[str, Any]:
    """The run's own settings (from ``run.json``), with what ``given`` changes.

    Raises:
        RunDirError: for a run of another recipe, or ``given`` changing the trajectory.
    """
    given = expand_aliases(recipe, dict(given))
    saved = run.read_record()
    if saved["recipe"] != recipe.name:
        raise RunDirError(f"{run.path} is a {saved['recipe']!r} run, not {recipe.name!r}")
    # the keys of the run's own options: its model config may be another than the default's
    names = {f.name for f in dataclasses.fields(recipe.options)}
    stored_options = {k: v for k, v in saved.get("options", {}).items() if k in names}
    keys = recipe.keys(config_from_dict(type(recipe.options), stored_options))
    values: dict[str, Any] = {}
    for section in ("options", "train", "model"):
        stored = saved.get(section, {})
        values.update({f"{section}.{k}": v for k, v in stored.items() if k in keys[section]})
    for section, renamed in stored_aliases(recipe, saved).items():  # older option names
        values.update({f"{section}.{k}": v for k, v in renamed.items()})
    changed = []
    for key, value in given.items():
        section, _, name = key.rpartition(".")
        sections = [section] if section else [s for s in keys if name in keys[s]]
        for s in sections:
            old = values.get(f"{s}.{name}")
            if old is not None and _norm(old) != _norm(value) and name not in RESUMABLE.get(s, ()):
                changed.append(name)
            values[f"{s}.{name}"] = value
    if changed:
        raise RunDirError(
            f"--resume with other settings than the run's ({', '.join(sorted(set(changed)))}); "
            "a resumed run keeps them (only its budget and bookkeeping may change)"
        )
    return values


def train_recipe(
    recipe: str | Recipe,
    out: str | os.PathLike[str],
    overrides: Mapping[str, Any] | None = None,
    *,
    resume: bool = False,
    overwrite: bool = False,
    check: Callable[[Any, TrainConfig, int, int | None], None] | None = None,
    distributed: DistributedContext | Callable[[], DistributedContext] | None = None,
    command: str = "",
    on_start: Callable[[Prepared, RunDir], None] | None = None,
) -> tuple[Prepared, FitResult]:
    """Train ``recipe`` into the run directory ``out`` (see the module docstring).

    Args:
        overrides: recipe-option, train and model fields by name (``"train.steps"`` where a
            name is in two sections; the recipe's older names are accepted).
        resume: continue the run in ``out`` (none yet: start one).
        overwrite: replace a run already in ``out``.
        check: ``(model config, train config, batch, seq_len)`` before the data is read and
            the model built (a memory check; see :func:`prepare`).
        distributed: the processes, or a function joining them, called once the recipe is
            prepared (so that a memory check refuses before any process group is joined);
            default: the initialised process group's, else one process.
        command: recorded in ``run.json``'s sessions. on_start: called before training
            (rank 0 only), e.g. to print a header.

    Returns:
        ``(the prepared recipe, what the trainer did)``.

    Raises:
        RunOwnedError: when another process owns (writes) ``out``.
        RunDirError: for a directory holding a run without ``resume``/``overwrite``, or a
            resume with other settings; and the errors of :func:`prepare` and the trainer.
        NewerVersionError: resuming a run whose files a newer attnlab wrote.
    """
    r = recipe if isinstance(recipe, Recipe) else get_recipe(recipe)
    values: dict[str, Any] = dict(overrides or {})
    if not resume:  # the user's mistake first, then the state of the disk
        check_settings(r, values)
    run = RunDir(out)
    # the writing process owns the directory before it reads or writes anything there (a
    # second writer is refused here, at once); under torchrun that is rank 0 alone
    lock = acquire(run.path) if _writes(distributed) else None
    try:
        tokenizer = None
        if resume and run.holds_run():
            values = resumed_overrides(run, r, values)
            if (run.path / TOKENIZER_NAME).is_file():
                tokenizer = load_tokenizer(run.path / TOKENIZER_NAME)
        elif run.holds_run() and not overwrite:
            raise RunDirError(
                f"{run.path} already holds a run: pass --resume to continue it, --overwrite to "
                "replace it, or another --out/--name"
            )
        prepared = prepare(r, values, check=check, tokenizer=tokenizer)
        if callable(distributed):
            distributed = distributed()
        ctx = distributed if distributed is not None else current_context()
        if lock is not None and not ctx.is_main:  # the rank, known only now, is not 0
            lock.release()
            lock = None
        elif lock is None and ctx.is_main:
            lock = acquire(run.path)
        trainer = Trainer(
            prepared.model, prepared.objective, prepared.train, run_dir=run,
            callbacks=prepared.callbacks, d_model=getattr(prepared.model_config, "d_model", None),
            distributed=ctx,
        )  # fmt: skip
        if resume:  # before anything is written: a refused resume changes nothing
            trainer.resume()
        if ctx.is_main:
            run.prepare(resume=resume, overwrite=overwrite)
            save_run_files(prepared, run.path)
            if on_start is not None:
                on_start(prepared, run)
            session = {"command": command, "resume": resume, **trainer.setup_info()}
            run.write_record(prepared.record(), session=session)
        return prepared, trainer.fit(resume=resume)
    finally:
        if lock is not None:
            lock.release()


def _writes(distributed: DistributedContext | Callable[[], DistributedContext] | None) -> bool:
    """Whether this process will write the run (rank 0), as far as is known before a process
    group is joined: a given context's rank, the joined group's, else torchrun's ``RANK``."""
    if isinstance(distributed, DistributedContext):
        return distributed.is_main
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank() == 0
    if launched_by_torchrun():
        return os.environ.get("RANK", "0").strip() == "0"
    return True


__all__ = ["RESUMABLE", "resumed_overrides", "train_recipe"]
