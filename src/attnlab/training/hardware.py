"""Devices and numeric precision of a training run: the trainer's ``device`` and ``precision``.

Devices (:func:`resolve_device`): ``"cpu"``, ``"cuda"`` (the current CUDA device), ``"cuda:N"``,
``"mps"`` (Apple GPUs), ``"auto"`` (CUDA if available, else MPS, else the CPU), or ``None``: the
device the model's parameters are on (attnlab 0.1's behaviour). Under torchrun the process's
device decides (``cuda:LOCAL_RANK`` or the CPU) and a ``device`` naming another is refused. A
device this machine lacks is refused naming it and what there is.

Precision (:class:`Precision`):

- ``"fp32"``: float32 everywhere.
- ``"bf16-mixed"``: the forward and the loss run under ``torch.autocast(dtype=bfloat16)``
  (matrix products in bfloat16, reductions, the loss and the gradients' accumulation in
  float32); the weights, their gradients and the optimizer state stay float32 (the weights
  *are* the master copy: autocast casts them per operation).
- ``"fp16-mixed"``: the same with float16, whose range is small (max 65504, smallest normal
  6e-5): the loss is multiplied by a scale before the backward (``torch.amp.GradScaler``), the
  gradients are unscaled before clipping, and a step whose gradients overflowed (inf/NaN) is
  skipped and the scale halved; after 2000 clean steps the scale doubles. Skipped steps are
  counted (:attr:`Precision.skipped`, logged in ``metrics.jsonl`` as ``skipped_steps``); the
  scaler's state is part of a checkpoint, so a resume continues exactly.
- ``"bf16"``: the model's weights themselves in bfloat16 (``model.to(bfloat16)``), so its
  gradients and Adam's moments are bfloat16 too: half the memory of the mixed modes for the
  weights, gradients and optimizer state, but an update smaller than one bfloat16 step of a
  weight (8 bits of mantissa: about 0.4% of it) is lost, so learning rates that suit float32
  stall or drift; no loss scaling (bfloat16 has float32's range). Floating inputs (images) are
  cast to bfloat16.

On the CPU the mixed modes compute attention itself in float32
(:func:`attnlab.transforms.float32_attention`): PyTorch's CPU attention backward is several
times slower in 16 bits, and float32 scores are more accurate; projections and FFNs stay under
autocast. The readable ``"math"`` backend is left under autocast: its two products run in 16
bits like any matmul while its scores, masking and softmax are float32 (the train step of
``cct-cifar`` at batch 128, bf16 autocast, 2 threads: 0.182 s with it against 0.192 s with
float32 SDPA, ``benchmarks/results/cct_attention_step.md``). On CUDA attention runs in 16 bits
(flash/memory-efficient SDPA kernels).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.layers.attention_backends import math_attention
from attnlab.transforms.precision import float32_attention

PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed", "bf16")
_AUTOCAST = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}


# /proc/cpuinfo flags of CPUs that multiply bfloat16 in hardware (AVX512-BF16, Intel AMX);
# other x86 CPUs emulate it, slower than float32
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags from ``path`` (Linux), empty where there is no such file."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def native_bf16(device: str | torch.device | None = None) -> bool:
    """Whether ``device`` (default: the CPU) multiplies bfloat16 matrices in hardware: a CUDA
    device that supports bfloat16, or a CPU whose flags include one of :data:`BF16_CPU_FLAGS`.
    Where it does not, ``bf16-mixed`` is usually slower than ``fp32``."""
    kind = torch.device(device).type if device is not None else "cpu"
    if kind == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if kind != "cpu":
        return False
    return bool(_host_cpu_flags() & set(BF16_CPU_FLAGS))


@functools.cache
def _host_cpu_flags() -> frozenset[str]:
    return cpu_flags()


def available_devices() -> list[str]:
    """The devices this process can train on: ``cpu``, ``cuda:0..N-1``, ``mps``."""
    out = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        out.append("mps")
    return out


def resolve_device(
    name: str | None, model: nn.Module | None = None, process_device: torch.device | None = None
) -> torch.device:
    """The device a run trains on (see the module docstring).

    Args:
        name: ``cpu``, ``cuda``, ``cuda:N``, ``mps``, ``auto`` or ``None`` (the model's).
        model: its parameters' device is the answer for ``None``.
        process_device: a distributed process's own device (``None``: a single process).

    Raises:
        ValueError: for an unknown name, or a device this machine does not have (naming the
            ones it has), or one other than the process's under torchrun.
    """
    if process_device is not None:
        same = name in (None, "auto") or (name == "cuda" and process_device.type == "cuda")
        if not same and torch.device(str(name)) != process_device:
            raise ValueError(
                f"device={name!r}: under torchrun each process trains on its own device "
                f"({process_device}); give device=auto or leave it unset"
            )
        return process_device
    if name is None:
        first = next(iter(model.parameters()), None) if model is not None else None
        return first.device if first is not None else torch.device("cpu")
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("mps" if torch.backends.mps.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(
            f"device={name!r} is not valid; choose cpu, cuda, cuda:N, mps or auto"
        ) from None
    return _check_present(name, device)


def _check_present(name: str, device: torch.device) -> torch.device:
    have = ", ".join(available_devices())
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only"
            raise ValueError(
                f"device={name!r} is not available: no CUDA device (this PyTorch "
                f"{torch.__version__} is {build}); this machine has: {have}"
            )
        index = torch.cuda.current_device() if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"device={name!r} is not available: {torch.cuda.device_count()} CUDA "
                f"device(s); this machine has: {have}"
            )
        return torch.device("cuda", index)
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={name!r} is not available (no MPS); this machine has: {have}")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device={name!r} is not valid; choose cpu, cuda, cuda:N, mps or auto")
    return device


def cast_floats(batch: Any, dtype: torch.dtype) -> Any:
    """``batch`` (tensors, or tuples/lists/dicts of them) with its floating tensors in
    ``dtype`` (integer ids and masks unchanged)."""
    if isinstance(batch, Tensor):
        return batch.to(dtype) if batch.is_floating_point() else batch
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a NamedTuple
        return type(batch)(*(cast_floats(b, dtype) for b in batch))
    if isinstance(batch, tuple | list):
        return type(batch)(cast_floats(b, dtype) for b in batch)
    if isinstance(batch, Mapping):
        return {k: cast_floats(v, dtype) for k, v in batch.items()}
    return batch


class Precision:
    """The numeric precision of a run on ``device`` (see the module docstring).

    Args:
        name: one of :data:`PRECISIONS`.
        device: where the run computes.

    Raises:
        ValueError: for an unknown name, or a precision ``device`` cannot run (naming both).
    """

    def __init__(self, name: str, device: torch.device) -> None:
        if name not in PRECISIONS:
            raise ValueError(f"precision={name!r} is not valid; choose one of {PRECISIONS}")
        if device.type == "cuda" and "bf16" in name and not torch.cuda.is_bf16_supported():
            raise ValueError(
                f"precision={name!r}: {torch.cuda.get_device_name(device)} has no bfloat16;"
                " use fp16-mixed"
            )
        self.name, self.device = name, device
        self.autocast_dtype = _AUTOCAST.get(name)
        self.scaler = torch.amp.GradScaler(device.type) if name == "fp16-mixed" else None
        self.skipped = 0  # optimizer steps skipped for overflowing gradients (fp16-mixed)

    @property
    def param_dtype(self) -> torch.dtype:
        """The dtype the weights are kept in."""
        return torch.bfloat16 if self.name == "bf16" else torch.float32

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """Put ``model``'s weights in :attr:`param_dtype` and, for the mixed modes on the CPU,
        its attention in float32 (the ``"math"`` backend excepted; in place); returns it."""
        if self.name == "bf16":
            model.to(torch.bfloat16)
        elif self.autocast_dtype is not None and self.device.type == "cpu":
            float32_attention(model, skip=(math_attention,))
        return model

    def batch(self, batch: Any) -> Any:
        """``batch`` with floating tensors in the weights' dtype (pure ``bf16``)."""
        return cast_floats(batch, torch.bfloat16) if self.name == "bf16" else batch

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The context the forward and the loss run in (autocast, or nothing)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def scale(self, loss: Tensor) -> Tensor:
        """The loss the backward starts from (multiplied by the loss scale under fp16)."""
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients by the loss scale (before clipping or measuring them)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step ``optimizer`` unless the gradients overflowed (fp16); returns whether it
        stepped, and updates the loss scale."""
        if self.scaler is None:
            optimizer.step()
            return True
        scale = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        stepped = not self.scaler.get_scale() < scale  # the scale drops only on overflow
        self.skipped += not stepped
        return stepped

    @property
    def loss_scale(self) -> float | None:
        """The current loss scale (``None`` without loss scaling)."""
        return self.scaler.get_scale() if self.scaler is not None else None

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the precision, skipped steps, the scaler's state."""
        scaler = self.scaler.state_dict() if self.scaler is not None else None
        return {"name": self.name, "skipped": self.skipped, "scaler": scaler}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (of any precision: a scaler state is used only under
        fp16-mixed, which starts a fresh scale when the checkpoint had none)."""
        self.skipped = int(state.get("skipped", 0))
        scaler = state.get("scaler")
        if self.scaler is not None and scaler:
            self.scaler.load_state_dict(dict(scaler))


def compile_warm_up(
    model: nn.Module,
    module: nn.Module,
    loss: Callable[[], Tensor],
    precision: Precision,
    optimizer: torch.optim.Optimizer,
) -> float:
    """Run ``loss()`` (a forward of the compiled ``model``) and its backward once in training
    mode, so that ``torch.compile`` compiles both, then put back what that touched: the
    gradients (none), the buffers of ``module`` (BatchNorm statistics) and the CPU and CUDA RNG
    states (dropout). Returns the seconds it took: the compile time, reported apart."""
    start = time.monotonic()
    buffers = [(b, b.clone()) for b in module.buffers()]
    cpu_rng = torch.get_rng_state()
    cuda_rng = (
        torch.cuda.get_rng_state(precision.device) if precision.device.type == "cuda" else None
    )
    model.train()
    with precision.autocast():
        value = loss()
    value.backward()
    optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        for b, saved in buffers:
            b.copy_(saved)
    torch.set_rng_state(cpu_rng)
    if cuda_rng is not None:
        torch.cuda.set_rng_state(cuda_rng, precision.device)
    return time.monotonic() - start


def prepare_for_precision(
    model: nn.Module, precision: str, device: torch.device | None = None
) -> nn.Module:
    """:meth:`Precision.prepare_model` of ``precision`` on ``device`` (default: where the
    model's weights are), for a model rebuilt outside a trainer (evaluation, generation)."""
    if device is None:
        first = next(iter(model.parameters()), None)
        device = first.device if first is not None else torch.device("cpu")
    return Precision(precision, device).prepare_model(model)


__all__ = [
    "BF16_CPU_FLAGS",
    "PRECISIONS",
    "Precision",
    "available_devices",
    "cast_floats",
    "compile_warm_up",
    "cpu_flags",
    "native_bf16",
    "prepare_for_precision",
    "resolve_device",
]
