"""Atomic file writes for the translation run directory (text, JSON, safetensors).

Each file is written to a temporary file in its directory, fsync-ed and moved over the old one
with ``os.replace`` (the same scheme as :mod:`attnlab.training.checkpoint`), so a killed process
leaves either the old or the new file, never half of one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from attnlab.training.checkpoint import _fsync_dir, _write_temp


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically, creating parent directories."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)

    def write(tmp: str) -> None:
        Path(tmp).write_text(text, encoding="utf-8")

    tmp = _write_temp(out.parent, out.name, write)
    os.replace(tmp, out)
    _fsync_dir(out.parent)
    return out


def atomic_write_json(path: str | os.PathLike[str], data: Any) -> Path:
    """Write ``data`` as indented JSON to ``path`` atomically."""
    return atomic_write_text(path, json.dumps(data, indent=2) + "\n")


def atomic_save_tensors(path: str | os.PathLike[str], tensors: dict[str, torch.Tensor]) -> Path:
    """Write a flat ``name -> tensor`` dict as safetensors to ``path`` atomically."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    tmp = _write_temp(out.parent, out.name, lambda t: save_file(data, t))
    os.replace(tmp, out)
    _fsync_dir(out.parent)
    return out


def read_json(path: str | os.PathLike[str]) -> Any:
    """Parse a JSON file.

    Raises:
        FileNotFoundError: if it is missing. ValueError: for invalid JSON.
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"missing {file}")
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{file} is not valid JSON: {e}") from None


__all__ = ["atomic_save_tensors", "atomic_write_json", "atomic_write_text", "read_json"]
