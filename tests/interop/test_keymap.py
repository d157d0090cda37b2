"""Key-map checks on loading: every missing, unexpected or misshapen tensor is reported by its
checkpoint key with the expected shape, and nothing is left silently at its initialisation."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import attnlab
from attnlab import GPT, GPTConfig
from attnlab.interop import CheckpointMismatchError, KeyMap, save_hf
from attnlab.interop.keymap import Entry, check_coverage, load_into, params, same

CFG = GPTConfig(
    vocab_size=50, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=16, eos_id=None
)


@pytest.fixture
def gpt2_dir(tmp_path: Path, tools: Any) -> Path:
    model = GPT(CFG).eval()
    tools.randomise(model)
    save_hf(model, tmp_path)
    return tmp_path


def edit(directory: Path, **changes: torch.Tensor | None) -> None:
    """Replace (tensor) or delete (None) checkpoint tensors; ``__`` in a name means ``.``."""
    tensors = load_file(directory / "model.safetensors")
    for key, value in changes.items():
        name = key.replace("__", ".")
        if value is None:
            del tensors[name]
        else:
            tensors[name] = value
    save_file(tensors, directory / "model.safetensors")


def test_every_missing_tensor_is_named_with_its_shape(gpt2_dir: Path) -> None:
    edit(gpt2_dir, transformer__h__1__ln_2__bias=None, transformer__wpe__weight=None)
    with pytest.raises(CheckpointMismatchError) as err:
        attnlab.from_pretrained(gpt2_dir)
    message = str(err.value)
    assert "missing tensors (2)" in message
    assert "h.1.ln_2.bias (expected shape [32])" in message
    assert "wpe.weight (expected shape [16, 32])" in message


def test_unexpected_and_misshapen_tensors(gpt2_dir: Path) -> None:
    edit(
        gpt2_dir,
        transformer__h__0__attn__c_attn__weight=torch.zeros(32, 32),
        score__weight=torch.zeros(3, 32),
    )
    with pytest.raises(CheckpointMismatchError) as err:
        attnlab.from_pretrained(gpt2_dir)
    message = str(err.value)
    assert "h.0.attn.c_attn.weight: shape [32, 32], expected [32, 96]" in message
    assert "unexpected tensors (1; an unsupported head or option?): score.weight" in message


def test_untied_copy_of_a_tied_weight(gpt2_dir: Path) -> None:
    edit(gpt2_dir, lm_head__weight=torch.zeros(50, 32))
    with pytest.raises(CheckpointMismatchError, match=r"lm_head\.weight differs from wte"):
        attnlab.from_pretrained(gpt2_dir)


def test_old_buffers_are_ignored(gpt2_dir: Path) -> None:
    """Old GPT-2 checkpoints saved the causal-mask tables ``attn.bias``/``attn.masked_bias``."""
    edit(
        gpt2_dir,
        transformer__h__0__attn__bias=torch.ones(1, 1, 16, 16),
        transformer__h__0__attn__masked_bias=torch.tensor(-1e4),
    )
    attnlab.from_pretrained(gpt2_dir)


def test_non_strict_loading_warns(gpt2_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    edit(gpt2_dir, transformer__ln_f__bias=None)
    with caplog.at_level(logging.WARNING, logger="attnlab.interop.keymap"):
        model = attnlab.from_pretrained(gpt2_dir, strict=False)
    assert "ln_f.bias (expected shape [32])" in caplog.text
    assert "keep their initialisation" in caplog.text
    assert isinstance(model, GPT) and model.final_norm is not None
    assert torch.equal(model.final_norm.bias, torch.zeros(32))  # LayerNorm's initial bias


def test_unprefixed_base_model_checkpoint(gpt2_dir: Path, tools: Any) -> None:
    """``GPT2Model`` checkpoints have no ``transformer.`` prefix."""
    tensors = load_file(gpt2_dir / "model.safetensors")
    save_file(
        {k.removeprefix("transformer."): v for k, v in tensors.items()},
        gpt2_dir / "model.safetensors",
    )
    config = json.loads((gpt2_dir / "config.json").read_text())
    config["architectures"] = ["GPT2Model"]
    (gpt2_dir / "config.json").write_text(json.dumps(config))
    model = attnlab.from_pretrained(gpt2_dir)
    assert isinstance(model, GPT)


def test_an_uncovered_parameter_is_an_error() -> None:
    """A map that forgets a parameter refuses to load instead of leaving it random."""
    model = nn.Sequential(nn.Linear(2, 3), nn.LayerNorm(3))
    keymap = KeyMap(params("0", "dense"))
    with pytest.raises(NotImplementedError, match=r"\['1.weight', '1.bias'\]"):
        check_coverage(model, keymap, "test")


def test_entries_aliases_and_transforms() -> None:
    model = nn.Sequential(nn.Linear(2, 3, bias=False))
    t = Entry(
        ("0.weight",), ("w",), lambda ts: [ts[0].t()], lambda ts: [ts[0].t()], aliases=(("old_w",),)
    )
    weight = torch.arange(6.0).reshape(2, 3)  # stored transposed
    load_into(model, KeyMap([t]), {"old_w": weight}, what="test")
    assert torch.equal(model[0].weight, weight.t())
    assert KeyMap([t]).to_theirs(model.state_dict())["w"].shape == (2, 3)
    # A primary key wins over its alias; the alias is then unexpected.
    with pytest.raises(CheckpointMismatchError, match=r"unexpected tensors .*old_w"):
        load_into(model, KeyMap([t]), {"w": weight, "old_w": weight}, what="test")
    assert same("a", "b", "c").aliases == (("c",),)


def test_old_bert_layer_norm_names(tmp_path: Path, tools: Any) -> None:
    """The first BERT checkpoints named LayerNorm parameters gamma/beta."""
    model = attnlab.build_model("bert-tiny", vocab_size=110, max_seq_len=16)
    tools.randomise(model)
    save_hf(model, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    renamed = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        ): v
        for k, v in tensors.items()
    }
    assert renamed.keys() != tensors.keys()
    save_file(renamed, tmp_path / "model.safetensors")
    tools.assert_same_state(model, attnlab.from_pretrained(tmp_path))
