"""The speedrun preset of shakespeare-char (issue 51): its fields, fields given by name win,
a warmup that fits short runs, and refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnlab.training import hardware
from attnlab.training.muon import Muon
from attnlab.training.recipes import prepare
from attnlab.training.recipes.text import (
    SPEEDRUN_ABLATIONS,
    SPEEDRUN_BF16,
    SPEEDRUN_MODEL,
    SPEEDRUN_TRAIN,
    speedrun_train_fields,
)
from testkit import run_cli, word_corpus

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text(word_corpus(200))
    return path


def test_the_preset_sets_its_model_and_training_fields(corpus: Path) -> None:
    p = prepare("shakespeare-char", {"data": str(corpus), "preset": "speedrun"})
    for key, value in SPEEDRUN_MODEL.items():
        assert getattr(p.model_config, key) == value, key
    for key, value in speedrun_train_fields().items():
        if key != "warmup":
            assert getattr(p.train, key) == value, key
    assert p.train.warmup <= SPEEDRUN_TRAIN["warmup"]
    plain = prepare("shakespeare-char", {"data": str(corpus)})
    assert plain.train.optimizer == "adamw" and plain.model_config.pos_encoding == "learned"


@pytest.mark.parametrize("flags", [{"avx512f", "avx512_bf16"}, {"amx_bf16"}, {"avx2", "avx512f"}])
def test_the_preset_trains_in_bf16_only_where_the_cpu_multiplies_it(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: set[str]
) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("vendor_id\t: X\nflags\t\t: fpu sse2 " + " ".join(sorted(flags)) + "\n")
    assert hardware.cpu_flags(str(cpuinfo)) >= flags
    monkeypatch.setattr(hardware, "_host_cpu_flags", lambda: hardware.cpu_flags(str(cpuinfo)))
    native = bool(flags & set(hardware.BF16_CPU_FLAGS))
    assert hardware.native_bf16("cpu") is native and hardware.native_bf16() is native
    p = prepare("shakespeare-char", {"data": str(corpus), "preset": "speedrun"})
    want = SPEEDRUN_BF16 if native else {"precision": "fp32", "muon_ns_dtype": "float32"}
    assert {k: getattr(p.train, k) for k in want} == want
    # given by name, the precision wins; the plain recipe never changes
    q = prepare("shakespeare-char", {"data": str(corpus), "preset": "speedrun",
                                     "precision": "fp32"})  # fmt: skip
    assert q.train.precision == "fp32" and q.train.muon_ns_dtype == "float32"
    plain = prepare("shakespeare-char", {"data": str(corpus)})
    assert plain.train.precision == "fp32" and plain.train.muon_ns_dtype == "float32"
    assert hardware.cpu_flags(str(tmp_path / "missing")) == frozenset()


def test_the_preset_asks_the_device_the_trainer_will_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "_host_cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    bf16 = {**SPEEDRUN_TRAIN, **SPEEDRUN_BF16}
    # a single process with the device unset trains on the CPU: its flags decide
    assert speedrun_train_fields() == speedrun_train_fields("cpu") == SPEEDRUN_TRAIN
    assert speedrun_train_fields("cuda") == bf16
    # under torchrun each process trains on its own GPU where CUDA is available (device unset)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert speedrun_train_fields() == speedrun_train_fields("auto") == bf16
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # gloo: the CPU decides
    assert speedrun_train_fields() == SPEEDRUN_TRAIN


def test_fields_given_by_name_win_and_ablations_apply(corpus: Path) -> None:
    base = {"data": str(corpus), "preset": "speedrun"}
    p = prepare("shakespeare-char", {**base, "lr": 5e-4, "tie_output": True, "steps": 40})
    assert p.train.lr == 5e-4 and p.model_config.tie_output is True
    assert p.train.schedule == "wsd" and 0 <= p.train.warmup <= 40 - round(0.3 * 40)
    for technique, fields in SPEEDRUN_ABLATIONS.items():
        q = prepare("shakespeare-char", {**base, **fields})
        for key, value in fields.items():
            section = q.train if hasattr(q.train, key) else q.model_config
            assert getattr(section, key) == value, (technique, key)


def test_the_preset_trains_with_muon(corpus: Path, tmp_path: Path) -> None:
    code, out, err = run_cli(["train", "shakespeare-char", "--preset", "speedrun", "--data",
                              str(corpus), "--steps", "6", "--d-model", "32", "--n-layers", "1",
                              "--out", str(tmp_path / "run"), "--no-progress"])  # fmt: skip
    assert code == 0, err
    assert "Muon + AdamW" in out and "(wsd)" in out
    p = prepare("shakespeare-char", {"data": str(corpus), "preset": "speedrun", "d_model": 32})
    from attnlab.training.optim import build_optimizer

    assert isinstance(build_optimizer(p.model, p.train), Muon)


def test_the_preset_refuses_a_recurrent_arch(corpus: Path) -> None:
    with pytest.raises(ValueError, match=r"preset='speedrun' is a GPT recipe.*arch='mamba'"):
        prepare("shakespeare-char", {"data": str(corpus), "preset": "speedrun", "arch": "mamba"})
