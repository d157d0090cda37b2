"""``torch.compile`` of a built model, as a transform applied from outside.

:func:`compile_model` returns PyTorch's compiled wrapper of the model (TorchDynamo captures the
forward, AOTAutograd derives the backward, Inductor generates the kernels: C++/OpenMP on the
CPU, Triton on CUDA). The wrapper holds the model as ``_orig_mod``; :func:`uncompiled` gives it
back, and everything that names parameters (checkpoints, optimizer state, exports) uses the
uncompiled model, so a compiled run's checkpoints are those of an eager run and either kind
resumes the other.

Compilation happens at the first call with a new input shape, dtype, ``requires_grad`` or
train/eval mode and takes seconds to minutes; :class:`attnlab.training.Trainer` runs it once
before training (on a validation batch, restoring every RNG and buffer it touches), so that its
duration is reported apart from the step times. Varying shapes (translation's token batches)
recompile a few times and then run with dynamic shapes.

Deviations: none in what is computed; Inductor may fuse and reorder floating-point operations,
so compiled and eager results agree to rounding (1e-5 in tests/training/test_hardware.py), not
bitwise, and random ops (dropout) draw from Inductor's own generator seeded from torch's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def compile_model(model: nn.Module, **options: Any) -> nn.Module:
    """``torch.compile(model, **options)`` (``mode``, ``fullgraph``, ``dynamic``, ...).

    Raises:
        TypeError: for a model that is already compiled.
    """
    if is_compiled(model):
        raise TypeError("the model is already compiled; compile the model itself once")
    return torch.compile(model, **options)  # type: ignore[return-value]


def is_compiled(model: nn.Module) -> bool:
    """Whether ``model`` is a ``torch.compile`` wrapper."""
    return hasattr(model, "_orig_mod") and hasattr(model, "dynamo_ctx")


def uncompiled(model: nn.Module) -> nn.Module:
    """The module a ``torch.compile`` wrapper wraps (``model`` itself when not compiled)."""
    while is_compiled(model):
        model = model._orig_mod  # type: ignore[assignment]
    return model


__all__ = ["compile_model", "is_compiled", "uncompiled"]
