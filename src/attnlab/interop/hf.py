"""Load Hugging Face checkpoint directories into attnlab models, and write them back.

A Hugging Face directory holds ``config.json`` and the weights: ``model.safetensors`` (or shards
listed in ``model.safetensors.index.json``), or in older checkpoints ``pytorch_model.bin`` (or its
shards). Safetensors are preferred; a ``.bin`` is read with ``torch.load(weights_only=True)``,
which refuses to unpickle code. transformers itself is not needed.

:data:`HF_FAMILIES` maps Hugging Face's ``model_type`` to an :class:`HFFamily` (config translation
+ key map, one module per family). :func:`load_hf` builds the attnlab model that the config
describes and fills it through the key map, which reports every missing, unexpected or misshapen
tensor; :func:`save_hf` writes a directory that ``transformers.AutoModel*.from_pretrained`` loads.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from attnlab.interop.family import (
    HFConfig,
    HFFamily,
    UnsupportedCheckpointError,
    refuse_unexported_options,
)
from attnlab.interop.hf_bert import FAMILY as BERT
from attnlab.interop.hf_bloom import FAMILY as BLOOM
from attnlab.interop.hf_gpt2 import FAMILY as GPT2
from attnlab.interop.hf_llama import FAMILY as LLAMA
from attnlab.interop.hf_mamba import FAMILY as MAMBA
from attnlab.interop.hf_marian import FAMILY as MARIAN
from attnlab.interop.hf_mixtral import FAMILY as MIXTRAL
from attnlab.interop.hf_qwen2_moe import FAMILY as QWEN2_MOE
from attnlab.interop.hf_vit import FAMILY as VIT
from attnlab.interop.keymap import check_coverage, load_into
from attnlab.io import read_json, write_files_together
from attnlab.models import build_model
from attnlab.registry import Registry

logger = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
SAFETENSORS_NAME = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_NAME = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"

HF_FAMILIES: Registry[HFFamily] = Registry("Hugging Face model_type")
for _family in (BERT, GPT2, LLAMA, BLOOM, VIT, MARIAN, MIXTRAL, QWEN2_MOE, MAMBA):
    for _model_type in _family.model_types:
        HF_FAMILIES.add(_model_type, _family)


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``config.json`` of a model directory, as a dict.

    Raises:
        FileNotFoundError: if ``path`` is not a directory or has no ``config.json`` (for a name
            such as ``"gpt2"`` or ``"org/model"``, the message explains that Hub ids must be
            downloaded first, and how).
        ValueError: if the file is not valid UTF-8 JSON holding an object.
    """
    directory = Path(path)
    if not directory.is_dir():
        hint = ""
        if not directory.exists() and not str(path).startswith((".", "/", "~")):
            hint = (
                f". If {str(path)!r} is a Hugging Face Hub id: attnlab reads local directories "
                "only (it never downloads); fetch it once with `huggingface-cli download "
                f"{path} --local-dir DIR` (or transformers' "
                f"`AutoModel.from_pretrained({str(path)!r}).save_pretrained(DIR)`) and pass DIR"
            )
        what = "is a file, not a directory" if directory.exists() else "does not exist"
        raise FileNotFoundError(f"model directory {directory} {what}{hint}")
    file = directory / CONFIG_NAME
    if not file.is_file():
        raise FileNotFoundError(
            f"{directory} has no {CONFIG_NAME}: not a model directory "
            "(attnlab and Hugging Face checkpoints both need one)"
        )
    data: dict[str, Any] = read_json(file, what="model config", expect=dict)
    return data


def _shards(directory: Path, index_name: str) -> list[Path]:
    """The weight files an index lists: plain file names inside ``directory`` only.

    Raises:
        ValueError: for an index that is not JSON or has no ``weight_map``, lists no file, or
            names a file elsewhere (``../x``, ``/abs/path``, ``sub/dir``).
    """
    file = directory / index_name
    index = read_json(file, what="weights index")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(n, str) for n in weight_map.values()):
        raise ValueError(f"{file} must hold a 'weight_map' object: tensor name -> file name")
    names = sorted(set(weight_map.values()))
    if not names:
        raise ValueError(f"{file} lists no weight files")
    for name in names:
        if name in ("", ".", "..") or Path(name).name != name:
            raise ValueError(
                f"{file} names the weight file {name!r}: shards must be plain file names "
                f"inside {directory}"
            )
    return [directory / n for n in names]


def _load_bin(file: Path) -> dict[str, Tensor]:
    # weights_only=True: tensors and plain containers only; never unpickle code.
    try:
        data = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ValueError(
            f"{file} holds Python objects that weights-only loading refuses (unpickling them "
            "could run code); it was not loaded"
        ) from None
    except (OSError, RuntimeError, EOFError) as e:  # truncated, not a zip archive
        raise ValueError(
            f"{file} is not a readable PyTorch weights file (truncated or damaged: "
            f"{type(e).__name__}: {str(e).split('.')[0]})"
        ) from None
    if not isinstance(data, dict):
        raise ValueError(f"{file} does not hold a state dict")
    return data


def read_weights(path: str | os.PathLike[str]) -> dict[str, Tensor]:
    """All tensors of a Hugging Face checkpoint directory (safetensors first, then ``.bin``).

    Raises:
        FileNotFoundError: if the directory has no weights file.
    """
    directory = Path(path)
    if (directory / SAFETENSORS_NAME).is_file():
        return load_file(directory / SAFETENSORS_NAME)
    if (directory / SAFETENSORS_INDEX).is_file():
        out: dict[str, Tensor] = {}
        for shard in _shards(directory, SAFETENSORS_INDEX):
            out.update(load_file(shard))
        return out
    if (directory / BIN_NAME).is_file():
        return _load_bin(directory / BIN_NAME)
    if (directory / BIN_INDEX).is_file():
        out = {}
        for shard in _shards(directory, BIN_INDEX):
            out.update(_load_bin(shard))
        return out
    raise FileNotFoundError(
        f"no weights in {directory}: expected {SAFETENSORS_NAME}, {SAFETENSORS_INDEX}, "
        f"{BIN_NAME} or {BIN_INDEX}"
    )


def weight_names(path: str | os.PathLike[str]) -> set[str] | None:
    """The tensor names of a checkpoint's safetensors file(s), from their headers (no tensor data
    is read); ``None`` for ``.bin`` checkpoints, whose names need the data."""
    directory = Path(path)
    if (directory / SAFETENSORS_NAME).is_file():
        files = [directory / SAFETENSORS_NAME]
    elif (directory / SAFETENSORS_INDEX).is_file():
        files = list(_shards(directory, SAFETENSORS_INDEX))
    else:
        return None
    names: set[str] = set()
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                names.update(f.keys())
        except SafetensorError as e:
            raise ValueError(f"{file} is not a readable safetensors file: {e}") from None
    return names


def hf_model_config(path: str | os.PathLike[str]) -> Any | None:
    """The attnlab config a Hugging Face directory describes, built from ``config.json`` and the
    weight names in the safetensors headers (nothing is loaded; ``None`` for ``.bin`` files).

    Raises:
        UnsupportedCheckpointError: for an unsupported family or option.
    """
    directory = Path(path)
    data = read_config(directory)
    family = family_for(data)
    names = weight_names(directory)
    if names is None:
        return None
    p = family.prefix + "."
    names = {n[len(p) :] if n.startswith(p) else n for n in names}
    return family.config_from_hf(HFConfig(data, family.name, _special_tokens(directory)), names)


def _special_tokens(directory: Path) -> dict[str, int]:
    """Special token text -> id from ``tokenizer.json``'s ``added_tokens`` (empty if absent)."""
    file = directory / "tokenizer.json"
    if not file.is_file():
        return {}
    try:  # a damaged file only loses the special ids here; loading the tokenizer names it
        added = read_json(file, what="tokenizer file", expect=dict).get("added_tokens", [])
        return {t["content"]: int(t["id"]) for t in added if t.get("special")}
    except (OSError, KeyError, TypeError, ValueError, AttributeError):
        return {}


def family_for(config: Mapping[str, Any]) -> HFFamily:
    """The :class:`HFFamily` of a Hugging Face ``config.json`` dict.

    Raises:
        UnsupportedCheckpointError: for a missing or unsupported ``model_type``.
    """
    model_type = config.get("model_type")
    if model_type is None:
        raise UnsupportedCheckpointError(
            f"config.json has no 'model_type'; supported: {', '.join(HF_FAMILIES.keys())}"
        )
    if model_type not in HF_FAMILIES:
        raise UnsupportedCheckpointError(
            f"Hugging Face model_type {model_type!r} is not supported by attnlab's mapper; "
            f"supported: {', '.join(HF_FAMILIES.keys())}"
        )
    return HF_FAMILIES.get(model_type)


def _strip_prefix(weights: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """Drop the base model prefix (``bert.``) of a checkpoint saved from a model with a head."""
    p = prefix + "."
    return {(k[len(p) :] if k.startswith(p) else k): v for k, v in weights.items()}


def load_hf(
    path: str | os.PathLike[str],
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    strict: bool = True,
    before_build: Callable[[Path, Any, Mapping[str, Tensor]], None] | None = None,
    verify: bool = True,
) -> nn.Module:
    """Load a Hugging Face checkpoint directory as the equivalent attnlab model (eval mode).

    Args:
        path: directory with ``config.json`` and weights.
        device: where to build the model. dtype: convert to this dtype (default float32).
        strict: raise on any missing/unexpected/misshapen tensor (``False``: warn and load the
            rest; the missing parameters keep their random initialisation).
        before_build: called with ``(directory, config, weights)`` once the attnlab config
            is known and before the model is built (:func:`attnlab.from_pretrained` refuses
            there a config claiming far more parameters than the weights hold).
        verify: refuse tensors of another kind than the parameter they fill (an int32 or bool
            tensor for a float parameter; float16/bfloat16/float64 are cast). ``False``: cast
            whatever they hold.

    Raises:
        FileNotFoundError: without ``config.json`` or weights.
        UnsupportedCheckpointError: for an unsupported family or option (the message says which).
        CheckpointMismatchError: listing the missing, unexpected and misshapen tensors (and,
            with ``verify``, those of another dtype kind).
    """
    directory = Path(path)
    data = read_config(directory)
    family = family_for(data)
    weights = _strip_prefix(read_weights(directory), family.prefix)
    hf_config = HFConfig(data, family.name, _special_tokens(directory))
    config = family.config_from_hf(hf_config, set(weights))
    if before_build is not None:
        before_build(directory, config, weights)
    model = build_model(config, device=device)
    what = f"{family.name} checkpoint {directory}"
    load_into(model, family.keymap(config), weights, what=what, strict=strict, dtypes=verify)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


def hf_family_of(model: nn.Module) -> tuple[HFFamily, dict[str, Any]]:
    """The family that can represent ``model`` and its ``config.json`` dict.

    Raises:
        UnsupportedCheckpointError: if no family fits (listing why each candidate does not).
    """
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError(f"{type(model).__name__} has no .config; cannot write config.json")
    refuse_unexported_options(config)
    reasons = []
    seen: set[str] = set()
    for key in HF_FAMILIES:
        family = HF_FAMILIES.get(key)
        if family.name in seen or not isinstance(model, family.model_class):
            continue
        seen.add(family.name)
        try:
            hf_config = family.config_to_hf(config)
            # the family must also have a tensor for every parameter (MoE FFNs, q/k/v-only biases)
            check_coverage(model, family.keymap(config), family.name)
            return family, hf_config
        except UnsupportedCheckpointError as e:
            reasons.append(str(e))
        except NotImplementedError:
            reasons.append(f"cannot express this model as {family.name}: its tensors differ")
    if not reasons:
        raise UnsupportedCheckpointError(
            f"no Hugging Face family for {type(model).__name__}; supported classes: "
            f"{sorted({HF_FAMILIES.get(k).model_class.__name__ for k in HF_FAMILIES})}"
        )
    raise UnsupportedCheckpointError(
        f"this {type(model).__name__} has no Hugging Face equivalent:\n  " + "\n  ".join(reasons)
    )


def save_hf(model: nn.Module, path: str | os.PathLike[str]) -> Path:
    """Write ``model`` as a Hugging Face checkpoint directory (``config.json`` +
    ``model.safetensors``) that ``transformers.AutoModel*.from_pretrained`` loads.

    The architecture is the family's model with its head (``BertForMaskedLM`` for a BERT with
    an MLM head, ``GPT2LMHeadModel``, ``LlamaForCausalLM``, ``BloomForCausalLM``,
    ``ViTForImageClassification``, ``MarianMTModel``, ``MixtralForCausalLM``,
    ``Qwen2MoeForCausalLM``), or the bare model without one. Each file
    is written to a temporary file in the directory and moved into place, so an interrupted
    save leaves the previous file, and a symlink in the directory is replaced, not followed.

    Returns:
        The directory.

    Raises:
        UnsupportedCheckpointError: if the model's config has no Hugging Face equivalent.
    """
    family, hf_config = hf_family_of(model)
    keymap = family.keymap(model.config)
    with torch.no_grad():
        tensors = keymap.to_theirs(model.state_dict())
    if hf_config["architectures"][0] != family.base_architecture:
        tensors = {
            (k if k.startswith(family.head_keys) else f"{family.prefix}.{k}"): v
            for k, v in tensors.items()
        }
    directory = Path(path)
    dtype = next(iter(tensors.values())).dtype
    hf_config["dtype"] = str(dtype).removeprefix("torch.")
    hf_config["torch_dtype"] = hf_config["dtype"]  # transformers 4's name
    # safetensors wants contiguous tensors that share no memory (tied ones are written once).
    arrays = {k: v.detach().contiguous().clone().cpu() for k, v in tensors.items()}
    text = json.dumps(hf_config, indent=2, sort_keys=True) + "\n"

    def write_weights(tmp: str) -> None:
        save_file(arrays, tmp, {"format": "pt"})  # looked up at call time (tests patch it)

    def write_config(tmp: str) -> None:
        Path(tmp).write_text(text, encoding="utf-8")

    write_files_together(directory, {SAFETENSORS_NAME: write_weights, CONFIG_NAME: write_config})
    logger.info("wrote %s checkpoint to %s", family.name, directory)
    return directory


__all__ = [
    "HF_FAMILIES",
    "family_for",
    "hf_family_of",
    "load_hf",
    "read_config",
    "read_weights",
    "save_hf",
]
