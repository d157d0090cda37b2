"""The recurrent encoder-decoder (models/rnn_seq2seq.py): Bahdanau's and Luong's attention in
closed form, incremental decoding == teacher forcing, padding invariance, the attention rows,
generation and beam search through the family's session, checkpoints, the closed-form parameter
count, and a tiny overfit."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.analysis import analyze
from attnlab.analysis.params import count_params, param_breakdown
from attnlab.generation.beam import beam_search
from attnlab.layers.recurrent_attention import AdditiveAttention, BilinearAttention, attend
from attnlab.models import RNNSeq2Seq, RNNSeq2SeqConfig, build_model, config_for, family_of
from attnlab.models.family import Kind

pytestmark = pytest.mark.usefixtures("one_thread")  # small ops: threads only contend

VARIANTS = [(a, c) for a in ("bahdanau", "luong", "none") for c in ("gru", "lstm")]


def tiny(attention: str = "bahdanau", cell: str = "gru", **kw: object) -> RNNSeq2Seq:
    torch.manual_seed(0)
    config = config_for("seq2seq-tiny", attention=attention, cell=cell, **kw)
    model = build_model(config).eval()
    assert isinstance(model, RNNSeq2Seq)
    return model


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two sources (the second right-padded to 7 from 4 tokens) and targets of 6 tokens."""
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, 64, (2, 7), generator=g)
    src[1, 4:] = 0  # pad_id
    return src, torch.randint(3, 64, (2, 6), generator=g)


def test_family_and_shapes() -> None:
    model = tiny(n_layers=2)
    assert family_of(model).kind is Kind.SEQ2SEQ and family_of(model).name == "rnn_seq2seq"
    src, tgt = batch()
    logits, loss = model(src, tgt, targets=tgt)
    assert logits.shape == (2, 6, 64) and loss is not None and loss.ndim == 0
    memory = model.encode(src)
    assert memory.shape == (2, 7, 64)  # 2H: both directions
    assert torch.all(memory[1, 4:] == 0)  # padded positions of the packed encoder
    assert model.decode(tgt, memory, src_mask=src != 0).shape == (2, 6, 64)


@pytest.mark.parametrize(("attention", "cell"), VARIANTS)
def test_incremental_decoding_equals_teacher_forcing(attention: str, cell: str) -> None:
    model = tiny(attention, cell, n_layers=2)
    src, tgt = batch()
    mask = model.default_src_mask(src)
    with torch.no_grad():
        full, _ = model(src, tgt)
        memory = model.encode(src, src_mask=mask)
        cache = model.new_cache(6)
        first = model.decode(tgt[:, :2], memory, src_mask=mask, cache=cache)  # two at once
        rest = [model.decode(tgt[:, t : t + 1], memory, src_mask=mask, cache=cache)
                for t in range(2, 6)]  # fmt: skip
    torch.testing.assert_close(torch.cat([first, *rest], 1), full, rtol=0, atol=1e-5)
    assert cache.seq_len == 6
    with pytest.raises(ValueError, match="holds 6 target tokens"):
        model.decode(tgt[:, :1], memory, src_mask=mask, cache=cache)


@pytest.mark.parametrize(("attention", "cell"), VARIANTS)
def test_padding_does_not_change_the_output(attention: str, cell: str) -> None:
    model = tiny(attention, cell, n_layers=2)
    src, tgt = batch()
    with torch.no_grad():
        padded, _ = model(src, tgt)
        alone, _ = model(src[1:, :4], tgt[1:])
        longer, _ = model(torch.cat([src, torch.zeros(2, 3, dtype=torch.long)], 1), tgt)
    torch.testing.assert_close(padded[1:], alone, rtol=0, atol=1e-5)
    torch.testing.assert_close(longer, padded, rtol=0, atol=1e-5)


@pytest.mark.parametrize("attention", ["bahdanau", "luong"])
def test_attention_rows_sum_to_one_over_real_tokens_and_are_zero_on_pads(attention: str) -> None:
    model = tiny(attention)
    src, tgt = batch()
    weights = model.attention_weights(src, tgt)  # (B, T, S)
    assert weights.shape == (2, 6, 7)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 6))
    assert torch.all(weights[1, :, 4:] == 0) and torch.all(weights[1, :, :4] > 0)
    _, again = model.decode(tgt, model.encode(src), src_mask=src != 0, return_attention=True)
    assert torch.equal(again, weights)


def test_without_attention_the_decoder_sees_one_vector_of_the_source() -> None:
    """attention='none': only s_0, made of the forward state at the last token and the backward
    state at the first, carries the source; every other memory vector is never read."""
    model = tiny("none")
    src, tgt = batch()
    with torch.no_grad():
        memory = model.encode(src[:1])  # (1, 7, 2H), unpadded
        changed = memory.clone()
        changed[:, 1:-1] = torch.randn_like(changed[:, 1:-1])
        a, b = model.decode(tgt[:1], memory), model.decode(tgt[:1], changed)
        changed[:, -1] += 1.0
        c = model.decode(tgt[:1], changed)
    assert torch.equal(a, b) and not torch.allclose(a, c)
    with pytest.raises(ValueError, match="no attention weights"):
        model.attention_weights(src, tgt)


def test_bahdanau_score_equals_its_closed_form() -> None:
    """e_j = v^T tanh(W_s s + W_h h_j + b) by hand for two source vectors, then softmax."""
    attn = AdditiveAttention(2, 2, 2)
    with torch.no_grad():
        attn.query_proj.weight.copy_(torch.eye(2))  # W_s = I
        attn.key_proj.weight.copy_(2 * torch.eye(2))  # W_h = 2I
        attn.key_proj.bias.copy_(torch.tensor([0.0, 0.5]))  # b
        attn.score_proj.weight.copy_(torch.tensor([[1.0, -2.0]]))  # v
    s = torch.tensor([[[0.5, -1.0]]])  # (1, 1, 2)
    h = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])  # (1, 2, 2)
    e1 = math.tanh(0.5 + 2.0) - 2 * math.tanh(-1.0 + 0.5)
    e2 = math.tanh(0.5) - 2 * math.tanh(-1.0 + 2.0 + 0.5)
    scores = attn.scores(s, attn.keys(h))
    torch.testing.assert_close(scores, torch.tensor([[[e1, e2]]]))
    context, weights = attend(scores, h, None)
    a1 = math.exp(e1) / (math.exp(e1) + math.exp(e2))
    torch.testing.assert_close(weights, torch.tensor([[[a1, 1 - a1]]]))
    torch.testing.assert_close(context, torch.tensor([[[a1, 1 - a1]]]))  # h is the identity


def test_luong_score_is_the_bilinear_form() -> None:
    torch.manual_seed(0)
    attn = BilinearAttention(3, 4)
    s, h = torch.randn(2, 5, 3), torch.randn(2, 6, 4)
    expected = torch.einsum("btq,qm,bsm->bts", s, attn.key_proj.weight, h)  # s^T W_a h
    torch.testing.assert_close(attn.scores(s, attn.keys(h)), expected)
    mask = torch.tensor([[True] * 6, [True] * 2 + [False] * 4])
    _, weights = attend(attn.scores(s, attn.keys(h)), h, mask)
    assert torch.all(weights[1, :, 2:] == 0)
    _, empty = attend(torch.randn(1, 2, 3), torch.randn(1, 3, 4), torch.zeros(1, 3, dtype=bool))
    assert torch.equal(empty, torch.zeros(1, 2, 3))  # no real token: zeros, not NaN


@pytest.mark.parametrize("attention", ["bahdanau", "luong", "none"])
def test_generate_greedy_beam_and_beam_one_is_greedy(attention: str) -> None:
    model = tiny(attention, "lstm")
    sources = [[5, 6, 7, 8], [9, 10]]
    greedy = attnlab.generate(model, sources, max_new_tokens=6, eos_id=())
    plain = attnlab.generate(model, sources, max_new_tokens=6, eos_id=(), use_cache=False)
    assert greedy.shape == (2, 6) and torch.equal(greedy, plain)
    one = beam_search(model, sources, num_beams=1, max_new_tokens=6, eos_id=(),
                      length_penalty=0.0).sequences  # fmt: skip
    assert torch.equal(one, greedy)
    beams = attnlab.generate(model, sources, max_new_tokens=6, num_beams=3, eos_id=())
    assert beams.shape == (2, 6)
    alone = attnlab.generate(model, [sources[1]], max_new_tokens=6, num_beams=3, eos_id=())
    assert torch.equal(beams[1:], alone)  # the padded row decodes as it does alone


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    model = tiny("luong", "lstm", n_layers=2, share_embeddings=False, tgt_vocab_size=50)
    model.save_pretrained(tmp_path / "m")
    again = RNNSeq2Seq.from_pretrained(tmp_path / "m").eval()
    assert again.config == model.config
    src, tgt = batch()
    tgt = tgt % 50
    with torch.no_grad():
        assert torch.equal(again(src, tgt)[0], model(src, tgt)[0])
    assert again.lm_head.weight.data_ptr() == again.tgt_embed.weight.data_ptr()  # still tied


@pytest.mark.parametrize(("attention", "cell"), VARIANTS)
@pytest.mark.parametrize(
    "overrides", [{}, {"n_layers": 2, "share_embeddings": False, "tgt_vocab_size": 40,
                       "tie_output": False, "bias": False, "d_attn": 12}]
)  # fmt: skip
def test_closed_form_parameter_count(attention: str, cell: str, overrides: dict) -> None:
    config = config_for("seq2seq-tiny", attention=attention, cell=cell, **overrides)
    model = build_model(config)
    unique = {id(p): p for p in model.parameters()}.values()
    assert count_params(config) == sum(p.numel() for p in unique) == param_breakdown(config).total
    for exclude in (False, True):
        assert count_params(config, exclude_embeddings=exclude) == count_params(
            model, exclude_embeddings=exclude
        )


def test_presets_count_and_analyze_refuses_clearly() -> None:
    assert count_params(attnlab.PRESETS["seq2seq-gru-bahdanau"]) == 8_874_752
    with pytest.raises(ValueError, match="RNNSeq2SeqConfig"):
        analyze(attnlab.PRESETS["seq2seq-tiny"])


def test_bad_inputs_are_refused_with_clear_errors() -> None:
    with pytest.raises(ValueError, match="attention='dot' is not valid"):
        RNNSeq2SeqConfig(attention="dot")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="share_embeddings needs one vocabulary"):
        RNNSeq2SeqConfig(tgt_vocab_size=10)
    model = tiny()
    src, tgt = batch()
    left = torch.ones(2, 7, dtype=torch.bool)
    left[1, :3] = False  # left padding
    with pytest.raises(ValueError, match="right padding"):
        model.encode(src, src_mask=left)
    with pytest.raises(ValueError, match="all padding"):
        model.encode(torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="memory must be"):
        model.decode(tgt, torch.zeros(2, 7, 5))


def test_a_tiny_model_overfits_a_few_pairs() -> None:
    """Four reversal pairs: the loss falls from ~ln(64) to below 0.3 within 120 Adam steps."""
    torch.manual_seed(0)
    config = dataclasses.replace(attnlab.PRESETS["seq2seq-tiny"], d_model=32, d_hidden=48)
    model = build_model(config).train()
    g = torch.Generator().manual_seed(0)
    body = torch.randint(3, 64, (4, 5), generator=g)
    src = torch.cat([body, torch.full((4, 1), 2)], 1)  # + EOS
    out = torch.cat([body.flip(1), torch.full((4, 1), 2)], 1)
    tgt_in = torch.cat([torch.full((4, 1), 1), out[:, :-1]], 1)  # BOS + target[:-1]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(120):
        _, loss = model(src, tgt_in, targets=out)
        assert loss is not None
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > 3.5 and losses[-1] < 0.3, (losses[0], losses[-1])
    model.eval()
    assert torch.equal(attnlab.generate(model, src, max_new_tokens=6), out)
