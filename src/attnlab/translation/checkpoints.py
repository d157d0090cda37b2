"""Checkpoints of a translation run: resumable snapshots, exported models, averaging (§6.1).

Layout of a run directory (``--out``)::

    OUT/
      tokenizer.json  run.json  metrics.jsonl
      checkpoints/step_00001000/   model.safetensors + config.json (every snapshot);
                                   the newest also holds optimizer.safetensors + state.json
      checkpoints/latest           name of the newest complete snapshot
      last/  best/  averaged/      model.safetensors + config.json + tokenizer.json +
                                   translation.json: what ``attnlab translate`` loads

Nothing is pickled: weights, Adam's moments and torch's RNG state are safetensors; the step, data
position, budgets and best score are JSON. Every file is written atomically, a snapshot before
the ``latest`` pointer moves to it, so a run killed at any moment resumes from its newest
complete snapshot. Snapshots beyond the newest ``keep`` are deleted (their optimizer state as
soon as a newer one exists).

Averaging (§6.1, "averaging the last 5 checkpoints"): the element-wise mean of every parameter
and buffer of the last k snapshots, accumulated in float64.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model
from torch import nn

from attnlab.io import atomic_save_tensors, atomic_write_json, atomic_write_text, read_json
from attnlab.pretrained import WEIGHTS_NAME, save_pretrained
from attnlab.translation.tokenizer import TranslationTokenizer

CHECKPOINTS_DIR = "checkpoints"
LATEST = "latest"
OPTIMIZER_NAME = "optimizer.safetensors"
STATE_NAME = "state.json"
INFO_NAME = "translation.json"
EXPORTS = ("averaged", "best", "last")


def step_dir(out: str | os.PathLike[str], step: int) -> Path:
    """``OUT/checkpoints/step_<step, 8 digits>``."""
    return Path(out) / CHECKPOINTS_DIR / f"step_{step:08d}"


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Adam's per-parameter state as ``"<param index>.<name>" -> tensor`` (all tensors).

    Raises:
        ValueError: for non-tensor state entries (other optimizers).
    """
    out: dict[str, torch.Tensor] = {}
    for index, entry in optimizer.state_dict()["state"].items():
        for name, value in entry.items():
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"optimizer state {index}.{name} is not a tensor: {value!r}")
            out[f"{index}.{name}"] = value
    return out


def load_optimizer_tensors(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor]
) -> None:
    """Restore :func:`optimizer_tensors` output (the param groups stay the optimizer's own)."""
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        index, _, name = key.partition(".")
        state.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict(
        {"state": state, "param_groups": optimizer.state_dict()["param_groups"]}
    )


def save_snapshot(
    out: str | os.PathLike[str],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    *,
    keep: int,
) -> Path:
    """Write a resumable snapshot of step ``state["step"]``, point ``latest`` at it, prune.

    Returns:
        The snapshot directory.
    """
    directory = step_dir(out, int(state["step"]))
    save_pretrained(model, directory)
    tensors = {f"optimizer.{k}": v for k, v in optimizer_tensors(optimizer).items()}
    tensors["rng.torch"] = torch.get_rng_state()
    atomic_save_tensors(directory / OPTIMIZER_NAME, tensors)
    atomic_write_json(directory / STATE_NAME, state)
    root = directory.parent
    atomic_write_text(root / LATEST, directory.name + "\n")
    snapshots = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_"))
    older = [p for p in snapshots if p.name < directory.name]
    for p in older:  # only the newest snapshot stays resumable
        (p / OPTIMIZER_NAME).unlink(missing_ok=True)
        (p / STATE_NAME).unlink(missing_ok=True)
    for p in older[: max(0, len(older) - (keep - 1))]:
        shutil.rmtree(p, ignore_errors=True)
    return directory


def latest_snapshot(out: str | os.PathLike[str]) -> Path | None:
    """The newest complete resumable snapshot of a run, or ``None``."""
    pointer = Path(out) / CHECKPOINTS_DIR / LATEST
    if not pointer.is_file():
        return None
    directory = pointer.parent / pointer.read_text(encoding="utf-8").strip()
    complete = all((directory / n).is_file() for n in (WEIGHTS_NAME, OPTIMIZER_NAME, STATE_NAME))
    return directory if complete else None


def load_snapshot(
    directory: str | os.PathLike[str], model: nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """Load a snapshot into ``model`` and ``optimizer``, restore torch's RNG; return the state.

    Raises:
        FileNotFoundError: for missing files. RuntimeError: if the weights do not fit the model.
    """
    directory = Path(directory)
    load_model(model, directory / WEIGHTS_NAME, strict=True)
    tensors = load_file(directory / OPTIMIZER_NAME)
    opt = {
        k.removeprefix("optimizer."): v for k, v in tensors.items() if k.startswith("optimizer.")
    }
    load_optimizer_tensors(optimizer, opt)
    torch.set_rng_state(tensors["rng.torch"])
    state: dict[str, Any] = read_json(directory / STATE_NAME)
    return state


def snapshot_dirs(out: str | os.PathLike[str]) -> list[Path]:
    """Every snapshot directory with weights, oldest first."""
    root = Path(out) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    return sorted(
        p for p in root.iterdir() if p.name.startswith("step_") and (p / WEIGHTS_NAME).is_file()
    )


@torch.no_grad()
def average_checkpoints(
    model: nn.Module, directories: Sequence[str | os.PathLike[str]]
) -> nn.Module:
    """Set ``model``'s parameters and float buffers to the mean over checkpoint ``directories``.

    Each directory's ``model.safetensors`` is loaded into ``model`` in turn (shared/tied tensors
    are handled by safetensors), summed in float64, and the mean written back.

    Raises:
        ValueError: for an empty list. RuntimeError: for weights that do not fit ``model``.
    """
    if not directories:
        raise ValueError("average_checkpoints needs at least one checkpoint directory")
    tensors: dict[str, torch.Tensor] = dict(model.named_parameters())
    tensors.update((n, b) for n, b in model.named_buffers() if b.is_floating_point())
    total = {n: torch.zeros_like(t, dtype=torch.float64) for n, t in tensors.items()}
    for d in directories:
        load_model(model, Path(d) / WEIGHTS_NAME, strict=True)
        for n, t in tensors.items():
            total[n] += t.double()
    for n, t in tensors.items():
        t.copy_(total[n] / len(directories))
    return model


def export_model(
    directory: str | os.PathLike[str],
    model: nn.Module,
    tokenizer: TranslationTokenizer,
    info: dict[str, Any],
) -> Path:
    """Write a self-contained model directory: weights, config, tokenizer and ``info``
    (languages, step, metrics) as ``translation.json``."""
    directory = save_pretrained(model, directory)
    tokenizer.save(directory)
    atomic_write_json(directory / INFO_NAME, info)
    return directory


__all__ = [
    "CHECKPOINTS_DIR",
    "EXPORTS",
    "INFO_NAME",
    "average_checkpoints",
    "export_model",
    "latest_snapshot",
    "load_optimizer_tensors",
    "load_snapshot",
    "optimizer_tensors",
    "save_snapshot",
    "snapshot_dirs",
    "step_dir",
]
