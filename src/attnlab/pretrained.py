"""The model directory: ``save_pretrained`` / ``from_pretrained`` for attnlab's and Hugging Face's
layouts.

A model directory holds ``config.json`` + ``model.safetensors`` (and, beside them, whatever else
belongs to the model: ``tokenizer.json``, a translation model's ``translation.json``). Two
formats share that shape:

- attnlab's own: the config dataclass as JSON with its ``model_type`` (``"gpt"``, ``"bert"``,
  ``"vit"``, ``"transformer"``, ...), the state dict as is (a tied tensor stored once, §3.4);
  saving and loading are bitwise exact;
- Hugging Face's (:mod:`attnlab.interop.hf`): its own ``config.json`` (``model_type`` ``"bert"``,
  ``"gpt2"``, ``"llama"``, ...), translated and loaded through a key map.

A quantized model directory (``quantization.json`` beside them, :mod:`attnlab.transforms.quant_io`)
is attnlab's format with int8/int4 weights: :func:`from_pretrained` loads it as the quantized
model and :func:`save_pretrained` of a quantized model writes it.

``"bert"`` and ``"vit"`` are ``model_type`` values of both; a config whose keys are all fields of
attnlab's config class is attnlab's, anything else is Hugging Face's.

Before an attnlab model is built, the parameter count its config implies is compared with the
shapes in the safetensors header (:func:`check_param_count`; no tensor data is read), so a
``config.json`` edited to another size is refused instead of allocating the wrong model.

Weights are what the config says (:mod:`attnlab.integrity`): :func:`save_pretrained` records in
the safetensors metadata a digest of the config and a content digest of the tensors (names,
dtypes, shapes, a CRC-32 of each tensor's bytes), and loading refuses a ``config.json`` edited
after saving (another ``n_heads``, activation, ``norm_eps``: the same shapes, other logits) or
tensor data changed in place, naming the fields or tensors
(:class:`~attnlab.integrity.DigestMismatchError`). Directories written before these digests
existed have none and load as before. For every directory, attnlab's or Hugging Face's, a
floating parameter must come from a floating tensor: float16/bfloat16/float64 files load into the
float32 model (cast by the copy), int and bool tensors are refused naming the tensor and both
dtypes. ``from_pretrained(..., verify=False)`` skips both checks (``attnlab generate`` and
``attnlab quantize``: ``--no-verify``).

Every model class has the Hugging Face-style conveniences ``Model.from_pretrained(path)`` and
``model.save_pretrained(path)`` from its base class (:class:`attnlab.models.base.PretrainedModel`),
which call the two functions of this module.

A sharded or wrapped model (FSDP, DDP) is saved from its *full* state dict:
``save_pretrained(model, path, state_dict=full)``. Tied parameters are then written once, under the
name ``safetensors``' ``save_model`` would keep (the first in sorted order), so the file is the same
as a single-process run's; :func:`with_tied_names` adds the other names back before loading.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from attnlab.analysis.params import count_params, has_closed_form
from attnlab.config import config_to_dict
from attnlab.integrity import (
    KIND_RULE,
    DigestMismatchError,
    check_config,
    check_content,
    is_bound,
    kind_problems,
    save_bound,
)
from attnlab.interop.family import UnsupportedCheckpointError
from attnlab.interop.hf import (
    BIN_INDEX,
    BIN_NAME,
    HF_FAMILIES,
    SAFETENSORS_INDEX,
    load_hf,
    read_config,
)
from attnlab.interop.keymap import CheckpointMismatchError
from attnlab.io import json_text, read_json, write_files_together
from attnlab.models import MODEL_TYPES, build_model, config_from_json_dict
from attnlab.models.base import IMPLEMENTATIONS
from attnlab.transforms.quant_io import (
    is_quantized_dir,
    load_quantized,
    quantized_float_tensors,
    save_quantized,
)

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
# the weight files a model directory may hold: attnlab's, then Hugging Face's other layouts
WEIGHT_FILES = (WEIGHTS_NAME, SAFETENSORS_INDEX, BIN_NAME, BIN_INDEX)


def holds_weights(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a model directory: weights in one of :data:`WEIGHT_FILES`."""
    return any((Path(path) / name).is_file() for name in WEIGHT_FILES)


# -- tied parameters ----------------------------------------------------------------------------


def tied_parameter_names(model: nn.Module) -> list[list[str]]:
    """Groups (sorted, two or more names each) of the parameter names of ``model`` that share
    one parameter, e.g. ``[["lm_head.weight", "tok_embed.weight"]]`` for tied embeddings
    (§3.4)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return sorted(sorted(group) for group in names.values() if len(group) > 1)


def with_tied_names(state_dict: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
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


def _stored_tensors(
    model: nn.Module, state_dict: Mapping[str, Tensor] | None
) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The tensors :func:`save_pretrained` writes (``state_dict``, default ``model``'s own),
    each tied group once under the name ``safetensors``' ``save_model`` keeps (the first in
    sorted order), and ``{dropped name: kept name}`` for the metadata."""
    source = model.state_dict() if state_dict is None else state_dict
    tensors = {k: v.detach().contiguous() for k, v in source.items()}
    aliases: dict[str, str] = {}
    for group in tied_parameter_names(model):
        present = [n for n in group if n in tensors]
        for name in present[1:]:
            aliases[name] = present[0]
            del tensors[name]
    return tensors, aliases


# -- attnlab's format ---------------------------------------------------------------------------


def save_pretrained(
    model: nn.Module,
    path: str | os.PathLike[str],
    *,
    state_dict: Mapping[str, Tensor] | None = None,
) -> Path:
    """Write ``model`` (which must carry its ``config``) to the directory ``path`` in attnlab's
    format: ``model.safetensors`` + ``config.json``, both complete before either replaces an old
    file (a failed save leaves the previous model directory as it was).

    Args:
        model: a model built by :func:`attnlab.build_model` (has ``.config``).
        path: the directory; created if missing.
        state_dict: the weights to write instead of ``model``'s own (the full state dict of a
            sharded model, whose parameter names it must use).

    The safetensors metadata binds the two files (:mod:`attnlab.integrity`): the digest of the
    config, the content digest of the tensors, checked by :func:`from_pretrained`. A model
    quantized by :func:`attnlab.quantize` is written as a quantized model directory
    (:func:`attnlab.transforms.quant_io.save_quantized`).

    Returns:
        The directory.

    Raises:
        ValueError: if ``model`` has no ``config`` attribute (or is quantized and
            ``state_dict`` is given).
    """
    if getattr(model, "quantization_config", None) is not None:  # quantized: its own layout
        if state_dict is not None:
            raise ValueError("save_pretrained of a quantized model takes no state_dict")
        return save_quantized(model, path)
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError(f"{type(model).__name__} has no .config; cannot write config.json")
    config_text = json_text(config_to_dict(config))

    def write_config(tmp: str) -> None:
        Path(tmp).write_text(config_text, encoding="utf-8")

    def write_weights(tmp: str) -> None:
        tensors, aliases = _stored_tensors(model, state_dict)
        # save_file looked up at call time (tests patch it); the digests bind config.json
        save_bound(save_file, tensors, tmp, metadata=aliases, config_text=config_text)

    directory = Path(path)
    write_files_together(directory, {WEIGHTS_NAME: write_weights, CONFIG_NAME: write_config})
    return directory


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


def load_config(path: str | os.PathLike[str]) -> Any:
    """The attnlab model config stored in the model directory ``path``.

    Raises:
        FileNotFoundError: if ``path`` or its ``config.json`` is missing.
        ValueError: for invalid JSON, a missing/unknown ``model_type``, unknown keys or values.
        TypeError: for a field of the wrong type.
    """
    return config_from_json_dict(read_config(path))


# batch-norm statistics are buffers, not parameters: count_params leaves them out
BUFFER_SUFFIXES = (".running_mean", ".running_var", ".num_batches_tracked")


def safetensors_numel(file: str | os.PathLike[str], *, skip: tuple[str, ...] = ()) -> int:
    """Elements in a safetensors file, from its header's shapes (no tensor data is read),
    leaving out the tensors whose names end with one of ``skip``.

    Raises:
        FileNotFoundError: if ``file`` does not exist.
        ValueError: if it is not a safetensors file (naming it).
    """
    if not Path(file).is_file():
        raise FileNotFoundError(f"no such weights file: {file}")
    total = 0
    try:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if not key.endswith(skip):
                    total += math.prod(f.get_slice(key).get_shape())
    except SafetensorError as e:
        raise ValueError(f"{file} is not a readable safetensors file: {e}") from None
    return total


def implied_params(config: Any) -> int:
    """Parameters of the model ``config`` describes: the closed form where the analysis has
    one, else counted on a model built on the ``meta`` device (nothing is allocated)."""
    if has_closed_form(config):
        return count_params(config)
    return count_params(build_model(config, device="meta"))


def check_param_count(path: str | os.PathLike[str], config: Any) -> None:
    """Check that an attnlab model directory's ``model.safetensors`` holds exactly the parameters
    its config implies (:func:`attnlab.analysis.count_params`, closed form), before anything is
    built: an edited ``config.json`` (another ``d_model``, more layers) is refused with both
    counts instead of allocating a model of the wrong size.

    Raises:
        FileNotFoundError: without ``model.safetensors``.
        CheckpointMismatchError: when the counts differ.
    """
    file = Path(path) / WEIGHTS_NAME
    stored, implied = safetensors_numel(file, skip=BUFFER_SUFFIXES), implied_params(config)
    if stored != implied:
        fields = ("d_model", "n_heads", "n_layers", "d_ff", "vocab_size")
        sizes = ", ".join(f"{k}={getattr(config, k)}" for k in fields if hasattr(config, k))
        raise CheckpointMismatchError(
            f"{Path(path) / CONFIG_NAME} implies {implied:,} parameters ({sizes}) but {file} "
            f"holds {stored:,}: the config does not describe these weights"
        )


def _read_safetensors(file: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Every tensor of ``file`` (one name per shared tensor, as stored) and its metadata.

    Raises:
        FileNotFoundError: without ``file``. ValueError: for a truncated or foreign file.
    """
    if not file.is_file():
        raise FileNotFoundError(f"no {file.name} in {file.parent}")
    try:
        with safe_open(str(file), framework="pt") as f:
            metadata = dict(f.metadata() or {})
        return load_file(file), metadata
    except (SafetensorError, OSError, RuntimeError) as e:
        raise ValueError(f"{file} is not a readable safetensors file: {e}") from None


def check_weight_kinds(
    file: str | os.PathLike[str], tensors: Mapping[str, Tensor], model: nn.Module
) -> None:
    """Refuse tensors of another kind than ``model``'s parameters and buffers of the same name
    (an int32 or bool tensor for a float parameter; :func:`attnlab.integrity.kind_problems`).

    Raises:
        CheckpointMismatchError: naming each such tensor and both dtypes.
    """
    expected = {k: v.dtype for k, v in model.state_dict().items()}
    problems = list(kind_problems(expected, {k: v.dtype for k, v in tensors.items()}).values())
    if problems:
        more = f" (and {len(problems) - 4} more)" if len(problems) > 4 else ""
        raise CheckpointMismatchError(
            f"{file} does not hold the weights of this {type(model).__name__}: "
            f"{'; '.join(problems[:4])}{more}: {KIND_RULE}. from_pretrained(..., verify=False) "
            "(attnlab generate/quantize --no-verify) casts them anyway"
        )


def read_model_weights(
    path: str | os.PathLike[str], model: nn.Module, *, verify: bool = True
) -> dict[str, Tensor]:
    """The state dict in an attnlab model directory's ``model.safetensors`` for ``model`` (the
    tied names added back), checked unless ``verify`` is false: the tensors' dtype kinds against
    ``model``'s (:func:`check_weight_kinds`), ``config.json`` against the config digest, the
    names against ``model``'s, the tensors against the content digest
    (:mod:`attnlab.integrity`; a directory written before the digests existed has none to
    check).

    Raises:
        FileNotFoundError: without ``model.safetensors``. ValueError: for an unreadable file.
        CheckpointMismatchError: for tensors of another kind, or other names than ``model``'s.
        DigestMismatchError: (a ValueError) for a config or tensors other than those saved.
    """
    directory = Path(path)
    file = directory / WEIGHTS_NAME
    tensors, metadata = _read_safetensors(file)
    try:
        state = with_tied_names(tensors, model)
    except KeyError as e:
        raise CheckpointMismatchError(f"{file} does not load into {type(model).__name__}: "
                                      f"{e.args[0]}") from None  # fmt: skip
    if not verify:
        return state
    check_weight_kinds(file, tensors, model)
    if not is_bound(metadata):  # written before the digests existed: nothing to check
        return state
    config_file = directory / CONFIG_NAME
    check_config(file, metadata, config_file, read_json(config_file, what="model config",
                                                        expect=dict))  # fmt: skip
    # the per-tensor CRCs are in name order: name the changed tensors only for the saved names
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise CheckpointMismatchError(
            f"{file} does not load into {type(model).__name__}: missing {missing[:8]}, "
            f"unexpected {unexpected[:8]}"
        )
    check_content(file, metadata, tensors)
    return state


def load_weights(
    model: nn.Module, path: str | os.PathLike[str], *, verify: bool = True
) -> nn.Module:
    """Load an attnlab model directory's weights into ``model`` in place, strictly, checked as
    :func:`read_model_weights` says; returns ``model``.

    Raises:
        FileNotFoundError, ValueError, CheckpointMismatchError, DigestMismatchError: as
        :func:`read_model_weights`, and for names or shapes ``model`` does not have.
    """
    state = read_model_weights(path, model, verify=verify)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise CheckpointMismatchError(
            f"{Path(path) / WEIGHTS_NAME} does not load into {type(model).__name__}: {e}"
        ) from None
    return model


def load_attnlab(
    path: str | os.PathLike[str], *, device: torch.device | str = "cpu", verify: bool = True
) -> nn.Module:
    """Rebuild the attnlab model saved in ``path`` and load its weights (eval mode), checked
    unless ``verify`` is false (:func:`read_model_weights`: dtype kinds, the config and content
    digests of directories saved with them; older directories load as before).

    Raises:
        FileNotFoundError: if a file is missing. ValueError: for a bad ``config.json``, a
        truncated or foreign weights file, weights that the config does not describe, or (with
        ``verify``) a config or tensors other than those saved
        (:class:`~attnlab.integrity.DigestMismatchError`).
    """
    weights = Path(path) / WEIGHTS_NAME
    if not weights.is_file():
        raise FileNotFoundError(f"no {WEIGHTS_NAME} in {path}")
    config = load_config(path)
    check_param_count(path, config)
    model = build_model(config, device=device)
    load_weights(model, path, verify=verify)
    return model.eval()


def check_claimed_size(directory: Path, config: Any, weights: Mapping[str, Tensor]) -> None:
    """Refuse a ``config.json`` claiming far more parameters than its weight files hold (a
    million layers or a huge hidden size beside a small file), before the model is built.

    Hugging Face files may hold extra buffers or omit a tied or unused tensor, so the check
    allows twice the stored count plus 2**20 elements; a config that passes but does not
    describe the weights is refused later by the strict key/shape match.

    Raises:
        CheckpointMismatchError: naming both counts and the config's sizes.
    """
    if not has_closed_form(config):
        return
    stored = sum(t.numel() for t in weights.values())
    implied = count_params(config)
    if implied > 2 * stored + (1 << 20):
        fields = ("d_model", "n_heads", "n_layers", "d_ff", "vocab_size", "max_seq_len")
        sizes = ", ".join(f"{k}={getattr(config, k)}" for k in fields if hasattr(config, k))
        raise CheckpointMismatchError(
            f"{directory / 'config.json'} describes a model of {implied:,} parameters "
            f"({sizes}) but the weight files hold {stored:,}: the config does not describe "
            "these weights (nothing was built)"
        )


# Higher floors teach from_pretrained more directory layouts without this module importing them:
# each resolver maps a directory that holds no config.json to the model directory inside it, or
# returns None (attnlab.training.rundir: a run directory -> its newest complete checkpoint).
DIRECTORY_RESOLVERS: list[Callable[[Path], Path | None]] = []


def resolve_directory(path: str | os.PathLike[str]) -> Path:
    """``path``, or the model directory a registered resolver finds in it (a run directory's
    newest checkpoint) when ``path`` itself holds no ``config.json``."""
    p = Path(path)
    if p.is_dir() and not (p / CONFIG_NAME).is_file():
        for resolve in DIRECTORY_RESOLVERS:
            found = resolve(p)
            if found is not None:
                return found
    return p


def from_pretrained(
    path: str | os.PathLike[str],
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    strict: bool = True,
    allow_non_finite: bool = False,
    verify: bool = True,
) -> nn.Module:
    """Load a model directory, attnlab's or Hugging Face's, as an attnlab model (eval mode).

    attnlab reads local directories only: a Hugging Face Hub id such as ``"gpt2"`` must first be
    downloaded to a directory (the error message says how). The returned model carries its
    config (``model.config``).

    Args:
        path: a directory with ``config.json`` and weights (a quantized one loads as the
            quantized model), or a run directory of ``attnlab train`` (its newest complete
            checkpoint).
        device: where to build the model.
        dtype: convert the parameters to this dtype (default: as built, float32).
        strict: Hugging Face checkpoints only: with ``False``, missing/unexpected tensors are
            logged instead of raised. attnlab checkpoints always load strictly.
        allow_non_finite: load parameters holding NaN or infinite values (refused by
            default, naming the tensor).
        verify: check that the weights are what the config says (default): for every
            directory, a floating parameter must come from a floating tensor (float16,
            bfloat16, float64 files are cast; int and bool tensors are refused); for attnlab's
            and quantized directories saved with digests (:mod:`attnlab.integrity`),
            ``config.json`` and the tensor data must be those saved. Directories written
            before the digests existed have none and load as before. ``False`` loads whatever
            the files hold (cast), as before these checks.

    Raises:
        FileNotFoundError: for a missing directory, ``config.json`` or weights file.
        ValueError: for an unknown ``model_type``, an unsupported Hugging Face family or
            option (:class:`~attnlab.interop.family.UnsupportedCheckpointError`), or tensors
            that do not match (:class:`~attnlab.interop.keymap.CheckpointMismatchError`, naming
            every key and expected shape; for attnlab's format, a parameter count in the
            safetensors header other than the config's, checked before the model is built;
            a ``dtype`` for a quantized model directory; int or bool tensors for floating
            parameters).
        DigestMismatchError: (a ValueError) for a ``config.json`` edited after saving, or
            tensor data changed in place (naming the fields or tensors; ``verify=False``).
        NonFiniteWeightsError: (a ValueError) for parameters holding NaN or inf values.
    """
    path = resolve_directory(path)
    if is_quantized_dir(path):  # attnlab's format + quantization.json
        if dtype is not None:
            raise ValueError(f"{path} holds a quantized model; dtype={dtype} cannot convert it")
        model = load_quantized(path, device=device, verify=verify)
        if not allow_non_finite:
            check_finite_parameters(model, path)
        return model
    data = read_config(path)
    model_type = data.get("model_type")
    if model_type not in MODEL_TYPES and model_type not in HF_FAMILIES:
        raise UnsupportedCheckpointError(
            f"{Path(path) / CONFIG_NAME}: model_type {model_type!r} is neither an attnlab model "
            f"({', '.join(MODEL_TYPES.keys())}) nor a supported Hugging Face family "
            f"({', '.join(HF_FAMILIES.keys())})"
        )
    if not is_attnlab_config(data):
        model = load_hf(path, device=device, strict=strict, before_build=check_claimed_size,
                        verify=verify)  # fmt: skip
    else:
        model = load_attnlab(path, device=device, verify=verify)
    if not allow_non_finite:
        check_finite_parameters(model, path)
    return model.to(dtype) if dtype is not None else model


class NonFiniteWeightsError(ValueError):
    """A checkpoint whose parameters hold NaN or infinite values."""


def check_finite_parameters(model: nn.Module, where: str | os.PathLike[str]) -> None:
    """Refuse a model loaded from ``where`` whose parameters hold NaN or infinite values (it
    would decode arbitrary tokens), naming the first such tensor and how many values are bad.

    Raises:
        NonFiniteWeightsError: naming the tensor.
    """
    for name, p in [*model.named_parameters(), *quantized_float_tensors(model)]:
        if p.device.type == "meta" or not p.is_floating_point():
            continue
        finite = torch.isfinite(p)
        if not bool(finite.all()):
            bad = int((~finite).sum())
            kind = "NaN" if bool(torch.isnan(p).any()) else "infinite"
            raise NonFiniteWeightsError(
                f"{where}: parameter {name} {tuple(p.shape)} holds {bad:,} {kind} value"
                f"{'s' * (bad > 1)}; the checkpoint is damaged (from_pretrained(..., "
                "allow_non_finite=True) loads it anyway)"
            )


# -- the conveniences of every model class --------------------------------------------------------

# ``Model.from_pretrained`` and ``model.save_pretrained`` (attnlab.models.base) call these.
IMPLEMENTATIONS.add("from_pretrained", from_pretrained)
IMPLEMENTATIONS.add("save_pretrained", save_pretrained)


def attach_methods(model_cls: type[nn.Module]) -> None:
    """Deprecated, does nothing: every model class has ``from_pretrained`` and
    ``save_pretrained`` from :class:`attnlab.models.base.PretrainedModel`; derive from it."""
    warnings.warn(
        "attnlab.pretrained.attach_methods is deprecated and does nothing: model classes get "
        "from_pretrained/save_pretrained by deriving from attnlab.models.base.PretrainedModel",
        DeprecationWarning,
        stacklevel=2,
    )


__all__ = [
    "BUFFER_SUFFIXES",
    "CONFIG_NAME",
    "WEIGHTS_NAME",
    "DigestMismatchError",
    "attach_methods",
    "check_param_count",
    "check_weight_kinds",
    "from_pretrained",
    "is_attnlab_config",
    "load_attnlab",
    "load_config",
    "load_weights",
    "read_model_weights",
    "safetensors_numel",
    "save_pretrained",
    "tied_parameter_names",
    "with_tied_names",
]
