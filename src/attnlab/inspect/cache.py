"""The activation cache: :func:`run_with_cache` and the :func:`capture` context manager.

``run_with_cache(model, *args, names=..., **kwargs) -> (output, cache)`` runs one forward pass
and keeps the chosen activations. Only what ``names`` selects is kept (and only the hooked
layers do any extra work), so one layer of a large model can be cached without the memory of the
whole model's activations. A cached tensor is the activation itself, detached (no copy), unless
``device``/``dtype`` ask for a converted copy (e.g. ``device="cpu", dtype=torch.float16``).

With no function attached, the output is bitwise the plain forward's, for every backend: caching
``scores``/``weights`` recomputes them on the math path beside the backend, whose output the
layer still returns.

:func:`capture` keeps activations for as long as its ``with`` block runs, so it also records
generation: each call of a point (the prompt's prefill, then one per new token with the KV
cache) is one entry of :meth:`ActivationCache.steps`.
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.inspect.hooks import attach_all
from attnlab.inspect.points import Names, is_pattern


class ActivationCache(Mapping[str, Tensor]):
    """Activations by hook name: ``cache[name]`` is the tensor of the point's latest call.

    ``cache.steps(name)`` lists every call in order (one per forward pass; generation calls the
    model once per token).
    """

    def __init__(self) -> None:
        self._steps: dict[str, list[Tensor]] = {}

    def record(self, name: str, x: Tensor) -> None:
        """Append one call's activation of ``name``."""
        self._steps.setdefault(name, []).append(x)

    def __getitem__(self, name: str) -> Tensor:
        try:
            return self._steps[name][-1]
        except KeyError:
            shown = ", ".join(list(self._steps)[:6]) + (", ..." if len(self._steps) > 6 else "")
            raise KeyError(f"{name!r} is not in the cache; cached: {shown or 'nothing'}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._steps)

    def __len__(self) -> int:
        return len(self._steps)

    def steps(self, name: str) -> list[Tensor]:
        """Every recorded call of ``name``, first first.

        Raises:
            KeyError: if ``name`` was not cached.
        """
        self[name]  # the KeyError with the list of cached names
        return list(self._steps[name])

    def stack(self, pattern: str) -> Tensor:
        """The latest tensors of the names matching ``pattern``, stacked on a new first dim
        (``cache.stack("layers.*.resid_post")`` -> ``(L, B, T, E)``), in forward order.

        Raises:
            KeyError: if no cached name matches. ValueError: if their shapes differ.
        """
        names = fnmatch.filter(self._steps, pattern) if is_pattern(pattern) else [pattern]
        names = [n for n in names if n in self._steps]
        if not names:
            raise KeyError(f"no cached name matches {pattern!r}")
        shapes = {tuple(self[n].shape) for n in names}
        if len(shapes) > 1:
            raise ValueError(f"the tensors of {pattern!r} have different shapes: {sorted(shapes)}")
        return torch.stack([self[n] for n in names])

    def nbytes(self) -> int:
        """Bytes held by the cached tensors, each storage counted once (views share one).

        Meta tensors (a model built on ``device="meta"``) have no storage to tell apart: each
        counts ``numel * element_size``, so points that are one tensor count once per name."""
        seen: dict[tuple[str, int], int] = {}
        for steps in self._steps.values():
            for t in steps:
                if t.device.type == "meta":
                    seen[("meta", id(t))] = t.numel() * t.element_size()
                    continue
                s = t.untyped_storage()
                seen[(str(t.device), s.data_ptr())] = s.nbytes()
        return sum(seen.values())

    def tensors(self) -> dict[str, Tensor]:
        """A flat ``{name: tensor}`` to save (e.g. with safetensors): contiguous copies (points
        that are one tensor, such as ``layers.0.resid_post`` and ``layers.1.resid_pre``, get one
        each); a point called once gives ``name``, one called several times ``name@i``."""
        out: dict[str, Tensor] = {}
        for name, steps in self._steps.items():
            if len(steps) == 1:
                out[name] = steps[0].clone(memory_format=torch.contiguous_format)
            else:
                out.update(
                    {f"{name}@{i}": t.clone(memory_format=torch.contiguous_format)
                     for i, t in enumerate(steps)}
                )  # fmt: skip
        return out

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} names, {self.nbytes() / 2**20:.1f} MiB)"


def _keeper(
    cache: ActivationCache,
    device: torch.device | str | None,
    dtype: torch.dtype | None,
    detach: bool,
) -> Any:
    def keep(x: Tensor, name: str) -> None:
        y = x.detach() if detach else x
        if device is not None or (dtype is not None and y.is_floating_point()):
            y = y.to(device=device, dtype=dtype if y.is_floating_point() else None)
        cache.record(name, y)

    return keep


@contextlib.contextmanager
def capture(
    model: nn.Module,
    names: Names = None,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    detach: bool = True,
) -> Iterator[ActivationCache]:
    """Within the ``with`` block, record the activations ``names`` selects into the yielded
    :class:`ActivationCache` (every call: also during ``generate``/``stream``).

    Args:
        model: a GPT, BERT, ViT, CCT or EncoderDecoderTransformer.
        names: ``None`` (every point), an exact name, a glob pattern, a list of them, or a
            predicate ``name -> bool`` (:func:`attnlab.inspect.points.select`).
        device, dtype: store converted copies (``dtype`` applies to floating tensors only).
        detach: store tensors detached from autograd (default); ``False`` keeps the graph.

    Raises:
        ValueError: for a name or pattern that matches no hook point.
        TypeError: for a model without hook points.
    """
    cache = ActivationCache()
    handle = attach_all(model, names, _keeper(cache, device, dtype, detach))
    try:
        yield cache
    finally:
        handle.remove()


def run_with_cache(
    model: nn.Module,
    *args: Any,
    names: Names = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    detach: bool = True,
    **kwargs: Any,
) -> tuple[Any, ActivationCache]:
    """``model(*args, **kwargs)`` once, keeping the activations ``names`` selects.

    Args:
        model, names, device, dtype, detach: as :func:`capture`.
        args, kwargs: the model's inputs (``ids``; ``src, tgt``; ``images``; ``mask=...``).

    Returns:
        ``(output, cache)``: the model's output (bitwise the plain forward's) and an
        :class:`ActivationCache`.

    Raises:
        ValueError, TypeError: as :func:`capture`, and whatever the forward raises.
    """
    with capture(model, names, device=device, dtype=dtype, detach=detach) as cache:
        out = model(*args, **kwargs)
    return out, cache


__all__ = ["ActivationCache", "capture", "run_with_cache"]
