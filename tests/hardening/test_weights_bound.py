"""Weights are what the config says (issue 49, class 3).

A red-team probe found that a model directory loaded whatever its files held: int32 or bool
tensors in a float model (cast silently), a ``config.json`` edited after saving (another
``n_heads``, activation or ``norm_eps``: other logits, same shapes), tensor data zeroed in place.
attnlab writes both files, so ``save_pretrained`` binds them: the safetensors metadata records a
digest of the config and a content digest of the tensors (names, dtypes, shapes and bytes), and
loading checks them, naming what differs. ``verify=False`` (``--no-verify``) loads anyway;
directories written before carry no digests and keep loading. Whatever the directory (attnlab's,
a quantized one, Hugging Face's), a floating parameter must come from a floating tensor.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file, save_model

import attnlab
from attnlab import GPTConfig, build_model
from attnlab.data.text import TokenStream
from attnlab.interop.hf import save_hf
from attnlab.models import GPT
from attnlab.training.config import TrainConfig
from attnlab.training.objectives import CausalLMObjective
from attnlab.training.trainer import Trainer
from attnlab.transforms import quantize
from testkit import run_cli as _run

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

TINY = GPTConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=16,
                 dropout=0.0, eos_id=None)  # fmt: skip
RANDOM_TENSOR = "layers.0.ffn.up_proj.weight"  # initialised at random: zeroing it changes it
IDS = torch.tensor([[1, 2, 3, 4, 5]])


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(TINY).eval()


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        out = model(IDS)
    return out[0] if isinstance(out, tuple) else out


def _saved(tmp_path: Path, name: str = "model") -> Path:
    return attnlab.save_pretrained(_model(), tmp_path / name)


def _metadata(file: Path) -> dict[str, str]:
    with safe_open(str(file), framework="pt") as f:
        return dict(f.metadata() or {})


def _zero(file: Path, names: list[str] | None = None) -> None:
    """Overwrite the data bytes of ``names`` (default: every tensor) with zeros in place: the
    header (names, dtypes, shapes, metadata) stays as it was."""
    raw = bytearray(file.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    for name in names or [k for k in header if k != "__metadata__"]:
        begin, end = header[name]["data_offsets"]
        raw[8 + n + begin : 8 + n + end] = bytes(end - begin)
    file.write_bytes(bytes(raw))


def _retype(file: Path, name: str, dtype: torch.dtype, *, keep_metadata: bool) -> None:
    """Rewrite ``file`` with the tensor ``name`` converted to ``dtype`` (same shape)."""
    tensors = load_file(file)
    tensors[name] = (tensors[name] * 100).to(dtype)
    save_file(tensors, file, metadata=_metadata(file) if keep_metadata else None)


def _edit_config(directory: Path, **changes: Any) -> None:
    data = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**data, **changes}))


# -- the round trip -------------------------------------------------------------------------------


def test_save_load_round_trip_is_bitwise_and_records_small_digests(tmp_path: Path) -> None:
    model = _model()
    directory = attnlab.save_pretrained(model, tmp_path / "model")
    metadata = _metadata(directory / "model.safetensors")
    assert {"attnlab.config_sha256", "attnlab.content_sha256"} <= set(metadata), metadata
    assert metadata["tok_embed.weight"] == "lm_head.weight"  # the tied name, as before
    assert sum(len(k) + len(v) for k, v in metadata.items()) < 4096, metadata  # small
    loaded = attnlab.from_pretrained(directory, verify=True)
    for name, value in model.state_dict().items():
        other = loaded.state_dict()[name]
        assert other.dtype == value.dtype and torch.equal(other, value), name
    assert torch.equal(_logits(loaded), _logits(model))
    # the digest is of the config's content, not its formatting: reformatted, it still loads
    data = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(dict(reversed(data.items())), indent=7))
    assert torch.equal(_logits(attnlab.from_pretrained(directory)), _logits(model))


def test_a_half_precision_file_loads_into_the_float32_model(tmp_path: Path) -> None:
    """Allowed: float16/bfloat16 (any floating dtype) into a float32 parameter, cast exactly;
    the digests are of the file as written, so they verify."""
    for dtype in (torch.bfloat16, torch.float16):
        half = _model().to(dtype)
        directory = attnlab.save_pretrained(half, tmp_path / str(dtype))
        loaded = attnlab.from_pretrained(directory, verify=True)
        for name, value in half.state_dict().items():
            assert loaded.state_dict()[name].dtype == torch.float32
            assert torch.equal(loaded.state_dict()[name].to(dtype), value), name


# -- integer and bool tensors in a float model ----------------------------------------------------


@pytest.mark.parametrize("keep_metadata", [False, True], ids=["foreign", "bound"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.bool], ids=["int32", "bool"])
def test_integer_or_bool_tensors_in_an_attnlab_directory_are_refused(
    tmp_path: Path, dtype: torch.dtype, keep_metadata: bool
) -> None:
    directory = _saved(tmp_path)
    _retype(directory / "model.safetensors", RANDOM_TENSOR, dtype, keep_metadata=keep_metadata)
    with pytest.raises(ValueError) as info:
        attnlab.from_pretrained(directory)
    message = str(info.value)
    kind = str(dtype).removeprefix("torch.")
    assert RANDOM_TENSOR in message and kind in message and "float32" in message, message
    assert "model.safetensors" in message, message
    model = attnlab.from_pretrained(directory, verify=False)  # as before: cast
    assert model.state_dict()[RANDOM_TENSOR].dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool], ids=["int32", "bool"])
def test_integer_or_bool_tensors_in_a_hugging_face_directory_are_refused(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    directory = save_hf(_model(), tmp_path / "hf")
    name = "transformer.h.0.mlp.c_fc.weight"
    _retype(directory / "model.safetensors", name, dtype, keep_metadata=True)
    with pytest.raises(ValueError) as info:
        attnlab.from_pretrained(directory)
    message = str(info.value)
    kind = str(dtype).removeprefix("torch.")
    assert "h.0.mlp.c_fc.weight" in message and kind in message and "float32" in message, message
    attnlab.from_pretrained(directory, verify=False)  # as before: cast


# -- config.json edited after saving --------------------------------------------------------------

EDITS: dict[str, dict[str, Any]] = {
    "heads": {"n_heads": 4},
    "activation": {"activation": "relu"},
    "norm_eps": {"norm_eps": 1e-3},
    # a vocabulary of the same size whose special ids moved: the same shapes, other meaning
    "special ids": {"eos_id": 3, "pad_id": 0},
    "attention window": {"attn_window": 2, "attn_backend": "sliding_window"},
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_a_config_edited_after_saving_is_refused_naming_the_config_digest(
    tmp_path: Path, edit: str
) -> None:
    directory = _saved(tmp_path)
    reference = _logits(_model())
    _edit_config(directory, **EDITS[edit])
    with pytest.raises(ValueError) as info:
        attnlab.from_pretrained(directory)
    message = str(info.value)
    assert "config digest" in message and "config.json" in message, message
    changed = [k for k, v in EDITS[edit].items() if getattr(TINY, k) != v]
    assert all(k in message for k in changed), message  # the fields that changed, named
    assert "verify=False" in message, message
    loaded = attnlab.from_pretrained(directory, verify=False)  # loads, as the config now says
    if edit != "special ids":
        assert not torch.equal(_logits(loaded), reference)  # why it is refused


# -- tensor data changed in place -----------------------------------------------------------------


@pytest.mark.parametrize("which", ["one tensor", "every tensor"])
def test_zeroed_data_bytes_are_refused_naming_the_content_digest(
    tmp_path: Path, which: str
) -> None:
    directory = _saved(tmp_path)
    _zero(directory / "model.safetensors", [RANDOM_TENSOR] if which == "one tensor" else None)
    with pytest.raises(ValueError) as info:
        attnlab.from_pretrained(directory)
    message = str(info.value)
    assert "content digest" in message and "model.safetensors" in message, message
    assert RANDOM_TENSOR in message, message  # the tensor whose bytes changed
    model = attnlab.from_pretrained(directory, verify=False)
    assert not model.state_dict()[RANDOM_TENSOR].any()


def test_a_relabelled_dtype_is_refused(tmp_path: Path) -> None:
    """The header's dtype of a tensor changed to another of the same width (bfloat16 read as
    float16): the bytes are the same, the values are not."""
    directory = attnlab.save_pretrained(_model().to(torch.bfloat16), tmp_path / "model")
    file = directory / "model.safetensors"
    raw = file.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header[RANDOM_TENSOR]["dtype"] = "F16"
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (n - len(text))
    assert len(text) == n
    file.write_bytes(raw[:8] + text + raw[8 + n :])
    with pytest.raises(ValueError, match="content digest"):
        attnlab.from_pretrained(directory)


# -- older directories ----------------------------------------------------------------------------


def test_a_directory_written_before_the_digests_still_loads(tmp_path: Path) -> None:
    """``save_model`` as ``save_pretrained`` called it before: no digests, so nothing to bind;
    it loads with verification on (an edit to its config cannot be told from the original)."""
    model = _model()
    directory = attnlab.save_pretrained(model, tmp_path / "old")
    save_model(model, str(directory / "model.safetensors"))  # the old writer: no digests
    assert not any(k.startswith("attnlab.") for k in _metadata(directory / "model.safetensors"))
    loaded = attnlab.from_pretrained(directory, verify=True)
    assert torch.equal(_logits(loaded), _logits(model))
    _edit_config(directory, norm_eps=1e-3)
    attnlab.from_pretrained(directory, verify=True)


# -- quantized directories ------------------------------------------------------------------------


def test_a_quantized_directory_is_bound_too(tmp_path: Path) -> None:
    model = quantize(_model(), "int8")
    directory = attnlab.save_pretrained(model, tmp_path / "q")
    assert "attnlab.content_sha256" in _metadata(directory / "model.safetensors")
    assert torch.equal(_logits(attnlab.from_pretrained(directory)), _logits(model))
    saved = (directory / "config.json").read_text()
    _edit_config(directory, norm_eps=1e-3)
    with pytest.raises(ValueError, match=r"config digest.*norm_eps"):
        attnlab.from_pretrained(directory)
    attnlab.from_pretrained(directory, verify=False)
    (directory / "config.json").write_text(saved)
    _zero(directory / "model.safetensors", ["layers.0.ffn.up_proj.qweight"])
    with pytest.raises(ValueError, match=r"content digest.*layers\.0\.ffn\.up_proj\.qweight"):
        attnlab.from_pretrained(directory)
    attnlab.from_pretrained(directory, verify=False)
    # written before the digests existed: the same file without them loads
    metadata = {k: v for k, v in _metadata(directory / "model.safetensors").items()
                if not k.startswith("attnlab.")}  # fmt: skip
    save_file(load_file(directory / "model.safetensors"), directory / "model.safetensors",
              metadata=metadata)  # fmt: skip
    attnlab.from_pretrained(directory, verify=True)


# -- the commands ---------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["generate", "quantize"])
def test_the_commands_refuse_and_no_verify_loads(tmp_path: Path, command: str) -> None:
    directory = _saved(tmp_path)
    _edit_config(directory, activation="relu")
    argv = {
        "generate": ["generate", str(directory), "--ids", "1,2", "--max-new-tokens", "2"],
        "quantize": ["quantize", str(directory), "--bits", "8", "--out", str(tmp_path / "q")],
    }[command]
    code, _, err = _run(argv)
    assert code == 2, err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "config digest" in lines[0] and "--no-verify" in lines[0], err
    code, _, err = _run([*argv, "--no-verify"])
    assert code == 0, err


# -- checkpoints of a run -------------------------------------------------------------------------

RUN_MODEL = GPTConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=8,
                      dropout=0.1, eos_id=None)  # fmt: skip
RUN = TrainConfig(steps=8, batch_size=4, schedule="cosine", warmup=2, lr=1e-2, eval_every=2,
                  progress=False, log_every=1, checkpoint_every=2,
                  keep_checkpoints=4)  # fmt: skip


def _trainer(run: Path, config: TrainConfig = RUN) -> Trainer:
    torch.manual_seed(0)
    stream = TokenStream(torch.randint(11, (2000,), generator=torch.Generator().manual_seed(1)))
    return Trainer(GPT(RUN_MODEL), CausalLMObjective(stream, block_size=8), config, run_dir=run)


@pytest.mark.parametrize("damage", ["zeroed tensor", "int32 tensor"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    full = _trainer(tmp_path / "full")
    full_losses = full.fit().losses
    run = tmp_path / "run"
    _trainer(run).fit(until=6)
    weights = run / "checkpoints" / "step_00000006" / "model.safetensors"
    if damage == "zeroed tensor":
        _zero(weights, [RANDOM_TENSOR])
    else:
        _retype(weights, RANDOM_TENSOR, torch.int32, keep_metadata=True)
    torch.manual_seed(99)
    resumed = _trainer(run)
    with caplog.at_level("WARNING"):
        losses = resumed.fit(resume=True).losses
    assert "step_00000006" in caplog.text and "trying an older one" in caplog.text
    assert ("content digest" if damage == "zeroed tensor" else "int32") in caplog.text
    assert losses == full_losses[4:], "did not continue bitwise from step 4"
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, full.model.state_dict()[name]), name


def test_the_exports_of_a_run_are_bound(tmp_path: Path) -> None:
    """``last/`` and ``averaged/`` (like ``best/``) are written by ``save_pretrained``: bound."""
    config = dataclasses.replace(RUN, steps=4, export_last=True, average_last=2)
    _trainer(tmp_path / "run", config).fit()
    for name in ("last", "averaged"):
        directory = tmp_path / "run" / name
        assert "attnlab.content_sha256" in _metadata(directory / "model.safetensors"), name
        copy = shutil.copytree(directory, tmp_path / f"{name}-copy")
        _zero(copy / "model.safetensors", [RANDOM_TENSOR])
        with pytest.raises(ValueError, match="content digest"):
            attnlab.from_pretrained(copy)
