"""Converting a translation run of attnlab 0.1 to the one run-directory layout.

attnlab 0.1 trained translation with its own loop: ``run.json`` held a ``TranslateConfig``
under ``config``; each snapshot ``checkpoints/step_X/`` held the model files, and the newest
also ``optimizer.safetensors`` (Adam's moments keyed by parameter *index*, torch's RNG state)
and ``state.json`` (step, epoch, batch, tokens, seconds, best score); metrics lines had
``seconds`` and ``val_*`` keys.

:func:`convert_translation_run` rewrites such a directory in place as a run of the
``translate`` recipe, so that ``attnlab train translate --resume`` continues it on the one
trainer: the settings become the recipe's options, train and model configs; the newest
snapshot becomes a checkpoint with a full trainer state (the moments keyed by parameter name,
the schedule at the snapshot's step, the data position ``(epoch, batch)``, the training time,
the best score); older snapshots keep their weights (for averaging); metrics are rewritten in
the current schema. Every file of the old layout is first copied to ``legacy-0.1/``. The
conversion owns the run directory while it writes (:mod:`attnlab.training.runlock`): a
conversion of a run another process is writing is refused. It reads and checks everything
before it writes, and a failed rewrite puts the old files back: a failure never leaves a
half-converted run, nor a ``legacy-0.1/`` that blocks the retry.

What cannot carry over: Python's ``random`` state (attnlab 0.1 did not save it; the recipe
does not use it) — so a converted run continues the old one exactly in everything that the
training computes.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnlab.io import atomic_write_bytes, atomic_write_text, read_json
from attnlab.pretrained import WEIGHTS_NAME, load_attnlab
from attnlab.training.metrics import METRICS_NAME, read_metrics
from attnlab.training.rundir import RunDir, RunDirError
from attnlab.training.runlock import own_run
from attnlab.training.state import load_tensors

logger = logging.getLogger(__name__)

LEGACY_DIR = "legacy-0.1"
_OLD_TRAIN_KEYS = {
    "max_steps": "steps", "max_minutes": "max_minutes", "max_epochs": "max_epochs",
    "lr_factor": "lr", "warmup": "warmup", "adam_eps": "adam_eps",
    "label_smoothing": "label_smoothing", "clip_grad_norm": "clip_grad_norm", "seed": "seed",
    "eval_every": "eval_every", "save_every": "checkpoint_every",
    "save_every_minutes": "checkpoint_every_minutes", "average_last": "average_last",
    "log_every": "log_every", "progress": "progress",
}  # fmt: skip
_OLD_OPTION_KEYS = ("src", "tgt", "vocab_size", "min_frequency", "max_len", "max_tokens",
                    "train_limit", "eval_bleu_sentences")  # fmt: skip
_OLD_MODEL_KEYS = ("d_model", "n_layers", "n_heads", "d_ff", "dropout", "norm_position")


def _overrides(old: dict[str, Any], data: str | None) -> dict[str, Any]:
    """The recipe's overrides equal to an attnlab 0.1 ``TranslateConfig``."""
    out: dict[str, Any] = {f"train.{new}": old[k] for k, new in _OLD_TRAIN_KEYS.items() if k in old}
    out.update({f"options.{k}": old[k] for k in _OLD_OPTION_KEYS if k in old})
    out.update({f"model.{k}": old[k] for k in _OLD_MODEL_KEYS if k in old})
    if "adam_beta1" in old and "adam_beta2" in old:
        out["train.betas"] = (old["adam_beta1"], old["adam_beta2"])
    best = old.get("best_metric")
    if best is not None:
        out["train.best_metric"] = {"bleu": "val_bleu", "loss": "val_loss"}.get(best, best)
    if old.get("average_last") is not None:
        out["train.keep_checkpoints"] = max(int(old["average_last"]), 1)
    if data is not None:
        out["options.data"] = data
    return out


def convert_translation_run(run_dir: str | os.PathLike[str]) -> Path:
    """Rewrite an attnlab 0.1 translation run as a ``translate`` recipe run (see the module
    docstring); returns the newest checkpoint it wrote.

    Everything is read and checked before anything is written: the settings, the newest
    resumable snapshot's state and optimizer files, the tokenizer, the data, the weights. Then
    the old files are copied to ``legacy-0.1/`` (through ``legacy-0.1.partial/``, renamed once
    complete), and only then is the run rewritten; if that fails, the old files are put back and
    the copy removed, so a retry starts from the run as it was. A ``legacy-0.1/`` left by an
    interrupted conversion (killed half-way) holds the old files: a retry reads them from it.

    Raises:
        RunOwnedError: if another process owns (writes) ``run_dir``.
        FileNotFoundError: if ``run_dir`` does not exist, or for a missing file (naming it).
        RunDirError: if ``run_dir`` is a file, not such a run, or has no resumable snapshot.
        ValueError: for damaged files or settings (naming the file).
        OSError: when the copy or the rewrite cannot be written (naming the path; nothing is
            left converted half-way).
    """
    path = Path(run_dir)
    if not path.exists():
        raise FileNotFoundError(f"run directory {path} does not exist")
    if not path.is_dir():
        raise RunDirError(f"{path} is a file; convert-run takes a run directory")
    run = RunDir(path)
    with own_run(run.path):  # the conversion writes the run: nobody else may meanwhile
        return _convert(run)


def _convert(run: RunDir) -> Path:
    from attnlab.training.recipes import prepare
    from attnlab.training.trainer import Trainer

    copy = run.path / LEGACY_DIR
    if run.record_file.is_file():  # a damaged record is named, not taken for another run's
        read_json(run.record_file, what="run record", expect=dict)
    if not run.is_legacy_translation():
        done = f" (converted already: the old files are in {copy})" if copy.is_dir() else ""
        raise RunDirError(
            f"{run.path} is not a translation run of attnlab 0.1 (nothing to do){done}"
        )
    # -- read and check everything; nothing is written before the copy
    record = read_json(run.record_file, what="run record", expect=dict)
    old = record["config"]
    if not isinstance(old, dict):
        raise RunDirError(
            f"{run.record_file}: 'config' must be an object (attnlab 0.1's translation "
            f"settings), got {type(old).__name__}"
        )
    snapshots = [d for d in run.checkpoint_dirs() if (d / WEIGHTS_NAME).is_file()]
    resumable = [d for d in snapshots
                 if all(_old_file(run, d, name) for name in _STATE_FILES)]  # fmt: skip
    if not resumable:
        raise RunDirError(f"{run.path} has no snapshot with optimizer state to continue from")
    newest = resumable[-1]
    state_file, tensor_file = (_old_file(run, newest, name) for name in _STATE_FILES)
    if state_file is None or tensor_file is None:  # not resumable: excluded above
        raise RunDirError(f"{newest} has no optimizer state to continue from")
    state = _read_state(state_file)
    tensors = load_tensors(tensor_file)
    metrics = _new_metrics(run)
    tokenizer = _tokenizer(run)
    try:
        prepared = prepare("translate", _overrides(old, record.get("data")), tokenizer=tokenizer)
    except (ValueError, TypeError) as e:  # the settings (or the data they name) refused
        raise ValueError(
            f"{run.record_file}: attnlab 0.1's settings do not make a translate run: {e}"
        ) from None
    weights = newest / WEIGHTS_NAME
    try:
        prepared.model.load_state_dict(load_attnlab(newest).state_dict())
    except RuntimeError as e:  # names and shapes of another model
        detail = " ".join(str(e).split())[:300]
        raise ValueError(
            f"{weights} does not fit the model {run.record_file} describes: {detail}"
        ) from None
    trainer = Trainer(prepared.model, prepared.objective, prepared.train, run_dir=run,
                      callbacks=prepared.callbacks)  # fmt: skip
    _load_moments(trainer, tensors, tensor_file)
    _set_progress(trainer, state)
    rng = tensors.get("rng.torch")
    size = torch.get_rng_state().shape
    if rng is None or rng.dtype != torch.uint8 or rng.shape != size:
        raise ValueError(f"{tensor_file}: 'rng.torch' must hold torch's RNG state (uint8 bytes)")
    # -- write: the copy first, then the run; a failure puts the old files back
    made = _keep_copy(run, snapshots)
    saved = _Saved.of(run)
    try:
        torch.set_rng_state(rng)
        if metrics is not None:
            atomic_write_text(run.path / METRICS_NAME, metrics)
        (run.checkpoints / "latest").unlink(missing_ok=True)
        for d in snapshots:  # the old state files are in legacy-0.1/ now
            for name in _STATE_FILES:
                (d / name).unlink(missing_ok=True)
        run.record_file.unlink()  # the new record starts its own session list
        run.write_record(prepared.record(), session={"command": "convert-run", "from": "0.1"})
        return trainer.checkpoints.save()
    except BaseException:
        _put_back(run, snapshots, saved, remove_copy=made)
        raise


_STATE_FILES = ("state.json", "optimizer.safetensors")


def _old_file(run: RunDir, snapshot: Path, name: str) -> Path | None:
    """A snapshot's 0.1 state file: in the snapshot, else in the copy an interrupted conversion
    left (``legacy-0.1/step_X/``); ``None`` when neither has it."""
    for file in (snapshot / name, run.path / LEGACY_DIR / snapshot.name / name):
        if file.is_file():
            return file
    return None


def _read_state(file: Path) -> dict[str, Any]:
    """A snapshot's ``state.json``, its counters checked (naming the file)."""
    state: dict[str, Any] = read_json(file, what="snapshot state", expect=dict)
    for key in ("step", "epoch", "batch", "src_tokens"):
        value = state.get(key, 0 if key == "src_tokens" else None)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"snapshot state {file}: {key!r} must be an integer >= 0, got "
                             f"{value!r}")  # fmt: skip
    seconds = state.get("seconds", 0.0)
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds >= 0:
        raise ValueError(f"snapshot state {file}: 'seconds' must be a number >= 0, got "
                         f"{seconds!r}")  # fmt: skip
    if not isinstance(state.get("best_metrics") or {}, dict):
        raise ValueError(f"snapshot state {file}: 'best_metrics' must be an object")
    return state


def _keep_copy(run: RunDir, snapshots: list[Path]) -> bool:
    """Copy the old files to ``legacy-0.1/`` (through ``legacy-0.1.partial/``, renamed once
    complete, so a ``legacy-0.1/`` is always whole); returns whether this call made it (an
    interrupted conversion's copy is completed, not replaced).

    Raises:
        OSError: naming ``legacy-0.1`` when it cannot be written; the partial copy is removed.
    """
    target = run.path / LEGACY_DIR
    made = not target.exists()
    work = run.path / f"{LEGACY_DIR}.partial" if made else target
    if made and work.exists():  # what a killed conversion left: never a complete copy
        shutil.rmtree(work)
    try:
        work.mkdir(exist_ok=True)
        for name in ("run.json", METRICS_NAME):
            if (run.path / name).is_file() and not (work / name).exists():
                shutil.copy2(run.path / name, work / name)
        for d in snapshots:
            for name in _STATE_FILES:
                if (d / name).is_file() and not (work / d.name / name).exists():
                    (work / d.name).mkdir(exist_ok=True)
                    shutil.copy2(d / name, work / d.name / name)
        if made:
            os.replace(work, target)
    except OSError as e:
        if made:
            shutil.rmtree(work, ignore_errors=True)
        raise OSError(
            e.errno, f"{e.strerror or e} while copying the old files (nothing was converted; "
            f"the partial copy is removed)", str(target)
        ) from e  # fmt: skip
    return made


@dataclass(frozen=True)
class _Saved:
    """The files the rewrite replaces, as they were (the state files are in the copy)."""

    record: bytes
    metrics: bytes | None
    latest: bytes | None

    @classmethod
    def of(cls, run: RunDir) -> _Saved:
        metrics, latest = run.path / METRICS_NAME, run.checkpoints / "latest"
        return cls(
            run.record_file.read_bytes(),
            metrics.read_bytes() if metrics.is_file() else None,
            latest.read_bytes() if latest.is_file() else None,
        )


def _put_back(run: RunDir, snapshots: list[Path], saved: _Saved, *, remove_copy: bool) -> None:
    """Undo a rewrite that failed: the old files back in place, then (when this conversion made
    it) the copy removed, so that a retry starts from the run as it was. If putting back fails
    too, the copy stays: a retry reads the old state files from it."""
    copy = run.path / LEGACY_DIR
    try:
        atomic_write_bytes(run.record_file, saved.record)
        if saved.metrics is not None:
            atomic_write_bytes(run.path / METRICS_NAME, saved.metrics)
        if saved.latest is not None:
            atomic_write_bytes(run.checkpoints / "latest", saved.latest)
        for d in snapshots:
            for name in _STATE_FILES:
                kept = copy / d.name / name
                if kept.is_file() and not (d / name).exists():
                    shutil.copy2(kept, d / name)
    except OSError as e:
        logger.error("convert-run: could not put the old files of %s back (%s); they are in %s, "
                     "which a retry reads", run.path, e, copy)  # fmt: skip
        return
    if remove_copy:
        shutil.rmtree(copy, ignore_errors=True)


def _tokenizer(run: RunDir) -> Any:
    from attnlab.tokenizers import load_tokenizer

    return load_tokenizer(run.path / "tokenizer.json")


def _load_moments(trainer: Any, tensors: dict[str, torch.Tensor], file: Path) -> None:
    """Adam's moments keyed by parameter index (0.1's single group over ``parameters()``) into
    the trainer's optimizer, by parameter.

    Raises:
        ValueError: naming ``file`` for a key that is no parameter index of this model, or a
            moment of another shape than its parameter.
    """
    params = list(trainer.module.parameters())
    by_param: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optimizer."):
            head, _, name = key.removeprefix("optimizer.").partition(".")
            if not head.isdigit() or int(head) >= len(params) or not name:
                raise ValueError(
                    f"{file}: {key!r} names no parameter of this model (it has {len(params)}; "
                    "keys are optimizer.INDEX.NAME)"
                )
            param = params[int(head)]
            if value.dim() and value.shape != param.shape:
                raise ValueError(f"{file}: {key!r} has shape {tuple(value.shape)}, but parameter "
                                 f"{head} has {tuple(param.shape)}")  # fmt: skip
            by_param.setdefault(int(head), {})[name] = value
    for index, entry in by_param.items():
        trainer.optimizer.state[params[index]] = {k: v.clone() for k, v in entry.items()}


def _set_progress(trainer: Any, state: dict[str, Any]) -> None:
    step = int(state["step"])
    trainer.step = step
    trainer.scheduler.last_epoch = step
    trainer.scheduler._step_count = step + 1
    sched = trainer.scheduler
    lrs = [base * fn(step) for base, fn in zip(sched.base_lrs, sched.lr_lambdas, strict=True)]
    for group, lr in zip(trainer.optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    sched._last_lr = lrs
    trainer.stream.load_state_dict({"epoch": state["epoch"], "batch": state["batch"]})
    trainer.elapsed = float(state.get("seconds", 0.0))
    trainer.tokens = int(state.get("src_tokens", 0))
    metrics = state.get("best_metrics") or {}
    key = trainer.config.best_metric.removeprefix("val_")
    value = metrics.get(f"val_{key}")
    trainer.best_value = None if value is None else float(value)
    trainer.best_step = state.get("best_step")
    trainer.evals_since_best = 0


def _new_metrics(run: RunDir) -> str | None:
    """An old run's metrics file in the one schema (``None`` without one)."""
    file = run.path / METRICS_NAME
    if not file.is_file():
        return None
    return "".join(f"{json.dumps(record)}\n" for record in read_metrics(file))


__all__ = ["LEGACY_DIR", "convert_translation_run"]
