"""Model checkpoints: a directory with ``model.safetensors`` and ``config.json``.

The weights go through ``safetensors.torch.save_model``/``load_model``, which store a tied or
shared tensor once (the paper shares the embeddings and the pre-softmax projection, §3.4). The
config is :func:`attnlab.config.config_to_dict` (with its ``model_type``), so
:func:`load_checkpoint` rebuilds any registered model with :func:`attnlab.models.build_model`;
unknown config keys fail loudly.

Writes are atomic per file: each file is written to a temporary file in the same directory,
fsync-ed, and moved over the old one with ``os.replace``. Both temporary files are complete before
either replacement, so a failed write leaves the previous checkpoint untouched and no temporary
files behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model
from torch import nn

from attnlab.config import config_to_dict
from attnlab.models import build_model, config_from_json_dict

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"


def _write_temp(directory: Path, name: str, write: Callable[[str], None]) -> Path:
    """Run ``write(path)`` on a fresh temporary file in ``directory``, fsync it, return it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return Path(tmp)


def _fsync_dir(directory: Path) -> None:
    """Make the renames durable (POSIX; a no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save_checkpoint(model: nn.Module, path: str | os.PathLike[str]) -> Path:
    """Save ``model`` (which must carry its ``config``) to the directory ``path``.

    Args:
        model: a model built by :func:`attnlab.models.build_model` (has ``.config``).
        path: the checkpoint directory; created if missing, its files replaced atomically.

    Returns:
        The checkpoint directory.

    Raises:
        ValueError: if ``model`` has no ``config`` attribute.
    """
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError(f"{type(model).__name__} has no .config; cannot write config.json")
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    config_text = json.dumps(config_to_dict(config), indent=2, sort_keys=False) + "\n"

    def write_config(tmp: str) -> None:
        Path(tmp).write_text(config_text, encoding="utf-8")

    tmp_weights = _write_temp(directory, WEIGHTS_NAME, lambda tmp: save_model(model, tmp))
    try:
        tmp_config = _write_temp(directory, CONFIG_NAME, write_config)
    except BaseException:
        tmp_weights.unlink(missing_ok=True)
        raise
    os.replace(tmp_weights, directory / WEIGHTS_NAME)
    os.replace(tmp_config, directory / CONFIG_NAME)
    _fsync_dir(directory)
    return directory


def load_config(path: str | os.PathLike[str]) -> Any:
    """The model config stored in checkpoint directory ``path``.

    Raises:
        FileNotFoundError: if ``config.json`` is missing.
        ValueError: for invalid JSON, a missing/unknown ``model_type`` or unknown keys.
    """
    file = Path(path) / CONFIG_NAME
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{file} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{file} must hold a JSON object, got {type(data).__name__}")
    return config_from_json_dict(data)


def load_checkpoint(
    path: str | os.PathLike[str], *, device: torch.device | str = "cpu"
) -> nn.Module:
    """Rebuild the model saved in ``path`` and load its weights; returned in eval mode.

    Raises:
        FileNotFoundError: if a checkpoint file is missing.
        ValueError: for a bad ``config.json`` (see :func:`load_config`).
        RuntimeError: if the weights do not match the model the config builds.
    """
    weights = Path(path) / WEIGHTS_NAME
    if not weights.is_file():
        raise FileNotFoundError(f"no {WEIGHTS_NAME} in {path}")
    model = build_model(load_config(path), device=device)
    load_model(model, weights, strict=True, device=str(device))
    return model.eval()


__all__ = ["CONFIG_NAME", "WEIGHTS_NAME", "load_checkpoint", "load_config", "save_checkpoint"]
