"""Attention scaling benchmark: time and peak memory of each backend as the sequence grows.

The lesson's exercise 6 ("compare the standard implementation with SDPA at different sequence
lengths, for speed and memory") for every registered backend. Each (backend, length, mode) case runs
in a *fresh subprocess* (``python -m attnlab.analysis.attention_bench --worker SPEC``) so that one
case's allocations cannot hide in another's peak, and a case that would not fit is never started:
its peak memory is estimated first (:func:`estimate_peak_bytes`) and, above the cap, the case is
reported as ``"skipped"``. A case that crashes or runs past the timeout is reported, not raised.

Measured per case: the median wall time of ``repeats`` calls (fewer once they add up to
``time_budget_s``) after ``warmup`` calls (forward under ``no_grad``, or forward + backward), and
the peak memory of the first call above what the inputs already use -- on CPU the resident-set
high-water mark (``VmHWM``, reset through ``/proc/self/clear_refs`` where Linux allows, else the
``ru_maxrss`` delta), on CUDA the allocator's ``max_memory_allocated``.
:mod:`attnlab.analysis.attention_bench_report` then fits the exponent of time (and memory) vs n
on a log-log scale, finds the length from which each backend beats ``math`` and the largest n each
backend handled under the cap, prints the tables and draws the plot. ``attnlab bench attention``
(:func:`add_bench_subparser`, :func:`run_bench`) and ``benchmarks/attention_scaling.py`` drive it.

Shapes: B batch, H heads, n sequence length (T = S = n), D head dim.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

RESULT_MARKER = "ATTNLAB_BENCH_RESULT "
SPARSE_BACKENDS: tuple[str, ...] = ("sparse_strided", "sparse_fixed", "bigbird", "lsh")
DEFAULT_BACKENDS: tuple[str, ...] = (
    *("math", "sdpa", "chunked", "sliding_window", "linear"),
    *SPARSE_BACKENDS,
)
DEFAULT_SEQ_LENS: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
MODES = ("forward", "forward_backward")
_ITEMSIZE = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """What to measure. Sizes: ``batch`` B, ``heads`` H, ``d_head`` D; ``seq_lens`` the n's."""

    backends: tuple[str, ...] = DEFAULT_BACKENDS
    seq_lens: tuple[int, ...] = DEFAULT_SEQ_LENS
    batch: int = 1
    heads: int = 8
    d_head: int = 64
    causal: bool = True
    backward: bool = False  # also measure forward + backward
    window: int = 256  # for sliding_window
    sparse_block: int | None = None  # sparse_strided/fixed's l; None: sqrt(n) (O(n·sqrt(n)))
    dtype: str = "float32"
    device: str = "cpu"
    repeats: int = 5
    warmup: int = 1
    time_budget_s: float = 60.0  # stop repeating once the timed calls of a case took this long
    threads: int | None = None  # torch.set_num_threads in each worker; None: torch's default
    mem_cap_gb: float = 4.0
    timeout_s: float = 1800.0
    fit_range: tuple[int, int] = (1024, 16384)  # n range of the exponent fit

    def __post_init__(self) -> None:
        if self.dtype not in _ITEMSIZE:
            raise ValueError(f"dtype {self.dtype!r}; valid: {', '.join(_ITEMSIZE)}")
        for name in ("batch", "heads", "d_head", "window", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.sparse_block is not None and self.sparse_block < 1:
            raise ValueError(f"sparse_block must be positive, got {self.sparse_block}")
        if any(n < 1 for n in self.seq_lens) or not self.seq_lens:
            raise ValueError(f"seq_lens must be positive lengths, got {self.seq_lens}")
        if min(self.mem_cap_gb, self.timeout_s, self.time_budget_s) <= 0 or self.warmup < 0:
            raise ValueError(
                "mem_cap_gb, timeout_s and time_budget_s must be positive, warmup non-negative"
            )

    @property
    def modes(self) -> tuple[str, ...]:
        return MODES if self.backward else MODES[:1]


@dataclass(kw_only=True)
class CaseResult:
    """One (backend, n, mode) measurement. ``status``: ok | skipped | error | timeout."""

    backend: str
    n: int
    mode: str
    status: str
    est_mem_bytes: int
    time_s: float | None = None  # median
    times_s: list[float] = field(default_factory=list)
    peak_mem_bytes: int | None = None
    mem_method: str | None = None
    threads: int | None = None
    reason: str | None = None


def estimate_peak_bytes(backend: str, n: int, config: BenchConfig, *, backward: bool) -> int:
    """A deliberately generous estimate of a case's peak memory (inputs included), in bytes.

    Used only to skip cases that would not fit under the cap. Quadratic terms: the math path keeps
    a few ``B·H·n²`` score-sized buffers (more when autograd saves them for backward).
    """
    f = _ITEMSIZE[config.dtype]
    bh, d = config.batch * config.heads, config.d_head
    io = bh * n * d * f * (4 + (4 if backward else 0))  # q, k, v, out (+ their grads, grad_out)
    if backend == "math":
        work = bh * n * n * (f * (5 if backward else 3) + 1)  # measured: 3 (5) score buffers
    elif backend == "chunked":
        from attnlab.layers.attention_chunked import DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q

        tile = bh * min(n, DEFAULT_BLOCK_Q) * min(n, DEFAULT_BLOCK_K) * 4
        work = 8 * tile + bh * n * d * 4 * (6 if backward else 3)
    elif backend == "sliding_window":
        span = min(64, max(16, config.window)) + config.window
        work = bh * n * span * 4 * (12 if backward else 5) + bh * n * d * 4 * 4
    elif backend == "linear":
        work = bh * n * (64 * 4 * 4 + d * 4 * 8) * (3 if backward else 1)
    elif backend in SPARSE_BACKENDS:  # the keys each query sees, times ~8 buffers of scores
        keys = _sparse_keys_per_query(backend, n, config)
        work = bh * n * keys * 4 * (16 if backward else 8) + bh * n * d * 4 * 8
    else:  # sdpa's fused kernels and unknown backends: linear with a generous constant
        work = bh * n * d * 4 * (16 if backward else 8) + bh * min(n, 1024) ** 2 * 4
    return int(1.25 * (io + work)) + (64 << 20)


def sparse_block(n: int, config: BenchConfig) -> int:
    """The Sparse Transformer's block ``l`` at length n: ``config.sparse_block``, else the power
    of two nearest ``sqrt(n)`` (the paper's choice, ``O(n·sqrt(n))``)."""
    if config.sparse_block is not None:
        return config.sparse_block
    return 1 << max(0, int(math.log2(n) / 2 + 0.5))


def backend_options(backend: str, n: int, config: BenchConfig) -> dict[str, Any]:
    """The options a case's backend is built with (``get_attention_backend(name, **options)``)."""
    if backend == "sliding_window":
        return {"window": config.window}
    if backend in ("sparse_strided", "sparse_fixed"):
        return {"block": sparse_block(n, config)}
    return {}  # bigbird, lsh: their defaults (blocks/chunks of 64: O(n))


def _sparse_keys_per_query(backend: str, n: int, config: BenchConfig) -> int:
    """Score slots per query the sparse backends build (padding included; their defaults)."""
    if backend == "sparse_strided":
        l = sparse_block(n, config)
        return (2 if config.causal else 3) * l + -(-n // l)
    if backend == "sparse_fixed":
        l = sparse_block(n, config)
        return l + -(-n // l)
    if backend == "bigbird":  # 3 window + 2 global + 3 random blocks of 64, 2 full-row blocks
        return (3 + 2 + 3) * 64 + 2 * 64
    return 2 * 64  # lsh: its chunk and the previous one


def parse_seq_lens(text: str) -> tuple[int, ...]:
    """``"256,512"`` -> (256, 512); ``"256,...,4096"`` doubles from 256 up to 4096.

    Raises:
        ValueError: for non-integers or a ``...`` without both ends.
    """
    parts = [p.strip() for p in text.split(",") if p.strip()]
    out: list[int] = []
    for i, part in enumerate(parts):
        if part == "...":
            if not out or i + 1 >= len(parts):
                raise ValueError(f"'...' needs a start and an end: {text!r}")
            n, end = out[-1] * 2, int(parts[i + 1])
            while n < end:
                out.append(n)
                n *= 2
        else:
            out.append(int(part))
    if not out or any(n < 1 for n in out):
        raise ValueError(f"sequence lengths must be positive integers, got {text!r}")
    return tuple(sorted(set(out)))


# ---------------------------------------------------------------- inside the worker process


def _rss_now() -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_rss_peak() -> bool:
    """Reset the kernel's resident-set high-water mark (Linux >= 4.0); False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _rss_peak() -> int:
    import resource

    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # bytes vs KiB


def measure_case(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one case in this process and return its timings and peak memory (a JSON-able dict)."""
    import torch

    from attnlab.layers import get_attention_backend

    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    config = BenchConfig(**{k: spec[k] for k in ("window", "sparse_block") if k in spec})
    options = backend_options(spec["backend"], int(spec["n"]), config)
    fn = get_attention_backend(spec["backend"], **options)
    device, dtype = torch.device(spec["device"]), getattr(torch, spec["dtype"])
    backward, causal = spec["mode"] == "forward_backward", bool(spec["causal"])
    B, H, n, D = spec["batch"], spec["heads"], spec["n"], spec["d_head"]
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (
        torch.randn(B, H, n, D, generator=gen, device=device, dtype=dtype).requires_grad_(backward)
        for _ in range(3)
    )
    grad_out = torch.randn(B, H, n, D, generator=gen, device=device, dtype=dtype)
    cuda = device.type == "cuda"

    def call() -> None:
        if backward:
            fn(q, k, v, is_causal=causal).backward(grad_out)
            q.grad = k.grad = v.grad = None
        else:
            with torch.no_grad():
                fn(q, k, v, is_causal=causal)
        if cuda:
            torch.cuda.synchronize(device)

    # Peak memory of the first call above what is already resident (inputs, torch itself).
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        call()
        peak, method = torch.cuda.max_memory_allocated(device) - base, "cuda_max_memory_allocated"
    else:
        reset = _reset_rss_peak()
        base = (_rss_now() if reset else None) or _rss_peak()
        call()
        peak, method = _rss_peak() - base, "rss_hwm" if reset else "ru_maxrss_delta"
    for _ in range(max(0, int(spec["warmup"]) - 1)):
        call()
    times: list[float] = []
    while len(times) < int(spec["repeats"]) and sum(times) < float(spec["time_budget_s"]):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    times.sort()
    return {
        "time_s": statistics.median(times),
        "times_s": times,
        "peak_mem_bytes": max(0, int(peak)),
        "mem_method": method,
        "threads": torch.get_num_threads(),
    }


def _worker_main(argv: Sequence[str]) -> int:
    spec = json.loads(argv[argv.index("--worker") + 1])
    result = measure_case(spec)
    sys.stdout.write(RESULT_MARKER + json.dumps(result) + "\n")
    return 0


# ---------------------------------------------------------------- the driver


def run_case(config: BenchConfig, backend: str, n: int, mode: str) -> CaseResult:
    """Measure one case in a fresh subprocess, unless its estimated peak exceeds the cap."""
    est = estimate_peak_bytes(backend, n, config, backward=mode == "forward_backward")
    res = CaseResult(backend=backend, n=n, mode=mode, status="ok", est_mem_bytes=est)
    if est > config.mem_cap_gb * 2**30:
        res.status = "skipped"
        res.reason = f"estimated {est / 2**30:.2f} GiB > cap {config.mem_cap_gb:g} GiB"
        return res
    spec = {**asdict(config), "backend": backend, "n": n, "mode": mode}
    cmd = [sys.executable, "-m", "attnlab.analysis.attention_bench", "--worker", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=config.timeout_s)
    except subprocess.TimeoutExpired:
        res.status, res.reason = "timeout", f"ran past {config.timeout_s:g} s"
        return res
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARKER)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        res.status, res.reason = "error", f"exit {proc.returncode}: {tail[0][:300]}"
        return res
    for key, value in json.loads(lines[-1][len(RESULT_MARKER) :]).items():
        setattr(res, key, value)
    return res


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (hosts of one kind differ in it), else the
    platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """Machine, versions and the command line, recorded with every result."""
    import torch

    import attnlab

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "attnlab": getattr(attnlab, "__version__", "unknown"),
        "torch_threads_default": torch.get_num_threads(),
        "command": " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]]),
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def describe_machine(meta: dict[str, Any], threads: int | None = None) -> str:
    """The opening of a report: `` `command` on platform (processor, N CPUs[, T torch threads]),
    torch X`` from a :func:`machine_info` dict."""
    extra = "" if threads is None else f", {threads} torch threads"
    return (
        f"`{meta['command']}` on {meta['platform']} ({meta['processor']}, "
        f"{meta['cpu_count']} CPUs{extra}), torch {meta['torch']}"
    )


__all__ = [
    "DEFAULT_BACKENDS",
    "DEFAULT_SEQ_LENS",
    "SPARSE_BACKENDS",
    "BenchConfig",
    "CaseResult",
    "backend_options",
    "cpu_model",
    "estimate_peak_bytes",
    "machine_info",
    "measure_case",
    "parse_seq_lens",
    "run_case",
    "sparse_block",
]

if __name__ == "__main__":
    if "--worker" in sys.argv:
        sys.exit(_worker_main(sys.argv))
    sys.exit("usage: python -m attnlab.analysis.attention_bench --worker SPEC_JSON")
