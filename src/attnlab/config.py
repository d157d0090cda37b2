"""Helpers shared by every config dataclass: validation and (de)serialisation.

Configs are ``@dataclass(frozen=True, kw_only=True)`` classes deriving from :class:`Config`. Its
``__post_init__`` checks every field against its annotation first (:func:`check_field_types`:
an ``int`` must be an integer, not ``True`` or ``2.0`` or ``"64"``; a ``float`` a finite number;
a ``bool`` ``true`` or ``false``; a ``Literal`` one of its values; ``None`` only where the
annotation allows it; a JSON list becomes a tuple; a ``dict`` field takes a mapping, copied),
then runs the class's own :meth:`Config.validate` (ranges, cross-field rules). Errors are
``TypeError``/``ValueError`` naming the field, the bad value and what was expected (never an
``assert``). Configs serialise with :func:`config_to_dict` and load with
:func:`config_from_dict`, which rejects unknown keys.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Iterable
from typing import Any, ClassVar, Literal, TypeVar, Union

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


def check_finite(**values: float | None) -> None:
    """Raise ``ValueError`` for any value that is NaN or infinite (``None`` is skipped)."""
    for name, v in values.items():
        if v is not None and not math.isfinite(v):
            raise ValueError(f"{name} must be a finite number, got {v}")


SEED_RANGE = (0, 2**64 - 1)  # what torch.Generator.manual_seed takes (negatives wrap around)


def check_seed(**values: int | None) -> None:
    """Raise ``ValueError`` for a seed outside ``[0, 2**64 - 1]`` (``None`` is skipped): torch
    refuses larger ones with "Overflow when unpacking long", naming nothing."""
    lo, hi = SEED_RANGE
    for name, v in values.items():
        if v is not None and not lo <= v <= hi:
            raise ValueError(f"{name} must be an integer in [0, 2**64 - 1], got {v}")


# -- annotation-driven field checks ---------------------------------------------------------------


def field_hints(cls: Any) -> dict[str, Any]:
    """The resolved annotations of the dataclass ``cls``'s fields (``ClassVar``s excluded)."""
    return _field_hints(cls)


@functools.cache
def _field_hints(cls: Any) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _options(hint: Any) -> tuple[list[Any], bool]:
    """The non-``None`` alternatives of a (possibly optional) annotation, and whether ``None``
    is allowed."""
    origin = typing.get_origin(hint)
    if origin is Union or origin is types.UnionType:
        args = typing.get_args(hint)
        return [a for a in args if a is not type(None)], type(None) in args
    return [hint], hint is type(None)


def _describe(hint: Any) -> str:
    if hint is int:
        return "an integer"
    if hint is float:
        return "a number"
    if hint is bool:
        return "true or false"
    if hint is str:
        return "a string"
    if typing.get_origin(hint) is Literal:
        return "one of " + repr(list(typing.get_args(hint)))
    if typing.get_origin(hint) is tuple:
        return "a list"
    if typing.get_origin(hint) is dict:
        return "a mapping (a JSON object)"
    return getattr(hint, "__name__", str(hint))


def _coerce(name: str, value: Any, hint: Any) -> tuple[bool, Any]:
    """``(matches, value)``: whether ``value`` is of the type ``hint`` (a list becomes a tuple)."""
    if hint is Any:
        return True, value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if ok and not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value}")
        return ok, value
    if hint is str:
        return isinstance(value, str), value
    origin = typing.get_origin(hint)
    if origin is Literal:
        choices = typing.get_args(hint)
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            if value not in choices:
                raise ValueError(f"{name}={value!r} is not valid; choose one of {list(choices)}")
            return True, value
        return False, value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            return False, value
        args = typing.get_args(hint)
        fixed = bool(args) and Ellipsis not in args
        if fixed and len(value) != len(args):
            raise ValueError(f"{name} must have {len(args)} items, got {len(value)}: {value!r}")
        items = []
        for i, item in enumerate(value):
            element = args[i] if fixed else (args[0] if args else Any)
            ok, item = _coerce(f"{name}[{i}]", item, element)
            if not ok:
                raise TypeError(f"{name}[{i}] must be {_describe(element)}, got {item!r}")
            items.append(item)
        return True, tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            return False, value
        key_hint, value_hint = typing.get_args(hint) or (Any, Any)
        entries = {}
        for key, item in value.items():
            ok, key = _coerce(f"{name} key", key, key_hint)
            if not ok:
                raise TypeError(f"{name} key {key!r} must be {_describe(key_hint)}")
            ok, item = _coerce(f"{name}[{key!r}]", item, value_hint)
            if not ok:
                raise TypeError(f"{name}[{key!r}] must be {_describe(value_hint)}, got {item!r}")
            entries[key] = item
        return True, entries  # a copy: the caller's mapping cannot change the config later
    if isinstance(hint, type):
        return isinstance(value, hint), value
    return True, value  # an annotation this checker does not know: left to validate()


def check_field_types(config: Any) -> None:
    """Check (and normalise: lists to tuples) every field of a frozen config dataclass against
    its annotation.

    Raises:
        TypeError: for a value of the wrong type (``None`` where it is not allowed included).
        ValueError: for a non-finite float or a value outside a ``Literal``.
    """
    hints: dict[str, Any] = field_hints(type(config))
    for name, hint in hints.items():
        value = getattr(config, name)
        alternatives, optional = _options(hint)
        if value is None:
            if not optional:
                raise TypeError(f"{name} must be {_describe(alternatives[0])}, got None")
            continue
        for alternative in alternatives:
            ok, normalised = _coerce(name, value, alternative)
            if ok:
                if normalised is not value:
                    object.__setattr__(config, name, normalised)
                break
        else:
            what = " or ".join(_describe(a) for a in alternatives)
            raise TypeError(f"{name} must be {what}, got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """Base of attnlab's config dataclasses: typed fields checked on construction, then
    :meth:`validate`; :meth:`to_dict` / :meth:`from_dict` for JSON.

    Subclasses are ``@dataclass(frozen=True, kw_only=True)`` and override :meth:`validate`
    (calling ``super().validate()``) for ranges and rules between fields.
    """

    model_type: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        check_field_types(self)
        self.validate()

    def validate(self) -> None:
        """Range and cross-field checks (the field types are already checked)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (:func:`config_to_dict`)."""
        return config_to_dict(self)

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any]) -> C:
        """Build from a dict such as :meth:`to_dict`'s (:func:`config_from_dict`)."""
        return config_from_dict(cls, data)


def config_to_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready dict of a config dataclass (tuples as lists), with its ``model_type`` when
    it has one."""
    d = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()}
    model_type = getattr(type(config), "model_type", None)
    if model_type is not None:
        d = {"model_type": model_type, **d}
    return d


def config_from_dict(cls: type[C], data: dict[str, Any]) -> C:
    """Build ``cls`` from a dict, ignoring a matching ``model_type`` and rejecting unknown keys.

    Raises:
        ValueError: naming unknown keys (and the valid ones) or a mismatched ``model_type``, or
            for ``data`` that is not a dict.
    """
    if not isinstance(data, dict):
        raise ValueError(f"a {cls.__name__} must be a JSON object, got {type(data).__name__}")
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


__all__ = [
    "Config",
    "check_choice",
    "check_field_types",
    "check_finite",
    "check_positive",
    "check_probability",
    "check_seed",
    "config_from_dict",
    "config_to_dict",
    "field_hints",
]
