"""BERT's next-sentence head <-> Hugging Face: ``BertForPreTraining`` (MLM + NSP) and
``BertForNextSentencePrediction`` load with both heads' logits within 1e-5, and write back."""

from __future__ import annotations

import json
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
        vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=24,
        initializer_range=0.2,  # large weights make the comparison sensitive
        **kw,
    )  # fmt: skip


def pair_batch(tools: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three pairs ``[CLS] A [SEP] B [SEP]`` with segments 0/1, two of them right-padded."""
    ids = tools.ids(3, 12, V, low=4)
    ids[:, 0], ids[:, 5], ids[:, 11] = 101 % V, 102 % V, 102 % V
    segments = torch.zeros_like(ids)
    segments[:, 6:] = 1
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    mask[2, 7:] = 0
    return ids, segments, mask


def check_pretraining_parity(hf: Any, model: BERT, tools: Any) -> None:
    ids, segments, mask = pair_batch(tools)
    labels = torch.tensor([0, 1, 0])
    targets = torch.full_like(ids, -100)
    targets[:, 3] = ids[:, 3]
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=segments, labels=targets,
                 next_sentence_label=labels)  # fmt: skip
        out = model(ids, mask=mask, token_type_ids=segments, targets=targets, nsp_labels=labels)
    real = mask.bool()
    assert out.logits is not None and out.nsp_logits is not None and out.loss is not None
    assert out.nsp_logits.shape == (3, 2)
    assert tools.max_diff(out.logits[real], ref.prediction_logits[real]) <= tools.ATOL
    assert tools.max_diff(out.nsp_logits, ref.seq_relationship_logits) <= tools.ATOL
    assert abs(float(out.loss) - float(ref.loss)) <= tools.ATOL  # MLM mean + NSP mean


def test_bert_for_pretraining_parity(transformers: ModuleType, tools: Any, tmp_path: Path) -> None:
    hf = transformers.BertForPreTraining(hf_config(transformers))
    model = attnlab.from_pretrained(tools.save(hf, tmp_path))
    assert isinstance(model, BERT)
    assert model.config.nsp_head and model.config.mlm_head and model.config.pooler
    assert model.nsp is not None and model.nsp.weight.shape == (2, 64)
    check_pretraining_parity(hf, model, tools)


def test_pretraining_export_round_trip(
    transformers: ModuleType, tools: Any, tmp_path: Path
) -> None:
    """attnlab BERT with both heads -> save_hf -> ``BertForPreTraining``: the same logits of
    both heads, and back into attnlab bitwise."""
    cfg = BERTConfig(vocab_size=V, d_model=64, n_heads=4, n_layers=2, d_ff=128, max_seq_len=24,
                     nsp_head=True)  # fmt: skip
    model = BERT(cfg).eval()
    tools.randomise(model)
    save_hf(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [
        "BertForPreTraining"
    ]
    hf = transformers.AutoModelForPreTraining.from_pretrained(tmp_path).eval()
    assert type(hf).__name__ == "BertForPreTraining"
    check_pretraining_parity(hf, model, tools)
    tools.assert_same_state(model, attnlab.from_pretrained(tmp_path))


def test_next_sentence_only_round_trip(
    transformers: ModuleType, tools: Any, tmp_path: Path
) -> None:
    """``BertForNextSentencePrediction`` (pooler + NSP, no MLM head) both ways."""
    hf = transformers.BertForNextSentencePrediction(hf_config(transformers))
    model = attnlab.from_pretrained(tools.save(hf, tmp_path / "hf"))
    assert model.config.nsp_head and not model.config.mlm_head and model.mlm is None
    ids, segments, mask = pair_batch(tools)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=segments).logits
        out = model(ids, mask=mask, token_type_ids=segments)
    assert out.logits is None and out.nsp_logits is not None
    assert tools.max_diff(out.nsp_logits, ref) <= tools.ATOL
    save_hf(model, tmp_path / "ours")
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert config["architectures"] == ["BertForNextSentencePrediction"]
    back = transformers.BertForNextSentencePrediction.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        again = back(ids, attention_mask=mask, token_type_ids=segments).logits
    assert tools.max_diff(again, ref) <= tools.ATOL


@pytest.mark.parametrize("cls", ["BertModel", "BertForMaskedLM"])
def test_checkpoints_without_the_head_load_without_it(
    transformers: ModuleType, tools: Any, tmp_path: Path, cls: str
) -> None:
    """No ``cls.seq_relationship.*`` (MiniLM, ``BertModel``, ``BertForMaskedLM``): no NSP head,
    no NSP logits, and asking for an NSP loss says what is missing."""
    hf = getattr(transformers, cls)(hf_config(transformers))
    model = attnlab.from_pretrained(tools.save(hf, tmp_path))
    assert not model.config.nsp_head and model.nsp is None
    ids, segments, mask = pair_batch(tools)
    with torch.no_grad():
        assert model(ids, mask=mask, token_type_ids=segments).nsp_logits is None
    with pytest.raises(ValueError, match="nsp_labels need the NSP head"):
        model(ids, nsp_labels=torch.zeros(3, dtype=torch.long))
