"""A property-based sweep over issue 48's and 49's new surfaces: quantization, the decode engines
and the explorer's requests.

Hypothesis draws small GPT configurations (positions learned, RoPE, ALiBi or none; pre- or
post-norm; LayerNorm or RMSNorm; plain or gated FFNs; multi-head, grouped-query or multi-query
attention; with or without biases), prompts of mixed lengths (left-padded batches) and the
options of each surface. The properties, for every example:

- **quantization** (``test_quantized_models_decode_and_round_trip``): an int8/int4 model (head
  included or not) decodes tokens inside the vocabulary with finite logits, the same tokens with
  and without the KV cache and with either engine, and its model directory loads back to the same
  tokens;
- **decode engines** (``test_engines_give_the_eager_tokens``): greedy decoding with the fused
  engine gives the eager path's tokens (the weights are scaled up so that no two logits are
  near-ties) and its first step's logits within 1e-4, for one prompt and a padded batch;
- **explorer requests** (``test_explorer_requests_are_answered_or_refused``): a random JSON body
  on every API route is answered or refused with a ``ValueError``/``TypeError``/``KeyError`` (a
  4xx: ``explore.server`` maps exactly those), never any other exception, and the model is left
  as it was.

:data:`EXAMPLES` per test in CI, **90** in all (derandomized: the same examples each run; the
count is in docs/validation.md); ``ATTNLAB_PROPERTY_SCALE`` multiplies them with random seeds.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnlab
from attnlab import GPTConfig
from attnlab.explore import Explorer
from attnlab.explore.server import ROUTES
from attnlab.transforms import fitting_group_size, quantize

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

EXAMPLES: dict[str, int] = {
    "test_quantized_models_decode_and_round_trip": 25,
    "test_engines_give_the_eager_tokens": 35,
    "test_explorer_requests_are_answered_or_refused": 30,
}
TOTAL_EXAMPLES = sum(EXAMPLES.values())
SCALE = int(os.environ.get("ATTNLAB_PROPERTY_SCALE", "1"))
VOCAB = 40


def _settings(test: str) -> Any:
    return settings(
        max_examples=EXAMPLES[test] * SCALE, deadline=None, derandomize=SCALE == 1,
        database=None, suppress_health_check=[HealthCheck.too_slow],
    )  # fmt: skip


@st.composite
def configs(draw: Any) -> GPTConfig:
    heads = draw(st.sampled_from([1, 2, 4]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4) if heads % h == 0]))
    return GPTConfig(
        vocab_size=VOCAB, d_model=32, n_heads=heads, n_kv_heads=kv,
        n_layers=draw(st.integers(1, 2)),
        d_ff=draw(st.sampled_from([32, 64])), max_seq_len=24, dropout=0.0, eos_id=None,
        pos_encoding=draw(st.sampled_from(["learned", "rope", "alibi", "none"])),
        norm_position=draw(st.sampled_from(["pre", "post"])),
        norm=draw(st.sampled_from(["layernorm", "rmsnorm"])),
        activation=draw(st.sampled_from(["gelu", "gelu_tanh", "relu", "swiglu", "geglu"])),
        bias=draw(st.booleans()), tie_output=draw(st.booleans()),
    )  # fmt: skip


prompts = st.lists(
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6), min_size=1, max_size=3
)


def _peaked(config: GPTConfig, seed: int) -> attnlab.GPT:
    """A GPT with large weights: peaked next-token distributions, no near-ties."""
    torch.manual_seed(seed)
    model = attnlab.GPT(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.4) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    return model


@_settings("test_quantized_models_decode_and_round_trip")
@given(config=configs(), fmt=st.sampled_from(["int8", "int4"]), head=st.booleans(),
       batch=prompts, seed=st.integers(0, 2**16))  # fmt: skip
def test_quantized_models_decode_and_round_trip(
    config: GPTConfig, fmt: str, head: bool, batch: list[list[int]], seed: int
) -> None:
    model = _peaked(config, seed)
    group = fitting_group_size(model, include_lm_head=head) if fmt == "int4" else None
    q = quantize(model, fmt, include_lm_head=head, group_size=group)
    steps = list(attnlab.generation.stream(q, batch, max_new_tokens=4, eos_id=()))
    out = torch.stack([s.tokens for s in steps], dim=1)
    assert out.shape == (len(batch), 4) and int(out.min()) >= 0 and int(out.max()) < VOCAB
    assert all(bool(torch.isfinite(s.logits).all()) for s in steps)
    for options in ({"use_cache": False}, {"engine": "eager"}, {"engine": "fused"}):
        again = attnlab.generate(q, batch, max_new_tokens=4, eos_id=(), **options)
        assert torch.equal(again, out), options
    with tempfile.TemporaryDirectory() as tmp:  # an example's own directory
        attnlab.save_pretrained(q, Path(tmp) / "q")
        loaded = attnlab.from_pretrained(Path(tmp) / "q")
        assert torch.equal(attnlab.generate(loaded, batch, max_new_tokens=4, eos_id=()), out)


@_settings("test_engines_give_the_eager_tokens")
@given(config=configs(), batch=prompts, seed=st.integers(0, 2**16),
       rows=st.sampled_from([1, 3]))  # fmt: skip
def test_engines_give_the_eager_tokens(
    config: GPTConfig, batch: list[list[int]], seed: int, rows: int
) -> None:
    model = _peaked(config, seed)
    prompts_ = batch[:rows]
    eager = list(attnlab.generation.stream(model, prompts_, max_new_tokens=5, eos_id=(),
                                           engine="eager"))  # fmt: skip
    fused = list(attnlab.generation.stream(model, prompts_, max_new_tokens=5, eos_id=(),
                                           engine="fused"))  # fmt: skip
    torch.testing.assert_close(fused[0].logits, eager[0].logits, atol=1e-4, rtol=1e-4)
    for a, b in zip(eager, fused, strict=True):
        assert torch.equal(a.tokens, b.tokens)


_JSON_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
)  # fmt: skip
_VALUES = st.recursive(
    _JSON_LEAVES, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(max_size=6), inner, max_size=3), max_leaves=8,
)  # fmt: skip
_KEYS = ["text", "ids", "target", "target_ids", "layer", "head", "query", "key", "stack", "n",
         "position", "top", "sample", "seed", "temperature", "top_k", "top_p", "kind",
         "d_model", "length", "n_heads", "num_beams", "max_new_tokens", "image"]  # fmt: skip
bodies = st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=6) | st.fixed_dictionaries(
    {"ids": st.lists(st.integers(-3, VOCAB + 3), min_size=1, max_size=8)},
    optional={k: st.integers(-2, 6) for k in ("layer", "head", "query", "key", "position")},
)


@pytest.fixture(scope="module")
def explorer() -> Explorer:
    torch.manual_seed(0)
    model = attnlab.GPT(GPTConfig(vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=2,
                                  d_ff=32, max_seq_len=16, eos_id=None, dropout=0.0))  # fmt: skip
    return Explorer(model, None, name="tiny")


@_settings("test_explorer_requests_are_answered_or_refused")
@given(route=st.sampled_from(sorted(ROUTES)), body=bodies)
def test_explorer_requests_are_answered_or_refused(
    explorer: Explorer, route: str, body: dict[str, Any]
) -> None:
    before = {k: v.clone() for k, v in explorer.model.state_dict().items()}
    with contextlib.suppress(ValueError, TypeError, KeyError):  # a 4xx (explore.server)
        ROUTES[route](explorer, body)
    after = explorer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_the_example_counts_are_the_documented_ones() -> None:
    assert f"**{TOTAL_EXAMPLES}** in all" in (__doc__ or "")
    doc = Path(__file__).resolve().parents[2] / "docs" / "validation.md"
    text = doc.read_text(encoding="utf-8")
    for test, n in EXAMPLES.items():
        assert f"`{test}` | {n}" in text, f"docs/validation.md: row for {test} with {n} examples"
