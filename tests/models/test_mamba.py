"""MambaLM: config validation, stateful decoding == the full forward, generate (padded batches,
beams, samples, no context limit), the two scans' agreement in training, and the closed forms
(parameters, FLOPs against FlopCounterMode, state bytes)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import attnlab
from attnlab import PRESETS, build_model, count_params
from attnlab.analysis import decode_state_bytes, forward_flops, scan_elementwise_flops
from attnlab.analysis.recurrent import (
    decode_flops_per_token,
    recurrent_state_bytes,
    state_crossover,
)
from attnlab.config import config_to_dict
from attnlab.models import MambaConfig, MambaLM, config_from_json_dict

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = MambaConfig(vocab_size=61, d_model=16, n_layers=2, d_state=4, dt_rank=3)


def tiny(seed: int = 0, **overrides: Any) -> MambaLM:
    torch.manual_seed(seed)
    model = MambaLM(dataclasses.replace(TINY, **overrides)).eval()
    with torch.no_grad():  # larger weights than the init, so that every part shows
        for name, p in model.named_parameters():
            if "A_log" not in name:
                p.add_(torch.randn_like(p) * 0.2)
    return model


def ids_for(B: int = 3, T: int = 20, V: int = 61, seed: int = 1) -> torch.Tensor:
    return torch.randint(V, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        ({"d_model": 16.0}, TypeError, "d_model must be an integer"),
        ({"d_state": 0}, ValueError, "d_state must be positive"),
        ({"expand": -1}, ValueError, "expand must be positive"),
        ({"dt_rank": 0}, ValueError, "dt_rank must be 'auto' or a positive integer"),
        ({"dt_rank": "full"}, ValueError, r"dt_rank='full' is not valid; choose one of \['auto'\]"),
        ({"scan": "fast"}, ValueError, r"scan='fast' is not valid; choose one of"),
        ({"norm_eps": float("nan")}, ValueError, "norm_eps must be a finite number"),
        ({"dt_min": 0.5}, ValueError, "dt_min=0.5 is larger than dt_max=0.1"),
        ({"tie_output": "yes"}, TypeError, "tie_output must be true or false"),
        ({"eos_id": 61}, ValueError, r"eos_id=61 is outside the vocabulary \[0, 61\)"),
    ],
)
def test_config_validation(overrides: dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        dataclasses.replace(TINY, **overrides)


def test_config_json_round_trip_and_derived_sizes() -> None:
    data = config_to_dict(TINY)
    assert data["model_type"] == "mamba" and config_from_json_dict(data) == TINY
    with pytest.raises(ValueError, match="unknown MambaConfig keys"):
        config_from_json_dict({**data, "n_heads": 4})
    c = PRESETS["mamba-130m"]
    assert (c.d_inner, c.dt_rank_value) == (1536, 48)  # ceil(768 / 16)
    assert TINY.dt_rank_value == 3


def test_presets_parameter_counts() -> None:
    # state-spaces/mamba-130m-hf has 129,135,360 parameters (tied head).
    assert count_params(PRESETS["mamba-130m"]) == 129_135_360
    baby, gpt = PRESETS["mamba-char-baby"], PRESETS["gpt-char-baby"]
    assert abs(count_params(baby) / count_params(gpt) - 1) < 0.03
    assert count_params(PRESETS["mamba-tiny"]) == count_params(build_model("mamba-tiny"))


@pytest.mark.parametrize(
    "overrides", [{}, {"bias": True, "conv_bias": False, "tie_output": False}, {"d_conv": 1}]
)
def test_closed_forms_match_the_built_model(overrides: dict[str, Any]) -> None:
    model = tiny(**overrides)
    c = model.config
    for exclude in (False, True):
        assert count_params(c, exclude_embeddings=exclude) == count_params(
            model, exclude_embeddings=exclude
        )
    ids = ids_for(2, 12)
    flops = forward_flops(c, 12, batch=2)
    with FlopCounterMode(display=False) as counter:
        model(ids)
    assert counter.get_total_flops() == flops.forward  # every matmul, the conv, the read-out
    with FlopCounterMode(display=False) as counter:
        model(ids)[0].sum().backward()
    counts = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    # FlopCounterMode's depthwise-conv backward ignores the groups (it counts E times the input
    # gradient), so the training count is compared on the matrix products.
    conv = flops.by_component()["layers.mixer.conv1d"]
    products = sum(counts.get(k, 0) for k in ("aten.mm", "aten.addmm", "aten.bmm"))
    assert products == flops.training - 3 * conv


def test_scan_elementwise_flops() -> None:
    c = TINY
    E, N, L = c.d_inner, c.d_state, c.n_layers
    seq = scan_elementwise_flops(c, 10, batch=2, scan="sequential")
    assert seq == 2 * L * 10 * (3 * E * N + 3 * E + 2 * E * N)
    par = scan_elementwise_flops(c, 1024, scan="parallel")
    per_token_recurrence = par / (L * 1024 * E * N) - (3 * E * N + 3 * E) / (E * N)
    assert 4.9 < per_token_recurrence < 5.01  # recursive doubling: ~2.5x the loop's 2EN
    with pytest.raises(ValueError, match="scan="):
        scan_elementwise_flops(c, 10, scan="cumsum")


def test_state_bytes_are_constant_and_match_the_state() -> None:
    model = tiny()
    state = model.new_state(3)
    assert state.nbytes() == recurrent_state_bytes(model.config, batch=3)
    model(ids_for(3, 50), state=state)
    assert state.nbytes() == recurrent_state_bytes(model.config, batch=3)  # same after 50 tokens
    c = model.config
    assert decode_state_bytes(c, 128) == decode_state_bytes(c, 8192)
    gpt = PRESETS["gpt-char-baby"]
    assert decode_state_bytes(gpt, 8192) == 64 * decode_state_bytes(gpt, 128)
    n = state_crossover(PRESETS["mamba-char-baby"], gpt)
    assert decode_state_bytes(gpt, n) > decode_state_bytes(PRESETS["mamba-char-baby"], n)
    assert decode_state_bytes(gpt, n - 1) <= decode_state_bytes(PRESETS["mamba-char-baby"], n)
    assert decode_flops_per_token(c, 10) == decode_flops_per_token(c, 10_000)
    assert decode_flops_per_token(gpt, 1000) > decode_flops_per_token(gpt, 10)
    with pytest.raises(ValueError, match="has no max_seq_len: pass seq_len"):
        forward_flops(c)


@pytest.mark.parametrize("scan", ["parallel", "sequential"])
@torch.no_grad()
def test_stateful_decoding_equals_full_forward(scan: str) -> None:
    model = tiny(scan=scan, bias=True)
    ids = ids_for(3, 24)
    full, _ = model(ids)
    state = model.new_state(3)
    parts = [model(ids[:, :10], state=state)[0]]
    parts += [model(ids[:, t : t + 1], state=state)[0] for t in range(10, 24)]
    assert (torch.cat(parts, 1) - full).abs().max() <= 1e-5


def test_scans_agree_in_training() -> None:
    ids = ids_for(2, 33)
    grads = {}
    for scan in ("parallel", "sequential"):
        model = tiny(scan=scan).train()
        _, loss = model(ids[:, :-1], targets=ids[:, 1:])
        assert loss is not None
        loss.backward()
        grads[scan] = (loss.item(), {n: p.grad for n, p in model.named_parameters()})
    assert abs(grads["parallel"][0] - grads["sequential"][0]) <= 1e-6
    for name, g in grads["parallel"][1].items():
        ref = grads["sequential"][1][name]
        assert g is not None and ref is not None
        assert (g - ref).abs().max() <= 1e-5 * max(1.0, ref.abs().max().item()), name


@torch.no_grad()
def test_generate_padded_batch_beams_and_samples() -> None:
    model = tiny(bias=True)  # an in_proj bias: padding would leak into a masked convolution
    prompts = [ids_for(1, n, seed=n)[0] for n in (6, 11, 1, 11)]
    out = attnlab.generate(model, prompts, max_new_tokens=10, eos_id=())
    alone = [attnlab.generate(model, p, max_new_tokens=10, eos_id=()) for p in prompts]
    assert torch.equal(out, torch.cat(alone))
    assert torch.equal(out, attnlab.generate(model, prompts, max_new_tokens=10, use_cache=False))
    beams = dict(max_new_tokens=6, num_beams=3, num_return_sequences=2, eos_id=())
    assert torch.equal(
        attnlab.generate(model, prompts, **beams),
        attnlab.generate(model, prompts, **beams, use_cache=False),
    )
    sampled = attnlab.generate(
        model, prompts, max_new_tokens=5, do_sample=True, num_return_sequences=3,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    assert sampled.shape == (12, 5)


def test_generation_has_no_context_limit() -> None:
    model = tiny()
    out = attnlab.generate(model, ids_for(1, 300), max_new_tokens=400, eos_id=())
    assert out.shape == (1, 400)
    with pytest.raises(ValueError, match="ids must be"):
        model(ids_for(1, 5)[0])
    with pytest.raises(ValueError, match="state holds 2 rows"):
        model(ids_for(3, 5), state=model.new_state(2))


def test_attnlab_checkpoint_round_trip(tmp_path: Path) -> None:
    model = tiny(tie_output=False)
    back = attnlab.from_pretrained(attnlab.save_pretrained(model, tmp_path))
    assert isinstance(back, MambaLM) and back.config == model.config
    pairs = zip(model.state_dict().values(), back.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
