"""The fused decoder-layer step (attnlab.transforms.decode_layer): one call per layer and token
inside decode_layout, bit for bit what the modules compute (to 1e-5 with the exact GELU), and the
modules wherever it does not apply."""

from __future__ import annotations

import importlib
from contextlib import nullcontext
from typing import Any

import pytest
import torch

import attnlab
from attnlab import GPT
from attnlab.inspect import hooked
from attnlab.transforms import quantize
from attnlab.transforms import woq_kernels as wk
from attnlab.transforms.decode_layer import active_plan
from attnlab.transforms.decode_weights import decode_layout

from .test_decode_layout import _gpt as _peaked_gpt

pytestmark = [
    pytest.mark.usefixtures("one_thread"),  # tests/conftest.py
    pytest.mark.skipif(not wk.available(), reason=f"kernels: {wk.unavailable_reason()}"),
]


def _gpt(**overrides: Any) -> GPT:
    """test_decode_layout's peaked-weight GPT at d_model 64 (``rope_layout``: set the RoPE
    module's pair layout, which no config field names)."""
    layout = overrides.pop("rope_layout", None)
    model = _peaked_gpt(**{"d_model": 64, "d_ff": 128, **overrides})
    if layout is not None:
        model.pos_encoding.layout = layout
    return model


def _step_logits(model: GPT, ids: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy decoding with a cache: the prompt, then ``steps`` one-token steps; returns the
    logits of every step ``(steps + 1, B, V)`` and the tokens ``(B, steps)``."""
    cache = model.new_cache(ids.shape[1] + steps + 1)
    logits, _ = model(ids, cache=cache)
    out, tokens = [logits[:, -1]], []
    for _ in range(steps):
        token = out[-1].argmax(-1, keepdim=True)  # (B, 1)
        tokens.append(token)
        logits, _ = model(token, cache=cache)
        out.append(logits[:, -1])
    return torch.stack(out), torch.cat(tokens, dim=1)


def _plain_generate(model: GPT, ids: torch.Tensor, n: int, **options: Any) -> torch.Tensor:
    """attnlab.generate without decode_layout (the modules, the sdpa backend)."""
    generate_module = importlib.import_module("attnlab.generation.generate")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(generate_module, "decode_layout", lambda m, rows: nullcontext())
        return attnlab.generate(model, ids, max_new_tokens=n, eos_id=(), **options)


CONFIGS = [
    pytest.param("int8", {}, id="int8-gpt2"),
    pytest.param("int4", {}, id="int4-gpt2"),
    pytest.param(
        "int4", {"bias": False, "norm": "rmsnorm", "activation": "swiglu"}, id="rms-swiglu"
    ),
    pytest.param("int8", {"norm_position": "post", "activation": "relu"}, id="post-relu"),
    pytest.param("int4", {"n_kv_heads": 2, "activation": "gelu"}, id="gqa-gelu"),
    pytest.param("int8", {"activation": "silu", "n_kv_heads": 1}, id="mqa-silu"),
    pytest.param("int4", {"activation": "gelu_tanh"}, id="gpt2-gelu-tanh"),  # GPT-2's own
    pytest.param("int4", {"bias": False}, id="layernorm-without-bias"),
    pytest.param("int8", {"activation": "gelu_tanh", "d_ff": 100}, id="gelu-tanh-odd-width"),
    pytest.param("int4", {"activation": "geglu", "norm": "rmsnorm"}, id="rms-geglu"),
    pytest.param(
        "int4",
        {
            "pos_encoding": "rope",
            "n_kv_heads": 2,
            "norm": "rmsnorm",
            "activation": "swiglu",
            "bias": False,
        },
        id="llama-like",
    ),
    pytest.param(
        "int8", {"pos_encoding": "rope", "rope_layout": "interleaved"}, id="rope-interleaved"
    ),
    pytest.param(
        "int8",
        {"pos_encoding": "rope", "rope_scaling": "dynamic", "rope_factor": 2.0, "max_seq_len": 8},
        id="rope-dynamic",  # positions past max_seq_len: the base grows step by step
    ),
]


@pytest.mark.parametrize(("fmt", "overrides"), CONFIGS)
@pytest.mark.parametrize("batch", [1, 3])
def test_fused_step_equals_the_modules_bit_for_bit(
    fmt: str, overrides: dict[str, Any], batch: int
) -> None:
    """Bit for bit, except the exact (erf) GELU: the step's own vectorized GELU and F.gelu's
    (oneDNN's) round differently in the last bits, so those models are held to 1e-5."""
    model = quantize(_gpt(**overrides), fmt, group_size=32)
    exact = model.layers[0].ffn.activation not in ("gelu", "geglu")
    ids = torch.randint(0, 50, (batch, 5))
    calls: list[int] = []  # the cache positions written
    with torch.inference_mode():
        expected, expected_tokens = _step_logits(model, ids, 6)  # the modules, sdpa
        with pytest.MonkeyPatch.context() as mp:
            _count_steps(mp, calls)
            with decode_layout(model, rows=batch):
                assert all(active_plan(layer) is not None for layer in model.layers)
                assert "run_layers" in model.__dict__  # the whole stack back to back
                got, tokens = _step_logits(model, ids, 6)
        assert all(active_plan(layer) is None for layer in model.layers)  # restored
        assert "run_layers" not in model.__dict__
    assert calls == [p for p in range(5, 11) for _ in range(2)]  # 6 steps x 2 layers
    # the attention kernel sums in another order than sdpa: equal tokens, close logits
    assert torch.equal(tokens, expected_tokens)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=0)
    # against the modules with the same attention kernel (decode_layout, no fused step): exact
    with (
        torch.inference_mode(),
        pytest.MonkeyPatch.context() as mp,
    ):
        mp.setattr(
            importlib.import_module("attnlab.transforms.decode_weights"),
            "layer_plan",
            lambda *a: None,
        )
        with decode_layout(model, rows=batch):
            assert all(active_plan(layer) is None for layer in model.layers)
            modules_logits, modules_tokens = _step_logits(model, ids, 6)
    if exact:
        assert torch.equal(got, modules_logits)
    else:
        assert torch.equal(tokens, modules_tokens)
        torch.testing.assert_close(got, modules_logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_generate_with_fused_steps_gives_the_tokens_of_plain_decoding(fmt: str) -> None:
    model = quantize(_gpt(), fmt, group_size=32)
    ids = torch.randint(0, 50, (2, 4))
    assert torch.equal(
        attnlab.generate(model, ids, max_new_tokens=12, eos_id=()),
        _plain_generate(model, ids, 12),
    )


@pytest.mark.parametrize("overrides", [{"activation": "relu"}, {"norm": "rmsnorm"}])
def test_the_step_runs_under_no_grad_after_inference_mode(overrides: dict[str, Any]) -> None:
    """The step's workspace outlives a call: made under inference mode, it is still written
    (by ATen's in-place relu, RMSNorm's copy) when a later step runs under plain no_grad."""
    model = quantize(_gpt(**overrides), "int8")
    ids = torch.randint(0, 50, (2, 4))
    with torch.inference_mode(), decode_layout(model, rows=2):
        first, _ = _step_logits(model, ids, 3)
    with torch.no_grad(), decode_layout(model, rows=2):
        again, _ = _step_logits(model, ids, 3)
        assert not again.is_inference()
    assert torch.equal(first, again)


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"attn_backend": "math"}, "not the sdpa backend (no attention kernel)"),
        ({"attn_backend": "sliding_window", "attn_window": 4}, "a sliding window"),
    ],
)
def test_layers_it_does_not_cover_keep_their_modules(overrides: dict[str, Any], why: str) -> None:
    model = quantize(_gpt(**overrides), "int8")
    ids = torch.randint(0, 50, (1, 4))
    with decode_layout(model, rows=1):
        assert all(active_plan(layer) is None for layer in model.layers), why
    assert torch.equal(
        attnlab.generate(model, ids, max_new_tokens=8, eos_id=()), _plain_generate(model, ids, 8)
    )


def test_alibi_steps_carry_a_mask_and_run_the_modules() -> None:
    model = quantize(_gpt(pos_encoding="alibi"), "int8")
    ids = torch.randint(0, 50, (1, 4))
    generated: list[torch.Tensor] = []
    taken = _steps_taken(
        model,
        lambda: generated.append(attnlab.generate(model, ids, max_new_tokens=8, eos_id=())),
        layout=False,
    )
    assert taken == 0
    assert torch.equal(generated[0], _plain_generate(model, ids, 8))


def test_float32_and_encoder_decoder_models_get_no_plan() -> None:
    with decode_layout(_gpt(), rows=1):  # float32: reordered copies, no fused step
        pass
    model = _gpt()
    with decode_layout(model, rows=1):
        assert all(active_plan(layer) is None for layer in model.layers)
    config = attnlab.TransformerConfig(
        vocab_size=30, d_model=32, n_heads=4, n_layers=1, d_ff=64, max_seq_len=32, dropout=0.0
    )
    seq2seq = quantize(attnlab.build_model(config).eval(), "int8")
    with decode_layout(seq2seq, rows=1):  # cross-attention: not covered
        assert all(active_plan(m) is None for m in seq2seq.modules())


def _count_steps(mp: pytest.MonkeyPatch, calls: list[int]) -> None:
    """Record in ``calls`` the cache position of every fused layer step, whether it runs alone
    (``layer_step``) or in a stack (``stack_step``, ``decode_step``: one entry per layer). The
    fused forwards and stacks look the operators up when made: patch before decode_layout."""
    ops = torch.ops.attnlab_decode
    step, stack, whole = ops.layer_step, ops.stack_step, ops.decode_step

    def counting(*args: Any) -> torch.Tensor:
        calls.append(args[6])
        return step(*args)

    def counting_stack(*args: Any) -> torch.Tensor:
        calls.extend(args[4])
        return stack(*args)

    def counting_whole(*args: Any) -> torch.Tensor:
        calls.extend(args[8])
        return whole(*args)

    mp.setattr(ops, "layer_step", counting)
    mp.setattr(ops, "stack_step", counting_stack)
    mp.setattr(ops, "decode_step", counting_whole)


def _steps_taken(model: GPT, run: Any, *, layout: bool = True) -> int:
    """How many fused steps ``run()`` makes, inside a decode_layout entered here (``layout``) or
    by ``run`` itself (generate)."""
    calls: list[int] = []
    with pytest.MonkeyPatch.context() as mp:
        _count_steps(mp, calls)
        if not layout:
            run()
            return len(calls)
        with decode_layout(model, rows=1):
            assert all(active_plan(layer) is not None for layer in model.layers)
            run()
    return len(calls)


def test_hooks_and_masks_run_the_modules() -> None:
    """A forward hook on a sublayer, an attnlab hook site, a padded batch (a mask at every step)
    and training-mode dropout all take the modules' path, so nothing they expect is skipped."""
    model = quantize(_gpt(), "int8")
    ids = torch.randint(0, 50, (1, 4))

    def decode() -> torch.Tensor:
        with torch.inference_mode():
            return _step_logits(model, ids, 3)[0]

    assert _steps_taken(model, decode) == 6  # 3 steps x 2 layers
    seen: list[tuple[int, ...]] = []
    handle = model.layers[1].ffn.register_forward_hook(
        lambda m, a, out: seen.append(tuple(out.shape))
    )
    assert _steps_taken(model, decode) == 3 and seen.count((1, 1, 64)) == 3  # layer 0 fused
    handle.remove()
    handle = model.layers[0].self_attn_norm.register_forward_pre_hook(lambda m, a: None)
    assert _steps_taken(model, decode) == 3  # layer 1 fused
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, a, out: None)
    assert _steps_taken(model, decode) == 0  # a global hook: every module must run
    handle.remove()
    hidden: list[tuple[int, ...]] = []
    with hooked(model, {"layers.0.ffn.hidden": lambda t, name: hidden.append(tuple(t.shape))}):
        assert _steps_taken(model, decode) == 3  # layer 1 still fused, layer 0 hooked
    assert hidden.count((1, 1, 128)) == 3  # every step's hidden seen
    pair = torch.randint(0, 50, (2, 4))
    mask = torch.tensor([[False, True, True, True], [True] * 4])  # left padding: a mask each step

    def generate(**options: Any) -> None:  # enters decode_layout itself
        attnlab.generate(model, pair, max_new_tokens=3, eos_id=(), **options)

    assert _steps_taken(model, generate, layout=False) == 4  # 2 one-token steps x 2 layers
    assert _steps_taken(model, lambda: generate(attention_mask=mask), layout=False) == 0
    dropped = quantize(_gpt(dropout=0.1), "int8").train()
    assert _steps_taken(dropped, lambda: _step_logits(dropped, ids, 2)) == 0  # grad on, training


def test_weights_changed_mid_stream_are_seen() -> None:
    """A tensor the step reads changed in place, a q/k/v source changed in place (the joined copy
    is stale) or a buffer replaced between two tokens: the stream goes on exactly like one that
    never had a fused step."""
    from attnlab.generation import stream

    model = quantize(_gpt(), "int8")
    reference = quantize(_gpt(), "int8")
    ids = torch.randint(0, 50, (1, 5))
    fused = stream(model, ids, max_new_tokens=6, eos_id=())
    generate_module = importlib.import_module("attnlab.generation.generate")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(generate_module, "decode_layout", lambda m, rows: nullcontext())
        plain = stream(reference, ids, max_new_tokens=6, eos_id=())
        next(plain)
    next(fused)
    assert active_plan(model.layers[0]) is not None
    with torch.no_grad():
        for m in (model, reference):
            m.layers[0].ffn.up_proj.scales.mul_(1.5)  # read by the step: seen as it is
            m.layers[1].self_attn.k_proj.scales.mul_(-1.0)  # copied into the joined q/k/v
            m.layers[1].ffn.down_proj.bias = m.layers[1].ffn.down_proj.bias + 0.25  # replaced
    for a, b in zip(fused, plain, strict=True):
        torch.testing.assert_close(a.logits, b.logits, atol=2e-5, rtol=0)
        assert torch.equal(a.tokens, b.tokens)


def test_operator_refuses_bad_operands() -> None:
    model = quantize(_gpt(), "int8")
    with decode_layout(model, rows=1):
        plan = active_plan(model.layers[0])
    assert plan is not None
    step = torch.ops.attnlab_decode.layer_step
    x, k, v = torch.randn(1, 1, 64), torch.zeros(1, 4, 8, 16), torch.zeros(1, 4, 8, 16)
    with pytest.raises(RuntimeError, match="cache position 8 outside"):
        step(x, plan.tensors, plan.config, plan.floats, k, v, 8)
    with pytest.raises(RuntimeError, match=r"\(B, 1, E\)"):
        step(torch.randn(1, 2, 64), plan.tensors, plan.config, plan.floats, k, v, 0)
    with pytest.raises(RuntimeError, match=r"\(B, H_kv, L, D\)"):
        step(x, plan.tensors, plan.config, plan.floats, torch.zeros(1, 2, 8, 16), v, 0)
    with pytest.raises(RuntimeError, match="malformed"):
        step(x, plan.tensors[:-1], plan.config, plan.floats, k, v, 0)
    out = step(x, plan.tensors, plan.config, plan.floats, k, v, 0)
    assert out.shape == (1, 1, 64) and bool(k[:, :, 0].abs().sum() > 0)  # position 0 written


def test_the_stack_runs_back_to_back_only_when_every_layer_would() -> None:
    """GPT.run_layers inside decode_layout: the layers' fused steps back to back when every layer
    would take its own, bit for bit the per-layer path; the class's loop (and so each layer's
    own choice) when a layer has a hook, the steps carry a mask, or a layer has no plan."""
    model = quantize(_gpt(n_layers=3), "int4", group_size=32)
    ids = torch.randint(0, 50, (1, 4))
    own: list[int] = []
    loop = GPT.run_layers

    def counting_loop(self: GPT, *args: Any, **kwargs: Any) -> torch.Tensor:
        own.append(1)
        return loop(self, *args, **kwargs)

    def decode() -> torch.Tensor:
        with torch.inference_mode():
            return _step_logits(model, ids, 4)[0]

    logits: dict[str, torch.Tensor] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(GPT, "run_layers", counting_loop)
        with decode_layout(model, rows=1):
            logits["stack"] = decode()
        assert len(own) == 1  # the prompt only: every one-token step ran as the stack
        own.clear()
        seen: list[int] = []
        handle = model.layers[1].register_forward_hook(lambda m, a, out: seen.append(1))
        with decode_layout(model, rows=1):
            logits["per layer"] = decode()
        handle.remove()
        assert len(own) == 5 and len(seen) == 5  # the loop, so the layer's hook ran every step
        own.clear()
        assert _steps_taken(model, decode) == 12  # yet each layer still took its fused step
        assert len(own) == 1
        own.clear()
        with decode_layout(model, rows=1):
            model.layers[2].__dict__.pop("forward")  # a layer without its fused step
            logits["one layer plain"] = decode()
        assert len(own) == 5
    assert torch.equal(logits["stack"], logits["per layer"])
    torch.testing.assert_close(logits["one layer plain"], logits["stack"], atol=2e-5, rtol=0)
    pair = torch.randint(0, 50, (2, 4))
    mask = torch.tensor([[False, True, True, True], [True] * 4])  # left padding
    own.clear()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(GPT, "run_layers", counting_loop)
        padded = attnlab.generate(model, pair, max_new_tokens=3, eos_id=(), attention_mask=mask)
    assert len(own) == 3  # a mask at every step: the loop each time
    assert torch.equal(padded, _plain_generate(model, pair, 3, attention_mask=mask))


def test_the_whole_step_is_one_call_where_the_embedding_allows() -> None:
    """GPT.hidden_states inside decode_layout: token ids to the final norm in one decode_step
    for a plain embedding (learned or rotary positions); stack_step alone when the final norm or
    the embedding has a hook; the ids and the learned table's end checked as the modules do."""
    ops = torch.ops.attnlab_decode
    used: list[str] = []

    def spy(name: str) -> Any:
        op = getattr(ops, name)
        return lambda *args: used.append(name) or op(*args)

    for overrides in ({}, {"pos_encoding": "rope", "norm": "rmsnorm"}):
        model = quantize(_gpt(n_layers=2, **overrides), "int4", group_size=32)
        ids = torch.randint(0, 50, (2, 4))
        used.clear()

        with pytest.MonkeyPatch.context() as mp, torch.inference_mode():
            for name in ("decode_step", "stack_step", "layer_step"):
                mp.setattr(ops, name, spy(name))
            with decode_layout(model, rows=2):
                whole, _ = _step_logits(model, ids, 3)
            assert used == ["decode_step"] * 3, overrides
            used.clear()
            for module in (model.final_norm, model.tok_embed):
                handle = module.register_forward_hook(lambda m, a, out: None)
                with decode_layout(model, rows=2):
                    hooked_logits, _ = _step_logits(model, ids, 3)
                handle.remove()
                assert used == ["stack_step"] * 3, (overrides, module)
                assert torch.equal(hooked_logits, whole)
                used.clear()
    model = quantize(_gpt(n_layers=2), "int8")
    model.tok_embed.scale = 1.7  # a scaled embedding (BERT-style): scaled in the step too
    ids = torch.randint(0, 50, (2, 4))
    with torch.inference_mode():
        plain, plain_tokens = _step_logits(model, ids, 3)
        used.clear()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ops, "decode_step", spy("decode_step"))
            with decode_layout(model, rows=2):
                scaled, scaled_tokens = _step_logits(model, ids, 3)
    assert used == ["decode_step"] * 3
    assert torch.equal(scaled_tokens, plain_tokens)
    torch.testing.assert_close(scaled, plain, atol=2e-5, rtol=0)
    model = quantize(_gpt(n_layers=2, max_seq_len=6), "int8")
    with torch.inference_mode(), decode_layout(model, rows=1):
        cache = model.new_cache(8)
        model(torch.randint(0, 50, (1, 5)), cache=cache)
        with pytest.raises(ValueError, match=r"token id 50 is outside the vocabulary \[0, 50\)"):
            model(torch.tensor([[50]]), cache=cache)
        model(torch.tensor([[3]]), cache=cache)  # position 5, the table's last
        with pytest.raises(ValueError, match="sequence of 7 tokens exceeds max_seq_len=6"):
            model(torch.tensor([[3]]), cache=cache)
