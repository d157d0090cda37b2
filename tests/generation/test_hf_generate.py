"""attnlab.generate == transformers' generate on tiny random GPT-2, Llama and Marian checkpoints.

Each Hugging Face model gets large random weights (``initializer_range=0.2``), is saved with
``save_pretrained`` and loaded with :func:`attnlab.from_pretrained`. Greedy decoding is compared
on a left-padded batch (decoder-only) or a padded source batch (Marian), without and with an
EOS id. Beam search (4 beams, 2 returned sequences) is compared where the two libraries define
the same search: Hugging Face's ``length_penalty`` divides by ``|Y| ** α`` (attnlab's
``length_norm="power"``), not GNMT's ``((5 + |Y|) / 6) ** α``; with α = 0 both are plain
log-probability, and Hugging Face's ``early_stopping="never"`` uses attnlab's exact stopping
bound for α > 0.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import Tensor

import attnlab
from attnlab.generation import beam_search

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

V = 97
MARIAN_PAD, MARIAN_EOS = 96, 0


@pytest.fixture
def transformers() -> ModuleType:
    module = pytest.importorskip("transformers")
    module.logging.set_verbosity_error()
    return module


def build_hf(t: ModuleType, family: str) -> Any:
    torch.manual_seed(0)
    common: dict[str, Any] = dict(initializer_range=0.2, bos_token_id=1, eos_token_id=2)
    if family == "gpt2":
        cfg = t.GPT2Config(vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=64, **common)
        return t.GPT2LMHeadModel(cfg).eval()
    if family == "llama":
        cfg = t.LlamaConfig(
            vocab_size=V,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            pad_token_id=None,
            **common,
        )
        return t.LlamaForCausalLM(cfg).eval()
    cfg = t.MarianConfig(
        vocab_size=V,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_position_embeddings=64,
        pad_token_id=MARIAN_PAD,
        decoder_start_token_id=MARIAN_PAD,
        eos_token_id=MARIAN_EOS,
        forced_eos_token_id=None,
        scale_embedding=True,
        init_std=0.2,
    )
    return t.MarianMTModel(cfg).eval()


def load_pair(t: ModuleType, family: str, tmp_path: Path) -> tuple[Any, Any]:
    hf = build_hf(t, family)
    hf.save_pretrained(tmp_path)
    return hf, attnlab.from_pretrained(tmp_path)


def left_padded_batch() -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, V, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # prompts of 9, 5 and 7 tokens, left-padded
    mask[2, :2] = 0
    return ids.masked_fill(mask == 0, 0), mask


def padded_sources() -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(2)
    src = torch.randint(3, MARIAN_PAD, (3, 10), generator=g)
    mask = torch.ones_like(src)
    mask[1, 7:] = 0
    mask[2, 4:] = 0
    return src.masked_fill(mask == 0, MARIAN_PAD), mask


@torch.no_grad()
def hf_generate(hf: Any, ids: Tensor, mask: Tensor, n: int, eos: int | None, **kw: Any) -> Any:
    hf.generation_config.eos_token_id = eos
    out = hf.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=n,
        do_sample=False,
        pad_token_id=0 if eos is None else eos,
        **kw,
    )
    return out


def new_tokens(hf: Any, out: Tensor, prompt_len: int) -> Tensor:
    return out[:, 1:] if hf.config.is_encoder_decoder else out[:, prompt_len:]


@pytest.mark.parametrize("family", ["gpt2", "llama", "marian"])
def test_greedy_equals_transformers(transformers: ModuleType, tmp_path: Path, family: str) -> None:
    hf, model = load_pair(transformers, family, tmp_path)
    ids, mask = padded_sources() if family == "marian" else left_padded_batch()
    n = 24
    ref = new_tokens(hf, hf_generate(hf, ids, mask, n, None), ids.shape[1])
    ours = attnlab.generate(model, ids, attention_mask=mask, max_new_tokens=n, eos_id=())
    assert torch.equal(ours, ref)
    # With an EOS id that occurs mid-way: rows stop and are padded as transformers pads them.
    eos = int(ref[0, 10])
    ref_eos = new_tokens(hf, hf_generate(hf, ids, mask, n, eos), ids.shape[1])
    ours_eos = attnlab.generate(
        model, ids, attention_mask=mask, max_new_tokens=n, eos_id=eos, pad_id=eos
    )
    assert torch.equal(ours_eos, ref_eos)


@pytest.mark.parametrize("family", ["gpt2", "llama", "marian"])
@pytest.mark.parametrize(
    ("alpha", "early_stopping"), [(0.0, False), (1.0, "never")], ids=["alpha0", "power1"]
)
def test_beam_search_equals_transformers(
    transformers: ModuleType, tmp_path: Path, family: str, alpha: float, early_stopping: Any
) -> None:
    hf, model = load_pair(transformers, family, tmp_path)
    ids, mask = padded_sources() if family == "marian" else left_padded_batch()
    n = 12
    kw: dict[str, Any] = dict(length_penalty=alpha, length_norm="power", num_return_sequences=2)
    free = beam_search(model, ids, attention_mask=mask, max_new_tokens=n, eos_id=(), **kw)
    eos = int(free.sequences[0, 3])  # an EOS that the best hypothesis of prompt 0 would emit
    with torch.no_grad():
        hf.generation_config.eos_token_id = eos
        ref = hf.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=n,
            num_beams=4,
            num_return_sequences=2,
            length_penalty=alpha,
            early_stopping=early_stopping,
            do_sample=False,
            pad_token_id=eos,
            output_scores=True,
            return_dict_in_generate=True,
        )
    ours = beam_search(
        model, ids, attention_mask=mask, max_new_tokens=n, eos_id=eos, pad_id=eos, **kw
    )
    ref_seq = new_tokens(hf, ref.sequences, ids.shape[1])
    assert torch.equal(ours.sequences, ref_seq[:, : ours.sequences.shape[1]])
    assert (ref_seq[:, ours.sequences.shape[1] :] == eos).all()
    torch.testing.assert_close(ours.scores, ref.sequences_scores, atol=1e-4, rtol=0)
