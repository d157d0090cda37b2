"""Trainer state on disk: everything but the weights that resuming needs, as JSON + safetensors.

A checkpoint directory (:mod:`attnlab.training.rundir`) holds the model files and
``trainer_state.safetensors`` (every tensor: optimizer moments, RNG states as uint8, ...) +
``trainer_state.json`` (the rest: step, scheduler, data position, best score, ... with
references to the tensors).

No pickle is written or read: the state is split by :func:`flatten_state` into plain JSON and a
flat ``{name: tensor}`` dict, and put back together by :func:`unflatten_state`. The JSON encodes
what JSON lacks with one-key tagged objects: ``{"__tensor__": name}``, ``{"__tuple__": [...]}``,
``{"__float__": "inf"}`` (also ``"-inf"``, ``"nan"``), and ``{"__dict__": [[key, value], ...]}``
for dicts whose keys are not all strings (a torch optimizer's integer parameter ids) or that
could be mistaken for a tag. Names of tensors are their paths in the state (``optimizer/state/
layers.0.ffn.up_proj.weight/exp_avg``).

Versions: 2 stores the data position under ``"data"``; version 1 (attnlab 0.1) kept the data
generator in ``rng["data"]`` and is read as version 2. A state of a newer version is refused
(:func:`attnlab.io.check_version`'s ``NewerVersionError``), never taken for a damaged one.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file
from torch import Tensor, nn

from attnlab.io import check_version, read_json, write_files_together
from attnlab.pretrained import WEIGHTS_NAME

STATE_NAME = "trainer_state.json"
STATE_TENSORS_NAME = "trainer_state.safetensors"
STATE_FORMAT = "attnlab-trainer-state"
STATE_VERSION = 2

_TAGS = ("__tensor__", "__tuple__", "__float__", "__dict__")


def rng_state() -> dict[str, Any]:
    """The global RNG states a resumed run needs: torch's (dropout) and Python's."""
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    torch.set_rng_state(state["torch"])
    random.setstate(_to_tuple(state["python"]))


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


def write_training_state(directory: str | os.PathLike[str], state: Mapping[str, Any]) -> None:
    """Write ``state`` into ``directory`` as ``trainer_state.json`` + ``.safetensors`` (both
    complete before either replaces an old file)."""
    data, tensors = flatten_state(dict(state))
    text = json.dumps(
        {"format": STATE_FORMAT, "version": STATE_VERSION, "state": data},
        indent=1, allow_nan=False,
    ) + "\n"  # fmt: skip

    def write_tensors(path: str) -> None:
        save_file(tensors, path)  # looked up at call time (tests patch it to kill a write)

    def write_json(path: str) -> None:
        Path(path).write_text(text, encoding="utf-8")

    write_files_together(directory, {STATE_TENSORS_NAME: write_tensors, STATE_NAME: write_json})


def read_training_state(checkpoint_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The trainer state stored in ``checkpoint_dir`` (tensors on the CPU), as version 2.

    Raises:
        FileNotFoundError: if a state file is missing (``trainer_state.pt`` files of older
            versions are not read).
        NewerVersionError: for a state written by a newer attnlab (a ``ValueError``: naming
            the file and both versions; never to be taken for damage).
        ValueError: for a state file that is not attnlab's format, or a damaged tensor file
            (each naming the file).
    """
    directory = Path(checkpoint_dir)
    for name in (STATE_NAME, STATE_TENSORS_NAME):
        if not (directory / name).is_file():
            old = " (an older attnlab's trainer_state.pt is not supported)" * (
                (directory / "trainer_state.pt").is_file()
            )
            raise FileNotFoundError(f"no {name} in {directory}{old}")
    file = directory / STATE_NAME
    data = read_json(file, what="trainer state", expect=dict)
    version = check_version(file, data, format=STATE_FORMAT, version=STATE_VERSION,
                            what="an attnlab trainer state", required=True)  # fmt: skip
    tensors = load_tensors(directory / STATE_TENSORS_NAME)
    state: dict[str, Any] = unflatten_state(data["state"], tensors)
    if version == 1:  # the data generator lived in the RNG states
        state["data"] = {"generator": state["rng"].pop("data")}
    return state


def load_tensors(file: str | os.PathLike[str]) -> dict[str, Tensor]:
    """Every tensor of a safetensors file.

    Raises:
        ValueError: for a file that is truncated or not safetensors (naming it).
    """
    try:
        return load_file(file)
    except (SafetensorError, OSError, RuntimeError) as e:
        raise ValueError(f"{file} is not a readable safetensors file: {e}") from None


def load_training_state(checkpoint_dir: str | os.PathLike[str], model: nn.Module) -> dict[str, Any]:
    """Load a checkpoint's weights into ``model`` (in place, an unsharded model) and return its
    trainer state (:func:`read_training_state`).

    Raises:
        FileNotFoundError: if the weights or a state file are missing. ValueError: for a
        damaged file.
    """
    directory = Path(checkpoint_dir)
    state = read_training_state(directory)
    device = next(iter(model.parameters())).device
    try:
        load_model(model, directory / WEIGHTS_NAME, strict=True, device=str(device))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{directory / WEIGHTS_NAME} is not readable: {e}") from None
    return state


__all__ = [
    "STATE_NAME",
    "STATE_TENSORS_NAME",
    "flatten_state",
    "load_tensors",
    "load_training_state",
    "read_training_state",
    "rng_state",
    "set_rng_state",
    "unflatten_state",
    "write_training_state",
]
