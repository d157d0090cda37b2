"""The fused decoder-layer step (attnlab.transforms.decode_layer), run by the fused decode engine:
one C++ call per layer and token (or per stack, or per whole step), bit for bit what the modules
compute (to 1e-5 with the exact GELU), and the modules wherever it does not apply."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import attnlab
import attnlab.kernels as wk
from attnlab import GPT
from attnlab.generation import engines
from attnlab.inspect import hooked
from attnlab.transforms import decode_engine, quantize
from attnlab.transforms.decode_engine import FusedDecoder
from attnlab.transforms.decode_layer import LayerPlan, layer_plan, takes_step

from .test_decode_engine import _assert_unchanged, _snapshot, _step_logits
from .test_decode_engine import _gpt as _peaked_gpt

pytestmark = [
    pytest.mark.usefixtures("one_thread"),  # tests/conftest.py
    pytest.mark.skipif(not wk.available(), reason=f"kernels: {wk.unavailable_reason()}"),
]


def _gpt(**overrides: Any) -> GPT:
    """test_decode_engine's peaked-weight GPT at d_model 64 (``rope_layout``: set the RoPE
    module's pair layout, which no config field names)."""
    layout = overrides.pop("rope_layout", None)
    model = _peaked_gpt(**{"d_model": 64, "d_ff": 128, **overrides})
    if layout is not None:
        model.pos_encoding.layout = layout
    return model


def _generate(model: Any, ids: torch.Tensor, n: int, **options: Any) -> torch.Tensor:
    return attnlab.generate(model, ids, max_new_tokens=n, eos_id=(), **options)


def _eager(model: Any, ids: torch.Tensor, n: int, **options: Any) -> torch.Tensor:
    """attnlab.generate on the modules (the sdpa backend), the reference."""
    return _generate(model, ids, n, engine="eager", **options)


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


def _count_steps(mp: pytest.MonkeyPatch, calls: list[int]) -> None:
    """Record in ``calls`` the cache position of every fused layer step, whether it runs alone
    (``layer_step``) or in a stack (``stack_step``, ``decode_step``: one entry per layer). The
    wrappers of attnlab.kernels look the operators up at each call."""
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


def _spy_ops(mp: pytest.MonkeyPatch, used: list[str]) -> None:
    """Record in ``used`` the name of every C++ step operator called."""
    ops = torch.ops.attnlab_decode
    for name in ("decode_step", "stack_step", "layer_step"):
        mp.setattr(ops, name, _spy(getattr(ops, name), name, used))


def _spy(op: Any, name: str, used: list[str]) -> Any:
    """``op``, recording ``name`` in ``used`` at each call."""
    return lambda *args: used.append(name) or op(*args)


def _steps_taken(model: Any, run: Any, *, rows: int = 1, engine: bool = True) -> int:
    """How many fused layer steps ``run`` makes: ``run(engine)`` with a :class:`FusedDecoder`
    made here whose every layer has a plan (``engine``), or ``run()`` (a generation call)."""
    calls: list[int] = []
    with pytest.MonkeyPatch.context() as mp:
        _count_steps(mp, calls)
        if not engine:
            run()
            return len(calls)
        with FusedDecoder(model, rows=rows) as fused:
            assert all(step.plan is not None for step in fused.steps)
            run(fused)
    return len(calls)


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
        expected, expected_tokens = _step_logits(model, model, ids, 6)  # the modules, sdpa
        before = _snapshot(model)
        with pytest.MonkeyPatch.context() as mp:
            _count_steps(mp, calls)
            with FusedDecoder(model, rows=batch) as engine:
                assert all(step.plan is not None for step in engine.steps)
                assert engine.cpp is not None  # the whole stack back to back
                got, tokens = _step_logits(engine, model, ids, 6)
        _assert_unchanged(model, before)
    assert calls == [p for p in range(5, 11) for _ in range(2)]  # 6 steps x 2 layers
    # the attention kernel sums in another order than sdpa: equal tokens, close logits
    assert torch.equal(tokens, expected_tokens)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=0)
    # against the modules' computation with the same attention kernel (the engine's Python
    # step: no plan): exact
    with torch.inference_mode(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(decode_engine, "layer_plan", lambda *a: None)
        with FusedDecoder(model, rows=batch) as engine:
            assert all(step.plan is None and step.kernel_attention for step in engine.steps)
            assert engine.cpp is None
            modules_logits, modules_tokens = _step_logits(engine, model, ids, 6)
    if exact:
        assert torch.equal(got, modules_logits)
    else:
        assert torch.equal(tokens, modules_tokens)
        torch.testing.assert_close(got, modules_logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_generate_with_fused_steps_gives_the_tokens_of_plain_decoding(fmt: str) -> None:
    model = quantize(_gpt(), fmt, group_size=32)
    ids = torch.randint(0, 50, (2, 4))
    eager = _eager(model, ids, 12)
    fused: list[torch.Tensor] = []
    taken = _steps_taken(
        model, lambda: fused.append(_generate(model, ids, 12, engine="fused")), engine=False
    )
    assert taken == 11 * 2  # every one-token step, both layers
    assert torch.equal(fused[0], eager)
    assert torch.equal(_generate(model, ids, 12), eager)  # auto


@pytest.mark.parametrize("overrides", [{"activation": "relu"}, {"norm": "rmsnorm"}])
def test_the_step_runs_under_no_grad_after_inference_mode(overrides: dict[str, Any]) -> None:
    """The step's workspace outlives a call: made under inference mode, it is still written
    (by ATen's in-place relu, RMSNorm's copy) when a later step of the same engine (a held
    session) runs under plain no_grad."""
    model = quantize(_gpt(**overrides), "int8")
    ids = torch.randint(0, 50, (2, 4))
    with FusedDecoder(model, rows=2) as engine:
        assert engine.cpp is not None
        with torch.inference_mode():
            first, _ = _step_logits(engine, model, ids, 3)
        with torch.no_grad():
            again, _ = _step_logits(engine, model, ids, 3)
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
    with FusedDecoder(model, rows=1) as engine:
        assert all(step.plan is None for step in engine.steps), why
        assert engine.cpp is None
    fused: list[torch.Tensor] = []
    taken = _steps_taken(
        model, lambda: fused.append(_generate(model, ids, 8, engine="fused")), engine=False
    )
    assert taken == 0
    assert torch.equal(fused[0], _eager(model, ids, 8))


def test_alibi_steps_carry_a_mask_and_run_the_modules() -> None:
    model = quantize(_gpt(pos_encoding="alibi"), "int8")
    ids = torch.randint(0, 50, (1, 4))
    generated: list[torch.Tensor] = []
    taken = _steps_taken(
        model,
        lambda: generated.append(_generate(model, ids, 8, engine="fused")),
        engine=False,
    )
    assert taken == 0
    assert torch.equal(generated[0], _eager(model, ids, 8))


def test_float32_and_encoder_decoder_models_get_no_plan() -> None:
    model = _gpt()
    with FusedDecoder(model, rows=1) as engine:  # float32: copies, no fused step
        assert all(step.plan is None for step in engine.steps) and engine.cpp is None
    config = attnlab.TransformerConfig(
        vocab_size=30, d_model=32, n_heads=4, n_layers=1, d_ff=64, max_seq_len=32, dropout=0.0
    )
    seq2seq = quantize(attnlab.build_model(config).eval(), "int8")
    with pytest.raises(ValueError, match="declares none"):  # cross-attention: not covered
        FusedDecoder(seq2seq, rows=1)
    choice = engines.resolve_engine(seq2seq, "auto", rows=1, max_new_tokens=32)
    assert choice.name == "eager"
    layer = seq2seq.decoder.layers[0]
    assert layer.cross_attn is not None
    assert layer_plan(layer, None) is None  # a plan is refused before q/k/v are read


def test_hooks_and_masks_run_the_modules() -> None:
    """A forward hook on a sublayer, an attnlab hook site, a padded batch (a mask at every step)
    and training-mode dropout all take the modules' path, so nothing they expect is skipped."""
    model = quantize(_gpt(), "int8")
    ids = torch.randint(0, 50, (1, 4))

    def decode(engine: FusedDecoder) -> torch.Tensor:
        with torch.inference_mode():
            return _step_logits(engine, model, ids, 3)[0]

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
    # a hook added while an engine is open (a session held) is seen from the next step on
    with FusedDecoder(model, rows=1) as engine, torch.inference_mode():
        calls: list[int] = []
        with pytest.MonkeyPatch.context() as mp:
            _count_steps(mp, calls)
            cache = model.new_cache(8)
            engine.hidden_states(ids, cache=cache)
            engine.hidden_states(ids[:, :1], cache=cache)
            assert len(calls) == 2
            handle = model.layers[0].ffn.register_forward_hook(
                lambda m, a, out: seen.append(tuple(out.shape))
            )
            seen.clear()
            engine.hidden_states(ids[:, :1], cache=cache)
            handle.remove()
            assert len(calls) == 3 and seen == [(1, 1, 64)]  # layer 1 alone fused
    pair = torch.randint(0, 50, (2, 4))
    mask = torch.tensor([[False, True, True, True], [True] * 4])  # left padding: a mask each step

    def generate(**options: Any) -> None:  # makes the engine itself
        _generate(model, pair, 3, engine="fused", **options)

    assert _steps_taken(model, generate, engine=False) == 4  # 2 one-token steps x 2 layers
    assert _steps_taken(model, lambda: generate(attention_mask=mask), engine=False) == 0
    dropped = quantize(_gpt(dropout=0.1), "int8").train()

    def grad_on(engine: FusedDecoder) -> None:  # autograd on: the model's own hidden_states
        _step_logits(engine, dropped, ids, 2)

    def training(engine: FusedDecoder) -> None:  # inference mode, active dropout: the modules
        with torch.inference_mode():
            _step_logits(engine, dropped, ids, 2)

    assert _steps_taken(dropped, grad_on) == 0
    assert _steps_taken(dropped, training) == 0
    dropped.eval()

    def evaluating(engine: FusedDecoder) -> None:  # eval mode: dropout off, fused
        with torch.inference_mode():
            _step_logits(engine, dropped, ids, 2)

    assert _steps_taken(dropped, evaluating) == 4


def test_weights_changed_mid_stream_are_seen() -> None:
    """A tensor the step reads changed in place, a q/k/v source changed in place (the joined copy
    is stale) or a buffer replaced between two tokens: the stream goes on exactly like the
    modules'."""
    from attnlab.generation import stream

    model = quantize(_gpt(), "int8")
    reference = quantize(_gpt(), "int8")
    ids = torch.randint(0, 50, (1, 5))
    with engines.DecodeSession(model, rows=1) as session:
        engine = session.engine
        assert engine is not None and engine.cpp is not None
        fused = stream(model, ids, max_new_tokens=6, eos_id=(), decode_session=session)
        plain = stream(reference, ids, max_new_tokens=6, eos_id=(), engine="eager")
        next(plain)
        next(fused)
        plan = engine.steps[1].plan
        assert plan is not None and plan.is_current()
        with torch.no_grad():
            for m in (model, reference):
                m.layers[0].ffn.up_proj.scales.mul_(1.5)  # read by the step: seen as it is
                m.layers[1].self_attn.k_proj.scales.mul_(-1.0)  # copied into the joined q/k/v
                m.layers[1].ffn.down_proj.bias = m.layers[1].ffn.down_proj.bias + 0.25  # replaced
        assert not plan.is_current()
        stale = engine.steps[1].qkv
        assert stale is not None and not stale.is_current()
        for a, b in zip(fused, plain, strict=True):
            torch.testing.assert_close(a.logits, b.logits, atol=2e-5, rtol=0)
            assert torch.equal(a.tokens, b.tokens)


def test_operator_refuses_bad_operands() -> None:
    model = quantize(_gpt(), "int8")
    with FusedDecoder(model, rows=1) as engine:
        plan = engine.steps[0].plan
    assert isinstance(plan, LayerPlan)
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


def test_takes_step_checks_what_the_step_covers() -> None:
    """takes_step: one float32 token per row, autograd off, a cache with room, current
    tensors."""
    model = quantize(_gpt(), "int8")
    layer = model.layers[0]
    with FusedDecoder(model, rows=1) as engine:
        plan = engine.steps[0].plan
        assert plan is not None
        cache = model.new_cache(3)
        layer_cache = cache.layer(0)[0]
        x = torch.randn(1, 1, 64)
        with torch.inference_mode():
            engine.hidden_states(torch.tensor([[1, 2]]), cache=cache)  # allocates the cache
            assert takes_step(layer, plan, x, layer_cache)
            assert not takes_step(layer, plan, torch.randn(1, 2, 64), layer_cache)  # 2 tokens
            assert not takes_step(layer, plan, x.double(), layer_cache)
            assert not takes_step(layer, plan, torch.randn(2, 1, 64), layer_cache)  # batch
            engine.hidden_states(torch.tensor([[3]]), cache=cache)  # the cache is full now
            assert not takes_step(layer, plan, x, layer_cache)
        assert not takes_step(layer, plan, x, model.new_cache(3).layer(0)[0])  # grad on


def test_the_stack_runs_back_to_back_only_when_every_layer_would() -> None:
    """The engine runs the layers' fused steps back to back (one call) when every layer would
    take its own, bit for bit the per-layer path; each layer's own choice when a layer has a
    hook (which then sees every call), the steps carry a mask, or a layer has no plan."""
    model = quantize(_gpt(n_layers=3), "int4", group_size=32)
    ids = torch.randint(0, 50, (1, 4))
    used: list[str] = []

    def decode(engine: FusedDecoder) -> torch.Tensor:
        with torch.inference_mode():
            return _step_logits(engine, model, ids, 4)[0]

    logits: dict[str, torch.Tensor] = {}
    with pytest.MonkeyPatch.context() as mp:
        _spy_ops(mp, used)
        with FusedDecoder(model, rows=1) as engine:
            assert engine.cpp is not None
            logits["stack"] = decode(engine)
        assert used == ["decode_step"] * 4  # every one-token step as one call
        used.clear()
        with pytest.MonkeyPatch.context() as no_stack:
            no_stack.setattr(decode_engine, "CppStack", lambda *a: None)
            with FusedDecoder(model, rows=1) as engine:
                assert engine.cpp is None and all(s.plan is not None for s in engine.steps)
                logits["per layer"] = decode(engine)
        assert used == ["layer_step"] * 12  # 4 steps x 3 layers, one call each
        used.clear()
        seen: list[int] = []
        handle = model.layers[1].register_forward_hook(lambda m, a, out: seen.append(1))
        with FusedDecoder(model, rows=1) as engine:
            logits["hooked"] = decode(engine)
        handle.remove()
        assert len(seen) == 5  # the prompt and 4 steps: the layer's module ran every time
        assert used == ["layer_step"] * 8  # the other two layers still took their fused steps
        used.clear()
    torch.testing.assert_close(logits["hooked"], logits["stack"], atol=2e-5, rtol=0)
    assert torch.equal(logits["stack"], logits["per layer"])
    # a layer without a plan (its down projection left in float32): no stack, no whole step
    mixed = quantize(_gpt(n_layers=3), "int4", group_size=32)
    torch.manual_seed(1)
    mixed.layers[2].ffn.down_proj = torch.nn.Linear(128, 64)
    with torch.inference_mode():
        expected, expected_tokens = _step_logits(mixed, mixed, ids, 4)
    with pytest.MonkeyPatch.context() as mp:
        _spy_ops(mp, used)
        with FusedDecoder(mixed, rows=1) as engine, torch.inference_mode():
            assert engine.steps[2].plan is None and engine.cpp is None
            assert engine.steps[0].plan is not None and engine.steps[1].plan is not None
            got, tokens = _step_logits(engine, mixed, ids, 4)
    assert used == ["layer_step"] * 8
    assert torch.equal(tokens, expected_tokens)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=0)
    used.clear()
    pair = torch.randint(0, 50, (2, 4))
    mask = torch.tensor([[False, True, True, True], [True] * 4])  # left padding
    with pytest.MonkeyPatch.context() as mp:
        _spy_ops(mp, used)
        padded = _generate(model, pair, 3, engine="fused", attention_mask=mask)
    assert used == []  # a mask at every step: the Python steps
    assert torch.equal(padded, _eager(model, pair, 3, attention_mask=mask))


def test_the_whole_step_is_one_call_where_the_embedding_allows() -> None:
    """The engine's hidden_states: token ids to the final norm in one decode_step for a plain
    embedding (learned or rotary positions); stack_step alone when the final norm or the
    embedding has a hook; the ids and the learned table's end checked as the modules do."""
    ops = torch.ops.attnlab_decode
    used: list[str] = []

    for overrides in ({}, {"pos_encoding": "rope", "norm": "rmsnorm"}):
        model = quantize(_gpt(n_layers=2, **overrides), "int4", group_size=32)
        ids = torch.randint(0, 50, (2, 4))
        used.clear()

        with pytest.MonkeyPatch.context() as mp, torch.inference_mode():
            _spy_ops(mp, used)
            with FusedDecoder(model, rows=2) as engine:
                whole, _ = _step_logits(engine, model, ids, 3)
                assert used == ["decode_step"] * 3, overrides
                used.clear()
                for module in (model.final_norm, model.tok_embed):
                    calls: list[int] = []
                    handle = module.register_forward_hook(
                        lambda m, a, out, calls=calls: calls.append(1)
                    )
                    hooked_logits, _ = _step_logits(engine, model, ids, 3)
                    handle.remove()
                    assert used == ["stack_step"] * 3, (overrides, module)
                    assert len(calls) == 4  # the hook saw the prompt and every step
                    assert torch.equal(hooked_logits, whole)
                    used.clear()
    model = quantize(_gpt(n_layers=2), "int8")
    model.tok_embed.scale = 1.7  # a scaled embedding (BERT-style): scaled in the step too
    ids = torch.randint(0, 50, (2, 4))
    with torch.inference_mode():
        plain, plain_tokens = _step_logits(model, model, ids, 3)
        used.clear()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ops, "decode_step", _spy(ops.decode_step, "decode_step", used))
            with FusedDecoder(model, rows=2) as engine:
                scaled, scaled_tokens = _step_logits(engine, model, ids, 3)
    assert used == ["decode_step"] * 3
    assert torch.equal(scaled_tokens, plain_tokens)
    torch.testing.assert_close(scaled, plain, atol=2e-5, rtol=0)
    model = quantize(_gpt(n_layers=2, max_seq_len=6), "int8")
    used.clear()
    with (
        pytest.MonkeyPatch.context() as mp,
        torch.inference_mode(),
        FusedDecoder(model, rows=1) as engine,
    ):
        _spy_ops(mp, used)
        cache = model.new_cache(8)
        engine.hidden_states(torch.randint(0, 50, (1, 5)), cache=cache)
        with pytest.raises(ValueError, match=r"token id 50 is outside the vocabulary \[0, 50\)"):
            engine.hidden_states(torch.tensor([[50]]), cache=cache)
        assert cache.seq_len == 5  # nothing written
        engine.hidden_states(torch.tensor([[3]]), cache=cache)  # position 5, the table's last
        assert used == ["decode_step"] * 2
        with pytest.raises(ValueError, match="sequence of 7 tokens exceeds max_seq_len=6"):
            engine.hidden_states(torch.tensor([[3]]), cache=cache)
