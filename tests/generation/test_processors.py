"""Logits processors on hand-made distributions, and sampling through attnlab.generate."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import Tensor

import attnlab
from attnlab import GPT, GPTConfig
from attnlab.generation import (
    LOGITS_PROCESSORS,
    LogitsProcessorList,
    MinP,
    Temperature,
    TopK,
    TopP,
    build_processors,
    stream,
)
from attnlab.generation.processors import NonFiniteLogitsError, check_finite_logits, select_tokens

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

NINF = float("-inf")


def logits_of(*probs: list[float]) -> Tensor:
    """Rows of log-probabilities (any constant shift would do)."""
    return torch.tensor(probs).log()


def kept(logits: Tensor) -> list[list[int]]:
    return [torch.nonzero(row > NINF).flatten().tolist() for row in logits]


# Sorted by probability: token 2 (0.4), 3 (0.3), 1 (0.2), 0 (0.1); cumulative 0.4, 0.7, 0.9, 1.
DIST = [0.1, 0.2, 0.4, 0.3]


@pytest.mark.parametrize(
    ("p", "expected"),
    [(0.35, [2]), (0.5, [2, 3]), (0.75, [1, 2, 3]), (0.95, [0, 1, 2, 3]), (1.0, [0, 1, 2, 3])],
)
def test_top_p_keeps_smallest_set_reaching_p(p: float, expected: list[int]) -> None:
    out = TopP(p)(logits_of(DIST, DIST[::-1]))
    assert kept(out)[0] == expected
    assert kept(out)[1] == sorted(3 - i for i in expected)  # the mirrored row
    # Kept logits are unchanged (no renormalisation).
    assert torch.equal(out[0, expected], logits_of(DIST)[0, expected])


def test_top_p_always_keeps_the_top_token() -> None:
    assert kept(TopP(1e-6)(logits_of([0.05, 0.9, 0.05]))) == [[1]]


@pytest.mark.parametrize(
    ("p", "expected"),
    [(0.0, [0, 1, 2, 3]), (0.3, [1, 2, 3]), (0.6, [2, 3]), (0.8, [2]), (1.0, [2])],
)
def test_min_p_keeps_tokens_above_fraction_of_max(p: float, expected: list[int]) -> None:
    # Threshold p · 0.4: 0.12 keeps 0.2, 0.3, 0.4; 0.24 keeps 0.3, 0.4; 0.32 keeps 0.4 only.
    assert kept(MinP(p)(logits_of(DIST))) == [expected]


def test_top_k_keeps_k_largest_and_ties() -> None:
    x = torch.tensor([[1.0, 3.0, 2.0, 0.0], [5.0, 2.0, 2.0, 1.0]])
    assert kept(TopK(1)(x)) == [[1], [0]]
    assert kept(TopK(2)(x)) == [[1, 2], [0, 1, 2]]  # row 1: a tie with the 2nd is kept
    assert kept(TopK(10)(x)) == [[0, 1, 2, 3]] * 2  # k > V keeps everything


def test_temperature_scales_logits() -> None:
    """logits / T, shifted by the row maximum (the same softmax); a tiny T gives the one-hot
    arg-max distribution, never NaN (inf - inf)."""
    x = logits_of(DIST)
    torch.testing.assert_close(Temperature(0.5)(x), (x - x.amax(-1, keepdim=True)) * 2)
    torch.testing.assert_close(Temperature(0.5)(x).softmax(-1), (x * 2).softmax(-1))
    cold = Temperature(1e-3)(x).softmax(-1)
    assert cold[0, 2] > 0.999999  # -> one-hot on the arg-max
    frozen = Temperature(1e-45)(x * 1e3).softmax(-1)
    assert torch.isfinite(frozen).all() and frozen[0, 2] == 1.0
    draw = torch.multinomial(frozen, 1, generator=torch.Generator().manual_seed(0))
    assert int(draw) == 2


def test_chain_order_and_registry() -> None:
    x = logits_of(DIST)
    chain = build_processors(temperature=0.5, top_k=3, top_p=0.8, min_p=0.1)
    assert [type(p) for p in chain] == [Temperature, TopK, TopP, MinP]
    expected = MinP(0.1)(TopP(0.8)(TopK(3)(Temperature(0.5)(x))))
    assert torch.equal(chain(x), expected)
    # Temperature first: at T = 0.5 the distribution is 1:4:16:9, so top-p 0.8 keeps 2 tokens.
    assert kept(chain(x)) == [[2, 3]]
    assert kept(LogitsProcessorList([TopP(0.8)])(x)) == [[1, 2, 3]]
    assert build_processors() == [] and LogitsProcessorList()(x) is x
    assert LOGITS_PROCESSORS.keys() == ["min_p", "temperature", "top_k", "top_p"]
    assert isinstance(LOGITS_PROCESSORS.get("top_p")(0.5), TopP)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: TopP(0.0), r"top_p must be in \(0, 1\]"),
        (lambda: TopP(1.01), r"top_p must be in \(0, 1\]"),
        (lambda: TopK(0), "top_k must be a positive integer"),
        (lambda: TopK(2.5), "top_k must be a positive integer"),
        (lambda: MinP(1.5), r"min_p must be in \[0, 1\]"),
        (lambda: Temperature(0.0), "temperature must be a finite number > 0"),
        (lambda: build_processors(temperature=-0.1), "temperature must be >= 0"),
    ],
)
def test_bad_values(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_sampling_frequencies_follow_the_distribution() -> None:
    g = torch.Generator().manual_seed(0)
    x = logits_of(DIST).expand(20000, 4)
    counts = torch.bincount(select_tokens(x, sample=True, generator=g), minlength=4)
    freq = counts.float() / counts.sum()
    assert torch.allclose(freq, torch.tensor(DIST), atol=0.015)
    # Filtered tokens are never drawn; the rest keep their relative odds.
    counts = torch.bincount(select_tokens(TopK(2)(x), sample=True, generator=g), minlength=4)
    assert counts[0] == counts[1] == 0
    assert math.isclose(counts[2] / counts[3], 4 / 3, rel_tol=0.08)


# --- sampling through generate ---------------------------------------------------------------


def tiny_gpt(seed: int = 0) -> GPT:
    model = GPT(
        GPTConfig(
            vocab_size=53, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, eos_id=None
        )
    )
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.15
            p.copy_(1.0 + noise if "norm" in name and name.endswith("weight") else noise)
    return model.eval()


def tiny_enc_dec() -> attnlab.EncoderDecoderTransformer:
    cfg = attnlab.TransformerConfig(
        vocab_size=53, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, max_seq_len=64
    )
    torch.manual_seed(0)
    return attnlab.EncoderDecoderTransformer(cfg).eval()


PROMPTS = [[5, 9, 11], [7, 3, 12, 40, 41, 2]]


@pytest.mark.parametrize("kind", ["gpt", "enc-dec"])
def test_top_k_one_and_zero_temperature_equal_greedy(kind: str) -> None:
    model: Any = tiny_gpt() if kind == "gpt" else tiny_enc_dec()
    greedy = attnlab.generate(model, PROMPTS, max_new_tokens=24, eos_id=())
    g = torch.Generator().manual_seed(1)
    for kw in (dict(top_k=1), dict(temperature=0.0), dict(temperature=1e-4)):
        sampled = attnlab.generate(
            model, PROMPTS, max_new_tokens=24, eos_id=(), do_sample=True, generator=g, **kw
        )
        assert torch.equal(sampled, greedy), kw
    # min_p=1 and a tiny top_p keep only the arg-max as well.
    for kw in (dict(min_p=1.0), dict(top_p=1e-6)):
        sampled = attnlab.generate(
            model, PROMPTS, max_new_tokens=24, eos_id=(), do_sample=True, generator=g, **kw
        )
        assert torch.equal(sampled, greedy), kw


def test_sampling_is_reproducible_with_a_seeded_generator() -> None:
    model = tiny_gpt()

    def run(seed: int) -> Tensor:
        g = torch.Generator().manual_seed(seed)
        return attnlab.generate(
            model, PROMPTS, max_new_tokens=32, do_sample=True, temperature=1.5, generator=g
        )

    assert torch.equal(run(7), run(7))
    assert not torch.equal(run(7), run(8))
    torch.manual_seed(3)  # without a generator: the global RNG
    a = attnlab.generate(model, PROMPTS, max_new_tokens=16, do_sample=True)
    torch.manual_seed(3)
    assert torch.equal(a, attnlab.generate(model, PROMPTS, max_new_tokens=16, do_sample=True))


def test_sampled_tokens_respect_the_filters() -> None:
    model = tiny_gpt()
    g = torch.Generator().manual_seed(0)
    steps = list(
        stream(
            model,
            PROMPTS,
            max_new_tokens=40,
            do_sample=True,
            temperature=2.0,
            top_k=3,
            generator=g,
        )
    )
    for s in steps:
        top3 = s.logits.topk(3, dim=-1).indices  # (B, 3)
        assert (top3 == s.tokens[:, None]).any(dim=-1).all()
    assert len({int(t) for s in steps for t in s.tokens}) > 2  # it did not collapse to greedy


def test_num_return_sequences_samples_per_prompt() -> None:
    model = tiny_gpt()
    g = torch.Generator().manual_seed(0)
    out = attnlab.generate(
        model,
        PROMPTS,
        max_new_tokens=12,
        do_sample=True,
        temperature=2.0,
        num_return_sequences=3,
        generator=g,
    )
    assert out.shape == (6, 12)
    assert len({tuple(r) for r in out.tolist()}) > 2
    greedy = attnlab.generate(model, PROMPTS, max_new_tokens=12)
    top1 = attnlab.generate(
        model, PROMPTS, max_new_tokens=12, do_sample=True, top_k=1, num_return_sequences=3
    )
    assert torch.equal(top1, greedy.repeat_interleave(3, dim=0))


def test_the_finite_check_tells_overflow_from_non_finite_logits() -> None:
    huge = torch.full((2, 50), 3e38)  # finite, but their float32 sum overflows
    check_finite_logits(huge, 0)  # the float64 check behind the fast one: no error
    check_finite_logits(torch.randn(3, 7), 1)
    for bad, kind in (
        (float("nan"), "NaN"),
        (float("-inf"), "infinite"),
        (float("inf"), "infinite"),
    ):
        logits = torch.randn(3, 7)
        logits[1, 4] = bad
        with pytest.raises(NonFiniteLogitsError, match=f"{kind} at step 5 \\(sequence 1\\)"):
            check_finite_logits(logits, 5)
