"""Analytic FLOPs: the lesson's closed forms, crossover lengths, the 6·N rule, sweeps, bad input."""

from __future__ import annotations

import dataclasses

import pytest

from attnlab import PRESETS
from attnlab.analysis.flops import SOFTMAX_FLOPS_PER_SCORE, attention_block_flops, forward_flops
from attnlab.analysis.scaling import approximations, crossover, sweep_seq_len

LESSON_PAIRS = [(128, 512), (512, 512), (2048, 512), (1024, 1024)]


@pytest.mark.parametrize(("n", "d"), LESSON_PAIRS)
@pytest.mark.parametrize("h", [1, 4, 8, 16])
def test_attention_block_closed_form(n: int, d: int, h: int) -> None:
    f = attention_block_flops(n, d, h)
    assert f.forward == 8 * n * d**2 + 4 * n**2 * d  # independent of h
    parts = f.by_component()
    assert sum(parts[f"attn.{p}"] for p in ("q_proj", "k_proj", "v_proj")) == 6 * n * d**2
    assert parts["attn.out_proj"] == 2 * n * d**2
    assert parts["attn.scores"] == parts["attn.weighted_sum"] == 2 * n**2 * d
    assert f.softmax == SOFTMAX_FLOPS_PER_SCORE * h * n * n  # O(n²h), reported separately
    assert f.backward == 2 * f.forward


def test_attention_block_gqa_and_cross_lengths() -> None:
    n, S, d, h, kv = 64, 96, 256, 8, 2
    f = attention_block_flops(n, d, h, n_kv_heads=kv, kv_len=S, batch=3)
    D = d // h
    # q/out: 2·B·n·d² each; k/v shrink to H_kv·D columns; products run over all query heads.
    assert f.forward == 3 * (4 * n * d * d + 4 * S * d * kv * D + 4 * n * S * d)


def test_ffn_and_whole_gpt_closed_form() -> None:
    """GPT-2-style layer: 24·n·d² + 4·n²·d, plus the LM head 2·n·d·V."""
    c = PRESETS["gpt2-small"]
    n, d, L, V = 1024, c.d_model, c.n_layers, c.vocab_size
    f = forward_flops(c, n)
    assert f.forward == L * (24 * n * d * d + 4 * n * n * d) + 2 * n * d * V
    assert f.grouped()["ffn"] == L * 16 * n * d * d
    assert f.training == 3 * f.forward
    assert f.tokens == n and f.forward_per_token == f.forward / n


def test_gated_ffn_and_gqa_llama() -> None:
    c = PRESETS["llama2-7b"]
    n, d, F = 128, c.d_model, c.d_ff
    f = forward_flops(c, n, batch=2)
    assert f.grouped()["ffn"] == c.n_layers * 2 * 3 * (2 * n) * d * F
    gqa = forward_flops(dataclasses.replace(c, n_kv_heads=8), n, batch=2)
    saved = f.grouped()["projections"] - gqa.grouped()["projections"]
    assert saved == c.n_layers * 2 * 2 * (2 * n) * d * (d - 8 * c.d_head)
    assert gqa.grouped()["attention"] == f.grouped()["attention"]


def test_cross_attention_uses_source_length() -> None:
    c = PRESETS["transformer-base"]
    d, L = c.d_model, c.n_layers
    T, S = 32, 80
    parts = forward_flops(c, T, src_len=S).by_component()
    assert parts["decoder.cross_attn.q_proj"] == L * 2 * T * d * d
    assert parts["decoder.cross_attn.k_proj"] == L * 2 * S * d * d
    assert parts["decoder.cross_attn.scores"] == L * 2 * T * S * d
    assert parts["encoder.self_attn.scores"] == L * 2 * S * S * d
    assert parts["decoder.self_attn.scores"] == L * 2 * T * T * d


def test_vit_patch_projection_needs_no_input_gradient() -> None:
    c = PRESETS["vit-b16"]
    f = forward_flops(c)
    assert f.seq_len == 197
    patch = f.by_component()["patch_embed.proj"]
    assert patch == 2 * 196 * (3 * 16 * 16) * c.d_model
    assert f.backward == 2 * f.forward - patch


def test_crossover_lesson_values() -> None:
    gpt3 = crossover(PRESETS["gpt3-175b"])
    d = 12288
    assert gpt3.block == 2 * d  # the seed's "attention dominates once n > 2d"
    assert gpt3.layer == 6 * d  # with the FFN (d_ff = 4d)
    assert gpt3.layer < gpt3.model < 1.01 * gpt3.layer
    llama = crossover(PRESETS["llama2-7b"])
    assert llama.layer == 2 * 4096 + 3 * 11008 / 2  # gated FFN
    assert crossover(dataclasses.replace(PRESETS["llama2-7b"], n_kv_heads=8)).block == 4096 + 1024


@pytest.mark.parametrize("name", ["gpt2-small", "bert-base", "vit-b16", "transformer-base"])
def test_crossover_is_where_the_terms_meet(name: str) -> None:
    c = PRESETS[name]
    x = crossover(c)
    block = attention_block_flops(round(x.block), c.d_model, c.n_heads).grouped()
    assert block["attention"] == block["projections"]
    for n, sign in ((int(x.model * 0.99), -1), (int(x.model * 1.01) + 1, 1)):
        if isinstance(c, type(PRESETS["transformer-base"])):
            f = forward_flops(c, n, src_len=n)
        else:
            f = forward_flops(c, n)
        attn = f.grouped()["attention"]
        assert (attn - (f.forward - attn)) * sign > 0


def test_six_n_approximation_gpt3() -> None:
    c = PRESETS["gpt3-175b"]
    f = forward_flops(c, 2048)
    six_n, _, palm = approximations(c, f)
    assert six_n.flops == 6 * 174_604_259_328 * 2048
    assert -0.03 < six_n.relative_error < -0.02  # misses the n²·d attention terms
    assert abs(palm.relative_error) < 1e-3


def test_sweep_moves_the_bottleneck() -> None:
    rows = sweep_seq_len(PRESETS["gpt2-small"], [128, 1024, 8192, 65536])
    attn = [r["attention"] for r in rows]
    assert attn == sorted(attn) and attn[-1] > 0.5
    for r in rows:
        assert sum(r[g] for g in ("projections", "attention", "ffn", "other")) == pytest.approx(1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"seq_len": 0}, "seq_len must be a positive integer"),
        ({"seq_len": -5}, "seq_len must be a positive integer"),
        ({"batch": 0}, "batch must be a positive integer"),
        ({"seq_len": 2.5}, "seq_len must be a positive integer"),
        ({"src_len": 4}, "src_len applies to encoder-decoder"),
    ],
)
def test_bad_input(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        forward_flops(PRESETS["gpt-char-baby"], **kwargs)  # type: ignore[arg-type]


def test_bad_config_and_block_sizes() -> None:
    @dataclasses.dataclass
    class Other:
        d_model: int = 8

    with pytest.raises(ValueError, match="no FLOP formula for Other"):
        forward_flops(Other())
    with pytest.raises(ValueError, match="does not divide"):
        attention_block_flops(16, 100, 3)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        attention_block_flops(16, 64, 4, n_kv_heads=3)
    with pytest.raises(ValueError, match="at least one patch"):
        forward_flops(PRESETS["vit-digits"], 1)
