"""Ready-made edits: zero/mean ablation of heads, layers and FFN neurons; steering vectors.

Each function checks its layers, heads and neurons against the model and returns hooks,
``{hook name: fn}``, for :func:`~attnlab.inspect.hooks.run_with_hooks` or
:func:`~attnlab.inspect.hooks.hooked` (combine several with ``{**a, **b}`` when their names
differ):

- :func:`ablate_heads`: a head's output ``z[:, :, h]`` (before W^O) set to zero or to its mean;
  zeroing is the same as zeroing that head's columns of the output projection;
- :func:`ablate_layers`: a layer's attention and/or FFN output (what it adds to the residual
  stream) set to zero or to its mean;
- :func:`ablate_neurons`: FFN hidden units ``hidden[..., i]`` set to zero or to their mean;
- :func:`steer`: ``x + scale · vector`` on a residual-stream point (at every position, or some).

"Mean" is the mean over the batch and positions of a reference run's activation (an
:class:`~attnlab.inspect.cache.ActivationCache` holding that name), the usual way to remove a
component's information while keeping its average contribution.

Shapes: B batch, T positions, H heads, D head dim, E d_model, F d_ff.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal

import torch
from torch import Tensor, nn

from attnlab.inspect.hooks import HookFn
from attnlab.inspect.points import HookPoint, hook_points, select
from attnlab.layers.feedforward import FeedForward
from attnlab.layers.multihead import MultiHeadAttention

Mode = Literal["zero", "mean"]
RESIDUAL_SITES = ("resid_pre", "resid_mid", "resid_cross", "resid_post")


def _prefix(stack: str) -> str:
    return f"{stack}." if stack else ""


def _point(points: dict[str, HookPoint], name: str) -> HookPoint:
    select(list(points), name)  # ValueError naming valid names
    return points[name]


def _mean(reference: Mapping[str, Tensor] | None, name: str, point: HookPoint) -> Tensor:
    """The reference activation of ``name`` averaged over its batch and position dims."""
    if reference is None:
        raise ValueError("mode='mean' needs reference=: a cache of a reference run")
    if name not in reference:
        raise ValueError(f"mode='mean': the reference cache has no {name!r}")
    x = reference[name]
    dims = tuple(i for i, a in enumerate(point.axes) if a in ("batch", "position"))
    return x.float().mean(dim=dims, keepdim=True).to(x.dtype)


def _replace(axis: int, index: Sequence[int], mode: Mode, mean: Tensor | None) -> HookFn:
    """A hook setting ``x[..., index, ...]`` (along ``axis``) to zero or to ``mean``'s values."""
    idx = list(index)

    def fn(x: Tensor, name: str) -> Tensor:
        y = x.clone()
        where = (slice(None),) * axis + (idx,)
        if mode == "zero":
            y[where] = 0
        else:
            if mean is None:
                raise ValueError(f"mean ablation of {name} needs the mean activations")
            y[where] = mean.to(device=x.device, dtype=x.dtype).expand_as(x)[where]
        return y

    return fn


def _n_heads(point: HookPoint) -> int:
    module = point.module
    if not isinstance(module, MultiHeadAttention):
        raise TypeError(f"{point.name} is not a point of an attention layer (heads)")
    return module.n_heads


def _d_ff(point: HookPoint) -> int:
    module = point.module
    if not isinstance(module, FeedForward):
        raise TypeError(f"{point.name} is not a point of a feed-forward layer (neurons)")
    return module.up_proj.out_features


def _check_mode(mode: str) -> None:
    if mode not in ("zero", "mean"):
        raise ValueError(f"mode must be 'zero' or 'mean', got {mode!r}")


def _group(pairs: Iterable[tuple[int, int]], what: str) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for pair in pairs:
        if len(pair) != 2:
            raise ValueError(f"{what} must be (layer, index) pairs, got {pair!r}")
        layer, i = (int(v) for v in pair)
        out.setdefault(layer, []).append(i)
    if not out:
        raise ValueError(f"no {what} given")
    return out


def _indexed(
    model: nn.Module,
    pairs: Iterable[tuple[int, int]],
    template: str,
    size: Callable[[HookPoint], int],
    what: str,
    mode: Mode,
    reference: Mapping[str, Tensor] | None,
) -> dict[str, HookFn]:
    _check_mode(mode)
    points = {p.name: p for p in hook_points(model)}
    hooks: dict[str, HookFn] = {}
    for layer, index in sorted(_group(pairs, what).items()):
        name = template.format(layer=layer)
        point = _point(points, name)
        n = size(point)
        bad = [i for i in index if not 0 <= i < n]
        if bad:
            raise ValueError(f"{what} {bad} of {name} are out of range: valid 0..{n - 1}")
        axis = point.axes.index("head" if what == "heads" else "d_ff")
        mean = _mean(reference, name, point) if mode == "mean" else None
        hooks[name] = _replace(axis, index, mode, mean)
    return hooks


def ablate_heads(
    model: nn.Module,
    heads: Iterable[tuple[int, int]],
    *,
    mode: Mode = "zero",
    reference: Mapping[str, Tensor] | None = None,
    stack: str = "",
    attention: Literal["attn", "cross_attn"] = "attn",
) -> dict[str, HookFn]:
    """Hooks that ablate attention heads, given as ``(layer, head)`` pairs.

    Args:
        model: the model the hooks are for (checks layers and heads).
        heads: ``(layer, head)`` pairs, counted from 0.
        mode: ``"zero"`` or ``"mean"`` (the head's mean output over ``reference``).
        reference: a cache holding ``...attn.z`` of the layers (for ``mode="mean"``).
        stack: ``""`` for GPT/BERT/ViT, ``"encoder"`` or ``"decoder"`` for encoder-decoder.
        attention: ``"attn"`` (self-attention) or ``"cross_attn"``.

    Raises:
        ValueError: for a layer without that attention, a head out of range, an unknown mode,
            or a missing reference.
    """
    template = f"{_prefix(stack)}layers.{{layer}}.{attention}.z"
    return _indexed(model, heads, template, _n_heads, "heads", mode, reference)


def ablate_neurons(
    model: nn.Module,
    neurons: Iterable[tuple[int, int]],
    *,
    mode: Mode = "zero",
    reference: Mapping[str, Tensor] | None = None,
    stack: str = "",
) -> dict[str, HookFn]:
    """Hooks that ablate FFN hidden units (``ffn.hidden[..., i]``), given as ``(layer, i)``.

    Raises:
        ValueError: as :func:`ablate_heads` (units out of ``[0, d_ff)``).
    """
    template = f"{_prefix(stack)}layers.{{layer}}.ffn.hidden"
    return _indexed(model, neurons, template, _d_ff, "neurons", mode, reference)


def ablate_layers(
    model: nn.Module,
    layers: Iterable[int],
    *,
    part: Literal["attn", "cross_attn", "ffn", "all"] = "all",
    mode: Mode = "zero",
    reference: Mapping[str, Tensor] | None = None,
    stack: str = "",
) -> dict[str, HookFn]:
    """Hooks that ablate what layers add to the residual stream: the attention output
    (``attn.out``), the cross-attention output, the FFN output (``ffn.out``), or all of them.

    Raises:
        ValueError: for an unknown layer (naming the valid names), part or mode.
    """
    _check_mode(mode)
    parts = {"attn": ["attn.out"], "cross_attn": ["cross_attn.out"], "ffn": ["ffn.out"]}
    if part not in (*parts, "all"):
        raise ValueError(f"part must be one of attn, cross_attn, ffn, all; got {part!r}")
    points = {p.name: p for p in hook_points(model)}
    hooks: dict[str, HookFn] = {}
    chosen = list(layers)
    if not chosen:
        raise ValueError("no layers given")
    for layer in chosen:
        for site in parts.get(part) or ["attn.out", "cross_attn.out", "ffn.out"]:
            name = f"{_prefix(stack)}layers.{int(layer)}.{site}"
            if part == "all" and site == "cross_attn.out" and name not in points:
                continue  # layers without cross-attention
            point = _point(points, name)
            mean = _mean(reference, name, point) if mode == "mean" else None
            hooks[name] = _constant(mean)
    return hooks


def _constant(mean: Tensor | None) -> HookFn:
    """A hook replacing the activation by zeros (``mean=None``) or by ``mean`` broadcast."""

    def fn(x: Tensor, name: str) -> Tensor:
        if mean is None:
            return torch.zeros_like(x)
        return mean.to(device=x.device, dtype=x.dtype).expand_as(x).clone()

    return fn


def steer(
    model: nn.Module,
    layer: int,
    vector: Tensor,
    *,
    at: str = "resid_pre",
    positions: Sequence[int] | None = None,
    scale: float = 1.0,
    stack: str = "",
) -> dict[str, HookFn]:
    """A hook adding ``scale · vector`` to the residual stream at ``layers.{layer}.{at}``.

    Args:
        model: the model (checks the layer and the vector's size).
        layer: the layer whose residual point is steered.
        vector: ``(E,)`` the steering direction (e.g. a difference of two cached means).
        at: ``resid_pre``, ``resid_mid``, ``resid_cross`` or ``resid_post``.
        positions: the positions to steer (default all; negative counts from the end).
        scale: multiplier of ``vector``.
        stack: ``""``, or ``"encoder"``/``"decoder"`` for encoder-decoder models.

    Raises:
        ValueError: for an unknown point, a vector that is not ``(E,)``, or a non-finite scale.
    """
    if at not in RESIDUAL_SITES:
        raise ValueError(f"at must be one of {', '.join(RESIDUAL_SITES)}, got {at!r}")
    name = f"{_prefix(stack)}layers.{int(layer)}.{at}"
    _point({p.name: p for p in hook_points(model)}, name)
    d_model = int(getattr(getattr(model, "config", None), "d_model", vector.shape[-1]))
    if vector.dim() != 1 or vector.shape[0] != d_model:
        raise ValueError(f"vector must be ({d_model},), got shape {tuple(vector.shape)}")
    if not torch.isfinite(torch.tensor(float(scale))):
        raise ValueError(f"scale must be finite, got {scale}")
    where = None if positions is None else [int(p) for p in positions]

    def fn(x: Tensor, name: str) -> Tensor:
        add = (scale * vector).to(device=x.device, dtype=x.dtype)  # (E,)
        if where is None:
            return x + add
        y = x.clone()
        y[:, where] = y[:, where] + add
        return y

    return {name: fn}


__all__ = ["ablate_heads", "ablate_layers", "ablate_neurons", "steer"]
