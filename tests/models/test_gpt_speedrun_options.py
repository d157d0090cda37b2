"""The speedrun's architecture options of the GPT family (issue 51): QK-norm, ReLU², logit
soft-capping, zero-initialised output projections, value embeddings and the x0 skip.

Each is off by default; each, on, keeps the invariants every GPT keeps: KV-cache decoding equals
the full forward, cached and uncached greedy generation agree, the fused engine gives the eager
tokens (or is refused by name), the closed-form parameter count equals the model's, the model
directory round-trips, and a Hugging Face export carries the option or refuses it by name.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attnlab
from attnlab import GPT, GPTConfig, build_model, count_params
from attnlab.analysis.params import param_breakdown
from attnlab.generation.engines import DecodeSession, resolve_engine
from attnlab.interop import save_hf
from attnlab.interop.family import UnsupportedCheckpointError
from attnlab.layers.feedforward import FeedForward
from attnlab.layers.multihead import MultiHeadAttention
from attnlab.layers.norm import RMSNorm
from attnlab.layers.positional import RotaryEmbedding
from attnlab.layers.softcap import SoftCappedLinear, soft_cap
from attnlab.models.family import find_family
from attnlab.transforms import decode_engine
from attnlab.transforms.decode_engine import FusedDecoder
from testkit import run_cli, word_corpus

V = 61
TINY = GPTConfig(
    vocab_size=V, d_model=32, n_heads=4, n_layers=4, d_ff=64, dropout=0.0, max_seq_len=48,
    eos_id=None,
)  # fmt: skip
SPEEDRUN = {  # all of them, with RoPE, RMSNorm and GQA as the speedrun's model has
    "qk_norm": True, "activation": "relu2", "logit_softcap": 5.0, "zero_init_proj": True,
    "value_embeddings": 2, "x0_skip": True, "pos_encoding": "rope", "norm": "rmsnorm",
    "bias": False, "n_kv_heads": 2, "tie_output": False,
}  # fmt: skip
OPTIONS = {
    "qk_norm": {"qk_norm": True, "pos_encoding": "rope"},
    "relu2": {"activation": "relu2"},
    "softcap": {"logit_softcap": 2.0},
    "zero_init": {"zero_init_proj": True},
    "value_embeddings": {"value_embeddings": 2, "n_kv_heads": 2},
    "x0_skip": {"x0_skip": True, "embed_norm": True},
    "speedrun": SPEEDRUN,
}


def _model(overrides: dict[str, object], *, randomise: bool = True) -> GPT:
    """A tiny GPT with ``overrides``; ``randomise``: large random weights everywhere (scalars
    and norm gains included), so that every option changes the logits and no greedy choice is
    a near-tie."""
    torch.manual_seed(0)
    model = GPT(dataclasses.replace(TINY, **overrides)).eval()  # type: ignore[arg-type]
    if randomise:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0.0, 0.2)
                else:
                    p.uniform_(0.5, 1.5)
    return model


def _ids(B: int = 2, T: int = 11, seed: int = 1) -> torch.Tensor:
    return torch.randint(V, (B, T), generator=torch.Generator().manual_seed(seed))


def _generate(model: nn.Module, ids: torch.Tensor, n: int, **options: object) -> torch.Tensor:
    return attnlab.generate(model, ids, max_new_tokens=n, eos_id=(), **options)  # type: ignore[arg-type]


# -- off by default ---------------------------------------------------------------------------


def test_every_option_is_off_by_default() -> None:
    c = GPTConfig()
    assert (c.qk_norm, c.logit_softcap, c.zero_init_proj, c.value_embeddings, c.x0_skip) == (
        False, None, False, 0, False,
    )  # fmt: skip
    model = _model({}, randomise=False)
    assert type(model.lm_head) is nn.Linear
    assert model.value_embeds is None and model.x0_lambdas is None
    assert all(layer.self_attn.q_norm is None for layer in model.layers)
    keys = set(model.state_dict())
    assert not {k for k in keys if "norm" in k and "self_attn." in k}
    assert not {k for k in keys if "value" in k or "x0" in k}
    for preset in ("gpt2-small", "llama2-7b", "gpt-char-baby", "mixtral-8x7b"):
        p = attnlab.PRESETS[preset]
        assert not (p.qk_norm or p.logit_softcap or p.zero_init_proj or p.value_embeddings
                    or p.x0_skip)  # fmt: skip


# -- the KV-cache invariant, for each option ------------------------------------------------


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_cached_decoding_equals_the_full_forward(option: str) -> None:
    model = _model(OPTIONS[option])
    ids = _ids(2, 11)
    with torch.no_grad():
        full, _ = model(ids)
        cache = model.new_cache(16)
        steps = [model(ids[:, :4], cache=cache)[0]]
        for t in range(4, 11):
            steps.append(model(ids[:, t : t + 1], cache=cache)[0])
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_greedy_generation_with_and_without_cache(option: str) -> None:
    model = _model(OPTIONS[option])
    ids = _ids(2, 5)
    cached = _generate(model, ids, 8, engine="eager")
    assert torch.equal(_generate(model, ids, 8, use_cache=False), cached)


# -- what each option computes ----------------------------------------------------------------


def test_qk_norm_normalises_q_and_k_per_head_before_rope() -> None:
    """The attention equals a hand-written one: RMSNorm (with its gain) over each head's q and
    k, then RoPE, then causal softmax attention; in cross-attention too."""
    torch.manual_seed(0)
    H, D, E = 4, 8, 32
    rope = RotaryEmbedding(D, max_seq_len=32)
    mha = MultiHeadAttention(E, H, rotary=rope, q_norm=RMSNorm(D), k_norm=RMSNorm(D)).eval()
    with torch.no_grad():
        mha.q_norm.weight.uniform_(0.5, 1.5)  # type: ignore[union-attr]
        mha.k_norm.weight.uniform_(0.5, 1.5)  # type: ignore[union-attr]
    x = torch.randn(2, 7, E)

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.view(2, -1, H, D).transpose(1, 2)  # (B, H, T, D)

    def rms(t: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    pos = torch.arange(7)
    q = rope.rotate(rms(heads(mha.q_proj(x)), mha.q_norm.weight), pos)  # type: ignore[union-attr]
    k = rope.rotate(rms(heads(mha.k_proj(x)), mha.k_norm.weight), pos)  # type: ignore[union-attr]
    a = F.scaled_dot_product_attention(q, k, heads(mha.v_proj(x)), is_causal=True)
    expected = mha.out_proj(a.transpose(1, 2).reshape(2, 7, E))
    with torch.no_grad():
        got, _ = mha(x, is_causal=True)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
        cross = MultiHeadAttention(E, H, bias=False, q_norm=RMSNorm(D), k_norm=RMSNorm(D))
        memory = torch.randn(2, 5, E) * 50  # k's norm makes the scores independent of its scale
        _, w = cross(x, memory, need_weights=True)
        _, w_small = cross(x, memory / 50, need_weights=True)
    torch.testing.assert_close(w, w_small, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="both q_norm and k_norm"):
        MultiHeadAttention(E, H, q_norm=RMSNorm(D))


def test_relu2_is_the_squared_relu() -> None:
    torch.manual_seed(0)
    ffn = FeedForward(16, 32, activation="relu2")
    x = torch.randn(3, 5, 16)
    expected = ffn.down_proj(F.relu(ffn.up_proj(x)) ** 2)
    torch.testing.assert_close(ffn(x), expected, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="relu2"):  # the error lists it among the valid ones
        GPTConfig(activation="relu3")


def test_softcap_bounds_every_logit_everywhere() -> None:
    """The head is capped for every caller of ``lm_head`` (forward, the fused engine); its
    parameter is still ``lm_head.weight``, tied to the embedding by default."""
    model = _model({"logit_softcap": 2.0})
    assert isinstance(model.lm_head, SoftCappedLinear)
    assert model.lm_head.weight is model.tok_embed.weight
    assert {k for k in model.state_dict() if k.startswith("lm_head")} == {"lm_head.weight"}
    ids = _ids(2, 9)
    with torch.no_grad():
        h = model.hidden_states(ids)
        raw = F.linear(h, model.lm_head.weight)
        logits, _ = model(ids)
        assert raw.abs().max() > 3  # the cap matters for these weights
        torch.testing.assert_close(logits, 2.0 * torch.tanh(raw / 2.0), rtol=0, atol=1e-6)
        assert logits.abs().max() < 2.0
        with FusedDecoder(model, rows=2) as engine:
            torch.testing.assert_close(engine.lm_head(h), logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(soft_cap(torch.tensor([0.0, 1e6]), 3.0), torch.tensor([0.0, 3.0]))
    readout = find_family(model).hooks(model).readout  # type: ignore[union-attr]
    assert readout is not None and not readout.linear  # no direct logit attribution
    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(ValueError, match="logit_softcap"):
            GPTConfig(logit_softcap=bad)


def test_zero_init_proj_starts_every_layer_as_the_identity() -> None:
    """out_proj and down_proj weights are zero; every other tensor is what the same seed gives
    without the option; the hidden states are the final norm of the embeddings."""
    plain = _model({}, randomise=False)
    zero = _model({"zero_init_proj": True}, randomise=False)
    for (name, a), (_, b) in zip(
        plain.state_dict().items(), zero.state_dict().items(), strict=True
    ):
        if name.endswith(("out_proj.weight", "down_proj.weight")):
            assert not b.any() and a.any(), name
        else:
            assert torch.equal(a, b), name
    ids = _ids(2, 6)
    with torch.no_grad():
        x = zero.embed(ids, torch.arange(6))
        torch.testing.assert_close(zero.hidden_states(ids), zero.final_norm(x))  # type: ignore[misc]


def test_value_embeddings_layout_and_mixing() -> None:
    """Table j serves layers j and n_layers - N + j; ``v = a·v + b·ve`` (a, b learned): with
    ``(a, b) = (1, 0)`` the model is the one without value embeddings."""
    c = dataclasses.replace(TINY, n_layers=6, value_embeddings=2)
    assert c.value_embedding_layers == {0: 0, 1: 1, 4: 0, 5: 1}
    model = _model({"value_embeddings": 2, "n_kv_heads": 2})  # n_layers 4: layers 0,1 and 2,3
    assert model.config.value_embedding_layers == {0: 0, 1: 1, 2: 0, 3: 1}
    assert [t.weight.shape for t in model.value_embeds] == [(V, 16)] * 2  # type: ignore[union-attr]
    assert all(layer.self_attn.value_lambdas is not None for layer in model.layers)
    plain = GPT(dataclasses.replace(model.config, value_embeddings=0)).eval()
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    assert not missing and all("value" in k for k in unexpected)
    ids = _ids(2, 8)
    with torch.no_grad():
        mixed, _ = model(ids)
        for layer in model.layers:
            layer.self_attn.value_lambdas.copy_(torch.tensor([1.0, 0.0]))  # type: ignore[union-attr]
        torch.testing.assert_close(model(ids)[0], plain(ids)[0], rtol=0, atol=1e-6)
        assert (mixed - plain(ids)[0]).abs().max() > 1e-3
    for n in (-1, 3):
        with pytest.raises(ValueError, match="value_embeddings"):
            dataclasses.replace(TINY, value_embeddings=n)
    layer = model.layers[0].self_attn
    with pytest.raises(ValueError, match="value embedding"):
        layer(torch.randn(1, 3, 32))  # a value layer needs its rows


def test_x0_skip_mixes_the_embedding_into_every_layer_input() -> None:
    model = _model({"x0_skip": True})
    assert model.x0_lambdas is not None and model.x0_lambdas.shape == (4, 2)
    fresh = _model({"x0_skip": True}, randomise=False)
    assert torch.equal(fresh.x0_lambdas, torch.tensor([[1.0, 0.0]] * 4))  # type: ignore[arg-type]
    plain = GPT(dataclasses.replace(model.config, x0_skip=False)).eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if k != "x0_lambdas"})
    ids = _ids(2, 8)
    with torch.no_grad():
        skipped, _ = model(ids)
        assert (skipped - plain(ids)[0]).abs().max() > 1e-3
        model.x0_lambdas.copy_(torch.tensor([[1.0, 0.0]] * 4))
        torch.testing.assert_close(model(ids)[0], plain(ids)[0], rtol=0, atol=1e-6)
        # (a, b) = (0, 1) in the last layer: its input is x0 itself
        model.x0_lambdas[3] = torch.tensor([0.0, 1.0])
        x0 = model.embed(ids, torch.arange(8))
        last = model.final_norm(model.layers[3](x0, is_causal=True))  # type: ignore[misc]
        torch.testing.assert_close(model.hidden_states(ids), last, rtol=0, atol=1e-6)
    # scalars: no weight decay, and not a Muon matrix
    from attnlab.training.optim import classify_parameters

    assert classify_parameters(model)["x0_lambdas"] == "bias"


# -- the decode engines ----------------------------------------------------------------------


@pytest.mark.parametrize("option", ["qk_norm", "relu2", "softcap"])
def test_the_fused_engine_gives_the_eager_tokens(
    option: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """QK-norm, ReLU² and a soft-capped head run on the engine's own (Python) step, which
    computes what the modules do."""
    model = _model({**OPTIONS[option], "n_kv_heads": 2})
    calls: list[int] = []
    step = decode_engine._LayerStep.python_step

    def counted(self: decode_engine._LayerStep, *args: object) -> torch.Tensor:
        calls.append(1)
        return step(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(decode_engine._LayerStep, "python_step", counted)
    ids = _ids(2, 5)
    eager = _generate(model, ids, 12, engine="eager")
    assert calls == []
    assert torch.equal(_generate(model, ids, 12, engine="fused"), eager)
    assert len(calls) >= 12 * TINY.n_layers  # the engine's step ran, not the layer modules


@pytest.mark.skipif(not attnlab.kernels.available(), reason="attnlab's kernels are not built")
def test_quantized_qk_norm_layers_never_take_the_cpp_step() -> None:
    """The C++ layer step has no QK-norm: a quantized model with it runs the Python step and
    gives the eager tokens."""
    from attnlab.transforms import quantize

    model = quantize(_model({"qk_norm": True, "pos_encoding": "rope", "bias": False}), "int8")
    with FusedDecoder(model, rows=2) as engine:
        assert all(s.plan is None for s in engine.steps) and engine.cpp is None
    ids = _ids(2, 5)
    assert torch.equal(
        _generate(model, ids, 8, engine="fused"), _generate(model, ids, 8, engine="eager")
    )


@pytest.mark.parametrize(
    ("option", "named"), [("value_embeddings", "value_embeddings=2"), ("x0_skip", "x0_skip")]
)
def test_engines_refuse_what_only_the_forward_computes(option: str, named: str) -> None:
    model = _model(OPTIONS[option])
    why = decode_engine.supports(model)
    assert why is not None and named in why
    choice = resolve_engine(model, "auto", rows=2, max_new_tokens=64)
    assert choice.name == "eager" and named in choice.reason
    with pytest.raises(ValueError, match=named):
        resolve_engine(model, "fused", rows=2, max_new_tokens=64)
    with pytest.raises(ValueError, match=named):
        DecodeSession(model)
    with pytest.raises(ValueError, match=named):
        FusedDecoder(model, rows=1)
    assert attnlab.generation.engines.engine_copy_numel(model) == 0


def test_a_soft_capped_head_is_never_quantized_silently() -> None:
    from attnlab.transforms import quantize

    with pytest.raises(ValueError, match="soft-capping"):
        quantize(_model({"logit_softcap": 2.0}), "int8", include_lm_head=True)
    model = quantize(_model({"logit_softcap": 2.0}), "int8")  # the head stays float, capped
    assert isinstance(model.lm_head, SoftCappedLinear)
    with torch.no_grad():
        assert model(_ids(2, 6))[0].abs().max() < 2.0


# -- parameter counts, checkpoints, export, the command line ----------------------------------


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_closed_form_parameter_count(option: str) -> None:
    config = dataclasses.replace(TINY, **OPTIONS[option])  # type: ignore[arg-type]
    model = build_model(config, device="meta")
    measured = sum(p.numel() for p in model.parameters())
    assert count_params(config) == count_params(model) == measured
    assert count_params(config, exclude_embeddings=True) == count_params(
        model, exclude_embeddings=True
    )
    parts = param_breakdown(config).components
    if config.value_embeddings:
        assert parts["embedding.value"] == 2 * V * 16
    if config.x0_skip:
        assert parts["x0_lambdas"] == 2 * config.n_layers


def test_qk_norm_on_other_stacks() -> None:
    """``qk_norm`` is a field of every stack: the encoder-decoder gets it in self- and
    cross-attention, its count matches, and cached greedy decoding equals uncached."""
    config = dataclasses.replace(attnlab.PRESETS["transformer-tiny"], qk_norm=True, dropout=0.0)
    model = build_model(config).eval()
    attns = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert len(attns) == 3 * config.n_layers and all(a.q_norm is not None for a in attns)
    assert count_params(config) == sum(p.numel() for p in model.parameters())
    src = torch.randint(3, config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    assert torch.equal(
        _generate(model, src, 8, use_cache=True), _generate(model, src, 8, use_cache=False)
    )
    vit = dataclasses.replace(attnlab.PRESETS["vit-digits"], qk_norm=True)
    assert count_params(vit) == sum(p.numel() for p in build_model(vit, device="meta").parameters())


def test_model_directory_round_trip(tmp_path: Path) -> None:
    model = _model(SPEEDRUN)
    attnlab.save_pretrained(model, tmp_path / "m")
    loaded = attnlab.from_pretrained(tmp_path / "m")
    assert loaded.config == model.config
    ids = _ids(2, 9)
    with torch.no_grad():
        assert torch.equal(loaded(ids)[0], model(ids)[0])


@pytest.mark.parametrize(
    ("option", "named"),
    [
        ("qk_norm", "qk_norm=True"),
        ("softcap", "logit_softcap=2.0"),
        ("value_embeddings", "value_embeddings=2"),
        ("x0_skip", "x0_skip=True"),
    ],
)
def test_hugging_face_export_refuses_what_it_cannot_carry(
    option: str, named: str, tmp_path: Path
) -> None:
    with pytest.raises(UnsupportedCheckpointError, match=named):
        save_hf(_model(OPTIONS[option]), tmp_path)
    assert not any(tmp_path.iterdir())  # nothing written


def test_hugging_face_export_carries_relu2_and_zero_init(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    model = _model({"activation": "relu2", "zero_init_proj": True})
    save_hf(model, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert hf.config.activation_function == "relu2"
    ids = _ids(2, 12)
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids)[0], rtol=0, atol=5e-5)
    back = attnlab.from_pretrained(tmp_path)
    assert back.config.activation == "relu2"


def test_the_command_line_sets_every_option(tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    text.write_text(word_corpus(60), encoding="utf-8")
    out = tmp_path / "run"
    code, _, err = run_cli([
        "train", "shakespeare-char", f"--data={text}", "--d-model=16", "--n-heads=2",
        "--n-layers=2", "--d-ff=32", "--max-seq-len=16", "--batch-size=2", "--eval-batches=1",
        "--steps=1", "--no-progress", "--qk-norm", "--activation=relu2", "--logit-softcap=30",
        "--zero-init-proj", "--value-embeddings=1", "--x0-skip", "--out", str(out),
    ])  # fmt: skip
    assert code == 0, err
    from attnlab.training.recipes import load_run

    c = load_run(out).model.config
    assert (c.qk_norm, c.activation, c.logit_softcap, c.zero_init_proj, c.value_embeddings,
            c.x0_skip) == (True, "relu2", 30.0, True, 1, True)  # fmt: skip
    code, _, err = run_cli(["train", "shakespeare-char", f"--data={text}", "--n-layers=2",
                            "--value-embeddings=2", "--steps=1",
                            "--out", str(tmp_path / "x")])  # fmt: skip
    assert code != 0 and "value-embeddings" in err.replace("_", "-")
