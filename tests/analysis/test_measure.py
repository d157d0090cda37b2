"""Analytic FLOPs == the count of ``torch.utils.flop_counter.FlopCounterMode`` on real passes.

The comparison is exact: both sides count matrix products (and the ViT patch convolution) with
the 2·m·k·p convention and nothing else, so no tolerance is needed. The attention block is
counted on the meta device (shapes only, instant at n = 2048) and once on the CPU to show both
devices dispatch the same products.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from attnlab import PRESETS, build_model
from attnlab.analysis.flops import attention_block_flops, forward_flops
from attnlab.analysis.measure import (
    count_flops,
    example_inputs,
    measure_flops,
    measure_step_time,
    mfu,
    module_flops,
    use_attention_backend,
)
from attnlab.layers.multihead import MultiHeadAttention


def _block(n: int, d: int, h: int, device: str, **kw: object) -> tuple[int, int]:
    with torch.device(device):
        mha = MultiHeadAttention(d, h, bias=False, backend="sdpa", **kw)  # type: ignore[arg-type]
        x = torch.randn(1, n, d, requires_grad=True)
    m = count_flops(mha, (x,), backward=True)
    return m.forward, m.backward


@pytest.mark.parametrize(("n", "d"), [(128, 512), (512, 512), (2048, 512), (1024, 1024)])
@pytest.mark.parametrize("h", [1, 4, 8, 16])
def test_attention_block_matches_flop_counter(n: int, d: int, h: int) -> None:
    fwd, bwd = _block(n, d, h, "meta")
    assert fwd == attention_block_flops(n, d, h).forward == 8 * n * d**2 + 4 * n**2 * d
    assert bwd == 2 * fwd


def test_attention_block_cpu_equals_meta_and_gqa() -> None:
    assert _block(128, 512, 8, "cpu") == _block(128, 512, 8, "meta")
    fwd, _ = _block(96, 256, 8, "meta", n_kv_heads=2)
    assert fwd == attention_block_flops(96, 256, 8, n_kv_heads=2).forward


def test_sdpa_on_cpu_is_invisible_to_the_counter() -> None:
    """Why the counting helpers switch to the math backend."""
    q = torch.randn(1, 2, 8, 4)
    with FlopCounterMode(display=False) as fc:
        F.scaled_dot_product_attention(q, q, q)
    assert fc.get_total_flops() == 0
    mha = MultiHeadAttention(16, 2, bias=False, backend="sdpa")
    x = torch.randn(1, 8, 16)
    with_sdpa = count_flops(mha, (x,), attention_backend=None).forward
    assert with_sdpa == 4 * 2 * 8 * 16 * 16  # projections only
    assert count_flops(mha, (x,)).forward == with_sdpa + 4 * 8 * 8 * 16
    assert mha.backend_name == "sdpa" and mha.backend.__name__ == "sdpa_attention"  # restored


def test_use_attention_backend_restores_on_error() -> None:
    model = build_model("gpt-char-baby", n_layers=1)
    old = model.layers[0].self_attn.backend
    with pytest.raises(RuntimeError), use_attention_backend(model, "math"):
        assert model.layers[0].self_attn.backend is not old
        raise RuntimeError
    assert model.layers[0].self_attn.backend is old
    with (
        pytest.raises(ValueError, match="unknown attention backend"),
        use_attention_backend(model, "nope"),
    ):
        pass


BABY = PRESETS["gpt-char-baby"]
FAMILIES = {
    "encoder-decoder": (dataclasses.replace(PRESETS["transformer-tiny"], n_layers=1), 12, 10),
    "gpt": (dataclasses.replace(BABY, n_layers=2), 16, None),
    "bert": (dataclasses.replace(PRESETS["bert-tiny"], vocab_size=512, n_layers=1), 16, None),
    "vit": (dataclasses.replace(PRESETS["vit-digits"], n_layers=2), None, None),
    "llama-gqa": (
        dataclasses.replace(
            BABY,
            n_layers=2,
            n_kv_heads=2,
            activation="swiglu",
            pos_encoding="rope",
            norm="rmsnorm",
            bias=False,
            tie_output=False,
        ),
        16,
        None,
    ),
    "alibi-post-norm": (
        dataclasses.replace(BABY, n_layers=1, pos_encoding="alibi", norm_position="post"),
        16,
        None,
    ),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_whole_model_matches_flop_counter(family: str) -> None:
    config, n, src = FAMILIES[family]
    analytic = forward_flops(config, n, batch=2, src_len=src)
    measured = measure_flops(config, n, batch=2, src_len=src, backward=True)
    assert measured.forward == analytic.forward
    assert measured.backward == analytic.backward
    assert measured.training == analytic.training
    # Per module (forward): scores + weighted sum sit in their attention module.
    assert measured.by_module == module_flops(analytic.by_component())


def test_gpt3_175b_counted_on_meta_device() -> None:
    """The whole 175B forward + backward at n = 2048, without allocating a weight."""
    c = PRESETS["gpt3-175b"]
    measured = measure_flops(c, 2048, backward=True, device="meta")
    analytic = forward_flops(c, 2048)
    assert measured.forward == analytic.forward
    assert measured.backward == analytic.backward


def test_example_inputs_bad_input() -> None:
    with pytest.raises(ValueError, match="ViT sees 17 tokens"):
        example_inputs(PRESETS["vit-digits"], seq_len=5)
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        example_inputs(BABY, batch=0)
    with pytest.raises(ValueError, match="device must be"):
        measure_flops(BABY, 8, device="cuda:7")


def test_step_time_and_mfu() -> None:
    config = dataclasses.replace(BABY, n_layers=1)
    model = build_model(config)
    args, kwargs = example_inputs(config, batch=2, seq_len=16)
    seconds = measure_step_time(model, args, kwargs, repeats=2)
    assert seconds > 0
    assert all(p.grad is None for p in model.parameters())
    flops = forward_flops(config, 16, batch=2).training
    assert mfu(flops, seconds, flops / seconds) == pytest.approx(1.0)
    assert mfu(1e12, 2.0, 1e12) == 0.5
    with pytest.raises(ValueError, match="step_time_s must be positive"):
        mfu(1e12, 0.0, 1e12)
    with pytest.raises(ValueError, match="peak_flops_per_s must be positive"):
        mfu(1e12, 1.0, -1.0)
