"""Helpers shared by every config dataclass: validation and (de)serialisation.

Configs are ``@dataclass(frozen=True, kw_only=True)``; they validate themselves in
``__post_init__`` with the checks below (``ValueError`` naming the bad value and the valid ones),
serialise with :func:`config_to_dict` and load with :func:`config_from_dict`, which rejects
unknown keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, TypeVar

C = TypeVar("C")


def check_choice(name: str, value: object, valid: Iterable[object]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``valid``."""
    valid = list(valid)
    if value not in valid:
        raise ValueError(f"{name}={value!r} is not valid; choose one of {valid}")


def check_positive(**values: float | int | None) -> None:
    """Raise ``ValueError`` for any value that is not > 0 (``None`` is skipped)."""
    for name, v in values.items():
        if v is not None and not v > 0:
            raise ValueError(f"{name} must be positive, got {v}")


def check_probability(**values: float | None) -> None:
    """Raise ``ValueError`` for any value outside [0, 1) (``None`` is skipped)."""
    for name, v in values.items():
        if v is not None and not 0.0 <= v < 1.0:
            raise ValueError(f"{name} must be in [0, 1), got {v}")


def config_to_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready dict of a config dataclass, with its ``model_type`` when it has one."""
    d = dataclasses.asdict(config)
    model_type = getattr(type(config), "model_type", None)
    if model_type is not None:
        d = {"model_type": model_type, **d}
    return d


def config_from_dict(cls: type[C], data: dict[str, Any]) -> C:
    """Build ``cls`` from a dict, ignoring a matching ``model_type`` and rejecting unknown keys.

    Raises:
        ValueError: naming unknown keys (and the valid ones) or a mismatched ``model_type``.
    """
    data = dict(data)
    model_type = data.pop("model_type", None)
    expected = getattr(cls, "model_type", None)
    if model_type is not None and expected is not None and model_type != expected:
        raise ValueError(f"config is for model_type {model_type!r}, not {expected!r}")
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys {unknown}; valid keys: {sorted(names)}")
    return cls(**data)
