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
The same write serves the other files of a run (:func:`atomic_write`, :func:`atomic_write_text`:
the run's settings, its tokenizer). A process *killed* mid-write leaves its temporary file
(``.NAME.XXXXXXXX.tmp``) behind; :func:`remove_stale_temp_files` deletes such files (a resume
does, before it writes anything).

A sharded or wrapped model (FSDP, DDP) is saved from its *full* state dict, gathered by
:mod:`attnlab.training.distributed`: ``save_checkpoint(model, path, state_dict=full)``. Tied
parameters are then written once, under the name ``save_model`` would keep (the first in sorted
order), so the file is the same as a single-process run's; :func:`with_tied_names` adds the
other names back before loading such a state dict.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_file, save_model
from torch import Tensor, nn

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


# the names of :func:`_write_temp`'s files: "." + the target's name + "." + mkstemp's 8 random
# characters + ".tmp" (e.g. ".model.safetensors.k2j9_x1a.tmp")
_TEMP_NAME = re.compile(r"\.(?P<target>.+)\.[A-Za-z0-9_]{8}\.tmp")


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], None]) -> Path:
    """Write the file ``path`` atomically: ``write(tmp)`` fills a temporary file in the same
    directory, which is fsync-ed and moved over ``path`` (``os.replace``; the directory is then
    fsync-ed). A process killed at any point leaves the old file or the new one, never a torn
    one (at worst a stale temporary file, see :func:`remove_stale_temp_files`).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    target = Path(path)
    tmp = _write_temp(target.parent, target.name, write)
    try:
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)
    return target


def _write_files_together(directory: Path, writers: dict[str, Callable[[str], None]]) -> None:
    """Write several files of ``directory``: every ``writers[name](tmp)`` fills (and fsyncs) a
    temporary file first, then they are all moved into place and the directory is fsync-ed. If a
    writer fails, the temporary files already written are removed and nothing is replaced.
    """
    temps: dict[str, Path] = {}
    try:
        for name, write in writers.items():
            temps[name] = _write_temp(directory, name, write)
    except BaseException:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
        raise
    for name, tmp in temps.items():
        os.replace(tmp, directory / name)
    _fsync_dir(directory)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """:func:`atomic_write` of ``text`` (UTF-8)."""

    def write(tmp: str) -> None:
        Path(tmp).write_text(text, encoding="utf-8")

    return atomic_write(path, write)


def remove_stale_temp_files(
    directory: str | os.PathLike[str], *, recursive: bool = True
) -> list[Path]:
    """Delete the temporary files an interrupted atomic write left in ``directory`` (and, with
    ``recursive``, in its sub-directories): only names of the form :func:`atomic_write` and the
    checkpoint writers create (``.NAME.XXXXXXXX.tmp``); anything else is left alone.

    Call it only when no other process writes there (a resuming run, before it writes).

    Returns:
        The files removed (a missing ``directory`` gives ``[]``).
    """
    root = Path(directory)
    if not root.is_dir():
        return []
    candidates = root.rglob(".*.tmp") if recursive else root.glob(".*.tmp")
    removed = []
    for file in sorted(candidates):
        if _TEMP_NAME.fullmatch(file.name) and file.is_file() and not file.is_symlink():
            with contextlib.suppress(FileNotFoundError):
                file.unlink()
                removed.append(file)
    return removed


def _fsync_dir(directory: Path) -> None:
    """Make the renames durable (POSIX; a no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def tied_parameter_names(model: nn.Module) -> list[list[str]]:
    """Groups (sorted, two or more names each) of the parameter names of ``model`` that share
    one parameter, e.g. ``[["lm_head.weight", "tok_embed.weight"]]`` for tied embeddings
    (§3.4)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return sorted(sorted(group) for group in names.values() if len(group) > 1)


def with_tied_names(state_dict: dict[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``state_dict`` with every tied name of ``model`` present (the file holds one per group).

    Raises:
        KeyError: if no name of a tied group is in ``state_dict``.
    """
    out = dict(state_dict)
    for group in tied_parameter_names(model):
        present = [n for n in group if n in out]
        if not present:
            raise KeyError(f"none of the tied parameters {group} is in the state dict")
        for name in group:
            out.setdefault(name, out[present[0]])
    return out


def _save_state_dict(state_dict: dict[str, Tensor], model: nn.Module, file: str) -> None:
    """``save_model`` for a given state dict: tied names dropped (recorded in the metadata)."""
    tensors = {k: v.detach().contiguous() for k, v in state_dict.items()}
    metadata: dict[str, str] = {}
    for group in tied_parameter_names(model):
        present = [n for n in group if n in tensors]
        for name in present[1:]:
            metadata[name] = present[0]
            del tensors[name]
    save_file(tensors, file, metadata=metadata or None)


def save_checkpoint(
    model: nn.Module,
    path: str | os.PathLike[str],
    *,
    state_dict: dict[str, Tensor] | None = None,
) -> Path:
    """Save ``model`` (which must carry its ``config``) to the directory ``path``.

    Args:
        model: a model built by :func:`attnlab.models.build_model` (has ``.config``).
        path: the checkpoint directory; created if missing, its files replaced atomically.
        state_dict: the weights to write instead of ``model``'s own (the full state dict of a
            sharded model, whose parameter names it must use).

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

    def write_weights(tmp: str) -> None:
        if state_dict is None:
            save_model(model, tmp)
        else:
            _save_state_dict(state_dict, model, tmp)

    _write_files_together(directory, {WEIGHTS_NAME: write_weights, CONFIG_NAME: write_config})
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


__all__ = [
    "CONFIG_NAME",
    "WEIGHTS_NAME",
    "atomic_write",
    "atomic_write_text",
    "load_checkpoint",
    "load_config",
    "remove_stale_temp_files",
    "save_checkpoint",
    "tied_parameter_names",
    "with_tied_names",
]
