"""The one ``--key=value`` parser of the command line, and the tables of keys for ``--help``.

A recipe takes every field of its options, its :class:`~attnlab.training.TrainConfig` and its
model config as a flag: ``--key=value`` or ``--key value``, the key in ``--kebab-case`` (the
``--snake_case`` spelling of attnlab 0.1 still works, with a one-line deprecation note);
``--section.key`` where a name is in two sections; booleans also as bare ``--key`` /
``--no-key``; ``none``/``null`` for optional values; tuples as ``0.9,0.98``; mappings as a JSON
object. Values are parsed by the field's annotation (:func:`coerce`); what a value means is then
checked by the config itself, so errors name the flag and the valid values.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import sys
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Literal, Union

from attnlab.config import field_hints

_NONE = ("none", "null")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def flag(name: str) -> str:
    """``d_model`` -> ``--d-model``."""
    return "--" + name.replace("_", "-")


def close_matches(word: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """The candidates closest to ``word`` (a mistyped flag, command or choice), best first.

    Leading dashes are ignored in the comparison (``--stesp`` is close to ``--steps``) and
    ``_`` counts as ``-``; at most ``n`` of them, none when nothing is close
    (:func:`difflib.get_close_matches` with its default cutoff of 0.6).
    """
    by_key: dict[str, str] = {}
    for c in candidates:
        by_key.setdefault(c.lstrip("-").replace("_", "-"), c)
    key = word.lstrip("-").replace("_", "-")
    return [by_key[k] for k in difflib.get_close_matches(key, list(by_key), n=n)]


def did_you_mean(word: str, candidates: Iterable[str], *, quote: bool = False) -> str:
    """``"; did you mean --steps?"`` (or ``"--steps or --step?"``): the close candidates of
    ``word`` as the end of an error message, or ``""`` when none is close."""
    matches = close_matches(word, candidates)
    if not matches:
        return ""
    shown = [repr(m) if quote else m for m in matches]
    words = shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]
    return f"; did you mean {words}?"


def flag_message(message: str, keys: Iterable[str]) -> str:
    """A library message with its field names written as the command's flags: ``warmup=100``
    -> ``--warmup=100``, ``warmup < steps`` -> ``--warmup < --steps``, ``lr must`` -> ``--lr
    must`` (only names of ``keys``; other words are left alone)."""
    names = sorted((k for k in keys if "." not in k), key=len, reverse=True)
    if not names:
        return message
    alt = "|".join(re.escape(k) for k in names)
    flagged = re.sub(rf"(?<![\w.-])({alt})(?==|\s+must\b)", lambda m: flag(m.group(1)), message)
    compare = rf"(?<![\w.-])({alt})(\s*(?:<=|>=|<|>)\s*)({alt})(?![\w-])"
    return re.sub(compare, lambda m: flag(m.group(1)) + m.group(2) + flag(m.group(3)), flagged)


def _alternatives(hint: Any) -> tuple[list[Any], bool]:
    origin = typing.get_origin(hint)
    if origin is Union or origin is types.UnionType:
        args = typing.get_args(hint)
        return [a for a in args if a is not type(None)], type(None) in args
    return [hint], False


def describe(hint: Any) -> str:
    """A short type name for help: ``int``, ``float|none``, ``{char,bpe}``, ``float,float``."""
    alternatives, optional = _alternatives(hint)
    parts = []
    for a in alternatives:
        if typing.get_origin(a) is Literal:
            parts.append("{" + ",".join(str(v) for v in typing.get_args(a)) + "}")
        elif typing.get_origin(a) is tuple:
            args = [x for x in typing.get_args(a) if x is not Ellipsis]
            parts.append(",".join(getattr(x, "__name__", str(x)) for x in args) + ",...")
        elif typing.get_origin(a) is dict:
            parts.append("json")
        else:
            parts.append(getattr(a, "__name__", str(a)))
    return "|".join(parts) + ("|none" if optional else "")


def is_bool(hint: Any) -> bool:
    """Whether the annotation is ``bool`` (or ``bool | None``)."""
    return _alternatives(hint)[0] == [bool]


def coerce(text: str, hint: Any) -> Any:
    """Parse ``text`` as a value of the annotation ``hint``.

    Raises:
        ValueError: when ``text`` is not such a value (naming what was expected).
    """
    alternatives, optional = _alternatives(hint)
    if optional and text.lower() in _NONE:
        return None
    errors = []
    for a in alternatives:
        try:
            return _coerce_one(text, a)
        except ValueError as e:
            errors.append(str(e))
    raise ValueError(" or ".join(errors))


def _coerce_one(text: str, hint: Any) -> Any:
    if hint is bool:
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        raise ValueError(f"expected a boolean, got {text!r}")
    if hint is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"expected int, got {text!r}") from None
    if hint is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"expected float, got {text!r}") from None
    if typing.get_origin(hint) is Literal:
        choices = typing.get_args(hint)
        for c in choices:
            if str(c) == text:
                return c
        raise ValueError(f"expected one of {', '.join(map(str, choices))}, got {text!r}")
    if typing.get_origin(hint) is tuple:
        args = [a for a in typing.get_args(hint) if a is not Ellipsis] or [str]
        items = text.replace(",", " ").split()
        return tuple(_coerce_one(t, args[min(i, len(args) - 1)]) for i, t in enumerate(items))
    if typing.get_origin(hint) is dict:  # a JSON object: '{"bigbird": {"block": 16}}'
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, dict):
            raise ValueError(f"expected a JSON object such as '{{\"key\": 1}}', got {text!r}")
        return value
    return text


def key_types(
    sections: Mapping[str, Any], skip: Mapping[str, Iterable[str]] = {}
) -> dict[str, Any]:
    """``{field name: annotation}`` over config dataclass instances (``skip``: names per
    section that are not flags)."""
    types_: dict[str, Any] = {}
    for section, obj in sections.items():
        left_out = set(skip.get(section, ()))
        for name, hint in field_hints(type(obj)).items():
            if name not in left_out:
                types_.setdefault(name, hint)
    return types_


_WARNED: set[str] = set()


def _deprecation(token: str, key: str) -> None:
    if key in _WARNED:
        return
    _WARNED.add(key)
    print(
        f"attnlab: note: {token.split('=')[0]} is the old spelling of {flag(key)}; "
        "it still works, but use --kebab-case flags",
        file=sys.stderr,
    )


def parse_overrides(
    tokens: list[str], types_: Mapping[str, Any], *, other_flags: Iterable[str] = ()
) -> dict[str, Any]:
    """``["--steps=5", "--lr", "1e-3", "--tensorboard"]`` -> ``{"steps": 5, "lr": 0.001, ...}``.

    Args:
        tokens: the command-line tokens left over by argparse.
        types_: ``{key: annotation}`` of every accepted key (:func:`key_types`, plus a
            recipe's aliases).
        other_flags: the command's own flags (``--out``, ``--resume`` ...), offered too when
            an unknown option is close to one of them.

    Raises:
        ValueError: for a token that is not an option, an unknown key (naming the closest
            valid flags, not all of them: ``--help`` lists those), or a bad value (naming
            the flag).
    """
    known = set(types_)
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--") or token == "--":
            raise ValueError(f"expected --key=value, got {token!r}")
        raw, eq, value = token[2:].partition("=")
        key = raw.replace("-", "_")
        if "_" in raw and "-" not in raw and raw.replace("_", "-") != raw:
            _deprecation(token, key.rpartition(".")[2])
        name = key.rpartition(".")[2]
        negated = not eq and name not in known and name.startswith("no_") and name[3:] in known
        if negated:
            key, name = key[: len(key) - len(name)] + name[3:], name[3:]
        if name not in known:
            raise ValueError(_unknown(raw, types_, other_flags))
        hint = types_[name]
        if not eq:
            lone = i + 1 == len(tokens) or tokens[i + 1].startswith("--")
            if is_bool(hint) and lone:
                value = "false" if negated else "true"
            elif negated:
                raise ValueError(f"--no-{name.replace('_', '-')} takes no value")
            elif i + 1 < len(tokens):
                i += 1
                value = tokens[i]
            else:
                raise ValueError(f"{flag(name)} needs a value")
        try:
            out[key] = coerce(value, hint)
        except ValueError as e:
            raise ValueError(f"{flag(name)}: {e}") from None
        i += 1
    return out


def _unknown(raw: str, types_: Mapping[str, Any], other_flags: Iterable[str]) -> str:
    """The message for the unknown option ``--raw``: the closest valid flags, if any."""
    section, dot, name = raw.rpartition(".")
    candidates = [flag(k) for k in types_]
    candidates += [flag("no_" + k) for k, hint in types_.items() if is_bool(hint)]
    hint = did_you_mean("--" + name, [*candidates, *([] if dot else other_flags)])
    if dot:  # --train.stesp: suggest --train.steps
        hint = hint.replace("--", f"--{section}.")
    return f"unknown option '--{raw}'{hint} (--help lists every option)"


def _default_note(obj: Any, name: str) -> str:
    """What a short run does to a default (a recipe's warmup: ``short_run_warmup``)."""
    from attnlab.training.recipes.base import SHORT_RUN_WARMUP

    warmup = getattr(obj, "warmup", 0)
    if name != "warmup" or getattr(obj, "schedule", None) != "cosine" or not warmup:
        return ""
    return f" (a run of --steps <= {warmup} without --warmup: --steps // {SHORT_RUN_WARMUP})"


def help_table(sections: Mapping[str, Any], skip: Mapping[str, Iterable[str]] = {}) -> str:
    """Every key of the sections with its type and default, one line each, by section."""
    lines = []
    for section, obj in sections.items():
        left_out = set(skip.get(section, ()))
        lines.append(f"{section} ({type(obj).__name__}):")
        for f in dataclasses.fields(obj):
            if f.name in left_out:
                continue
            hint = field_hints(type(obj))[f.name]
            default = getattr(obj, f.name)
            shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
            note = _default_note(obj, f.name)
            lines.append(f"  {flag(f.name):<30} {describe(hint):<22} default: {shown}{note}")
    return "\n".join(lines)


__all__ = [
    "close_matches",
    "coerce",
    "describe",
    "did_you_mean",
    "flag",
    "help_table",
    "is_bool",
    "key_types",
    "parse_overrides",
]
