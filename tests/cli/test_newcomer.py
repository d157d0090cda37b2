"""The newcomer's first hour (issue 20): what tripped a new user up, each tested where no other
test already covers it (docs/validation.md's table lists every point and its test)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.tokenizers import CharTokenizer, load_tokenizer

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"
needs_data = pytest.mark.skipif(
    not (DATA / "tinyshakespeare.txt").is_file(), reason="shared data missing"
)
TINY = ["--steps", "4", "--warmup", "1", "--eval-every", "2", "--eval-batches", "1",
        "--d-model", "32", "--n-layers", "1", "--d-ff", "64", "--batch-size", "4",
        "--no-progress"]  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("ATTNLAB_DATA", str(DATA))
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def char_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny shakespeare-char run with the recipe's 64-token context."""
    if not (DATA / "tinyshakespeare.txt").is_file():
        pytest.skip("shared data missing")
    out = tmp_path_factory.mktemp("runs") / "char"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNLAB_DATA", str(DATA))
        assert main(["train", "shakespeare-char", *TINY, "--out", str(out)]) == 0
    return out


@needs_data
def test_1_sample_past_the_context_slides_like_nanogpt(
    char_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    argv = ["sample", str(char_run), "--prompt", "ROMEO:", "--max-new-tokens", "200", "--seed", "0"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert text.startswith("ROMEO:") and len(text.rstrip("\n")) == len("ROMEO:") + 200
    assert main([*argv, "--context", "error"]) == 2
    assert "--max-new-tokens <= 58" in capsys.readouterr().err  # the flags, not Python names


@needs_data
def test_2_a_runs_char_tokenizer_is_its_own_format_and_generate_reads_it(
    char_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads((char_run / "tokenizer.json").read_text())
    assert data["format"] == "attnlab-char-tokenizer"
    assert isinstance(load_tokenizer(char_run / "tokenizer.json"), CharTokenizer)
    capsys.readouterr()
    assert main(["generate", str(char_run), "--prompt", "JULIET:", "--max-new-tokens", "8"]) == 0
    assert capsys.readouterr().out.startswith("JULIET:")
    model = attnlab.from_pretrained(char_run)  # the Python API reads a run directory too
    assert isinstance(model, attnlab.GPT)


def test_5_the_all_extra_holds_what_the_commands_import() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    names = {req.split(">")[0].split("=")[0].strip() for req in extras["all"]}
    # viz attention: tokenizers + matplotlib; translate: sacrebleu; HF: transformers; digits
    assert {"tokenizers", "matplotlib", "sacrebleu", "transformers", "scikit-learn"} <= names


@needs_data
def test_8_header_summary_json_and_only_the_recipes_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main(["train", "shakespeare-char", *TINY, "--out", str(out), "--json"]) == 0
    printed = capsys.readouterr().out
    head = printed.splitlines()[0]
    assert head.startswith("shakespeare-char: training GPT with ") and str(out) in head
    assert "budget: 4 steps" in printed
    summary = json.loads(printed[printed.index("{") :])
    assert summary["step"] == 4 and "val_loss" in json.dumps(summary)
    run = json.loads((out / "run.json").read_text())
    assert set(run["options"]) == {"data", "tokenizer", "bpe_vocab_size", "val_fraction", "arch",
                                   "block_size", "preset"}  # fmt: skip
    assert (out / "metrics.jsonl").is_file()


@needs_data
def test_8_the_snake_spelling_works_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("attnlab.cli.overrides._WARNED", set())  # once per process
    argv = ["train", "shakespeare-char", *TINY, "--d_ff=64", "--out", str(tmp_path / "r")]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "--d_ff" in err and "--d-ff" in err and "kebab" in err


def test_9_a_hub_id_says_how_to_download_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"huggingface-cli download gpt2 --local-dir"):
        attnlab.from_pretrained("gpt2")
