"""Mamba <-> Hugging Face ``MambaForCausalLM`` (its pure-PyTorch path: no mamba-ssm kernels on
this CPU): logits at <= 1e-5 for several random configurations, identical greedy tokens,
save_hf directories that transformers loads, and the options that cannot be expressed."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import attnlab
from attnlab.interop import UnsupportedCheckpointError, save_hf
from attnlab.models import MambaLM

pytestmark = pytest.mark.usefixtures("one_thread")

V = 97
CONFIGS = {
    "default": {},
    "biases-untied": {"use_bias": True, "tie_word_embeddings": False, "time_step_rank": 5},
    "no-conv-bias": {"use_conv_bias": False, "conv_kernel": 2, "state_size": 4, "expand": 3},
    "wide-state": {"state_size": 16, "num_hidden_layers": 3, "layer_norm_epsilon": 1e-6},
}


def hf_mamba(t: ModuleType, tools: Any, **kw: Any) -> Any:
    cfg = t.MambaConfig(
        **{
            "vocab_size": V,
            "hidden_size": 32,
            "state_size": 8,
            "num_hidden_layers": 2,
            "conv_kernel": 4,
            "expand": 2,
            "bos_token_id": 0,
            "eos_token_id": 0,
            "pad_token_id": 0,
            **kw,
        }
    )
    hf = t.MambaForCausalLM(cfg).eval()
    tools.randomise(hf, std=0.2)
    with torch.no_grad():  # keep the S4D-real A (decays in (0, 1)), randomise around it
        for layer in hf.backbone.layers:
            n = torch.arange(1.0, cfg.state_size + 1)
            layer.mixer.A_log.copy_(torch.log(n).expand_as(layer.mixer.A_log))
    return hf


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_and_greedy_match_transformers(
    transformers: ModuleType, tools: Any, tmp_path: Path, name: str
) -> None:
    hf = hf_mamba(transformers, tools, **CONFIGS[name])
    model = attnlab.from_pretrained(tools.save(hf, tmp_path))
    assert isinstance(model, MambaLM) and not model.training
    ids = tools.ids(3, 40, V)
    with torch.no_grad():
        ref = hf(ids).logits
        logits, _ = model(ids)
        hidden = model.hidden_states(ids)
        ref_hidden = hf(ids, output_hidden_states=True).hidden_states[-1]
    assert tools.max_diff(logits, ref) <= tools.ATOL
    assert tools.max_diff(hidden, ref_hidden) <= tools.ATOL
    prompt = ids[:, :8]
    ours = attnlab.generate(model, prompt, max_new_tokens=24, eos_id=())
    assert torch.equal(ours, tools.greedy_hf(hf, prompt, 24))


def test_save_hf_round_trip(transformers: ModuleType, tools: Any, tmp_path: Path) -> None:
    hf = hf_mamba(transformers, tools, use_bias=True)
    model = attnlab.from_pretrained(tools.save(hf, tmp_path / "hf"))
    out = save_hf(model, tmp_path / "ours")
    data = json.loads((out / "config.json").read_text())
    assert data["architectures"] == ["MambaForCausalLM"] and data["time_step_rank"] == 2
    back = transformers.MambaForCausalLM.from_pretrained(out).eval()
    ids = tools.ids(2, 17, V)
    with torch.no_grad():
        assert tools.max_diff(back(ids).logits, hf(ids).logits) == 0.0
    tools.assert_same_state(attnlab.from_pretrained(out), model)
    # an attnlab-built model (attnlab's init) also exports, and transformers agrees with it
    mine = attnlab.build_model("mamba-tiny").eval()
    back = transformers.MambaForCausalLM.from_pretrained(save_hf(mine, tmp_path / "tiny")).eval()
    ids = tools.ids(2, 9, 256)
    with torch.no_grad():
        assert tools.max_diff(back(ids).logits, mine(ids)[0]) <= tools.ATOL


def test_older_embedding_name_and_unsupported_options(
    transformers: ModuleType, tools: Any, tmp_path: Path
) -> None:
    hf = hf_mamba(transformers, tools)
    directory = tools.save(hf, tmp_path)
    weights = load_file(directory / "model.safetensors")
    renamed = {k.replace("embeddings.", "embedding."): v for k, v in weights.items()}
    save_file(renamed, directory / "model.safetensors", {"format": "pt"})
    model = attnlab.from_pretrained(directory)
    ids = tools.ids(1, 12, V)
    with torch.no_grad():
        assert tools.max_diff(model(ids)[0], hf(ids).logits) <= tools.ATOL
    config = json.loads((directory / "config.json").read_text())
    for key, value, message in (
        ("hidden_act", "gelu", "hidden_act='gelu' is not supported"),
        ("intermediate_size", 50, "intermediate_size=50"),
    ):
        (directory / "config.json").write_text(json.dumps({**config, key: value}))
        with pytest.raises(UnsupportedCheckpointError, match=message):
            attnlab.from_pretrained(directory)
