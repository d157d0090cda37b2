"""The fused decode engine (attnlab.transforms.decode_engine): decode-time weight copies change
speed, never results, and never the model; they live for one call (or a held session)."""

from __future__ import annotations

import copy
import dataclasses
import gc
import weakref
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.modules import module as torch_module

import attnlab
import attnlab.kernels as wk
from attnlab import GPT, GPTConfig
from attnlab.generation import engines, stream
from attnlab.generation.engines import (
    MIN_FUSED_TOKENS,
    DecodeSession,
    engine_copy_numel,
    resolve_engine,
)
from attnlab.layers.attention_backends import sdpa_attention
from attnlab.transforms import decode_engine
from attnlab.transforms import decode_weights as layout_module
from attnlab.transforms.decode_engine import FusedDecoder
from attnlab.transforms.decode_weights import (
    MAX_ROWS,
    DecodeWeight,
    QuantizedStack,
    active_copy,
    copy_numel,
    decode_layout,
    release_copies,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(autouse=True)
def _onednn_for_large_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests below check the reordered copies, which an Intel CPU would not make by
    default (test_large_weights_follow_the_cpu covers that choice)."""
    monkeypatch.setenv(layout_module.LIBRARY_VARIABLE, "onednn")


def _all_large(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every weight count as large: reordered (oneDNN) copies, whatever the rows."""
    monkeypatch.setattr(layout_module, "ONEDNN_MIN_NUMEL", 0)


def _gpt(**overrides: object) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=50,
        d_model=32,
        n_heads=4,
        n_layers=2,
        d_ff=64,
        max_seq_len=64,
        dropout=0.0,
        eos_id=None,
    )
    model = GPT(dataclasses.replace(cfg, **overrides)).eval()  # type: ignore[arg-type]
    with torch.no_grad():  # large weights: peaked next-token distributions, no near-ties
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.15)
            else:  # biases and norm gains
                p.uniform_(0.5, 1.5)
    return model


# -- running a model or an engine ---------------------------------------------------------------


def _prompt_logits(runner: Any, model: Any, ids: torch.Tensor) -> torch.Tensor:
    """The logits of every prompt position ``(B, T, V)``, run by ``runner`` (the model itself or
    a :class:`FusedDecoder`) with a cache (the engine runs cached calls)."""
    h = runner.hidden_states(ids, cache=model.new_cache(ids.shape[1] + 1))
    return runner.lm_head(h)


def _step_logits(
    runner: Any, model: Any, ids: torch.Tensor, steps: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy decoding with a cache, run by ``runner``: the prompt, then ``steps`` one-token
    steps; the logits of every step ``(steps + 1, B, V)`` and the tokens ``(B, steps)``."""
    cache = model.new_cache(ids.shape[1] + steps + 1)
    out = [runner.lm_head(runner.hidden_states(ids, cache=cache))[:, -1]]
    tokens = []
    for _ in range(steps):
        token = out[-1].argmax(-1, keepdim=True)  # (B, 1)
        tokens.append(token)
        out.append(runner.lm_head(runner.hidden_states(token, cache=cache))[:, -1])
    return torch.stack(out), torch.cat(tokens, dim=1)


def _generate(model: nn.Module, ids: torch.Tensor, n: int, **options: Any) -> torch.Tensor:
    return attnlab.generate(model, ids, max_new_tokens=n, eos_id=(), **options)


# -- the model is never changed ------------------------------------------------------------------


@dataclasses.dataclass
class _Snapshot:
    attributes: dict[str, list[str]]  # every module's instance attributes
    classes: dict[type, dict[str, Any]]  # every module class's attributes
    state: dict[str, torch.Tensor]  # a copy of the state dict
    tensors: dict[str, tuple[int, int, tuple[int, ...], int]]  # id, storage, strides, version
    global_hooks: tuple[int, ...]  # torch's global module hooks


def _global_hooks() -> tuple[int, ...]:
    return tuple(
        len(getattr(torch_module, name))
        for name in dir(torch_module)
        if name.startswith("_global_") and name.endswith("_hooks")
    )


def _snapshot(model: nn.Module) -> _Snapshot:
    return _Snapshot(
        attributes={name: sorted(m.__dict__) for name, m in model.named_modules()},
        classes={type(m): dict(vars(type(m))) for m in model.modules()},
        state={k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()},
        tensors={
            k: (id(v), v.data_ptr(), v.stride(), v._version)
            for k, v in model.state_dict(keep_vars=True).items()
        },
        global_hooks=_global_hooks(),
    )


def _assert_unchanged(model: nn.Module, before: _Snapshot) -> None:
    """No module gained or lost an instance attribute (nothing patched in), no class changed,
    every parameter and buffer is the same tensor with bitwise the same numbers, and no global
    hook was left behind."""
    after = _snapshot(model)
    assert after.attributes == before.attributes
    assert after.classes == before.classes
    assert after.tensors == before.tensors
    assert after.state.keys() == before.state.keys()
    for k, v in before.state.items():
        assert v.dtype == after.state[k].dtype and torch.equal(v, after.state[k]), k
    assert after.global_hooks == before.global_hooks


# -- the engines made inside a call --------------------------------------------------------------


def _copy_tensors(copy: DecodeWeight | QuantizedStack) -> list[torch.Tensor]:
    if isinstance(copy, DecodeWeight):
        return [t for t in (copy.weight, copy.bias) if t is not None]
    return list(copy.layer.stored_tensors())


@dataclasses.dataclass
class _Made:
    """Weak references to every engine made (by a generation call or a session), its copies
    and their tensors."""

    engines: list[weakref.ref[Any]] = dataclasses.field(default_factory=list)
    copies: list[weakref.ref[Any]] = dataclasses.field(default_factory=list)
    tensors: list[weakref.ref[Any]] = dataclasses.field(default_factory=list)

    def alive(self) -> list[Any]:
        gc.collect()
        return [r() for r in self.engines + self.copies + self.tensors if r() is not None]


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> _Made:
    record = _Made()
    real = engines.FusedDecoder

    def making(model: nn.Module, rows: int) -> FusedDecoder:
        engine = real(model, rows)
        record.engines.append(weakref.ref(engine))
        record.copies += [weakref.ref(c) for c in engine.copies()]
        record.tensors += [weakref.ref(t) for c in engine.copies() for t in _copy_tensors(c)]
        return engine

    monkeypatch.setattr(engines, "FusedDecoder", making)
    return record


@pytest.fixture
def used(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ids of the copies called (DecodeWeight and QuantizedStack), in order."""
    calls: list[int] = []
    for cls in (DecodeWeight, QuantizedStack):
        real = cls.__call__

        def counting(self: Any, x: torch.Tensor, real: Any = real) -> torch.Tensor:
            calls.append(id(self))
            return real(self, x)

        monkeypatch.setattr(cls, "__call__", counting)
    return calls


# -- copies: which, and the logits they give -----------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [{}, {"n_kv_heads": 2, "pos_encoding": "rope", "activation": "swiglu", "bias": False}],
)
@pytest.mark.parametrize("large", [False, True])
def test_logits_with_copies_equal_the_modules(
    overrides: dict[str, object], large: bool, monkeypatch: pytest.MonkeyPatch, used: list[int]
) -> None:
    if large:
        _all_large(monkeypatch)
    model = _gpt(**overrides)
    ids = torch.randint(0, 50, (1, 7))
    with torch.inference_mode():
        expected = _prompt_logits(model, model, ids)
        expected_steps, expected_tokens = _step_logits(model, model, ids, 4)
        before = _snapshot(model)
        with FusedDecoder(model, rows=1) as engine:
            step = engine.steps[0]
            attn = model.layers[0].self_attn
            assert isinstance(step.qkv, DecodeWeight) and step.qkv.is_current()
            assert step.qkv.sources == (attn.q_proj, attn.k_proj, attn.v_proj)  # one product
            assert step.qkv.reordered == large
            assert engine.head is not None and engine.head.reordered == large  # wide: 32 -> 50
            assert (step.ffn["down_proj"] is not None) == large  # small and narrow: no copy
            assert (step.out is not None) == large
            assert step.plan is None and engine.cpp is None  # float32: no C++ step
            assert engine.copy_bytes() > 0
            got = _prompt_logits(engine, model, ids)
            got_steps, tokens = _step_logits(engine, model, ids, 4)
            assert {id(c) for c in engine.copies()} <= set(used)  # every copy ran
        _assert_unchanged(model, before)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_steps, expected_steps, atol=1e-5, rtol=1e-5)
    assert torch.equal(tokens, expected_tokens)


@pytest.mark.parametrize("large", [False, True])
def test_many_rows_use_only_reordered_copies(large: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if large:
        _all_large(monkeypatch)
    model = _gpt()
    ids = torch.randint(0, 50, (MAX_ROWS + 1, 7))
    with torch.inference_mode():
        expected = _prompt_logits(model, model, ids)
        with FusedDecoder(model, rows=MAX_ROWS + 1) as engine:
            assert (engine.head is not None) == large
            assert (engine.steps[0].qkv is not None) == large
            assert all(c.reordered for c in engine.copies())
            assert decode_engine.gains(model, MAX_ROWS + 1) == large
            got = _prompt_logits(engine, model, ids)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_models_off_fp32_get_no_copies() -> None:
    model = _gpt().double()
    ids = torch.randint(0, 50, (1, 5))
    with FusedDecoder(model, rows=1) as engine:
        assert engine.copies() == [] and engine.copy_bytes() == 0
        with torch.inference_mode():
            assert torch.equal(
                _prompt_logits(engine, model, ids), _prompt_logits(model, model, ids)
            )
    assert not decode_engine.gains(model, 1)
    choice = resolve_engine(model, "auto", rows=1, max_new_tokens=32)
    assert choice.name == "eager" and "no copy pays" in choice.reason
    assert torch.equal(_generate(model, ids, 6, engine="fused"), _generate(model, ids, 6))


def test_copy_numel_counts_what_the_engine_may_copy() -> None:
    model = _gpt()
    with torch.device("meta"):
        meta = GPT(model.config)
    copied = copy_numel(meta)
    assert copied == copy_numel(model) == copy_numel(model.config)
    assert 0 < copied < sum(p.numel() for p in model.parameters())
    assert engine_copy_numel(model) == copied and engine_copy_numel(model, "eager") == 0
    with FusedDecoder(model, rows=1) as engine:  # what it holds is at most what it may copy
        assert 0 < engine.copy_bytes() <= 4 * copied
    seq2seq = attnlab.build_model("transformer-tiny")
    assert copy_numel(seq2seq) == 0 and engine_copy_numel(seq2seq) == 0  # not run fused


# -- the model never changes; the copies live for one call or a held session --------------------


def test_parameters_and_modules_are_untouched(made: _Made) -> None:
    model = _gpt()
    ids = torch.randint(0, 50, (2, 5))
    before = _snapshot(model)
    with FusedDecoder(model, rows=2) as engine, torch.inference_mode():
        _step_logits(engine, model, ids, 3)
    _assert_unchanged(model, before)
    tokens = _generate(model, ids, 6, engine="fused")
    assert len(made.engines) == 1  # the call ran the engine
    _assert_unchanged(model, before)
    assert torch.equal(tokens, _generate(model, ids, 6, engine="eager"))
    _assert_unchanged(model, before)


def test_copies_are_freed_when_the_call_ends(made: _Made) -> None:
    model = _gpt()
    ids = torch.randint(0, 50, (1, 5))
    _generate(model, ids, 4, engine="fused")
    assert len(made.engines) == 1 and made.copies and made.tensors
    assert made.alive() == []  # engine, copies and their tensors all gone
    # a stream holds its engine until it is exhausted or closed
    steps = stream(model, ids, max_new_tokens=4, eos_id=(), engine="fused")
    next(steps)
    assert len(made.engines) == 2 and made.alive()
    steps.close()
    assert made.alive() == []
    # a FusedDecoder frees its copies on close, even while the object itself lives on
    engine = FusedDecoder(model, rows=1)
    refs = [weakref.ref(c) for c in engine.copies()]
    refs += [weakref.ref(t) for c in engine.copies() for t in _copy_tensors(c)]
    assert refs
    with torch.inference_mode():
        expected = _prompt_logits(model, model, ids)
        with engine:
            _prompt_logits(engine, model, ids)
        gc.collect()
        assert all(r() is None for r in refs)
        assert engine.closed and engine.copies() == [] and engine.copy_bytes() == 0
        engine.close()  # idempotent
        assert torch.equal(_prompt_logits(engine, model, ids), expected)  # the model's own


def test_a_session_keeps_its_copies_across_calls_and_frees_them_on_close(
    made: _Made, used: list[int]
) -> None:
    model = _gpt()
    ids = torch.randint(0, 50, (1, 5))
    before = _snapshot(model)
    expected = _generate(model, ids, 6, engine="eager")
    with DecodeSession(model, rows=1) as session:
        assert session.engine is not None
        held = [id(c) for c in session.engine.copies()]
        assert held
        for _ in range(2):
            got = _generate(model, ids, 6, engine="fused", decode_session=session)
            assert torch.equal(got, expected)
            assert [id(c) for c in session.engine.copies()] == held  # the same copies
        assert set(held) <= set(used)
        # a held session makes "auto" take the engine even for a few tokens
        assert resolve_engine(model, "auto", rows=1, max_new_tokens=2, held=True).name == "fused"
        assert torch.equal(_generate(model, ids, 2, decode_session=session), expected[:, :2])
        assert len(made.engines) == 1  # no call made an engine of its own
        # a weight changed in place (a training step): its stale copy is never used
        attn = model.layers[0].self_attn
        saved = attn.v_proj.bias.detach().clone()
        with torch.no_grad():
            attn.v_proj.bias.add_(1.0)
        stale = session.engine.steps[0].qkv
        assert stale is not None and not stale.is_current()
        used.clear()
        reference = _generate(model, ids, 6, engine="eager")
        got = _generate(model, ids, 6, engine="fused", decode_session=session)
        assert torch.equal(got, reference)
        assert id(stale) not in used and used  # the current copies still ran
        del stale
        with torch.no_grad():
            attn.v_proj.bias.copy_(saved)
        now = _snapshot(model)  # the bias's version moved on; the session's hooks are on
        _assert_unchanged(
            model, dataclasses.replace(before, tensors=now.tensors, global_hooks=now.global_hooks)
        )
        before = dataclasses.replace(now, global_hooks=before.global_hooks)
        assert made.alive()
    assert made.alive() == []  # closed: every copy freed
    with pytest.raises(ValueError, match="closed"):
        _generate(model, ids, 2, engine="fused", decode_session=session)
    with DecodeSession(_gpt(), rows=1) as other, pytest.raises(ValueError, match="another model"):
        _generate(model, ids, 2, engine="fused", decode_session=other)
    _assert_unchanged(model, before)


def test_weights_changed_mid_stream_are_used(used: list[int]) -> None:
    """Copies made at the start of a stream are ignored once their weights change: the stream
    continues exactly like the modules'."""
    model = _gpt()
    reference = _gpt()
    ids = torch.randint(0, 50, (1, 5))
    with DecodeSession(model, rows=1) as session:
        engine = session.engine
        assert engine is not None
        fused = stream(model, ids, max_new_tokens=3, eos_id=(), decode_session=session)
        eager = stream(reference, ids, max_new_tokens=3, eos_id=(), engine="eager")
        next(fused)
        next(eager)
        assert engine.head is not None and engine.head.is_current()
        with torch.no_grad():
            for m in (model, reference):  # an optimizer step between two tokens
                m.lm_head.weight.mul_(-1.0)
                m.layers[0].ffn.up_proj.weight.add_(0.5)
                m.layers[1].self_attn.k_proj.weight.mul_(2.0)
        stale = {id(engine.head), id(engine.steps[0].ffn["up_proj"]), id(engine.steps[1].qkv)}
        assert {id(c) for c in engine.copies() if not c.is_current()} == stale
        used.clear()
        for a, b in zip(fused, eager, strict=True):
            torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=1e-5)
            assert torch.equal(a.tokens, b.tokens)
        assert used and not stale & set(used)  # the current copies ran, the stale never


@pytest.mark.parametrize("fmt", [None, "int8"])
def test_modules_replaced_mid_stream_are_used(fmt: str | None, made: _Made) -> None:
    """A projection, the LM head or a whole layer swapped in the model between two tokens: the
    engine (whose copies, plans and steps read the old modules) gives way to the model's own
    modules, and the stream continues exactly like the modules'."""
    from attnlab.transforms import quantize

    model, reference = _gpt(), _gpt()
    if fmt is not None:
        model, reference = quantize(model, fmt), quantize(reference, fmt)
    ids = torch.randint(0, 50, (1, 5))
    fused = stream(model, ids, max_new_tokens=4, eos_id=(), engine="fused")
    eager = stream(reference, ids, max_new_tokens=4, eos_id=(), engine="eager")
    next(fused)
    next(eager)
    assert len(made.engines) == 1 and made.alive()
    torch.manual_seed(3)
    swapped = {
        "lm_head": nn.Linear(32, 50, bias=False),
        "layers.0.self_attn.q_proj": nn.Linear(32, 32),
        "layers.1.ffn.up_proj": nn.Linear(32, 64),
    }
    for m in (model, reference):
        for name, new in swapped.items():
            parent, _, attr = name.rpartition(".")
            setattr(m.get_submodule(parent) if parent else m, attr, copy.deepcopy(new))
    for a, b in zip(fused, eager, strict=True):
        torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=1e-5)
        assert torch.equal(a.tokens, b.tokens)
    assert made.alive() == []
    # a held session's engine gives way too (and frees its copies at once)
    with DecodeSession(model, rows=1) as session:
        engine = session.engine
        assert engine is not None and engine.copies()
        model.layers[1] = copy.deepcopy(reference.layers[0])
        reference.layers[1] = copy.deepcopy(reference.layers[0])
        got = _generate(model, ids, 4, decode_session=session)
        assert engine.closed and engine.copies() == []
    assert torch.equal(got, _generate(reference, ids, 4, engine="eager"))


def test_generate_few_rows_equals_many_rows() -> None:
    """Rows decoded in a small batch get the tokens they get in a big one."""
    model = _gpt()
    ids = torch.randint(0, 50, (MAX_ROWS + 1, 6))
    few = _generate(model, ids[:MAX_ROWS], 16, engine="fused")
    many = _generate(model, ids, 16, engine="fused")
    assert torch.equal(few, many[:MAX_ROWS])


@pytest.mark.parametrize(
    "overrides", [{}, {"n_kv_heads": 2, "pos_encoding": "rope", "activation": "swiglu"}]
)
def test_every_engine_gives_the_eager_tokens(overrides: dict[str, object], made: _Made) -> None:
    model = _gpt(**overrides)
    ids = torch.randint(0, 50, (2, 5))
    n = MIN_FUSED_TOKENS
    eager = _generate(model, ids, n, engine="eager")
    assert made.engines == []
    assert torch.equal(_generate(model, ids, n, engine="fused"), eager)
    assert len(made.engines) == 1
    assert resolve_engine(model, "auto", rows=2, max_new_tokens=n).name == "fused"
    assert torch.equal(_generate(model, ids, n), eager)  # auto: fused here
    assert len(made.engines) == 2
    mask = torch.tensor([[False, True, True, True, True], [True] * 5])  # left padding
    assert torch.equal(
        _generate(model, ids, 8, engine="fused", attention_mask=mask),
        _generate(model, ids, 8, engine="eager", attention_mask=mask),
    )


@pytest.mark.parametrize("where", ["global", "head", "out_proj"])
def test_hooks_see_every_call_they_see_on_the_modules(where: str, made: _Made) -> None:
    """A forward hook (global, on the LM head, on a projection with a copy) sees the same
    module calls, in the same order, whatever the engine: a hooked module is never skipped."""
    model = _gpt()
    ids = torch.randint(0, 50, (1, 5))
    names = {m: name for name, m in model.named_modules()}

    def run(engine: str) -> tuple[list[tuple[str, tuple[int, ...]]], torch.Tensor]:
        seen: list[tuple[str, tuple[int, ...]]] = []

        def hook(m: nn.Module, args: Any, out: Any) -> None:
            seen.append((names[m], tuple(out.shape) if torch.is_tensor(out) else ()))

        if where == "global":
            handle = torch_module.register_module_forward_hook(hook)
        elif where == "head":
            handle = model.lm_head.register_forward_hook(hook)
        else:
            handle = model.layers[1].self_attn.out_proj.register_forward_hook(hook)
        try:
            return seen, _generate(model, ids, 4, engine=engine)
        finally:
            handle.remove()

    eager_seen, eager_tokens = run("eager")
    fused_seen, fused_tokens = run("fused")
    assert len(made.engines) == 1
    assert fused_seen == eager_seen
    hooked = "layers.1.self_attn.out_proj" if where == "out_proj" else "lm_head"
    assert sum(name == hooked for name, _ in eager_seen) == 4  # the prompt and 3 steps
    assert torch.equal(fused_tokens, eager_tokens)


# -- which engine runs ----------------------------------------------------------------------------


def test_resolve_engine_for_a_causal_lm() -> None:
    model = _gpt()
    choose = resolve_engine
    assert choose(model, "eager", rows=1, max_new_tokens=99).name == "eager"
    assert choose(model, "fused", rows=1, max_new_tokens=1).name == "fused"
    no_cache = choose(model, "fused", rows=1, max_new_tokens=99, use_cache=False)
    assert no_cache.name == "eager" and "use_cache=False" in no_cache.reason
    few = choose(model, "auto", rows=1, max_new_tokens=MIN_FUSED_TOKENS - 1)
    assert few.name == "eager" and f"< {MIN_FUSED_TOKENS}" in few.reason
    auto = choose(model, "auto", rows=1, max_new_tokens=MIN_FUSED_TOKENS)
    assert (auto.name, auto.requested) == ("fused", "auto") and "fused" in auto.describe()
    assert choose(model, "auto", rows=1, max_new_tokens=99, use_cache=False).name == "eager"
    with pytest.raises(ValueError, match="unknown decode engine 'turbo'"):
        choose(model, "turbo", rows=1, max_new_tokens=4)
    with torch.device("meta"):
        meta = GPT(model.config)
    with pytest.raises(ValueError, match="not on the CPU"):
        choose(meta, "fused", rows=1, max_new_tokens=4)
    assert choose(meta, "auto", rows=1, max_new_tokens=99).name == "eager"


@pytest.mark.parametrize("preset", ["transformer-tiny", "mamba-tiny"])
def test_fused_refuses_models_without_a_decoder_stack(preset: str, made: _Made) -> None:
    """An encoder-decoder or a recurrent LM: "fused" refuses, naming why; "auto" runs eager."""
    torch.manual_seed(0)
    model = attnlab.build_model(preset).eval()
    name = type(model).__name__
    ids = torch.randint(3, 40, (1, 5))
    why = f"{name} declares no decoder stack"
    with pytest.raises(ValueError, match=f"engine='fused' cannot run this model: {why}"):
        resolve_engine(model, "fused", rows=1, max_new_tokens=32)
    with pytest.raises(ValueError, match=why):
        _generate(model, ids, 3, engine="fused")
    with pytest.raises(ValueError, match=f"{name} declares none"):
        FusedDecoder(model, rows=1)
    with pytest.raises(ValueError, match=f"a decode session needs the fused engine: {why}"):
        DecodeSession(model)
    choice = resolve_engine(model, "auto", rows=1, max_new_tokens=32)
    assert choice.name == "eager" and choice.reason.startswith(f"auto: {why}")
    assert not decode_engine.gains(model, 1) and decode_engine.supports(model) is not None
    assert torch.equal(_generate(model, ids, 32), _generate(model, ids, 32, engine="eager"))
    assert made.engines == []
    assert engine_copy_numel(model) == 0


def test_the_old_entry_points_are_deprecated_no_ops() -> None:
    model = _gpt()
    before = _snapshot(model)
    with (
        pytest.warns(DeprecationWarning, match="decode_layout is deprecated"),
        decode_layout(model, rows=1),
    ):
        assert not any("forward" in m.__dict__ for m in model.modules())
    with pytest.warns(DeprecationWarning, match="release_copies is deprecated"):
        release_copies(model)
    with pytest.warns(DeprecationWarning, match="active_copy is deprecated"):
        assert active_copy(model.lm_head) is None
    _assert_unchanged(model, before)
    import attnlab.transforms.woq_kernels as old_kernels

    with pytest.warns(DeprecationWarning, match="moved to attnlab.kernels.available"):
        assert old_kernels.available is wk.available


# -- quantized models: joined q/k/v, the decode-attention kernel -------------------------------


_needs_kernels = pytest.mark.skipif(
    not wk.available(), reason="attnlab's int8/int4 CPU kernels are not built here"
)


@_needs_kernels
@pytest.mark.parametrize(("fmt", "options"), [("int8", {}), ("int4", {"group_size": 16})])
@pytest.mark.parametrize("bias", [True, False])
def test_quantized_qkv_are_joined_and_decode_bit_for_bit(
    fmt: str, options: dict[str, int], bias: bool, used: list[int]
) -> None:
    """A quantized model's q/k/v are one kernel call in the engine; the logits and the greedy
    tokens are bitwise those of the three separate layers."""
    from attnlab.transforms import quantize

    model = quantize(_gpt(bias=bias), fmt, **options)  # type: ignore[arg-type]
    ids = torch.randint(0, 50, (2, 7))
    before = _snapshot(model)
    with torch.inference_mode():
        expected = _prompt_logits(model, model, ids)
        with FusedDecoder(model, rows=2) as engine:
            joined = engine.steps[0].qkv
            attn = model.layers[0].self_attn
            assert isinstance(joined, QuantizedStack) and joined.is_current()
            assert joined.sources == (attn.q_proj, attn.k_proj, attn.v_proj)
            assert joined.layer.out_features == 3 * 32 and type(joined.layer).__name__ in (
                "Int8Linear",
                "Int4Linear",
            )
            assert engine.steps[0].kernel_attention and engine.steps[0].plan is not None
            got = _prompt_logits(engine, model, ids)  # the prompt: the Python step
            assert {id(s.qkv) for s in engine.steps} <= set(used)
    assert torch.equal(got, expected)
    _assert_unchanged(model, before)
    eager = _generate(model, ids, 6, engine="eager")
    assert torch.equal(_generate(model, ids, 6, engine="fused"), eager)
    assert torch.equal(_generate(model, ids, 6), eager)  # auto (fused: q/k/v to join)
    assert resolve_engine(model, "auto", rows=2, max_new_tokens=16).name == "fused"
    _assert_unchanged(model, before)


@_needs_kernels
@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_quantized_decoders_attend_with_attnlab_kernel(
    n_kv_heads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine runs a quantized decoder's one-query self-attention steps on attnlab's
    decode-attention kernel (sdpa for the prompt, and whenever a mask is given); the model's
    backend is never replaced; the greedy tokens equal those of the modules and the step logits
    agree to 1e-4 (float32 products in another order)."""
    from attnlab.transforms import quantize

    model = quantize(_gpt(n_kv_heads=n_kv_heads), "int8")
    attn = model.layers[0].self_attn
    calls: list[tuple[int, ...]] = []
    kernel = wk.decode_attention

    def counting(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(k.shape))
        return kernel(q, k, v)

    monkeypatch.setattr(wk, "decode_attention", counting)
    # the Python step (the fused C++ layer step calls the kernel itself: test_decode_layer.py)
    monkeypatch.setattr(decode_engine, "layer_plan", lambda *args: None)
    ids = torch.randint(0, 50, (2, 7))
    with FusedDecoder(model, rows=2) as engine:
        assert all(s.kernel_attention and s.plan is None for s in engine.steps)
        assert engine.cpp is None
        with torch.inference_mode():
            _prompt_logits(engine, model, ids)  # the prompt: seven queries, sdpa
        assert calls == []
    assert attn.backend is sdpa_attention  # never replaced
    got = _generate(model, ids, 6, engine="fused")
    # 5 one-query steps (the first token comes from the prompt's pass), 2 layers each
    assert len(calls) == 10 and calls[0] == (2, n_kv_heads, 8, 8) and calls[-1][2] == 12
    plain = _generate(model, ids, 6, engine="eager")
    assert len(calls) == 10  # the modules: sdpa
    assert torch.equal(got, plain)

    with torch.inference_mode():
        expected, expected_tokens = _step_logits(model, model, ids, 4)
        with FusedDecoder(model, rows=2) as engine:
            kernel_logits, tokens = _step_logits(engine, model, ids, 4)
    torch.testing.assert_close(kernel_logits, expected, atol=1e-4, rtol=0)
    assert torch.equal(tokens, expected_tokens)
    assert len(calls) == 10 + 8  # the 4 steps, 2 layers each
    calls.clear()
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[0, :3] = False  # left padding: every step carries a mask, so sdpa runs
    masked = _generate(model, ids, 3, engine="fused", attention_mask=mask)
    assert calls == []
    assert torch.equal(masked, _generate(model, ids, 3, engine="eager", attention_mask=mask))


@_needs_kernels
def test_a_stale_quantized_join_is_never_used(used: list[int]) -> None:
    from attnlab.transforms import quantize

    model = quantize(_gpt(), "int8")
    attn = model.layers[0].self_attn
    ids = torch.randint(0, 50, (1, 5))
    with torch.inference_mode(), FusedDecoder(model, rows=1) as engine:
        first = engine.steps[0].qkv
        assert first is not None and first.is_current()
        with torch.no_grad():
            attn.k_proj.scales.mul_(2.0)  # the source changed in place
        assert not first.is_current()
        used.clear()
        got = _prompt_logits(engine, model, ids)
        assert id(first) not in used and id(engine.steps[1].qkv) in used
        expected = _prompt_logits(model, model, ids)
        with FusedDecoder(model, rows=1) as fresh:  # a new engine joins the current numbers
            joined = fresh.steps[0].qkv
            assert joined is not None and joined.is_current()
            again = _prompt_logits(fresh, model, ids)
    assert torch.equal(got, expected) and torch.equal(again, expected)


def test_stack_quantized_refuses_mixed_formats() -> None:
    from attnlab.transforms.quant_modules import Int4Linear, Int8Linear, stack_quantized

    a = Int8Linear.from_linear(torch.nn.Linear(32, 8), activation_dtype="float32")
    b = Int4Linear.from_linear(torch.nn.Linear(32, 8), group_size=16, activation_dtype="float32")
    with pytest.raises(ValueError, match="one format"):
        stack_quantized([a, b])
    with pytest.raises(ValueError, match="one format"):
        stack_quantized([])


# -- which library decodes large weights -----------------------------------------------------------


@pytest.mark.parametrize(
    ("vendor", "setting", "library"),
    [
        ("GenuineIntel", "auto", "mkl"),
        ("AuthenticAMD", "auto", "onednn"),
        ("", "", "onednn"),
        ("GenuineIntel", "onednn", "onednn"),
        ("AuthenticAMD", "MKL", "mkl"),
    ],
)
def test_large_weights_follow_the_cpu(
    vendor: str, setting: str, library: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large weights are decoded by MKL from the parameters themselves on Intel CPUs and from
    reordered oneDNN copies elsewhere (ATTNLAB_DECODE_LIBRARY decides by hand); the logits are
    those of the modules either way, to float rounding."""
    _all_large(monkeypatch)
    monkeypatch.setattr(layout_module, "_cpu_vendor", lambda: vendor)
    monkeypatch.setenv(layout_module.LIBRARY_VARIABLE, setting)
    assert layout_module.large_weight_library() == library
    model = _gpt()
    ids = torch.randint(0, 50, (1, 6))
    with torch.inference_mode():
        expected = _prompt_logits(model, model, ids)
        with FusedDecoder(model, rows=1) as engine:
            copied = engine.head
            assert (engine.copies() == []) == (library == "mkl")
            got = _prompt_logits(engine, model, ids)
    assert (copied is not None and copied.reordered) == (library == "onednn")
    assert (copied is None) == (library == "mkl")
    assert decode_engine.gains(model, 1) == (library == "onednn")
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_a_bad_library_setting_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(layout_module.LIBRARY_VARIABLE, "cublas")
    with pytest.raises(ValueError, match="ATTNLAB_DECODE_LIBRARY='cublas': expected"):
        layout_module.large_weight_library()
