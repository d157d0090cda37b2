"""RNNLM (LSTM and GRU): config validation, cached decoding == the full forward, generate with
padded batches and beams, and the closed forms (parameters, FLOPs, state bytes)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import attnlab
from attnlab import PRESETS, count_params
from attnlab.analysis import forward_flops, recurrent_state_bytes
from attnlab.models import RNNLM, RNNConfig
from attnlab.models.rnn import RNNState

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN"),
]

TINY = RNNConfig(vocab_size=61, d_model=24, n_layers=2)
CELLS = ["lstm", "gru"]


def tiny(cell: str = "lstm", seed: int = 0, **overrides: Any) -> RNNLM:
    torch.manual_seed(seed)
    return RNNLM(dataclasses.replace(TINY, cell=cell, **overrides)).eval()


def ids_for(B: int = 3, T: int = 20, seed: int = 1) -> torch.Tensor:
    return torch.randint(61, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        ({"cell": "rnn"}, ValueError, r"cell='rnn' is not valid; choose one of \['lstm', 'gru'\]"),
        ({"d_model": 0}, ValueError, "d_model must be positive"),
        ({"n_layers": 2.0}, TypeError, "n_layers must be an integer"),
        ({"dropout": 1.0}, ValueError, r"dropout must be in \[0, 1\)"),
        ({"d_hidden": 32}, ValueError, "tie_output needs d_hidden == d_model"),
        ({"pad_id": -1}, ValueError, "pad_id=-1 is outside the vocabulary"),
    ],
)
def test_config_validation(overrides: dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        dataclasses.replace(TINY, **overrides)


def test_presets_match_the_baby_gpt() -> None:
    gpt = count_params(PRESETS["gpt-char-baby"])
    for name in ("lstm-char-baby", "gru-char-baby"):
        assert abs(count_params(PRESETS[name]) / gpt - 1) < 0.01  # closed form == built: below


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("overrides", [{}, {"d_hidden": 40, "tie_output": False, "bias": False}])
def test_closed_forms_match_the_built_model(cell: str, overrides: dict[str, Any]) -> None:
    model = tiny(cell, **overrides)
    for exclude in (False, True):
        assert count_params(model.config, exclude_embeddings=exclude) == count_params(
            model, exclude_embeddings=exclude
        )
    ids = ids_for(2, 9)
    # PyTorch's CPU LSTM is one oneDNN kernel that FlopCounterMode does not see; without
    # oneDNN it runs as matrix products, which it counts.
    with torch.backends.mkldnn.flags(enabled=False), FlopCounterMode(display=False) as counter:
        model(ids)
    assert counter.get_total_flops() == forward_flops(model.config, 9, batch=2).forward


@pytest.mark.parametrize("cell", CELLS)
@torch.no_grad()
def test_cached_decoding_equals_full_forward(cell: str) -> None:
    model = tiny(cell)
    ids = ids_for(3, 25)
    full, _ = model(ids)
    state = model.new_state(3)
    parts = [model(ids[:, :7], state=state)[0]]
    parts += [model(ids[:, t : t + 1], state=state)[0] for t in range(7, 25)]
    assert (torch.cat(parts, 1) - full).abs().max() <= 1e-5
    assert state.nbytes() == recurrent_state_bytes(model.config, batch=3)


@pytest.mark.parametrize("cell", CELLS)
@torch.no_grad()
def test_generate_padded_batch_and_beams(cell: str) -> None:
    model = tiny(cell)
    prompts = [ids_for(1, n, seed=n)[0] for n in (4, 13, 1, 13)]
    out = attnlab.generate(model, prompts, max_new_tokens=9, eos_id=())
    alone = torch.cat([attnlab.generate(model, p, max_new_tokens=9, eos_id=()) for p in prompts])
    assert torch.equal(out, alone)
    assert torch.equal(out, attnlab.generate(model, prompts, max_new_tokens=9, use_cache=False))
    beams = dict(max_new_tokens=5, num_beams=4, num_return_sequences=2, eos_id=())
    assert torch.equal(
        attnlab.generate(model, prompts, **beams),
        attnlab.generate(model, prompts, **beams, use_cache=False),
    )


def test_state_reorder_cat_and_training_loss() -> None:
    h, c = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    state = RNNState(h.clone(), c.clone())
    state.reorder(torch.tensor([1, 1, 0, 2]))
    assert state.batch_size == 4 and torch.equal(state.c[:, 2], c[:, 0])  # type: ignore[index]
    assert RNNState.cat([state, RNNState(h, c)]).batch_size == 7
    assert RNNState.cat([RNNState(h), RNNState(h)]).c is None
    model = tiny("gru", dropout=0.1).train()
    ids = ids_for(2, 12)
    _, loss = model(ids[:, :-1], targets=ids[:, 1:])
    assert loss is not None and torch.isfinite(loss)
    loss.backward()
    with pytest.raises(ValueError, match="targets must match"):
        model(ids, targets=ids[:, 1:])


@pytest.mark.parametrize("cell", CELLS)
def test_attnlab_checkpoint_round_trip(cell: str, tmp_path: Path) -> None:
    model = tiny(cell, d_hidden=20, tie_output=False)
    back = attnlab.from_pretrained(attnlab.save_pretrained(model, tmp_path))
    assert isinstance(back, RNNLM) and back.config == model.config
    pairs = zip(model.state_dict().values(), back.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
