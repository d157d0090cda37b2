"""Speculative sampling keeps the target's distribution: statistical tests with fixed seeds.

The verification rule alone (:func:`rejection_acceptance`, on explicit probability tables with
200,000 independent rows) and whole speculative decoding calls (a 5-token vocabulary, temperature
1.3 and top-k 4 applied to both models, 9,600 and 20,000 draws): the joint distribution of the
first two tokens must match the target's exact one, computed from its forward passes. Tolerance,
stated: a chi-square goodness-of-fit p-value above 1e-3 (cells the target gives probability 0
must stay empty) and a total-variation distance under a bound about three times the expected
sampling noise. The same counts tested against the *draft's* distribution (the tables' and the
unrelated draft's) must fail (p < 1e-6): the test can tell the difference it is there to catch.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

import attnlab
from attnlab import GPT, GPTConfig
from attnlab.generation import build_processors, speculative_generate
from attnlab.generation.acceptance import (
    accepted_count,
    greedy_acceptance,
    rejection_acceptance,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

V = 5
PROMPT = [1, 2, 3]
FILTERS: dict[str, Any] = dict(do_sample=True, temperature=1.3, top_k=4)


def chi_square_p(counts: Tensor, probs: Tensor) -> float:
    """Goodness-of-fit p-value of ``counts`` under ``probs`` (cells of probability 0 must be
    empty; they are left out of the degrees of freedom)."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    if counts[probs == 0].sum() > 0:
        return 0.0
    keep = probs > 0
    expected = probs[keep] * counts.sum()
    stat = ((counts[keep] - expected) ** 2 / expected).sum()
    df = torch.tensor((int(keep.sum()) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, stat / 2))


def total_variation(counts: Tensor, probs: Tensor) -> float:
    freq = counts.double().flatten() / counts.sum()
    return 0.5 * float((freq - probs.double().flatten()).abs().sum())


def noise_bound(probs: Tensor, n: int) -> float:
    """Three times the expected total-variation distance of ``n`` draws from ``probs``
    (``E|f - p| ≈ sqrt(2 p (1 - p) / (π n))`` per cell)."""
    p = probs.double().flatten()
    return 3 * 0.5 * float(torch.sqrt(2 * p * (1 - p) / (torch.pi * n)).sum())


# --- the rule alone, on explicit tables -------------------------------------------------------


def table(g: torch.Generator, *shape: int, zeros: int = 0) -> Tensor:
    """Random distributions over the last dim, with ``zeros`` tokens of probability 0 per row."""
    w = torch.rand(*shape, V, generator=g, dtype=torch.float64) + 0.05
    if zeros:
        drop = torch.rand(*shape, V, generator=g).argsort(dim=-1)[..., :zeros]
        w = w.scatter(-1, drop, 0.0)
    return (w / w.sum(dim=-1, keepdim=True)).float()


def test_rejection_rule_keeps_the_target_distribution() -> None:
    """A two-token "language model" as tables: the draft proposes x1 ~ q1, x2 ~ q2(x1); the rule
    keeps n of them; the first two emitted tokens are (x1, x2), (x1, y) or (y, z ~ p2(y)) and
    must be distributed as p1(a)·p2(b | a). Both sides have tokens of probability 0, in different
    places (as top-k filters leave them)."""
    g = torch.Generator().manual_seed(0)
    p1, p2, p3 = table(g, zeros=1), table(g, V, zeros=1), table(g, V, V)
    q1, q2 = table(g, zeros=2), table(g, V, zeros=1)
    rows = 200_000
    x1 = torch.multinomial(q1.expand(rows, V), 1, generator=g).squeeze(1)
    x2 = torch.multinomial(q2[x1], 1, generator=g).squeeze(1)
    proposals = torch.stack((x1, x2), dim=1)  # (rows, 2)
    n, y = rejection_acceptance(
        proposals,
        torch.stack((q1.expand(rows, V), q2[x1]), dim=1),  # (rows, 2, V)
        torch.stack((p1.expand(rows, V), p2[x1], p3[x1, x2]), dim=1),  # (rows, 3, V)
        generator=g,
    )
    z = torch.multinomial(p2[y], 1, generator=g).squeeze(1)  # the next round, after a rejection
    first = torch.where(n == 0, y, x1)
    second = torch.where(n == 0, z, torch.where(n == 1, y, x2))
    counts = torch.bincount(first * V + second, minlength=V * V)
    target = p1[:, None] * p2  # (V, V)
    assert set(n.unique().tolist()) == {0, 1, 2}  # every path is taken
    assert chi_square_p(counts, target) > 1e-3
    assert total_variation(counts, target) < noise_bound(target, rows)
    draft = q1[:, None] * q2
    assert chi_square_p(counts, draft) < 1e-6  # the draft's own distribution is told apart


def test_rejection_rule_edge_cases() -> None:
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[[0.0, 1.0, 0.0], [0.5, 0.5, 0.0]]])  # (1, 2, 3)
    # p = q: always accepted, then the bonus token from p_{k+1}.
    n, y = rejection_acceptance(torch.tensor([[1]]), p[:, :1], p, generator=g)
    assert n.tolist() == [1] and y.item() in (0, 1)
    # A proposal the target gives probability 0: always rejected; the residual is p's support.
    q = torch.tensor([[[0.0, 0.0, 1.0]]])
    for _ in range(20):
        n, y = rejection_acceptance(torch.tensor([[2]]), q, p, generator=g)
        assert n.tolist() == [0] and y.tolist() == [1]
    # No proposals at all (k = 0): a plain draw from p_1.
    n, y = rejection_acceptance(torch.empty(1, 0, dtype=torch.long), q[:, :0], p[:, :1])
    assert n.tolist() == [0] and y.tolist() == [1]
    with pytest.raises(ValueError, match=r"must be \(B, k \+ 1, V\) = \(1, 3, V\)"):
        rejection_acceptance(torch.tensor([[1, 2]]), q, p)
    with pytest.raises(ValueError, match=r"draft_probs must be \(B, k, V\) = \(1, 1, 3\)"):
        rejection_acceptance(torch.tensor([[1]]), q[..., :2], p)


def test_greedy_rule() -> None:
    logits = torch.tensor([[[0.0, 5.0], [5.0, 0.0], [0.0, 5.0]]] * 3)  # arg-max 1, 0, 1
    n, y = greedy_acceptance(torch.tensor([[1, 0], [1, 1], [0, 0]]), logits)
    assert n.tolist() == [2, 1, 0] and y.tolist() == [1, 0, 1]
    assert accepted_count(torch.tensor([[True, False, True]])).tolist() == [1]
    with pytest.raises(ValueError, match=r"draft_tokens must be \(B, k\)"):
        greedy_acceptance(torch.tensor([1, 0]), logits)


# --- whole calls ------------------------------------------------------------------------------


@torch.no_grad()
def randomise(model: nn.Module, std: float, seed: int) -> GPT:
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=g) * std
        p.copy_(1.0 + noise if "norm" in name and name.endswith("weight") else noise)
    assert isinstance(model, GPT)
    return model.eval()


def tiny(seed: int) -> GPT:
    cfg = GPTConfig(vocab_size=V, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=16,
                    dropout=0.0, eos_id=None)  # fmt: skip
    return randomise(GPT(cfg), std=0.3, seed=seed)


@torch.no_grad()
def exact_first_two(model: GPT) -> Tensor:
    """``P(t1 = a, t2 = b)`` under ``model`` with the test's filters. ``(V, V)``."""
    chain = build_processors(temperature=FILTERS["temperature"], top_k=FILTERS["top_k"])
    ids = torch.tensor([[*PROMPT, a] for a in range(V)])  # (V, P + 1)
    logits, _ = model(ids)
    p1 = chain(logits[:1, -2]).softmax(dim=-1)[0]  # (V,)
    p2 = chain(logits[:, -1]).softmax(dim=-1)  # (V, V)
    return p1[:, None] * p2


def first_two_counts(target: GPT, draft: GPT, calls: int, rows: int, seed: int) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V * V, dtype=torch.long)
    for _ in range(calls):
        out = speculative_generate(
            target, draft, [PROMPT], max_new_tokens=4, num_draft_tokens=3,
            num_return_sequences=rows, generator=g, **FILTERS,
        )  # fmt: skip
        seq = out.sequences
        counts += torch.bincount(seq[:, 0] * V + seq[:, 1], minlength=V * V)
    return counts


def close_to(model: GPT, noise: float) -> GPT:
    """``model`` with a little noise on every weight: a draft whose proposals are mostly kept."""
    draft = tiny(0)
    draft.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise)
    return draft


def test_sampling_keeps_the_target_distribution_of_the_first_two_tokens() -> None:
    """An unrelated draft (another top-k support; most proposals rejected) in batches of 5,000
    rows, and a close draft in batches of 16, where about half the rounds keep 1-3 proposals for
    every row (a batch keeps the fewest any row accepted: that path is exercised too)."""
    target = tiny(0)
    exact = exact_first_two(target)
    assert int((exact == 0).sum()) >= V  # top-k removed tokens: cells that must stay empty
    close = close_to(target, 0.01)
    for name, draft, calls, rows in (("unrelated", tiny(1), 4, 5000), ("close", close, 600, 16)):
        counts = first_two_counts(target, draft, calls, rows, seed=2)
        n = int(counts.sum())
        assert chi_square_p(counts, exact) > 1e-3, name
        assert total_variation(counts, exact) < noise_bound(exact, n), name
        if name == "unrelated":  # the test tells a draft's distribution from the target's
            assert chi_square_p(counts, exact_first_two(draft)) < 1e-6


def test_a_close_draft_keeps_several_tokens_per_round() -> None:
    target = tiny(0)
    g = torch.Generator().manual_seed(2)
    draft = close_to(target, 0.01)
    stats = [
        speculative_generate(target, draft, [PROMPT], max_new_tokens=4,
                             num_draft_tokens=3, num_return_sequences=16, generator=g,
                             **FILTERS).stats
        for _ in range(60)
    ]  # fmt: skip
    histogram = [sum(s.histogram[n] for s in stats) for n in range(4)]
    assert all(histogram[1:]), histogram  # rounds that kept 1, 2 and 3 proposals per row
    assert 0.1 < sum(s.accepted for s in stats) / sum(s.proposed for s in stats) < 0.9


def test_seeded_sampling_is_reproducible() -> None:
    target, draft = tiny(0), tiny(1)

    def draw(seed: int) -> Tensor:
        g = torch.Generator().manual_seed(seed)
        return speculative_generate(target, draft, [PROMPT, [4]], max_new_tokens=10,
                                    generator=g, **FILTERS).sequences  # fmt: skip

    assert torch.equal(draw(3), draw(3)) and not torch.equal(draw(3), draw(4))
    # Temperature 0 is greedy even with do_sample: the target's greedy tokens.
    greedy = attnlab.generate(target, [PROMPT], max_new_tokens=10)
    out = speculative_generate(target, draft, [PROMPT], max_new_tokens=10, do_sample=True,
                               temperature=0.0)  # fmt: skip
    assert torch.equal(out.sequences, greedy)
