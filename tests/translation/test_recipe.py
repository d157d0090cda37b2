"""The translation recipe on the one trainer: loss decreases, exact resume after an interruption,
checkpoint averaging (§6.1), the files of a run, attnlab 0.1's option names, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab.models.transformer import EncoderDecoderTransformer, TransformerConfig
from attnlab.pretrained import load_attnlab, save_pretrained
from attnlab.training import RunDir, RunDirError, Trainer, average_checkpoints
from attnlab.training.metrics import TIMING_KEYS

from .conftest import tiny_config, train


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_loss_decreases_and_run_files(tiny_run: Path) -> None:
    train_records = [r for r in _records(tiny_run) if r["split"] == "train"]
    assert [r["step"] for r in train_records] == list(range(1, 31))
    first = sum(r["loss"] for r in train_records[:3]) / 3
    last = sum(r["loss"] for r in train_records[-3:]) / 3
    assert last < first - 1.0, (first, last)
    assert train_records[-1]["epoch"] > 0  # the data position in epochs
    val = [r for r in _records(tiny_run) if r["split"] == "val"]
    assert [r["step"] for r in val] == [10, 20, 30]
    assert val[-1]["loss"] < val[0]["loss"]
    assert {"loss", "ppl", "bleu", "accuracy"} <= set(val[0])
    final = [r for r in _records(tiny_run) if r["split"] == "final"]
    assert final[0]["model"] == "averaged" and final[0]["averaged_steps"] == [20, 25, 30]
    for name in ("averaged", "best", "last"):
        for f in ("model.safetensors", "config.json", "tokenizer.json", "export.json"):
            assert (tiny_run / name / f).is_file(), (name, f)
    info = json.loads((tiny_run / "averaged" / "export.json").read_text())
    assert info["averaged_steps"] == [20, 25, 30] and info["src"] == "de"
    run = json.loads((tiny_run / "run.json").read_text())
    assert run["data"]["train_pairs"] == 300 and run["data"]["train_dropped"] == 0
    assert run["recipe"] == "translate" and set(run["options"]) == {
        "src", "tgt", "data", "vocab_size", "min_frequency", "max_len", "max_tokens",
        "train_limit", "eval_bleu_sentences", "arch", "attention",
    }  # only the recipe's own options  # fmt: skip
    # shared source/target embeddings tied to the output projection (§3.4)
    model = load_attnlab(tiny_run / "last")
    assert model.src_embed is model.tgt_embed
    assert model.lm_head.weight.data_ptr() == model.tgt_embed.weight.data_ptr()


def test_averaged_model_is_the_mean_of_the_last_checkpoints(tiny_run: Path) -> None:
    dirs = RunDir(tiny_run).checkpoint_dirs()
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
    """Killed at step 8 (last checkpoint: 6), resumed through the common trainer: the same
    weights, exports and metrics lines as a run never interrupted (the data position is the
    epoch stream's)."""
    overrides = {"max_steps": 9, "save_every": 3, "eval_every": 4}
    full = tmp_path / "full"
    train(tiny_data, full, **overrides)

    original = Trainer.train_step

    def crash_at_step_8(self: Trainer) -> tuple[float, int, float]:
        if self.step == 7:
            raise KeyboardInterrupt("simulated kill")
        return original(self)

    broken = tmp_path / "broken"
    monkeypatch.setattr(Trainer, "train_step", crash_at_step_8)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_data, broken, **overrides)
    monkeypatch.setattr(Trainer, "train_step", original)
    latest = RunDir(broken).latest()
    assert latest is not None and latest.name == "step_00000006"
    result = train(tiny_data, broken, resume=True, **overrides)
    assert result.step == 9
    sessions = json.loads((broken / "run.json").read_text())["sessions"]
    assert [x["resume"] for x in sessions] == [False, True]
    for name in ("last", "averaged", "best"):
        a = load_file(full / name / "model.safetensors")
        b = load_file(broken / name / "model.safetensors")
        assert all(torch.equal(a[k], b[k]) for k in a), name
    drop = TIMING_KEYS
    steps = [{k: v for k, v in r.items() if k not in drop} for r in _records(broken)]
    assert steps == [{k: v for k, v in r.items() if k not in drop} for r in _records(full)]


def test_bad_input(tiny_data: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown language 'fr'.*de, en"):
        train(tiny_data, tmp_path / "a", src="fr")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        train(tmp_path / "nodata", tmp_path / "b")
    with pytest.raises(ValueError, match="give a training budget"):
        train(tiny_data, tmp_path / "c", max_steps=None)
    with pytest.raises(ValueError, match="both 'de'"):
        train(tiny_data, tmp_path / "c", tgt="de")
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        train(tiny_data, tmp_path / "c", label_smoothing=1.0)
    done = tmp_path / "d"
    train(tiny_data, done, max_steps=2)
    with pytest.raises(RunDirError, match="already holds a run"):
        train(tiny_data, done, max_steps=2)
    with pytest.raises(RunDirError, match=r"other settings than the run's \(d_model\)"):
        train(tiny_data, done, resume=True, max_steps=4, d_model=16)
    assert tiny_config()["max_steps"] == 8


def test_without_bleu_the_best_model_follows_the_validation_loss(
    tiny_data: Path, tmp_path: Path
) -> None:
    train(tiny_data, tmp_path / "a", max_steps=2, eval_every=2, eval_bleu_sentences=0)
    info = json.loads((tmp_path / "a" / "run.json").read_text())
    assert info["train"]["best_metric"] == "val_loss"
    assert (tmp_path / "a" / "best").is_dir()
    with pytest.raises(ValueError, match="best_metric='val_bleu' is not measured"):
        train(tiny_data, tmp_path / "b", max_steps=2, eval_bleu_sentences=0, best_metric="bleu")
    assert not (tmp_path / "b" / "checkpoints").exists()  # refused before training


def test_the_recipe_draws_dropout_and_updates_as_attnlab_0_1() -> None:
    from attnlab.training.recipes import get_recipe

    train_config = get_recipe("translate").train
    assert train_config.reseed_dropout is False and train_config.optimizer_impl == "for-loop"
