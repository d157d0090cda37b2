"""Every preset, driven by the registry: builds on the meta device, and a shrunken copy (same
structure, tiny sizes) runs forward + backward on CPU with finite loss and gradients."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab import PRESETS, build_model
from attnlab.config import config_to_dict
from attnlab.models import (
    BERT,
    GPT,
    BERTConfig,
    CCTConfig,
    EncoderDecoderTransformer,
    GPTConfig,
    MambaConfig,
    ResNetConfig,
    RNNConfig,
    RNNSeq2SeqConfig,
    TransformerConfig,
    ViT,
    ViTConfig,
    config_from_json_dict,
    mask_tokens_for,
)


def shrink(config: Any) -> Any:
    """Tiny sizes, same structure: norms, activations, positions, GQA ratio, tying, patches."""
    names = {f.name for f in dataclasses.fields(config)}
    small: dict[str, Any] = {"d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64}
    if getattr(config, "n_kv_heads", None) is not None:
        ratio = config.n_heads // config.n_kv_heads
        small["n_kv_heads"] = max(1, 4 // ratio)
    if getattr(config, "n_decoder_layers", None) is not None:
        small["n_decoder_layers"] = 1
    if "max_seq_len" in names:
        small["max_seq_len"] = min(config.max_seq_len, 64)
    if "patch_size" in names:
        small["image_size"] = 2 * config.patch_size
    if "stage_channels" in names:  # CNNs: one narrow block per stage
        small["stage_channels"] = tuple(min(c, 8) for c in config.stage_channels)
        small["blocks_per_stage"] = (1,) * len(config.blocks_per_stage)
    return dataclasses.replace(config, **{k: v for k, v in small.items() if k in names})


def gpt_loss(model: GPT, g: torch.Generator) -> Tensor:
    ids = torch.randint(model.config.vocab_size, (2, 9), generator=g)
    _, loss = model(ids[:, :-1], targets=ids[:, 1:])
    assert loss is not None
    return loss


def bert_loss(model: BERT, g: torch.Generator) -> Tensor:
    c = model.config
    ids = torch.randint(c.vocab_size, (2, 12), generator=g)
    ids[:, 0] = c.cls_id
    inputs, targets = mask_tokens_for(c, ids, generator=g)
    targets[:, 1] = ids[:, 1]  # at least one target
    out = model(inputs, targets=targets if c.mlm_head else None)
    loss = out.hidden.pow(2).mean()
    if out.loss is not None:
        loss = loss + out.loss
    if out.pooled is not None:
        loss = loss + out.pooled.pow(2).mean()
    return loss


def vit_loss(model: ViT, g: torch.Generator) -> Tensor:
    c = model.config
    size = getattr(c, "image_size", 32)  # the CIFAR ResNets take any size; 32x32 here
    x = torch.randn(2, c.in_channels, size, size, generator=g)
    labels = torch.randint(c.n_classes, (2,), generator=g)
    return F.cross_entropy(model(x), labels)


def transformer_loss(model: EncoderDecoderTransformer, g: torch.Generator) -> Tensor:
    c = model.config
    src = torch.randint(3, c.vocab_size, (2, 7), generator=g)
    tgt = torch.randint(3, c.target_vocab_size, (2, 6), generator=g)
    _, loss = model(src, tgt[:, :-1], targets=tgt[:, 1:])
    assert loss is not None
    return loss


# A new model type must say how to make a loss for it (the KeyError below is the reminder).
LOSSES: dict[type[Any], Callable[[Any, torch.Generator], Tensor]] = {
    GPTConfig: gpt_loss,
    BERTConfig: bert_loss,
    ViTConfig: vit_loss,
    TransformerConfig: transformer_loss,
    CCTConfig: vit_loss,
    ResNetConfig: vit_loss,
    MambaConfig: gpt_loss,  # the same LM interface: forward(ids, targets=) -> (logits, loss)
    RNNConfig: gpt_loss,
    RNNSeq2SeqConfig: transformer_loss,  # the same (src, tgt, targets=) interface
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_builds_on_meta(name: str) -> None:
    model = build_model(name, device="meta")
    assert all(p.device.type == "meta" for p in model.parameters())


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_shrunken_preset_trains(name: str) -> None:
    config = shrink(PRESETS[name])
    torch.manual_seed(0)
    model = build_model(config).train()
    loss = LOSSES[type(config)](model, torch.Generator().manual_seed(0))
    assert torch.isfinite(loss), f"{name}: loss {loss}"
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, f"{name}: {pname} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{name}: non-finite gradient in {pname}"


def test_shrink_keeps_structure() -> None:
    big, small = PRESETS["llama2-7b"], shrink(PRESETS["llama2-7b"])
    for field in ("norm", "activation", "pos_encoding", "bias", "tie_output", "vocab_size"):
        assert getattr(small, field) == getattr(big, field)
    assert isinstance(build_model(small), nn.Module)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_config_round_trips_through_json(name: str) -> None:
    config = PRESETS[name]
    data = json.loads(json.dumps(config_to_dict(config)))
    assert config_from_json_dict(data) == config
