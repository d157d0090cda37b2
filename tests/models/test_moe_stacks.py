"""MoE in every stack (the fields are StackConfig's): BERT, ViT and the encoder-decoder build MoE
FFNs where ``moe_every`` says (both stacks of the encoder-decoder), their closed-form parameters
and FLOPs equal the built model and FlopCounterMode, and their objectives hand the aux loss to
the trainer."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from attnlab import build_model, count_params
from attnlab.analysis.flops import forward_flops
from attnlab.analysis.measure import count_flops
from attnlab.analysis.moe import active_params, moe_layers_by_stack
from attnlab.layers.feedforward import FeedForward
from attnlab.layers.moe import MoEFeedForward
from attnlab.layers.moe_stats import collect_moe_stats
from attnlab.models.bert import BERTConfig
from attnlab.models.transformer import TransformerConfig
from attnlab.models.vit import ViTConfig
from attnlab.training.objectives import (
    ClassificationObjective,
    MaskedLMObjective,
    Seq2SeqBatch,
    Seq2SeqObjective,
)

pytestmark = pytest.mark.usefixtures("one_thread")

BERT = BERTConfig(vocab_size=50, pad_id=0, cls_id=1, sep_id=2, mask_id=3, d_model=32, n_heads=2,
                  n_layers=2, d_ff=48, max_seq_len=16, n_experts=3, top_k=2, moe_every=2,
                  attn_backend="math")  # fmt: skip
VIT = ViTConfig(image_size=8, patch_size=4, in_channels=3, n_classes=5, d_model=32, n_heads=2,
                n_layers=2, d_ff=48, n_experts=4, top_k=1, n_shared_experts=1,
                shared_expert_gate=True, attn_backend="math")  # fmt: skip
ENC_DEC = TransformerConfig(vocab_size=40, pad_id=0, bos_id=1, eos_id=2, d_model=32, n_heads=2,
                            n_layers=2, n_decoder_layers=3, d_ff=48, max_seq_len=16, n_experts=4,
                            top_k=2, moe_every=(0, 2), qkv_bias=False,
                            attn_backend="math")  # fmt: skip


def _inputs(c: Any) -> tuple[Any, ...]:
    if isinstance(c, ViTConfig):
        return (torch.randn(2, 3, 8, 8),)
    if isinstance(c, TransformerConfig):
        return torch.randint(3, 40, (2, 7)), torch.randint(3, 40, (2, 5))
    return (torch.randint(4, 50, (2, 9)),)


def _flops(c: Any) -> Any:
    if isinstance(c, ViTConfig):
        return forward_flops(c, batch=2)
    if isinstance(c, TransformerConfig):
        return forward_flops(c, 5, batch=2, src_len=7)
    return forward_flops(c, 9, batch=2)


def _ffns(model: Any, stack: str) -> list[Any]:
    layers = getattr(model, stack).layers if stack in ("encoder", "decoder") else model.layers
    return [layer.ffn for layer in layers]


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (BERT, {"layers": (1,)}),
        (VIT, {"layers": (0, 1)}),
        (ENC_DEC, {"encoder": (0,), "decoder": (0, 2)}),
    ],
    ids=["bert", "vit", "encoder-decoder"],
)
def test_closed_forms_equal_the_model_and_the_flop_counter(
    config: Any, expected: dict[str, tuple[int, ...]]
) -> None:
    torch.manual_seed(0)
    model = build_model(config)
    assert moe_layers_by_stack(config) == expected
    for stack, indices in expected.items():
        kinds = [isinstance(f, MoEFeedForward) for f in _ffns(model, stack)]
        assert kinds == [i in indices for i in range(len(kinds))], stack
        assert all(isinstance(f, MoEFeedForward | FeedForward) for f in _ffns(model, stack))
    assert count_params(config) == count_params(model)
    n_moe = sum(len(v) for v in expected.values())
    first = next(m for m in model.modules() if isinstance(m, MoEFeedForward))
    one_expert = sum(p.numel() for p in first.experts[0].parameters())
    idle = n_moe * (config.n_experts - config.top_k) * one_expert
    assert active_params(config) == count_params(model) - idle
    measured = count_flops(model, _inputs(config), backward=True)
    expected_flops = _flops(config)
    assert measured.forward == expected_flops.forward
    assert measured.backward == expected_flops.backward


def test_objectives_hand_over_the_aux_loss() -> None:
    torch.manual_seed(0)
    vit = build_model(VIT)

    class Images:
        def batch(self, split: str, n: int, g: torch.Generator) -> Any:
            return torch.randn(n, 3, 8, 8, generator=g), torch.randint(5, (n,), generator=g)

    batch = Images().batch("train", 3, torch.Generator().manual_seed(0))
    terms = ClassificationObjective(Images()).loss(vit, batch, label_smoothing=0.0)  # type: ignore[arg-type]
    assert terms.aux_loss is not None
    torch.testing.assert_close(terms.aux_loss, collect_moe_stats(vit).loss)
    enc_dec = build_model(ENC_DEC)
    src, tgt = _inputs(ENC_DEC)
    s2s = Seq2SeqBatch(src, tgt, tgt, torch.ones_like(src, dtype=torch.bool))
    terms = Seq2SeqObjective(lambda b, s: None, [], pad_id=0).loss(  # type: ignore[arg-type,return-value]
        enc_dec, s2s, label_smoothing=0.1
    )
    assert terms.aux_loss is not None and float(terms.aux_loss.detach()) > 0
    # three MoE layers over two stacks, each weighted by aux_loss_weight
    stats = collect_moe_stats(enc_dec)
    assert len(stats.tokens_per_expert) == 3
    torch.testing.assert_close(terms.aux_loss, 0.01 * stats.aux_loss)
    bert = build_model(BERT)
    mlm = MaskedLMObjective(None, 9, vocab_size=50, mask_id=3)  # type: ignore[arg-type]
    ids = torch.randint(4, 50, (2, 9))
    terms = mlm.loss(bert, (ids, ids), label_smoothing=0.0)
    assert terms.aux_loss is not None and float(terms.aux_loss.detach()) > 0
    dense = build_model(dataclasses.replace(BERT, n_experts=0))
    assert mlm.loss(dense, (ids, ids), label_smoothing=0.0).aux_loss is None
