"""attnlab's int8/int4 CPU kernels (attnlab.kernels) == the reference product.

Reference: ``F.linear(x, dequantize(codes), bias)`` in float32. The kernels accumulate the same
float32 products in another order (8- or 16-lane partial sums; int4 on AVX2: per group, then
scaled; int4 on AVX-512: the dequantized weights themselves, looked up per group), so with
``bound = |x| @ |W|^T`` they agree to ``1e-5 * bound`` (K <= 3072 terms, eps 6e-8). Shapes are
chosen to hit every code path: M in blocks of 2 plus a remainder, N in blocks of 8/4/2 plus a
remainder and across the 64-row chunks the threads split, K with an int8 tail (K % 8 != 0).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import attnlab.kernels as wk
from attnlab.transforms import Int4Linear, Int8Linear
from attnlab.transforms import quant_formats as qf
from attnlab.transforms.quant_modules import REFERENCE

pytestmark = pytest.mark.skipif(not wk.available(), reason=f"kernels: {wk.unavailable_reason()}")


def _bound(x: Tensor, w: Tensor) -> Tensor:
    return x.abs() @ w.abs().T  # (M, N)


@pytest.mark.parametrize("m", [1, 2, 3, 7, 9])
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


@pytest.mark.parametrize("m", [1, 2, 5, 7, 8])
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


def _attention_reference(q: Tensor, k: Tensor, v: Tensor, scale: float | None = None) -> Tensor:
    """float64 softmax attention, key/value heads repeated for grouped queries."""
    groups = q.shape[1] // k.shape[1]
    k64 = k.double().repeat_interleave(groups, dim=1)
    v64 = v.double().repeat_interleave(groups, dim=1)
    s = q.shape[-1] ** -0.5 if scale is None else scale
    weights = torch.softmax(s * q.double() @ k64.transpose(-2, -1), dim=-1)
    return (weights @ v64).float()


@pytest.mark.parametrize(
    ("b", "h", "h_kv", "s", "d", "dv"),
    [
        (1, 12, 12, 120, 64, 64),  # GPT-2 small decoding
        (2, 8, 2, 37, 32, 32),  # grouped-query heads
        (3, 4, 1, 1, 128, 128),  # one cached key, multi-query
        (1, 2, 2, 300, 24, 40),  # head sizes off the 8-lane blocks, Dv != D
        (2, 3, 3, 9, 5, 3),  # smaller than one vector
    ],
)
def test_decode_attention_equals_softmax_attention(
    b: int, h: int, h_kv: int, s: int, d: int, dv: int
) -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(b, h, 1, d), torch.randn(b, h_kv, s, d), torch.randn(b, h_kv, s, dv)
    got = wk.decode_attention(q, k, v)
    assert got.shape == (b, h, 1, dv)
    torch.testing.assert_close(got, _attention_reference(q, k, v), rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(
        wk.decode_attention(q, k, v, scale=0.3), _attention_reference(q, k, v, 0.3)
    )


def test_decode_attention_reads_strided_views() -> None:
    """The layouts decoding hands it: q a transposed projection, k/v the first S rows of a
    preallocated cache."""
    torch.manual_seed(1)
    q = torch.randn(2, 1, 6, 16).transpose(1, 2)  # (B, H, 1, D), heads not adjacent in memory
    cache_k, cache_v = torch.randn(2, 3, 50, 16), torch.randn(2, 3, 50, 16)
    k, v = cache_k[:, :, :21], cache_v[:, :, :21]
    got = wk.decode_attention(q, k, v)
    torch.testing.assert_close(got, _attention_reference(q, k, v), rtol=1e-5, atol=2e-6)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    )
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=2e-6)


def test_decode_attention_treats_non_finite_inputs_as_the_backends_do() -> None:
    """NaN query -> NaN row; a +inf score -> NaN row; a -inf score -> that key weighs 0: as
    attnlab's sdpa backend (raw ``F.scaled_dot_product_attention`` returns zeros for a NaN
    query, which the backend corrects)."""
    from attnlab.layers.attention_backends import sdpa_attention

    torch.manual_seed(2)
    q, k, v = torch.randn(3, 2, 1, 8), torch.randn(3, 2, 5, 8), torch.randn(3, 2, 5, 8)
    q[0, 1, 0, 3] = float("nan")
    q[1, 0, 0, 0], k[1, 0, 2, 0] = 1.0, float("inf")  # score +inf
    q[2, 1, 0, 0], k[2, 1, 4, 0] = -1.0, float("inf")  # score -inf
    out = wk.decode_attention(q, k, v)
    assert out[0, 1].isnan().all() and out[1, 0].isnan().all()
    assert out[0, 0].isfinite().all() and out[1, 1].isfinite().all()
    assert out[2].isfinite().all()
    expected = sdpa_attention(q, k, v)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=2e-6, equal_nan=True)


def test_decode_attention_refuses_bad_operands() -> None:
    q, k, v = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    with pytest.raises(RuntimeError, match="float32"):
        wk.decode_attention(q.double(), k, v)
    with pytest.raises(RuntimeError, match="one query"):
        wk.decode_attention(torch.randn(1, 4, 2, 8), k, v)
    with pytest.raises(RuntimeError, match="multiple of H_kv"):
        wk.decode_attention(q, torch.randn(1, 3, 5, 8), torch.randn(1, 3, 5, 8))
    with pytest.raises(RuntimeError, match="must match"):
        wk.decode_attention(q, torch.randn(1, 2, 5, 7), v)
    with pytest.raises(RuntimeError, match="contiguous"):
        wk.decode_attention(q, k, torch.randn(1, 2, 8, 5).transpose(-2, -1))


def test_a_lock_file_left_by_a_killed_build_does_not_hang_the_next(tmp_path: Path) -> None:
    """torch's build lock is a plain file: a process killed mid-build leaves it, and torch's next
    ``load`` waits for it forever (this hung a whole CI run at collection). The process holding
    attnlab's ``flock`` removes it and builds."""
    import os
    import shutil
    import subprocess
    import sys

    root = tmp_path / "ext"
    shutil.copytree(wk.build_directory(), root / wk.NAME)  # the built extension: ninja has no work
    (root / wk.NAME / "lock").touch()  # what the killed build left
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(root)}
    code = "import attnlab.kernels as k; print(k.build_directory(), k.available())"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=240, check=True)  # fmt: skip
    assert done.stdout.split() == [str(root / wk.NAME), "True"]
    assert "left by a build that was killed" in done.stderr
    assert not (root / wk.NAME / "lock").exists()
