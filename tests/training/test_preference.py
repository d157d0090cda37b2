"""Preference learning (attnlab.training.preference): the DPO and Bradley-Terry losses against
their closed forms, the gradient's direction at π = π_ref, the frozen reference, prompt masking,
the reward model, a tiny DPO run that moves a property's rate, and the two recipes end to end."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

import attnlab
from attnlab.tokenizers import CharTokenizer
from attnlab.training.preference import (
    PROPERTIES,
    DPOObjective,
    PreferencePairs,
    RewardModel,
    RewardObjective,
    bradley_terry_loss,
    build_pairs,
    dpo_loss,
    frozen_copy,
    property_rate,
    sample_completions,
    sampled_kl,
    sequence_logprob,
)
from testkit import run_cli, word_corpus

TINY = dict(vocab_size=8, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=16,
            dropout=0.0, eos_id=None)  # fmt: skip


def tiny_gpt(seed: int = 0, **kw: object) -> nn.Module:
    torch.manual_seed(seed)
    return attnlab.build_model("gpt-char-baby", **{**TINY, **kw})


def log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x))


def test_dpo_loss_equals_its_closed_form() -> None:
    pi_w, pi_l = torch.tensor([-3.0, -5.0]), torch.tensor([-4.0, -2.0])
    ref_w, ref_l = torch.tensor([-3.5, -4.0]), torch.tensor([-3.0, -2.5])
    beta = 0.5
    s = dpo_loss(pi_w, pi_l, ref_w, ref_l, beta=beta)
    expected = []
    for a, b, c, d in zip(
        pi_w.tolist(), pi_l.tolist(), ref_w.tolist(), ref_l.tolist(), strict=True
    ):
        expected.append(-log_sigmoid(beta * ((a - c) - (b - d))))
    torch.testing.assert_close(s.losses, torch.tensor(expected))
    torch.testing.assert_close(s.loss, torch.tensor(sum(expected) / 2))
    # implicit rewards β(log π - log π_ref): pair 0 ranks right (0.25 > -0.5), pair 1 wrong
    torch.testing.assert_close(s.chosen_reward, torch.tensor([0.25, -0.5]))
    torch.testing.assert_close(s.rejected_reward, torch.tensor([-0.5, 0.25]))
    assert s.accuracy == 0.5 and s.margin == pytest.approx(0.0)
    # β scales the argument of log σ: β = 2 on the same inputs
    s2 = dpo_loss(pi_w, pi_l, ref_w, ref_l, beta=2.0)
    assert float(s2.losses[0]) == pytest.approx(-log_sigmoid(2.0 * 1.5))


def test_dpo_loss_refuses_bad_input() -> None:
    x = torch.zeros(2)
    with pytest.raises(ValueError, match="beta must be positive"):
        dpo_loss(x, x, x, x, beta=0.0)
    with pytest.raises(ValueError, match="one shape"):
        dpo_loss(x, x, x, torch.zeros(3))


def test_bradley_terry_loss_closed_form() -> None:
    r_w, r_l = torch.tensor([2.0, 0.0, -1.0]), torch.tensor([1.0, 0.0, 1.0])
    expected = [-log_sigmoid(1.0), math.log(2.0), -log_sigmoid(-2.0)]
    torch.testing.assert_close(bradley_terry_loss(r_w, r_l), torch.tensor(expected))
    with pytest.raises(ValueError, match="one shape"):
        bradley_terry_loss(r_w, r_l[:2])


class FixedLogits(nn.Module):
    """A 'language model' returning given logits (B, T, V), whatever the ids."""

    def __init__(self, logits: Tensor) -> None:
        super().__init__()
        self.logits = logits

    def forward(self, ids: Tensor) -> tuple[Tensor, None]:
        return self.logits, None


def test_sequence_logprob_scores_only_the_completion() -> None:
    torch.manual_seed(0)
    B, P, C, V = 2, 3, 4, 5
    ids = torch.randint(0, V, (B, P + C))
    logits = torch.randn(B, P + C, V)
    mask = torch.tensor([False] * P + [True] * C)
    got = sequence_logprob(FixedLogits(logits), ids, mask)
    logp = logits.log_softmax(-1)
    by_hand = [sum(float(logp[b, t - 1, ids[b, t]]) for t in range(P, P + C)) for b in range(B)]
    torch.testing.assert_close(got, torch.tensor(by_hand))
    # the logits that predict prompt tokens (positions 0 .. P-2) do not matter ...
    changed = logits.clone()
    changed[:, : P - 1] = torch.randn(B, P - 1, V) * 10
    torch.testing.assert_close(sequence_logprob(FixedLogits(changed), ids, mask), got)
    # ... the one predicting the first completion token does
    changed[:, P - 1] += torch.randn(B, V) * 10
    assert not torch.allclose(sequence_logprob(FixedLogits(changed), ids, mask), got)
    with pytest.raises(ValueError, match="first token"):
        sequence_logprob(FixedLogits(logits), ids, torch.ones(P + C, dtype=torch.bool))
    with pytest.raises(ValueError, match="completion_mask"):
        sequence_logprob(FixedLogits(logits), ids, mask[:-1])


def test_at_the_reference_the_loss_is_log2_and_the_gradient_ranks_the_pair() -> None:
    policy = tiny_gpt()
    reference = frozen_copy(policy)
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, 8, (4, 5), generator=g)
    pairs = PreferencePairs(prompts, torch.randint(0, 8, (4, 6), generator=g),
                            torch.randint(0, 8, (4, 6), generator=g))  # fmt: skip
    chosen, rejected = pairs.sequences()
    mask = pairs.completion_mask

    def logps(model: nn.Module) -> tuple[Tensor, Tensor]:
        return sequence_logprob(model, chosen, mask), sequence_logprob(model, rejected, mask)

    pi_w, pi_l = logps(policy)
    with torch.no_grad():
        ref_w, ref_l = logps(reference)
    # the gradient with respect to the log-probabilities: -β σ(0) = -β/2 for chosen, +β/2
    leaf_w, leaf_l = pi_w.detach().requires_grad_(), pi_l.detach().requires_grad_()
    s = dpo_loss(leaf_w, leaf_l, ref_w, ref_l, beta=0.1)
    assert float(s.loss.detach()) == pytest.approx(math.log(2.0), abs=1e-6)
    s.loss.backward()
    torch.testing.assert_close(leaf_w.grad, torch.full((4,), -0.1 / 2 / 4))
    torch.testing.assert_close(leaf_l.grad, torch.full((4,), 0.1 / 2 / 4))
    # through the model: one small gradient step raises log π(chosen), lowers log π(rejected)
    dpo_loss(pi_w, pi_l, ref_w, ref_l, beta=0.1).loss.backward()
    with torch.no_grad():
        for p in policy.parameters():
            p -= 0.5 * p.grad
        new_w, new_l = logps(policy)
    assert float((new_w - pi_w.detach()).sum()) > 0 and float((new_l - pi_l.detach()).sum()) < 0


def test_the_reference_gets_no_gradient_and_does_not_move() -> None:
    policy = tiny_gpt()
    reference = frozen_copy(policy)
    assert not reference.training and all(not p.requires_grad for p in reference.parameters())
    before = {k: v.clone() for k, v in reference.state_dict().items()}
    g = torch.Generator().manual_seed(2)
    pairs = PreferencePairs(torch.randint(0, 8, (8, 4), generator=g),
                            torch.randint(0, 8, (8, 5), generator=g),
                            torch.randint(0, 8, (8, 5), generator=g))  # fmt: skip
    objective = DPOObjective(pairs, pairs, reference, beta=0.5)
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        objective.loss(policy, pairs, label_smoothing=0.0).loss_sum.backward()
        opt.step()
    assert all(p.grad is None for p in reference.parameters())
    for k, v in reference.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    assert any(not torch.equal(v, before[k]) for k, v in policy.state_dict().items())
    assert float(objective.stats(policy, pairs).margin) > 0
    with pytest.raises(ValueError, match="frozen"):
        DPOObjective(pairs, pairs, policy)


def test_reward_model_reads_the_last_token_and_learns_a_pair() -> None:
    body = tiny_gpt()
    model = RewardModel(body)
    ids = torch.randint(0, 8, (3, 7))
    assert model(ids).shape == (3,)
    torch.testing.assert_close(model(ids), torch.zeros(3))  # zero head: no preference yet
    with pytest.raises(TypeError, match="hidden_states"):
        RewardModel(nn.Linear(2, 2), d_model=2)
    g = torch.Generator().manual_seed(3)
    pairs = PreferencePairs(torch.randint(0, 8, (8, 4), generator=g),
                            torch.full((8, 3), 1), torch.full((8, 3), 2))  # fmt: skip
    objective = RewardObjective(pairs, pairs)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(20):
        opt.zero_grad()
        terms = objective.loss(model, pairs, label_smoothing=0.0)
        (terms.loss_sum / terms.count).backward()
        opt.step()
    assert objective.loss(model, pairs, label_smoothing=0.0).correct == 8


def test_a_tiny_dpo_run_raises_the_property_rate() -> None:
    tok = CharTokenizer.from_text("abcd")

    def no_a(text: str) -> bool:  # the toy task's property: no letter a (a quarter of them)
        return "a" not in text

    policy = tiny_gpt(vocab_size=tok.vocab_size)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, tok.vocab_size, (64, 3), generator=g)
    pairs, info = build_pairs(policy, prompts, tok.decode, no_a, length=4, samples_per_prompt=6,
                              generator=g)  # fmt: skip
    assert info["samples"] == 384 and 0 < info["pairs"] <= 64
    assert all(no_a(tok.decode(c.tolist())) for c in pairs.chosen)
    assert not any(no_a(tok.decode(r.tolist())) for r in pairs.rejected)

    def rate(model: nn.Module) -> float:
        gen = torch.Generator().manual_seed(7)
        samples = sample_completions(model, prompts, length=4, samples_per_prompt=4,
                                     generator=gen)  # fmt: skip
        return property_rate([tok.decode(s.tolist()) for s in samples], no_a)

    before = rate(policy)
    reference = frozen_copy(policy)
    objective = DPOObjective(pairs, pairs, reference, beta=0.5)
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
    for _ in range(30):
        opt.zero_grad()
        terms = objective.loss(policy, pairs, label_smoothing=0.0)
        (terms.loss_sum / terms.count).backward()
        opt.step()
    after = rate(policy)
    assert after > before + 0.25, (before, after)
    ids = torch.cat([prompts, sample_completions(policy, prompts, length=4, generator=g)], 1)
    mask = torch.tensor([False] * 3 + [True] * 4)
    assert sampled_kl(policy, reference, ids, mask) > 0.01
    assert sampled_kl(reference, reference, ids, mask) == 0.0


def test_properties() -> None:
    assert property_rate(["Thou art", "Here", "what"], "no-e") == pytest.approx(2 / 3)
    assert PROPERTIES.get("question")("who is there?")
    with pytest.raises(ValueError, match="no-e"):
        PROPERTIES.get("no-x")


BASE_ARGS = [
    "--d_model=16", "--n_heads=2", "--n_layers=1", "--d_ff=32", "--max_seq_len=32",
    "--batch_size=4", "--eval_batches=1", "--no-progress",
]  # fmt: skip
PAIR_ARGS = ["--prompts=48", "--val_pairs=4", "--prompt_len=8", "--completion_len=6",
             "--property=question", "--batch_size=4", "--eval_batches=1", "--eval_every=2",
             "--no-progress"]  # fmt: skip


def test_the_recipes_train_from_a_base_run(tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    text.write_text(word_corpus(120).replace("lord", "lord?"), encoding="utf-8")
    base = tmp_path / "base"
    code, _, err = run_cli(["train", "shakespeare-char", f"--data={text}", *BASE_ARGS,
                            "--steps=2", "--out", str(base)])  # fmt: skip
    assert code == 0, err
    code, out, err = run_cli(["train", "shakespeare-dpo", "--base", str(base), *PAIR_ARGS,
                              "--steps=2", "--out", str(tmp_path / "dpo")])  # fmt: skip
    assert code == 0, err
    assert "rate" in out and "kl" in out and "margin" in out
    code, out, err = run_cli(["train", "shakespeare-reward", "--base", str(base), *PAIR_ARGS,
                              "--steps=2", "--out", str(tmp_path / "reward")])  # fmt: skip
    assert code == 0, err
    from attnlab.training.recipes import load_run

    reward = load_run(tmp_path / "reward")
    assert isinstance(reward.model, RewardModel)
    policy = load_run(tmp_path / "dpo").model
    assert reward.data.info["pairs"] > 4 and policy.config.d_model == 16


def test_the_dpo_recipe_names_what_it_needs(tmp_path: Path) -> None:
    code, _, err = run_cli(["train", "shakespeare-dpo", "--out", str(tmp_path / "x"),
                            "--no-progress"])  # fmt: skip
    assert code != 0 and "--base RUN_DIR" in err
    code, _, err = run_cli(["train", "shakespeare-dpo", "--property=no-x", "--base=x"])
    assert code != 0 and "no-e" in err
    code, _, err = run_cli(["train", "shakespeare-dpo", "--d_model=64", "--base=x"])
    assert code != 0 and "d_model" in err


def test_pairs_are_deterministic_and_validation_sees_every_pair_once() -> None:
    tok = CharTokenizer.from_text("abcd")
    model = tiny_gpt(vocab_size=tok.vocab_size)
    prompts = torch.randint(0, tok.vocab_size, (16, 3), generator=torch.Generator().manual_seed(4))

    def pairs_of(seed: int) -> PreferencePairs:
        gen = torch.Generator().manual_seed(seed)
        return build_pairs(model, prompts, tok.decode, lambda t: "a" not in t, length=4,
                           generator=gen)[0]  # fmt: skip

    one, two, other = pairs_of(5), pairs_of(5), pairs_of(6)
    for a, b in zip(one.sequences(), two.sequences(), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(one.chosen, other.chosen)  # another seed, other samples
    val = one.select(slice(0, 5))
    batches = RewardObjective(one, val).val_batches(2, 1, 0)
    assert [len(b) for b in batches] == [2, 2, 1]
    assert torch.equal(torch.cat([b.prompts for b in batches]), val.prompts)
    with pytest.raises(ValueError, match="pairs need"):
        PreferencePairs(prompts, one.chosen[:2], one.rejected[:2])
    with pytest.raises(ValueError, match="no preference pair"):
        build_pairs(model, prompts, tok.decode, lambda t: True, length=4)
