"""attnlab's models: one file per model, each with its Config dataclass and PRESETS.

``MODEL_TYPES`` maps a config's ``model_type`` to ``(ConfigClass, ModelClass)``; ``PRESETS`` holds
every named configuration; :func:`build_model` builds either.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch
from torch import nn

from attnlab.config import config_from_dict
from attnlab.models import bert, cct, gpt, mamba, resnet, rnn, transformer, vit
from attnlab.models.bert import BERT, BERTConfig, BERTOutput, mask_tokens, mask_tokens_for
from attnlab.models.cct import CCT, CCTConfig
from attnlab.models.cnn import CNNClassifier, CNNConfig
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.mamba import MambaConfig, MambaLM
from attnlab.models.resnet import ResNet, ResNetConfig
from attnlab.models.rnn import RNNLM, RNNConfig
from attnlab.models.transformer import (
    Decoder,
    Encoder,
    EncoderDecoderTransformer,
    TransformerConfig,
)
from attnlab.models.vit import ViT, ViTConfig
from attnlab.registry import Registry

MODEL_TYPES: Registry[tuple[type[Any], type[nn.Module]]] = Registry("model type")
MODEL_TYPES.add("transformer", (TransformerConfig, EncoderDecoderTransformer))
MODEL_TYPES.add("gpt", (GPTConfig, GPT))
MODEL_TYPES.add("bert", (BERTConfig, BERT))
MODEL_TYPES.add("vit", (ViTConfig, ViT))
MODEL_TYPES.add("cnn", (CNNConfig, CNNClassifier))
MODEL_TYPES.add("cct", (CCTConfig, CCT))
MODEL_TYPES.add("resnet", (ResNetConfig, ResNet))
MODEL_TYPES.add("mamba", (MambaConfig, MambaLM))
MODEL_TYPES.add("rnn", (RNNConfig, RNNLM))

PRESETS: dict[str, Any] = {**transformer.PRESETS}
for _module in (gpt, bert, vit, cct, resnet, mamba, rnn):
    _clash = sorted(set(PRESETS) & set(_module.PRESETS))
    if _clash:
        raise ValueError(f"preset names defined twice: {_clash}")
    PRESETS.update(_module.PRESETS)


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
    model_type = getattr(type(config), "model_type", None)
    if not isinstance(model_type, str):
        raise ValueError(
            f"{type(config).__name__} is not a model config; expected one of "
            f"{', '.join(c.__name__ for c, _ in (MODEL_TYPES.get(k) for k in MODEL_TYPES))}"
        )
    _, model_cls = MODEL_TYPES.get(model_type)
    return model_cls


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
    "GPTConfig",
    "MambaConfig",
    "MambaLM",
    "RNNConfig",
    "ResNet",
    "ResNetConfig",
    "TransformerConfig",
    "ViT",
    "ViTConfig",
    "build_model",
    "config_for",
    "config_from_json_dict",
    "mask_tokens",
    "mask_tokens_for",
    "model_class_for",
]
