"""``from_pretrained`` / ``save_pretrained`` / ``save_hf`` without transformers.

attnlab's own format round-trips bitwise for every model type; every Hugging Face family
round-trips bitwise through ``save_hf`` -> ``from_pretrained``; the weights readers (sharded
safetensors, ``pytorch_model.bin`` with ``weights_only=True``) and the format detection work.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import attnlab
from attnlab import GPT, BERTConfig, GPTConfig, TransformerConfig, ViTConfig, build_model
from attnlab.interop import save_hf

TINY = {
    "gpt": GPTConfig(
        vocab_size=50, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=16, eos_id=None
    ),
    "llama": GPTConfig(
        vocab_size=50,
        d_model=32,
        n_heads=4,
        n_kv_heads=2,
        n_layers=2,
        d_ff=48,
        max_seq_len=16,
        norm="rmsnorm",
        activation="swiglu",
        pos_encoding="rope",
        bias=False,
        tie_output=False,
        dropout=0.0,
        eos_id=None,
    ),
    "bloom": GPTConfig(
        vocab_size=50,
        d_model=32,
        n_heads=4,
        n_layers=2,
        d_ff=128,
        max_seq_len=2048,
        pos_encoding="alibi",
        embed_norm=True,
        eos_id=None,
    ),
    "bert": BERTConfig(vocab_size=110, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=16),
    "vit": ViTConfig(
        image_size=8, patch_size=4, n_classes=3, d_model=32, n_heads=4, n_layers=2, d_ff=64
    ),
    "transformer": TransformerConfig(
        vocab_size=50, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=16, output_bias=True
    ),
}


def tiny(name: str, tools: Any) -> nn.Module:
    model = build_model(TINY[name]).eval()
    tools.randomise(model)
    return model


@pytest.mark.parametrize("name", ["gpt", "bert", "vit", "transformer"])
def test_own_format_is_bitwise(name: str, tools: Any, tmp_path: Path) -> None:
    model = tiny(name, tools)
    assert model.save_pretrained(tmp_path) == tmp_path  # type: ignore[operator]
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == name
    again = attnlab.from_pretrained(tmp_path)
    assert type(again) is type(model) and again.config == model.config  # type: ignore[union-attr]
    assert not again.training
    tools.assert_same_state(model, again)
    attnlab.save_pretrained(again, tmp_path / "again")
    tools.assert_same_state(model, attnlab.from_pretrained(tmp_path / "again"))


@pytest.mark.parametrize("name", ["gpt", "llama", "bloom", "bert", "vit", "transformer"])
def test_hugging_face_format_round_trip_is_bitwise(name: str, tools: Any, tmp_path: Path) -> None:
    model = tiny(name, tools)
    save_hf(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert "architectures" in config  # a Hugging Face config, not attnlab's
    again = attnlab.from_pretrained(tmp_path)
    # Hugging Face configs spell out what attnlab leaves as None ("same as dropout").
    c = model.config  # type: ignore[union-attr]
    attn_dropout = c.dropout if c.attn_dropout is None else c.attn_dropout
    expected = dataclasses.replace(c, attn_dropout=attn_dropout)
    assert again.config == expected  # type: ignore[union-attr]
    tools.assert_same_state(model, again)


def test_tied_weights_stay_tied(tools: Any, tmp_path: Path) -> None:
    save_hf(tiny("gpt", tools), tmp_path)
    model = attnlab.from_pretrained(tmp_path)
    assert isinstance(model, GPT) and model.lm_head.weight is model.tok_embed.weight


def test_class_method_and_wrong_class(tools: Any, tmp_path: Path) -> None:
    tiny("gpt", tools).save_pretrained(tmp_path)  # type: ignore[operator]
    assert isinstance(GPT.from_pretrained(tmp_path), GPT)
    with pytest.raises(TypeError, match="holds a GPT, not a BERT"):
        attnlab.BERT.from_pretrained(tmp_path)


def test_dtype_and_device(tools: Any, tmp_path: Path) -> None:
    save_hf(tiny("llama", tools), tmp_path)
    model = attnlab.from_pretrained(tmp_path, dtype=torch.bfloat16, device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_sharded_safetensors(tools: Any, tmp_path: Path) -> None:
    model = tiny("bert", tools)
    save_hf(model, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    keys = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": keys[::2],
        "model-00002-of-00002.safetensors": keys[1::2],
    }
    weight_map = {}
    for file, names in shards.items():
        save_file({k: tensors[k] for k in names}, tmp_path / file)
        weight_map.update(dict.fromkeys(names, file))
    index = {"metadata": {}, "weight_map": weight_map}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    tools.assert_same_state(model, attnlab.from_pretrained(tmp_path))


def test_pytorch_bin_is_read_with_weights_only(tools: Any, tmp_path: Path) -> None:
    model = tiny("bert", tools)
    save_hf(model, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    torch.save(tensors, tmp_path / "pytorch_model.bin")
    tools.assert_same_state(model, attnlab.from_pretrained(tmp_path))
    # A pickle that would run code on loading is refused, not executed.
    torch.save({"x": _Evil(tmp_path / "pwned")}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="weights-only loading refuses"):
        attnlab.from_pretrained(tmp_path)
    assert not (tmp_path / "pwned").exists()


class _Evil:
    """Unpickling this calls ``Path.touch``: code execution, which must not happen."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.target,))


def test_missing_directory_and_config(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        attnlab.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"has no config\.json"):
        attnlab.from_pretrained(tmp_path)


def test_missing_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 8}))
    with pytest.raises(FileNotFoundError, match="no weights"):
        attnlab.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"model_type": "t5", "d_model": 8}, "neither an attnlab model .* nor a supported"),
        ({"hidden_size": 8}, "model_type None"),
        ({"model_type": "gpt", "d_modle": 8}, r"unknown GPTConfig keys \['d_modle'\]"),
    ],
)
def test_unsupported_configs(tmp_path: Path, config: dict[str, Any], message: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file({"x": torch.zeros(1)}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=message):
        attnlab.from_pretrained(tmp_path)


def test_not_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        attnlab.from_pretrained(tmp_path)
