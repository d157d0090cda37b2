"""Decoder-only families <-> Hugging Face: GPT-2, Llama (RoPE scaling, GQA), BLOOM (ALiBi).

For each: a transformers checkpoint loads as an attnlab GPT whose logits and final hidden states
match on a right-padded batch, 32 greedy tokens are identical, and save_hf writes a directory
that transformers loads with the same logits.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

import attnlab
from attnlab import GPT
from attnlab.interop import save_hf

V = 97
# transformers computes the RoPE frequencies in float32, attnlab in float64: Llama logits
# (magnitude ~6) differ by up to 8e-6 here, and each side is ~1e-5 from a float64 evaluation, so
# RoPE models get twice the 1e-5. The other families stay at tools.ATOL (1e-5).
ROPE_ATOL = 2e-5


def atol(tools: Any, family: str) -> float:
    return ROPE_ATOL if family == "llama" else tools.ATOL


def gpt2(t: ModuleType, **kw: Any) -> Any:
    cfg = t.GPT2Config(
        vocab_size=V,
        n_embd=64,
        n_layer=3,
        n_head=4,
        n_positions=64,
        initializer_range=0.2,  # large weights make the comparison sensitive
        bos_token_id=0,
        eos_token_id=0,
        **kw,
    )
    return t.GPT2LMHeadModel(cfg)


def llama(t: ModuleType, **kw: Any) -> Any:
    kw = {"max_position_embeddings": 64, **kw}
    cfg = t.LlamaConfig(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention
        initializer_range=0.2,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=None,
        **kw,
    )
    return t.LlamaForCausalLM(cfg)


def bloom(t: ModuleType, **kw: Any) -> Any:
    cfg = t.BloomConfig(
        vocab_size=V,
        hidden_size=64,
        n_layer=3,
        n_head=4,
        initializer_range=0.2,
        bos_token_id=0,
        eos_token_id=0,
        **kw,
    )
    return t.BloomForCausalLM(cfg)


FAMILIES = {"gpt2": gpt2, "llama": llama, "bloom": bloom}


def base_hidden(hf: Any, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    out = hf(ids, attention_mask=mask, output_hidden_states=True)
    return out.hidden_states[-1]  # after the final norm in all three families


@pytest.mark.parametrize("family", list(FAMILIES))
def test_parity_and_greedy(
    transformers: ModuleType, tools: Any, tmp_path: Path, family: str
) -> None:
    hf = FAMILIES[family](transformers).eval()
    model = attnlab.from_pretrained(tools.save(hf, tmp_path))
    assert isinstance(model, GPT) and not model.training
    ids = tools.ids(3, 16, V)
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0  # right padding
    mask[2, 6:] = 0
    real = mask.bool()
    with torch.no_grad():
        ref_logits = hf(ids, attention_mask=mask).logits
        logits, _ = model(ids, mask=mask)
        hidden = model.hidden_states(ids, mask=mask)
        ref_hidden = base_hidden(hf, ids, mask)
    assert tools.max_diff(logits[real], ref_logits[real]) <= atol(tools, family)
    assert tools.max_diff(hidden[real], ref_hidden[real]) <= atol(tools, family)
    prompt = ids[:, :8]
    assert torch.equal(tools.greedy_gpt(model, prompt, 32), tools.greedy_hf(hf, prompt, 32))


@pytest.mark.parametrize("kind", ["linear", "dynamic"])
def test_llama_rope_scaling(
    transformers: ModuleType, tools: Any, tmp_path: Path, kind: str
) -> None:
    """rope_scaling linear/dynamic (factor 2) with a 16-token trained context and 24 tokens."""
    hf = llama(
        transformers,
        max_position_embeddings=16,
        rope_scaling={"rope_type": kind, "factor": 2.0},
    ).eval()
    model = attnlab.from_pretrained(tools.save(hf, tmp_path))
    assert isinstance(model, GPT)
    assert (model.config.rope_scaling, model.config.rope_factor) == (kind, 2.0)
    ids = tools.ids(2, 24, V)
    # A fresh transformers model: its dynamic RoPE keeps the longest length seen so far.
    with torch.no_grad():
        assert tools.max_diff(model(ids)[0], hf(ids).logits) <= ROPE_ATOL
    prompt = ids[:, :8]  # greedy decoding runs past the trained context
    assert torch.equal(tools.greedy_gpt(model, prompt, 32), tools.greedy_hf(hf, prompt, 32))


ROUND_TRIPS = {
    "gpt2": dict(d_ff=256),
    "llama": dict(
        pos_encoding="rope",
        norm="rmsnorm",
        activation="swiglu",
        bias=False,
        tie_output=False,
        n_kv_heads=2,
        d_ff=160,
        rope_scaling="linear",
        rope_factor=2.0,
    ),
    "bloom": dict(pos_encoding="alibi", embed_norm=True, d_ff=256),
}


@pytest.mark.parametrize("family", list(ROUND_TRIPS))
def test_round_trip_through_transformers(
    transformers: ModuleType, tools: Any, tmp_path: Path, family: str
) -> None:
    cfg = attnlab.GPTConfig(
        vocab_size=V,
        d_model=64,
        n_heads=4,
        n_layers=2,
        max_seq_len=64,
        dropout=0.0,
        eos_id=None,
        **ROUND_TRIPS[family],  # type: ignore[arg-type]
    )
    model = GPT(cfg).eval()
    tools.randomise(model, std=0.1)
    save_hf(model, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert hf.config.model_type == family
    ids = tools.ids(2, 20, V)
    with torch.no_grad():
        assert tools.max_diff(model(ids)[0], hf(ids).logits) <= atol(tools, family)
    tools.assert_same_state(model, attnlab.from_pretrained(tmp_path))


def test_no_hugging_face_equivalent(tmp_path: Path) -> None:
    model = GPT(
        attnlab.GPTConfig(
            vocab_size=V,
            d_model=32,
            n_heads=4,
            n_layers=1,
            d_ff=64,
            pos_encoding="sinusoidal",
            eos_id=None,
        )
    )
    with pytest.raises(ValueError, match="no Hugging Face equivalent") as err:
        save_hf(model, tmp_path)
    for family in ("GPT-2", "Llama", "BLOOM"):  # every candidate says why not
        assert family in str(err.value)


@pytest.mark.parametrize(
    ("family", "kw", "message"),
    [
        ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
        ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "RoPE type 'yarn'"),
        ("llama", {"attention_bias": True}, "one bias switch"),
        ("bloom", {"apply_residual_connection_post_layernorm": True}, "post_layernorm"),
    ],
)
def test_unsupported_options(
    transformers: ModuleType, tools: Any, tmp_path: Path, family: str, kw: Any, message: str
) -> None:
    hf = FAMILIES[family](transformers, **kw)
    with pytest.raises(ValueError, match=message):
        attnlab.from_pretrained(tools.save(hf, tmp_path))
