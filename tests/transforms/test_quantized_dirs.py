"""Quantized model directories in the house: ``save_pretrained``/``from_pretrained`` round trips,
damaged or edited directories refused before anything is built, memory footprints computed on
``meta`` equal to the measured ones, the int4 group size that fits, and decode copies released."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import attnlab
from attnlab import GPT, GPTConfig
from attnlab.generation.engines import DecodeSession
from attnlab.transforms import (
    copy_numel,
    fitting_group_size,
    quantize,
    quantized_footprint,
    quantized_weight_bytes,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _gpt(d_model: int = 64, d_ff: int = 128, n_layers: int = 2, **kw: Any) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=50, d_model=d_model, n_heads=4, n_layers=n_layers, d_ff=d_ff,
                       max_seq_len=32, dropout=0.0, eos_id=None, **kw)  # fmt: skip
    return GPT(config).eval()


def _logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        return model(ids)[0]


@pytest.mark.parametrize(
    ("fmt", "options"),
    [("int8", {}), ("int4", {"group_size": 32, "include_lm_head": True}),
     ("int8", {"include_lm_head": True, "include_embedding": True})],
)  # fmt: skip
def test_save_pretrained_and_from_pretrained_round_trip(
    tmp_path: Path, fmt: str, options: dict[str, Any]
) -> None:
    model = quantize(_gpt(), fmt, **options)
    attnlab.save_pretrained(model, tmp_path / "q")  # a quantized model writes its own layout
    assert (tmp_path / "q" / "quantization.json").is_file()
    loaded = attnlab.from_pretrained(tmp_path / "q")
    assert loaded.quantization_config == model.quantization_config
    assert torch.equal(_logits(loaded), _logits(model))
    again = GPT.from_pretrained(tmp_path / "q")  # the class method too
    assert torch.equal(_logits(again), _logits(model))
    with pytest.raises(ValueError, match=r"quantized model; dtype=torch\.float16"):
        attnlab.from_pretrained(tmp_path / "q", dtype=torch.float16)
    with pytest.raises(ValueError, match="takes no state_dict"):
        attnlab.save_pretrained(model, tmp_path / "r", state_dict=model.state_dict())


def test_an_edited_config_is_refused_before_building(tmp_path: Path) -> None:
    attnlab.save_pretrained(quantize(_gpt(), "int8"), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_layers": 3}))
    with pytest.raises(ValueError, match=r"holds 49 tensors but config\.json and quantization"):
        attnlab.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config))
    saved = (tmp_path / "quantization.json").read_text()
    record = json.loads(saved)
    record["config"]["modules"][0] = "layers.7.self_attn.q_proj"  # a name it does not rebuild
    (tmp_path / "quantization.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"quantization\.json: .*differing: \['layers\.0"):
        attnlab.from_pretrained(tmp_path)
    (tmp_path / "quantization.json").write_text(saved)
    (tmp_path / "config.json").write_text(json.dumps({**config, "d_model": 32, "n_heads": 2}))
    with pytest.raises(ValueError, match=r"does not hold the quantized model .*expected I8"):
        attnlab.from_pretrained(tmp_path)


def test_foreign_tensors_are_named(tmp_path: Path) -> None:
    attnlab.save_pretrained(quantize(_gpt(), "int4", group_size=32), tmp_path)
    file = tmp_path / "model.safetensors"
    tensors = load_file(file)
    name = "layers.0.ffn.up_proj.qweight"
    tensors[name] = tensors[name].to(torch.int32)  # codes in another dtype
    tensors["extra.weight"] = torch.zeros(2)
    save_file(tensors, file)
    with pytest.raises(ValueError, match=rf"{name} is I32 \[128, 32\], expected U8") as e:
        attnlab.from_pretrained(tmp_path)
    assert "extra.weight unexpected" in str(e.value)
    (tmp_path / "quantization.json").write_text('{"version": 2}')
    with pytest.raises(ValueError, match=r"written by a newer attnlab \(format version 2; this"):
        attnlab.from_pretrained(tmp_path)
    (tmp_path / "quantization.json").write_text('{"version": 1, "config": {"format": "int3"}}')
    with pytest.raises(ValueError, match=r"quantization\.json: format='int3'"):
        attnlab.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    ("fmt", "options"),
    [("int8", {}), ("int8", {"activation_dtype": "float32"}),
     ("int4", {"group_size": 32}), ("int4", {"group_size": 16, "include_lm_head": True}),
     ("int4", {"group_size": 64, "include_lm_head": True, "include_embedding": True})],
)  # fmt: skip
def test_footprint_on_meta_equals_the_measured_model(fmt: str, options: dict[str, Any]) -> None:
    model = quantize(_gpt(n_layers=4), fmt, **options)  # extrapolated from 1 and 2 layers
    measured = quantized_weight_bytes(model)
    footprint = quantized_footprint(model.config, model.quantization_config)
    assert footprint.stored == measured.total_stored
    assert footprint.kernel_copies == measured.kernel_copies  # computed, not made
    assert footprint.decode_copy_numel == copy_numel(model)
    head_kept = not options.get("include_lm_head")
    assert (footprint.decode_copy_numel > 0) == head_kept  # only a float32 head is still copied


def test_a_config_claiming_a_million_layers_is_refused_before_building(tmp_path: Path) -> None:
    one, two = (quantize(_gpt(n_layers=n), "int8") for n in (1, 2))
    attnlab.save_pretrained(two, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_layers": 10**6}))
    record = json.loads((tmp_path / "quantization.json").read_text())
    record["config"]["modules"] = []  # no recorded names to give it away either
    (tmp_path / "quantization.json").write_text(json.dumps(record))
    n1, n2 = len(one.state_dict()), len(two.state_dict())
    described = n1 + (10**6 - 1) * (n2 - n1)  # counted from 1- and 2-layer structures
    with pytest.raises(ValueError, match=rf"holds {n2} tensors but .* of {described}:"):
        attnlab.from_pretrained(tmp_path)
    big = dataclasses.replace(two.config, n_layers=10**6)  # the memory estimate: same way
    footprint = quantized_footprint(big, two.quantization_config)
    s1, s2 = (quantized_weight_bytes(m).total_stored for m in (one, two))
    assert footprint.stored == s1 + (10**6 - 1) * (s2 - s1)


def test_fitting_group_size() -> None:
    assert fitting_group_size(_gpt(d_model=128, d_ff=512)) == 128
    assert fitting_group_size(_gpt(d_model=64, d_ff=256)) == 64
    assert fitting_group_size(_gpt(d_model=96, d_ff=384)) == 32
    assert fitting_group_size(_gpt(d_model=48, d_ff=96)) == 48  # no kernel size fits: reference
    assert fitting_group_size(_gpt(d_model=48, d_ff=96), preferred=32) == 24
    assert fitting_group_size(_gpt(d_model=128, d_ff=512), preferred=256) == 128
    with pytest.raises(ValueError, match="preferred=0"):
        fitting_group_size(_gpt(), preferred=0)


def test_quantize_under_a_held_decode_session_frees_its_copies() -> None:
    """Decode copies belong to the fused engine of a call or a held session, never to the model;
    quantizing the model in place while a session holds copies of its layers replaces them: the
    session's engine gives way to the (quantized) modules and frees its copies."""
    model = _gpt()
    with DecodeSession(model, rows=1) as session:
        engine = session.engine
        assert engine is not None
        attnlab.generate(model, [[1, 2, 3]], max_new_tokens=3, decode_session=session)
        if not engine.copies():
            pytest.skip("no decode copies on this build (oneDNN missing)")
        quantize(model, "int8")
        got = attnlab.generate(model, [[1, 2, 3]], max_new_tokens=3, decode_session=session)
        assert engine.closed and engine.copies() == []
    assert torch.equal(got, attnlab.generate(model, [[1, 2, 3]], max_new_tokens=3, engine="eager"))


def test_non_finite_scales_are_refused_naming_the_tensor(tmp_path: Path) -> None:
    model = quantize(_gpt(), "int4", group_size=32)
    model.layers[1].ffn.down_proj.scales[0, 0] = float("nan")  # a damaged scale (a buffer)
    attnlab.save_pretrained(model, tmp_path)
    with pytest.raises(ValueError, match=r"layers\.1\.ffn\.down_proj\.scales .* 1 NaN value"):
        attnlab.from_pretrained(tmp_path)
    loaded = attnlab.from_pretrained(tmp_path, allow_non_finite=True)
    assert bool(loaded.layers[1].ffn.down_proj.scales.isnan().any())
