"""Format versions, forwards (issue 49, class 2): a file written by a newer attnlab is refused,
naming the file and both versions, and left byte for byte; a file of another ``format`` is
refused, naming it; the current version and older files (an older version, or none) still load.

One check for every file kind (:func:`attnlab.io.check_version`): ``run.json``, the trainer
state of a checkpoint, attnlab's ``tokenizer.json`` (a Hugging Face ``tokenizers`` file keeps
loading whatever its own ``version``) and ``quantization.json``. A resume whose newest checkpoint
was written by a newer attnlab refuses: it does not take that checkpoint for a damaged one, so
it neither falls back to an older one nor writes a new step over it or prunes the old ones.
Commands run through :func:`attnlab.cli.main` in the test's own working directory; each refusal
is exit status 2 with one ``error:`` line, and every file of the directory hashes as before.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.io import FormatError, NewerVersionError, check_version
from attnlab.models import GPTConfig, build_model
from attnlab.tokenizers import CharTokenizer, LibraryTokenizer, load_tokenizer
from attnlab.training.state import STATE_VERSION, read_training_state
from attnlab.transforms import quantize
from testkit import tree_digest as digest
from testkit import word_corpus

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

NEWER = "was written by a newer attnlab (format version {n}; this release reads up to {m})"
ARGS = ["--warmup=1", "--checkpoint-every=2", "--keep-checkpoints=3", "--log-every=1",
        "--eval-every=2", "--eval-batches=1", "--d-model=16", "--n-heads=2", "--n-layers=1",
        "--d-ff=32", "--max-seq-len=16", "--batch-size=4", "--no-progress"]  # fmt: skip


def train(run: Path, steps: int, *extra: str) -> list[str]:
    return ["train", "shakespeare-char", "--data=corpus.txt", *ARGS, f"--steps={steps}",
            "--out", str(run), *extra]  # fmt: skip


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``attnlab ARGV``; assert exit 2 with one ``error:`` line, and return it."""
    code = main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1, f"attnlab {' '.join(argv)}: exit {code}, stderr {err}"
    assert f"attnlab {argv[0]}" in err[0] and ": error: " in err[0], err
    return err[0]


def edit(file: Path, **changes: Any) -> None:
    """Set (or, with ``None``, remove) top-level keys of the JSON file ``file``."""
    data = json.loads(file.read_text(encoding="utf-8"))
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    file.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-step ``shakespeare-char`` run (checkpoints at steps 2 and 4, a character tokenizer)."""
    root = tmp_path_factory.mktemp("versions")
    (root / "corpus.txt").write_text(word_corpus(), encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            assert main(train(root / "run", 4)) == 0
        finally:
            torch.set_num_threads(threads)
    return root


@pytest.fixture
def run(trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the trained run in this test's working directory (``tmp_path``)."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(trained / "corpus.txt", tmp_path / "corpus.txt")
    shutil.copytree(trained / "run", tmp_path / "run")
    return tmp_path / "run"


# -- run.json ------------------------------------------------------------------------------------


def test_a_newer_run_json_is_refused_and_left_byte_for_byte(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before issue 49 the resume went ahead and rewrote ``run.json`` as version 1, dropping
    the fields it did not know."""
    edit(run / "run.json", version=2, retention={"keep": "forever"})
    before = digest(run)
    message = f"{run / 'run.json'} {NEWER.format(n=2, m=1)}"
    for argv in (train(run, 6, "--resume"), ["evaluate", str(run)]):
        assert message in refused(argv, capsys), argv
        assert digest(run) == before, f"attnlab {argv[0]} changed the run"


def test_a_run_json_of_another_format_is_refused_naming_it(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit(run / "run.json", format="someone-elses-run")
    before = digest(run)
    line = refused(train(run, 6, "--resume"), capsys)
    assert f"{run / 'run.json'} is not an attnlab run record: it has format " in line
    assert "'someone-elses-run' (expected 'attnlab-run')" in line
    assert digest(run) == before


def test_the_current_and_an_unversioned_run_json_still_resume(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit(run / "run.json", version=None)  # a record written before it carried a version
    assert main(train(run, 6, "--resume")) == 0, capsys.readouterr().err
    record = json.loads((run / "run.json").read_text(encoding="utf-8"))
    assert record["format"] == "attnlab-run" and record["version"] == 1
    assert len(record["sessions"]) == 2
    assert main(train(run, 8, "--resume")) == 0, capsys.readouterr().err


# -- the trainer state ---------------------------------------------------------------------------


def test_a_newer_trainer_state_in_the_newest_checkpoint_refuses_the_resume_without_pruning(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before issue 49 the newest checkpoint was skipped as damaged: the run resumed from step
    2, wrote a new step 4 over the newer one, and pruned."""
    state = run / "checkpoints" / "step_00000004" / "trainer_state.json"
    edit(state, version=STATE_VERSION + 1)
    before = digest(run)
    line = refused(train(run, 8, "--resume", "--keep-checkpoints=1"), capsys)
    assert f"{state} {NEWER.format(n=STATE_VERSION + 1, m=STATE_VERSION)}" in line
    assert "nothing was changed" in line
    assert digest(run) == before
    with pytest.raises(NewerVersionError, match="format version 3; this release reads up to 2"):
        read_training_state(state.parent)


def test_the_current_and_the_first_trainer_state_versions_load(run: Path) -> None:
    directory = run / "checkpoints" / "step_00000004"
    current = read_training_state(directory)
    data = json.loads((directory / "trainer_state.json").read_text(encoding="utf-8"))
    data["version"] = 1  # attnlab 0.1: the data generator among the RNG states
    data["state"]["rng"]["data"] = data["state"].pop("data")["generator"]
    (directory / "trainer_state.json").write_text(json.dumps(data), encoding="utf-8")
    first = read_training_state(directory)
    assert first["step"] == current["step"] == 4
    assert torch.equal(first["data"]["generator"], current["data"]["generator"])
    assert sorted(first["rng"]) == sorted(current["rng"])


def test_a_trainer_state_of_another_format_is_still_damage(run: Path) -> None:
    """Not attnlab's trainer state: the resume skips that checkpoint as damaged (as before)."""
    edit(run / "checkpoints" / "step_00000004" / "trainer_state.json", format="pickle")
    with pytest.raises(FormatError, match="it has format 'pickle'") as e:
        read_training_state(run / "checkpoints" / "step_00000004")
    assert not isinstance(e.value, NewerVersionError)
    assert main(train(run, 6, "--resume")) == 0  # from step 2


# -- tokenizer.json ------------------------------------------------------------------------------


def test_a_newer_tokenizer_is_refused_and_left_byte_for_byte(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit(run / "tokenizer.json", version=2, normalizer="nfc")
    before = digest(run)
    message = f"{run / 'tokenizer.json'} {NEWER.format(n=2, m=1)}"
    for argv in (train(run, 6, "--resume"), ["sample", str(run), "--max-new-tokens", "2"]):
        assert message in refused(argv, capsys), argv
        assert digest(run) == before, f"attnlab {argv[0]} changed the run"


def test_an_attnlab_tokenizer_format_this_release_does_not_know_is_refused(
    tmp_path: Path,
) -> None:
    file = tmp_path / "tokenizer.json"
    file.write_text('{"format": "attnlab-wordpiece-tokenizer", "version": 1, "vocab": []}')
    with pytest.raises(FormatError, match="it has format 'attnlab-wordpiece-tokenizer'"):
        load_tokenizer(file)


def test_current_older_and_library_tokenizers_still_load(tmp_path: Path) -> None:
    chars = CharTokenizer(list("abc"), specials=["[PAD]"])
    chars.save(tmp_path / "current.json")
    assert json.loads((tmp_path / "current.json").read_text())["version"] == 1
    files = {
        "current.json": None,
        "unversioned.json": {
            "format": "attnlab-char-tokenizer",
            "chars": ["a", "b", "c"],
            "specials": ["[PAD]"],
        },
        "attnlab-0.1.json": {"type": "char", "chars": ["a", "b", "c"], "specials": ["[PAD]"]},
    }
    for name, data in files.items():
        if data is not None:
            (tmp_path / name).write_text(json.dumps(data))
        loaded = load_tokenizer(tmp_path / name)
        assert isinstance(loaded, CharTokenizer) and loaded.encode("cab") == [3, 1, 2], name
    pytest.importorskip("tokenizers")
    from attnlab.tokenizers import BPETokenizer

    bpe = BPETokenizer.train(["the king and the queen"] * 20, vocab_size=270)
    bpe.save(tmp_path / "library.json")
    library = json.loads((tmp_path / "library.json").read_text())
    assert library["version"] == "1.0" and "format" not in library  # the library's own
    loaded = load_tokenizer(tmp_path / "library.json")
    assert isinstance(loaded, LibraryTokenizer)
    assert loaded.encode("the king") == bpe.encode("the king")


# -- quantization.json ---------------------------------------------------------------------------


@pytest.fixture
def quantized(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=32, d_model=32, n_heads=2, n_layers=1, d_ff=64, max_seq_len=16, eos_id=None
    )
    model = quantize(build_model(config), "int8")
    attnlab.save_pretrained(model, tmp_path / "q")
    return tmp_path / "q"


def test_quantization_json_carries_its_format_and_a_newer_one_is_refused(
    quantized: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = json.loads((quantized / "quantization.json").read_text())
    assert record["format"] == "attnlab-quantization" and record["version"] == 1
    edit(quantized / "quantization.json", version=2)
    before = digest(quantized)
    message = f"{quantized / 'quantization.json'} {NEWER.format(n=2, m=1)}"
    argv = ["generate", str(quantized), "--ids", "1,2,3", "--max-new-tokens", "2"]
    assert message in refused(argv, capsys)
    assert digest(quantized) == before
    with pytest.raises(NewerVersionError):
        attnlab.from_pretrained(quantized)
    edit(quantized / "quantization.json", version=1, format="gptq")
    with pytest.raises(FormatError, match="it has format 'gptq'"):
        attnlab.from_pretrained(quantized)


def test_quantization_json_without_format_or_version_still_loads(quantized: Path) -> None:
    expected = attnlab.from_pretrained(quantized)
    ids = torch.tensor([[1, 2, 3]])
    for removed in ({"format": None}, {"format": None, "version": None}):
        edit(quantized / "quantization.json", **removed)
        loaded = attnlab.from_pretrained(quantized)
        with torch.inference_mode():
            assert torch.equal(loaded(ids)[0], expected(ids)[0]), removed


# -- the helper ----------------------------------------------------------------------------------


def test_check_version_reads_missing_as_the_first_and_refuses_what_is_not_a_version() -> None:
    kw: dict[str, Any] = {"format": "attnlab-x", "version": 3}
    assert check_version("f", {}, **kw) == 1
    assert check_version("f", {"format": "attnlab-x", "version": 3}, **kw) == 3
    with pytest.raises(NewerVersionError, match=r"^f was written by a newer attnlab \(format "
                       r"version 4; this release reads up to 3\)"):  # fmt: skip
        check_version("f", {"version": 4}, **kw)
    for bad in (0, -1, True, "2", 2.0, None):
        with pytest.raises(FormatError) as e:
            check_version("f", {"version": bad}, **kw)
        assert not isinstance(e.value, NewerVersionError), bad
    with pytest.raises(FormatError, match="it has no format"):
        check_version("f", {"version": 1}, **kw, required=True)
    with pytest.raises(FormatError, match="it has format 'other'"):
        check_version("f", {"format": "other"}, **kw)
