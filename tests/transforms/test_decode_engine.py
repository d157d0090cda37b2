"""decode_layout: reordered weight copies for decoding change speed, never results."""

from __future__ import annotations

import copy
import dataclasses
import gc
import importlib
from contextlib import nullcontext

import pytest
import torch

import attnlab
from attnlab import GPT, GPTConfig
from attnlab.generation import stream
from attnlab.transforms import decode_weights as layout_module
from attnlab.transforms.decode_weights import (
    _COPIES,
    MAX_ROWS,
    active_copy,
    copy_numel,
    decode_layout,
    release_copies,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(autouse=True)
def _onednn_for_large_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests below check the reordered copies, which an Intel CPU would not make by
    default (test_large_weights_follow_the_cpu covers that choice)."""
    monkeypatch.setenv(layout_module.LIBRARY_VARIABLE, "onednn")


def _all_large(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every weight count as large: reordered (oneDNN) copies, whatever the rows."""
    monkeypatch.setattr(layout_module, "ONEDNN_MIN_NUMEL", 0)


def _gpt(**overrides: object) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=50,
        d_model=32,
        n_heads=4,
        n_layers=2,
        d_ff=64,
        max_seq_len=64,
        dropout=0.0,
        eos_id=None,
    )
    model = GPT(dataclasses.replace(cfg, **overrides)).eval()  # type: ignore[arg-type]
    with torch.no_grad():  # large weights: peaked next-token distributions, no near-ties
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.15)
            else:  # biases and norm gains
                p.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize(
    "overrides",
    [{}, {"n_kv_heads": 2, "pos_encoding": "rope", "activation": "swiglu", "bias": False}],
)
@pytest.mark.parametrize("large", [False, True])
def test_logits_inside_equal_logits_outside(
    overrides: dict[str, object], large: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if large:
        _all_large(monkeypatch)
    model = _gpt(**overrides)
    ids = torch.randint(0, 50, (1, 7))
    with torch.inference_mode():
        expected, _ = model(ids)
        with decode_layout(model, rows=1):
            attn = model.layers[0].self_attn
            assert active_copy(attn) is not None and active_copy(attn).is_current()
            assert active_copy(model.lm_head) is not None  # wide: 32 -> 50
            narrow = active_copy(model.layers[0].ffn.down_proj)  # 64 -> 32
            assert (narrow is not None) == large  # small and narrow: no copy
            assert (active_copy(model.layers[0].self_attn.out_proj) is not None) == large
            assert active_copy(model.lm_head).reordered == large
            assert active_copy(model.layers[0].self_attn.q_proj) is None  # stacked instead
            got, _ = model(ids)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_encoder_decoder_copies_skip_the_memory_projections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _all_large(monkeypatch)
    torch.manual_seed(0)
    model = attnlab.build_model("transformer-tiny").eval()
    with decode_layout(model, rows=2):
        layer = model.decoder.layers[0]
        assert active_copy(layer.cross_attn.q_proj) is not None
        assert active_copy(layer.cross_attn.out_proj) is not None
        assert active_copy(layer.cross_attn.k_proj) is None  # run once on the memory
        assert active_copy(layer.self_attn) is not None
    with torch.device("meta"):
        meta = attnlab.build_model("transformer-tiny")
    copied = copy_numel(meta)
    assert copied == copy_numel(model) and 0 < copied < sum(p.numel() for p in model.parameters())


def test_parameters_are_untouched_and_copies_detached() -> None:
    model = _gpt()
    before = {n: (p.data_ptr(), p.stride(), p._version) for n, p in model.named_parameters()}
    with decode_layout(model, rows=1):
        pass
    after = {n: (p.data_ptr(), p.stride(), p._version) for n, p in model.named_parameters()}
    assert after == before
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert all(active_copy(m) is None for m in linears)
    assert all(active_copy(layer.self_attn) is None for layer in model.layers)


@pytest.mark.parametrize("large", [False, True])
def test_many_rows_use_only_reordered_copies(large: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if large:
        _all_large(monkeypatch)
    model = _gpt()
    ids = torch.randint(0, 50, (MAX_ROWS + 1, 7))
    with torch.inference_mode():
        expected, _ = model(ids)
        with decode_layout(model, rows=MAX_ROWS + 1):
            assert (active_copy(model.lm_head) is not None) == large
            assert (active_copy(model.layers[0].self_attn) is not None) == large
            got, _ = model(ids)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_models_off_fp32_get_no_copies() -> None:
    model = _gpt().double()
    with decode_layout(model, rows=1):
        assert active_copy(model.lm_head) is None
        assert active_copy(model.layers[0].self_attn) is None
    assert model not in _COPIES


def test_weights_changed_mid_stream_are_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """Copies made at the start of a stream are ignored once their weights change: the stream
    continues exactly like one that never had copies."""
    generate_module = importlib.import_module("attnlab.generation.generate")  # not the function
    model = _gpt()
    reference = copy.deepcopy(model)
    ids = torch.randint(0, 50, (1, 5))
    with_copies = stream(model, ids, max_new_tokens=3, eos_id=())
    next(with_copies)  # the copies exist from here on
    monkeypatch.setattr(generate_module, "decode_layout", lambda m, rows: nullcontext())
    without = stream(reference, ids, max_new_tokens=3, eos_id=())
    next(without)
    assert active_copy(model.lm_head) is not None
    with torch.no_grad():
        for m in (model, reference):  # an optimizer step between two tokens
            m.lm_head.weight.mul_(-1.0)
            m.layers[0].ffn.up_proj.weight.add_(0.5)
            m.layers[1].self_attn.k_proj.weight.mul_(2.0)
    for a, b in zip(with_copies, without, strict=True):
        torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=1e-5)


def test_generate_few_rows_equals_many_rows() -> None:
    """Rows decoded in a small batch get the tokens they get in a big one."""
    model = _gpt()
    ids = torch.randint(0, 50, (MAX_ROWS + 1, 6))
    few = attnlab.generate(model, ids[:MAX_ROWS], max_new_tokens=16, eos_id=())
    many = attnlab.generate(model, ids, max_new_tokens=16, eos_id=())
    assert torch.equal(few, many[:MAX_ROWS])


def test_copies_are_kept_between_calls_and_made_again_when_stale() -> None:
    model = _gpt()
    with decode_layout(model, rows=1):
        head, qkv = active_copy(model.lm_head), active_copy(model.layers[0].self_attn)
    with decode_layout(model, rows=1):
        assert active_copy(model.lm_head) is head  # reused, not copied again
        assert active_copy(model.layers[0].self_attn) is qkv
    with torch.no_grad():
        model.layers[0].self_attn.v_proj.bias.add_(1.0)  # e.g. a training step
    with decode_layout(model, rows=1):
        assert active_copy(model.lm_head) is head
        fresh = active_copy(model.layers[0].self_attn)
        assert fresh is not qkv and fresh is not None and fresh.is_current()
    release_copies(model)
    assert model not in _COPIES


def test_copies_go_with_their_model() -> None:
    model = _gpt()
    with decode_layout(model, rows=1):
        pass
    assert len(_COPIES) >= 1 and model in _COPIES
    n = len(_COPIES)
    del model
    gc.collect()
    assert len(_COPIES) == n - 1


_needs_kernels = pytest.mark.skipif(
    not importlib.import_module("attnlab.transforms.woq_kernels").available(),
    reason="attnlab's int8/int4 CPU kernels are not built here",
)


@_needs_kernels
@pytest.mark.parametrize(("fmt", "options"), [("int8", {}), ("int4", {"group_size": 16})])
@pytest.mark.parametrize("bias", [True, False])
def test_quantized_qkv_are_joined_and_decode_bit_for_bit(
    fmt: str, options: dict[str, int], bias: bool
) -> None:
    """A quantized model's q/k/v become one kernel call inside decode_layout; the logits and the
    greedy tokens are bitwise those of the three separate layers."""
    from attnlab.transforms import quantize
    from attnlab.transforms.decode_weights import QuantizedStack

    model = quantize(_gpt(bias=bias), fmt, **options)  # type: ignore[arg-type]
    ids = torch.randint(0, 50, (2, 7))
    with torch.inference_mode():
        expected, _ = model(ids)
        with decode_layout(model, rows=2):
            joined = active_copy(model.layers[0].self_attn)
            assert isinstance(joined, QuantizedStack) and joined.is_current()
            assert joined.layer.out_features == 3 * 32 and type(joined.layer).__name__ in (
                "Int8Linear",
                "Int4Linear",
            )
            got, _ = model(ids)
    assert torch.equal(got, expected)
    assert active_copy(model.layers[0].self_attn) is None  # outside the layout: restored
    plain = attnlab.generate(model, ids, max_new_tokens=6, eos_id=())
    generate_module = importlib.import_module("attnlab.generation.generate")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(generate_module, "decode_layout", lambda m, rows: nullcontext())
        unjoined = attnlab.generate(model, ids, max_new_tokens=6, eos_id=())
    assert torch.equal(plain, unjoined)


@_needs_kernels
@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_quantized_decoders_attend_with_attnlab_kernel(
    n_kv_heads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside decode_layout a quantized decoder's self-attention runs attnlab's decode-attention
    kernel for its one-query steps (and sdpa for the prompt, and whenever a mask is given); the
    backend is restored afterwards; the greedy tokens equal those of the plain sdpa path and the
    step logits agree to 1e-4 (float32 products in another order)."""
    from attnlab.layers.attention_backends import sdpa_attention
    from attnlab.transforms import quantize
    from attnlab.transforms import woq_kernels as wk

    model = quantize(_gpt(n_kv_heads=n_kv_heads), "int8")
    attn = model.layers[0].self_attn
    calls: list[tuple[int, ...]] = []
    kernel = wk.decode_attention

    def counting(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(k.shape))
        return kernel(q, k, v)

    monkeypatch.setattr(wk, "decode_attention", counting)
    # the modules' path (the fused layer step calls the kernel from C++: test_decode_layer.py)
    monkeypatch.setattr(layout_module, "layer_plan", lambda *args: None)
    ids = torch.randint(0, 50, (2, 7))
    with decode_layout(model, rows=2):
        assert getattr(attn.backend, "decode_kernel", False)
        with torch.no_grad():
            model(ids)  # the prompt: seven queries, sdpa
        assert calls == []
    assert attn.backend is sdpa_attention  # restored
    got = attnlab.generate(model, ids, max_new_tokens=6, eos_id=())  # inside decode_layout
    # 5 one-query steps (the first token comes from the prompt's pass), 2 layers each
    assert len(calls) == 10 and calls[0] == (2, n_kv_heads, 8, 8) and calls[-1][2] == 12
    generate_module = importlib.import_module("attnlab.generation.generate")
    with monkeypatch.context() as mp:
        mp.setattr(generate_module, "decode_layout", lambda m, rows: nullcontext())
        plain = attnlab.generate(model, ids, max_new_tokens=6, eos_id=())
    assert torch.equal(got, plain)

    def step_logits() -> torch.Tensor:  # the prompt, then 4 cached one-token steps
        cache = model.new_cache(16)
        logits, _ = model(ids, cache=cache)
        out = [logits[:, -1]]
        for t in range(4):
            logits, _ = model(got[:, -6 + t : -5 + t], cache=cache)
            out.append(logits[:, -1])
        return torch.stack(out)

    with torch.inference_mode():
        expected = step_logits()
        with decode_layout(model, rows=2):
            kernel_logits = step_logits()
    torch.testing.assert_close(kernel_logits, expected, atol=1e-4, rtol=0)
    assert len(calls) == 10 + 8  # the 4 steps of step_logits, 2 layers each
    calls.clear()
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[0, :3] = False  # left padding: every step carries a mask, so sdpa runs
    attnlab.generate(model, ids, max_new_tokens=3, eos_id=(), attention_mask=mask)
    assert calls == []


@_needs_kernels
def test_quantized_join_is_made_again_when_a_source_changes() -> None:
    from attnlab.transforms import quantize

    model = quantize(_gpt(), "int8")
    attn = model.layers[0].self_attn
    with decode_layout(model, rows=1):
        first = active_copy(attn)
    with decode_layout(model, rows=1):
        assert active_copy(attn) is first  # kept between calls
    with torch.no_grad():
        attn.k_proj.scales.mul_(2.0)  # the source changed in place
    ids = torch.randint(0, 50, (1, 5))
    with torch.inference_mode(), decode_layout(model, rows=1):
        fresh = active_copy(attn)
        assert fresh is not first and fresh is not None and fresh.is_current()
        got, _ = model(ids)
    with torch.inference_mode():
        expected, _ = model(ids)
    assert torch.equal(got, expected)


def test_stack_quantized_refuses_mixed_formats() -> None:
    from attnlab.transforms.quant_modules import Int4Linear, Int8Linear, stack_quantized

    a = Int8Linear.from_linear(torch.nn.Linear(32, 8), activation_dtype="float32")
    b = Int4Linear.from_linear(torch.nn.Linear(32, 8), group_size=16, activation_dtype="float32")
    with pytest.raises(ValueError, match="one format"):
        stack_quantized([a, b])
    with pytest.raises(ValueError, match="one format"):
        stack_quantized([])


@pytest.mark.parametrize(
    ("vendor", "setting", "library"),
    [
        ("GenuineIntel", "auto", "mkl"),
        ("AuthenticAMD", "auto", "onednn"),
        ("", "", "onednn"),
        ("GenuineIntel", "onednn", "onednn"),
        ("AuthenticAMD", "MKL", "mkl"),
    ],
)
def test_large_weights_follow_the_cpu(
    vendor: str, setting: str, library: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large weights are decoded by MKL from the parameters themselves on Intel CPUs and from
    reordered oneDNN copies elsewhere (ATTNLAB_DECODE_LIBRARY decides by hand); the logits are
    those of the modules either way, to float rounding."""
    _all_large(monkeypatch)
    monkeypatch.setattr(layout_module, "_cpu_vendor", lambda: vendor)
    monkeypatch.setenv(layout_module.LIBRARY_VARIABLE, setting)
    assert layout_module.large_weight_library() == library
    model = _gpt()
    ids = torch.randint(0, 50, (1, 6))
    with torch.inference_mode():
        expected, _ = model(ids)
        with decode_layout(model, rows=1):
            copied = active_copy(model.lm_head)
            got, _ = model(ids)
    assert (copied is not None and copied.reordered) == (library == "onednn")
    assert (copied is None) == (library == "mkl")
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_a_bad_library_setting_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(layout_module.LIBRARY_VARIABLE, "cublas")
    with pytest.raises(ValueError, match="ATTNLAB_DECODE_LIBRARY='cublas': expected"):
        layout_module.large_weight_library()
