"""Resumable training checkpoints: model + config + optimizer/scheduler/RNG/data-position state.

Layout of a run directory::

    runs/<name>/
      train_config.json          the TrainConfig (and the recipe's extras)
      metrics.jsonl              one JSON object per logged step or evaluation
      checkpoints/
        step_00000100/           model.safetensors + config.json (attnlab.training.checkpoint)
                                 trainer_state.pt (optimizer, scheduler, RNGs, step, ...)
        latest                   the name of the newest complete checkpoint

Atomicity: a checkpoint is written into its own new directory (every file through a temporary
file, fsync and ``os.replace``), and only then is ``latest`` replaced, the same way. A process
killed at any point leaves ``latest`` naming the previous, complete checkpoint. Older
checkpoints beyond ``keep`` are deleted after the pointer moves.

The state file holds only tensors, numbers, strings and containers of them, so it loads with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model
from torch import nn

from attnlab.training.checkpoint import WEIGHTS_NAME, _fsync_dir, _write_temp, save_checkpoint

STATE_NAME = "trainer_state.pt"
LATEST_NAME = "latest"
CHECKPOINTS_DIR = "checkpoints"


def _step_dir(step: int) -> str:
    return f"step_{step:08d}"


def rng_state(data_generator: torch.Generator) -> dict[str, Any]:
    """The RNG states a resumed run needs: torch's global one (dropout), Python's, and the data
    generator's (the data position)."""
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "data": data_generator.get_state(),
    }


def set_rng_state(state: dict[str, Any], data_generator: torch.Generator) -> None:
    """Restore what :func:`rng_state` captured."""
    torch.set_rng_state(state["torch"])
    random.setstate(_to_tuple(state["python"]))
    data_generator.set_state(state["data"])


def _to_tuple(x: Any) -> Any:
    return tuple(_to_tuple(v) for v in x) if isinstance(x, list | tuple) else x


def save_training_checkpoint(
    run_dir: str | os.PathLike[str], model: nn.Module, state: dict[str, Any], *, keep: int = 2
) -> Path:
    """Write ``model`` and the trainer ``state`` (must hold ``"step"``) as a new checkpoint of
    ``run_dir``, point ``latest`` at it, and prune all but the ``keep`` newest.

    Returns:
        The new checkpoint directory.
    """
    root = Path(run_dir) / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    directory = root / _step_dir(int(state["step"]))
    save_checkpoint(model, directory)
    tmp = _write_temp(directory, STATE_NAME, lambda path: torch.save(state, path))
    os.replace(tmp, directory / STATE_NAME)
    _fsync_dir(directory)

    def write_pointer(path: str) -> None:
        Path(path).write_text(directory.name + "\n", encoding="utf-8")

    pointer = _write_temp(root, LATEST_NAME, write_pointer)
    os.replace(pointer, root / LATEST_NAME)
    _fsync_dir(root)
    _prune(root, keep=keep, current=directory.name)
    return directory


def _prune(root: Path, *, keep: int, current: str) -> None:
    steps = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_"))
    newer_first = [p for p in reversed(steps) if p.name <= current]
    for old in newer_first[keep:]:
        shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(path: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint directory of a run directory (or of a checkpoint
    directory itself, returned as is); ``None`` when there is none."""
    path = Path(path)
    if (path / WEIGHTS_NAME).is_file():
        return path
    pointer = path / CHECKPOINTS_DIR / LATEST_NAME
    if not pointer.is_file():
        return None
    directory = path / CHECKPOINTS_DIR / pointer.read_text().strip()
    return directory if (directory / STATE_NAME).is_file() else None


def load_training_state(checkpoint_dir: str | os.PathLike[str], model: nn.Module) -> dict[str, Any]:
    """Load a checkpoint's weights into ``model`` (in place) and return its trainer state.

    Raises:
        FileNotFoundError: if the weights or the state file are missing.
    """
    directory = Path(checkpoint_dir)
    state_file = directory / STATE_NAME
    if not state_file.is_file():
        raise FileNotFoundError(f"no {STATE_NAME} in {directory}")
    device = next(iter(model.parameters())).device
    load_model(model, directory / WEIGHTS_NAME, strict=True, device=str(device))
    state: dict[str, Any] = torch.load(state_file, map_location=device, weights_only=True)
    return state


__all__ = [
    "CHECKPOINTS_DIR",
    "LATEST_NAME",
    "STATE_NAME",
    "latest_checkpoint",
    "load_training_state",
    "rng_state",
    "save_training_checkpoint",
    "set_rng_state",
]
