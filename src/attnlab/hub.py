"""``from_pretrained`` / ``save_pretrained``: one entry point for checkpoint directories.

Two formats share the directory shape ``config.json`` + ``model.safetensors``:

- attnlab's own (:mod:`attnlab.training.checkpoint`): the config dataclass as JSON with its
  ``model_type`` (``"gpt"``, ``"bert"``, ``"vit"``, ``"transformer"``), the state dict as is;
  saving and loading are bitwise exact;
- Hugging Face's (:mod:`attnlab.interop.hf`): its own ``config.json`` (``model_type`` ``"bert"``,
  ``"gpt2"``, ``"llama"``, ...), translated and loaded through a key map.

Before building an attnlab model, the parameter count its config implies is compared with the
shapes in the safetensors header (:func:`check_param_count`; no tensor data is read), so a
``config.json`` edited to another size is refused instead of allocating the wrong model.

``"bert"`` and ``"vit"`` are ``model_type`` values of both; a config whose keys are all fields of
attnlab's config class is attnlab's, anything else is Hugging Face's.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from attnlab.interop.family import UnsupportedCheckpointError
from attnlab.interop.hf import HF_FAMILIES, SAFETENSORS_NAME, load_hf, read_config
from attnlab.interop.keymap import CheckpointMismatchError
from attnlab.models import MODEL_TYPES


def is_attnlab_config(data: Mapping[str, Any]) -> bool:
    """Whether a ``config.json`` dict is attnlab's own format (not Hugging Face's)."""
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or model_type not in MODEL_TYPES:
        return False
    if model_type not in HF_FAMILIES:
        return True  # "gpt", "transformer": attnlab names only; bad keys fail loudly later
    config_cls, _ = MODEL_TYPES.get(model_type)
    fields = {f.name for f in dataclasses.fields(config_cls)}
    return set(data) - {"model_type"} <= fields


def from_pretrained(
    path: str | os.PathLike[str],
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    strict: bool = True,
) -> nn.Module:
    """Load a checkpoint directory, attnlab's or Hugging Face's, as an attnlab model (eval mode).

    The returned model carries its config (``model.config``).

    Args:
        path: a directory with ``config.json`` and weights.
        device: where to build the model.
        dtype: convert the parameters to this dtype (default: as built, float32).
        strict: Hugging Face checkpoints only: with ``False``, missing/unexpected tensors are
            logged instead of raised. attnlab checkpoints always load strictly.

    Raises:
        FileNotFoundError: for a missing directory, ``config.json`` or weights file.
        ValueError: for an unknown ``model_type``, an unsupported Hugging Face family or
            option (:class:`~attnlab.interop.family.UnsupportedCheckpointError`), or tensors
            that do not match (:class:`~attnlab.interop.keymap.CheckpointMismatchError`, naming
            every key and expected shape; for attnlab's format, a parameter count in the
            safetensors header other than the config's, checked before the model is built).
    """
    data = read_config(path)
    model_type = data.get("model_type")
    if model_type not in MODEL_TYPES and model_type not in HF_FAMILIES:
        raise UnsupportedCheckpointError(
            f"{Path(path) / 'config.json'}: model_type {model_type!r} is neither an attnlab model "
            f"({', '.join(MODEL_TYPES.keys())}) nor a supported Hugging Face family "
            f"({', '.join(HF_FAMILIES.keys())})"
        )
    if not is_attnlab_config(data):
        return load_hf(path, device=device, dtype=dtype, strict=strict)
    from attnlab.training.checkpoint import load_checkpoint, load_config  # above models

    check_param_count(path, load_config(path))
    model = load_checkpoint(path, device=device)
    return model.to(dtype) if dtype is not None else model


def safetensors_numel(file: str | os.PathLike[str]) -> int:
    """Elements in a safetensors file, from its header's shapes (no tensor data is read).

    Raises:
        FileNotFoundError: if ``file`` does not exist.
        safetensors.SafetensorError: if it is not a safetensors file.
    """
    if not Path(file).is_file():
        raise FileNotFoundError(f"no such weights file: {file}")
    total = 0
    with safe_open(str(file), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            total += math.prod(f.get_slice(key).get_shape())
    return total


def check_param_count(path: str | os.PathLike[str], config: Any) -> None:
    """Check that an attnlab checkpoint's ``model.safetensors`` holds exactly the parameters its
    config implies (:func:`attnlab.analysis.count_params`, closed form), before anything is
    built: an edited ``config.json`` (another ``d_model``, more layers) is refused with both
    counts instead of allocating a model of the wrong size.

    Raises:
        FileNotFoundError: without ``model.safetensors``.
        CheckpointMismatchError: when the counts differ.
    """
    from attnlab.analysis.params import count_params

    file = Path(path) / SAFETENSORS_NAME
    stored, implied = safetensors_numel(file), count_params(config)
    if stored != implied:
        fields = ("d_model", "n_heads", "n_layers", "d_ff", "vocab_size")
        sizes = ", ".join(f"{k}={getattr(config, k)}" for k in fields if hasattr(config, k))
        raise CheckpointMismatchError(
            f"{Path(path) / 'config.json'} implies {implied:,} parameters ({sizes}) but {file} "
            f"holds {stored:,}: the config does not describe these weights"
        )


def save_pretrained(model: nn.Module, path: str | os.PathLike[str]) -> Path:
    """Write ``model`` in attnlab's format (``model.safetensors`` + ``config.json``, each file
    replaced atomically); :func:`from_pretrained` reads it back bitwise.

    Raises:
        ValueError: if ``model`` has no ``config``.
    """
    from attnlab.training.checkpoint import save_checkpoint

    return save_checkpoint(model, path)


__all__ = [
    "check_param_count",
    "from_pretrained",
    "is_attnlab_config",
    "safetensors_numel",
    "save_pretrained",
]
