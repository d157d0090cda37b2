"""What one Hugging Face model family needs: config translation both ways and a key map.

Each ``hf_*.py`` module defines one :class:`HFFamily`; :mod:`attnlab.interop.hf` keeps them in a
registry keyed by Hugging Face's ``model_type``. The helpers here read a ``config.json`` dict
(:class:`HFConfig`) and translate activations and special token ids.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from attnlab.interop.keymap import KeyMap
from attnlab.layers.attention_backends import FULL_ATTENTION_BACKENDS

# Hugging Face ``hidden_act`` / ``activation_function`` -> attnlab activation, and back.
HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
    "relu2": "relu2",  # transformers' ReLUSquaredActivation (Primer)
}
TO_HF_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu",
                     "relu2": "relu2"}  # fmt: skip
# Options no exporter here carries (their Hugging Face families, Qwen3's QK-norm or Gemma 2's
# soft-capping, have no key map in attnlab), with the value that means "off": a model with one
# on is refused by name rather than written without it.
NO_HF_EQUIVALENT: dict[str, Any] = {
    "qk_norm": False,
    "logit_softcap": None,
    "value_embeddings": 0,
    "x0_skip": False,
}


class UnsupportedCheckpointError(ValueError):
    """A checkpoint (or an attnlab config, on export) uses an option the mapping cannot express."""


_REQUIRED = object()


class HFConfig:
    """Read access to a Hugging Face ``config.json`` dict with family-aware error messages.

    ``tokens`` maps special tokens ("[MASK]") to ids when the directory has a ``tokenizer.json``.
    """

    def __init__(
        self, data: Mapping[str, Any], family: str, tokens: Mapping[str, int] | None = None
    ) -> None:
        self.data = dict(data)
        self.family = family
        self.tokens = dict(tokens or {})  # special token text -> id, from tokenizer.json

    def get(self, *names: str, default: Any = _REQUIRED) -> Any:
        """The first of ``names`` present and not null (older spellings after the first).

        Raises:
            ValueError: if none is present and no ``default`` is given.
        """
        for n in names:
            if self.data.get(n) is not None:
                return self.data[n]
        if default is _REQUIRED:
            raise ValueError(f"{self.family} config.json has no {names[0]!r}")
        return default

    def expect(self, name: str, supported: Collection[Any], default: Any = None) -> None:
        """Raise unless option ``name`` (``default`` when absent) is one of ``supported``.

        Raises:
            UnsupportedCheckpointError: naming the option, its value and the supported values.
        """
        value = self.data.get(name, default)
        if value not in supported:
            raise UnsupportedCheckpointError(
                f"{self.family} option {name}={value!r} is not supported by attnlab "
                f"(supported: {sorted(map(repr, supported))})"
            )

    def activation(self, *names: str, default: Any = _REQUIRED) -> str:
        """The attnlab activation for the activation option ``names``.

        Raises:
            UnsupportedCheckpointError: for an activation attnlab does not have.
        """
        act = self.get(*names, default=default)
        if act not in HF_ACTIVATIONS:
            raise UnsupportedCheckpointError(
                f"{self.family} activation {act!r} is not supported by attnlab "
                f"(supported: {sorted(HF_ACTIVATIONS)})"
            )
        return HF_ACTIVATIONS[act]

    def token_id(self, name: str, vocab_size: int) -> int | None:
        """A special token id, or ``None`` when absent or outside ``[0, vocab_size)``."""
        value = self.data.get(name)
        if isinstance(value, list):  # some configs list several end-of-sequence ids
            value = value[0] if value else None
        return value if isinstance(value, int) and 0 <= value < vocab_size else None


def require(condition: bool, family: str, what: str) -> None:
    """Raise :class:`UnsupportedCheckpointError` ``"<family> ... <what>"`` unless ``condition``."""
    if not condition:
        raise UnsupportedCheckpointError(f"cannot express this model as {family}: {what}")


def refuse_unexported_options(config: Any) -> None:
    """Raise when ``config`` turns on an option of :data:`NO_HF_EQUIVALENT`, or attends
    through a backend outside :data:`~attnlab.layers.FULL_ATTENTION_BACKENDS` (a window, a
    sparse pattern, LSH buckets, linear attention: another function than the exported one's).

    Raises:
        UnsupportedCheckpointError: naming the options and their values.
    """
    on = [
        f"{name}={getattr(config, name)!r}"
        for name, off in NO_HF_EQUIVALENT.items()
        if getattr(config, name, off) != off
    ]
    # a window, a sparse pattern, LSH buckets or linear attention is another function: every
    # exported family attends to every key
    used = [
        getattr(config, "attn_backend", "sdpa"),
        *(getattr(config, "attn_layer_backends", None) or ()),
    ]
    restricted = [b for b in dict.fromkeys(used) if b not in FULL_ATTENTION_BACKENDS]
    if restricted:
        on.append(f"attention backend {'/'.join(map(repr, restricted))}")
    if on:
        raise UnsupportedCheckpointError(
            f"this model has no Hugging Face equivalent in attnlab's exporters: {', '.join(on)} "
            "(no exported family has the option; the checkpoint would silently lose it)"
        )


def hf_activation(activation: str, family: str) -> str:
    """The Hugging Face name of an attnlab (non-gated) activation.

    Raises:
        UnsupportedCheckpointError: for an activation with no Hugging Face name.
    """
    require(
        activation in TO_HF_ACTIVATIONS,
        family,
        f"activation {activation!r} (supported: {sorted(TO_HF_ACTIVATIONS)})",
    )
    return TO_HF_ACTIVATIONS[activation]


@dataclass(frozen=True)
class HFFamily:
    """A Hugging Face model family and how attnlab maps it.

    Attributes:
        name: display name ("GPT-2"). model_types: Hugging Face ``model_type`` values.
        prefix: the base model's key prefix in checkpoints of models with a head ("bert").
        head_keys: key prefixes that belong to heads, outside ``prefix``.
        base_architecture: the class name of the headless model ("BertModel").
        model_class: the attnlab model class it maps to.
        config_from_hf: ``(config, checkpoint keys without prefix) -> attnlab config``; the
            keys tell which heads are present.
        config_to_hf: attnlab config -> ``config.json`` dict (with ``architectures``); raises
            :class:`UnsupportedCheckpointError` when the config has no equivalent.
        keymap: attnlab config -> :class:`KeyMap` (keys without ``prefix``).
    """

    name: str
    model_types: tuple[str, ...]
    prefix: str
    head_keys: tuple[str, ...]
    base_architecture: str
    model_class: type[nn.Module]
    config_from_hf: Callable[[HFConfig, Collection[str]], Any]
    config_to_hf: Callable[[Any], dict[str, Any]]
    keymap: Callable[[Any], KeyMap]


__all__ = [
    "HF_ACTIVATIONS",
    "NO_HF_EQUIVALENT",
    "HFConfig",
    "HFFamily",
    "UnsupportedCheckpointError",
    "hf_activation",
    "refuse_unexported_options",
    "require",
]
