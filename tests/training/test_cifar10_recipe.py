"""The cifar10 recipe: a few steps of each model family into a run directory, an interrupted run
resumed exactly (sampler position and augmentation generator included), evaluate and viz.

The data is a small fake copy in the layout of the real one (with a SHA256SUMS manifest, as a
download writes), so each test reads 150 images instead of 60,000."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from attnlab.cli import main
from attnlab.cli.train import recipe_types
from attnlab.data.cifar10 import FILES, MANIFEST, sha256_file
from attnlab.training import Trainer
from attnlab.training.image_objective import AugmentedImageStream
from attnlab.training.metrics import TIMING_KEYS
from attnlab.training.recipes import get_recipe, load_run, prepare, train_recipe
from attnlab.training.recipes.cifar10 import TRANSFORMER_TRAIN, evaluate_split
from attnlab.training.state import read_training_state
from attnlab.transforms.precision import Float32Attention

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def fake_cifar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 training and 3 test images per class; a class is a tinted noise pattern."""
    directory = tmp_path_factory.mktemp("cifar10")
    rng = np.random.default_rng(0)
    lines = []
    for name, per_class in zip(FILES, (12, 3), strict=True):
        labels = np.repeat(np.arange(10, dtype=np.uint8), per_class)
        rng.shuffle(labels)
        noise = rng.integers(0, 96, (len(labels), 32, 32, 3))
        tint = np.stack([labels * 15, 255 - labels * 20, (labels % 3) * 70], axis=-1)
        images = (noise + tint[:, None, None, :] * 0.6).clip(0, 255).astype(np.uint8)
        np.savez(directory / name, images=images, labels=labels)
        lines.append(f"{sha256_file(directory / name)}  {name}")
    (directory / MANIFEST).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


def small(fake: Path, **extra: Any) -> dict[str, Any]:
    """Overrides of a tiny run on the fake data (20 validation images, 100 for training)."""
    return {"data": str(fake), "n_val": 20, "steps": 4, "batch_size": 8, "progress": False,
            "log_every": 1, **extra}  # fmt: skip


def metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    ("model", "shrink"),
    [("resnet20", {}), ("vit-cifar", {"n_layers": 1, "d_model": 48, "n_heads": 2, "d_ff": 96}),
     ("cct-cifar", {"n_layers": 1})],
)  # fmt: skip
def test_each_model_trains_into_a_run_directory(
    model: str, shrink: dict[str, Any], fake_cifar: Path, tmp_path: Path
) -> None:
    prepared, result = train_recipe(
        "cifar10", tmp_path / "run", small(fake_cifar, model=model, **shrink)
    )
    assert result.step == 4 and result.stopped_by == "steps" and all(np.isfinite(result.losses))
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["recipe"] == "cifar10" and record["options"]["model"] == model
    assert record["data"] == {"dataset": "CIFAR-10", "test images": 30, "train images": 100,
                              "val images": 20}  # fmt: skip
    assert all(record["model"][k] == v for k, v in shrink.items())
    train = prepared.train
    if model == "resnet20":
        assert (train.optimizer, train.lr, train.label_smoothing) == ("sgd", 0.1, 0.0)
    else:  # the Transformers' optimisation where no flag says otherwise
        assert all(getattr(train, k) == v for k, v in TRANSFORMER_TRAIN.items())
    # an epoch of the real set (its 50,000 images are what the options imply), 5% of 4 steps
    assert train.eval_every == 6248 and train.warmup == 0
    lines = metrics(tmp_path / "run")
    assert [r["step"] for r in lines if r["split"] == "train"] == [1, 2, 3, 4]
    (val,) = [r for r in lines if r["split"] == "val"]
    assert val["step"] == 4 and 0 <= val["accuracy"] <= 1
    assert [r["epoch"] for r in lines if r["split"] == "train"] == [0.08, 0.16, 0.24, 0.32]
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step_00000004"


def test_flags_given_win_over_the_family_defaults(fake_cifar: Path) -> None:
    p = prepare("cifar10", small(fake_cifar, model="vit-cifar", n_layers=1, lr=3e-4,
                                 warmup=2, eval_every=2))  # fmt: skip
    assert (p.train.lr, p.train.warmup, p.train.eval_every, p.train.optimizer) == (
        3e-4, 2, 2, "adamw")  # fmt: skip


def test_an_interrupted_run_resumes_exactly(
    fake_cifar: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Crash after the step-3 checkpoint, resume: the losses, the metrics and every weight and
    BN buffer equal the uninterrupted run's. Batches of 24 over 100 images span epochs, and
    RandAugment + mixup draw from the checkpointed generator."""
    overrides = small(fake_cifar, steps=7, batch_size=24, checkpoint_every=3, randaug_ops=2,
                      mixup_alpha=0.4, mix_prob=0.5, label_smoothing=0.1)  # fmt: skip
    _, full = train_recipe("cifar10", tmp_path / "full", overrides)
    real_next = AugmentedImageStream.next_batch

    def crash_at_step_5(self: AugmentedImageStream) -> Any:
        if self.drawn >= 4 * 24:
            raise KeyboardInterrupt
        return real_next(self)

    monkeypatch.setattr(AugmentedImageStream, "next_batch", crash_at_step_5)
    with pytest.raises(KeyboardInterrupt):
        train_recipe("cifar10", tmp_path / "cut", overrides)
    monkeypatch.undo()
    saved = read_training_state(tmp_path / "cut" / "checkpoints" / "step_00000003")
    assert saved["data"]["drawn"] == 72 and "generator" in saved["data"]
    _, resumed = train_recipe("cifar10", tmp_path / "cut", {"progress": False}, resume=True)
    assert full.losses[3:] == resumed.losses and resumed.step == 7
    a, b = load_run(tmp_path / "full").model, load_run(tmp_path / "cut").model
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name

    def comparable(run: str) -> list[dict[str, Any]]:
        timing = TIMING_KEYS
        return [{k: v for k, v in r.items() if k not in timing} for r in metrics(tmp_path / run)]

    assert comparable("cut") == comparable("full")


def test_evaluate_and_viz_confusion(
    fake_cifar: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    train_recipe("cifar10", run, small(fake_cifar, steps=2, n_layers=1, model="cct-cifar"))
    assert main(["evaluate", str(run), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    test = report["splits"]["test"]
    cm = np.array(test["confusion"])
    assert (
        cm.shape == (10, 10) and cm.sum() == test["images"] == 30 and cm.sum(1).tolist() == [3] * 10
    )
    assert test["accuracy"] == pytest.approx(np.trace(cm) / 30)
    assert report["whole_split_accuracy"]["test"] == test["accuracy"]
    assert test["per_class"]["cat"] == pytest.approx(cm[3, 3] / 3)
    assert test["dataset"] == "CIFAR-10" and report["splits"]["val"]["images"] == 20
    # the same numbers from the library, and as a picture
    assert evaluate_split(load_run(run), "test").confusion == test["confusion"]
    assert (
        main(["viz", "confusion", str(run), "--out", str(tmp_path / "cm.png"), "--dpi", "40"]) == 0
    )
    out = capsys.readouterr().out
    assert f"accuracy {test['accuracy']:.2%} on 30 images" in out
    assert (tmp_path / "cm.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["evaluate", str(run)]) == 0
    text = capsys.readouterr().out
    assert "test accuracy (whole split, CIFAR-10)" in text and "confusion (rows: true class" in text


def test_command_line_flags_cover_every_model_and_are_checked_against_the_one_built(
    fake_cifar: Path,
) -> None:
    types = recipe_types(get_recipe("cifar10"))
    assert {"stage_channels", "d_model", "patch_size", "conv_layers", "mixup_alpha"} <= set(types)
    assert "n_classes" not in types and "image_size" not in types  # fixed by the data
    with pytest.raises(ValueError, match="unknown key 'd_model'"):
        prepare("cifar10", small(fake_cifar, model="resnet20", d_model=64))
    with pytest.raises(ValueError, match="model='resnet99' is not valid"):
        prepare("cifar10", small(fake_cifar, model="resnet99"))
    with pytest.raises(ValueError, match="mix_prob must be in"):
        prepare("cifar10", small(fake_cifar, mix_prob=2.0))
    for bad in (0, 25):
        with pytest.raises(ValueError, match=f"n_val must be a positive multiple of 10.*got {bad}"):
            prepare("cifar10", small(fake_cifar, n_val=bad))


def test_bf16_and_channels_last_are_applied_to_built_and_rebuilt_models(
    fake_cifar: Path, tmp_path: Path
) -> None:
    over = small(fake_cifar, model="vit-cifar", n_layers=1, d_model=48, n_heads=2, d_ff=96,
                 precision="bf16", channels_last=True, steps=2)  # fmt: skip
    prepared, result = train_recipe("cifar10", tmp_path / "run", over)
    assert all(np.isfinite(result.losses))
    for model in (prepared.model, load_run(tmp_path / "run").model):
        assert isinstance(model.layers[0].self_attn.backend, Float32Attention)
        weight = model.patch_embed.proj.weight
        assert weight.is_contiguous(memory_format=torch.channels_last)
    batch = Trainer(prepared.model, prepared.objective, prepared.train).stream.next_batch()
    assert batch.images.is_contiguous(memory_format=torch.channels_last)


def test_resume_keeps_the_settings_of_a_model_other_than_the_default(
    fake_cifar: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run's model fields are those of its own --model (here ViT's), not the default's."""
    run = str(tmp_path / "run")
    flags = ["--data", str(fake_cifar), "--n-val", "20", "--batch-size", "8", "--no-progress",
             "--model", "vit-cifar", "--n-layers", "1", "--d-model", "48",
             "--n-heads", "2"]  # fmt: skip
    assert main(["train", "cifar10", *flags, "--steps", "2", "--out", run]) == 0
    assert (
        main(["train", "cifar10", "--steps", "3", "--out", run, "--resume", "--no-progress"]) == 0
    )
    assert "trained to step 3" in capsys.readouterr().out
    assert load_run(run).model_config.d_model == 48
    assert main(["train", "cifar10", "--d-model", "64", "--out", run, "--resume"]) == 2
    assert "--resume with other settings than the run's (d_model)" in capsys.readouterr().err
