"""Untrusted files: loading never runs code, configs are data, writes stay in their directory.

- Pickle payloads (``os.system``, ``exec``, ``subprocess``, ``Path.touch``) in every place a
  checkpoint directory can hold one (``pytorch_model.bin`` in the zip and the legacy format,
  ``.bin`` shards, a pickle named ``model.safetensors`` in attnlab's and Hugging Face's layout,
  a payload hidden next to real tensors): :func:`attnlab.from_pretrained` raises and the marker
  file the payload would create does not exist. ``tests/interop/test_pretrained.py`` has the basic
  ``Path.touch`` case; these extend it.
- Configs are JSON data: code in string values, dunder keys, ``auto_map`` with a ``.py`` file
  beside it (Hugging Face's remote code) are rejected or ignored, never imported or evaluated.
- A static scan of ``src/attnlab``: no ``eval``/``exec``/``pickle``/``marshal``/``yaml`` loads,
  every ``torch.load`` passes ``weights_only=True``, nothing writes pickles (``torch.save``,
  ``pickle.dump``; the trainer state too is safetensors + JSON), no shell.
- attnlab writes only safetensors + JSON: exactly ``config.json`` and ``model.safetensors``.
- Paths: saves touch nothing outside the given directory (weird names, nested new
  directories, symlinks planted in the target), a failed save leaves the old files and no
  temporary files, and a shard index cannot make the loader read outside the checkpoint.
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import pickle
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import attnlab
from attnlab import BERTConfig, GPTConfig, TransformerConfig, ViTConfig, build_model
from attnlab.interop import hf as hf_module
from attnlab.interop import save_hf

SRC = Path(attnlab.__file__).resolve().parent

TINY = {
    "gpt": GPTConfig(
        vocab_size=50, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=8, eos_id=None
    ),
    "bert": BERTConfig(vocab_size=110, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=8),
    "vit": ViTConfig(
        image_size=8, patch_size=4, n_classes=3, d_model=16, n_heads=2, n_layers=1, d_ff=32
    ),
    "transformer": TransformerConfig(vocab_size=50, d_model=16, n_heads=2, n_layers=1, d_ff=32),
}


def tiny(name: str) -> Any:
    return build_model(TINY[name]).eval()


# ---------------------------------------------------------------------------- payloads


class Payload:
    """Unpickling this object runs ``how`` to create ``marker``: code execution."""

    def __init__(self, how: str, marker: Path) -> None:
        self.how, self.marker = how, str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        if self.how == "os.system":
            return (os.system, (f"touch '{self.marker}'",))
        if self.how == "exec":
            return (builtins.exec, (f"open({self.marker!r}, 'w').close()",))
        if self.how == "subprocess":
            return (subprocess.call, (["touch", self.marker],))
        return (Path.touch, (Path(self.marker),))


HOWS = ["os.system", "exec", "subprocess", "Path.touch"]


def _hf_dir(directory: Path) -> dict[str, torch.Tensor]:
    """A valid GPT-2 checkpoint in ``directory``; returns its tensors (safetensors removed)."""
    save_hf(tiny("gpt"), directory)
    tensors = load_file(directory / "model.safetensors")
    (directory / "model.safetensors").unlink()
    return tensors


def plant(layout: str, how: str, directory: Path, marker: Path) -> None:
    """Write a checkpoint directory whose weights carry the payload, in ``layout``."""
    evil = Payload(how, marker)
    if layout == "bin-zip":
        _hf_dir(directory)
        torch.save({"x": evil}, directory / "pytorch_model.bin")
    elif layout == "bin-legacy":
        _hf_dir(directory)
        with open(directory / "pytorch_model.bin", "wb") as f:
            pickle.dump({"x": evil}, f, protocol=2)
    elif layout == "bin-hidden-in-state-dict":
        tensors: dict[str, Any] = _hf_dir(directory)
        tensors["transformer.h.0.attn.bias"] = evil
        torch.save(tensors, directory / "pytorch_model.bin")
    elif layout == "bin-shards":
        tensors = _hf_dir(directory)
        names = sorted(tensors)
        torch.save({k: tensors[k] for k in names[1:]}, directory / "pytorch_model-1.bin")
        torch.save({names[0]: evil}, directory / "pytorch_model-2.bin")
        weight_map = {k: "pytorch_model-1.bin" for k in names[1:]}
        weight_map[names[0]] = "pytorch_model-2.bin"
        (directory / "pytorch_model.bin.index.json").write_text(
            json.dumps({"weight_map": weight_map})
        )
    elif layout == "hf-pickle-named-safetensors":
        _hf_dir(directory)
        torch.save({"x": evil}, directory / "model.safetensors")
    elif layout == "attnlab-pickle-named-safetensors":
        tiny("gpt").save_pretrained(directory)
        torch.save({"x": evil}, directory / "model.safetensors")
    elif layout == "attnlab-with-only-a-bin":
        tiny("gpt").save_pretrained(directory)
        (directory / "model.safetensors").unlink()
        torch.save({"x": evil}, directory / "pytorch_model.bin")
    else:
        raise AssertionError(layout)


LAYOUTS = [
    "bin-zip",
    "bin-legacy",
    "bin-hidden-in-state-dict",
    "bin-shards",
    "hf-pickle-named-safetensors",
    "attnlab-pickle-named-safetensors",
    "attnlab-with-only-a-bin",
]


def test_payloads_do_run_when_unpickled_naively(tmp_path: Path) -> None:
    """Control: each payload really executes under a plain ``pickle.loads`` (so the tests below
    prove something)."""
    for how in HOWS:
        marker = tmp_path / f"ran-{how}"
        pickle.loads(pickle.dumps(Payload(how, marker)))
        assert marker.exists(), how


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_malicious_pickle_is_never_executed(layout: str, how: str, tmp_path: Path) -> None:
    directory, marker = tmp_path / "ckpt", tmp_path / "PWNED"
    directory.mkdir()
    plant(layout, how, directory, marker)
    with pytest.raises(Exception) as info:
        attnlab.from_pretrained(directory)
    assert not marker.exists(), f"payload ran ({layout}, {how})"
    if layout.startswith("bin"):
        # weights_only refused it; the loader says so, naming the file
        assert isinstance(info.value, ValueError), repr(info.value)
        assert "weights-only loading refuses" in str(info.value), info.value
    if layout == "attnlab-with-only-a-bin":
        assert isinstance(info.value, FileNotFoundError)  # attnlab's format never reads .bin


def test_bin_loading_uses_weights_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every torch.load that from_pretrained makes asks for weights_only=True."""
    tensors = _hf_dir(tmp_path)
    torch.save(tensors, tmp_path / "pytorch_model.bin")
    calls: list[dict[str, Any]] = []
    real = torch.load

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    attnlab.from_pretrained(tmp_path)
    assert calls and all(c.get("weights_only") is True for c in calls)


# ---------------------------------------------------------------------------- configs are data


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"activation": "__import__('os').system('touch PWNED')"}, ValueError),
        ({"attn_backend": "os.system"}, ValueError),
        ({"d_model": "__import__('os').system('touch PWNED') or 16"}, TypeError),
        ({"d_model": {"__class__": "os.system"}}, TypeError),
        ({"__class__": "GPT", "__init__": "exec"}, ValueError),
        ({"model_type": "__import__('os').system('touch PWNED')"}, ValueError),
    ],
)
def test_config_values_are_data(
    change: dict[str, Any], error: type[Exception], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Strings that are Python code are rejected as values, never evaluated."""
    monkeypatch.chdir(tmp_path)
    tiny("gpt").save_pretrained(tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(error):
        attnlab.from_pretrained(tmp_path / "ckpt")
    assert not (tmp_path / "PWNED").exists()


def test_remote_code_in_a_hugging_face_directory_is_ignored(tmp_path: Path) -> None:
    """``auto_map`` + ``trust_remote_code`` + a ``.py`` beside the weights: attnlab builds its
    own model from the config's numbers and never imports the file."""
    save_hf(tiny("gpt"), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilModel"}
    config["trust_remote_code"] = True
    (tmp_path / "config.json").write_text(json.dumps(config))
    marker = tmp_path / "PWNED"
    (tmp_path / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    model = attnlab.from_pretrained(tmp_path)
    assert isinstance(model, attnlab.GPT) and not marker.exists()


def _calls(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    """``(dotted name, call)`` of every call in ``tree`` (``torch.load``, ``eval``...)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            parts, f = [], node.func
            while isinstance(f, ast.Attribute):
                parts.append(f.attr)
                f = f.value
            if isinstance(f, ast.Name):
                parts.append(f.id)
            out.append((".".join(reversed(parts)), node))
    return out


FORBIDDEN = {
    "eval", "exec", "compile", "__import__", "importlib.import_module",
    "pickle.load", "pickle.loads", "pickle.dump", "pickle.dumps", "pickle.Unpickler",
    "pickle.Pickler", "dill.dump", "dill.dumps", "torch.serialization.save",
    "marshal.load", "marshal.loads", "shelve.open", "dill.load", "dill.loads",
    "yaml.load", "yaml.unsafe_load", "torch.save", "os.system", "os.popen",
    "numpy.load", "np.load",
}  # fmt: skip


def test_source_never_evaluates_unpickles_or_writes_pickles() -> None:
    """A static scan of every module under src/attnlab: no module may write a pickle (there is
    no allow-list; the trainer state is safetensors + JSON since issue 11)."""
    problems = []
    for file in sorted(SRC.rglob("*.py")):
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
        where = file.relative_to(SRC.parent)
        for name, call in _calls(tree):
            line = f"{where}:{call.lineno} {name}"
            if name in FORBIDDEN:
                problems.append(line)
            if name == "torch.load":
                flag = {k.arg: k.value for k in call.keywords}.get("weights_only")
                ok = isinstance(flag, ast.Constant) and flag.value is True
                if not ok:
                    problems.append(f"{line} without weights_only=True")
            if name.startswith("subprocess.") and any(
                k.arg == "shell" and not (isinstance(k.value, ast.Constant) and not k.value.value)
                for k in call.keywords
            ):
                problems.append(f"{line} with shell=")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------- writes


def _files(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` (links not followed) -> its content."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = Path(dirpath) / n
            out[str(p.relative_to(root))] = b"<link>" if p.is_symlink() else p.read_bytes()
    return out


def _assert_safetensors_and_json(directory: Path) -> None:
    assert sorted(os.listdir(directory)) == ["config.json", "model.safetensors"]
    raw = (directory / "model.safetensors").read_bytes()
    assert not raw.startswith((b"\x80", b"PK")), "a pickle / zip, not safetensors"
    with safe_open(directory / "model.safetensors", framework="pt") as f:
        assert len(list(f.keys())) > 0
    assert isinstance(json.loads((directory / "config.json").read_text()), dict)


@pytest.mark.parametrize("name", sorted(TINY))
@pytest.mark.parametrize("how", ["save_pretrained", "save_hf"])
def test_saves_write_only_safetensors_and_json_inside_the_directory(
    name: str, how: str, tmp_path: Path
) -> None:
    sandbox = tmp_path / "sandbox"
    (sandbox / "existing").mkdir(parents=True)
    (sandbox / "existing" / "keep.txt").write_text("untouched")
    before = _files(sandbox)
    target = sandbox / "new" / "nested" / "dir"
    save = attnlab.save_pretrained if how == "save_pretrained" else save_hf
    if how == "save_hf" and name == "transformer":
        pytest.skip("the paper's Transformer (sinusoidal, tied) has no Hugging Face family")
    assert save(tiny(name), target) == target
    _assert_safetensors_and_json(target)
    after = _files(sandbox)
    assert {k: v for k, v in after.items() if not k.startswith("new/")} == before
    assert sorted(k for k in after if k.startswith("new/")) == [
        "new/nested/dir/config.json",
        "new/nested/dir/model.safetensors",
    ]


WEIRD = [
    "with space",
    "ünïcödé ✓",
    "-rf",
    "a\nnewline",
    "..dots..",
    "sub/../resolved",
    "trailing/",
    "$HOME",
    "`touch PWNED`",
    "*",
]


@pytest.mark.parametrize("weird", WEIRD)
@pytest.mark.parametrize("how", ["save_pretrained", "save_hf"])
def test_weird_directory_names(weird: str, how: str, tmp_path: Path) -> None:
    """Names are paths, never shell words or patterns: the files land in exactly
    ``sandbox / weird`` (normalised), nowhere else."""
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    save = attnlab.save_pretrained if how == "save_pretrained" else save_hf
    target = sandbox / weird
    save(tiny("gpt"), target)
    resolved = Path(os.path.normpath(target))
    _assert_safetensors_and_json(resolved)
    written = {sandbox / k for k in _files(sandbox)}
    assert written == {resolved / "config.json", resolved / "model.safetensors"}
    assert not (tmp_path / "PWNED").exists() and not (Path.cwd() / "PWNED").exists()
    model = attnlab.from_pretrained(resolved)
    assert isinstance(model, attnlab.GPT)


@pytest.mark.parametrize("how", ["save_pretrained", "save_hf"])
def test_symlinks_in_the_target_are_replaced_not_followed(how: str, tmp_path: Path) -> None:
    """A ``model.safetensors`` / ``config.json`` symlink planted in the output directory that
    points elsewhere: saving replaces the links; the files they pointed to stay untouched."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.bin").write_text("precious")
    (outside / "victim.json").write_text("{}")
    target = tmp_path / "out"
    target.mkdir()
    (target / "model.safetensors").symlink_to(outside / "victim.bin")
    (target / "config.json").symlink_to(outside / "victim.json")
    save = attnlab.save_pretrained if how == "save_pretrained" else save_hf
    save(tiny("gpt"), target)
    assert (outside / "victim.bin").read_text() == "precious"
    assert (outside / "victim.json").read_text() == "{}"
    assert not (target / "model.safetensors").is_symlink()
    assert not (target / "config.json").is_symlink()
    _assert_safetensors_and_json(target)


def test_failed_save_hf_keeps_the_old_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save that dies half-way (here: the tensor writer fails after writing garbage) leaves
    the previous checkpoint loadable and no temporary files."""
    save_hf(tiny("gpt"), tmp_path)
    before = _files(tmp_path)

    def broken(tensors: Any, filename: str, metadata: Any = None) -> None:
        Path(filename).write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(hf_module, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        save_hf(tiny("gpt"), tmp_path)
    assert _files(tmp_path) == before
    assert isinstance(attnlab.from_pretrained(tmp_path), attnlab.GPT)


@pytest.mark.parametrize(
    "shard", ["../outside.safetensors", "{abs}", "sub/model.safetensors", ".."]
)
def test_shard_index_cannot_point_outside_the_checkpoint(shard: str, tmp_path: Path) -> None:
    """``model.safetensors.index.json`` naming ``../x``, an absolute path or a sub-directory is
    refused before any file is opened (Hugging Face shards are plain names in the directory)."""
    directory = tmp_path / "ckpt"
    tensors = _hf_dir(directory)
    save_file(tensors, tmp_path / "outside.safetensors")  # loadable, if the loader went there
    (directory / "sub").mkdir()
    save_file(tensors, directory / "sub" / "model.safetensors")
    name = str(tmp_path / "outside.safetensors") if shard == "{abs}" else shard
    index = {"weight_map": dict.fromkeys(tensors, name)}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="shards must be plain file names"):
        attnlab.from_pretrained(directory)
