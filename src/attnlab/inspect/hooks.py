"""Attaching functions to hook points: ``hooked(model, {...})`` and :func:`run_with_hooks`.

A hook is ``fn(tensor, name)``; it returns ``None`` (the activation is only read) or a tensor of
the same shape and dtype that replaces it for the rest of the forward pass. Several functions at
one point run in the order they were added, each seeing the previous one's result.

How: while at least one function is attached to a model, every module that produces a hooked
point gets a dispatcher as its ``activation_hook`` (the layers' hook sites,
:mod:`attnlab.layers.hooks`) or a forward hook (module outputs: embeddings, final norm, logits);
an encoder-decoder's ``encode``/``decode`` are wrapped to tell its shared embedding modules which
stack is running. When the last function is removed the model is exactly as before: no
attribute, forward hook or wrapper is left, so an unhooked forward pays nothing.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from torch import Tensor, nn

from attnlab.inspect.points import HookPoint, Names, hook_points, layout_of, select

HookFn = Callable[[Tensor, str], Tensor | None]


class _Dispatch:
    """A module's ``activation_hook``: its local sites -> hook names -> the attached functions."""

    def __init__(self, state: _State, points: list[HookPoint]) -> None:
        self.state = state
        self.names = {(p.site, p.scope): p.name for p in points}

    def name(self, site: str | None) -> str | None:
        return self.names.get((site, self.state.scope)) or self.names.get((site, None))

    def wants(self, site: str) -> bool:
        name = self.name(site)
        return name is not None and name in self.state.handlers

    def __call__(self, site: str, x: Tensor) -> Tensor:
        name = self.name(site)
        return x if name is None else self.state.fire(name, x)


class _State:
    """The functions attached to one model and what is installed for them."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.points = {p.name: p for p in hook_points(model)}
        self.handlers: dict[str, list[HookFn]] = {}
        self.scope: str | None = None
        self._installed: list[Callable[[], None]] = []

    def fire(self, name: str, x: Tensor) -> Tensor:
        for fn in list(self.handlers.get(name, ())):
            y = fn(x, name)
            if y is None:
                continue
            if not isinstance(y, Tensor) or y.shape != x.shape or y.dtype != x.dtype:
                got = f"{tuple(y.shape)} {y.dtype}" if isinstance(y, Tensor) else type(y).__name__
                raise ValueError(
                    f"hook on {name!r} returned {got}; expected None or a tensor of shape "
                    f"{tuple(x.shape)} and dtype {x.dtype}"
                )
            x = y
        return x

    def add(self, pairs: list[tuple[str, HookFn]]) -> None:
        """Attach each ``(name, fn)``, then install what they need (once)."""
        if pairs:
            _STATES.setdefault(self.model, self)
        for name, fn in pairs:
            self.handlers.setdefault(name, []).append(fn)
        self._reinstall()

    def remove(self, pairs: list[tuple[str, HookFn]]) -> None:
        """Detach each ``(name, fn)`` (those not attached are ignored), then reinstall."""
        for name, fn in pairs:
            fns = self.handlers.get(name, [])
            if fn in fns:
                fns.remove(fn)
            if not fns:
                self.handlers.pop(name, None)
        self._reinstall()

    def _reinstall(self) -> None:
        """Install exactly what the attached functions need (nothing when none is left)."""
        for undo in reversed(self._installed):
            undo()
        self._installed = []
        if not self.handlers:
            if _STATES.get(self.model) is self:
                del _STATES[self.model]
            return
        by_module: dict[int, list[HookPoint]] = {}
        for name in self.handlers:
            p = self.points[name]
            by_module.setdefault(id(p.module), []).append(p)
        for points in by_module.values():
            module = points[0].module
            sites = [p for p in points if p.site is not None]
            outputs = [p for p in points if p.site is None]
            if sites:
                # An instance attribute over the layer's class default None (layers/hooks.py).
                module.__dict__["activation_hook"] = _Dispatch(self, sites)
                self._installed.append(
                    functools.partial(module.__dict__.pop, "activation_hook", None)
                )
            if outputs:
                dispatch = _Dispatch(self, outputs)
                handle = module.register_forward_hook(lambda _m, _a, out, d=dispatch: d(None, out))
                self._installed.append(handle.remove)
        if any(self.points[n].scope is not None for n in self.handlers):
            self._wrap_stacks()

    def _wrap_stacks(self) -> None:
        """Scope the points of modules several stacks share: each stack's method (its
        :attr:`~attnlab.models.family.HookStack.runs_in`) sets the scope while it runs."""
        model = self.model
        inner = getattr(model, "_orig_mod", None)
        while isinstance(inner, nn.Module):  # torch.compile's wrapper calls what it wraps
            model, inner = inner, getattr(inner, "_orig_mod", None)
        for stack in layout_of(model).stacks:
            method, scope = stack.runs_in, stack.scope
            if method is None or scope is None:
                continue
            bound = getattr(model, method)

            def scoped(*args: Any, _f: Any = bound, _s: str = scope, **kwargs: Any) -> Any:
                outer, self.scope = self.scope, _s
                try:
                    return _f(*args, **kwargs)
                finally:
                    self.scope = outer

            object.__setattr__(model, method, scoped)
            self._installed.append(functools.partial(object.__delattr__, model, method))


_STATES: weakref.WeakKeyDictionary[nn.Module, _State] = weakref.WeakKeyDictionary()


class HookHandle:
    """Detaches the functions a :func:`add_hooks` call attached (``remove()``, idempotent)."""

    def __init__(self, state: _State, pairs: list[tuple[str, HookFn]]) -> None:
        self._state, self._pairs = state, pairs

    def remove(self) -> None:
        self._state.remove(self._pairs)
        self._pairs = []


def _state(model: nn.Module) -> _State:
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected an attnlab model (nn.Module), got {type(model).__name__}")
    state = _STATES.get(model)
    return _State(model) if state is None else state  # registered by its first add


def add_hooks(model: nn.Module, hooks: Mapping[str, HookFn]) -> HookHandle:
    """Attach ``{name or glob pattern: fn}`` to ``model`` until ``handle.remove()``.

    Raises:
        ValueError: for a name or pattern that matches no hook point (see :func:`select`).
        TypeError: for a model without hook points or a function that is not callable.
    """
    state = _state(model)
    pairs: list[tuple[str, HookFn]] = []
    for spec, fn in hooks.items():
        if not callable(fn):
            raise TypeError(f"the hook for {spec!r} is not callable: {fn!r}")
        pairs += [(name, fn) for name in select(list(state.points), spec)]
    pairs = list(dict.fromkeys(pairs))  # a function once per point, whatever patterns overlap
    state.add(pairs)
    return HookHandle(state, pairs)


def attach_all(model: nn.Module, names: Names, fn: HookFn) -> HookHandle:
    """Attach one function to every point ``names`` selects (see :func:`select`)."""
    state = _state(model)
    pairs = [(name, fn) for name in select(list(state.points), names)]
    state.add(pairs)
    return HookHandle(state, pairs)


@contextlib.contextmanager
def hooked(model: nn.Module, hooks: Mapping[str, HookFn]) -> Iterator[nn.Module]:
    """Within the ``with`` block, ``model`` runs with ``hooks`` attached (removed on exit, also
    when the block raises). Yields the model.

    Example: ``with hooked(gpt, {"layers.1.attn.z": fn}): gpt(ids)``.

    Raises:
        ValueError, TypeError: as :func:`add_hooks`.
    """
    handle = add_hooks(model, hooks)
    try:
        yield model
    finally:
        handle.remove()


def run_with_hooks(model: nn.Module, *args: Any, hooks: Mapping[str, HookFn], **kwargs: Any) -> Any:
    """``model(*args, **kwargs)`` with ``hooks`` (``{name or pattern: fn(tensor, name)}``)
    attached for this call only; returns the model's output.

    Raises:
        ValueError, TypeError: as :func:`add_hooks`, and whatever the forward raises (the hooks
            are removed first).
    """
    with hooked(model, hooks):
        return model(*args, **kwargs)


def is_hooked(model: nn.Module) -> bool:
    """Whether any function is attached to ``model`` now."""
    return model in _STATES


__all__ = [
    "HookFn",
    "HookHandle",
    "add_hooks",
    "attach_all",
    "hooked",
    "is_hooked",
    "run_with_hooks",
]
