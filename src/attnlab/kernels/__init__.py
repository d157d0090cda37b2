"""attnlab's C++ CPU kernels, one folder and this one entry point: weight-only int8/int4 products
with float32 activations, one query's attention over a KV cache, and a decoder layer's (or a
whole stack's) one-token step.

PyTorch ships CPU kernels for both weight formats (``aten::_weight_int8pack_mm``,
``aten::_weight_int4pack_mm_for_cpu``), but they vectorise bfloat16 activations only; with
float32 ones they run scalar loops several times slower than a float32 ``F.linear``. The kernels
of ``csrc/woq_gemm.cpp`` (AVX2 + FMA, torch's thread pool) read each weight byte once, widen it
to float32 in registers and multiply in float32: exact float32 activations, at close to the
memory-bandwidth cost of the codes. They read the stored codes directly (int8 ``(N, K)``, int4 in
the canonical nibble layout), so they need no second, kernel-private copy of the weights. The
quantized layers (:mod:`attnlab.transforms.quant_modules`) call :func:`int8_linear` and
:func:`int4_linear`.

``csrc/decode_attention.cpp`` (:func:`decode_attention`): softmax attention of one query per
sequence over its KV cache, each head one pass over its keys, grouped-query heads reading their
shared key/value head in place. At one query PyTorch's CPU ``scaled_dot_product_attention``
spends most of its time outside the arithmetic (GPT-2 small: 12 heads over ~150 keys are ~0.2 M
multiply-adds, a few µs, against tens of µs per call inside a decoding step).

``csrc/decode_layer.cpp`` (:func:`layer_step`, :func:`stack_step`, :func:`decode_step`,
:func:`decode_stack`): a whole decoder layer's one-token step in one call — the two kernels above
and the same ATen functions the modules use in between, in the modules' order, so the result is
bit for bit theirs — then a whole stack, then a whole step from token ids to the final norm. The
fused decode engine (:mod:`attnlab.transforms.decode_engine`) is their only caller; what a change
to a layer's semantics requires of them is in ``docs/architecture.md``.

The extension is compiled on first use with ``torch.utils.cpp_extension`` (a C++ compiler and
ninja; about half a minute, cached under ``TORCH_EXTENSIONS_DIR``, default
``~/.cache/torch_extensions``). One process builds at a time (an advisory ``flock``, which the
system releases when its holder dies); torch's own lock file, which a process killed mid-build
leaves behind and on which every later build would wait forever, is removed by the process that
holds that lock. :func:`available` says whether it could be built and loaded
here; it is ``False`` off x86-64, on a CPU without AVX2, when ``ATTNLAB_NO_CPP_KERNELS=1`` is set,
or when the build fails (logged once as a warning; the quantized layers then use PyTorch's kernels
or the reference path, and decoding runs the modules).

Shapes: x ``(M, K)`` float32 contiguous -> ``(M, N)`` float32; attention q ``(B, H, 1, D)``,
k ``(B, H_kv, S, D)``, v ``(B, H_kv, S, Dv)`` -> ``(B, H, 1, Dv)``; a layer step x ``(B, 1, E)``
-> ``(B, 1, E)``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "woq_gemm.cpp"
# compiled into the same extension: one query's attention over a KV cache, for decoding
# (``torch.ops.attnlab_decode.attention``, used by :func:`decode_attention`)
ATTENTION_SOURCE = SOURCE.with_name("decode_attention.cpp")
# and one decoder layer's whole step, calling the two above (``attnlab_decode.layer_step``,
# ``stack_step``, ``decode_step``; used by :mod:`attnlab.transforms.decode_engine`)
LAYER_SOURCE = SOURCE.with_name("decode_layer.cpp")
NAME = "attnlab_woq"
KERNEL_INT8 = "attnlab woq_gemm int8 (AVX2, float32 activations)"
KERNEL_INT4 = "attnlab woq_gemm int4 (AVX2, float32 activations)"
K_MULTIPLE = 16  # the int4 loop takes inputs 16 at a time; int8 any K (tail handled)

_state: dict[str, bool | str] = {}


def _cpu_supported() -> tuple[bool, str]:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False, f"not an x86-64 machine ({platform.machine()})"
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        return False, f"torch reports CPU capability {capability}, the kernels need AVX2"
    return True, ""


def _ninja_on_path() -> None:
    """Put the ``ninja`` package's binary on PATH (a venv's bin is not there unless activated)."""
    try:
        import ninja
    except ImportError:
        return
    bin_dir = str(getattr(ninja, "BIN_DIR", ""))
    path = os.environ.get("PATH", "")
    if bin_dir and bin_dir not in path.split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + path


def build_directory() -> Path:
    """Where the extension is built and cached: ``$TORCH_EXTENSIONS_DIR/attnlab_woq``, else
    torch's default root (``~/.cache/torch_extensions/pyXY_cpu/attnlab_woq``)."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        from torch.utils import cpp_extension

        version = f"py{sys.version_info.major}{sys.version_info.minor}"
        root = os.path.join(cpp_extension.get_default_build_root(), f"{version}_cpu")
    return Path(root) / NAME


@contextlib.contextmanager
def _sole_builder(directory: Path) -> Iterator[None]:
    """Hold the build directory against other processes' builds while the body runs.

    torch's ``cpp_extension.load`` guards a build with a lock *file* that it creates and removes;
    a process killed while building (a test's worker, a Ctrl-C) leaves that file, and every later
    load waits for it forever. Here an ``flock`` on a file beside it says who builds (the system
    drops it when its holder dies), so the holder knows any lock file it finds is stale.
    """
    directory.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: torch's own lock file only
        yield
        return
    with open(directory / "attnlab-build.flock", "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            stale = directory / "lock"
            if stale.exists():
                logger.warning("removing %s, left by a build that was killed", stale)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _build() -> None:
    from torch.utils import cpp_extension

    _ninja_on_path()
    directory = build_directory()
    with _sole_builder(directory):
        _load(cpp_extension, directory)


def _load(cpp_extension: Any, directory: Path) -> None:
    cpp_extension.load(
        name=NAME,
        build_directory=str(directory),
        sources=[str(SOURCE), str(ATTENTION_SOURCE), str(LAYER_SOURCE)],
        # no contraction of a multiply and an add into one FMA: the int4 tables must round as
        # the reference's dequantization does
        extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp", "-std=c++17", "-ffp-contract=off"],
        extra_ldflags=["-fopenmp"],
        is_python_module=False,
        verbose=False,
    )


def available() -> bool:
    """Whether the kernels are built and loaded here (building them on the first call)."""
    if "ok" in _state:
        return bool(_state["ok"])
    if os.environ.get("ATTNLAB_NO_CPP_KERNELS", "") not in ("", "0"):
        _state.update(ok=False, reason="ATTNLAB_NO_CPP_KERNELS is set")
        return False
    ok, reason = _cpu_supported()
    if ok:
        try:
            _build()
            ok = (
                hasattr(getattr(torch.ops, NAME), "int8_linear")
                and hasattr(torch.ops.attnlab_decode, "attention")
                and hasattr(torch.ops.attnlab_decode, "layer_step")
            )
            reason = "" if ok else "the extension loaded but registered no operators"
        except Exception as err:  # a missing compiler, ninja or headers: fall back, say why
            ok, reason = False, f"{type(err).__name__}: {str(err).strip().splitlines()[-1:]}"
            logger.warning("attnlab's int8/int4 CPU kernels could not be built (%s)", reason)
    _state.update(ok=ok, reason=reason)
    return ok


def unavailable_reason() -> str:
    """Why :func:`available` is ``False`` (empty when it is ``True``)."""
    available()
    return str(_state.get("reason", ""))


def int8_supports(in_features: int) -> bool:
    """Whether the int8 kernel takes this K here (any K, once the kernels are available)."""
    return in_features > 0 and available()


def int4_supports(group_size: int, in_features: int) -> bool:
    """Whether the int4 kernel takes this group size and K here."""
    return (
        group_size % K_MULTIPLE == 0
        and in_features % group_size == 0
        and in_features % 2 == 0
        and available()
    )


def int8_linear(
    x: Tensor, q: Tensor, scale: Tensor, bias: Tensor | None, *, avx2_only: bool = False
) -> Tensor:
    """``x (M, K) @ (q (N, K) int8 · scale (N,))^T + bias`` in float32 -> ``(M, N)``.

    ``avx2_only``: skip the AVX-512 loop even where the CPU has it (tests compare the two)."""
    return torch.ops.attnlab_woq.int8_linear(x, q, scale, bias, int(avx2_only))


def int4_linear(
    x: Tensor,
    codes: Tensor,
    scale: Tensor,
    zero: Tensor,
    group_size: int,
    bias: Tensor | None,
    *,
    avx2_only: bool = False,
) -> Tensor:
    """``x (M, K)`` times the int4 weight (codes ``(N, K/2)`` uint8 nibbles, scale and zero
    ``(N, K/group_size)``) plus ``bias``, in float32 -> ``(M, N)``. The AVX-512 loop (where the
    CPU has it) takes group sizes that are multiples of 32; ``avx2_only`` skips it."""
    return torch.ops.attnlab_woq.int4_linear(
        x, codes, scale, zero, group_size, bias, int(avx2_only)
    )


def decode_attention(q: Tensor, k: Tensor, v: Tensor, scale: float | None = None) -> Tensor:
    """``softmax(scale · q k^T) v`` for one query per sequence, in float32, by attnlab's kernel
    (``csrc/decode_attention.cpp``): q ``(B, H, 1, D)``, k ``(B, H_kv, S, D)``, v ``(B, H_kv, S,
    Dv)`` with ``H_kv`` dividing ``H`` (grouped-query heads read their shared key/value head, not
    a repeated copy) -> ``(B, H, 1, Dv)``. No mask (the one query sees every cached key); any
    strides with a contiguous last dimension; ``scale`` defaults to ``1/sqrt(D)``. Non-finite
    inputs as in attnlab's ``sdpa`` backend: a row whose query holds NaN or an infinity,
    or whose scores hold NaN or +inf, comes out NaN; a -inf score weighs its key 0.

    Raises:
        RuntimeError: for operands off the CPU, not float32, or of mismatched shapes."""
    s = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return torch.ops.attnlab_decode.attention(q, k, v, s)


def layer_step(
    x: Tensor,
    tensors: list[Tensor | None],
    config: list[int],
    floats: list[float],
    cache_k: Tensor,
    cache_v: Tensor,
    length: int,
    cos: Tensor | None = None,
    sin: Tensor | None = None,
) -> Tensor:
    """One decoder layer's one-token step (its description from
    :func:`attnlab.transforms.decode_layer.layer_plan`): x ``(B, 1, E)`` -> ``(B, 1, E)``; the
    caches ``(B, H_kv, L, D)`` gain position ``length`` (the caller advances its length)."""
    return torch.ops.attnlab_decode.layer_step(
        x, tensors, config, floats, cache_k, cache_v, length, cos, sin
    )


def decode_stack(tensors: list[Tensor | None], config: list[int], floats: list[float]) -> Any:
    """A ``DecodeStack``: the layer descriptions of a whole stack, concatenated, made once (its
    ``set_final_norm(weight, bias, kind, eps)`` adds the final norm for :func:`decode_step`)."""
    return torch.classes.attnlab_decode.DecodeStack(tensors, config, floats)


def stack_step(
    x: Tensor,
    stack: Any,
    cache_k: list[Tensor],
    cache_v: list[Tensor],
    lengths: list[int],
    cos: Tensor | None = None,
    sin: Tensor | None = None,
) -> Tensor:
    """Every layer of ``stack`` (:func:`decode_stack`) on one token per row, back to back:
    x ``(B, 1, E)`` -> ``(B, 1, E)``; each layer's cache gains position ``lengths[i]``."""
    return torch.ops.attnlab_decode.stack_step(x, stack, cache_k, cache_v, lengths, cos, sin)


def decode_step(
    ids: Tensor,
    table: Tensor,
    scale: float,
    pos_table: Tensor | None,
    position: int,
    stack: Any,
    cache_k: list[Tensor],
    cache_v: list[Tensor],
    lengths: list[int],
    cos: Tensor | None = None,
    sin: Tensor | None = None,
) -> Tensor:
    """A whole one-token step from ids ``(B, 1)``: the token table's rows (times ``scale``) plus
    row ``position`` of ``pos_table`` (if any), every layer of ``stack``, its final norm:
    -> ``(B, 1, E)``."""
    return torch.ops.attnlab_decode.decode_step(
        ids, table, scale, pos_table, position, stack, cache_k, cache_v, lengths, cos, sin
    )


__all__ = [
    "KERNEL_INT4",
    "KERNEL_INT8",
    "available",
    "build_directory",
    "decode_attention",
    "decode_stack",
    "decode_step",
    "int4_linear",
    "int4_supports",
    "int8_linear",
    "int8_supports",
    "layer_step",
    "stack_step",
    "unavailable_reason",
]
