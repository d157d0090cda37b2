"""``attnlab quantize`` and ``--quantize int8|int4`` on ``generate``/``sample`` (cli.quantize):
the written directory loads through ``from_pretrained`` and computes what in-memory quantization
computes, side files come along, bad input exits 2 with one line, and the memory estimate of a
quantized model counts its quantized weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab import GPT, GPTConfig
from attnlab.cli import main
from attnlab.cli.quantize import generation_estimate
from attnlab.tokenizers import CharTokenizer
from attnlab.transforms import Int4Linear, Int8Linear, quantize, quantized_weight_bytes

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

V = 40


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=V, d_model=64, n_heads=4, n_layers=2, d_ff=192, max_seq_len=32,
                    dropout=0.0, eos_id=None)  # fmt: skip
    directory = tmp_path / "fp32"
    GPT(cfg).save_pretrained(directory)
    text = "abcdefghijklmnopqrstuvwxyz .,;:!?'-ABCDE"  # V characters
    CharTokenizer.from_text(text).save(directory / "tokenizer.json")
    return directory


def _logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.randint(0, V, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        return model(ids)[0]


@pytest.mark.parametrize(
    ("argv", "fmt", "options"),
    [
        (["--bits", "8"], "int8", {}),
        (["--bits", "4"], "int4", {"group_size": 64}),  # gcd(64, 192) = 64: the largest fitting
        (["--bits", "4", "--group-size", "32", "--include-lm-head"], "int4",
         {"group_size": 32, "include_lm_head": True}),
    ],
)  # fmt: skip
def test_quantize_writes_a_directory_from_pretrained_loads(
    model_dir: Path, tmp_path: Path, argv: list[str], fmt: str, options: dict[str, object],
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    out = tmp_path / "q"
    assert main(["quantize", str(model_dir), *argv, "--out", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("quantize: GPT with ") and f"-> {fmt} (" in lines[0]
    assert lines[-1].startswith(f"wrote {out}: ") and "copied tokenizer.json" in lines[-1]
    assert {p.name for p in out.iterdir()} == {
        "config.json", "model.safetensors", "quantization.json", "tokenizer.json"
    }  # fmt: skip
    loaded = attnlab.from_pretrained(out)
    expected = quantize(attnlab.from_pretrained(model_dir), fmt, **options)  # type: ignore[arg-type]
    assert loaded.quantization_config == expected.quantization_config
    assert torch.equal(_logits(loaded), _logits(expected))  # disk round trip == in memory
    kind = Int8Linear if fmt == "int8" else Int4Linear
    assert isinstance(loaded.layers[0].ffn.up_proj, kind)
    record = json.loads((out / "quantization.json").read_text())
    assert record["config"]["format"] == fmt
    assert f"{sum(isinstance(m, kind) for m in loaded.modules())} layers {fmt}" in lines[-1]


def test_a_checkpoint_brings_its_runs_tokenizer_and_leaves_trainer_state(tmp_path: Path) -> None:
    checkpoint = tmp_path / "run" / "checkpoints" / "step_00000004"
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=V, d_model=32, n_heads=2, n_layers=1, d_ff=64, max_seq_len=16,
                    eos_id=None)  # fmt: skip
    GPT(cfg).save_pretrained(checkpoint)
    (checkpoint / "trainer_state.json").write_text("{}")
    (checkpoint / "trainer_state.safetensors").write_bytes(b"")
    (tmp_path / "run" / "tokenizer.json").write_text('{"run": 1}')
    out = tmp_path / "q"
    assert main(["quantize", str(checkpoint), "--bits", "8", "--out", str(out)]) == 0
    assert (out / "tokenizer.json").read_text() == '{"run": 1}'
    assert not (out / "trainer_state.json").exists()
    assert not (out / "trainer_state.safetensors").exists()


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = int(e.code or 0)
    assert code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_bad_input_exits_2_naming_the_problem(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    q, out = ["quantize", str(model_dir)], ["--out", str(tmp_path / "q")]
    assert "--group-size applies to --bits 4" in _error([*q, "--bits", "8", "--group-size", "32",
                                                         *out], capsys)  # fmt: skip
    err = _error([*q, "--bits", "4", "--group-size", "48", *out], capsys)
    assert "--group-size=48 does not divide in_features=64" in err
    assert not (tmp_path / "q").exists()  # refused before anything was written
    assert "invalid choice: '3'" in _error([*q, "--bits", "3", *out], capsys)
    assert "is the source directory" in _error([*q, "--bits", "8", "--out", str(model_dir)],
                                               capsys)  # fmt: skip
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    err = _error([*q, "--bits", "8", "--out", str(tmp_path / "busy")], capsys)
    assert "is not empty" in err and (tmp_path / "busy" / "notes.txt").read_text() == "mine"
    assert "has no best/ export" in _error([*q, "--bits", "8", "--checkpoint", "best", *out],
                                           capsys)  # fmt: skip
    assert "does not exist" in _error(["quantize", str(tmp_path / "nowhere"), "--bits", "8",
                                       *out], capsys)  # fmt: skip
    assert main([*q, "--bits", "8", *out]) == 0
    capsys.readouterr()
    err = _error(["quantize", str(tmp_path / "q"), "--bits", "4", "--out", str(tmp_path / "r")],
                 capsys)  # fmt: skip
    assert "is already quantized (int8)" in err
    assert main([*q, "--bits", "4", *out]) == 0  # a quantized --out is replaced
    assert attnlab.from_pretrained(tmp_path / "q").quantization_config.format == "int4"


def _ids(capsys: pytest.CaptureFixture[str]) -> list[int]:
    return [int(t) for t in capsys.readouterr().out.split()]


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_generate_quantize_flag_equals_quantizing_in_memory(
    model_dir: Path, tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (model_dir / "tokenizer.json").unlink()  # ids in, ids out
    prompt = ["--ids", "1,2,3", "--max-new-tokens", "10", "--no-eos"]
    assert main(["generate", str(model_dir), *prompt, "--quantize", fmt]) == 0
    got = _ids(capsys)
    model = quantize(attnlab.from_pretrained(model_dir), fmt, group_size=64)
    expected = attnlab.generate(model, [[1, 2, 3]], max_new_tokens=10, eos_id=())[0].tolist()
    assert got == expected
    assert main(["quantize", str(model_dir), "--bits", fmt[-1], "--out", str(tmp_path / "q")]) == 0
    capsys.readouterr()
    assert main(["generate", str(tmp_path / "q"), *prompt]) == 0  # a quantized directory
    assert _ids(capsys) == expected
    err = _error(["generate", str(tmp_path / "q"), *prompt, "--quantize", "int8"], capsys)
    assert f"is already quantized ({fmt}); drop --quantize" in err


def test_sample_takes_the_quantize_flag(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sample", str(model_dir), "--prompt", "ab", "--max-new-tokens", "12"]
    assert main([*argv, "--quantize", "int4"]) == 0
    flag = capsys.readouterr().out
    assert flag.startswith("ab") and len(flag) == len("ab") + 12 + 1  # 12 characters and "\n"
    assert main(["quantize", str(model_dir), "--bits", "4", "--out", str(tmp_path / "q")]) == 0
    capsys.readouterr()
    assert main(["sample", str(tmp_path / "q"), *argv[2:]]) == 0  # same seed, same weights
    assert capsys.readouterr().out == flag
    assert "invalid choice: 'int2'" in _error([*argv, "--quantize", "int2"], capsys)


def test_memory_estimate_counts_quantized_weights(model_dir: Path, tmp_path: Path) -> None:
    config = attnlab.from_pretrained(model_dir).config
    sizes = {"batch": 1, "prompt_len": 4, "max_new_tokens": 8, "num_beams": 1}
    fp32 = generation_estimate(model_dir, config, quantize=None, cpu=True, **sizes)
    assert main(["quantize", str(model_dir), "--bits", "8", "--out", str(tmp_path / "q")]) == 0
    q = generation_estimate(tmp_path / "q", config, quantize=None, cpu=True, **sizes)
    measured = quantized_weight_bytes(attnlab.from_pretrained(tmp_path / "q"))
    assert q.parts["weights"] == measured.total_stored + measured.kernel_copies
    assert q.parts["weights"] < fp32.parts["weights"] / 2
    head = config.vocab_size * config.d_model  # the tied head stays float32: still copied
    assert q.parts["decode_copies"] == 4 * head
    assert fp32.parts["decode_copies"] > q.parts["decode_copies"]
    loading = generation_estimate(model_dir, config, quantize="int8", cpu=True, **sizes)
    assert loading.parts["float32_weights"] == fp32.parts["weights"]  # float weights come first
    assert loading.parts["quantized_weights"] == q.parts["weights"]


def test_a_quantized_target_with_a_draft_keeps_its_greedy_tokens(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--quantize applies to the target; speculative decoding (--draft, a float32 draft) then
    gives the quantized target's own greedy tokens (its kernels are row-invariant)."""
    (model_dir / "tokenizer.json").unlink()
    torch.manual_seed(1)
    draft_cfg = GPTConfig(vocab_size=V, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                          max_seq_len=32, dropout=0.0, eos_id=None)  # fmt: skip
    GPT(draft_cfg).save_pretrained(tmp_path / "draft")
    args = ["generate", str(model_dir), "--ids", "1,2,3", "--max-new-tokens", "12", "--no-eos",
            "--quantize", "int8"]  # fmt: skip
    assert main(args) == 0
    plain = _ids(capsys)
    assert main([*args, "--draft", str(tmp_path / "draft"), "--num-draft-tokens", "3"]) == 0
    assert _ids(capsys) == plain
