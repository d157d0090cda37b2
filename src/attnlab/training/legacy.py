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
the current schema. Every file of the old layout is first copied to ``legacy-0.1/``.

What cannot carry over: Python's ``random`` state (attnlab 0.1 did not save it; the recipe
does not use it) — so a converted run continues the old one exactly in everything that the
training computes.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from attnlab.io import atomic_write_text, read_json
from attnlab.pretrained import WEIGHTS_NAME, load_attnlab
from attnlab.training.metrics import METRICS_NAME, read_metrics
from attnlab.training.rundir import RunDir, RunDirError
from attnlab.training.state import load_tensors

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

    Raises:
        RunDirError: if ``run_dir`` is not such a run, or has no resumable snapshot.
        FileNotFoundError / ValueError: for missing or damaged files (naming them).
    """
    from attnlab.training.recipes import prepare
    from attnlab.training.trainer import Trainer

    run = RunDir(run_dir)
    if not run.is_legacy_translation():
        raise RunDirError(f"{run.path} is not a translation run of attnlab 0.1 (nothing to do)")
    record = read_json(run.record_file, what="run record", expect=dict)
    snapshots = [d for d in run.checkpoint_dirs() if (d / WEIGHTS_NAME).is_file()]
    resumable = [d for d in snapshots if (d / "state.json").is_file()
                 and (d / "optimizer.safetensors").is_file()]  # fmt: skip
    if not resumable:
        raise RunDirError(f"{run.path} has no snapshot with optimizer state to continue from")
    newest = resumable[-1]
    _keep_copy(run)
    state = read_json(newest / "state.json", what="snapshot state", expect=dict)
    tensors = load_tensors(newest / "optimizer.safetensors")
    prepared = prepare("translate", _overrides(record["config"], record.get("data")),
                       tokenizer=_tokenizer(run))  # fmt: skip
    prepared.model.load_state_dict(load_attnlab(newest).state_dict())
    trainer = Trainer(prepared.model, prepared.objective, prepared.train, run_dir=run,
                      callbacks=prepared.callbacks)  # fmt: skip
    _load_moments(trainer, tensors)
    _set_progress(trainer, state)
    torch.set_rng_state(tensors["rng.torch"])
    _rewrite_metrics(run)
    (run.checkpoints / "latest").unlink(missing_ok=True)
    for d in snapshots:  # the old state files are in legacy-0.1/ now
        for name in ("state.json", "optimizer.safetensors"):
            (d / name).unlink(missing_ok=True)
    run.record_file.unlink()
    run.write_record(prepared.record(), session={"command": "convert-run", "from": "0.1"})
    return trainer.checkpoints.save()


def _keep_copy(run: RunDir) -> None:
    target = run.path / LEGACY_DIR
    if target.exists():
        raise RunDirError(f"{target} exists already: a conversion was started before; move it")
    target.mkdir()
    for name in ("run.json", METRICS_NAME):
        if (run.path / name).is_file():
            shutil.copy2(run.path / name, target / name)
    for d in run.checkpoint_dirs():
        for name in ("state.json", "optimizer.safetensors"):
            if (d / name).is_file():
                (target / d.name).mkdir(exist_ok=True)
                shutil.copy2(d / name, target / d.name / name)


def _tokenizer(run: RunDir) -> Any:
    from attnlab.tokenizers import load_tokenizer

    return load_tokenizer(run.path / "tokenizer.json")


def _load_moments(trainer: Any, tensors: dict[str, torch.Tensor]) -> None:
    """Adam's moments keyed by parameter index (0.1's single group over ``parameters()``) into
    the trainer's optimizer, by parameter."""
    params = list(trainer.module.parameters())
    by_param: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optimizer."):
            head, _, name = key.removeprefix("optimizer.").partition(".")
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


def _rewrite_metrics(run: RunDir) -> None:
    """Rewrite an old run's metrics file in the one schema (nothing to do without one)."""
    file = run.path / METRICS_NAME
    if not file.is_file():
        return
    lines = [json.dumps(record) for record in read_metrics(file)]
    atomic_write_text(file, "".join(f"{line}\n" for line in lines))


__all__ = ["LEGACY_DIR", "convert_translation_run"]
