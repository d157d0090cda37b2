"""BERT: parity with Hugging Face, bidirectionality, padding invariance, MLM loss and masking."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from attnlab import BERT, BERTConfig, build_model
from attnlab.models.bert import PRESETS, mask_tokens, mask_tokens_for

TINY = BERTConfig(
    vocab_size=120,
    d_model=32,
    n_heads=4,
    n_layers=2,
    d_ff=64,
    dropout=0.0,
    max_seq_len=24,
)


def tiny(**overrides: object) -> BERT:
    torch.manual_seed(0)
    return BERT(dataclasses.replace(TINY, **overrides)).eval()


def ids_for(B: int = 2, T: int = 10, V: int = 120, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(104, V, (B, T), generator=g)  # above the special ids


# Max abs difference allowed against Hugging Face (float32, eval). Measured ~5e-6 or less with the
# large init below; the margin absorbs other CPUs' summation orders.
ATOL = 5e-5

# -- Hugging Face parity ---------------------------------------------------------------------


def copy_bert(sd: dict[str, torch.Tensor], model: BERT, prefix: str) -> None:
    """HF BertModel / BertForMaskedLM state dict -> attnlab BERT (``prefix`` "" or "bert.")."""
    p = prefix
    with torch.no_grad():
        model.tok_embed.weight.copy_(sd[p + "embeddings.word_embeddings.weight"])
        model.segment_embed.weight.copy_(sd[p + "embeddings.token_type_embeddings.weight"])
        model.pos_encoding.weight.copy_(sd[p + "embeddings.position_embeddings.weight"])
        model.embed_norm.weight.copy_(sd[p + "embeddings.LayerNorm.weight"])
        model.embed_norm.bias.copy_(sd[p + "embeddings.LayerNorm.bias"])
        for i, layer in enumerate(model.layers):
            q = f"{p}encoder.layer.{i}."
            a, f = layer.self_attn, layer.ffn
            pairs: list[tuple[nn.Module, str]] = [
                (a.q_proj, "attention.self.query"),
                (a.k_proj, "attention.self.key"),
                (a.v_proj, "attention.self.value"),
                (a.out_proj, "attention.output.dense"),
                (layer.self_attn_norm, "attention.output.LayerNorm"),
                (f.up_proj, "intermediate.dense"),
                (f.down_proj, "output.dense"),
                (layer.ffn_norm, "output.LayerNorm"),
            ]
            for mod, name in pairs:
                mod.weight.copy_(sd[q + name + ".weight"])
                mod.bias.copy_(sd[q + name + ".bias"])
        if model.pooler is not None and p + "pooler.dense.weight" in sd:
            model.pooler.weight.copy_(sd[p + "pooler.dense.weight"])
            model.pooler.bias.copy_(sd[p + "pooler.dense.bias"])
        if model.mlm is not None and "cls.predictions.bias" in sd:
            h = "cls.predictions."
            model.mlm.dense.weight.copy_(sd[h + "transform.dense.weight"])
            model.mlm.dense.bias.copy_(sd[h + "transform.dense.bias"])
            model.mlm.norm.weight.copy_(sd[h + "transform.LayerNorm.weight"])
            model.mlm.norm.bias.copy_(sd[h + "transform.LayerNorm.bias"])
            model.mlm.bias.copy_(sd[h + "bias"])


def hf_config(transformers: object, **kw: object) -> object:
    return transformers.BertConfig(
        vocab_size=120,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=24,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.2,  # large weights make the comparison sensitive
        **kw,
    )


def our_config(**kw: object) -> BERTConfig:
    return BERTConfig(
        vocab_size=120,
        d_model=64,
        n_heads=4,
        n_layers=2,
        d_ff=128,
        max_seq_len=24,
        dropout=0.0,
        **kw,
    )


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_encoder_and_pooler_parity_with_hugging_face(backend: str) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.BertModel(hf_config(transformers)).eval()
    model = BERT(our_config(mlm_head=False, attn_backend=backend)).eval()
    copy_bert(hf.state_dict(), model, "")
    ids = ids_for(2, 12)
    segments = torch.zeros_like(ids)
    segments[:, 6:] = 1
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=segments)
        out = model(ids, mask=mask, token_type_ids=segments)
    real = mask.bool()
    assert (out.hidden[real] - ref.last_hidden_state[real]).abs().max().item() < ATOL
    assert out.pooled is not None
    assert (out.pooled - ref.pooler_output).abs().max().item() < ATOL
    assert out.logits is None


def test_masked_lm_parity_with_hugging_face() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.BertForMaskedLM(hf_config(transformers)).eval()
    model = BERT(our_config(pooler=False)).eval()
    copy_bert(hf.state_dict(), model, "bert.")
    assert model.mlm is not None and model.mlm.decoder.weight is model.tok_embed.weight
    ids = ids_for(2, 12)
    inputs, targets = mask_tokens_for(model.config, ids, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf(inputs, labels=targets)
        out = model(inputs, targets=targets)
    assert out.logits is not None and out.loss is not None
    assert (out.logits - ref.logits).abs().max().item() < ATOL
    assert abs(out.loss.item() - ref.loss.item()) < ATOL


# -- invariants ------------------------------------------------------------------------------


def test_bidirectional() -> None:
    """Changing the last token changes the first token's output (no causal mask)."""
    model = tiny()
    ids = ids_for(1, 8)
    changed = ids.clone()
    changed[0, -1] = 110 if ids[0, -1] != 110 else 111
    with torch.no_grad():
        a, b = model(ids).hidden, model(changed).hidden
    assert (a[:, 0] - b[:, 0]).abs().max() > 1e-4


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_padding_invariance(backend: str) -> None:
    """Appending padding (masked out) leaves every real position's output unchanged."""
    model = tiny(attn_backend=backend)
    ids = ids_for(2, 7)
    padded = torch.cat((ids, torch.zeros(2, 5, dtype=torch.long)), dim=1)  # pad_id 0
    with torch.no_grad():
        ref = model(ids)
        explicit = model(padded, mask=padded != 0)
        default = model(padded)  # mask defaults to ids != pad_id
    for out in (explicit, default):
        torch.testing.assert_close(out.hidden[:, :7], ref.hidden, rtol=0, atol=1e-5)
        assert out.pooled is not None and ref.pooled is not None
        torch.testing.assert_close(out.pooled, ref.pooled, rtol=0, atol=1e-5)


def test_mlm_loss_only_on_masked_positions() -> None:
    model = tiny()
    ids = ids_for(4, 12)
    inputs, targets = mask_tokens_for(model.config, ids, generator=torch.Generator().manual_seed(0))
    sel = targets != model.config.ignore_index
    assert sel.any() and not sel.all()
    with torch.no_grad():
        out = model(inputs, targets=targets)
    assert out.logits is not None and out.loss is not None
    ref = nn.functional.cross_entropy(out.logits[sel], ids[sel])
    torch.testing.assert_close(out.loss, ref)
    # Targets at unselected positions do not matter: setting them changes the loss.
    with torch.no_grad():
        everywhere = model(inputs, targets=ids).loss
    assert everywhere is not None and abs(everywhere.item() - out.loss.item()) > 1e-4


def test_mask_tokens_proportions() -> None:
    """15% of non-special tokens selected; of those 80% [MASK], 10% random, 10% unchanged."""
    cfg = TINY
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(104, cfg.vocab_size, (64, 512), generator=g)
    ids[:, 0], ids[:, -1] = cfg.cls_id, cfg.sep_id
    ids[:8, -100:-1] = cfg.pad_id
    inputs, targets = mask_tokens_for(cfg, ids, generator=torch.Generator().manual_seed(1))
    special = torch.isin(ids, torch.tensor(cfg.special_ids))
    selected = targets != cfg.ignore_index
    assert not (selected & special).any()
    assert torch.equal(inputs[~selected], ids[~selected])
    assert torch.equal(targets[selected], ids[selected])
    n = int(selected.sum())
    assert abs(n / int((~special).sum()) - 0.15) < 0.005
    masked = inputs[selected] == cfg.mask_id
    unchanged = inputs[selected] == ids[selected]
    random = ~masked & ~unchanged
    assert abs(masked.float().mean().item() - 0.8) < 0.015
    # a random replacement may draw the original token (1/V of them count as unchanged)
    assert abs(unchanged.float().mean().item() - 0.1) < 0.01
    assert abs(random.float().mean().item() - 0.1) < 0.01
    # seeded: the same generator seed gives the same corruption
    again = mask_tokens_for(cfg, ids, generator=torch.Generator().manual_seed(1))
    assert torch.equal(again[0], inputs) and torch.equal(again[1], targets)


def test_mask_tokens_errors() -> None:
    with pytest.raises(ValueError, match="mask_prob must be in"):
        mask_tokens(torch.zeros(2, 2, dtype=torch.long), vocab_size=5, mask_id=4, mask_prob=1.5)
    with pytest.raises(ValueError, match="integer tensor"):
        mask_tokens(torch.zeros(2, 2), vocab_size=5, mask_id=4)


def test_pre_norm_variant_gets_a_final_norm() -> None:
    model = tiny(norm_position="pre")
    assert model.final_norm is not None
    with torch.no_grad():
        assert torch.isfinite(model(ids_for()).hidden).all()


def test_build_model_by_name() -> None:
    model = build_model("bert-tiny")
    assert isinstance(model, BERT) and model.mlm is not None
    assert isinstance(build_model("bert-base", device="meta"), BERT)
    assert PRESETS["bert-base"].mlm_head is False


# -- bad input -------------------------------------------------------------------------------


def test_bad_inputs() -> None:
    model = tiny()
    with pytest.raises(ValueError, match=r"token id 120 is outside the vocabulary \[0, 120\)"):
        model(torch.tensor([[101, 120]]))
    with pytest.raises(ValueError, match="25 tokens exceeds max_seq_len=24"):
        model(torch.full((1, 25), 105))
    ids = ids_for(1, 4)
    with pytest.raises(ValueError, match=r"token_type_ids must lie in \[0, 2\)"):
        model(ids, token_type_ids=torch.full_like(ids, 2))
    with pytest.raises(ValueError, match="token_type_ids must match ids"):
        model(ids, token_type_ids=torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="targets need the MLM head"):
        tiny(mlm_head=False)(ids, targets=ids)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n_heads": 5}, "n_heads=5 does not divide d_model=32"),
        ({"mask_id": 120}, "mask_id=120 is outside the vocabulary"),
        ({"norm_position": "sandwich"}, "norm_position='sandwich' is not valid"),
        ({"type_vocab_size": 0}, "type_vocab_size must be positive"),
    ],
)
def test_config_validation(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TINY, **overrides)
