"""BERT <-> Hugging Face: load ``BertModel``/``BertForMaskedLM`` checkpoints, write them back."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

import attnlab
from attnlab import BERT, BERTConfig
from attnlab.interop import save_hf

V = 120


def hf_config(transformers: ModuleType, **kw: Any) -> Any:
    return transformers.BertConfig(
        vocab_size=V,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=24,
        initializer_range=0.2,  # large weights make the comparison sensitive
        **kw,
    )


def batch(tools: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = tools.ids(3, 12, V)
    segments = torch.zeros_like(ids)
    segments[:, 6:] = 1
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0  # right padding
    mask[2, 5:] = 0
    return ids, segments, mask


def test_bert_model_parity(transformers: ModuleType, tools: Any, tmp_path: Path) -> None:
    hf = transformers.BertModel(hf_config(transformers))
    model = attnlab.from_pretrained(tools.save(hf, tmp_path))
    assert isinstance(model, BERT) and model.pooler is not None and model.mlm is None
    assert not model.training
    ids, segments, mask = batch(tools)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=segments)
        out = model(ids, mask=mask, token_type_ids=segments)
    real = mask.bool()
    assert tools.max_diff(out.hidden[real], ref.last_hidden_state[real]) <= tools.ATOL
    assert out.pooled is not None
    assert tools.max_diff(out.pooled, ref.pooler_output) <= tools.ATOL


@pytest.mark.parametrize("tie", [True, False])
def test_masked_lm_parity(transformers: ModuleType, tools: Any, tmp_path: Path, tie: bool) -> None:
    hf = transformers.BertForMaskedLM(hf_config(transformers, tie_word_embeddings=tie))
    model = attnlab.BERT.from_pretrained(tools.save(hf, tmp_path))
    assert model.mlm is not None and model.pooler is None
    assert (model.mlm.decoder.weight is model.tok_embed.weight) == tie
    ids, segments, mask = batch(tools)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=segments, output_hidden_states=True)
        out = model(ids, mask=mask, token_type_ids=segments)
    real = mask.bool()
    assert out.logits is not None
    assert tools.max_diff(out.logits[real], ref.logits[real]) <= tools.ATOL
    assert tools.max_diff(out.hidden[real], ref.hidden_states[-1][real]) <= tools.ATOL


def test_pickle_checkpoint_with_tied_copies(
    transformers: ModuleType, tools: Any, tmp_path: Path
) -> None:
    """A ``pytorch_model.bin`` (read with ``weights_only=True``) that repeats the tied decoder
    weight and bias, as old checkpoints do: equal copies are accepted."""
    hf = transformers.BertForMaskedLM(hf_config(transformers)).eval()
    hf.config.save_pretrained(tmp_path)
    state = dict(hf.state_dict())
    state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
    state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"]
    torch.save(state, tmp_path / "pytorch_model.bin")
    model = attnlab.from_pretrained(tmp_path)
    ids, _, _ = batch(tools)
    with torch.no_grad():
        ours = model(ids, mask=torch.ones_like(ids)).logits
        assert tools.max_diff(ours, hf(ids).logits) <= tools.ATOL


def test_round_trip_through_transformers(
    transformers: ModuleType, tools: Any, tmp_path: Path
) -> None:
    """attnlab BERT (pooler + MLM head) -> save_hf -> transformers: the same outputs."""
    cfg = BERTConfig(vocab_size=V, d_model=64, n_heads=4, n_layers=2, d_ff=128, max_seq_len=24)
    model = BERT(cfg).eval()
    tools.randomise(model)
    save_hf(model, tmp_path)
    mlm = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    base = transformers.AutoModel.from_pretrained(tmp_path).eval()
    ids, segments, mask = batch(tools)
    real = mask.bool()
    with torch.no_grad():
        out = model(ids, mask=mask, token_type_ids=segments)
        ref = mlm(ids, attention_mask=mask, token_type_ids=segments)
        ref_base = base(ids, attention_mask=mask, token_type_ids=segments)
    assert out.logits is not None and out.pooled is not None
    assert tools.max_diff(out.logits[real], ref.logits[real]) <= tools.ATOL
    assert tools.max_diff(out.hidden[real], ref_base.last_hidden_state[real]) <= tools.ATOL
    assert tools.max_diff(out.pooled, ref_base.pooler_output) <= tools.ATOL
    # ... and back into attnlab, bitwise.
    tools.assert_same_state(model, attnlab.from_pretrained(tmp_path))


def test_unsupported_option(transformers: ModuleType, tools: Any, tmp_path: Path) -> None:
    hf = transformers.BertModel(hf_config(transformers, is_decoder=True))
    with pytest.raises(ValueError, match="is_decoder=True is not supported"):
        attnlab.from_pretrained(tools.save(hf, tmp_path))
