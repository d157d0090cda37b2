"""Captured attention weights are the real ones; rollout and head ranking on hand-made examples."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab import BERT, GPT, EncoderDecoderTransformer, build_model
from attnlab.layers.attention_sliding import SlidingWindowAttention, sliding_window_mask
from attnlab.layers.masks import as_attention_mask
from attnlab.viz.capture import (
    attention_rollout,
    collect_attention,
    fuse_heads,
    head_scores,
    rank_heads,
    record_attention,
    stack_of,
)


@torch.no_grad()
def _bert_reference(model: BERT, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's weights by calling its attention with need_weights=True by hand."""
    x = model.embed(ids)
    out = []
    for layer in model.layers:
        h = layer.enter(x, layer.self_attn_norm)
        a, _ = layer.self_attn(h, mask=as_attention_mask(mask))  # the backend, as the model runs
        _, w = layer.self_attn(h, mask=as_attention_mask(mask), need_weights=True)  # math path
        x = layer.leave(x, a, layer.self_attn_norm)
        x = layer.leave(x, layer.ffn(layer.enter(x, layer.ffn_norm)), layer.ffn_norm)
        out.append(w)
    return out


def test_bert_weights_equal_need_weights_and_respect_padding(tiny_bert: BERT) -> None:
    ids = torch.tensor([[1, 7, 8, 9, 10, 2], [1, 11, 12, 2, 0, 0]])
    mask = ids != 0
    stacks = collect_attention(tiny_bert, ids, mask=mask)
    assert list(stacks) == ["self"]
    reference = _bert_reference(tiny_bert, ids, mask)
    assert len(stacks["self"]) == tiny_bert.config.n_layers
    for got, want in zip(stacks["self"], reference, strict=True):
        assert got.shape == (2, 4, 6, 6)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        torch.testing.assert_close(got.sum(-1), torch.ones(2, 4, 6))  # rows sum to 1
        assert torch.all(got[1, :, :, 4:] == 0)  # padded keys get exactly 0


def test_hooks_are_removed_and_mode_restored(tiny_bert: BERT) -> None:
    tiny_bert.train()
    collect_attention(tiny_bert, torch.tensor([[1, 5, 2]]))
    assert tiny_bert.training
    for m in tiny_bert.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks
    out = tiny_bert.layers[0].self_attn(torch.randn(1, 3, 32))
    assert out[1] is None  # need_weights is off again


def test_seq2seq_stacks_match_encoder_decoder(tiny_seq2seq: EncoderDecoderTransformer) -> None:
    m = tiny_seq2seq
    src, tgt = torch.tensor([[5, 6, 7, 8, 2]]), torch.tensor([[1, 9, 10]])
    stacks = collect_attention(m, src, tgt)
    assert set(stacks) == {"encoder", "decoder", "cross"}
    with torch.no_grad():
        pos_s, pos_t = torch.arange(5), torch.arange(3)
        x = m.pos_encoding.embed(m.src_embed(src), pos_s)
        enc_w = []
        for layer in m.encoder.layers:
            h = layer.enter(x, layer.self_attn_norm)
            enc_w.append(layer.self_attn(h, positions=pos_s, need_weights=True)[1])
            x = layer(x, positions=pos_s)
        memory = m.encoder.final_norm(x) if m.encoder.final_norm is not None else x
        y = m.pos_encoding.embed(m.tgt_embed(tgt), pos_t)
        dec_w = []
        for layer in m.decoder.layers:  # the sublayers by hand, keeping the weights
            h = layer.enter(y, layer.self_attn_norm)
            a, w_self = layer.self_attn(h, is_causal=True, positions=pos_t, need_weights=True)
            y1 = layer.leave(y, a, layer.self_attn_norm)
            h = layer.enter(y1, layer.cross_attn_norm)
            w_cross = layer.cross_attn(h, memory, need_weights=True)[1]
            dec_w.append((w_self, w_cross))
            y = layer(y, memory, positions=pos_t)
    for got, want in zip(stacks["encoder"], enc_w, strict=True):
        torch.testing.assert_close(got, want)
    for i, (self_w, cross_w) in enumerate(dec_w):
        torch.testing.assert_close(stacks["decoder"][i], self_w)
        torch.testing.assert_close(stacks["cross"][i], cross_w)
        assert stacks["cross"][i].shape == (1, 4, 3, 5)  # target queries x source keys
        assert torch.all(stacks["decoder"][i].triu(1) == 0)  # causal


def test_weights_come_from_the_math_path_with_the_backend_pattern() -> None:
    model = build_model("gpt-char-baby", n_layers=1, dropout=0.0, attn_backend="sliding_window")
    window, T = 4, 12
    model.layers[0].self_attn.backend = SlidingWindowAttention(window)
    w = collect_attention(model, torch.randint(0, 256, (1, T)))["self"][0]
    allowed = sliding_window_mask(T, window=window, is_causal=True)
    assert torch.all(w[..., ~allowed] == 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 4, T))


def test_errors() -> None:
    with (
        pytest.raises(ValueError, match="no MultiHeadAttention"),
        record_attention(nn.Linear(2, 2)),
    ):
        pass
    linear = build_model("gpt-char-baby", n_layers=1, dropout=0.0, attn_backend="linear")
    with pytest.raises(ValueError, match="no softmax attention weights"):
        collect_attention(linear, torch.randint(0, 256, (1, 5)))


def test_stack_names() -> None:
    assert stack_of("layers.3.self_attn") == ("self", 3)
    assert stack_of("encoder.layers.0.self_attn") == ("encoder", 0)
    assert stack_of("decoder.layers.1.self_attn") == ("decoder", 1)
    assert stack_of("decoder.layers.1.cross_attn") == ("cross", 1)
    assert stack_of("blocks.attn") == ("blocks.attn", 0)


def test_gpt_weights_causal(tiny_gpt: GPT) -> None:
    stacks = collect_attention(tiny_gpt, torch.randint(0, 256, (2, 7)))
    assert len(stacks["self"]) == 2
    for w in stacks["self"]:
        assert torch.all(w.triu(1) == 0)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 7))


def test_rollout_by_hand() -> None:
    a1 = torch.tensor([[[1.0, 0.0], [0.5, 0.5]]])  # (H=1, T, T)
    a2 = torch.tensor([[[0.5, 0.5], [0.0, 1.0]]])
    # Â1 = 0.5·I + 0.5·A1 = [[1, 0], [.25, .75]]; Â2 = [[.75, .25], [0, 1]]; R = Â2 @ Â1.
    want = torch.tensor([[0.8125, 0.1875], [0.25, 0.75]])
    torch.testing.assert_close(attention_rollout([a1, a2]), want)
    # No residual, one layer: just the head mean.
    two_heads = torch.stack([a1[0], a2[0]])  # (2, T, T)
    torch.testing.assert_close(attention_rollout([two_heads], residual=0.0), (a1[0] + a2[0]) / 2)
    # Max fusion is renormalised: max of rows [1, .5] and [.5, 1] -> [[1, .5], [.5, 1]] / 1.5.
    got = attention_rollout([two_heads], residual=0.0, head_fusion="max")
    torch.testing.assert_close(got, torch.tensor([[2 / 3, 1 / 3], [1 / 3, 2 / 3]]))
    batch = torch.softmax(torch.randn(3, 2, 4, 5, 5), -1)  # (L, B, H, T, T)
    r = attention_rollout(list(batch))
    assert r.shape == (2, 5, 5)
    torch.testing.assert_close(r.sum(-1), torch.ones(2, 5))


def test_rollout_errors() -> None:
    with pytest.raises(ValueError, match="at least one layer"):
        attention_rollout([])
    with pytest.raises(ValueError, match="square"):
        attention_rollout([torch.ones(2, 3, 4)])
    with pytest.raises(ValueError, match="residual"):
        attention_rollout([torch.ones(1, 2, 2)], residual=1.5)
    with pytest.raises(ValueError, match="valid: mean, max, min"):
        fuse_heads(torch.ones(1, 2, 2), "median")  # type: ignore[arg-type]


def test_head_scores_and_ranking() -> None:
    w0 = torch.zeros(2, 3, 4)
    w1 = torch.zeros(2, 3, 4)
    w0[0, 1, 2], w0[1, 1, 3] = 0.7, 0.4
    w1[0, 1, 2], w1[1, 1, 2], w1[1, 1, 3] = 0.1, 0.3, 0.5
    scores = head_scores([w0, w1], query=1, keys=[2])
    torch.testing.assert_close(scores, torch.tensor([[0.7, 0.0], [0.1, 0.3]]))
    assert rank_heads(scores, 2) == [(0, 0, pytest.approx(0.7)), (1, 1, pytest.approx(0.3))]
    summed = head_scores([w0, w1], query=1, keys=[2, 3])  # a word of two sub-word tokens
    torch.testing.assert_close(summed, torch.tensor([[0.7, 0.4], [0.1, 0.8]]))
    with pytest.raises(ValueError, match=r"valid 0\.\.2"):
        head_scores([w0], query=3, keys=[0])
    with pytest.raises(ValueError, match=r"within 0\.\.3"):
        head_scores([w0], query=0, keys=[4])
