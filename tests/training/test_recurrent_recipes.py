"""Mamba, LSTM and GRU through the one trainer: ``shakespeare-char --arch ARCH`` and ``recall``
write the same run directory as every recipe, resume bitwise, and their runs are read back by
``from_pretrained``, ``generate``, ``sample`` and ``evaluate``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.models import RNNLM, MambaLM
from attnlab.tokenizers import load_tokenizer
from attnlab.training import load_run
from attnlab.training.optim import classify_parameters
from attnlab.training.recipes import get_recipe, prepare, train_recipe
from attnlab.training.rundir import latest_checkpoint
from attnlab.training.state import load_training_state

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 40
TRAIN = {"steps": 6, "warmup": 1, "schedule": "constant", "eval_every": 3, "eval_batches": 1,
         "batch_size": 4, "block_size": 8, "checkpoint_every": 3, "log_every": 1,
         "progress": False}  # fmt: skip
ARCHS: dict[str, dict[str, Any]] = {
    "mamba": {"d_model": 16, "n_layers": 1, "d_state": 4},
    "lstm": {"d_model": 16, "n_layers": 2, "dropout": 0.1},  # the RNG state must resume too
    "gru": {"d_model": 16, "n_layers": 1},
}
MODEL_CLASS = {"mamba": MambaLM, "lstm": RNNLM, "gru": RNNLM}


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def _overrides(arch: str, corpus: Path, **extra: Any) -> dict[str, Any]:
    return {"arch": arch, "data": str(corpus), **TRAIN, **ARCHS[arch], **extra}


def _weights(run_dir: Path, arch: str, corpus: Path) -> dict[str, torch.Tensor]:
    model = prepare("shakespeare-char", _overrides(arch, corpus)).model
    checkpoint = latest_checkpoint(run_dir)
    assert checkpoint is not None
    load_training_state(checkpoint, model)
    return model.state_dict()


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_run_directory_and_exact_resume(arch: str, corpus: Path, tmp_path: Path) -> None:
    prepared, full = train_recipe("shakespeare-char", tmp_path / "full", _overrides(arch, corpus))
    assert isinstance(prepared.model, MODEL_CLASS[arch]) and full.step == 6
    if arch != "mamba":
        assert prepared.model_config.cell == arch
    run = tmp_path / "full"
    record = json.loads((run / "run.json").read_text())
    model_type = "mamba" if arch == "mamba" else "rnn"
    assert record["recipe"] == "shakespeare-char" and record["options"]["arch"] == arch
    assert record["model"]["model_type"] == model_type
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines if m["split"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert [m["step"] for m in lines if m["split"] == "val"] == [3, 6]
    assert (run / "tokenizer.json").is_file() and (run / "checkpoints" / "latest").is_file()

    # a first session of 3 steps (a constant schedule: the budget does not change the rates)
    _, first = train_recipe("shakespeare-char", tmp_path / "split",
                            _overrides(arch, corpus, steps=3))  # fmt: skip
    torch.manual_seed(123)  # another process's RNG: the resume must restore the run's
    _, second = train_recipe("shakespeare-char", tmp_path / "split",
                             _overrides(arch, corpus), resume=True)  # fmt: skip
    assert (first.step, second.step) == (3, 6)
    assert first.losses + second.losses == full.losses  # bitwise
    a, b = _weights(run, arch, corpus), _weights(tmp_path / "split", arch, corpus)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_runs_are_read_back_everywhere(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """from_pretrained, model.generate == attnlab.generate, the CLI's generate/sample/evaluate,
    and evaluate's figure equals the trainer's last validation line."""
    run = tmp_path / "run"
    train_recipe("shakespeare-char", run, _overrides("mamba", corpus))
    model = attnlab.from_pretrained(run)
    assert isinstance(model, MambaLM)
    tokenizer = load_tokenizer(run / "tokenizer.json")
    prompt = tokenizer.encode("First")
    out = model.generate([prompt], max_new_tokens=12)
    assert out.shape == (1, 12)
    assert torch.equal(out, attnlab.generate(model, [prompt], max_new_tokens=12))
    assert main(["generate", str(run), "--prompt", "First", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("First")  # the prompt echoed, then the new text
    assert main(["sample", str(run), "--prompt", "Be", "--max-new-tokens", "8"]) == 0
    assert capsys.readouterr().out.startswith("Be")
    assert main(["evaluate", str(run), "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)["metrics"]
    last = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    val = [m for m in last if m["split"] == "val"][-1]
    assert metrics["val_loss"] == pytest.approx(val["loss"], abs=1e-6)
    rebuilt = load_run(run)
    assert isinstance(rebuilt.model, MambaLM) and rebuilt.checkpoint is not None


def test_cli_arch_flags(corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["train", "shakespeare-char", f"--data={corpus}", "--runs-dir", str(tmp_path),
            "--steps=2", "--warmup=1", "--eval-batches=1", "--batch-size=2",
            "--block-size=8", "--no-progress"]  # fmt: skip
    assert main([*base, "--arch", "gru", "--d-model", "8", "--n-layers", "1"]) == 0
    assert (tmp_path / "shakespeare-char-gru" / "run.json").is_file()  # its own run name
    capsys.readouterr()
    assert main([*base, "--arch", "mamba", "--n-heads", "2"]) == 2
    err = capsys.readouterr().err
    assert "--n-heads is not an option of MambaConfig" in err and "--d-state" in err
    assert main([*base, "--d-state", "4"]) == 2  # a Mamba flag for the GPT
    assert "--d-state is not an option of GPTConfig" in capsys.readouterr().err
    assert main(["train", "shakespeare-mlm", "--arch", "lstm"]) == 2  # the MLM has no such arch
    assert "expected one of classic, modern" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "shakespeare-char", "--help"])
    text = capsys.readouterr().out
    assert "model (MambaConfig):" in text and "--d-state" in text
    assert "model (RNNConfig):" in text and "--d-hidden" in text and "--cell" not in text


def test_gpt_block_size_and_mamba_decay_groups(corpus: Path) -> None:
    p = prepare("shakespeare-char", {"data": str(corpus), "block_size": 16})
    assert p.objective.block_size == 16  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="block_size=65 is longer than the model's max_seq_len"):
        prepare("shakespeare-char", {"data": str(corpus), "block_size": 65})
    default = prepare("shakespeare-char", {"data": str(corpus), "arch": "mamba", "n_layers": 1})
    assert default.objective.block_size == 64  # type: ignore[attr-defined]
    kinds = classify_parameters(default.model)
    assert kinds["layers.0.mixer.A_log"] == "bias"  # no weight decay, as the reference
    assert kinds["layers.0.mixer.in_proj.weight"] == "weight"


def test_recall_recipe_trains_every_family_and_resumes(tmp_path: Path) -> None:
    recipe = get_recipe("recall")
    small = {"steps": 4, "warmup": 1, "schedule": "constant", "eval_every": 2,
             "eval_batches": 1, "batch_size": 4, "checkpoint_every": 2, "distance": 5,
             "progress": False}  # fmt: skip
    sizes = {"classic": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32},
             "mamba": ARCHS["mamba"], "lstm": {"d_model": 16, "n_layers": 1}}  # fmt: skip
    for arch, size in sizes.items():
        prepared, result = train_recipe(recipe, tmp_path / arch, {**small, **size, "arch": arch})
        assert result.step == 4 and 0.0 <= result.evals[-1]["val_accuracy"] <= 1.0
        if arch == "classic":
            assert prepared.model_config.max_seq_len == 5 + 2 * 4 + 2  # the task's length
    _, full = train_recipe(recipe, tmp_path / "full", {**small, **sizes["mamba"], "arch": "mamba"})
    over = {**small, **sizes["mamba"], "arch": "mamba"}
    train_recipe(recipe, tmp_path / "split", {**over, "steps": 2})
    _, rest = train_recipe(recipe, tmp_path / "split", over, resume=True)
    assert rest.losses == full.losses[2:]  # the task's draws resume with the data position
