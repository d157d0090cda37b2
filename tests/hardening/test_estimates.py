"""Estimates cover what is allocated (issue 49, class 4).

- The generation estimate counts what the decoding loops really allocate besides the KV cache:
  the ``(rows, P + N)`` token buffers, the ``(rows, V)`` tensors of a step (beam search: seven,
  ``topk``'s working copy included), beam search's hypotheses and candidates; it follows the
  context policy (a sliding window caches ``max_seq_len`` positions, ``truncate`` lowers N).
  A beam search measured in a fresh process peaks within its estimate's reach.
- The Python API (``generate``, ``stream``, ``beam_search``, ``speculative_generate``) refuses,
  before allocating, a call whose estimate exceeds the memory available, naming the estimate
  and ``memory_check=False``; an ordinary call never reads the available memory.
- The command line: ``attnlab generate`` refuses a beam search whose step tensors do not fit
  (exit 2, one ``error:`` line naming ``--ignore-memory-check``); ``attnlab analyze --measure``
  refuses a batch that cannot fit instead of dying in the allocator.

No test allocates more than about a hundred MiB: the available memory is made small instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import attnlab
import testkit
from attnlab import GPTConfig, build_model
from attnlab.analysis import memory_check as mc
from attnlab.generation import GenerationConfig, beam_search, speculative_generate, stream

V = 50
TINY = GPTConfig(vocab_size=V, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=8,
                 eos_id=None)  # fmt: skip
KV_PER_POSITION = 2 * 1 * 16 * 4  # k and v, 1 layer, H_kv·D = 16, float32


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture
def model() -> Any:
    torch.manual_seed(0)
    return build_model(TINY).eval()


def generation_memory() -> Any:
    """:mod:`attnlab.generation.memory` (imported here: each test fails alone without it)."""
    from attnlab.generation import memory

    return memory


def no_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compare every call with the memory available (small numbers suffice), where the library
    has a floor below which it does not compare."""
    with contextlib.suppress(ImportError):  # without the check: the test fails on its asserts
        monkeypatch.setattr(generation_memory(), "CHECK_FLOOR", 0)


def fake_available(monkeypatch: pytest.MonkeyPatch, n_bytes: int) -> list[int]:
    """The memory available is ``n_bytes``; the list returned counts the reads."""
    reads: list[int] = []

    def available() -> tuple[int, str]:
        reads.append(n_bytes)
        return n_bytes, "a test's figure"

    monkeypatch.setattr(mc, "available_memory", available)
    return reads


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``attnlab ARGV``'s exit status and stderr (``capsys`` kept for the callers' sake)."""
    status, _, err = testkit.run_cli(argv)
    return status, err


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "error:" in line]


# ----------------------------------------------------------------------------- the estimate


def test_beam_search_estimate_counts_its_step_tensors_candidates_and_buffers() -> None:
    K, P, N = 10**6, 2, 2  # a million beams: arithmetic only
    e = mc.estimate_generation(TINY, batch=1, prompt_len=P, max_new_tokens=N, num_beams=K)
    assert e is not None
    rows = K
    assert e.parts["kv_cache"] == rows * (P + N) * KV_PER_POSITION
    # logits, log-probabilities, summed scores and topk's working copy (4x): 7 (rows, V) fp32
    assert e.parts["step_logits"] == 7 * rows * V * 4
    # ids and positions (int64) and the key mask (bool) of (rows, P + N), reordered every step
    assert e.parts["token_buffers"] == 2 * rows * (P + N) * 17
    # (B, K, N) running, finished (old and new), (B, C, N) candidates twice and the (B, K + C,
    # N) concatenation, C = 2K with one stop id; plus one layer's keys reordered
    C = 2 * K
    assert e.parts["beam_candidates"] == N * 8 * (4 * K + 2 * C) + rows * (P + N) * 16 * 4
    assert "1000000 sequences of 2 + 2 tokens, 1000000 beams per prompt" in e.what
    # the parts the estimate had before: the cache and the prefill are now a third of it
    assert e.total > 3 * (e.parts["weights"] + e.parts["kv_cache"] + e.parts["prefill"])
    sampled = mc.estimate_generation(TINY, batch=2, prompt_len=P, max_new_tokens=N,
                                     num_return_sequences=3, sampling=True)  # fmt: skip
    assert sampled is not None and "beam_candidates" not in sampled.parts
    assert sampled.parts["step_logits"] == 4 * 6 * V * 4  # 6 rows: logits, previous, scores, p
    assert sampled.parts["token_buffers"] == (6 + 2) * (P + N) * 17  # the prompts', repeated


def test_generation_estimate_follows_the_context_policy() -> None:
    gm = generation_memory()
    huge = 10**18
    slide = gm.planned_sizes(TINY, 2, GenerationConfig(max_new_tokens=huge))
    assert slide["cache_len"] == 8 and slide["recompute_len"] == 8  # the window, not 2 + 10**18
    e = mc.estimate_generation(TINY, batch=1, **slide)
    assert e is not None and e.parts["kv_cache"] == 8 * KV_PER_POSITION
    assert e.parts["token_buffers"] == (2 + huge) * 17  # what really cannot fit
    truncate = gm.planned_sizes(TINY, 2, GenerationConfig(max_new_tokens=huge,
                                                          context="truncate"))  # fmt: skip
    assert truncate["max_new_tokens"] == 6 and truncate["cache_len"] == 8
    assert gm.planned_sizes(TINY, 2, GenerationConfig(max_new_tokens=huge, context="error")) == {}
    no_cache = gm.planned_sizes(TINY, 2, GenerationConfig(max_new_tokens=3, use_cache=False))
    assert no_cache["cache_len"] == 0 and no_cache["recompute_len"] == 5


CHILD = """
import json, sys, torch, attnlab
from attnlab import GPTConfig, build_model
from attnlab.analysis import memory_check as mc
torch.set_num_threads(1)
K, V, N = 1000, 4000, 4
config = GPTConfig(vocab_size=V, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=64,
                   eos_id=None)
torch.manual_seed(0)
model = build_model(config).eval()
ids = torch.tensor([[1, 2]])
attnlab.generate(model, ids, max_new_tokens=2, engine="eager")  # warm up
def status(key):
    return int([l for l in open("/proc/self/status") if l.startswith(key)][0].split()[1]) * 1024
base = status("VmRSS:")
attnlab.generate(model, ids, max_new_tokens=N, num_beams=K, engine="eager", eos_id=())
e = mc.estimate_generation(config, batch=1, prompt_len=2, max_new_tokens=N, num_beams=K)
print(json.dumps({"peak": status("VmHWM:") - base, "estimate": e.total - e.parts["weights"]}))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM (Linux)")
def test_a_beam_search_peaks_within_reach_of_its_estimate(tmp_path: Path) -> None:
    """1000 beams over 4000 tokens (about 110 MiB of step tensors) in a fresh process: the peak
    above the warmed-up process is at most 1.3x the estimate (it was about 100x before the step
    tensors were counted)."""
    # glibc serves blocks this large from mmap, returned on free: the peak is what was alive
    # (not what a fragmented heap kept), whatever the allocator's adaptive threshold did before
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2**20)}
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         timeout=300, check=True, cwd=tmp_path, env=env)  # fmt: skip
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["peak"] <= 1.3 * got["estimate"], got
    assert got["estimate"] <= 1.3 * got["peak"], got  # and it does not overcount either


# ------------------------------------------------------------------------- the Python API


def test_generate_refuses_what_cannot_fit_before_allocating(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = fake_available(monkeypatch, 2**30)  # 1 GiB
    ids = torch.tensor([[1, 2]])
    assert attnlab.generate(model, ids, max_new_tokens=3).shape == (1, 3)
    assert reads == []  # an ordinary call: arithmetic only, the available memory is not read
    with pytest.raises(mc.MemoryLimitError) as info:  # (1, 2 + 10**18) ids: the allocator's
        attnlab.generate(model, ids, max_new_tokens=10**18)  # RuntimeError before
    message = str(info.value)
    assert isinstance(info.value, ValueError) and reads == [2**30]
    for part in ("generating with GPTConfig (float32, 1 sequence of 2 + 1000000000000000000",
                 "token buffers", "more than the 1.00 GiB of memory available (a test's figure)",
                 "memory_check=False"):  # fmt: skip
        assert part in message, (part, message)
    assert "weights" not in message  # they are loaded already: not counted again
    with pytest.raises(mc.MemoryLimitError, match="memory_check=False"):
        stream(model, ids, max_new_tokens=10**18)  # at the call, not at the first next()


def test_beam_search_and_speculative_decoding_are_checked(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_floor(monkeypatch)
    fake_available(monkeypatch, 2**20)  # 1 MiB
    ids = torch.tensor([[1, 2]])
    with pytest.raises(mc.MemoryLimitError) as info:  # about 3 MiB of step tensors
        beam_search(model, ids, num_beams=1000, max_new_tokens=2)
    assert "step logits" in str(info.value) and "beam candidates" in str(info.value)
    with pytest.raises(mc.MemoryLimitError):  # generate's way in, and model.generate's
        model.generate(ids, num_beams=1000, max_new_tokens=2)
    out = beam_search(model, ids, num_beams=1000, max_new_tokens=2, memory_check=False)
    assert out.sequences.shape[0] == 1  # the option skips the check: the search runs
    with pytest.raises(mc.MemoryLimitError, match="2000 sequences of 2 \\+ 4"):
        attnlab.generate(model, ids, max_new_tokens=4, do_sample=True,
                         num_return_sequences=2000)  # fmt: skip
    draft = build_model(TINY).eval()
    with pytest.raises(mc.MemoryLimitError, match="draft kv cache") as info:
        speculative_generate(model, draft, ids.repeat(2000, 1), max_new_tokens=4)
    assert "speculative decoding with GPTConfig" in str(info.value)
    fake_available(monkeypatch, 2**40)
    assert speculative_generate(model, draft, ids, max_new_tokens=4).sequences.shape == (1, 4)


# --------------------------------------------------------------------------- the commands


def test_generate_command_counts_beam_search_step_tensors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    attnlab.save_pretrained(build_model(TINY), tmp_path / "m")
    K = 2000
    args = ["generate", str(tmp_path / "m"), "--ids", "1,2", "--num-beams", str(K),
            "--max-new-tokens", "2", "--no-eos"]  # fmt: skip
    e = mc.estimate_generation(TINY, batch=1, prompt_len=2, max_new_tokens=2, num_beams=K,
                               decode_copy_numel=0)  # fmt: skip
    assert e is not None
    before = e.parts["weights"] + e.parts["kv_cache"] + e.parts["prefill"]
    room = before + (e.total - before) // 2  # what the old estimate passed, the new one not
    fake_available(monkeypatch, room)
    status, err = run_cli(args, capsys)
    assert status == 2, err
    [line] = error_lines(err)
    for part in ("2000 sequences of 2 + 2 tokens, 2000 beams per prompt", "step logits",
                 "beam candidates", "--ignore-memory-check"):  # fmt: skip
        assert part in line, (part, line)
    status, err = run_cli([*args, "--ignore-memory-check"], capsys)  # neither check: it runs
    assert status == 0, err


def test_a_call_refused_after_loading_names_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check before loading passes (the weights fit); the call's own check, after loading,
    refuses: its message speaks of the command's flag, not of ``memory_check=False``."""
    attnlab.save_pretrained(build_model(TINY), tmp_path / "m")
    no_floor(monkeypatch)
    calls: list[int] = []

    def available() -> tuple[int, str]:  # plenty before loading, nothing afterwards
        calls.append(1)
        return (2**40 if len(calls) == 1 else 1024), "a test's figure"

    monkeypatch.setattr(mc, "available_memory", available)
    status, err = run_cli(["generate", str(tmp_path / "m"), "--ids", "1,2", "--max-new-tokens",
                           "2"], capsys)  # fmt: skip
    assert status == 2 and len(calls) == 2, err
    [line] = error_lines(err)
    assert "--ignore-memory-check" in line and "memory_check=False" not in line, line


def test_analyze_measure_refuses_a_batch_that_cannot_fit(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_available(monkeypatch, 2**30)
    # 10**8 sequences of 64 tokens: hundreds of TiB of activations (the allocator's error before)
    status, err = run_cli(["analyze", "gpt-char-baby", "--measure", "--batch", "100000000"],
                          capsys)  # fmt: skip
    assert status == 2, err
    [line] = error_lines(err)
    assert "batch 100000000 x 64 tokens" in line and "--ignore-memory-check" in line, line
