"""Activation patching: which activations carry the difference between two inputs.

:func:`activation_patching` runs a clean and a corrupted input, then re-runs the corrupted one
once per slice of each chosen activation with that slice replaced by its clean value (one
position, one head, or the whole tensor), and records a metric of the output each time. A
slice that restores the clean metric carries the information the corruption removed (Meng et
al. 2022, "causal tracing"; Wang et al. 2022, "path patching" in its simplest form).

The result is a :class:`PatchingResult`: the metric per (hook name, slice), labelled, with the
clean and corrupted baselines; :meth:`PatchingResult.normalized` is 0 at the corrupted and 1 at
the clean metric. :func:`attnlab.viz.plot_patching` draws it (layer x position, layer x head).

Shapes: N chosen names, K slices (positions, heads, or 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
from torch import Tensor, nn

from attnlab.inspect.cache import run_with_cache
from attnlab.inspect.hooks import run_with_hooks
from attnlab.inspect.points import Names, hook_points

Per = Literal["position", "head", "all"]


@dataclass(frozen=True)
class PatchingResult:
    """The metric after patching each slice of each activation from clean into corrupted.

    Attributes:
        metric: ``(N, K)`` float64: row ``n`` is ``names[n]``, column ``k`` its ``k``-th slice
            along ``per`` (NaN where that activation has fewer than K slices).
        names: the patched hook names (rows), in forward order.
        per: ``"position"``, ``"head"`` or ``"all"`` (columns: positions, heads, or one).
        clean, corrupted: the metric of the unpatched clean and corrupted runs.
    """

    metric: Tensor
    names: tuple[str, ...]
    per: Per
    clean: float
    corrupted: float

    @property
    def dims(self) -> tuple[str, str]:
        """What the two axes of :attr:`metric` index: ``("name", per)``."""
        return ("name", self.per)

    @property
    def effect(self) -> Tensor:
        """``metric - corrupted``: how much patching the slice moves the metric."""
        return self.metric - self.corrupted

    def normalized(self) -> Tensor:
        """``(metric - corrupted) / (clean - corrupted)``: 0 = no effect, 1 = fully restored.

        Raises:
            ValueError: if the clean and corrupted metrics are equal.
        """
        gap = self.clean - self.corrupted
        if gap == 0:
            raise ValueError("the clean and corrupted metrics are equal: nothing to normalise")
        return self.effect / gap

    def column_labels(self) -> list[str]:
        """``"0", "1", ...`` for positions, ``"h0", "h1", ...`` for heads, ``"all"``."""
        k = self.metric.shape[1]
        if self.per == "all":
            return ["all"]
        return [f"h{i}" if self.per == "head" else str(i) for i in range(k)]


def _as_args(x: Any) -> tuple[Any, ...]:
    return tuple(x) if isinstance(x, tuple | list) else (x,)


def _check_inputs(clean: tuple[Any, ...], corrupted: tuple[Any, ...]) -> None:
    if len(clean) != len(corrupted):
        raise ValueError(
            f"clean and corrupted take the same arguments; got {len(clean)} and {len(corrupted)}"
        )
    for i, (a, b) in enumerate(zip(clean, corrupted, strict=True)):
        if isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape != b.shape:
            raise ValueError(
                f"clean and corrupted input {i} have different shapes {tuple(a.shape)} and "
                f"{tuple(b.shape)}; patching needs aligned inputs (same length)"
            )


def _scalar(value: Any, what: str) -> float:
    v = float(value.item() if isinstance(value, Tensor) else value)
    if not math.isfinite(v):
        raise ValueError(f"the metric of the {what} run is not finite: {v}")
    return v


def _patch(clean: Tensor, axis: int | None, k: int) -> Callable[[Tensor, str], Tensor]:
    def fn(x: Tensor, name: str) -> Tensor:
        if axis is None:
            return clean.to(x.dtype).clone()
        y = x.clone()
        where = (slice(None),) * axis + (k,)
        y[where] = clean[where]
        return y

    return fn


@torch.no_grad()
def activation_patching(
    model: nn.Module,
    clean: Any,
    corrupted: Any,
    names: Names,
    metric: Callable[[Any], Tensor | float],
    *,
    per: Per = "position",
    **kwargs: Any,
) -> PatchingResult:
    """Patch each slice of each chosen activation from the clean run into the corrupted one.

    Args:
        model: a GPT, BERT, ViT, CCT or encoder-decoder (run in eval mode, restored after).
        clean, corrupted: the model's positional input(s): a tensor, or a tuple such as
            ``(src, tgt)``; both of the same shapes.
        names: the activations to patch (names, glob patterns or a predicate, as
            :func:`~attnlab.inspect.points.select`).
        metric: ``output -> scalar`` (e.g. a logit difference at the last position).
        per: ``"position"`` (one position at a time), ``"head"`` (one head at a time: points
            with a head axis only) or ``"all"`` (the whole activation).
        kwargs: keyword arguments of the forward, shared by every run (e.g. ``mask=``).

    Returns:
        A :class:`PatchingResult` with ``N x K`` metrics (``N`` names, ``K`` slices).

    Raises:
        ValueError: for inputs of different shapes, an unknown ``per``, a name without the
            ``per`` axis, or a non-finite metric.
    """
    if per not in ("position", "head", "all"):
        raise ValueError(f"per must be 'position', 'head' or 'all', got {per!r}")
    clean_args, corrupted_args = _as_args(clean), _as_args(corrupted)
    _check_inputs(clean_args, corrupted_args)
    points = {p.name: p for p in hook_points(model)}
    was_training = model.training
    model.eval()
    try:
        out, cache = run_with_cache(model, *clean_args, names=names, **kwargs)
        clean_metric = _scalar(metric(out), "clean")
        corrupted_metric = _scalar(metric(model(*corrupted_args, **kwargs)), "corrupted")
        axes = {}
        for name in cache:
            ax = points[name].axes
            if per != "all" and per not in ax:
                raise ValueError(f"per={per!r}: {name} has no {per} axis (its axes: {ax})")
            axes[name] = None if per == "all" else ax.index(per)
        counts = [1 if a is None else cache[n].shape[a] for n, a in axes.items()]
        values = torch.full((len(axes), max(counts)), math.nan, dtype=torch.float64)
        for row, (name, axis) in enumerate(axes.items()):
            for k in range(counts[row]):
                patched = run_with_hooks(
                    model, *corrupted_args, hooks={name: _patch(cache[name], axis, k)}, **kwargs
                )
                values[row, k] = _scalar(metric(patched), f"patched {name}[{k}]")
    finally:
        model.train(was_training)
    return PatchingResult(values, tuple(axes), per, clean_metric, corrupted_metric)


def logit_difference(
    right: int, wrong: int, *, position: int = -1, batch: int | None = None
) -> Callable[[Any], Tensor]:
    """A metric: ``logits[:, position, right] - logits[:, position, wrong]`` (mean over the batch,
    or row ``batch``), for models returning ``(logits, loss)`` or logits ``(B, T, V)``."""

    def metric(output: Any) -> Tensor:
        logits = output[0] if isinstance(output, tuple) else output
        logits = cast(Tensor, getattr(logits, "logits", logits))  # (B, T, V)
        diff = logits[:, position, right] - logits[:, position, wrong]  # (B,)
        return diff.mean() if batch is None else diff[batch]

    return metric


def labels_for(tokens: Sequence[str], result: PatchingResult) -> list[str]:
    """Column labels ``"i:token"`` for a per-position result over ``tokens``."""
    if result.per != "position":
        return result.column_labels()
    return [f"{i}:{t}" for i, t in enumerate(tokens)][: result.metric.shape[1]]


__all__ = ["PatchingResult", "activation_patching", "labels_for", "logit_difference"]
