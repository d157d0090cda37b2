"""Weight-only quantization formats: quantize, dequantize, pack, and PyTorch's CPU kernels.

Two formats of a linear weight ``W (N, K)`` (N = out_features, K = in_features):

- **int8**, symmetric per output channel: ``W[n, k] ≈ scale[n] · q[n, k]``, ``q`` int8 in
  [-127, 127], ``scale[n] = max_k |W[n, k]| / 127``.
- **int4**, asymmetric per group of ``g`` consecutive inputs (``g`` divides K):
  ``W[n, k] ≈ scale[n, j] · (q[n, k] - 8) + zero[n, j]`` with ``j = k // g``, ``q`` in [0, 15],
  ``scale = (max - min) / 15`` over the group and ``zero`` the value of the middle code 8
  (``min + 8 · scale``): the convention of PyTorch's int4 kernel (and gpt-fast's).

Scales and zeros are rounded to bfloat16 values (kept in float32 tensors) *before* the codes are
chosen, so the same numbers serve the bfloat16 kernels and the float32 reference exactly; the codes
are computed from the rounded values, so the rounding costs nothing but a clip of at most
``2^-9`` of the largest weight. (Limitation: a group whose values sit far from zero compared to
their spread loses precision in its bfloat16 ``zero``; linear weights are centred on zero.)

Kernels (``torch.ops.aten``, torch 2.13 CPU build; signatures and layouts found by experiment,
see ``tests/transforms/test_quantize.py``):

- ``_weight_int8pack_mm(A (M, K), q (N, K) int8, scale (N,)) -> (M, N) = A @ (q · scale)^T``.
  ``A`` must be 2-D and contiguous in its last dimension, ``scale`` of A's dtype. The plain
  ``(N, K)`` int8 matrix *is* its layout. float32 ``A``: any M, N, K. bfloat16 ``A``: **K must be
  a multiple of 16** (of 8 with the AVX2 build): other K crash the process (segmentation fault)
  or, for K = 8 mod 16 on AVX512 (4 mod 8 on AVX2), return wrong numbers without an error; such
  layers use the reference path (:func:`int8_kernel_supports`).
- ``_convert_weight_to_int4pack_for_cpu(q (N, K) int32 in [0, 15], innerKTiles) -> (N, K/2)
  uint8`` in a kernel-private layout that **depends on the CPU capability** (AVX512, AVX2 and the
  default build pack differently; ``innerKTiles`` is ignored on the CPU), so only the canonical
  layout below is ever saved and the kernel copy is made again on load. Needs N % 16 == 0 (we
  pad N with zero rows and drop the padded outputs) and K even.
- ``_weight_int4pack_mm_for_cpu(A (M, K), packed, g, scale_and_zero (K/g, N, 2)) -> (M, N)``
  with ``g`` in {32, 64, 128, 256}, K % g == 0, ``A`` 2-D contiguous, ``scale_and_zero`` of A's
  dtype. Other group sizes use the reference path.

Both kernels have a vectorised path for bfloat16 activations only: with float32 ``A`` they run a
scalar loop, 5-20x slower than ``F.linear`` in float32 (measured on the 2-core AVX512 machine of
this project; ``benchmarks/quantized_decoding.py`` prints the kernel table). Hence attnlab's own
float32 kernels (:mod:`attnlab.kernels`), the default where they build, and the
``activation_dtype`` choice of :func:`attnlab.transforms.quantize`: ``bfloat16`` rows into these
kernels (rounded to bfloat16, accumulated in float32, returned rounded to bfloat16, then cast
back) or ``float32``.

Canonical int4 storage (what is saved): ``(N, ceil(K/2))`` uint8, byte ``i`` of row ``n`` holds
the code of input ``2i`` in its low nibble and of input ``2i+1`` in its high nibble.

Shapes: M rows of activations, N out_features, K in_features, G = K / g groups.
"""

from __future__ import annotations

import torch
from torch import Tensor

INT8_QMAX = 127
INT4_LEVELS = 15  # codes 0..15
INT4_MID = 8  # the code whose value is ``zero``
INT4_KERNEL_GROUP_SIZES = (32, 64, 128, 256)
INT4_KERNEL_N_MULTIPLE = 16


def _as_bf16_values(x: Tensor) -> Tensor:
    """``x`` rounded to the nearest bfloat16 values, kept in float32."""
    return x.to(torch.bfloat16).to(torch.float32)


def quantize_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-output-channel int8 codes of ``weight``.

    Shapes: weight ``(N, K)`` -> codes ``(N, K)`` int8, scales ``(N,)`` float32.
    """
    w = weight.detach().to(torch.float32)
    amax = w.abs().amax(dim=1)  # (N,)
    scale = _as_bf16_values(torch.where(amax > 0, amax / INT8_QMAX, torch.ones_like(amax)))
    q = torch.round(w / scale[:, None]).clamp_(-INT8_QMAX, INT8_QMAX)  # (N, K)
    return q.to(torch.int8), scale


def dequantize_int8(q: Tensor, scale: Tensor) -> Tensor:
    """float32 ``(N, K)`` weight of int8 codes ``q (N, K)`` and scales ``(N,)``."""
    return q.to(torch.float32) * scale[:, None]


def quantize_int4(weight: Tensor, group_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """Group-wise asymmetric int4 codes of ``weight`` (groups of ``group_size`` inputs).

    Shapes: weight ``(N, K)`` -> codes ``(N, K)`` uint8 in [0, 15], scales and zeros
    ``(N, K / group_size)`` float32.

    Raises:
        ValueError: if ``group_size`` does not divide K.
    """
    N, K = weight.shape
    if group_size < 1 or K % group_size:
        raise ValueError(f"group_size={group_size} must divide in_features={K}")
    w = weight.detach().to(torch.float32).reshape(N, K // group_size, group_size)  # (N, G, g)
    lo, hi = w.amin(dim=-1), w.amax(dim=-1)  # (N, G)
    spread = hi - lo
    scale = _as_bf16_values(torch.where(spread > 0, spread / INT4_LEVELS, torch.ones_like(lo)))
    zero = _as_bf16_values(lo + INT4_MID * scale)
    q = torch.round((w - zero[..., None]) / scale[..., None]) + INT4_MID  # (N, G, g)
    return q.clamp_(0, INT4_LEVELS).to(torch.uint8).reshape(N, K), scale, zero


def dequantize_int4(q: Tensor, scale: Tensor, zero: Tensor) -> Tensor:
    """float32 ``(N, K)`` weight of int4 codes ``q (N, K)``, scales and zeros ``(N, G)``."""
    N, K = q.shape
    G = scale.shape[1]
    codes = q.to(torch.float32).reshape(N, G, K // G) - INT4_MID  # (N, G, g)
    return (codes * scale[..., None] + zero[..., None]).reshape(N, K)


def pack_nibbles(q: Tensor) -> Tensor:
    """Canonical int4 storage: codes ``(N, K)`` in [0, 15] -> ``(N, ceil(K/2))`` uint8, input
    ``2i`` in the low nibble of byte ``i``, ``2i+1`` in the high one."""
    q = q.to(torch.uint8)
    if q.shape[1] % 2:
        q = torch.nn.functional.pad(q, (0, 1))  # (N, K + 1)
    return q[:, 0::2] | (q[:, 1::2] << 4)  # (N, K/2)


def unpack_nibbles(packed: Tensor, in_features: int) -> Tensor:
    """Inverse of :func:`pack_nibbles`: ``(N, ceil(K/2))`` uint8 -> codes ``(N, K)`` uint8."""
    low, high = packed & 0x0F, packed >> 4  # (N, K/2) each
    return torch.stack((low, high), dim=-1).flatten(1)[:, :in_features]  # (N, K)


INT8_BF16_K_MULTIPLE = 16  # the bfloat16 path of the int8 kernel needs K % 16 == 0 (AVX512)


def int8_kernel_supports(in_features: int, activation_dtype: torch.dtype) -> bool:
    """Whether ``aten::_weight_int8pack_mm`` exists here and is safe for this K and dtype."""
    if not hasattr(torch.ops.aten, "_weight_int8pack_mm"):
        return False
    return activation_dtype == torch.float32 or in_features % INT8_BF16_K_MULTIPLE == 0


def int4_kernel_supports(group_size: int, in_features: int) -> bool:
    """Whether ``aten::_weight_int4pack_mm_for_cpu`` exists here and takes this shape."""
    ops = torch.ops.aten
    return (
        hasattr(ops, "_weight_int4pack_mm_for_cpu")
        and hasattr(ops, "_convert_weight_to_int4pack_for_cpu")
        and group_size in INT4_KERNEL_GROUP_SIZES
        and in_features % group_size == 0
    )


def padded_rows(n: int) -> int:
    """``n`` rounded up to the int4 kernel's multiple of output rows."""
    return -(-n // INT4_KERNEL_N_MULTIPLE) * INT4_KERNEL_N_MULTIPLE


def int4_kernel_pack(
    q: Tensor, scale: Tensor, zero: Tensor, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """The int4 kernel's operands: packed codes and ``scale_and_zero``, N padded to a multiple
    of 16 (zero codes, unit scales: the padded outputs are computed and dropped).

    Shapes: q ``(N, K)``, scale and zero ``(N, G)`` -> packed ``(N_pad, K/2)`` uint8 (private
    layout), scale_and_zero ``(G, N_pad, 2)`` of ``dtype``.
    """
    N = q.shape[0]
    pad = padded_rows(N) - N
    q32 = torch.nn.functional.pad(q.to(torch.int32), (0, 0, 0, pad))  # (N_pad, K)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q32.contiguous(), 1)
    s = torch.nn.functional.pad(scale, (0, 0, 0, pad), value=1.0)  # (N_pad, G)
    z = torch.nn.functional.pad(zero, (0, 0, 0, pad))  # (N_pad, G)
    scale_and_zero = torch.stack((s, z), dim=-1).transpose(0, 1)  # (G, N_pad, 2)
    return packed, scale_and_zero.to(dtype).contiguous()


def int8_kernel_mm(x: Tensor, q: Tensor, scale: Tensor) -> Tensor:
    """``x (M, K) @ (q · scale)^T`` by ``aten::_weight_int8pack_mm``; ``x`` of the kernel's
    dtype, contiguous; ``scale`` of the same dtype. Returns ``(M, N)`` in that dtype."""
    return torch.ops.aten._weight_int8pack_mm(x, q, scale)


def int4_kernel_mm(
    x: Tensor, packed: Tensor, group_size: int, scale_and_zero: Tensor, n: int
) -> Tensor:
    """``x (M, K)`` times the int4 weight by ``aten::_weight_int4pack_mm_for_cpu``; the padded
    outputs dropped. Returns ``(M, n)`` in ``x``'s dtype (a view when N was padded)."""
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group_size, scale_and_zero)
    return out if out.shape[1] == n else out[:, :n]  # (M, N)


__all__ = [
    "INT4_KERNEL_GROUP_SIZES",
    "dequantize_int4",
    "dequantize_int8",
    "int4_kernel_mm",
    "int4_kernel_pack",
    "int4_kernel_supports",
    "int8_kernel_mm",
    "int8_kernel_supports",
    "pack_nibbles",
    "padded_rows",
    "quantize_int4",
    "quantize_int8",
    "unpack_nibbles",
]
