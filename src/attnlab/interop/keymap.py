"""Declarative key maps between attnlab's parameter names and another library's checkpoint keys.

A :class:`KeyMap` is a list of :class:`Entry` rows. Each row pairs one or more attnlab names with
one or more checkpoint keys and, where the tensors differ in layout, a transform each way (a
transpose for GPT-2's ``Conv1D``, a split of a fused q/k/v projection, ...). Most rows are plain
renames built by :func:`same` / :func:`params`; :func:`per_layer` repeats rows with ``{i}`` filled
in for every layer. A map also lists the checkpoint keys that carry no weights (``ignore``: saved
buffers such as causal-mask tables), older names of the same tensor (``aliases`` on an entry), and
tied copies that must equal another key (``duplicates``).

:func:`load_into` checks a checkpoint against what the model expects, *in the checkpoint's own
terms*: the expected keys and shapes are what :meth:`KeyMap.to_theirs` makes of the freshly built
model, so an error names the checkpoint key and the expected shape. Nothing is silently left at
its random initialisation: every attnlab parameter must be covered by the map, and every missing,
unexpected or misshapen tensor is reported at once.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnlab.integrity import KIND_RULE, kind_problems

logger = logging.getLogger(__name__)

Transform = Callable[[Sequence[Tensor]], list[Tensor]]


def _identity(tensors: Sequence[Tensor]) -> list[Tensor]:
    return list(tensors)


@dataclass(frozen=True)
class Entry:
    """One row of a key map: attnlab names <-> checkpoint keys, with a transform each way.

    ``to_ours`` maps the tensors of ``theirs`` (in order) to those of ``ours``; ``to_theirs`` is
    its inverse. ``aliases`` are other spellings of ``theirs`` (same length) accepted on loading.
    """

    ours: tuple[str, ...]
    theirs: tuple[str, ...]
    to_ours: Transform = _identity
    to_theirs: Transform = _identity
    aliases: tuple[tuple[str, ...], ...] = ()

    def format(self, **values: object) -> Entry:
        """This entry with ``{name}`` placeholders filled in (e.g. ``i`` for the layer index)."""

        def fill(names: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(n.format(**values) for n in names)

        return Entry(
            fill(self.ours),
            fill(self.theirs),
            self.to_ours,
            self.to_theirs,
            tuple(fill(a) for a in self.aliases),
        )


def same(ours: str, theirs: str, *aliases: str) -> Entry:
    """A tensor stored as is, under another name (``aliases``: older names of ``theirs``)."""
    return Entry((ours,), (theirs,), aliases=tuple((a,) for a in aliases))


def transposed(ours: str, theirs: str) -> Entry:
    """A 2-D weight stored transposed (``(in, out)``, as GPT-2's ``Conv1D``)."""

    def t(ts: Sequence[Tensor]) -> list[Tensor]:
        return [ts[0].t()]

    return Entry((ours,), (theirs,), t, t)


def unsqueezed(ours: str, theirs: str) -> Entry:
    """A tensor stored with a leading unit dimension (``(1, ...)`` there, ``(...)`` here)."""

    def to_ours(ts: Sequence[Tensor]) -> list[Tensor]:
        return [ts[0].squeeze(0)]

    def to_theirs(ts: Sequence[Tensor]) -> list[Tensor]:
        return [ts[0].unsqueeze(0)]

    return Entry((ours,), (theirs,), to_ours, to_theirs)


def params(
    ours: str,
    theirs: str,
    *,
    names: Iterable[str] = ("weight", "bias"),
    bias: bool = True,
    alias: str | None = None,
) -> list[Entry]:
    """Rename every parameter of one module (``weight`` and, when ``bias``, ``bias``).

    ``ours`` and ``theirs`` are module paths; ``alias`` is an older path of ``theirs``.
    """
    out = []
    for n in names:
        if n == "bias" and not bias:
            continue
        aliases = (f"{alias}.{n}",) if alias is not None else ()
        out.append(same(f"{ours}.{n}", f"{theirs}.{n}", *aliases))
    return out


def per_layer(n_layers: int, entries: Iterable[Entry]) -> list[Entry]:
    """``entries`` repeated for ``i`` in ``range(n_layers)`` (``{i}`` in their names)."""
    rows = list(entries)
    return [e.format(i=i) for i in range(n_layers) for e in rows]


@dataclass(frozen=True)
class KeyMap:
    """A full mapping between one attnlab model and one checkpoint layout.

    Args:
        entries: the rows (every attnlab parameter must appear in exactly one).
        ignore: regular expressions of checkpoint keys that hold no weights (saved buffers).
        duplicates: checkpoint key -> the key it is a tied copy of; dropped when equal.
    """

    entries: list[Entry]
    ignore: tuple[str, ...] = ()
    duplicates: Mapping[str, str] = field(default_factory=dict)

    def ours_keys(self) -> list[str]:
        return [k for e in self.entries for k in e.ours]

    def to_theirs(self, ours: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """attnlab state dict -> checkpoint tensors (only what the map covers)."""
        out: dict[str, Tensor] = {}
        for e in self.entries:
            tensors = e.to_theirs([ours[k] for k in e.ours])
            out.update(zip(e.theirs, tensors, strict=True))
        return out

    def to_ours(self, theirs: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Checkpoint tensors (canonical keys) -> attnlab state dict, for complete entries."""
        out: dict[str, Tensor] = {}
        for e in self.entries:
            if all(k in theirs for k in e.theirs):
                tensors = e.to_ours([theirs[k] for k in e.theirs])
                out.update(zip(e.ours, tensors, strict=True))
        return out

    def canonicalise(self, theirs: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], list[str]]:
        """Rename aliases to the primary keys, drop ignored keys and equal tied copies.

        Returns:
            ``(tensors, problems)``: the canonical checkpoint and descriptions of tied copies
            that differ from their original.
        """
        out = {k: v for k, v in theirs.items() if not any(re.fullmatch(p, k) for p in self.ignore)}
        for e in self.entries:
            for alias in e.aliases:
                if not any(k in out for k in e.theirs) and all(a in out for a in alias):
                    for a, k in zip(alias, e.theirs, strict=True):
                        out[k] = out.pop(a)
        problems = []
        for dup, original in self.duplicates.items():
            if dup not in out:
                continue
            copy = out.pop(dup)
            if original in out and not torch.equal(copy, out[original]):
                problems.append(
                    f"{dup} differs from {original}, but the config ties them "
                    "(set tie_word_embeddings=false in config.json if they are separate)"
                )
        return out, problems


class CheckpointMismatchError(ValueError):
    """A checkpoint does not fit the model its config describes (the message lists every key)."""


def _shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def check_coverage(model: nn.Module, keymap: KeyMap, what: str) -> None:
    """Raise unless the map fills every parameter and persistent buffer of ``model`` exactly.

    Raises:
        NotImplementedError: naming the attnlab parameters the map has no tensor for (an option
            of the model that the checkpoint format cannot express).
    """
    state = model.state_dict(keep_vars=True)
    unknown = [k for k in keymap.ours_keys() if k not in state]
    if unknown:
        raise NotImplementedError(f"{what}: the key map names unknown attnlab tensors {unknown}")
    covered = {id(state[k]) for k in keymap.ours_keys()}
    uncovered = [k for k, v in state.items() if id(v) not in covered]
    if uncovered:
        raise NotImplementedError(
            f"{what}: no checkpoint tensor maps to the attnlab parameters {uncovered} "
            "(an option this format does not support)"
        )


def load_into(
    model: nn.Module,
    keymap: KeyMap,
    checkpoint: Mapping[str, Tensor],
    *,
    what: str,
    strict: bool = True,
    dtypes: bool = True,
) -> None:
    """Copy ``checkpoint`` (keys as the map's ``theirs``) into ``model`` after checking it.

    Args:
        model: the freshly built attnlab model. keymap: its map. checkpoint: the tensors.
        what: a description for messages (e.g. the checkpoint directory and family).
        strict: raise on any missing, unexpected or misshapen tensor (default). With
            ``strict=False`` those are logged as warnings and the rest is loaded.
        dtypes: count a tensor of another dtype kind than the parameter it fills as bad (an
            int32 or bool tensor for a float parameter, :func:`attnlab.integrity.kind_problems`;
            float16/bfloat16/float64 are cast). ``False``: cast whatever it holds.

    Raises:
        CheckpointMismatchError: listing every missing key (with its expected shape), every
            unexpected key, every shape mismatch and (``dtypes``) every dtype of another kind.
        NotImplementedError: if the map does not cover the model (see :func:`check_coverage`).
    """
    check_coverage(model, keymap, what)
    tensors, problems = keymap.canonicalise(checkpoint)
    with torch.no_grad():
        theirs = keymap.to_theirs(model.state_dict())
    expected = {k: _shape(v) for k, v in theirs.items()}
    missing = [f"{k} (expected shape {list(s)})" for k, s in expected.items() if k not in tensors]
    unexpected = sorted(k for k in tensors if k not in expected)
    problems += [
        f"{k}: shape {list(tensors[k].shape)}, expected {list(s)}"
        for k, s in expected.items()
        if k in tensors and _shape(tensors[k]) != s
    ]
    wrong_kind: dict[str, str] = {}
    if dtypes:  # an int or bool tensor for a float parameter would be cast silently
        found = {k: v.dtype for k, v in tensors.items() if k in expected}
        wrong_kind = kind_problems({k: v.dtype for k, v in theirs.items()}, found)
        problems += [f"{p} ({KIND_RULE})" for p in wrong_kind.values()]
    lines = []
    if missing:
        lines.append(f"missing tensors ({len(missing)}): " + "; ".join(missing))
    if unexpected:
        lines.append(
            f"unexpected tensors ({len(unexpected)}; an unsupported head or option?): "
            + ", ".join(unexpected)
        )
    if problems:
        lines.append("bad tensors: " + "; ".join(problems))
    if lines:
        message = f"{what} does not match the model its config describes:\n  " + "\n  ".join(lines)
        if strict:
            raise CheckpointMismatchError(message)
        logger.warning("%s\n(strict=False: those parameters keep their initialisation)", message)
    bad = {k for k, s in expected.items() if k in tensors and _shape(tensors[k]) != s}
    bad |= set(wrong_kind)
    usable = {k: v for k, v in tensors.items() if k in expected and k not in bad}
    with torch.no_grad():
        ours = keymap.to_ours(usable)
        result = model.load_state_dict(ours, strict=False)
    if result.unexpected_keys:  # the map produced a name the model lacks: a bug in the map
        raise NotImplementedError(f"{what}: key map produced unknown keys {result.unexpected_keys}")


__all__ = [
    "CheckpointMismatchError",
    "Entry",
    "KeyMap",
    "check_coverage",
    "load_into",
    "params",
    "per_layer",
    "same",
    "transposed",
    "unsqueezed",
]
