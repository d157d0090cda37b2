"""The family contract: a family declared entirely in this file, without editing any library
file, gets every upper floor (issue 48): ``build_model``, ``save_pretrained`` /
``from_pretrained``, ``generate`` (greedy, sampled, both engines), ``inspect.run_with_cache``,
``analyze``'s parameter count equal to the built model's, and the explorer's JSON.

What a new family needs is exactly what this file holds: a config, a module, presets and the
declaration handed to ``register_family`` (docs/architecture.md, "Adding a family")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torch import Tensor, nn

import attnlab
from attnlab.analysis import analyze, count_params
from attnlab.explore import Explorer
from attnlab.generation.session import DecoderOnlySession
from attnlab.inspect import hook_names, run_with_cache
from attnlab.layers.embedding import TokenEmbedding, tie_weights
from attnlab.layers.kv_cache import KVCache
from attnlab.layers.positional import LearnedPositionalEmbedding
from attnlab.models import PRESETS, build_model
from attnlab.models.base import GenerationMixin, PretrainedModel
from attnlab.models.common import StackConfig, decoder_layer, example_ids, final_norm, token_loss
from attnlab.models.costs import (
    FP32,
    INDEX_BYTES,
    Costs,
    MatmulTerm,
    ParamBreakdown,
    activation_result,
    norm_elems,
    norm_params,
    stack_activations,
    stack_params,
    stack_terms,
)
from attnlab.models.family import (
    DecoderStack,
    ExplorerSpec,
    Family,
    HookLayout,
    HookStack,
    Kind,
    Readout,
    family_of,
    registered,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# -- the family: models/toy.py, were it a library file -----------------------------------------


@dataclass(frozen=True, kw_only=True)
class ToyConfig(StackConfig):
    """A small decoder-only LM: learned positions, pre-norm decoder layers, a tied head."""

    model_type: ClassVar[str] = "toy-lm"

    vocab_size: int = 40
    max_seq_len: int = 32
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 64
    dropout: float = 0.0
    norm_position: str = "pre"  # type: ignore[assignment]
    activation: str = "gelu"
    pos_encoding: str = "learned"
    eos_id: int | None = None
    pad_id: int | None = None
    bos_id: int | None = None


class ToyLM(GenerationMixin, PretrainedModel):
    """Embedding + learned positions, N decoder layers, final norm, tied LM head."""

    def __init__(self, config: ToyConfig) -> None:
        super().__init__()
        c = self.config = config
        self.tok_embed = TokenEmbedding(c.vocab_size, c.d_model, scale=False)
        self.pos_encoding = LearnedPositionalEmbedding(c.d_model, c.max_seq_len)
        self.layers = nn.ModuleList(
            decoder_layer(c, i, None, cross_attention=False) for i in range(c.n_layers)
        )
        self.final_norm = final_norm(c)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        tie_weights(self.lm_head, self.tok_embed)

    def embed(self, ids: Tensor, positions: Tensor) -> Tensor:
        return self.pos_encoding.embed(self.tok_embed(ids), positions)  # (B, T, E)

    def new_cache(self, max_len: int | None = None, *, rollback: int = 0) -> KVCache:
        c = self.config
        return KVCache(c.n_layers, max_len or c.max_seq_len, rollback=rollback)

    def hidden_states(
        self,
        ids: Tensor,
        *,
        mask: Tensor | None = None,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        T = ids.shape[1]
        offset = cache.seq_len if cache is not None else 0
        index = torch.arange(offset, offset + T, device=ids.device)  # (T,)
        pos = index if positions is None else positions
        attn_mask = None if mask is None else mask[:, None, None, :].bool()  # (B, 1, 1, S)
        x = self.embed(ids, pos)
        for i, layer in enumerate(self.layers):
            layer_cache = cache.layer(i)[0] if cache is not None else None
            x = layer(x, mask=attn_mask, is_causal=True, positions=pos, cache=layer_cache)
        return self.final_norm(x) if self.final_norm is not None else x

    def forward(
        self, ids: Tensor, *, targets: Tensor | None = None, cache: KVCache | None = None
    ) -> tuple[Tensor, Tensor | None]:
        logits = self.lm_head(self.hidden_states(ids, cache=cache))  # (B, T, V)
        loss = None if targets is None else token_loss(logits, targets, ids)
        return logits, loss


def _params(c: ToyConfig) -> ParamBreakdown:
    comp = {"embedding.token": c.vocab_size * c.d_model}
    comp["embedding.position"] = c.max_seq_len * c.d_model
    comp.update(stack_params("layers", c, c.n_layers))
    comp["final_norm"] = norm_params(c.d_model, c.norm, c.bias)
    comp["lm_head"] = 0  # tied to the token table
    return ParamBreakdown(comp, {"layers": c.n_layers}, {"lm_head": "embedding.token"})


def _flops(c: ToyConfig, B: int, n: int, src: int | None) -> tuple[list[MatmulTerm], int]:
    terms, softmax = stack_terms("layers", c, batch=B, n=n, n_layers=c.n_layers)
    return [*terms, MatmulTerm("lm_head", B * n, c.d_model, c.vocab_size)], softmax


def _activations(
    c: ToyConfig, *, batch: int, seq_len: int, src_len: int | None, a: int, every: int
) -> dict[str, int]:
    t = batch * seq_len
    act, fp32, scores = stack_activations(c, B=batch, T=seq_len, n_layers=c.n_layers,
                                          masked=True, every=every)  # fmt: skip
    outside = 2 * t * INDEX_BYTES + (2 * t * c.d_model + norm_elems(c, t)) * a
    return activation_result(act, fp32, scores, outside + t * c.vocab_size * FP32, a)


def _hooks(m: ToyLM) -> HookLayout:
    stack = HookStack("", (("embed.token", m.tok_embed),), m.pos_encoding, m.layers, m.final_norm)
    return HookLayout(
        (stack,), head=m.lm_head, readout=Readout("", m.layers, m.final_norm, m.lm_head)
    )


def _decoder_stack(m: ToyLM) -> DecoderStack:
    return DecoderStack(
        embed=m.embed, token_embedding=m.tok_embed, positions=m.pos_encoding,
        embed_modules=(m.tok_embed, m.pos_encoding), layers=m.layers, final_norm=m.final_norm,
        head=m.lm_head, max_positions=m.config.max_seq_len,
    )  # fmt: skip


def _example_inputs(
    c: ToyConfig, *, batch: int = 1, seq_len: int | None = None, src_len: int | None = None,
    generator: torch.Generator,
) -> tuple[tuple[Tensor, ...], dict[str, Tensor]]:  # fmt: skip
    return (example_ids(c.vocab_size, batch, seq_len or c.max_seq_len, generator),), {}


TOY = Family(
    name="toy-lm",
    config=ToyConfig,
    model=ToyLM,
    kind=Kind.CAUSAL_LM,
    presets={"toy-lm-tiny": ToyConfig()},
    description="a causal LM declared in a test",
    hooks=_hooks,
    costs=Costs(params=_params, flops=_flops, activations=_activations),
    decode_stack=_decoder_stack,
    example_inputs=_example_inputs,
    explorer=ExplorerSpec(),
)


# -- the test -----------------------------------------------------------------------------------


@pytest.fixture
def toy() -> Iterator[Family]:
    with registered(TOY) as family:
        yield family
    assert "toy-lm-tiny" not in PRESETS  # gone again: nothing else sees the test's family


def _peaked(model: ToyLM) -> ToyLM:
    """Large weights: peaked next-token distributions (no near-ties between engines)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    return model.eval()


def test_a_family_declared_outside_the_library_gets_every_floor(
    toy: Family, tmp_path: Path
) -> None:
    # models: presets, build_model, the family of a model and of a config
    model = _peaked(build_model("toy-lm-tiny"))
    assert isinstance(model, ToyLM) and family_of(model) is toy is family_of(model.config)
    assert isinstance(build_model(ToyConfig(n_layers=1)), ToyLM)
    # checkpoints: attnlab's format, through the free functions and the class method
    attnlab.save_pretrained(model, tmp_path / "m")
    again = ToyLM.from_pretrained(tmp_path / "m")
    loaded = attnlab.from_pretrained(tmp_path / "m")
    for other in (again, loaded):
        assert other.config == model.config
        for a, b in zip(model.state_dict().values(), other.state_dict().values(), strict=True):
            assert torch.equal(a, b)
    # generation: greedy is the arg-max of a full recompute at every step; both engines agree
    prompt = torch.tensor([[3, 7, 11, 5]])
    greedy = model.generate(prompt, max_new_tokens=10, eos_id=())
    ids = prompt
    with torch.no_grad():
        for _ in range(10):
            ids = torch.cat([ids, model(ids)[0][:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(greedy, ids[:, 4:])
    for engine in ("eager", "fused"):
        out = attnlab.generate(model, prompt, max_new_tokens=10, eos_id=(), engine=engine)
        assert torch.equal(out, greedy), engine
    g = torch.Generator().manual_seed(1)
    sampled = attnlab.generate(model, [[3, 7], [5]], max_new_tokens=6, do_sample=True,
                               temperature=1.5, generator=g)  # fmt: skip
    assert sampled.shape == (2, 6) and int(sampled.max()) < 40
    # inspect: every hook point, the attention weights a forward computes
    assert "layers.1.attn.weights" in hook_names(model) and "logits" in hook_names(model)
    _, cache = run_with_cache(model, prompt, names="layers.*.attn.weights")
    assert cache["layers.0.attn.weights"].shape == (1, 4, 4, 4)
    torch.testing.assert_close(cache["layers.0.attn.weights"].sum(-1), torch.ones(1, 4, 4))
    # analysis: the declared closed form counts what the module holds
    assert analyze(model.config).params.total == count_params(model) == count_params(ToyConfig())
    assert analyze(model).params_measured == count_params(model)
    # the explorer: the JSON the page draws, with the causal LM's views
    explorer = Explorer(model, None, name="toy")
    info = explorer.info()
    assert info["family"] == "toy-lm" and info["kind"] == "causal-lm" and info["language_model"]
    view = json.loads(json.dumps(explorer.analyze(ids=[3, 7, 11, 5])))
    assert view["attention"]["shape"] == [2, 4, 4, 4] and view["next"] and view["lens"]
    assert json.loads(json.dumps(explorer.neuron([3, 7, 11, 5], 1, 2, 3, 1)))["weight"] >= 0


def test_an_unregistered_family_is_refused_clearly(toy: Family) -> None:
    with pytest.raises(ValueError, match="already belong to a family"), registered(toy):
        pass
    with pytest.raises(TypeError, match=r"Linear belongs to no attnlab model family"):
        family_of(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="unknown preset 'toy-lm-big'"):
        build_model("toy-lm-big")


@dataclass(frozen=True, kw_only=True)
class StepCountingConfig(ToyConfig):
    model_type: ClassVar[str] = "toy-lm-counted"


class StepCountingLM(ToyLM):
    """The toy LM under another family, whose declaration brings its own generation session."""


def test_a_family_may_bring_its_own_generation_session() -> None:
    opened: list[tuple[int, int]] = []

    def session(model: nn.Module, prompts: Any, max_new_tokens: int, use_cache: bool,
                **options: Any) -> DecoderOnlySession:  # fmt: skip
        opened.append((prompts.batch_size, max_new_tokens))
        return DecoderOnlySession(model, prompts, max_new_tokens, use_cache, **options)

    counted = Family(
        name="toy-lm-counted", config=StepCountingConfig, model=StepCountingLM,
        kind=Kind.CAUSAL_LM, hooks=_hooks, decode_stack=_decoder_stack, session=session,
    )  # fmt: skip
    with registered(counted):
        model = _peaked(StepCountingLM(StepCountingConfig()))
        out = attnlab.generate(model, [[3, 7], [5, 9, 11]], max_new_tokens=5, eos_id=())
        beams = attnlab.generate(model, [[3, 7]], max_new_tokens=4, num_beams=3, eos_id=())
    assert opened == [(2, 5), (1, 4)] and out.shape == (2, 5) and beams.shape == (1, 4)
    with registered(TOY):  # the same weights under the standard session: the same tokens
        plain = ToyLM(ToyConfig())
        plain.load_state_dict(model.state_dict())
        assert torch.equal(attnlab.generate(plain.eval(), [[3, 7], [5, 9, 11]], max_new_tokens=5,
                                            eos_id=()), out)  # fmt: skip


def test_the_family_is_gone_after_the_block() -> None:
    with registered(TOY):
        assert "toy-lm-tiny" in PRESETS
    with pytest.raises(ValueError, match="unknown preset 'toy-lm-tiny'"):
        build_model("toy-lm-tiny")
    with pytest.raises(TypeError, match="ToyLM belongs to no attnlab model family"):
        attnlab.generate(ToyLM(ToyConfig()), [[1, 2]], max_new_tokens=2)


# -- the library's own declarations -----------------------------------------------------------


def _smallest(family: Family) -> object:
    """The family's smallest preset (by its closed-form count), else its config's defaults."""
    if not family.presets:
        return family.config()
    if family.costs is None:
        return next(iter(family.presets.values()))
    return min(family.presets.values(), key=count_params)


@pytest.mark.parametrize("name", sorted(f.name for f in attnlab.models.families()))
def test_every_library_family_declares_a_consistent_contract(name: str) -> None:
    """Each family's declaration agrees with its model: the class offers ``generate`` exactly
    when the kind generates, the example inputs run a forward, the closed form counts the
    built parameters, the hook layout names real submodules, the decoder stack its layers."""
    family = family_of(name)
    config = _smallest(family)
    model = build_model(config).eval()
    assert family_of(model) is family and isinstance(model, PretrainedModel)
    assert isinstance(model, GenerationMixin) == family.kind.generates
    if family.costs is not None:
        assert count_params(config) == count_params(model)
    if family.example_inputs is not None:
        short = 8 if family.kind.reads_text else None
        args, kwargs = family.example_inputs(
            config, batch=2, seq_len=short, generator=torch.Generator().manual_seed(0)
        )
        with torch.no_grad():
            model(*args, **kwargs)
    if family.hooks is not None:
        modules = {id(m) for m in model.modules()}
        layout = family.hooks(model)
        for stack in layout.stacks:
            assert all(id(m) in modules for _, m in stack.inputs)
            assert all(id(layer) in modules for layer in stack.layers)
        assert hook_names(model)
    if family.decode_stack is not None:
        stack = family.decode_stack(model)
        assert stack is not None and len(stack.layers) == model.config.n_layers
