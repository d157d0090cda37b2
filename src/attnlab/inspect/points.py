"""Hook points: the named activations of every attnlab model, listed and selected.

One naming scheme for every family (``L`` a layer index; encoder-decoder models put the
per-stack names under ``encoder.`` / ``decoder.``); where the points of a model are is what its
family declares (:class:`~attnlab.models.family.HookLayout`):

| name | shape | what |
|---|---|---|
| ``embed.token`` | (B, T, E) | token embeddings (scaled by sqrt(E) where the model does) |
| ``embed.segment`` | (B, T, E) | BERT's segment (token type) embeddings |
| ``embed.patch`` | (B, P, E) | ViT's patch projections ([CLS] not included), CCT's tokens |
| ``embed.position`` | (B, T, E) | the added position term (learned, sinusoidal) |
| ``layers.L.resid_pre`` | (B, T, E) | the residual stream entering layer L |
| ``layers.L.attn.q`` | (B, H, T, D) | queries, after RoPE |
| ``layers.L.attn.k`` / ``.v`` | (B, H_kv, T, D) | keys (after RoPE) / values of the new tokens |
| ``layers.L.attn.scores`` | (B, H, T, S) | scaled, masked scores before the softmax (>= fp32) |
| ``layers.L.attn.weights`` | (B, H, T, S) | attention weights after the softmax |
| ``layers.L.attn.z`` | (B, T, H, D) | per-head outputs, before the output projection W^O |
| ``layers.L.attn.out`` | (B, T, E) | the attention output (after W^O) |
| ``layers.L.resid_mid`` | (B, T, E) | the residual stream after the attention sublayer |
| ``layers.L.cross_attn.*`` | as attn | decoder cross-attention (k, v over the S source tokens) |
| ``layers.L.resid_cross`` | (B, T, E) | after the cross-attention sublayer |
| ``layers.L.ffn.gate`` | (B, T, F) | ``act(x W_gate)`` of GLU variants |
| ``layers.L.ffn.hidden`` | (B, T, F) | FFN hidden, after the activation (the input of W_down) |
| ``layers.L.ffn.out`` | (B, T, E) | the FFN output |
| ``layers.L.resid_post`` | (B, T, E) | the residual stream leaving layer L |
| ``final_norm`` | (B, T, E) | the final norm's output (stacks that have one) |
| ``logits`` | (B, T, V) / (B, K) | LM / MLM logits, ViT class logits |

``scores`` and ``weights`` exist for softmax backends only (not linear attention); whatever the
backend, hooked layers compute them on the math path (with the backend's sparsity pattern) while
the layer's output still comes from its backend, unless a hook replaces them.

Shapes: B batch, T tokens, S keys, E d_model, H heads, H_kv kv heads, D head dim, F d_ff,
V vocabulary, P patches, K classes.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from torch import nn

from attnlab.layers.blocks import DecoderLayer, EncoderLayer
from attnlab.layers.feedforward import FeedForward
from attnlab.layers.multihead import MultiHeadAttention
from attnlab.layers.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from attnlab.models.family import HookLayout, find_family

RESID = ("batch", "position", "d_model")
HEADS = ("batch", "head", "position", "d_head")
PATTERN = ("batch", "head", "position", "key")
Z = ("batch", "position", "head", "d_head")
HIDDEN = ("batch", "position", "d_ff")

Names = str | Sequence[str] | Callable[[str], bool] | None


@dataclass(frozen=True, eq=False)
class HookPoint:
    """One named activation of a model.

    Attributes:
        name: the hook name (``"layers.3.attn.q"``).
        module: the module where it is produced.
        site: the module's local hook site (:mod:`attnlab.layers.hooks`), or ``None`` for the
            module's output (read through a forward hook).
        scope: ``"encoder"``/``"decoder"`` for a module an encoder-decoder model shares between
            its stacks (embeddings, positions): the point fires only inside that stack's call.
        axes: the name of each dimension (``"batch"``, ``"position"``, ``"head"``, ...).
    """

    name: str
    module: nn.Module
    site: str | None
    scope: str | None = None
    axes: tuple[str, ...] = RESID


def _attention(attn: MultiHeadAttention, prefix: str) -> list[HookPoint]:
    points = [HookPoint(f"{prefix}.{s}", attn, s, axes=HEADS) for s in ("q", "k", "v")]
    if getattr(attn.backend, "softmax", True) is not False:
        points += [HookPoint(f"{prefix}.{s}", attn, s, axes=PATTERN) for s in ("scores", "weights")]
    points.append(HookPoint(f"{prefix}.z", attn, "z", axes=Z))
    points.append(HookPoint(f"{prefix}.out", attn, "out"))
    return points


def _layer(layer: nn.Module, prefix: str) -> list[HookPoint]:
    """Points of one encoder/decoder layer, in the order they fire."""
    if not isinstance(layer, EncoderLayer | DecoderLayer):
        return []  # a block type without hook sites
    points = [HookPoint(f"{prefix}.resid_pre", layer, "resid_pre")]
    points += _attention(layer.self_attn, f"{prefix}.attn")
    points.append(HookPoint(f"{prefix}.resid_mid", layer, "resid_mid"))
    if isinstance(layer, DecoderLayer) and layer.cross_attn is not None:
        points += _attention(layer.cross_attn, f"{prefix}.cross_attn")
        points.append(HookPoint(f"{prefix}.resid_cross", layer, "resid_cross"))
    ffn = layer.ffn
    if isinstance(ffn, FeedForward):
        if ffn.gate_proj is not None:
            points.append(HookPoint(f"{prefix}.ffn.gate", ffn, "gate", axes=HIDDEN))
        points.append(HookPoint(f"{prefix}.ffn.hidden", ffn, "hidden", axes=HIDDEN))
    points.append(HookPoint(f"{prefix}.ffn.out", layer, "ffn.out"))
    points.append(HookPoint(f"{prefix}.resid_post", layer, "resid_post"))
    return points


def _stack(layers: Iterable[nn.Module], prefix: str) -> list[HookPoint]:
    return [p for i, layer in enumerate(layers) for p in _layer(layer, f"{prefix}layers.{i}")]


def _position(pos: nn.Module, name: str, scope: str | None = None) -> list[HookPoint]:
    if isinstance(pos, LearnedPositionalEmbedding | SinusoidalPositionalEncoding):
        return [HookPoint(name, pos, "position", scope)]
    return []


def _output(module: nn.Module | None, name: str, axes: tuple[str, ...] = RESID) -> list[HookPoint]:
    return [] if module is None else [HookPoint(name, module, None, axes=axes)]


def layout_of(model: nn.Module) -> HookLayout:
    """The hook layout ``model``'s family declares (:mod:`attnlab.models.family`).

    Raises:
        TypeError: for a model of no family, or one without hook points.
    """
    family = find_family(model)
    if family is None or family.hooks is None:
        have = "no attnlab model family" if family is None else f"family {family.name!r}"
        raise TypeError(
            f"attnlab.inspect has hook points for models whose family declares them; "
            f"{type(model).__name__} belongs to {have}, which declares none"
        )
    return family.hooks(model)


def hook_points(model: nn.Module) -> list[HookPoint]:
    """Every hook point of ``model``, in the order a forward pass reaches them (from the hook
    layout its family declares: :class:`~attnlab.models.family.HookLayout`).

    Raises:
        TypeError: for a model without hook points.
    """
    layout = layout_of(model)
    points: list[HookPoint] = []
    for stack in layout.stacks:
        scope = stack.scope
        for name, module in stack.inputs:
            points.append(HookPoint(f"{stack.prefix}{name}", module, None, scope))
        if stack.position is not None:
            points += _position(stack.position, f"{stack.prefix}embed.position", scope)
        points += _stack(stack.layers, stack.prefix)
        points += _output(stack.final_norm, f"{stack.prefix}final_norm")
    return points + _output(layout.head, "logits", layout.head_axes)


def hook_names(model: nn.Module) -> list[str]:
    """The names of :func:`hook_points` (see the table in this module's docstring).

    Raises:
        TypeError: for a model without hook points.
    """
    return [p.name for p in hook_points(model)]


def is_pattern(text: str) -> bool:
    """Whether ``text`` is a glob pattern (``*``, ``?`` or ``[...]``) rather than a name."""
    return any(c in text for c in "*?[")


def select(names: Sequence[str], spec: Names) -> list[str]:
    """The names chosen by ``spec``, in ``names``' order.

    Args:
        names: every hook name of a model.
        spec: ``None`` (all), an exact name, a glob pattern (``"layers.*.attn.weights"``; ``*``
            also matches dots), a list of those, or a predicate ``name -> bool``.

    Raises:
        ValueError: for an exact name that does not exist or a pattern that matches nothing
            (naming it and some valid names), or a predicate that selects nothing.
        TypeError: for a spec of another type.
    """
    if spec is None:
        return list(names)
    if callable(spec):
        chosen = [n for n in names if spec(n)]
        if not chosen:
            raise ValueError("the names predicate selects no hook point")
        return chosen
    specs = [spec] if isinstance(spec, str) else list(spec)
    if not specs or not all(isinstance(s, str) for s in specs):
        raise TypeError(
            f"names must be a name, a glob pattern, a list of them or a predicate, got {spec!r}"
        )
    wanted: set[str] = set()
    for s in specs:
        found = fnmatch.filter(names, s) if is_pattern(s) else [s] if s in names else []
        if not found:
            raise ValueError(f"no hook point matches {s!r}; {_suggest(names, s)}")
        wanted.update(found)
    return [n for n in names if n in wanted]


def _suggest(names: Sequence[str], spec: str) -> str:
    """A hint naming some valid names (those sharing the last part of ``spec`` first)."""
    last = spec.rsplit(".", 1)[-1].strip("*?")
    near = [n for n in names if last and n.endswith(last)] or list(names)
    shown = ", ".join(near[:6]) + (", ..." if len(near) > 6 else "")
    return f"valid names include {shown} ({len(names)} in all; attnlab.inspect.hook_names)"


def layer_index(name: str) -> int | None:
    """The layer number in a hook name (``"decoder.layers.2.attn.z"`` -> 2), or ``None``."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part == "layers" and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


__all__ = [
    "HookPoint",
    "Names",
    "hook_names",
    "hook_points",
    "is_pattern",
    "layer_index",
    "layout_of",
    "select",
]
