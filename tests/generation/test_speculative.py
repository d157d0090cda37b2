"""Speculative decoding, greedy: the tokens are plain greedy decoding's, whatever the draft.

Every check compares against :func:`attnlab.generate` without a draft on the same target: random
prompts, draft lengths k = 1..8, a draft of its own (partial acceptance), the target itself as
its draft (every proposal accepted) and a draft whose arg-max is the target's arg-min (every
proposal rejected); left-padded batches, EOS, a context that slides, a draft with a shorter
context, sliding-window attention, streaming and the bad inputs. Weights are large random ones
(as in test_generate.py): peaked, tie-free next-token distributions, so float rounding between a
(k + 1)-token forward and one-token steps cannot reorder two logits.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import attnlab
from attnlab import GPT, EncoderDecoderTransformer, GPTConfig, TransformerConfig
from attnlab.generation import speculative_generate, stream

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

V = 61
N = 24


@torch.no_grad()
def randomise(model: nn.Module, std: float = 0.15, seed: int = 0) -> nn.Module:
    """Large random weights (norm weights near 1), as tests/generation/test_generate.py."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=g) * std
        p.copy_(1.0 + noise if "norm" in name and name.endswith("weight") else noise)
    return model.eval()


def gpt(seed: int = 0, **kw: Any) -> GPT:
    base: dict[str, Any] = dict(
        vocab_size=V, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=96, dropout=0.0,
        eos_id=None,
    )  # fmt: skip
    return randomise(GPT(GPTConfig(**{**base, **kw})), seed=seed)  # type: ignore[return-value]


@torch.no_grad()
def contrarian(target: GPT) -> GPT:
    """The target with its LM head negated: its arg-max is the target's arg-min, so greedy
    verification rejects every proposal."""
    draft = GPT(dataclasses.replace(target.config, tie_output=False)).eval()
    draft.load_state_dict(target.state_dict())
    draft.lm_head.weight.neg_()
    return draft


VARIANTS: dict[str, dict[str, Any]] = {
    "learned": {},
    "rope-gqa": dict(pos_encoding="rope", n_kv_heads=2),
    "alibi": dict(pos_encoding="alibi"),
    "sliding-window": dict(pos_encoding="rope", attn_backend="sliding_window", attn_window=6),
}


def random_prompts(seed: int, count: int, longest: int = 9) -> list[Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, longest + 1, (count,), generator=g)
    return [torch.randint(0, V, (int(n),), generator=g) for n in lengths]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_equals_plain_greedy_for_every_k_and_draft(variant: str) -> None:
    """Every k from 1 to 8 on the learned-position GPT; k = 1, 3, 8 on the other variants."""
    target = gpt(0, **VARIANTS[variant])
    drafts = {
        "own": gpt(1, d_model=16, n_heads=2, n_layers=1, d_ff=32, **VARIANTS[variant]),
        "itself": target,
        "contrarian": contrarian(target),
    }
    full = variant == "learned"
    for i, prompt in enumerate(random_prompts(seed=len(variant), count=4 if full else 2)):
        plain = attnlab.generate(target, [prompt], max_new_tokens=N)
        for k in range(1, 9) if full else (1, 3, 8):
            for name, draft in drafts.items():
                out = speculative_generate(target, draft, [prompt], max_new_tokens=N,
                                           num_draft_tokens=k)  # fmt: skip
                where = f"prompt {i}, k={k}, draft {name}"
                assert torch.equal(out.sequences, plain), where
                s = out.stats
                assert s.proposed > 0 and sum(s.histogram) == s.rounds, where
                if name == "itself":
                    assert s.acceptance_rate == 1.0, where
                    assert s.rounds == -(-N // (k + 1)), where  # k + 1 tokens per forward
                if name == "contrarian":
                    assert s.accepted == 0 and s.rounds == N, where


def test_acceptance_statistics_of_a_partial_draft() -> None:
    """A draft trained to nothing still agrees sometimes; the counts add up."""
    target, draft = gpt(0), gpt(0)
    with torch.no_grad():  # the same model with a little noise: most proposals are accepted
        for p in draft.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    out = speculative_generate(target, draft, [[5, 6, 7]], max_new_tokens=N, num_draft_tokens=4)
    s = out.stats
    assert torch.equal(out.sequences, attnlab.generate(target, [[5, 6, 7]], max_new_tokens=N))
    assert 0.0 < s.acceptance_rate < 1.0
    assert s.accepted == sum(n * c for n, c in enumerate(s.histogram))
    assert s.accepted + s.rounds == N  # every round yields its kept proposals + one token
    assert s.tokens_per_round == pytest.approx(N / s.rounds)
    assert s.to_dict()["acceptance_rate"] == s.acceptance_rate
    assert f"acceptance rate {s.acceptance_rate:.3f}" in s.summary()


def test_batches_of_padded_prompts_equal_plain_greedy() -> None:
    """Left-padded rows of different lengths: as plain greedy decodes the batch (each row as it
    decodes alone), while every row keeps the same number of tokens per round."""
    target = gpt(0, pos_encoding="rope")
    draft = gpt(2, d_model=16, n_heads=2, n_layers=1, d_ff=32, pos_encoding="rope")
    rows = random_prompts(seed=3, count=5)
    plain = attnlab.generate(target, rows, max_new_tokens=N)
    for k in (1, 3, 8):
        for d in (draft, target):
            out = speculative_generate(target, d, rows, max_new_tokens=N, num_draft_tokens=k)
            assert torch.equal(out.sequences, plain), (k, d is target)
    alone = attnlab.generate(target, [rows[0]], max_new_tokens=N)
    assert torch.equal(plain[0], alone[0])


def test_eos_and_padding_after_it() -> None:
    target = gpt(0)
    plain_free = attnlab.generate(target, [[3, 4]], max_new_tokens=N)
    eos = int(plain_free[0, 7])  # a token greedy decoding reaches at step 8
    plain = attnlab.generate(target, [[3, 4], [9]], max_new_tokens=N, eos_id=eos, pad_id=0)
    for k in (2, 5):
        for d in (target, contrarian(target)):
            out = speculative_generate(
                target, d, [[3, 4], [9]], max_new_tokens=N, eos_id=eos, pad_id=0,
                num_draft_tokens=k,
            )  # fmt: skip
            assert out.sequences.shape == plain.shape and torch.equal(out.sequences, plain)


def test_context_that_slides_and_a_draft_with_a_short_context() -> None:
    """Past the target's context the rest is plain sliding-window decoding (counted as plain
    steps); a draft whose context is full restarts its cache on its last tokens."""
    target = gpt(0, max_seq_len=24)
    short_draft = gpt(1, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=10)
    for prompt in ([7], list(range(3, 20)), list(range(2, 30))):  # the last one is too long
        plain = attnlab.generate(target, [prompt], max_new_tokens=N)
        for d in (short_draft, target):
            out = speculative_generate(target, d, [prompt], max_new_tokens=N, num_draft_tokens=4)
            assert torch.equal(out.sequences, plain), (len(prompt), d is target)
            assert out.stats.plain_steps == max(0, min(N, len(prompt) + N - 25))
    long_target = gpt(0)  # context 96: only the draft's context is short
    plain = attnlab.generate(long_target, [[5, 6]], max_new_tokens=N)
    out = speculative_generate(long_target, short_draft, [[5, 6]], max_new_tokens=N,
                               num_draft_tokens=8)  # fmt: skip
    assert torch.equal(out.sequences, plain) and out.stats.plain_steps == 0


def test_generate_stream_and_method_take_a_draft(caplog: pytest.LogCaptureFixture) -> None:
    target, draft = gpt(0), gpt(1, d_model=16, n_heads=2, n_layers=1, d_ff=32)
    plain = attnlab.generate(target, [[1, 2, 3]], max_new_tokens=12)
    with caplog.at_level(logging.INFO, logger="attnlab.generation.speculative"):
        out = attnlab.generate(target, [[1, 2, 3]], max_new_tokens=12, draft_model=draft)
    assert torch.equal(out, plain)
    assert "acceptance rate" in caplog.text and "k=4" in caplog.text  # the default k
    method = target.generate([[1, 2, 3]], max_new_tokens=12, draft_model=draft,
                             num_draft_tokens=2)  # type: ignore[operator]  # fmt: skip
    assert torch.equal(method, plain)
    steps = stream(target, [[1, 2, 3]], max_new_tokens=12, draft_model=draft, num_draft_tokens=3)
    tokens = [int(s.tokens[0]) for s in steps]
    assert tokens == plain[0].tolist()
    assert steps.stats.rounds > 0  # type: ignore[attr-defined]  # a SpeculativeStream
    # The step logits are the target's own, before any processor.
    first = next(iter(stream(target, [[1, 2, 3]], max_new_tokens=2, draft_model=draft)))
    reference = next(iter(stream(target, [[1, 2, 3]], max_new_tokens=2)))
    torch.testing.assert_close(first.logits, reference.logits, atol=1e-5, rtol=0)
    assert target.training is False and draft.training is False


def test_modes_are_restored() -> None:
    target, draft = gpt(0).train(), gpt(1, d_model=16, n_heads=2, n_layers=1, d_ff=32).train()
    speculative_generate(target, draft, [[1, 2]], max_new_tokens=4, num_draft_tokens=2)
    assert target.training and draft.training


def test_bad_inputs_are_refused() -> None:
    target = gpt(0)
    draft = gpt(1, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=16)
    ids = [[1, 2, 3]]
    with pytest.raises(ValueError, match=r"draft model's vocabulary \(62 tokens\) differs from "
                                         r"the target's \(61\)"):  # fmt: skip
        speculative_generate(target, gpt(1, vocab_size=62), ids)
    for k in (0, -1, 17, 2.0, True):
        with pytest.raises(ValueError, match=r"num_draft_tokens must be an integer in \[1, 16\]"):
            speculative_generate(target, draft, ids, num_draft_tokens=k)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"num_draft_tokens must be an integer in \[1, 16\]"):
        attnlab.generate(target, ids, draft_model=draft, num_draft_tokens=0)
    with pytest.raises(ValueError, match="does not combine with beam search"):
        attnlab.generate(target, ids, draft_model=draft, num_beams=2)
    with pytest.raises(ValueError, match="needs use_cache=True"):
        attnlab.generate(target, ids, draft_model=draft, use_cache=False)
    with pytest.raises(ValueError, match="num_draft_tokens=3 needs a draft_model"):
        attnlab.generate(target, ids, num_draft_tokens=3)
    with pytest.raises(ValueError, match="num_draft_tokens=3 needs a draft_model"):
        stream(target, ids, num_draft_tokens=3)
    enc_dec = EncoderDecoderTransformer(
        TransformerConfig(vocab_size=V, d_model=16, n_heads=2, n_layers=1, d_ff=32)
    )
    with pytest.raises(TypeError, match=r"needs a decoder-only .* as the target model, got Enc"):
        attnlab.generate(enc_dec, ids, draft_model=draft)
    with pytest.raises(TypeError, match="GPT as the draft model, got EncoderDecoderTransformer"):
        attnlab.generate(target, ids, draft_model=enc_dec)
    with pytest.raises(ValueError, match="unknown generation options"):
        speculative_generate(target, draft, ids, num_beam=2)
