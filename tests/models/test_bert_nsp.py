"""BERT's next-sentence head: shapes, its loss is the cross-entropy of its logits, the config
check, and the closed-form costs that count it."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from attnlab import BERT, BERTConfig, build_model, count_params
from attnlab.analysis.flops import forward_flops
from attnlab.analysis.measure import example_inputs, measure_activation_bytes
from attnlab.analysis.memory import activation_bytes
from attnlab.models.bert import nsp_loss

PRETRAIN = BERTConfig(vocab_size=120, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0,
                      max_seq_len=24, nsp_head=True)  # fmt: skip


def model_and_batch() -> tuple[BERT, torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = BERT(PRETRAIN).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(104, 120, (4, 10), generator=g)
    segments = torch.zeros_like(ids)
    segments[:, 5:] = 1
    targets = torch.full_like(ids, -100)
    targets[:, 2] = ids[:, 2]
    return model, ids, segments, targets


def test_heads_shapes_and_the_loss_is_the_sum_of_both_cross_entropies() -> None:
    model, ids, segments, targets = model_and_batch()
    labels = torch.tensor([0, 1, 1, 0])
    out = model(ids, token_type_ids=segments, targets=targets, nsp_labels=labels)
    assert out.logits is not None and out.logits.shape == (4, 10, 120)
    assert out.nsp_logits is not None and out.nsp_logits.shape == (4, 2)
    assert out.pooled is not None
    # the head reads the pooled [CLS]
    assert torch.allclose(out.nsp_logits, model.nsp(out.pooled))  # type: ignore[misc]
    mlm = F.cross_entropy(out.logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    nsp = F.cross_entropy(out.nsp_logits, labels)
    assert out.loss is not None and torch.allclose(out.loss, mlm + nsp)
    assert torch.allclose(nsp_loss(out.nsp_logits, labels), nsp)
    only_nsp = model(ids, token_type_ids=segments, nsp_labels=labels).loss
    assert only_nsp is not None and torch.allclose(only_nsp, nsp)
    # flipping the labels changes the loss: the labels are read
    flipped = model(ids, token_type_ids=segments, nsp_labels=1 - labels).loss
    assert flipped is not None and not torch.allclose(flipped, only_nsp)


def test_the_nsp_gradient_reaches_the_encoder() -> None:
    model, ids, segments, _ = model_and_batch()
    model.train()
    loss = model(ids, token_type_ids=segments, nsp_labels=torch.tensor([0, 1, 0, 1])).loss
    assert loss is not None
    loss.backward()
    assert model.nsp is not None and model.nsp.weight.grad is not None
    assert model.pooler is not None and float(model.pooler.weight.grad.abs().sum()) > 0
    assert float(model.layers[0].self_attn.q_proj.weight.grad.abs().sum()) > 0


@pytest.mark.parametrize(
    ("labels", "match"),
    [
        (torch.tensor([0, 1, 2, 0]), r"0 \(IsNext\) or 1 \(NotNext\), got values in \[0, 2\]"),
        (torch.tensor([0, 1]), r"nsp_labels must have shape \(4,\), got \(2,\)"),
        (torch.tensor([0.0, 1.0, 0.0, 1.0]), "must be integer class ids"),
    ],
)
def test_bad_nsp_labels(labels: torch.Tensor, match: str) -> None:
    model, ids, segments, _ = model_and_batch()
    with pytest.raises(ValueError, match=match):
        model(ids, token_type_ids=segments, nsp_labels=labels)


def test_nsp_head_needs_the_pooler() -> None:
    with pytest.raises(ValueError, match="nsp_head=True needs pooler=True"):
        dataclasses.replace(PRETRAIN, pooler=False)


def test_default_bert_has_no_nsp_head_and_old_configs_load() -> None:
    model = build_model(dataclasses.replace(PRETRAIN, nsp_head=False))
    assert model.nsp is None
    assert "nsp.weight" not in model.state_dict()
    assert BERTConfig().nsp_head is False


def test_closed_form_costs_count_the_head() -> None:
    model = build_model(PRETRAIN, device="meta")
    assert count_params(PRETRAIN) == count_params(model)
    without = dataclasses.replace(PRETRAIN, nsp_head=False)
    assert count_params(PRETRAIN) - count_params(without) == 32 * 2 + 2
    # one (B, E) x (E, 2) matmul on the pooled [CLS]: 2·B·E·2 FLOPs
    extra = (
        forward_flops(PRETRAIN, 10, batch=3).forward - forward_flops(without, 10, batch=3).forward
    )
    assert extra == 2 * 3 * 32 * 2


def test_activation_estimate_with_both_losses() -> None:
    config = dataclasses.replace(PRETRAIN, vocab_size=512, max_seq_len=16)
    model = build_model(config).train()
    args, _ = example_inputs(config, batch=4, seq_len=16)
    kwargs = {
        "targets": torch.randint(4, 512, args[0].shape),
        "nsp_labels": torch.tensor([0, 1] * 2),
    }
    measured = measure_activation_bytes(model, args, kwargs)
    assert activation_bytes(config, 16, batch=4)["total"] == pytest.approx(measured, rel=0.01)
