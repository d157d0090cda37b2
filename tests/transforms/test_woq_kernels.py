"""attnlab's int8/int4 CPU kernels (attnlab.transforms.woq_kernels) == the reference product.

Reference: ``F.linear(x, dequantize(codes), bias)`` in float32. The kernels accumulate the same
float32 products in another order (8-lane partial sums, int4: per group, then scaled), so with
``bound = |x| @ |W|^T`` they agree to ``1e-5 * bound`` (K <= 3072 terms, eps 6e-8). Shapes are
chosen to hit every code path: M in blocks of 2 plus a remainder, N in blocks of 8/4/2 plus a
remainder and across the 64-row chunks the threads split, K with an int8 tail (K % 8 != 0).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.transforms import Int4Linear, Int8Linear
from attnlab.transforms import quant_formats as qf
from attnlab.transforms import woq_kernels as wk
from attnlab.transforms.quant_modules import REFERENCE

pytestmark = pytest.mark.skipif(not wk.available(), reason=f"kernels: {wk.unavailable_reason()}")


def _bound(x: Tensor, w: Tensor) -> Tensor:
    return x.abs() @ w.abs().T  # (M, N)


@pytest.mark.parametrize("m", [1, 2, 3, 9])
@pytest.mark.parametrize(("n", "k"), [(1, 1), (7, 13), (9, 8), (130, 64), (300, 771), (20, 200)])
@pytest.mark.parametrize("bias", [True, False])
def test_int8_kernel_equals_reference(m: int, n: int, k: int, bias: bool) -> None:
    g = torch.Generator().manual_seed(n * 1000 + k)
    w, x = torch.randn(n, k, generator=g), torch.randn(m, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    q, s = qf.quantize_int8(w)
    ref = F.linear(x, qf.dequantize_int8(q, s), b)
    for avx2_only in (False, True):  # AVX-512 where the CPU has it, and the AVX2 loop
        out = wk.int8_linear(x, q, s, b, avx2_only=avx2_only)
        assert out.shape == (m, n) and out.dtype == torch.float32
        assert bool(((out - ref).abs() <= 1e-5 * _bound(x, w) + 1e-6).all())


@pytest.mark.parametrize("m", [1, 2, 5])
@pytest.mark.parametrize(
    ("n", "k", "group"), [(1, 16, 16), (5, 96, 48), (67, 256, 128), (130, 3072, 64)]
)
@pytest.mark.parametrize("bias", [True, False])
def test_int4_kernel_equals_reference(m: int, n: int, k: int, group: int, bias: bool) -> None:
    g = torch.Generator().manual_seed(n * 1000 + k)
    w, x = torch.randn(n, k, generator=g) + 0.1, torch.randn(m, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    codes, scale, zero = qf.quantize_int4(w, group)
    ref = F.linear(x, qf.dequantize_int4(codes, scale, zero), b)
    for avx2_only in (False, True):
        out = wk.int4_linear(x, qf.pack_nibbles(codes), scale, zero, group, b, avx2_only=avx2_only)
        assert out.shape == (m, n)
        assert bool(((out - ref).abs() <= 1e-5 * _bound(x, w) + 1e-6).all())


def test_kernels_refuse_bad_operands() -> None:
    q, s = qf.quantize_int8(torch.randn(4, 32))
    with pytest.raises(RuntimeError, match="float32"):
        wk.int8_linear(torch.randn(2, 32, dtype=torch.float64), q, s, None)
    with pytest.raises(RuntimeError, match=r"K = x\.size"):
        wk.int8_linear(torch.randn(2, 31), q, s, None)
    with pytest.raises(RuntimeError, match="bias"):
        wk.int8_linear(torch.randn(2, 32), q, s, torch.zeros(5))
    codes, scale, zero = qf.quantize_int4(torch.randn(4, 32), 32)
    with pytest.raises(RuntimeError, match="group_size"):
        wk.int4_linear(torch.randn(1, 32), qf.pack_nibbles(codes), scale, zero, 24, None)


def test_layers_choose_the_kernel_for_float32_activations() -> None:
    lin = torch.nn.Linear(64, 40)
    q8 = Int8Linear.from_linear(lin, activation_dtype="float32")
    q4 = Int4Linear.from_linear(lin, group_size=16, activation_dtype="float32")
    assert q8.kernel == wk.KERNEL_INT8 and q4.kernel == wk.KERNEL_INT4
    assert "attnlab woq_gemm" in repr(q4)
    # bfloat16 activations keep PyTorch's kernels (group size 16: the reference path)
    bf16 = "bfloat16"
    assert Int8Linear.from_linear(lin, activation_dtype=bf16).kernel == "aten._weight_int8pack_mm"
    assert Int4Linear.from_linear(lin, group_size=16, activation_dtype=bf16).kernel == REFERENCE
    assert Int8Linear.from_linear(lin).activation_dtype == "float32"  # the default here
    x = torch.randn(3, 5, 64)
    with torch.inference_mode():
        for layer in (q8, q4):
            assert layer.uses_kernel(x)
            ref = F.linear(x, layer.dequantize(), layer.bias)
            assert (layer(x) - ref).abs().max() <= 1e-5 * ref.abs().max()
        # the streamed tensors are the stored ones: no kernel-private copies
        assert q4.read_tensors() == q4.stored_tensors() and q4.kernel_copy_bytes() == 0


def test_loading_an_int4_layer_needs_no_packing() -> None:
    source = Int4Linear.from_linear(
        torch.nn.Linear(64, 16), group_size=32, activation_dtype="float32"
    )
    empty = Int4Linear(64, 16, bias=True, group_size=32, activation_dtype="float32")
    empty.load_state_dict(source.state_dict())
    x = torch.randn(2, 64)
    with torch.inference_mode():
        assert empty.uses_kernel(x) and torch.equal(empty(x), source(x))


def test_disabled_kernels_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wk, "_state", {})
    monkeypatch.setenv("ATTNLAB_NO_CPP_KERNELS", "1")
    assert not wk.available() and "ATTNLAB_NO_CPP_KERNELS" in wk.unavailable_reason()
    layer = Int8Linear.from_linear(torch.nn.Linear(32, 8), activation_dtype="float32")
    assert layer.kernel == "aten._weight_int8pack_mm"
