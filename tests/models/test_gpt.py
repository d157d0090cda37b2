"""GPT: parity with Hugging Face GPT-2 and Llama, causality, KV-cache decoding, loss, errors."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab import GPT, GPTConfig, build_model
from attnlab.models.gpt import PRESETS

TINY = GPTConfig(
    vocab_size=97,
    d_model=32,
    n_heads=4,
    n_layers=2,
    d_ff=64,
    dropout=0.0,
    max_seq_len=32,
    eos_id=None,
)
POS_ENCODINGS = ["learned", "rope", "alibi", "sinusoidal", "none"]


def tiny(**overrides: object) -> GPT:
    torch.manual_seed(0)
    return GPT(dataclasses.replace(TINY, **overrides)).eval()


def ids_for(B: int = 2, T: int = 10, V: int = 97, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(V, (B, T), generator=g)


# Max abs difference allowed against Hugging Face (float32, eval). Measured ~5e-6 or less with the
# large init below; the margin absorbs other CPUs' summation orders.
ATOL = 5e-5

# -- Hugging Face parity ---------------------------------------------------------------------


def copy_gpt2(hf: nn.Module, model: GPT) -> None:
    """HF GPT2LMHeadModel -> attnlab GPT. GPT-2's Conv1D stores weights as (in, out)."""
    sd = hf.state_dict()
    E = model.config.d_model
    with torch.no_grad():
        model.tok_embed.weight.copy_(sd["transformer.wte.weight"])
        model.pos_encoding.weight.copy_(sd["transformer.wpe.weight"])
        for i, layer in enumerate(model.layers):
            p = f"transformer.h.{i}."
            w, b = sd[p + "attn.c_attn.weight"], sd[p + "attn.c_attn.bias"]  # (E, 3E), (3E,)
            for j, proj in enumerate(
                (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)
            ):
                proj.weight.copy_(w[:, j * E : (j + 1) * E].T)
                proj.bias.copy_(b[j * E : (j + 1) * E])
            pairs = [
                (layer.self_attn.out_proj, "attn.c_proj"),
                (layer.ffn.up_proj, "mlp.c_fc"),
                (layer.ffn.down_proj, "mlp.c_proj"),
            ]
            for lin, name in pairs:
                lin.weight.copy_(sd[p + name + ".weight"].T)
                lin.bias.copy_(sd[p + name + ".bias"])
            for norm, name in ((layer.self_attn_norm, "ln_1"), (layer.ffn_norm, "ln_2")):
                norm.weight.copy_(sd[p + name + ".weight"])
                norm.bias.copy_(sd[p + name + ".bias"])
        model.final_norm.weight.copy_(sd["transformer.ln_f.weight"])
        model.final_norm.bias.copy_(sd["transformer.ln_f.bias"])


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_gpt2_parity_with_hugging_face(backend: str) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf_cfg = transformers.GPT2Config(
        vocab_size=97,
        n_positions=32,
        n_embd=64,
        n_layer=2,
        n_head=4,
        activation_function="gelu_new",
        bos_token_id=0,
        eos_token_id=0,
        initializer_range=0.2,  # large weights make the comparison sensitive
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    hf = transformers.GPT2LMHeadModel(hf_cfg).eval()
    model = GPT(
        GPTConfig(
            vocab_size=97,
            d_model=64,
            n_heads=4,
            n_layers=2,
            d_ff=256,
            max_seq_len=32,
            dropout=0.0,
            attn_backend=backend,
            eos_id=None,
        )
    ).eval()
    copy_gpt2(hf, model)
    ids = ids_for(2, 12)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 9:] = 0  # right padding
    with torch.no_grad():
        ref = hf(ids).logits
        ours, _ = model(ids)
        assert (ours - ref).abs().max().item() < ATOL
        ref_m = hf(ids, attention_mask=mask).logits
        ours_m, _ = model(ids, mask=mask)
        real = mask.bool()
        assert (ours_m[real] - ref_m[real]).abs().max().item() < ATOL
        # HF shifts labels inside; attnlab takes already-shifted targets.
        ref_loss = hf(ids, labels=ids).loss
        targets = torch.cat((ids[:, 1:], torch.full((2, 1), -100)), dim=1)
        _, loss = model(ids, targets=targets)
        assert loss is not None and abs(loss.item() - ref_loss.item()) < ATOL


def copy_llama(hf: nn.Module, model: GPT) -> None:
    sd = hf.state_dict()
    with torch.no_grad():
        model.tok_embed.weight.copy_(sd["model.embed_tokens.weight"])
        model.lm_head.weight.copy_(sd["lm_head.weight"])
        model.final_norm.weight.copy_(sd["model.norm.weight"])
        for i, layer in enumerate(model.layers):
            p = f"model.layers.{i}."
            a, f = layer.self_attn, layer.ffn
            pairs = [
                (a.q_proj, "self_attn.q_proj"),
                (a.k_proj, "self_attn.k_proj"),
                (a.v_proj, "self_attn.v_proj"),
                (a.out_proj, "self_attn.o_proj"),
                (f.gate_proj, "mlp.gate_proj"),
                (f.up_proj, "mlp.up_proj"),
                (f.down_proj, "mlp.down_proj"),
                (layer.self_attn_norm, "input_layernorm"),
                (layer.ffn_norm, "post_attention_layernorm"),
            ]
            for mod, name in pairs:
                mod.weight.copy_(sd[p + name + ".weight"])


def test_llama_parity_with_hugging_face() -> None:
    """RoPE (half layout), RMSNorm, SwiGLU, GQA, no biases, untied head."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf_cfg = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        initializer_range=0.2,
        tie_word_embeddings=False,
    )
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    cfg = dataclasses.replace(
        PRESETS["llama2-7b"],
        vocab_size=97,
        d_model=64,
        d_ff=160,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        max_seq_len=64,
        bos_id=None,
        eos_id=None,
    )
    model = GPT(cfg).eval()
    copy_llama(hf, model)
    ids = ids_for(2, 16)
    with torch.no_grad():
        diff = (model(ids)[0] - hf(ids).logits).abs().max().item()
    assert diff < ATOL


# -- invariants ------------------------------------------------------------------------------


@pytest.mark.parametrize("pos", POS_ENCODINGS)
def test_causality(pos: str) -> None:
    """Changing token t changes no logits before t, and does change logits at t."""
    model = tiny(pos_encoding=pos)
    ids = ids_for(1, 12)
    changed = ids.clone()
    changed[0, 7] = (ids[0, 7] + 1) % 97
    with torch.no_grad():
        a, _ = model(ids)
        b, _ = model(changed)
    torch.testing.assert_close(a[:, :7], b[:, :7], rtol=0, atol=1e-6)
    assert (a[:, 7:] - b[:, 7:]).abs().max() > 1e-4


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("pos", POS_ENCODINGS)
def test_kv_cache_decoding_matches_full_forward(pos: str, backend: str) -> None:
    model = tiny(pos_encoding=pos, attn_backend=backend, n_kv_heads=2)
    ids = ids_for(2, 11)
    with torch.no_grad():
        full, _ = model(ids)
        # prompt of 4 tokens, then one token at a time
        cache = model.new_cache(16)
        steps = [model(ids[:, :4], cache=cache)[0]]
        for t in range(4, 11):
            steps.append(model(ids[:, t : t + 1], cache=cache)[0])
    assert cache.seq_len == 11
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)


def test_kv_cache_with_padding_mask() -> None:
    """A key mask over cached + new tokens gives the same logits as the full masked pass."""
    model = tiny(pos_encoding="alibi")
    ids = ids_for(2, 8)
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[1, :3] = False  # left padding in the second row
    with torch.no_grad():
        full, _ = model(ids, mask=mask)
        cache = model.new_cache()
        a, _ = model(ids[:, :5], mask=mask[:, :5], cache=cache)
        b, _ = model(ids[:, 5:], mask=mask, cache=cache)
    torch.testing.assert_close(torch.cat((a, b), dim=1)[mask], full[mask], rtol=0, atol=1e-5)


def test_shifted_positions_make_left_padding_invisible() -> None:
    """With positions counted from the first real token, a left-padded row equals the unpadded
    sequence (learned positions)."""
    model = tiny()
    ids = ids_for(1, 6)
    padded = torch.cat((torch.zeros(1, 3, dtype=torch.long), ids), dim=1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp_min(0)  # (1, 9)
    with torch.no_grad():
        ref, _ = model(ids)
        out, _ = model(padded, mask=mask, positions=positions)
    torch.testing.assert_close(out[:, 3:], ref, rtol=0, atol=1e-5)


def test_initial_loss_is_near_log_vocab() -> None:
    cfg = dataclasses.replace(PRESETS["gpt-char-baby"], dropout=0.0)
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    ids = torch.randint(cfg.vocab_size, (4, 64))
    with torch.no_grad():
        _, loss = model(ids[:, :-1], targets=ids[:, 1:])
    assert loss is not None
    assert abs(loss.item() - math.log(cfg.vocab_size)) < 0.1


def test_overfits_one_batch() -> None:
    torch.manual_seed(0)
    model = GPT(dataclasses.replace(TINY, vocab_size=32, d_model=64, d_ff=128))
    g = torch.Generator().manual_seed(0)
    data = torch.randint(32, (4, 17), generator=g)
    x, y = data[:, :-1], data[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    loss = None
    for _ in range(300):
        _, loss = model(x, targets=y)
        assert loss is not None
        if loss.item() < 0.05:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss is not None and loss.item() < 0.05


def test_ignore_index_is_skipped() -> None:
    model = tiny(ignore_index=-1)
    ids = ids_for(2, 6)
    targets = ids.clone()
    targets[:, 3:] = -1
    with torch.no_grad():
        logits, loss = model(ids, targets=targets)
        ref = nn.functional.cross_entropy(logits[:, :3].flatten(0, 1), ids[:, :3].flatten())
    assert loss is not None
    torch.testing.assert_close(loss, ref)


def test_weight_tying() -> None:
    model = tiny()
    assert model.lm_head.weight is model.tok_embed.weight
    untied = tiny(tie_output=False)
    assert untied.lm_head.weight is not untied.tok_embed.weight


def test_post_norm_variant_has_no_final_norm() -> None:
    model = tiny(norm_position="post")
    assert model.final_norm is None
    with torch.no_grad():
        logits, _ = model(ids_for())
    assert torch.isfinite(logits).all()


def test_build_model_by_name() -> None:
    model = build_model("gpt-char-baby")
    assert isinstance(model, GPT)
    assert model.config == PRESETS["gpt-char-baby"]


# -- bad input -------------------------------------------------------------------------------


def test_token_ids_outside_vocabulary() -> None:
    model = tiny()
    with pytest.raises(ValueError, match=r"token id 97 is outside the vocabulary \[0, 97\)"):
        model(torch.tensor([[1, 97]]))


@pytest.mark.parametrize("bad", [97, 500, -3])
def test_target_ids_outside_vocabulary_are_named(bad: int) -> None:
    # the loss names the bad target id; the ignored id is skipped, whatever its value
    model = tiny()
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match=rf"target id {bad} is outside the vocabulary \[0, 97\)"):
        model(ids, targets=torch.tensor([[2, bad, -100]]))
    logits, loss = model(ids, targets=torch.tensor([[2, -100, 4]]))  # the ignored id: no error
    assert loss is not None and torch.isfinite(loss)
    want = F.cross_entropy(logits[0, [0, 2]], torch.tensor([2, 4]))
    torch.testing.assert_close(loss, want)


def test_sequence_longer_than_position_table() -> None:
    model = tiny()
    with pytest.raises(ValueError, match="33 tokens exceeds max_seq_len=32"):
        model(torch.zeros(1, 33, dtype=torch.long))
    cache = model.new_cache(40)
    model(torch.zeros(1, 30, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="34 tokens exceeds max_seq_len=32"):
        model(torch.zeros(1, 4, dtype=torch.long), cache=cache)
    # RoPE has no table: longer sequences run.
    tiny(pos_encoding="rope")(torch.zeros(1, 40, dtype=torch.long))


def test_bad_mask_and_targets_shapes() -> None:
    model = tiny()
    ids = ids_for(2, 5)
    with pytest.raises(ValueError, match=r"mask must be \(B, cached \+ T\)"):
        model(ids, mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="targets must match ids"):
        model(ids, targets=ids[:, 1:])
    with pytest.raises(ValueError, match=r"ids must be \(B, T\)"):
        model(ids[0])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n_heads": 5}, "n_heads=5 does not divide d_model=32"),
        ({"n_kv_heads": 3}, "not a multiple of n_kv_heads=3"),
        ({"pos_encoding": "xpos"}, "pos_encoding='xpos' is not valid"),
        ({"activation": "tanh"}, "activation='tanh' is not valid"),
        ({"dropout": 1.0}, r"dropout must be in \[0, 1\)"),
        ({"eos_id": 97}, "eos_id=97 is outside the vocabulary"),
        ({"n_layers": 0}, "n_layers must be positive"),
    ],
)
def test_config_validation(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TINY, **overrides)
