"""The training recipe: loss decreases, exact resume after an interruption, checkpoint
averaging, the files of a run, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab.models.transformer import EncoderDecoderTransformer, TransformerConfig
from attnlab.pretrained import load_attnlab, save_pretrained
from attnlab.translation import average_checkpoints, latest_snapshot, train_translation
from attnlab.translation import loop as loop_module
from attnlab.translation.checkpoints import snapshot_dirs

from .conftest import tiny_config


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_loss_decreases_and_run_files(tiny_run: Path) -> None:
    train = [r for r in _records(tiny_run) if r["split"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 31))
    first = sum(r["loss"] for r in train[:3]) / 3
    last = sum(r["loss"] for r in train[-3:]) / 3
    assert last < first - 1.0, (first, last)
    val = [r for r in _records(tiny_run) if r["split"] == "val"]
    assert [r["step"] for r in val] == [10, 20, 30]
    assert val[-1]["val_loss"] < val[0]["val_loss"]
    assert {"val_loss", "val_ppl", "val_bleu"} <= set(val[0])
    for name in ("averaged", "best", "last"):
        for f in ("model.safetensors", "config.json", "tokenizer.json", "translation.json"):
            assert (tiny_run / name / f).is_file(), (name, f)
    info = json.loads((tiny_run / "averaged" / "translation.json").read_text())
    assert info["averaged_steps"] == [20, 25, 30] and info["src"] == "de"
    run = json.loads((tiny_run / "run.json").read_text())
    assert run["train_pairs"] == 300 and run["train_dropped"] == 0
    # shared source/target embeddings tied to the output projection (§3.4)
    model = load_attnlab(tiny_run / "last")
    assert model.src_embed is model.tgt_embed
    assert model.lm_head.weight.data_ptr() == model.tgt_embed.weight.data_ptr()


def test_averaged_model_is_the_mean_of_the_last_snapshots(tiny_run: Path) -> None:
    dirs = snapshot_dirs(tiny_run)
    assert [d.name for d in dirs] == ["step_00000020", "step_00000025", "step_00000030"]
    states = [load_file(d / "model.safetensors") for d in dirs]
    averaged = load_file(tiny_run / "averaged" / "model.safetensors")
    assert set(averaged) == set(states[0])
    for key, value in averaged.items():
        mean = torch.stack([s[key] for s in states]).double().mean(0).float()
        torch.testing.assert_close(value, mean, rtol=0, atol=1e-7)
    assert not torch.equal(averaged["lm_head.weight"], states[-1]["lm_head.weight"])


def test_average_checkpoints_closed_form(tmp_path: Path) -> None:
    config = TransformerConfig(vocab_size=20, d_model=8, n_heads=2, n_layers=1, d_ff=16)
    models = []
    for i in range(3):
        torch.manual_seed(i)
        models.append(EncoderDecoderTransformer(config))
        save_pretrained(models[-1], tmp_path / str(i))
    target = average_checkpoints(
        EncoderDecoderTransformer(config), [tmp_path / "0", tmp_path / "1", tmp_path / "2"]
    )
    for name, p in target.named_parameters():
        expected = sum(dict(m.named_parameters())[name] for m in models) / 3
        torch.testing.assert_close(p, expected, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="at least one"):
        average_checkpoints(target, [])


def test_resume_after_interruption_equals_uninterrupted(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tiny_config(max_steps=9, save_every=3, eval_every=4)
    full = tmp_path / "full"
    train_translation(config, tiny_data, full)

    original = loop_module.TrainLoop._update

    def crash_at_step_8(self, index, step):  # type: ignore[no-untyped-def]
        if step == 8:
            raise KeyboardInterrupt("simulated kill")
        return original(self, index, step)

    broken = tmp_path / "broken"
    monkeypatch.setattr(loop_module.TrainLoop, "_update", crash_at_step_8)
    with pytest.raises(KeyboardInterrupt):
        train_translation(config, tiny_data, broken)
    monkeypatch.setattr(loop_module.TrainLoop, "_update", original)
    snap = latest_snapshot(broken)
    assert snap is not None and snap.name == "step_00000006"
    run = train_translation(config, tiny_data, broken, resume=True)
    assert run.step == 9
    sessions = json.loads((broken / "run.json").read_text())["sessions"]
    assert [x["start_step"] for x in sessions] == [0, 6]
    for name in ("last", "averaged", "best"):
        a = load_file(full / name / "model.safetensors")
        b = load_file(broken / name / "model.safetensors")
        assert all(torch.equal(a[k], b[k]) for k in a), name
    steps = [(r["step"], r["split"]) for r in _records(broken)]
    assert steps == [(r["step"], r["split"]) for r in _records(full)]  # no duplicated lines


def test_bad_input(tiny_data: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown language 'fr'.*de, en"):
        train_translation(tiny_config(src="fr"), tiny_data, tmp_path / "a")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        train_translation(tiny_config(), tmp_path / "nodata", tmp_path / "b")
    with pytest.raises(FileNotFoundError, match=r"holds no run\.json"):
        train_translation(tiny_config(), tiny_data, tmp_path / "c", resume=True)
    with pytest.raises(ValueError, match="give a training budget"):
        tiny_config(max_steps=None)
    with pytest.raises(ValueError, match="both 'de'"):
        tiny_config(tgt="de")
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        tiny_config(label_smoothing=1.0)
    done = tmp_path / "d"
    train_translation(tiny_config(max_steps=2), tiny_data, done)
    with pytest.raises(FileExistsError, match="already holds a run"):
        train_translation(tiny_config(max_steps=2), tiny_data, done)
    with pytest.raises(ValueError, match="other settings than the run's: d_model"):
        train_translation(tiny_config(max_steps=4, d_model=16), tiny_data, done, resume=True)
