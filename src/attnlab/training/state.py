"""Resumable training checkpoints: model + config + optimizer/scheduler/RNG/data-position state.

Layout of a run directory::

    runs/<name>/
      train_config.json          the TrainConfig (and the recipe's extras)
      metrics.jsonl              one JSON object per logged step or evaluation
      checkpoints/
        step_00000100/           model.safetensors + config.json (attnlab.training.checkpoint)
                                 trainer_state.safetensors (every tensor: optimizer moments,
                                   RNG states as uint8, ...) + trainer_state.json (the rest:
                                   step, scheduler, best loss, ... with references to tensors)
        latest                   the name of the newest complete checkpoint

No pickle is written or read: the state is split by :func:`flatten_state` into plain JSON and a
flat ``{name: tensor}`` dict, and put back together by :func:`unflatten_state`. The JSON encodes
what JSON lacks with one-key tagged objects: ``{"__tensor__": name}``, ``{"__tuple__": [...]}``,
``{"__float__": "inf"}`` (also ``"-inf"``, ``"nan"``), and ``{"__dict__": [[key, value], ...]}``
for dicts whose keys are not all strings (a torch optimizer's integer parameter ids) or that
could be mistaken for a tag. Names of tensors are their paths in the state (``optimizer/state/
layers.0.ffn.up_proj.weight/exp_avg``).

Atomicity: a checkpoint is written into its own new directory (every file through a temporary
file, fsync and ``os.replace``), and only then is ``latest`` replaced, the same way. A process
killed at any point leaves ``latest`` naming the previous, complete checkpoint (and possibly
temporary files, which :meth:`attnlab.training.Trainer.resume` removes). Older checkpoints beyond
``keep`` are deleted after the pointer moves.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file
from torch import Tensor, nn

from attnlab.io import _write_temp, fsync_dir, write_files_together
from attnlab.pretrained import WEIGHTS_NAME, save_pretrained

STATE_NAME = "trainer_state.json"
STATE_TENSORS_NAME = "trainer_state.safetensors"
STATE_FORMAT = "attnlab-trainer-state"
STATE_VERSION = 1
LATEST_NAME = "latest"
CHECKPOINTS_DIR = "checkpoints"

_TAGS = ("__tensor__", "__tuple__", "__float__", "__dict__")


def _step_dir(step: int) -> str:
    return f"step_{step:08d}"


def checkpoint_path(run_dir: str | os.PathLike[str], step: int) -> Path:
    """The directory the checkpoint of ``step`` of ``run_dir`` has (or would have)."""
    return Path(run_dir) / CHECKPOINTS_DIR / _step_dir(step)


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


# -- state <-> (JSON, tensors) ------------------------------------------------------------------


def flatten_state(state: Any) -> tuple[Any, dict[str, Tensor]]:
    """Split a nested state (dicts, lists, tuples, tensors, numbers, strings, ``None``) into a
    JSON-ready object and the tensors it references.

    Returns:
        ``(json_object, {name: tensor})``; tensors are detached, contiguous CPU copies.

    Raises:
        TypeError: naming the path of a value that is none of the above.
    """
    tensors: dict[str, Tensor] = {}

    def encode(x: Any, path: str) -> Any:
        if isinstance(x, Tensor):
            if path in tensors:
                raise ValueError(f"two tensors of the state have the name {path!r}")
            tensors[path] = x.detach().to("cpu", copy=True).contiguous()
            return {"__tensor__": path}
        if isinstance(x, bool | int | str) or x is None:
            return x
        if isinstance(x, float):
            return x if math.isfinite(x) else {"__float__": repr(x)}
        if isinstance(x, tuple):
            return {"__tuple__": [encode(v, f"{path}/{i}") for i, v in enumerate(x)]}
        if isinstance(x, list):
            return [encode(v, f"{path}/{i}") for i, v in enumerate(x)]
        if isinstance(x, Mapping):
            plain = all(isinstance(k, str) for k in x) and not any(k in _TAGS for k in x)
            if plain:
                return {k: encode(v, f"{path}/{k}") for k, v in x.items()}
            return {"__dict__": [[encode(k, f"{path}/<key>"), encode(v, f"{path}/{k}")]
                                 for k, v in x.items()]}  # fmt: skip
        raise TypeError(
            f"trainer state at {path or '/'!r} has type {type(x).__name__}; expected tensors, "
            "numbers, strings, None, or dicts/lists/tuples of them"
        )

    return encode(state, ""), tensors


def unflatten_state(data: Any, tensors: Mapping[str, Tensor]) -> Any:
    """Rebuild what :func:`flatten_state` split.

    Raises:
        ValueError: for a tensor reference missing from ``tensors`` or a malformed tag.
    """

    def decode(x: Any) -> Any:
        if isinstance(x, list):
            return [decode(v) for v in x]
        if not isinstance(x, dict):
            return x
        if len(x) == 1 and next(iter(x)) in _TAGS:
            tag, value = next(iter(x.items()))
            if tag == "__tensor__":
                if value not in tensors:
                    raise ValueError(f"the state references a tensor {value!r} that is missing")
                return tensors[value]
            if tag == "__tuple__":
                return tuple(decode(v) for v in value)
            if tag == "__float__":
                if value not in ("inf", "-inf", "nan"):
                    raise ValueError(f"bad __float__ value {value!r}; expected inf, -inf or nan")
                return float(value)
            return {_hashable(decode(k)): decode(v) for k, v in value}
        return {k: decode(v) for k, v in x.items()}

    return decode(data)


def _hashable(key: Any) -> Any:
    if isinstance(key, list | Tensor | dict):
        raise ValueError(f"a state dict key must be a number, string or tuple, got {key!r}")
    return key


# -- writing and reading ------------------------------------------------------------------------


def save_training_checkpoint(
    run_dir: str | os.PathLike[str],
    model: nn.Module,
    state: dict[str, Any],
    *,
    keep: int = 2,
    model_state: dict[str, Tensor] | None = None,
) -> Path:
    """Write ``model`` and the trainer ``state`` (must hold ``"step"``) as a new checkpoint of
    ``run_dir``, point ``latest`` at it, and prune all but the ``keep`` newest.

    Args:
        run_dir: the run directory.
        model: the model (unwrapped: it must carry ``.config``).
        state: the trainer state (:meth:`attnlab.training.Trainer.state_dict`).
        keep: how many checkpoints to keep.
        model_state: the weights to write instead of ``model.state_dict()`` (the full state
            dict gathered from a sharded model).

    Returns:
        The new checkpoint directory.
    """
    root = Path(run_dir) / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    directory = checkpoint_path(run_dir, int(state["step"]))
    save_pretrained(model, directory, state_dict=model_state)
    data, tensors = flatten_state(state)
    text = json.dumps(
        {"format": STATE_FORMAT, "version": STATE_VERSION, "state": data},
        indent=1, allow_nan=False,
    ) + "\n"  # fmt: skip

    def write_tensors(path: str) -> None:
        save_file(tensors, path)  # looked up at call time (tests patch it to kill a write)

    def write_json(path: str) -> None:
        Path(path).write_text(text, encoding="utf-8")

    write_files_together(directory, {STATE_TENSORS_NAME: write_tensors, STATE_NAME: write_json})

    def write_pointer(path: str) -> None:
        Path(path).write_text(directory.name + "\n", encoding="utf-8")

    pointer = _write_temp(root, LATEST_NAME, write_pointer)
    os.replace(pointer, root / LATEST_NAME)
    fsync_dir(root)
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
    complete = all((directory / n).is_file() for n in (STATE_NAME, STATE_TENSORS_NAME))
    return directory if complete else None


def read_training_state(checkpoint_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The trainer state stored in ``checkpoint_dir`` (tensors on the CPU).

    Raises:
        FileNotFoundError: if a state file is missing (``trainer_state.pt`` files of older
            versions are not read).
        ValueError: for a state file that is not attnlab's format.
    """
    directory = Path(checkpoint_dir)
    for name in (STATE_NAME, STATE_TENSORS_NAME):
        if not (directory / name).is_file():
            old = " (an older attnlab's trainer_state.pt is not supported)" * (
                (directory / "trainer_state.pt").is_file()
            )
            raise FileNotFoundError(f"no {name} in {directory}{old}")
    file = directory / STATE_NAME
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{file} is not valid JSON: {e}") from None
    if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
        raise ValueError(f"{file} is not an attnlab trainer state (format {STATE_FORMAT!r})")
    if data.get("version") != STATE_VERSION:
        raise ValueError(f"{file} has version {data.get('version')}; expected {STATE_VERSION}")
    state: dict[str, Any] = unflatten_state(
        data["state"], load_file(directory / STATE_TENSORS_NAME)
    )
    return state


def load_training_state(checkpoint_dir: str | os.PathLike[str], model: nn.Module) -> dict[str, Any]:
    """Load a checkpoint's weights into ``model`` (in place, an unsharded model) and return its
    trainer state (:func:`read_training_state`).

    Raises:
        FileNotFoundError: if the weights or a state file are missing.
    """
    directory = Path(checkpoint_dir)
    state = read_training_state(directory)
    device = next(iter(model.parameters())).device
    load_model(model, directory / WEIGHTS_NAME, strict=True, device=str(device))
    return state


__all__ = [
    "CHECKPOINTS_DIR",
    "LATEST_NAME",
    "STATE_NAME",
    "STATE_TENSORS_NAME",
    "checkpoint_path",
    "flatten_state",
    "latest_checkpoint",
    "load_training_state",
    "read_training_state",
    "rng_state",
    "save_training_checkpoint",
    "set_rng_state",
    "unflatten_state",
]
