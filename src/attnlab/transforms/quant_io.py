"""Quantized model directories: :func:`save_quantized`, :func:`load_quantized`,
:func:`quantize_model_dir`.

A quantized model directory is an attnlab model directory plus one file:

- ``config.json``: the model config exactly as attnlab writes it
  (:func:`attnlab.config.config_to_dict`, with its ``model_type``);
- ``quantization.json``: ``{"version": 1, "config": QuantizationConfig, "tensors": ...}`` (how
  to rebuild the structure, and a description of the tensors);
- ``model.safetensors``: the state dict of the quantized model: for a quantized layer ``NAME``,
  ``NAME.qweight`` (int8 ``(N, K)``, or int4 codes in the canonical nibble layout
  ``(N, ceil(K/2))`` uint8), ``NAME.scales``, int4's ``NAME.zeros`` and ``NAME.bias``; every
  other tensor as it is. A tensor shared by several names (a tied head and embedding) is stored
  once; the safetensors metadata maps each dropped name to the stored one (as
  :mod:`attnlab.training.checkpoint` does).

The int4 kernel's own packing depends on the CPU (see :mod:`attnlab.transforms.quant_formats`),
so it is never stored: :func:`load_quantized` makes it again from the codes. Loading builds the
model from its config, applies the recorded quantization structure with empty quantized layers,
and loads the tensors: the result computes bitwise what the saved model computed.

Files are replaced atomically (each written to a temporary file in the directory, fsync-ed, then
moved into place once all are complete).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from attnlab.config import config_to_dict
from attnlab.models import build_model, config_from_json_dict
from attnlab.transforms.quantize import QuantizationConfig, apply_quantization, quantize

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
QUANTIZATION_NAME = "quantization.json"
FORMAT_VERSION = 1
# weight files of a source directory that a quantized copy replaces (never copied along)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack")
TENSORS_DOC = {
    "int8": "NAME.qweight int8 (N, K), NAME.scales float32 (N,): W = qweight * scales[:, None]",
    "int4": (
        "NAME.qweight uint8 (N, ceil(K/2)): code of input 2i in the low nibble of byte i, 2i+1 "
        "in the high nibble; NAME.scales, NAME.zeros float32 (N, K/group_size): "
        "W[n, k] = scales[n, k // g] * (code - 8) + zeros[n, k // g]"
    ),
    "bias": "NAME.bias float32 (N,), added after the product",
}


def _write_together(directory: Path, writers: dict[str, Callable[[str], None]]) -> None:
    """Write every ``writers[name](tmp)`` to a temporary file, then move them all into place."""
    temps: dict[str, str] = {}
    try:
        for name, write in writers.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
            os.close(fd)
            temps[name] = tmp
            write(tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
    except BaseException:
        for tmp in temps.values():
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    for name, tmp in temps.items():
        os.replace(tmp, directory / name)


def _unique_tensors(model: nn.Module) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The state dict with each shared tensor once, and {dropped name: stored name}."""
    tensors: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}
    first: dict[int, str] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in first:
            aliases[name] = first[id(t)]
        else:
            first[id(t)] = name
            tensors[name] = t.detach().contiguous()
    return tensors, aliases


def save_quantized(model: nn.Module, path: str | os.PathLike[str]) -> Path:
    """Write a quantized model (from :func:`~attnlab.transforms.quantize.quantize`) to the
    directory ``path`` (created if missing; its three files replaced atomically).

    Raises:
        ValueError: if ``model`` has no ``config`` or was not quantized.
    """
    config = getattr(model, "config", None)
    qconfig = getattr(model, "quantization_config", None)
    if config is None:
        raise ValueError(f"{type(model).__name__} has no .config; cannot write config.json")
    if not isinstance(qconfig, QuantizationConfig):
        raise ValueError(f"{type(model).__name__} is not quantized (no quantization_config)")
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    tensors, aliases = _unique_tensors(model)
    config_text = json.dumps(config_to_dict(config), indent=2) + "\n"
    record = {"version": FORMAT_VERSION, "config": qconfig.to_dict(), "tensors": TENSORS_DOC}
    quant_text = json.dumps(record, indent=2) + "\n"

    def text(value: str) -> Callable[[str], None]:
        def write(tmp: str) -> None:
            Path(tmp).write_text(value, encoding="utf-8")

        return write

    def weights(tmp: str) -> None:
        save_file(tensors, tmp, metadata={"format": "pt", **aliases})

    writers = {WEIGHTS_NAME: weights, CONFIG_NAME: text(config_text)}
    _write_together(directory, {**writers, QUANTIZATION_NAME: text(quant_text)})
    return directory


def is_quantized_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a quantized model directory (has ``quantization.json``)."""
    return (Path(path) / QUANTIZATION_NAME).is_file()


def read_quantization_config(path: str | os.PathLike[str]) -> QuantizationConfig:
    """The :class:`QuantizationConfig` of a quantized model directory.

    Raises:
        FileNotFoundError: without ``quantization.json``.
        ValueError: for invalid JSON, another format version, or bad values.
    """
    file = Path(path) / QUANTIZATION_NAME
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{file} is not valid JSON: {e}") from None
    if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
        version = data.get("version") if isinstance(data, dict) else None
        raise ValueError(f"{file}: version {version!r} is not {FORMAT_VERSION}")
    return QuantizationConfig.from_dict(data.get("config", {}))


def _read_tensors(file: Path) -> dict[str, Tensor]:
    """The tensors of ``file`` with every alias of the metadata added back (same tensor)."""
    tensors = load_file(str(file))
    with safe_open(str(file), framework="pt") as f:
        metadata: dict[str, Any] = f.metadata() or {}
    for name, stored in metadata.items():
        if stored in tensors and name not in tensors:
            tensors[name] = tensors[stored]
    return tensors


def load_quantized(
    path: str | os.PathLike[str], *, device: torch.device | str = "cpu"
) -> nn.Module:
    """Rebuild the quantized model saved in ``path`` (eval mode), bitwise as it was saved.

    Raises:
        FileNotFoundError: for a missing ``config.json``, ``quantization.json`` or weights.
        ValueError: for a bad config, or a recorded structure that this attnlab does not
            rebuild the same way (module names differ).
        RuntimeError: if the tensors do not match the rebuilt model (``load_state_dict``).
    """
    directory = Path(path)
    weights = directory / WEIGHTS_NAME
    if not weights.is_file():
        raise FileNotFoundError(f"no {WEIGHTS_NAME} in {directory}")
    qconfig = read_quantization_config(directory)
    config_file = directory / CONFIG_NAME
    try:
        data = json.loads(config_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{config_file} is not valid JSON: {e}") from None
    model = build_model(config_from_json_dict(data))
    apply_quantization(model, qconfig, empty=True)
    rebuilt: QuantizationConfig = getattr(model, "quantization_config")  # noqa: B009
    if rebuilt.modules != qconfig.modules:
        missing = sorted(set(qconfig.modules) ^ set(rebuilt.modules))
        raise ValueError(
            f"{directory / QUANTIZATION_NAME} records quantized modules that this model does "
            f"not rebuild the same way (differing: {missing[:5]})"
        )
    model.load_state_dict(_read_tensors(weights), strict=True)
    model = model.to(device)
    return model.eval()


def _side_files(directory: Path) -> list[Path]:
    """The files of ``directory`` to keep beside quantized weights (tokenizer, ...)."""
    own = {CONFIG_NAME, QUANTIZATION_NAME}
    return [
        f
        for f in sorted(directory.iterdir())
        if f.is_file()
        and f.name not in own
        and not f.name.endswith(_WEIGHT_SUFFIXES)
        and not f.name.endswith(".index.json")
        and not f.name.startswith(".")
    ]


def quantize_model_dir(
    src_dir: str | os.PathLike[str],
    dst_dir: str | os.PathLike[str],
    format: str,
    *,
    group_size: int = 128,
    include_lm_head: bool = False,
    include_embedding: bool = False,
    activation_dtype: str = "bfloat16",
) -> Path:
    """Load ``src_dir`` (anything :func:`attnlab.from_pretrained` loads), quantize it and write
    a quantized model directory ``dst_dir``, copying the side files (``tokenizer.json``,
    ``translation.json``, ...; not weights or configs). For ``attnlab quantize``.

    Args: as :func:`~attnlab.transforms.quantize.quantize`.

    Returns:
        ``dst_dir``.

    Raises:
        ValueError: if ``dst_dir`` is ``src_dir``, or as ``from_pretrained`` and ``quantize``.
        FileNotFoundError: as ``from_pretrained``.
    """
    from attnlab.hub import from_pretrained  # the model-directory reader (same floor)

    src, dst = Path(src_dir), Path(dst_dir)
    if dst.exists() and src.exists() and dst.resolve() == src.resolve():
        raise ValueError(f"dst_dir={str(dst)!r} is the source directory; choose another")
    model = from_pretrained(src)
    quantize(
        model,
        format,
        group_size=group_size,
        include_lm_head=include_lm_head,
        include_embedding=include_embedding,
        activation_dtype=activation_dtype,
    )
    save_quantized(model, dst)
    for file in _side_files(src):
        shutil.copy2(file, dst / file.name)
    return dst


__all__ = [
    "QUANTIZATION_NAME",
    "is_quantized_dir",
    "load_quantized",
    "quantize_model_dir",
    "read_quantization_config",
    "save_quantized",
]
