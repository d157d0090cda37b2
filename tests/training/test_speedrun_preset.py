"""The speedrun preset of shakespeare-char (issue 51): its fields, fields given by name win,
a warmup that fits short runs, and refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnlab.training.muon import Muon
from attnlab.training.recipes import prepare
from attnlab.training.recipes.text import SPEEDRUN_ABLATIONS, SPEEDRUN_MODEL, SPEEDRUN_TRAIN
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
    for key, value in SPEEDRUN_TRAIN.items():
        if key != "warmup":
            assert getattr(p.train, key) == value, key
    assert p.train.warmup <= SPEEDRUN_TRAIN["warmup"]
    plain = prepare("shakespeare-char", {"data": str(corpus)})
    assert plain.train.optimizer == "adamw" and plain.model_config.pos_encoding == "learned"


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
