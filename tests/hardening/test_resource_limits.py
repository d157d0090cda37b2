"""Resource limits: runs that cannot fit are refused up front, and a checkpoint whose config does
not describe its weights is refused before a model is built.

- :mod:`attnlab.analysis.memory_check`: the available memory (``MemAvailable``, lowered by a
  cgroup limit, v1 or v2), the training and generation estimates (the analysis formulas), and
  :func:`check_fits`' message (the estimate, its parts, the available memory, the flag).
- ``attnlab train <recipe>``: a model too large for any machine exits with status 2 naming the
  estimate, before any weight is allocated; a tiny run passes; with the available memory faked
  small, the tiny run is refused and ``--ignore-memory-check`` lets it train.
- ``attnlab generate``: the same for attnlab and Hugging Face checkpoints.
- :func:`attnlab.from_pretrained`: a ``config.json`` edited to another size is refused with both
  parameter counts (from the safetensors header) and the model is never built.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import attnlab
from attnlab import BERTConfig, GPTConfig, TransformerConfig, ViTConfig, build_model
from attnlab import pretrained as checkpoint_module
from attnlab.analysis import count_params, kv_cache_bytes, training_memory
from attnlab.analysis import memory_check as mc
from attnlab.analysis.text import human_bytes
from attnlab.cli import main
from attnlab.interop import CheckpointMismatchError, save_hf
from attnlab.models.cnn import CNNConfig
from attnlab.pretrained import check_param_count, safetensors_numel
from attnlab.training.recipes import base as recipes
from attnlab.transforms.decode_weights import copy_numel

GIB = 2**30
TINY_GPT = GPTConfig(vocab_size=50, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=8,
                     eos_id=None)  # fmt: skip
TINY = {
    "gpt": TINY_GPT,
    "bert": BERTConfig(vocab_size=110, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=8),
    "vit": ViTConfig(
        image_size=8, patch_size=4, n_classes=3, d_model=16, n_heads=2, n_layers=1, d_ff=32
    ),
    "transformer": TransformerConfig(vocab_size=50, d_model=16, n_heads=2, n_layers=1, d_ff=32),
}
# far beyond any machine: 65536 wide, 512 layers, about 26 trillion parameters
HUGE = ["--d_model=65536", "--n_heads=512", "--n_layers=512", "--d_ff=262144"]
TRAIN = ["--steps=1", "--warmup=0", "--eval_batches=1", "--d_model=16", "--n_heads=2",
         "--n_layers=1", "--d_ff=32", "--max_seq_len=8", "--batch_size=2",
         "--no-progress"]  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    file = tmp_path / "corpus.txt"
    file.write_text("To be, or not to be, that is the question.\n" * 40, encoding="utf-8")
    return file


def fake_available(monkeypatch: pytest.MonkeyPatch, n_bytes: int) -> None:
    monkeypatch.setattr(mc, "available_memory", lambda: (n_bytes, "a test's figure"))


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``attnlab argv`` in process: (exit status, stderr)."""
    try:
        status = main(argv)
    except SystemExit as e:
        status = int(e.code or 0)
    return status, capsys.readouterr().err


# ---------------------------------------------------------------------------- available memory


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_available_memory_reads_meminfo_and_cgroup_limits(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    write(meminfo, "MemTotal:  8000000 kB\nMemFree:  100 kB\nMemAvailable:   4000000 kB\n")
    v2, v1, none = tmp_path / "v2", tmp_path / "v1", tmp_path / "none"
    none.mkdir()
    assert mc.available_memory(meminfo, none) == (4000000 * 1024, "MemAvailable in /proc/meminfo")
    write(v2 / "memory.max", f"{GIB}\n")
    write(v2 / "memory.current", f"{GIB // 2}\n")
    write(v2 / "memory.stat", "anon 1\ninactive_file 1048576\nactive_file 9\n")
    room = GIB // 2 + 2**20  # the limit - usage + reclaimable page cache
    assert mc.available_memory(meminfo, v2) == (room, "room under the cgroup memory limit")
    write(v2 / "memory.max", "max\n")  # no limit
    assert mc.available_memory(meminfo, v2)[0] == 4000000 * 1024  # type: ignore[index]
    write(v1 / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")  # v1's "no limit"
    write(v1 / "memory" / "memory.usage_in_bytes", "5\n")
    assert mc.available_memory(meminfo, v1)[0] == 4000000 * 1024  # type: ignore[index]
    write(v1 / "memory" / "memory.limit_in_bytes", f"{GIB}\n")
    write(v1 / "memory" / "memory.stat", "total_inactive_file 0\n")
    assert mc.available_memory(meminfo, v1) == (GIB - 5, "room under the cgroup memory limit")
    write(v1 / "memory" / "memory.usage_in_bytes", f"{2 * GIB}\n")  # over the limit: no room
    assert mc.available_memory(meminfo, v1) == (0, "room under the cgroup memory limit")
    assert mc.available_memory(tmp_path / "missing", none) is None  # not Linux: unknown


def test_this_machine_reports_its_memory() -> None:
    if not Path("/proc/meminfo").is_file():
        pytest.skip("no /proc/meminfo (not Linux)")
    found = mc.available_memory()
    assert found is not None and found[0] > 0


# ---------------------------------------------------------------------------- estimates


@pytest.mark.parametrize("name", list(TINY))
def test_training_estimate_is_the_analysis_formula(name: str) -> None:
    config = TINY[name]
    estimate = mc.estimate_training(config, batch=3)
    assert estimate is not None
    assert estimate.total == training_memory(config, batch=3).total
    assert estimate.parts["weights"] == 4 * count_params(config)
    assert estimate.parts["optimizer"] == 8 * count_params(config)  # Adam's two moments


def test_estimates_for_what_the_analysis_cannot_model_are_none() -> None:
    cnn = CNNConfig(in_channels=1, n_classes=10, channels=8, dropout=0.0)
    assert mc.estimate_training(cnn, batch=2) is None
    assert mc.estimate_generation(TINY["bert"], batch=1, prompt_len=4, max_new_tokens=2) is None
    mc.check_fits(None, available=(0, "nothing"))  # nothing to check: passes


def test_generation_estimate_counts_weights_cache_and_prefill() -> None:
    with torch.device("meta"):
        copied = copy_numel(attnlab.GPT(TINY_GPT))  # the decoding copies of fp32 on the CPU
    assert copied == copy_numel(TINY_GPT) > 0  # also from the config alone
    e = mc.estimate_generation(
        TINY_GPT, batch=2, prompt_len=5, max_new_tokens=3, num_beams=2, decode_copy_numel=copied
    )
    assert e is not None
    assert e.parts["weights"] == 4 * count_params(TINY_GPT)
    assert e.parts["kv_cache"] == kv_cache_bytes(TINY_GPT, 8, batch=4)
    # the last position's logits (what the session computes) + one layer's scores and probs
    assert e.parts["prefill"] == 4 * (2 * 50 + 2 * 2 * 2 * 5 * 5)
    assert e.parts["decode_copies"] == 4 * copied > 0
    gpu = mc.estimate_generation(TINY_GPT, batch=2, prompt_len=5, max_new_tokens=3)
    assert gpu is not None and "decode_copies" not in gpu.parts
    tr = mc.estimate_generation(TINY["transformer"], batch=1, prompt_len=6, max_new_tokens=4)
    assert tr is not None and tr.parts["kv_cache"] == kv_cache_bytes(TINY["transformer"], 4,
                                                                     src_len=6)  # fmt: skip
    with pytest.raises(ValueError, match="prompt_len must be positive, got 0"):
        mc.estimate_generation(TINY_GPT, batch=1, prompt_len=0, max_new_tokens=1)


def test_check_fits_names_the_estimate_and_the_available_memory() -> None:
    e = mc.estimate_training(TINY_GPT, batch=2)
    assert e is not None
    mc.check_fits(e, available=(e.total, "exactly enough"))
    with pytest.raises(mc.MemoryLimitError) as info:
        mc.check_fits(e, available=(e.total - 1, "a test's figure"))
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    for part in ("training GPTConfig", "batch 2 x 8 tokens", human_bytes(e.total),
                 f"weights {human_bytes(e.parts['weights'])}", human_bytes(e.total - 1),
                 "(a test's figure)", "--ignore-memory-check"):  # fmt: skip
        assert part in message, (part, message)


# ---------------------------------------------------------------------------- the CLI


def test_train_refuses_a_model_that_cannot_fit_before_building_it(
    tmp_path: Path,
    corpus: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_build(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model was built")

    monkeypatch.setattr(recipes, "_build", no_build)
    argv = ["train", "shakespeare-char", f"--data={corpus}", *HUGE, "--runs-dir", str(tmp_path)]
    status, err = run_cli(argv, capsys)
    assert status == 2, err
    assert "training GPTConfig (float32, Adam, batch 12 x 64 tokens) needs an estimated" in err
    assert "TiB (weights" in err and "of memory available" in err
    assert "--ignore-memory-check" in err
    assert not (tmp_path / "shakespeare-char").exists()


def test_train_checks_memory_unless_told_not_to(
    tmp_path: Path,
    corpus: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    argv = ["train", "shakespeare-char", f"--data={corpus}", *TRAIN, "--runs-dir", str(tmp_path)]
    assert run_cli(argv, capsys)[0] == 0  # a tiny run fits the real machine
    fake_available(monkeypatch, 1024)
    status, err = run_cli([*argv, "--name", "refused"], capsys)
    assert status == 2 and "more than the 1.00 KiB of memory available (a test's figure)" in err
    assert run_cli([*argv, "--name", "forced", "--ignore-memory-check"], capsys)[0] == 0
    assert (tmp_path / "forced" / "checkpoints" / "latest").is_file()


@pytest.mark.filterwarnings("ignore:Unable to enable fault handler")  # torchrun's error recorder
def test_train_under_torchrun_estimates_one_process_share_of_the_batch(
    tmp_path: Path,
    corpus: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each of torchrun's processes computes batch_size / world_size sequences of a micro-batch
    (the check runs before any process group is joined)."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    argv = ["train", "shakespeare-char", f"--data={corpus}", *HUGE, "--runs-dir", str(tmp_path)]
    status, err = run_cli(argv, capsys)
    assert status == 2 and "(float32, Adam, batch 3 x 64 tokens) needs an estimated" in err, err
    monkeypatch.setenv("WORLD_SIZE", "5")  # 12 sequences do not split over 5 processes
    status, err = run_cli(argv, capsys)
    assert status == 2 and "not divisible by the world size 5" in err, err


REVERSE_TINY = ["--vocab", "12", "--min-len", "2", "--max-len", "4", "--eval-size", "4",
                "--d-model", "16", "--layers", "1", "--heads", "2", "--d-ff", "32", "--steps",
                "2", "--warmup", "1", "--batch-size", "4", "--no-progress"]  # fmt: skip
REVERSE_HUGE = ["--d-model", "65536", "--heads", "512", "--layers", "512", "--d-ff", "262144"]


def test_train_reverse_checks_memory_unless_told_not_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "reverse"
    status, err = run_cli(["train", "reverse", *REVERSE_HUGE, "--out", str(out)], capsys)
    assert status == 2, err
    assert "training TransformerConfig (float32, Adam, batch 128 x 17 tokens) needs" in err
    assert "TiB (weights" in err and "--ignore-memory-check" in err
    assert not out.exists()
    fake_available(monkeypatch, 1024)
    status, err = run_cli(["train", "reverse", *REVERSE_TINY, "--out", str(out)], capsys)
    assert status == 2 and "more than the 1.00 KiB of memory available" in err, err
    argv = ["train", "reverse", *REVERSE_TINY, "--out", str(out), "--ignore-memory-check"]
    assert run_cli(argv, capsys)[0] == 0
    assert (out / "checkpoints" / "step_00000002" / "model.safetensors").is_file()


def test_train_translate_checks_memory_before_reading_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    missing, out = tmp_path / "no-data", tmp_path / "run"
    argv = ["train", "translate", "--data", str(missing), "--out", str(out), "--d-model", "65536",
            "--n-heads", "512", "--n-layers", "512", "--d-ff", "262144"]  # fmt: skip
    status, err = run_cli(argv, capsys)
    assert status == 2, err
    # max_tokens 2048 as sequences of max_len 128
    assert "training TransformerConfig (float32, Adam, batch 16 x 128 tokens) needs" in err
    assert "TiB (weights" in err and "--ignore-memory-check" in err
    assert not out.exists()
    fake_available(monkeypatch, 1024)
    tiny = ["train", "translate", "--data", str(missing), "--out", str(out), "--d-model", "16",
            "--n-heads", "2", "--n-layers", "1", "--d-ff", "32", "--vocab-size", "300"]  # fmt: skip
    status, err = run_cli(tiny, capsys)
    assert status == 2 and "more than the 1.00 KiB of memory available" in err, err
    status, err = run_cli([*tiny, "--ignore-memory-check"], capsys)  # on to the data: missing
    assert status == 2 and "memory available" not in err and str(missing) in err, err


def test_generate_checks_memory_unless_told_not_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, hf = tmp_path / "ours", tmp_path / "hf"
    attnlab.save_pretrained(build_model(TINY_GPT), ours)
    save_hf(build_model(TINY_GPT), hf)
    args = ["--ids", "1,2,3", "--max-new-tokens", "2"]
    assert run_cli(["generate", str(ours), *args], capsys)[0] == 0
    fake_available(monkeypatch, 1024)
    status, err = run_cli(["generate", str(ours), *args], capsys)
    assert status == 2
    assert "generating with GPTConfig (float32, 1 sequence of 3 + 2 tokens) needs an" in err
    assert "kv cache" in err and "1.00 KiB of memory available" in err
    status, err = run_cli(["generate", str(hf), *args], capsys)  # the config, not the file
    assert status == 2 and "generating with GPTConfig (float32, 1 sequence of 3 + 2" in err
    (hf / "model.safetensors").rename(hf / "pytorch_model.bin")  # not a real .bin: only sized
    status, err = run_cli(["generate", str(hf), *args], capsys)
    size = human_bytes((hf / "pytorch_model.bin").stat().st_size)
    assert status == 2 and f"loading {hf} needs an estimated {size} (weights {size})" in err
    (hf / "pytorch_model.bin").rename(hf / "model.safetensors")
    for path in (ours, hf):
        assert run_cli(["generate", str(path), *args, "--ignore-memory-check"], capsys)[0] == 0


# ---------------------------------------------------------------------------- from_pretrained


@pytest.mark.parametrize("name", list(TINY))
def test_header_count_equals_the_config_count(name: str, tmp_path: Path) -> None:
    model = build_model(TINY[name])
    attnlab.save_pretrained(model, tmp_path)
    assert safetensors_numel(tmp_path / "model.safetensors") == count_params(TINY[name])
    check_param_count(tmp_path, TINY[name])  # passes
    loaded = attnlab.from_pretrained(tmp_path)
    for key, value in model.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key


@pytest.mark.parametrize(
    ("edit", "implied"),
    [({"d_model": 32}, "d_model=32"), ({"n_layers": 3}, "n_layers=3"),
     ({"vocab_size": 5000}, "vocab_size=5000")],
)  # fmt: skip
def test_an_edited_config_is_refused_before_the_model_is_built(
    edit: dict[str, int], implied: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    attnlab.save_pretrained(build_model(TINY_GPT), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **edit}))

    def no_build(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model was built")

    monkeypatch.setattr(checkpoint_module, "build_model", no_build)
    edited = checkpoint_module.load_config(tmp_path)
    with pytest.raises(CheckpointMismatchError) as info:
        attnlab.from_pretrained(tmp_path)
    message = str(info.value)
    assert f"implies {count_params(edited):,} parameters" in message and implied in message
    assert f"holds {count_params(TINY_GPT):,}" in message


def test_header_count_of_a_missing_or_foreign_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such weights file"):
        safetensors_numel(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").write_bytes(b"\x80\x04not a safetensors file")
    with pytest.raises(Exception, match=r"(?i)header|metadata|invalid"):
        safetensors_numel(tmp_path / "model.safetensors")
