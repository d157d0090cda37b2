"""Quantized model directories: :func:`save_quantized`, :func:`load_quantized`.

A quantized model directory is an attnlab model directory plus one file, so
:func:`attnlab.from_pretrained` (and with it every command that takes a model directory) loads
it, and :func:`attnlab.save_pretrained` of a quantized model writes it:

- ``config.json``: the model config exactly as attnlab writes it
  (:func:`attnlab.config.config_to_dict`, with its ``model_type``);
- ``quantization.json``: ``{"format": "attnlab-quantization", "version": 1, "config":
  QuantizationConfig, "tensors": ...}`` (how to rebuild the structure, and a description of the
  tensors). Files written before the ``format`` key existed load as they are; a newer
  ``version`` is refused, naming both versions;
- ``model.safetensors``: the state dict of the quantized model: for a quantized layer ``NAME``,
  ``NAME.qweight`` (int8 ``(N, K)``, or int4 codes in the canonical nibble layout
  ``(N, ceil(K/2))`` uint8), ``NAME.scales``, int4's ``NAME.zeros`` and ``NAME.bias``; every
  other tensor as it is. A tensor shared by several names (a tied head and embedding) is stored
  once; the safetensors metadata maps each dropped name to the stored one.

The int4 kernel's own packing depends on the CPU (see :mod:`attnlab.transforms.quant_formats`),
so it is never stored: loading makes it again from the codes. Loading first rebuilds the
quantized structure on the ``meta`` device (nothing allocated) and compares every tensor name,
shape and dtype with the safetensors header (no tensor data read), so an edited ``config.json``
or a foreign file is refused with the differences named before a model is built; then it
builds the model from its config, applies the recorded structure with empty quantized layers and
loads the tensors: the result computes bitwise what the saved model computed.

The three files are written with :func:`attnlab.io.write_files_together` (all complete before
any replaces an old one). As in attnlab's own format, the weights' metadata binds them to the
config (:mod:`attnlab.integrity`: the digest of ``config.json``, the content digest of the
tensors), checked on loading unless ``verify=False``; directories written before have no digests
and load as before.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from attnlab.config import config_to_dict
from attnlab.integrity import save_bound, verify_binding
from attnlab.io import check_version, json_text, read_json, write_files_together
from attnlab.models import build_model, config_from_json_dict
from attnlab.transforms.quant_modules import QuantizedLinear
from attnlab.transforms.quantize import QuantizationConfig, apply_quantization

CONFIG_NAME = "config.json"  # the same names as attnlab.pretrained's model directory
WEIGHTS_NAME = "model.safetensors"
QUANTIZATION_NAME = "quantization.json"
QUANTIZATION_FORMAT = "attnlab-quantization"
FORMAT_VERSION = 1
TENSORS_DOC = {
    "int8": "NAME.qweight int8 (N, K), NAME.scales float32 (N,): W = qweight * scales[:, None]",
    "int4": (
        "NAME.qweight uint8 (N, ceil(K/2)): code of input 2i in the low nibble of byte i, 2i+1 "
        "in the high nibble; NAME.scales, NAME.zeros float32 (N, K/group_size): "
        "W[n, k] = scales[n, k // g] * (code - 8) + zeros[n, k // g]"
    ),
    "bias": "NAME.bias float32 (N,), added after the product",
}
# safetensors' dtype names (the header) of the dtypes a quantized state dict holds
_DTYPE_NAMES = {
    torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
    torch.int8: "I8", torch.uint8: "U8", torch.int32: "I32", torch.int64: "I64",
    torch.bool: "BOOL",
}  # fmt: skip


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
    directory ``path`` (created if missing; its three files replaced together).

    Returns:
        The directory.

    Raises:
        ValueError: if ``model`` has no ``config`` or was not quantized.
    """
    config = getattr(model, "config", None)
    qconfig = getattr(model, "quantization_config", None)
    if config is None:
        raise ValueError(f"{type(model).__name__} has no .config; cannot write config.json")
    if not isinstance(qconfig, QuantizationConfig):
        raise ValueError(f"{type(model).__name__} is not quantized (no quantization_config)")
    tensors, aliases = _unique_tensors(model)
    tensors = {k: v.cpu() for k, v in tensors.items()}
    config_text = json_text(config_to_dict(config))
    record = {"format": QUANTIZATION_FORMAT, "version": FORMAT_VERSION,
              "config": qconfig.to_dict(), "tensors": TENSORS_DOC}  # fmt: skip
    quant_text = json_text(record)

    def text(value: str) -> Any:
        def write(tmp: str) -> None:
            Path(tmp).write_text(value, encoding="utf-8")

        return write

    def weights(tmp: str) -> None:  # + the digests of config.json and the tensors
        save_bound(save_file, tensors, tmp, metadata={"format": "pt", **aliases},
                   config_text=config_text)  # fmt: skip

    directory = Path(path)
    write_files_together(
        directory,
        {
            WEIGHTS_NAME: weights,
            CONFIG_NAME: text(config_text),
            QUANTIZATION_NAME: text(quant_text),
        },
    )
    return directory


def quantized_float_tensors(model: nn.Module) -> list[tuple[str, Tensor]]:
    """``(name, tensor)`` of the float tensors the quantized layers store (scales, zeros,
    biases: buffers, not parameters), e.g. for a NaN/inf check of a loaded model."""
    out = []
    for prefix, module in model.named_modules():
        if isinstance(module, QuantizedLinear):
            for name in ("scales", "zeros", "bias"):
                t = getattr(module, name, None)
                if isinstance(t, Tensor) and t.is_floating_point():
                    out.append((f"{prefix}.{name}" if prefix else name, t))
    return out


def is_quantized_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a quantized model directory (has ``quantization.json``)."""
    return (Path(path) / QUANTIZATION_NAME).is_file()


def read_quantization_config(path: str | os.PathLike[str]) -> QuantizationConfig:
    """The :class:`QuantizationConfig` of a quantized model directory.

    Raises:
        FileNotFoundError: without ``quantization.json``.
        ValueError: for invalid JSON or bad values (naming the file); ``FormatError`` for
            another format, ``NewerVersionError`` for a newer attnlab's record (both versions
            named; :func:`attnlab.io.check_version`).
    """
    file = Path(path) / QUANTIZATION_NAME
    data = read_json(file, what="quantization record", expect=dict)
    check_version(file, data, format=QUANTIZATION_FORMAT, version=FORMAT_VERSION,
                  what="an attnlab quantization record")  # fmt: skip
    config = data.get("config")
    if not isinstance(config, dict):
        raise ValueError(f"{file}: 'config' must be a JSON object, got {type(config).__name__}")
    try:
        return QuantizationConfig.from_dict(config)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{file}: {e}") from None


def quantized_structure(
    config: Any, qconfig: QuantizationConfig, *, device: torch.device | str = "cpu"
) -> nn.Module:
    """The model ``config`` builds, with ``qconfig``'s quantized layers left empty (to be
    filled by ``load_state_dict``). On ``"meta"`` nothing is allocated (for checks and memory
    estimates).

    Raises:
        ValueError: if ``qconfig.modules`` are not the modules this structure quantizes.
    """
    with torch.device(device):  # the quantized layers' buffers are made there too
        model = build_model(config, device=device)
        apply_quantization(model, qconfig, empty=True)
    rebuilt: QuantizationConfig = getattr(model, "quantization_config")  # noqa: B009
    if qconfig.modules and rebuilt.modules != qconfig.modules:
        differing = sorted(set(qconfig.modules) ^ set(rebuilt.modules))
        raise ValueError(
            "the recorded quantized modules are not the ones this model rebuilds "
            f"(differing: {differing[:5]})"
        )
    return model


def measure_structure(
    config: Any, qconfig: QuantizationConfig, measure: Callable[[nn.Module], tuple[int, ...]]
) -> tuple[int, ...]:
    """``measure`` of :func:`quantized_structure` on ``meta``, computed from models of one and
    two layers when the layers are alike (``measure`` must grow linearly with them), so that a
    config claiming a million layers costs nothing to check or estimate."""
    free = dataclasses.replace(qconfig, modules=(), untied=())  # names of the full model
    fields = [
        f.name for f in dataclasses.fields(config) if re.fullmatch(r"n_(\w+_)?layers", f.name)
    ]
    counts = {name: getattr(config, name) for name in fields}
    n = next(iter(counts.values()), None)
    if isinstance(n, int) and n >= 3 and all(v == n for v in counts.values()):
        try:
            small = [dataclasses.replace(config, **dict.fromkeys(fields, k)) for k in (1, 2)]
        except (TypeError, ValueError):  # per-layer options tied to the layer count
            small = []
        if small:
            one, two = (measure(quantized_structure(c, free, device="meta")) for c in small)
            return tuple(a + (n - 1) * (b - a) for a, b in zip(one, two, strict=True))
    return measure(quantized_structure(config, free, device="meta"))


def _header(file: Path) -> tuple[dict[str, tuple[str, tuple[int, ...]]], dict[str, str]]:
    """``{name: (dtype, shape)}`` and the metadata of a safetensors file (no data read)."""
    try:
        with safe_open(str(file), framework="pt") as f:
            entries = {
                k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape()))
                for k in f.keys()  # noqa: SIM118 (safe_open is not a mapping)
            }
            return entries, dict(f.metadata() or {})
    except SafetensorError as e:
        raise ValueError(f"{file} is not a readable safetensors file: {e}") from None


def check_tensors(file: str | os.PathLike[str], model: nn.Module) -> None:
    """Check that the safetensors ``file`` holds exactly ``model``'s state dict (names,
    aliases, shapes and dtypes; ``model`` may be on ``meta``).

    Raises:
        ValueError: naming the missing, unexpected or mismatched tensors.
    """
    path = Path(file)
    entries, metadata = _header(path)
    expected = {k: (t.dtype, tuple(t.shape)) for k, t in model.state_dict().items()}
    problems = []
    for name, (dtype, shape) in expected.items():
        stored = name if name in entries else metadata.get(name)
        if stored not in entries:
            problems.append(f"{name} missing")
            continue
        found = entries[stored]
        want = (_DTYPE_NAMES.get(dtype, str(dtype)), shape)
        if found != want:
            problems.append(
                f"{name} is {found[0]} {list(found[1])}, expected {want[0]} {list(shape)}"
            )
    problems += [f"{k} unexpected" for k in entries if k not in expected]
    if problems:
        more = f" (and {len(problems) - 4} more)" if len(problems) > 4 else ""
        raise ValueError(
            f"{path} does not hold the quantized model its config and {QUANTIZATION_NAME} "
            f"describe: {'; '.join(problems[:4])}{more}"
        )


def _read_tensors(file: Path, *, verify: bool = False) -> dict[str, Tensor]:
    """The tensors of ``file`` with every alias of the metadata added back (same tensor);
    with ``verify``, checked against the digests the metadata records (and the directory's
    ``config.json``; :func:`attnlab.integrity.verify_binding`).

    Raises:
        DigestMismatchError: (``verify``) for a config or tensors other than those saved.
    """
    tensors = load_file(str(file))
    _, metadata = _header(file)
    if verify:
        config_file = file.parent / CONFIG_NAME
        data = read_json(config_file, what="model config", expect=dict)
        verify_binding(file, metadata, tensors, config_file=config_file, config_data=data)
    stored = set(tensors)
    for name, target in metadata.items():
        if target in stored and name not in tensors:
            tensors[name] = tensors[target]
    return tensors


def load_config_of(path: str | os.PathLike[str]) -> Any:
    """The model config in the ``config.json`` of ``path``.

    Raises:
        FileNotFoundError, ValueError, TypeError: as :func:`attnlab.io.read_json` and
            :func:`attnlab.models.config_from_json_dict`.
    """
    data = read_json(Path(path) / CONFIG_NAME, what="model config", expect=dict)
    return config_from_json_dict(data)


def load_quantized(
    path: str | os.PathLike[str], *, device: torch.device | str = "cpu", verify: bool = True
) -> nn.Module:
    """Rebuild the quantized model saved in ``path`` (eval mode), bitwise as it was saved;
    with ``verify``, ``config.json`` and the tensors are checked against the digests the weights
    record (:mod:`attnlab.integrity`; a directory written before them has none:
    :class:`~attnlab.integrity.DigestMismatchError` otherwise).

    Raises:
        FileNotFoundError: for a missing ``config.json``, ``quantization.json`` or weights.
        ValueError: for a bad config or quantization record, or tensors that do not match the
            structure they describe (checked on the header before anything is built).
    """
    directory = Path(path)
    weights = directory / WEIGHTS_NAME
    if not weights.is_file():
        raise FileNotFoundError(f"no {WEIGHTS_NAME} in {directory}")
    qconfig = read_quantization_config(directory)
    config = load_config_of(directory)
    entries, metadata = _header(weights)
    held = len(entries) + sum(v in entries and k not in entries for k, v in metadata.items())
    try:
        (described,) = measure_structure(config, qconfig, lambda m: (len(m.state_dict()),))
    except ValueError as e:
        raise ValueError(f"{directory / QUANTIZATION_NAME}: {e}") from None
    if held != described:  # before the whole structure is built, even on meta
        raise ValueError(
            f"{weights} holds {held} tensors but {CONFIG_NAME} and {QUANTIZATION_NAME} describe "
            f"a quantized model of {described}: the config does not describe these weights"
        )
    try:
        meta = quantized_structure(config, qconfig, device="meta")
    except ValueError as e:
        raise ValueError(f"{directory / QUANTIZATION_NAME}: {e}") from None
    check_tensors(weights, meta)
    model = quantized_structure(config, qconfig)
    model.load_state_dict(_read_tensors(weights, verify=verify), strict=True)
    model = model.to(device)
    return model.eval()


__all__ = [
    "QUANTIZATION_FORMAT",
    "QUANTIZATION_NAME",
    "check_tensors",
    "is_quantized_dir",
    "load_config_of",
    "load_quantized",
    "measure_structure",
    "quantized_float_tensors",
    "quantized_structure",
    "read_quantization_config",
    "save_quantized",
]
