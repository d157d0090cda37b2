"""attnlab's models: one file per family, each with its Config dataclass, its module, its PRESETS
and its declaration (:class:`~attnlab.models.family.Family`, registered when the file is imported).

``MODEL_TYPES`` maps a config's ``model_type`` to ``(ConfigClass, ModelClass)`` and ``PRESETS``
holds every named configuration, both for every registered family (live views of
:data:`~attnlab.models.family.FAMILIES`); :func:`build_model` builds a preset or a config.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from attnlab.config import config_from_dict

# importing each family's module registers its family (attnlab.models.family)
from attnlab.models.bert import BERT, BERTConfig, BERTOutput, mask_tokens, mask_tokens_for
from attnlab.models.cct import CCT, CCTConfig
from attnlab.models.cnn import CNNClassifier, CNNConfig
from attnlab.models.family import (
    FAMILIES,
    Family,
    Kind,
    families,
    family_of,
    find_family,
    register_family,
)
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.mamba import MambaConfig, MambaLM
from attnlab.models.resnet import ResNet, ResNetConfig
from attnlab.models.rnn import RNNLM, RNNConfig
from attnlab.models.rnn_seq2seq import RNNSeq2Seq, RNNSeq2SeqConfig
from attnlab.models.transformer import (
    Decoder,
    Encoder,
    EncoderDecoderTransformer,
    TransformerConfig,
)
from attnlab.models.vit import ViT, ViTConfig


class _ModelTypes:
    """``model_type`` -> ``(ConfigClass, ModelClass)`` of every registered family (a live view of
    :data:`~attnlab.models.family.FAMILIES`, so a family registered later appears too)."""

    name = "model type"

    def get(self, key: str) -> tuple[type[Any], type[nn.Module]]:
        """The classes of ``key``; ``ValueError`` naming the valid keys for an unknown one."""
        if key not in FAMILIES:
            raise ValueError(f"unknown model type {key!r}; valid: {', '.join(FAMILIES.keys())}")
        family = FAMILIES.get(key)
        return family.config, family.model

    def keys(self) -> list[str]:
        return FAMILIES.keys()

    def __contains__(self, key: object) -> bool:
        return key in FAMILIES

    def __iter__(self) -> Iterator[str]:
        return iter(FAMILIES.keys())

    def __repr__(self) -> str:
        return f"MODEL_TYPES({self.keys()})"


class _Presets(Mapping[str, Any]):
    """Every registered family's presets by name (a live, read-only view)."""

    def _all(self) -> dict[str, Any]:
        return {name: c for f in families() for name, c in f.presets.items()}

    def __getitem__(self, key: str) -> Any:
        for f in families():
            if key in f.presets:
                return f.presets[key]
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return sum(len(f.presets) for f in families())

    def __repr__(self) -> str:
        return f"PRESETS({sorted(self)})"


MODEL_TYPES = _ModelTypes()
PRESETS: Mapping[str, Any] = _Presets()


def config_for(name: str, **overrides: Any) -> Any:
    """The preset config ``name`` with ``overrides`` applied (``dataclasses.replace``).

    Raises:
        ValueError: for an unknown preset (listing the valid ones) or an unknown override.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid: {', '.join(sorted(PRESETS))}")
    return _replace(PRESETS[name], repr(name), overrides)


def _replace(config: Any, what: str, overrides: dict[str, Any]) -> Any:
    """``dataclasses.replace`` that names unknown keys (and the valid ones) in a ValueError."""
    fields = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown config keys {unknown} for {what}; valid: {sorted(fields)}")
    return dataclasses.replace(config, **overrides)


def model_class_for(config: Any) -> type[nn.Module]:
    """The model class that builds ``config`` (looked up by its ``model_type``).

    Raises:
        ValueError: if ``config`` is not a model config.
    """
    family = None if isinstance(config, type) else find_family(config)
    if family is None or not isinstance(config, family.config):
        raise ValueError(
            f"{type(config).__name__} is not a model config; expected one of "
            f"{', '.join(f.config.__name__ for f in families())}"
        )
    return family.model


def build_model(
    name_or_config: Any, *, device: torch.device | str | None = None, **overrides: Any
) -> nn.Module:
    """Build a model from a preset name (with overrides) or from a config object.

    Args:
        name_or_config: a key of :data:`PRESETS` or a config dataclass instance.
        device: where to create the parameters (``"meta"`` builds without allocating).
        overrides: config fields to replace.

    Raises:
        ValueError: for an unknown preset or override key (listing the valid ones), or an
            object that is not a model config.
    """
    if isinstance(name_or_config, str):
        config = config_for(name_or_config, **overrides)
    else:
        model_class_for(name_or_config)  # raises for an object that is not a model config
        what = type(name_or_config).__name__
        config = _replace(name_or_config, what, overrides) if overrides else name_or_config
    cls = model_class_for(config)
    with torch.device(device) if device is not None else contextlib.nullcontext():
        return cls(config)


def config_from_json_dict(data: dict[str, Any]) -> Any:
    """Rebuild any model config from its :func:`attnlab.config.config_to_dict` form.

    Raises:
        ValueError: for a missing/unknown ``model_type`` or unknown keys.
    """
    if "model_type" not in data:
        raise ValueError(f"config has no 'model_type'; valid: {', '.join(MODEL_TYPES.keys())}")
    config_cls, _ = MODEL_TYPES.get(data["model_type"])
    return config_from_dict(config_cls, data)


__all__ = [
    "BERT",
    "CCT",
    "FAMILIES",
    "GPT",
    "MODEL_TYPES",
    "PRESETS",
    "RNNLM",
    "BERTConfig",
    "BERTOutput",
    "CCTConfig",
    "CNNClassifier",
    "CNNConfig",
    "Decoder",
    "Encoder",
    "EncoderDecoderTransformer",
    "Family",
    "GPTConfig",
    "Kind",
    "MambaConfig",
    "MambaLM",
    "RNNConfig",
    "RNNSeq2Seq",
    "RNNSeq2SeqConfig",
    "ResNet",
    "ResNetConfig",
    "TransformerConfig",
    "ViT",
    "ViTConfig",
    "build_model",
    "config_for",
    "config_from_json_dict",
    "families",
    "family_of",
    "find_family",
    "mask_tokens",
    "mask_tokens_for",
    "model_class_for",
    "register_family",
]
