"""A property-based sweep over the command line and the Python API (issue 19).

Hypothesis draws option values from a hostile alphabet — NaN, ±inf, huge and negative numbers,
zero, empty and non-numeric strings, lists where one value is expected, and file-system fixtures
(missing, empty, truncated, a directory where a file is wanted and the reverse) — and runs
``attnlab generate``, ``sample``, ``analyze``, ``viz`` and ``train`` in process, and
:func:`attnlab.generate` with wrongly typed arguments. The invariant, for every example:

- a command returns 0 (and then prints a result) or 2 with one ``error:`` line — never a raw
  traceback (any other exception), another exit status, or a NaN in what it printed;
- the API returns tokens inside the vocabulary or raises ``ValueError``/``TypeError`` whose
  message names the bad value or option;
- the run directory the examples read is never modified.

:data:`EXAMPLES` per test in CI (derandomized: the same examples each run);
``ATTNLAB_PROPERTY_SCALE`` multiplies them with random seeds (``benchmarks/property_nightly.py``
runs the attention sweep that way; this module takes the same variable).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnlab
from attnlab import GPTConfig, build_model
from attnlab.tokenizers import CharTokenizer
from testkit import run_cli as _run

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

EXAMPLES: dict[str, int] = {
    "test_generate_and_sample_options": 120,
    "test_analyze_and_viz_options": 60,
    "test_train_options": 25,
    "test_generate_api_arguments": 150,
}
TOTAL_EXAMPLES = sum(EXAMPLES.values())
SCALE = int(os.environ.get("ATTNLAB_PROPERTY_SCALE", "1"))

TINY = GPTConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=16,
                 eos_id=None)  # fmt: skip
NUMBERS = ["nan", "-nan", "inf", "-inf", "1e308", "1e-45", "-1", "0", "-0", "0.5", "1", "2",
           "3", "7", "64", "100000", "99999999999999999999", "1.5", "-3.25"]  # fmt: skip
WORDS = ["", " ", "x", "None", "true", "[]", "1,2", "1,,2", "é", "\x00", "--", "-"]
PATHS = ["missing", "empty_file", "truncated.json", "a_dir", "run", "a_file"]


def _settings(test: str) -> Callable[[Any], Any]:
    return settings(
        max_examples=EXAMPLES[test] * SCALE,
        derandomize=SCALE == 1,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


def value() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(NUMBERS), st.sampled_from(WORDS), st.sampled_from(PATHS))


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A working directory: a tiny GPT run directory (``run``) and the file-system fixtures."""
    root = tmp_path_factory.mktemp("property_cli")
    old = Path.cwd()
    os.chdir(root)
    torch.manual_seed(0)
    (root / "run").mkdir()
    build_model(TINY).save_pretrained(root / "run")
    chars = CharTokenizer.from_text("abcdefghijklmnopqrstuvwxyz .,\n")
    assert chars.vocab_size == TINY.vocab_size
    chars.save(root / "run" / "tokenizer.json")
    (root / "empty_file").write_bytes(b"")
    (root / "truncated.json").write_text('{"model_type": "gpt", "d_mo')
    (root / "a_dir").mkdir()
    (root / "a_file").write_text("not a directory\n")
    (root / "corpus.txt").write_text("To be, or not to be, that is the question.\n" * 40)
    try:
        yield root
    finally:
        os.chdir(old)


def _digest(directory: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(directory.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(directory).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()


OUTCOMES: dict[str, list[int]] = {}  # command -> exit statuses seen (the last test reads it)


def _check_command(argv: list[str]) -> None:
    """Exit 0 with output free of NaN, or 2 with an ``error:`` line; nothing else escapes."""
    code, out, err = _run(argv)  # any exception other than SystemExit fails the test here
    OUTCOMES.setdefault(argv[0] if argv[0] != "viz" else argv[1], []).append(code)
    assert code in (0, 2), f"{argv}: exit {code}\n{err[-2000:]}"
    assert "Traceback" not in err, f"{argv}: a traceback\n{err[-2000:]}"
    if code == 2:
        assert "error:" in err, f"{argv}: exit 2 without an error line: {err!r}"
    else:
        assert not re.search(r"\bnan\b", out.lower()), f"{argv}: NaN in the output: {out[:500]}"


OPTIONS_GENERATE = ["--max-new-tokens", "--temperature", "--top-k", "--top-p", "--min-p",
                    "--num-beams", "--length-penalty", "--seed", "--num-return-sequences",
                    "--context", "--tokenizer", "--device"]  # fmt: skip


@_settings("test_generate_and_sample_options")
@given(
    command=st.sampled_from(["generate", "sample"]),
    model=st.sampled_from(["run", "run", "run", *PATHS]),
    ids=st.sampled_from(["1,2,3", "1", "29", "30", "-1", "", "1.5", "a"]),
    options=st.lists(st.tuples(st.sampled_from(OPTIONS_GENERATE), value()), max_size=3),
    sample=st.booleans(),
)
def test_generate_and_sample_options(
    place: Path,
    command: str,
    model: str,
    ids: str,
    options: list[tuple[str, str]],
    sample: bool,
) -> None:
    before = _digest(place / "run")
    argv = [command, model, "--ids", ids] if command == "generate" else [command, model]
    if command == "generate" and sample:
        argv.append("--do-sample")
    for flag, v in options:
        argv += [flag, v]
    if "--max-new-tokens" not in argv:
        argv += ["--max-new-tokens", "3"]
    _check_command(argv)
    assert _digest(place / "run") == before, f"{argv} modified the run directory"


@_settings("test_analyze_and_viz_options")
@given(
    which=st.sampled_from(["analyze", "positional", "masks", "schedule"]),
    a=st.one_of(st.sampled_from(["8", "16", "64"]), value()),  # often valid: both outcomes
    b=st.one_of(st.sampled_from(["4", "8", "16"]), value()),
    out=st.sampled_from(["pic.png", "a_dir", "a_file/x.png", "/proc/x.png", "sub/pic.png"]),
)
def test_analyze_and_viz_options(place: Path, which: str, a: str, b: str, out: str) -> None:
    if which == "analyze":
        argv = ["analyze", "gpt2-small", "--seq-len", a, "--batch", b]
    elif which == "positional":
        argv = ["viz", "positional", "--kind", "sinusoidal", "--d-model", a, "--max-len", b]
    elif which == "masks":
        argv = ["viz", "masks", "--seq-len", a, "--window", b]
    else:
        argv = ["viz", "schedule", "--kind", "noam", "--d-model", a, "--warmup", b]
    if which != "analyze":
        argv += ["--dpi", "20", "--out", out]
    _check_command(argv)


# each key with a valid value, drawn as often as a hostile one (so both outcomes occur)
TRAIN_KEYS = {"--steps": "2", "--lr": "0.01", "--warmup": "1", "--dropout": "0.1",
              "--batch-size": "3", "--d-model": "32", "--n-heads": "4", "--max-seq-len": "12",
              "--init-std": "0.05", "--norm-eps": "1e-6", "--clip-grad-norm": "0.5",
              "--val-fraction": "0.2", "--weight-decay": "0.01", "--label-smoothing": "0.1",
              "--data": "corpus.txt"}  # fmt: skip


@_settings("test_train_options")
@given(
    options=st.lists(
        st.sampled_from(sorted(TRAIN_KEYS)).flatmap(
            lambda k: st.tuples(st.just(k), st.one_of(st.just(TRAIN_KEYS[k]), value()))
        ),
        min_size=1,
        max_size=2,
    )
)
def test_train_options(place: Path, options: list[tuple[str, str]]) -> None:
    """Tiny runs (at most 3 steps) with one or two hostile values; the run directory of an
    example is new each time (``--overwrite``)."""
    argv = ["train", "shakespeare-char", "--data=corpus.txt", "--steps=3", "--warmup=0",
            "--eval-every=3", "--eval-batches=1", "--d-model=16", "--n-heads=2", "--n-layers=1",
            "--d-ff=32", "--max-seq-len=8", "--batch-size=2", "--no-progress", "--out=trained",
            "--overwrite"]  # fmt: skip
    for flag, v in options:
        if flag == "--steps" and v not in ("nan", "-1", "0", "x", "", "1.5"):
            v = "3"  # keep each example short: other values are checked by the others
        argv.append(f"{flag}={v}")
    _check_command(argv)


def _api_value() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1, 0, 1, 2, 1.5, 2.0, True]),
        st.sampled_from(["", "19", "x", None, [1, "2"], [1.5], (), {"a": 1}]),
        st.sampled_from([torch.tensor(1.5), torch.tensor([1, 2]), torch.zeros(2, 2)]),
    )


API_OPTIONS = ["max_new_tokens", "temperature", "top_k", "top_p", "min_p", "num_beams",
               "length_penalty", "num_return_sequences", "eos_ids", "pad_id", "do_sample",
               "context"]  # fmt: skip


@_settings("test_generate_api_arguments")
@given(
    prompt=st.one_of(
        st.just(torch.tensor([[1, 2, 3]])),
        st.sampled_from([[[1, 2]], [[1.5]], [[True]], [[]], [], [[40]], [[-1]], "abc", 5]),
        st.just(torch.tensor([[1.0, 2.0]])),
        st.just(torch.tensor([[1, 2]], device="meta")),
    ),
    options=st.dictionaries(st.sampled_from(API_OPTIONS), _api_value(), max_size=3),
)
def test_generate_api_arguments(prompt: Any, options: dict[str, Any]) -> None:
    model = _tiny()
    options.setdefault("max_new_tokens", 2)
    try:
        out = attnlab.generate(model, prompt, **options)
    except (ValueError, TypeError) as e:
        message = str(e)
        assert message and "Traceback" not in message
        return
    assert isinstance(out, torch.Tensor) and out.dtype == torch.long
    assert out.numel() == 0 or (int(out.min()) >= 0 and int(out.max()) < TINY.vocab_size)


_MODEL: list[Any] = []


def _tiny() -> Any:
    if not _MODEL:
        torch.manual_seed(0)
        _MODEL.append(build_model(TINY).eval())
    return _MODEL[0]


def test_the_sweep_reached_both_outcomes() -> None:
    """Each command ran to success on some examples and refused others: a sweep where every
    example fails at the first option would test nothing."""
    if not OUTCOMES:
        pytest.skip("run with the sweeps above")
    for command, codes in OUTCOMES.items():
        assert 0 in codes and 2 in codes, f"{command}: exit statuses {sorted(set(codes))}"
