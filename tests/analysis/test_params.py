"""Parameter counts: closed form == instantiated model == the reference implementations."""

from __future__ import annotations

import dataclasses

import pytest

from attnlab import PRESETS, build_model, count_params
from attnlab.analysis.params import param_breakdown

# Hugging Face's counts for the same configurations (tied weights once): GPT2LMHeadModel,
# BertModel (encoder + pooler), ViTForImageClassification (1000 classes), LlamaForCausalLM.
REFERENCE = {
    "gpt2-small": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "gpt3-175b": 174_604_259_328,
    "bert-base": 109_482_240,
    "bert-large": 335_141_888,
    "vit-b16": 86_567_656,
    "vit-l16": 304_326_632,
    "vit-h14": 632_045_800,
    "llama2-7b": 6_738_415_616,
}


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_published_counts(name: str) -> None:
    assert count_params(PRESETS[name]) == REFERENCE[name]


@pytest.mark.parametrize("exclude", [False, True])
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_closed_form_matches_instantiated(name: str, exclude: bool) -> None:
    model = build_model(name, device="meta")
    assert count_params(PRESETS[name], exclude_embeddings=exclude) == count_params(
        model, exclude_embeddings=exclude
    )


VARIANTS = [
    ("gpt-char-baby", {"n_kv_heads": 2, "activation": "swiglu", "bias": False}),
    ("gpt-char-baby", {"tie_output": False, "pos_encoding": "rope", "norm": "rmsnorm"}),
    ("gpt-char-baby", {"norm_position": "post", "pos_encoding": "alibi"}),
    ("bert-tiny", {"pooler": False, "tie_output": False, "norm_position": "pre"}),
    ("bert-tiny", {"mlm_head": False, "activation": "geglu", "n_kv_heads": 1}),
    ("vit-digits", {"pos_encoding": "none", "bias": False, "norm": "rmsnorm"}),
    ("transformer-tiny", {"share_embeddings": False, "tgt_vocab_size": 50, "tie_output": False}),
    ("transformer-tiny", {"norm_position": "pre", "n_decoder_layers": 3}),
    ("transformer-tiny", {"pos_encoding": "learned", "activation": "swiglu"}),
]


@pytest.mark.parametrize(("name", "overrides"), VARIANTS)
def test_closed_form_matches_variants(name: str, overrides: dict[str, object]) -> None:
    config = dataclasses.replace(PRESETS[name], **overrides)
    model = build_model(config, device="meta")
    for exclude in (False, True):
        assert count_params(config, exclude_embeddings=exclude) == count_params(
            model, exclude_embeddings=exclude
        )


def test_tied_weights_count_once() -> None:
    tied = build_model("gpt-char-baby", device="meta")
    untied = build_model("gpt-char-baby", device="meta", tie_output=False)
    c = PRESETS["gpt-char-baby"]
    assert count_params(untied) - count_params(tied) == c.vocab_size * c.d_model


def test_gpt2_non_embedding_count() -> None:
    """Kaplan et al.'s N: GPT-2 small without token and position tables."""
    assert count_params(PRESETS["gpt2-small"], exclude_embeddings=True) == 85_056_000


def test_unknown_config_type() -> None:
    @dataclasses.dataclass
    class Other:
        d_model: int = 1

    with pytest.raises(ValueError, match="no closed-form parameter count for Other"):
        count_params(Other())


# -- per-component breakdown ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_breakdown_sums_to_count_params(name: str) -> None:
    """count_params(config) is the breakdown's total, so the module tests above check it."""
    b = param_breakdown(PRESETS[name])
    assert b.total == count_params(PRESETS[name])
    assert sum(b.grouped().values()) == b.total


def test_gpt3_lesson_table() -> None:
    """Per layer 4d² attention + 8d² FFN (+ biases), 96 layers: 12·96·d² ≈ 174B of the 175B."""
    d, L = 12288, 96
    b = param_breakdown(PRESETS["gpt3-175b"])
    assert b.per_layer("layers.self_attn") == 4 * d * d + 4 * d
    assert b.per_layer("layers.ffn") == 8 * d * d + 5 * d
    assert b.components["layers.self_attn"] + b.components["layers.ffn"] == L * (12 * d * d + 9 * d)
    assert 12 * L * d * d == 173_946_175_488
    assert b.components["embedding.token"] == 50257 * d
    assert b.components["lm_head"] == 0 and b.tied == {"lm_head": "embedding.token"}


def test_breakdown_gqa_gated_untied() -> None:
    c = PRESETS["llama2-7b"]
    b = param_breakdown(c)
    assert b.per_layer("layers.self_attn") == 4 * 4096 * 4096  # no biases
    assert b.per_layer("layers.ffn") == 3 * 4096 * 11008  # SwiGLU: gate, up, down
    assert b.components["lm_head"] == 32000 * 4096 and not b.tied
    gqa = param_breakdown(dataclasses.replace(c, n_kv_heads=8))
    assert gqa.per_layer("layers.self_attn") == 2 * 4096 * 4096 + 2 * 4096 * 1024


def test_breakdown_encoder_decoder_and_bert() -> None:
    t = param_breakdown(PRESETS["transformer-base"])
    assert t.n_layers == {"encoder": 6, "decoder": 6}
    assert t.components["decoder.cross_attn"] == t.components["decoder.self_attn"]
    assert t.tied == {"embedding.target": "embedding.token", "lm_head": "embedding.token"}
    bert = param_breakdown(dataclasses.replace(PRESETS["bert-base"], mlm_head=True))
    assert bert.components["mlm.decoder"] == 30522  # the bias; the matrix is the token table
    assert bert.grouped()["embeddings"] == (30522 + 2 + 512) * 768
    with pytest.raises(ValueError, match="not a per-layer component"):
        bert.per_layer("pooler")


def test_breakdown_unknown_config() -> None:
    @dataclasses.dataclass
    class Other:
        d_model: int = 1

    with pytest.raises(ValueError, match="no parameter breakdown for Other"):
        param_breakdown(Other())
