"""Hooks and caches during generate/stream with the KV cache: each step's activations."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from attnlab.generation import generate, stream
from attnlab.inspect import capture, hooked, is_hooked, run_with_cache, steer

pytestmark = pytest.mark.usefixtures("one_thread")


def test_gpt_steps_with_the_kv_cache_match_a_full_forward(make: Any, example: Any) -> None:
    model = make["gpt"]()
    (prompt,) = example(model, B=1, T=5)
    names = ["layers.*.attn.weights", "layers.1.attn.k", "layers.1.resid_post", "logits"]
    with capture(model, names) as cache:
        new = generate(model, prompt, max_new_tokens=4)
    assert not is_hooked(model)
    steps = cache.steps("layers.1.attn.weights")
    assert [tuple(w.shape) for w in steps] == [
        (1, 4, 5, 5),
        (1, 4, 1, 6),
        (1, 4, 1, 7),
        (1, 4, 1, 8),
    ]
    assert [k.shape[2] for k in cache.steps("layers.1.attn.k")] == [5, 1, 1, 1]  # new tokens only
    assert [tuple(t.shape) for t in cache.steps("logits")][1:] == [(1, model.config.vocab_size)] * 3
    # the same sequence in one forward pass: each step's row of weights, residual and logits
    full = torch.cat([prompt, new[:, :-1]], dim=1)  # (1, 8)
    _, ref = run_with_cache(model, full, names=names)
    for t in range(1, 4):
        row = 4 + t  # the position of the token fed at step t
        got = cache.steps("layers.1.attn.weights")[t][:, :, 0]  # (1, H, S)
        torch.testing.assert_close(got, ref["layers.1.attn.weights"][:, :, row, : row + 1])
        resid = cache.steps("layers.1.resid_post")[t][:, 0]
        torch.testing.assert_close(resid, ref["layers.1.resid_post"][:, row], atol=1e-5, rtol=0)
        logits = cache.steps("logits")[t]
        torch.testing.assert_close(logits, ref["logits"][:, row], atol=1e-5, rtol=0)


def test_steering_during_stream(make: Any, example: Any) -> None:
    model = make["gpt"]()
    (prompt,) = example(model, B=1, T=5)
    plain = generate(model, prompt, max_new_tokens=6)
    with hooked(model, steer(model, 0, torch.zeros(32))):
        same = torch.stack([s.tokens for s in stream(model, prompt, max_new_tokens=6)], dim=1)
    assert torch.equal(same, plain)
    push = 40 * model.lm_head.weight[7] / model.lm_head.weight[7].norm()  # towards token 7
    with hooked(model, steer(model, 1, push, at="resid_post")):
        steered = generate(model, prompt, max_new_tokens=6)
    assert torch.all(steered == 7) and not torch.equal(steered, plain)
    assert not is_hooked(model)


def test_encoder_decoder_generation(make: Any, example: Any) -> None:
    model = make["transformer"]()
    src, _ = example(model, B=2, T=7)  # row 1 ends with two pad tokens
    names = ["encoder.layers.0.attn.weights", "decoder.layers.0.cross_attn.*"]
    with capture(model, names) as cache:
        generate(model, src, max_new_tokens=3, eos_id=None)
    assert len(cache.steps("encoder.layers.0.attn.weights")) == 1  # encoded once
    cross = cache.steps("decoder.layers.0.cross_attn.weights")
    assert [tuple(w.shape) for w in cross] == [(2, 4, 1, 7)] * 3  # one query per step
    assert len(cache.steps("decoder.layers.0.cross_attn.k")) == 1  # memory projected once
    assert len(cache.steps("decoder.layers.0.cross_attn.q")) == 3
    assert torch.all(cross[0][1, ..., -2:] == 0) and torch.all(cross[0][0, ..., -2:] > 0)
