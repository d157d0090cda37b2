"""Activation checkpointing: recompute blocks in the backward instead of keeping their tensors.

Training keeps, for the backward, the intermediate tensors of every block (attention scores,
FFN hidden activations, norm inputs: :func:`attnlab.analysis.memory.activation_bytes`). A
checkpointed block keeps only its input; the backward runs its forward again (under the same
RNG state, so dropout draws the same masks) and then its backward. Memory per checkpointed block
drops from a whole block's activations to one ``(B, T, E)`` tensor, for about one more forward
pass of compute (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost").

:func:`checkpoint_blocks` applies it from outside to a built model, to every ``every``-th block
of each stack (``every=1``: all of them; ``every=2``: blocks 0, 2, 4, ...; the "selective"
option), using PyTorch's non-reentrant :func:`torch.utils.checkpoint.checkpoint`. The blocks are
the items of every ``nn.ModuleList`` named ``layers`` (attnlab's naming: ``model.layers``,
``encoder.layers``, ``decoder.layers``). The block's ``forward`` is replaced on the instance
only: parameter names, ``state_dict`` and checkpoints are those of the plain model, and
:func:`remove_checkpointing` restores the original. Outside autograd (``torch.no_grad``,
evaluation, generation with a KV cache) the block runs as it always does.

Gradients equal the plain model's up to the order of floating-point additions (the forward is
recomputed bitwise; tests/transforms/test_activation_checkpointing.py checks 1e-6).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

_MARK = "_attnlab_checkpointed"


def model_blocks(model: nn.Module) -> list[list[nn.Module]]:
    """The blocks of ``model``: the items of each ``nn.ModuleList`` named ``layers``, one list
    per stack (an encoder-decoder has two), in module order."""
    stacks = []
    for name, module in model.named_modules():
        if name.rpartition(".")[2] == "layers" and isinstance(module, nn.ModuleList):
            stacks.append(list(module))
    return stacks


def _checkpointed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    forward: Callable[..., Any] = type(self).forward.__get__(self)
    cached = kwargs.get("cache") is not None or kwargs.get("cross_cache") is not None
    if not torch.is_grad_enabled() or cached:
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def checkpoint_blocks(model: nn.Module, every: int = 1) -> nn.Module:
    """Checkpoint every ``every``-th block of each stack of ``model`` (in place); returns it.

    Args:
        model: a built model whose blocks live in ``layers`` module lists.
        every: 1 checkpoints every block; k the blocks ``0, k, 2k, ...`` of each stack.

    Raises:
        ValueError: for ``every < 1``, or a model without blocks (naming its type).
    """
    if every < 1:
        raise ValueError(f"every must be >= 1 (1: every block), got {every}")
    stacks = model_blocks(model)
    if not any(stacks):
        raise ValueError(
            f"{type(model).__name__} has no blocks to checkpoint (no nn.ModuleList named "
            "'layers'); activation checkpointing applies to attnlab's stacks"
        )
    for stack in stacks:
        for i, block in enumerate(stack):
            checkpointed = getattr(block, _MARK, False)
            if i % every == 0 and not checkpointed:
                block.forward = types.MethodType(_checkpointed_forward, block)
                setattr(block, _MARK, True)
            elif i % every != 0 and checkpointed:
                _restore(block)
    return model


def _restore(block: nn.Module) -> None:
    del block.forward
    delattr(block, _MARK)


def remove_checkpointing(model: nn.Module) -> nn.Module:
    """Undo :func:`checkpoint_blocks` (in place); returns ``model``."""
    for stack in model_blocks(model):
        for block in stack:
            if getattr(block, _MARK, False):
                _restore(block)
    return model


def checkpointed_blocks(model: nn.Module) -> int:
    """How many blocks of ``model`` are checkpointed."""
    return sum(bool(getattr(b, _MARK, False)) for stack in model_blocks(model) for b in stack)


def activation_memory(model: nn.Module, forward: Callable[[], Any]) -> dict[str, int]:
    """Bytes ``model`` holds for the backward of ``forward()`` (a closure calling it), at the
    backward's peak, measured with :func:`torch.autograd.graph.saved_tensors_hooks` (exact
    and deterministic on the CPU; parameters excluded, each storage counted once).

    A checkpointed block's own saved tensors are not kept by the forward (PyTorch's hooks
    replace them); what it keeps is its inputs (PyTorch saves them through the hooks, so they
    are in ``saved``; ``checkpoint_inputs`` counts any that were not), and the backward
    recomputes one block at a time, so the peak is ``saved + checkpoint_inputs + recompute``,
    with ``recompute`` the largest checkpointed block's saved bytes, measured by running that
    block's forward plainly on the same inputs.

    Returns:
        ``{"saved", "checkpoint_inputs", "recompute", "peak"}`` (plain model: the last two 0).
    """
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}
    inputs: dict[int, int] = {}
    calls: list[tuple[nn.Module, tuple[Any, ...], dict[str, Any]]] = []

    def keep(t: torch.Tensor, into: dict[int, int]) -> None:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            into[s.data_ptr()] = s.nbytes()

    def pack(t: torch.Tensor) -> torch.Tensor:
        keep(t, saved)
        return t

    def pre(block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        calls.append((block, args, kwargs))
        for x in (*args, *kwargs.values()):
            if isinstance(x, torch.Tensor):
                keep(x, inputs)

    blocks = [b for stack in model_blocks(model) for b in stack if getattr(b, _MARK, False)]
    handles = [b.register_forward_pre_hook(pre, with_kwargs=True) for b in blocks]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = forward()
        del out
        recompute = max((_plain_saved(b, a, k, params) for b, a, k in calls), default=0)
    finally:
        for h in handles:
            h.remove()
    held = {k: v for k, v in inputs.items() if k not in saved}
    parts = {"saved": sum(saved.values()), "checkpoint_inputs": sum(held.values()),
             "recompute": recompute}  # fmt: skip
    return {**parts, "peak": sum(parts.values())}


def _plain_saved(
    block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], params: set[int]
) -> int:
    """Bytes one block's plain forward saves for its backward."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            storages[s.data_ptr()] = s.nbytes()
        return t

    forward = type(block).forward.__get__(block)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward(*args, **kwargs)
    del out
    return sum(storages.values())


__all__ = [
    "activation_memory",
    "checkpoint_blocks",
    "checkpointed_blocks",
    "model_blocks",
    "remove_checkpointing",
]
