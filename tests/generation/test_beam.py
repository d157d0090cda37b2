"""Beam search: the known best sequence of a hand-built model, exhaustive search, the length
penalty by its formula, score order, EOS handling, batching, beam 1 == greedy."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from torch import Tensor

import attnlab
from attnlab import GPT, EncoderDecoderTransformer, GPTConfig, TransformerConfig
from attnlab.generation import LENGTH_NORMS, beam_search, gnmt_length_penalty

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

EOS, S, A, B, C, D = range(6)


def bigram_table() -> Tensor:
    """P(next | previous) over 6 tokens. From S, greedy takes A (0.55) and ends A C EOS
    (0.55 · 0.36 = 0.198); the best sequence is B D EOS (0.45 · 0.9 = 0.405)."""
    P = torch.full((6, 6), 1e-6)
    P[S, A], P[S, B] = 0.55, 0.45
    P[A, C], P[A, D], P[A, EOS] = 0.36, 0.33, 0.31
    P[B, D], P[B, C], P[B, EOS] = 0.9, 0.06, 0.04
    P[C, EOS], P[D, EOS], P[EOS, EOS] = 1.0, 1.0, 1.0
    return P / P.sum(dim=1, keepdim=True)


@torch.no_grad()
def make_bigram(model: Any, table: Tensor) -> Any:
    """Zero every weight, one-hot embeddings, ``lm_head = log P``: every attention/FFN sublayer
    adds 0 to the residual stream, so the logits are ``log P(· | last token)``."""
    for p in model.parameters():
        p.zero_()
    embed = model.tok_embed if isinstance(model, GPT) else model.tgt_embed  # (shared with src)
    embed.weight.copy_(torch.eye(6))
    model.lm_head.weight.copy_(table.log().T)
    return model.eval()


def bigram_gpt() -> GPT:
    cfg = GPTConfig(
        vocab_size=6,
        d_model=6,
        n_heads=1,
        n_layers=1,
        d_ff=4,
        dropout=0.0,
        max_seq_len=32,
        pos_encoding="none",
        final_norm=False,
        tie_output=False,
        eos_id=EOS,
    )
    return make_bigram(GPT(cfg), bigram_table())  # type: ignore[no-any-return]


def bigram_enc_dec() -> EncoderDecoderTransformer:
    cfg = TransformerConfig(
        vocab_size=6,
        d_model=6,
        n_heads=1,
        n_layers=1,
        d_ff=4,
        dropout=0.0,
        max_seq_len=32,
        pos_encoding="none",
        norm_position="pre",
        final_norm=False,
        scale_embeddings=False,
        tie_output=False,
        pad_id=None,
        bos_id=S,
        eos_id=EOS,
    )
    return make_bigram(EncoderDecoderTransformer(cfg), bigram_table())  # type: ignore[no-any-return]


def bigram_model(kind: str) -> tuple[Any, list[list[int]]]:
    if kind == "gpt":
        return bigram_gpt(), [[S]]
    return bigram_enc_dec(), [[C, D, A]]  # any source: the bigram ignores it


@pytest.mark.parametrize("kind", ["gpt", "enc-dec"])
def test_beam_finds_the_best_sequence_greedy_misses(kind: str) -> None:
    model, prompt = bigram_model(kind)
    assert attnlab.generate(model, prompt, max_new_tokens=5).tolist() == [[A, C, EOS]]
    for k in (2, 4):
        out = beam_search(model, prompt, max_new_tokens=5, num_beams=k)
        assert out.sequences.tolist() == [[B, D, EOS]]
        assert out.lengths.tolist() == [3]
        torch.testing.assert_close(out.log_probs, torch.tensor([0.405]).log(), rtol=0, atol=1e-4)
    assert model.generate(prompt, max_new_tokens=5, num_beams=4).tolist() == [[B, D, EOS]]


def gnmt_score(seq: tuple[int, ...], table: Tensor, alpha: float) -> float:
    logp, prev = 0.0, S
    for tok in seq:
        logp += float(table[prev, tok].log())
        prev = tok
    return logp / ((5 + len(seq)) / 6) ** alpha


@pytest.mark.parametrize("kind", ["gpt", "enc-dec"])
def test_wide_beam_equals_exhaustive_search(kind: str) -> None:
    """With more beams than prefixes, beam search is exhaustive: its top 6 are the 6 best of
    all sequences (ending at EOS, or at max_new_tokens) by the GNMT-penalised score."""
    model, prompt = bigram_model(kind)
    table, N, alpha = bigram_table(), 3, 0.6
    candidates = []
    for L in range(1, N + 1):
        for seq in itertools.product(range(6), repeat=L):
            ends_at_eos = seq[-1] == EOS and EOS not in seq[:-1]
            if ends_at_eos or (L == N and EOS not in seq):
                candidates.append((gnmt_score(seq, table, alpha), seq))
    best = sorted(candidates, reverse=True)[:6]
    out = beam_search(
        model,
        prompt,
        max_new_tokens=N,
        num_beams=150,
        num_return_sequences=6,
        length_penalty=alpha,
    )
    got = [tuple(s[:n]) for s, n in zip(out.sequences.tolist(), out.lengths.tolist(), strict=True)]
    assert got == [seq for _, seq in best]
    torch.testing.assert_close(out.scores, torch.tensor([s for s, _ in best]), rtol=0, atol=1e-4)


def test_gnmt_length_penalty_formula() -> None:
    lengths = torch.tensor([1.0, 2.0, 7.0, 25.0])
    expected = torch.tensor([1.0, (7 / 6) ** 0.6, 2.0**0.6, 5.0**0.6])
    torch.testing.assert_close(gnmt_length_penalty(lengths, 0.6), expected)
    assert torch.equal(gnmt_length_penalty(lengths, 0.0), torch.ones(4))
    assert LENGTH_NORMS.keys() == ["gnmt", "power"]
    torch.testing.assert_close(LENGTH_NORMS.get("power")(lengths, 0.5), lengths.sqrt())


def random_gpt(eos_id: int | None = 5) -> GPT:
    cfg = GPTConfig(
        vocab_size=23,
        d_model=32,
        n_heads=4,
        n_layers=2,
        d_ff=64,
        dropout=0.0,
        max_seq_len=48,
        eos_id=eos_id,
    )
    model = GPT(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.3
            p.copy_(1.0 + noise if "norm" in name and name.endswith("weight") else noise)
    return model.eval()


@torch.no_grad()
def teacher_forced_log_prob(model: GPT, prompt: list[int], seq: list[int]) -> float:
    ids = torch.tensor([prompt + seq])
    logp = torch.log_softmax(model(ids)[0][0].float(), dim=-1)  # (T, V)
    start = len(prompt) - 1
    return float(sum(logp[start + i, tok] for i, tok in enumerate(seq)))


@pytest.mark.parametrize(("norm", "alpha"), [("gnmt", 0.6), ("gnmt", 1.0), ("power", 0.7)])
def test_scores_follow_the_length_penalty_and_are_sorted(norm: str, alpha: float) -> None:
    model = random_gpt()
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11]]
    out = beam_search(
        model,
        prompts,
        max_new_tokens=12,
        num_beams=4,
        num_return_sequences=4,
        length_penalty=alpha,
        length_norm=norm,
    )
    assert out.sequences.shape[0] == 8
    lp = LENGTH_NORMS.get(norm)(out.lengths.float(), alpha)
    torch.testing.assert_close(out.scores, out.log_probs / lp)
    for b in range(2):
        scores = out.scores[4 * b : 4 * b + 4]
        assert torch.all(scores[:-1] >= scores[1:])  # best first
        for r in range(4):
            row, n = out.sequences[4 * b + r].tolist(), int(out.lengths[4 * b + r])
            ref = teacher_forced_log_prob(model, prompts[b], row[:n])
            assert abs(ref - float(out.log_probs[4 * b + r])) < 1e-4
            assert EOS_OR_END(row[:n], n, 12)
            assert all(t == 5 for t in row[n:])  # padding (pad_id defaults to the EOS id)


def EOS_OR_END(seq: list[int], n: int, max_new: int) -> bool:  # noqa: N802
    """A hypothesis ends at its only EOS, or at max_new_tokens without one."""
    return (seq[-1] == 5 and 5 not in seq[:-1]) or (n == max_new and 5 not in seq)


def test_finished_hypotheses_are_kept_while_others_continue() -> None:
    model, prompt = bigram_model("gpt")
    out = beam_search(model, prompt, max_new_tokens=6, num_beams=4, num_return_sequences=4)
    hyps = [tuple(s[:n]) for s, n in zip(out.sequences.tolist(), out.lengths.tolist(), strict=True)]
    # A EOS (length 2) finished early and is kept next to the longer ones.
    assert hyps[0] == (B, D, EOS) and (A, EOS) in hyps and (A, C, EOS) in hyps
    assert out.lengths.tolist() != [out.lengths[0]] * 4


def test_batched_beam_search_equals_each_prompt_alone() -> None:
    model = random_gpt()
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11, 12], [4]]
    batch = beam_search(model, prompts, max_new_tokens=10, num_return_sequences=2)
    for b, p in enumerate(prompts):
        alone = beam_search(model, [p], max_new_tokens=10, num_return_sequences=2)
        n = alone.sequences.shape[1]
        assert torch.equal(batch.sequences[2 * b : 2 * b + 2, :n], alone.sequences)
        torch.testing.assert_close(batch.scores[2 * b : 2 * b + 2], alone.scores, atol=1e-5, rtol=0)
    no_cache = beam_search(
        model, prompts, max_new_tokens=10, num_return_sequences=2, use_cache=False
    )
    assert torch.equal(no_cache.sequences, batch.sequences)


def test_batched_beam_search_encoder_decoder() -> None:
    cfg = TransformerConfig(
        vocab_size=29, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, max_seq_len=32
    )
    torch.manual_seed(0)
    model = EncoderDecoderTransformer(cfg).eval()
    sources = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16]]
    batch = beam_search(model, sources, max_new_tokens=10, num_return_sequences=3)
    for b, s in enumerate(sources):
        alone = beam_search(model, [s], max_new_tokens=10, num_return_sequences=3)
        n = alone.sequences.shape[1]
        assert torch.equal(batch.sequences[3 * b : 3 * b + 3, :n], alone.sequences)
    no_cache = beam_search(
        model, sources, max_new_tokens=10, num_return_sequences=3, use_cache=False
    )
    assert torch.equal(no_cache.sequences, batch.sequences)


def test_beam_one_equals_greedy() -> None:
    model = random_gpt(eos_id=None)
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11]]
    greedy = attnlab.generate(model, prompts, max_new_tokens=20)
    # No EOS: the length penalty cannot matter, beam 1 is greedy for any α.
    assert torch.equal(
        beam_search(model, prompts, max_new_tokens=20, num_beams=1).sequences, greedy
    )
    # With an EOS that greedy produces, beam 1 with α = 0 stops where greedy does.
    eos = int(greedy[0, 6])
    g_eos = attnlab.generate(model, prompts, max_new_tokens=20, eos_id=eos)
    b_eos = beam_search(
        model, prompts, max_new_tokens=20, num_beams=1, eos_id=eos, length_penalty=0
    )
    assert torch.equal(b_eos.sequences, g_eos[:, : b_eos.sequences.shape[1]])
    assert (g_eos[:, b_eos.sequences.shape[1] :] == eos).all()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(num_beams=0), ValueError, "num_beams must be positive, got 0"),
        (dict(num_beams=2, num_return_sequences=3), ValueError, "num_return_sequences"),
        (dict(length_norm="log"), ValueError, "length_norm='log' is not valid"),
        (dict(max_new_tokens=0), ValueError, "max_new_tokens must be positive, got 0"),
        (dict(input_ids=[[]]), ValueError, "prompt 0 is empty"),
    ],
)
def test_bad_input(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    args: dict[str, Any] = {"input_ids": [[1, 2]], "max_new_tokens": 4, **kwargs}
    with pytest.raises(error, match=message):
        beam_search(random_gpt(), **args)
