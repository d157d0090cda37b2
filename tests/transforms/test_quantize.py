"""Weight-only quantization (attnlab.transforms): kernels == reference, formats, save/load, models.

Tolerances, with ``bound = |x| @ |W|^T`` (the sum of absolute products of each output):

- float32 activations: the packed kernel and ``F.linear(x, dequantize())`` differ only in the
  order of float32 accumulation: ``|diff| <= 1e-5 * bound`` (K <= 512 terms, eps 6e-8);
- bfloat16 activations: the kernel rounds its input rows (relative error <= 2^-9 each) and its
  outputs (<= 2^-9 |y| <= 2^-9 bound) to bfloat16: ``|diff| <= 2^-8 * bound`` against the
  float32 reference, and within one bfloat16 step of an emulation that rounds the same way.

Quantization error bounds (element-wise, exact): int8 ``|W - Ŵ| <= s/2 + 2^-9 max|W|`` (the
scale is rounded to bfloat16, which can clip the largest weight by that much); int4
``<= 0.53 s + 2^-8 |zero|`` (half a step, the bfloat16 rounding of the scale over 15 steps and
of the zero).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import attnlab
import attnlab.kernels as wk
from attnlab import GPT, EncoderDecoderTransformer, GPTConfig, TransformerConfig
from attnlab.transforms import (
    Int4Linear,
    Int8Linear,
    QuantizedEmbedding,
    QuantizedLinear,
    copy_numel,
    load_quantized,
    quantize,
    quantized_weight_bytes,
    save_quantized,
)
from attnlab.transforms import quant_formats as qf
from attnlab.transforms.decode_weights import decoder_linears
from attnlab.transforms.quant_modules import REFERENCE

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

V = 61  # odd: the int4 head (N = 61) exercises the kernel's padding to 16 rows


def _bound(x: Tensor, w: Tensor) -> Tensor:
    return x.abs().reshape(-1, x.shape[-1]) @ w.abs().T  # (M, N)


def _linear(n: int, k: int, bias: bool = True, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.normal_(0, 0.05)
        if bias:
            lin.bias.normal_(0, 0.05)
    return lin


def _gpt(**kw: Any) -> GPT:
    torch.manual_seed(0)
    base: dict[str, Any] = dict(
        vocab_size=V, d_model=64, n_heads=4, n_layers=2, d_ff=128, max_seq_len=64, dropout=0.0
    )
    return GPT(GPTConfig(**{**base, "eos_id": None, **kw})).eval()


def _enc_dec(**kw: Any) -> EncoderDecoderTransformer:
    torch.manual_seed(0)
    base: dict[str, Any] = dict(
        vocab_size=V, d_model=64, n_heads=4, n_layers=2, d_ff=128, max_seq_len=64, dropout=0.0
    )
    return EncoderDecoderTransformer(TransformerConfig(**{**base, **kw})).eval()


def _ids(b: int = 2, t: int = 9, seed: int = 1) -> Tensor:
    return torch.randint(0, V, (b, t), generator=torch.Generator().manual_seed(seed))


# -- formats ---------------------------------------------------------------------------------


def test_int8_codes_are_within_half_a_step() -> None:
    w = torch.randn(37, 53) * 0.1
    w[3] = 0.0  # an all-zero row must not divide by zero
    q, s = qf.quantize_int8(w)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= 127
    assert torch.equal(s, s.to(torch.bfloat16).float())  # bfloat16 values, stored as float32
    err = (qf.dequantize_int8(q, s) - w).abs()
    assert bool((err <= s[:, None] / 2 + 2**-9 * w.abs().amax(1, keepdim=True) + 1e-9).all())
    assert torch.equal(qf.dequantize_int8(q, s)[3], torch.zeros(53))


@pytest.mark.parametrize("group_size", [8, 32, 64])
def test_int4_codes_are_within_half_a_step(group_size: int) -> None:
    w = torch.randn(24, 128) * 0.1 + 0.01
    q, s, z = qf.quantize_int4(w, group_size)
    assert q.dtype == torch.uint8 and int(q.max()) <= 15
    assert s.shape == z.shape == (24, 128 // group_size)
    err = (qf.dequantize_int4(q, s, z) - w).abs().reshape(24, -1, group_size)
    limit = 0.53 * s + 2**-8 * z.abs()
    assert bool((err <= limit[..., None] + 1e-9).all())


@pytest.mark.parametrize("k", [1, 6, 7, 64])
def test_nibble_packing_round_trips(k: int) -> None:
    q = torch.randint(0, 16, (5, k), dtype=torch.uint8)
    packed = qf.pack_nibbles(q)
    assert packed.shape == (5, (k + 1) // 2) and packed.dtype == torch.uint8
    assert int(packed[0, 0]) == int(q[0, 0]) + (16 * int(q[0, 1]) if k > 1 else 0)
    assert torch.equal(qf.unpack_nibbles(packed, k), q)


# -- kernels == reference ------------------------------------------------------------------


def _kernel_vs_reference(layer: QuantizedLinear, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    with torch.inference_mode():
        assert layer.uses_kernel(x)
        out = layer(x)
        w = layer.dequantize()
        ref = F.linear(x, w, layer.bias)
    return out, ref, _bound(x, w).reshape(out.shape)


@pytest.mark.parametrize(("n", "k"), [(1, 1), (7, 13), (5, 24), (48, 64), (100, 256)])
@pytest.mark.parametrize("shape", [(3,), (2, 5), (1, 1)])
def test_int8_kernel_equals_reference(n: int, k: int, shape: tuple[int, ...]) -> None:
    lin = _linear(n, k)
    x = torch.randn(*shape, k)
    exact = Int8Linear.from_linear(lin, activation_dtype="float32")
    assert exact.kernel == (wk.KERNEL_INT8 if wk.available() else "aten._weight_int8pack_mm")
    for kernel in [wk.KERNEL_INT8] * wk.available() + ["aten._weight_int8pack_mm"]:
        exact.kernel = kernel  # attnlab's float32 kernel, then PyTorch's scalar float32 path
        out, ref, bound = _kernel_vs_reference(exact, x)
        assert out.shape == (*shape, n) and out.dtype == torch.float32
        assert bool(((out - ref).abs() <= 1e-5 * bound + 1e-7).all()), kernel
    fast = Int8Linear.from_linear(lin, activation_dtype="bfloat16")
    if k % 16:  # the kernel's bfloat16 path crashes or is wrong for such K: never used
        assert fast.kernel == REFERENCE
        with torch.inference_mode():
            assert torch.equal(fast(x), F.linear(x, fast.dequantize(), fast.bias))
        return
    out, ref, bound = _kernel_vs_reference(fast, x)
    assert bool(((out - ref).abs() <= 2**-8 * bound + 1e-7).all())
    with torch.no_grad():  # the same rounding, emulated: within one bfloat16 step
        rounded = x.to(torch.bfloat16).float()
        emulated = (F.linear(rounded, fast.dequantize())).to(torch.bfloat16).float() + fast.bias
    assert bool(((out - emulated).abs() <= 2**-8 * emulated.abs() + 1e-5 * bound + 1e-7).all())


@pytest.mark.parametrize("group_size", [32, 64, 128, 256])
@pytest.mark.parametrize("n", [1, 17, 64])
def test_int4_kernel_equals_reference(group_size: int, n: int) -> None:
    lin = _linear(n, 256)
    x = torch.randn(2, 3, 256)
    exact = Int4Linear.from_linear(lin, group_size=group_size, activation_dtype="float32")
    if wk.available():  # attnlab's kernel reads the stored nibbles: no packed copy
        assert exact.kernel == wk.KERNEL_INT4 and exact.packed.numel() == 0
        assert exact.kernel_copy_bytes() == 0
        out, ref, bound = _kernel_vs_reference(exact, x)
        assert out.shape == (2, 3, n)
        assert bool(((out - ref).abs() <= 1e-5 * bound + 1e-7).all())
        exact.kernel = "aten._weight_int4pack_mm_for_cpu"  # then PyTorch's float32 path
        exact.prepare_kernel()
    assert exact.kernel == "aten._weight_int4pack_mm_for_cpu"
    assert exact.packed.shape[0] == qf.padded_rows(n)  # N padded to a multiple of 16
    out, ref, bound = _kernel_vs_reference(exact, x)
    assert out.shape == (2, 3, n)
    assert bool(((out - ref).abs() <= 1e-5 * bound + 1e-7).all())
    fast = Int4Linear.from_linear(lin, group_size=group_size, activation_dtype="bfloat16")
    out, ref, bound = _kernel_vs_reference(fast, x)
    assert bool(((out - ref).abs() <= 2**-8 * bound + 1e-7).all())


def test_unsupported_group_size_uses_the_reference_path() -> None:
    lin = _linear(20, 48)
    layer = Int4Linear.from_linear(lin, group_size=16, activation_dtype="bfloat16")  # 32..256 only
    assert layer.kernel == REFERENCE and "kernel=reference" in repr(layer)
    x = torch.randn(4, 48)
    with torch.inference_mode():
        assert torch.equal(layer(x), F.linear(x, layer.dequantize(), layer.bias))


def test_empty_int4_layer_packs_when_codes_arrive() -> None:
    source = Int4Linear.from_linear(_linear(16, 64), group_size=32, activation_dtype="bfloat16")
    empty = Int4Linear(64, 16, bias=True, group_size=32, activation_dtype="bfloat16")  # loading
    x = torch.randn(2, 64)
    assert not empty.uses_kernel(x)  # nothing packed yet: the reference path
    empty.load_state_dict(source.state_dict())
    with torch.inference_mode():
        assert empty.uses_kernel(x) and torch.equal(empty(x), source(x))


def test_grad_mode_and_input_gradients() -> None:
    layer = Int8Linear.from_linear(_linear(8, 32), activation_dtype="float32")
    x = torch.randn(3, 32)
    with torch.no_grad():
        a = layer(x)
    with torch.inference_mode():
        b = layer(x)
    assert torch.equal(a, b)
    xr = x.clone().requires_grad_(True)  # autograd through the reference path
    assert not layer.uses_kernel(xr)
    layer(xr).sum().backward()
    assert xr.grad is not None and torch.allclose(xr.grad, layer.dequantize().sum(0).expand(3, 32))


def test_modules_report_format_and_are_not_linears() -> None:
    q8 = Int8Linear.from_linear(_linear(16, 64), activation_dtype="bfloat16")
    q4 = Int4Linear.from_linear(_linear(16, 64), group_size=32, activation_dtype="bfloat16")
    for layer in (q8, q4):
        assert not isinstance(layer, nn.Linear)
    assert "bits=8" in repr(q8) and "per-channel" in repr(q8) and "_weight_int8pack_mm" in repr(q8)
    assert "bits=4" in repr(q4) and "group_size=32" in repr(q4)
    assert "_weight_int4pack_mm_for_cpu" in repr(q4) and "activation_dtype=bfloat16" in repr(q4)
    assert set(q4.state_dict()) == {"qweight", "scales", "zeros", "bias"}  # no kernel copies
    assert set(q8.state_dict()) == {"qweight", "scales", "bias"}


# -- models ----------------------------------------------------------------------------------


def test_model_kernels_equal_the_reference_path(monkeypatch: pytest.MonkeyPatch) -> None:
    model = quantize(_gpt(), "int4", group_size=32, activation_dtype="float32")
    ids = _ids()
    with torch.inference_mode():
        fast = model(ids)[0]
        for m in model.modules():
            if isinstance(m, QuantizedLinear):
                monkeypatch.setattr(m, "kernel", REFERENCE)
        slow = model(ids)[0]
    assert (fast - slow).abs().max() <= 1e-4 * slow.abs().max()


def _rel(a: Tensor, b: Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_int8_error_on_a_random_gpt_is_small() -> None:
    """int8 per-channel: a weight's rounding error is uniform in ±s/2 with s ≈ 2·3σ/254 for
    Gaussian rows of 64-128 weights, i.e. ~0.7% of the weights' RMS per layer; bfloat16 rows add
    ~0.2%. Five linears per path in quadrature: ~2%; we allow 3%. int4 (groups of 32, 16 levels)
    is ~11x coarser, so int8's error must be at least 4x smaller."""
    model, ids = _gpt(), _ids()
    with torch.no_grad():
        ref = model(ids)[0]
        e8 = _rel(quantize(copy.deepcopy(model), "int8")(ids)[0], ref)
        e4 = _rel(quantize(copy.deepcopy(model), "int4", group_size=32)(ids)[0], ref)
    assert e8 < 0.03
    assert e8 < e4 / 4


@pytest.mark.parametrize("make", [_gpt, _enc_dec])
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_generation_runs_on_quantized_models(make: Any, fmt: str) -> None:
    model = make()
    fp32 = attnlab.generate(model, _ids(2, 5), max_new_tokens=12)
    quantize(model, fmt, group_size=32, include_lm_head=True)
    assert not decoder_linears(model)[0]  # no stacked q/k/v copies of quantized layers
    assert copy_numel(model) == 0  # and no decode copy of anything quantized
    out = attnlab.generate(model, _ids(2, 5), max_new_tokens=12)
    assert out.shape == fp32.shape == (2, 12)
    assert int(out.min()) >= 0 and int(out.max()) < V
    if fmt == "int8":  # mostly the same greedy tokens (trained models: the benchmark's job)
        assert float((out == fp32).float().mean()) >= 0.5


def test_tied_head_and_embedding() -> None:
    default = quantize(_gpt(), "int8")
    assert isinstance(default.lm_head, nn.Linear)  # the head stays float32, still tied
    assert default.lm_head.weight is default.tok_embed.weight
    assert default.quantization_config.untied == ()
    head_only = quantize(_gpt(), "int8", include_lm_head=True)
    assert isinstance(head_only.lm_head, Int8Linear)
    assert isinstance(head_only.tok_embed.weight, nn.Parameter)  # float32 table kept
    assert head_only.quantization_config.untied == (("lm_head", "tok_embed"),)
    both = quantize(_gpt(), "int4", group_size=32, include_lm_head=True, include_embedding=True)
    assert isinstance(both.tok_embed, QuantizedEmbedding)
    assert both.tok_embed.table is both.lm_head  # one quantized table: still tied
    ids = _ids()
    with torch.no_grad():
        rows = both.tok_embed(ids)
    assert torch.equal(rows, both.lm_head.dequantize()[ids])


def test_shared_encoder_decoder_embeddings() -> None:
    model = _enc_dec(share_embeddings=True)
    assert model.src_embed is model.tgt_embed
    quantize(model, "int8", include_lm_head=True, include_embedding=True)
    assert isinstance(model.src_embed, QuantizedEmbedding) and model.src_embed is model.tgt_embed
    assert model.src_embed.table is model.lm_head


# -- save / load -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "fmt", "options"),
    [
        (_gpt, "int8", {}),
        (_gpt, "int4", {"group_size": 32, "include_lm_head": True}),
        (_gpt, "int4", {"group_size": 16, "include_lm_head": True, "include_embedding": True}),
        (_enc_dec, "int8", {"include_lm_head": True}),
    ],
)
def test_save_load_round_trip_is_bitwise(
    tmp_path: Path, make: Any, fmt: str, options: dict[str, Any]
) -> None:
    model = quantize(make(), fmt, **options)
    save_quantized(model, tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {
        "config.json",
        "model.safetensors",
        "quantization.json",
    }
    loaded = load_quantized(tmp_path)
    again = attnlab.from_pretrained(tmp_path)  # from_pretrained knows quantized directories
    ids = _ids()
    with torch.inference_mode():
        if isinstance(model, GPT):
            outs = [m(ids)[0] for m in (model, loaded, again)]
        else:
            outs = [m(ids, ids[:, :5])[0] for m in (model, loaded, again)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    assert loaded.quantization_config == model.quantization_config
    record = json.loads((tmp_path / "quantization.json").read_text())
    assert record["version"] == 1 and record["config"]["format"] == fmt
    if options.get("include_embedding"):
        assert loaded.tok_embed.table is loaded.lm_head  # the tie survives the file


def test_saved_int4_does_not_depend_on_the_cpu_kernel_layout(tmp_path: Path) -> None:
    """The int4 kernel packs differently per CPU capability; the file holds canonical codes, so
    a process with another capability (the scalar 'default' build) computes the same logits."""
    model = quantize(_gpt(), "int4", group_size=32, activation_dtype="float32")
    save_quantized(model, tmp_path)
    ids = _ids()
    with torch.inference_mode():
        expected = model(ids)[0]
    torch.save(ids, tmp_path / "ids.pt")
    script = (
        "import sys, torch; from attnlab.transforms import load_quantized\n"
        "m = load_quantized(sys.argv[1]); ids = torch.load(sys.argv[1] + '/ids.pt')\n"
        "torch.save(m(ids)[0].detach(), sys.argv[1] + '/out.pt')\n"
    )
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, env=env)
    other = torch.load(tmp_path / "out.pt")
    assert (other - expected).abs().max() <= 1e-4 * expected.abs().max()


# -- sizes -------------------------------------------------------------------------------------


def test_weight_bytes() -> None:
    model = _gpt()
    fp32 = quantized_weight_bytes(model)
    params = {id(p): p for p in model.parameters()}
    assert fp32.total_stored == sum(p.numel() * 4 for p in params.values())
    assert fp32.per_token == fp32.total_stored - model.pos_encoding.weight.numel() * 4
    q = quantize(copy.deepcopy(model), "int8", include_lm_head=True, activation_dtype="bfloat16")
    sizes = quantized_weight_bytes(q)
    linears = [m for m in q.modules() if isinstance(m, Int8Linear)]
    codes = sum(m.in_features * m.out_features for m in linears)
    rows = sum(m.out_features for m in linears)
    biases = sum(m.bias.numel() for m in linears if m.bias is not None)
    assert sizes.stored["int8"] == codes + 4 * rows + 4 * biases
    assert sizes.kernel_copies == 2 * rows  # bfloat16 scales for the kernel
    norms = sum(p.numel() * 4 for n, p in q.named_parameters() if "norm" in n)
    assert sizes.per_token == codes + 2 * rows + 4 * biases + norms
    if wk.available():  # float32 rows, attnlab's kernel: it streams the stored scales, no copy
        exact = quantized_weight_bytes(quantize(copy.deepcopy(model), "int8", include_lm_head=True))
        assert exact.kernel_copies == 0
        assert exact.per_token == codes + 4 * rows + 4 * biases + norms


# -- bad input -------------------------------------------------------------------------------


def test_bad_inputs_raise_value_errors() -> None:
    model = _gpt()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match="'int3'"):
        quantize(model, "int3")
    with pytest.raises(ValueError, match="group_size=48 does not divide in_features=64"):
        quantize(model, "int4", group_size=48)
    with pytest.raises(ValueError, match="group_size=0"):
        quantize(model, "int4", group_size=0)
    with pytest.raises(ValueError, match="'float16'"):
        quantize(model, "int8", activation_dtype="float16")
    assert all(isinstance(m, nn.Linear) for m in (model.lm_head, model.layers[0].ffn.up_proj))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched
    with pytest.raises(ValueError, match="Conv1d"):
        Int8Linear.from_linear(nn.Conv1d(3, 4, 1))
    with pytest.raises(ValueError, match="LayerNorm"):
        quantize(nn.LayerNorm(4), "int8")
    with pytest.raises(ValueError, match="already quantized"):
        quantize(quantize(model, "int8"), "int8")
    with pytest.raises(ValueError, match="expected input"):
        Int8Linear.from_linear(_linear(4, 8))(torch.randn(2, 9))
