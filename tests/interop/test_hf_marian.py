"""Marian <-> the paper's encoder-decoder: parity, greedy decoding and round trips.

Marian's sinusoids put sin/cos in the two halves of the model dimension; attnlab interleaves
them (the paper's layout), so the key map permutes the model dimension and attnlab's encoder
memory is Marian's ``[..., feature_order(E)]``. Logits are unaffected.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

import attnlab
from attnlab import EncoderDecoderTransformer, TransformerConfig
from attnlab.generation import generate
from attnlab.interop import save_hf
from attnlab.interop.hf_marian import feature_order

V, PAD, EOS = 99, 98, 0


def marian(transformers: ModuleType, **kw: Any) -> Any:
    kw = {"decoder_ffn_dim": 128, **kw}
    cfg = transformers.MarianConfig(
        vocab_size=V,
        d_model=64,
        encoder_layers=3,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        max_position_embeddings=64,
        pad_token_id=PAD,
        decoder_start_token_id=PAD,  # as real Marian models
        eos_token_id=EOS,
        forced_eos_token_id=None,
        scale_embedding=True,
        activation_function="swish",
        init_std=0.2,  # large weights make the comparison sensitive
        **kw,
    )
    hf = transformers.MarianMTModel(cfg).eval()
    with torch.no_grad():  # real checkpoints carry a non-zero logits bias
        hf.final_logits_bias.normal_(generator=torch.Generator().manual_seed(3))
    return hf


def source(tools: Any) -> tuple[torch.Tensor, torch.Tensor]:
    src = tools.ids(3, 10, PAD)  # ids in [1, 98): no pad, no eos
    mask = torch.ones_like(src)
    mask[1, 7:] = 0
    mask[2, 4:] = 0
    return src.masked_fill(mask == 0, PAD), mask


def test_parity_and_greedy(transformers: ModuleType, tools: Any, tmp_path: Path) -> None:
    hf = marian(transformers)
    model = attnlab.from_pretrained(tools.save(hf, tmp_path))
    assert isinstance(model, EncoderDecoderTransformer)
    c = model.config
    assert (c.n_layers, c.num_decoder_layers, c.bos_id, c.output_bias) == (3, 2, PAD, True)
    src, mask = source(tools)
    tgt = torch.cat([torch.full((3, 1), PAD), tools.ids(3, 6, PAD, seed=4)], dim=1)
    real = mask.bool()
    with torch.no_grad():
        ref = hf(input_ids=src, attention_mask=mask, decoder_input_ids=tgt)
        logits, _ = model(src, tgt, src_mask=real)
        memory = model.encode(src, src_mask=real)
    assert tools.max_diff(logits, ref.logits) <= tools.ATOL
    ref_memory = ref.encoder_last_hidden_state[..., feature_order(64)]
    assert tools.max_diff(memory[real], ref_memory[real]) <= tools.ATOL
    with torch.no_grad():
        ref_ids = hf.generate(
            src, attention_mask=mask, max_new_tokens=32, num_beams=1, do_sample=False
        )
    ours = generate(model, src, attention_mask=real, max_new_tokens=32)
    assert torch.equal(ours, ref_ids[:, 1:])  # transformers keeps the start token


@pytest.mark.parametrize("shared", [True, False])
def test_round_trip_through_transformers(
    transformers: ModuleType, tools: Any, tmp_path: Path, shared: bool
) -> None:
    """The paper's model (sinusoids, post-norm, scaled embeddings, ReLU) written as Marian."""
    cfg = TransformerConfig(
        vocab_size=V,
        tgt_vocab_size=None if shared else V - 9,
        d_model=64,
        n_heads=4,
        n_layers=2,
        d_ff=128,
        dropout=0.0,
        max_seq_len=64,
        share_embeddings=shared,
        output_bias=True,
        pad_id=PAD - 10,
        bos_id=1,
        eos_id=2,
    )
    model = EncoderDecoderTransformer(cfg).eval()
    tools.randomise(model)
    save_hf(model, tmp_path)
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    src, mask = source(tools)
    src = src.clamp(max=PAD - 20)
    tgt = tools.ids(3, 7, V - 20, seed=5)
    with torch.no_grad():
        ref = hf(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        logits, _ = model(src, tgt, src_mask=mask.bool())
    assert tools.max_diff(logits, ref) <= tools.ATOL
    tools.assert_same_state(model, attnlab.from_pretrained(tmp_path))


def test_unsupported_option(transformers: ModuleType, tools: Any, tmp_path: Path) -> None:
    hf = marian(transformers, decoder_ffn_dim=64)
    with pytest.raises(ValueError, match="encoder_ffn_dim=128 != decoder_ffn_dim=64"):
        attnlab.from_pretrained(tools.save(hf, tmp_path))
