"""Measured counterparts of the closed forms: FLOPs counted on a real pass, saved activations,
step times, peak throughput and model FLOP utilisation (MFU).

FLOPs are counted with ``torch.utils.flop_counter.FlopCounterMode``, which sees matrix products
and convolutions (``mm``, ``addmm``, ``bmm``, ``convolution``, the fused attention kernels of CUDA)
and nothing else. PyTorch's CPU kernel for ``scaled_dot_product_attention`` has no formula there
(it counts 0), so the counting helpers switch every attention layer to the ``"math"`` backend,
whose ``QKᵀ`` and ``AV`` are plain ``bmm``s, for the duration of the count
(:func:`use_attention_backend`, an outside-in transform on a built model).

Shapes: B batch, T (target) length, S source length, C channels, H = W image side.
"""

from __future__ import annotations

import contextlib
import re
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from attnlab.analysis.flops import check_length
from attnlab.layers.attention_backends import AttentionBackend, get_attention_backend
from attnlab.layers.multihead import MultiHeadAttention
from attnlab.models.family import find_family


@contextlib.contextmanager
def use_attention_backend(
    model: nn.Module, backend: str | AttentionBackend = "math"
) -> Iterator[nn.Module]:
    """Temporarily run every :class:`MultiHeadAttention` of ``model`` with ``backend``.

    Raises:
        ValueError: for an unknown backend name.
    """
    fn = get_attention_backend(backend)
    saved = [(m, m.backend) for m in model.modules() if isinstance(m, MultiHeadAttention)]
    try:
        for m, _ in saved:
            m.backend = fn
        yield model
    finally:
        for m, old in saved:
            m.backend = old


def example_inputs(
    config: Any,
    *,
    batch: int = 1,
    seq_len: int | None = None,
    src_len: int | None = None,
    device: torch.device | str = "cpu",
) -> tuple[tuple[Tensor, ...], dict[str, Any]]:
    """Random ``(args, kwargs)`` for the forward of the model ``config`` describes (what its
    family declares: :attr:`~attnlab.models.family.Family.example_inputs`).

    Token ids avoid the pad id (so no padding mask changes the work); ViT gets images of its
    configured size (``seq_len`` must then be ``None`` or patches + 1).

    Raises:
        ValueError: for non-positive sizes, a ViT length other than its own, or an unknown config.
    """
    check_length("batch", batch)
    family = None if isinstance(config, type) else find_family(config)
    if family is None or family.example_inputs is None:
        raise ValueError(f"no example inputs for {type(config).__name__}")
    g = torch.Generator().manual_seed(0)
    args, kwargs = family.example_inputs(
        config, batch=batch, seq_len=seq_len, src_len=src_len, generator=g
    )
    return tuple(a.to(device) for a in args), {k: v.to(device) for k, v in kwargs.items()}


def _scalar(out: Any) -> Tensor:
    """The sum of every floating tensor in a (nested) model output: a loss touching them all."""
    if isinstance(out, Tensor):
        return (
            out.float().sum()
            if out.is_floating_point() and out.requires_grad
            else out.new_zeros(())
        )
    parts = [_scalar(o) for o in (out.values() if isinstance(out, dict) else out) if o is not None]
    parts = [p for p in parts if p.requires_grad]
    if not parts:
        raise ValueError("the model output has no tensor that requires grad")
    return torch.stack(parts).sum()


_LAYER_INDEX = re.compile(r"\.layers\.\d+|^layers\.\d+")


def _component(path: str) -> str:
    """Module path -> component name: drop the root class and the layer index."""
    path = path.split(".", 1)[1] if "." in path else ""
    return _LAYER_INDEX.sub(lambda m: "layers" if m.group().startswith("layers") else "", path)


def _exclusive(counts: dict[str, int]) -> dict[str, int]:
    """Per-module FLOPs without those of the (called) sub-modules."""
    out = {}
    for path, total in counts.items():
        inner = [c for c in counts if c.startswith(path + ".")]
        direct = [c for c in inner if not any(c.startswith(o + ".") for o in inner if o != c)]
        out[path] = total - sum(counts[c] for c in direct)
    return out


@dataclass(frozen=True)
class MeasuredFlops:
    """FLOPs counted by ``FlopCounterMode`` on one pass.

    Attributes:
        forward: total forward FLOPs. backward: total backward FLOPs (0 when not run).
        by_module: forward FLOPs per component, summed over layers, with the score and weighted
            sum products under their attention module (``"layers.self_attn"``); backward
            attribution to modules is unreliable in PyTorch, so only its total is kept.
        by_op: forward FLOPs per aten op (``"aten.addmm"``...).
    """

    forward: int
    backward: int
    by_module: dict[str, int]
    by_op: dict[str, int]

    @property
    def training(self) -> int:
        return self.forward + self.backward


def count_flops(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    *,
    backward: bool = False,
    attention_backend: str | AttentionBackend | None = "math",
) -> MeasuredFlops:
    """Count the FLOPs of ``model(*args, **kwargs)`` (and of a backward pass) with
    ``FlopCounterMode``.

    Args:
        backward: also back-propagate the sum of every floating output (every product's
            backward runs once, as in training).
        attention_backend: backend for the count (``None`` keeps the model's); the default
            ``"math"`` makes the attention products visible on CPU.
    """
    kwargs = kwargs or {}
    ctx = (
        use_attention_backend(model, attention_backend)
        if attention_backend is not None
        else contextlib.nullcontext()
    )
    with ctx, torch.set_grad_enabled(backward):
        fwd = FlopCounterMode(display=False)
        with fwd:
            out = model(*args, **kwargs)
        bwd_total = 0
        if backward:
            loss = _scalar(out)
            bwd = FlopCounterMode(display=False)
            with bwd:
                loss.backward()
            bwd_total = bwd.get_total_flops()
    counts = {
        path: sum(ops.values()) for path, ops in fwd.get_flop_counts().items() if path != "Global"
    }
    by_module: dict[str, int] = {}
    for path, flops in _exclusive(counts).items():
        if flops:
            name = _component(path)
            by_module[name] = by_module.get(name, 0) + flops
    by_op = {str(op): n for op, n in fwd.get_flop_counts()["Global"].items()}
    return MeasuredFlops(fwd.get_total_flops(), bwd_total, by_module, by_op)


def measure_flops(
    config: Any,
    seq_len: int | None = None,
    *,
    batch: int = 1,
    src_len: int | None = None,
    backward: bool = False,
    device: str = "cpu",
) -> MeasuredFlops:
    """Build the model ``config`` describes and count one pass (see :func:`count_flops`).

    Args:
        device: ``"cpu"`` really runs the pass (small configs). ``"meta"`` builds the model
            without allocating and feeds it CPU token ids, so only shapes flow: a 175B GPT is
            counted in seconds. It works for models whose forward creates no CPU tensor that
            meets the meta activations (attnlab's GPT with learned or no positions); others
            raise ``RuntimeError`` (device mismatch) or ``NotImplementedError``.
    """
    from attnlab.models import build_model  # models <- analysis; a function-level import

    if device not in ("cpu", "meta"):
        raise ValueError(f"device must be 'cpu' or 'meta', got {device!r}")
    model = build_model(config, device=device)
    args, kwargs = example_inputs(config, batch=batch, seq_len=seq_len, src_len=src_len)
    return count_flops(model, args, kwargs, backward=backward)


def module_flops(flops_by_component: dict[str, int]) -> dict[str, int]:
    """Analytic per-component FLOPs regrouped like :attr:`MeasuredFlops.by_module` (scores and
    weighted sum folded into their attention module)."""
    out: dict[str, int] = {}
    for name, f in flops_by_component.items():
        parent, _, leaf = name.rpartition(".")
        key = parent if leaf in ("scores", "weighted_sum") else name
        out[key] = out.get(key, 0) + f
    return out


# -- saved activations ---------------------------------------------------------------------------


def measure_activation_bytes(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    *,
    attention_backend: str | AttentionBackend | None = "math",
) -> int:
    """Bytes of the tensors autograd saves for the backward of one forward pass.

    Every distinct storage is counted once (views share it); the parameters are excluded.
    """
    kwargs = kwargs or {}
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params and t.device.type != "meta":
            storages[s.data_ptr()] = s.nbytes()
        return t

    ctx = (
        use_attention_backend(model, attention_backend)
        if attention_backend is not None
        else contextlib.nullcontext()
    )
    with ctx, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(*args, **kwargs)
    del out
    return sum(storages.values())


# -- time, peak and MFU --------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(
    fn: Callable[[], object],
    *,
    repeats: int = 5,
    warmup: int = 1,
    device: torch.device | str = "cpu",
) -> float:
    """Median wall time of ``fn()`` in seconds (synchronising CUDA around each call)."""
    check_length("repeats", repeats)
    dev = torch.device(device)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        _sync(dev)
        t0 = time.perf_counter()
        fn()
        _sync(dev)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_step_time(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    *,
    backward: bool = True,
    repeats: int = 5,
    warmup: int = 1,
) -> float:
    """Median seconds of one forward (+ backward) of ``model`` on these inputs."""
    kwargs = kwargs or {}
    device = next(model.parameters()).device

    def step() -> None:
        with torch.set_grad_enabled(backward):
            out = model(*args, **kwargs)
            if backward:
                _scalar(out).backward()
                model.zero_grad(set_to_none=True)

    return time_call(step, repeats=repeats, warmup=warmup, device=device)


def measure_peak_flops(
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    size: int = 1024,
    repeats: int = 5,
) -> float:
    """Achieved FLOP/s of a square ``size`` matmul: a practical stand-in for the peak.

    Vendor peaks (e.g. 989 TFLOP/s dense bf16 for an H100 SXM) are higher; pass them to
    :func:`mfu` when known.
    """
    check_length("size", size)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    seconds = time_call(lambda: a @ b, repeats=repeats, warmup=2, device=device)
    return 2 * size**3 / seconds


def mfu(flops_per_step: float, step_time_s: float, peak_flops_per_s: float) -> float:
    """Model FLOP utilisation: ``flops_per_step / step_time_s / peak_flops_per_s``.

    ``flops_per_step`` should be the model's FLOPs without recomputation (e.g.
    ``forward_flops(...).training``), as in PaLM's definition.

    Raises:
        ValueError: for non-positive inputs.
    """
    for name, v in (("flops_per_step", flops_per_step), ("step_time_s", step_time_s)):
        if not v > 0:
            raise ValueError(f"{name} must be positive, got {v}")
    if not peak_flops_per_s > 0:
        raise ValueError(f"peak_flops_per_s must be positive, got {peak_flops_per_s}")
    return flops_per_step / step_time_s / peak_flops_per_s


__all__ = [
    "MeasuredFlops",
    "count_flops",
    "example_inputs",
    "measure_activation_bytes",
    "measure_flops",
    "measure_peak_flops",
    "measure_step_time",
    "mfu",
    "module_flops",
    "time_call",
    "use_attention_backend",
]
