"""Interrupted runs: ``attnlab train`` killed with SIGKILL at random points, then resumed.

A tiny ``shakespeare-char`` run (a 1-layer GPT on a small text file, a checkpoint every 2 steps,
dropout on so that the RNG state matters) is trained once without interruption, then again in
seeded trials, each killed 1 to 3 times before it is resumed to the end (``--resume``):

- *timed* kills: the test sends SIGKILL after a random delay within the run's duration (start-up,
  training, checkpoint writes, wherever it lands);
- *checkpoint-write* kills: the process SIGKILLs itself at a random file operation under
  ``checkpoints/`` (before a temporary file is made durable, before or after each atomic rename;
  see ``kill_worker.py``);
- *any-write* kills: the same over every file operation of the run directory, including the
  plain writes of ``train_config.json``, ``tokenizer.json`` and ``metrics.jsonl`` (torn in half).

After every kill, every checkpoint on disk is checked: the one ``latest`` names loads (weights and
trainer state), and any other either loads or is incomplete (a file missing, never a corrupt
one). After the resume, the final weights equal the uninterrupted run's bitwise and
``metrics.jsonl`` holds the same records (nothing lost, nothing twice).

Runs are forked from a server process that has already imported torch (``kill_worker.py``), so
a trial costs its training, not an interpreter start; one plain ``python -m attnlab`` run shows
that a forked run trains exactly like a fresh interpreter.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.training.checkpoint import load_checkpoint
from attnlab.training.state import latest_checkpoint, load_training_state

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="forks runs and reads /proc/self/fd (Linux)"
)
HERE = Path(__file__).resolve().parent
SEED = 20261129
N_TRIALS = 9  # 3 of each kind; 1-3 kills each
KINDS = ("timed", "checkpoint-write", "any-write")
STEPS = 20
ARGS = [f"--steps={STEPS}", "--warmup=2", "--checkpoint_every=2", "--keep_checkpoints=3",
        "--log_every=1", "--eval_every=5", "--eval_batches=1", "--d_model=16", "--n_heads=2",
        "--n_layers=1", "--d_ff=32", "--max_seq_len=16", "--batch_size=4", "--dropout=0.1",
        "--no-progress"]  # fmt: skip
VOLATILE = ("tokens_per_s", "elapsed_s")  # wall-clock figures differ between runs


def _text() -> str:
    """A small deterministic corpus (about 6 kB): enough characters for a vocabulary."""
    rng = random.Random(0)
    words = ["the", "king", "queen", "of", "and", "to", "a", "my", "lord", "thou", "art", "hath"]
    lines = (" ".join(rng.choice(words) for _ in range(10)).capitalize() + "." for _ in range(120))
    return "\n".join(lines) + "\n"


class Worker:
    """The fork server (``kill_worker.py``) and its request/answer protocol."""

    def __init__(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "kill_worker.py")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert self._answer(120.0) == {"ready": True}

    def _answer(self, timeout: float) -> dict[str, Any] | None:
        """The next answer line, or ``None`` when none comes within ``timeout`` seconds."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the kill worker exited")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def run(self, request: dict[str, Any], *, kill_after: float | None = None) -> int | None:
        """Run a command; returns its exit status, or ``None`` when it died of SIGKILL.

        ``kill_after``: send SIGKILL after this many seconds unless it has finished by then.
        """
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        started = self._answer(60.0)
        assert started is not None and "pid" in started
        answer = self._answer(kill_after) if kill_after is not None else None
        if kill_after is not None and answer is None:
            with contextlib.suppress(ProcessLookupError):  # it finished just now
                os.kill(started["pid"], signal.SIGKILL)
        if answer is None:
            answer = self._answer(120.0)
        assert answer is not None, "the run did not end within 120 s"
        status = int(answer["status"])
        if os.WIFSIGNALED(status):
            assert os.WTERMSIG(status) == signal.SIGKILL
            return None
        return os.WEXITSTATUS(status)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@dataclass
class Setup:
    worker: Worker
    tmp: Path
    data: Path
    events: list[str]  # the file operations of one uninterrupted run (the kill points)
    seconds: float  # its wall time
    reference: Path  # its run directory


def argv(setup: Setup, run_dir: Path, *extra: str) -> list[str]:
    return ["train", "shakespeare-char", f"--data={setup.data}", *ARGS, "--runs-dir",
            str(run_dir.parent), "--name", run_dir.name, *extra]  # fmt: skip


def request(setup: Setup, run_dir: Path, log: Path, *extra: str, **kw: Any) -> dict[str, Any]:
    return {"argv": argv(setup, run_dir, *extra), "log": str(log), "root": str(run_dir), **kw}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("kill")
    data = tmp / "corpus.txt"
    data.write_text(_text(), encoding="utf-8")
    worker = Worker()
    try:
        s = Setup(worker, tmp, data, [], 0.0, tmp / "runs" / "reference")
        events = tmp / "events.json"
        start = time.monotonic()
        status = worker.run(request(s, s.reference, tmp / "reference.log", events=str(events)))
        s.seconds = time.monotonic() - start
        assert status == 0, (tmp / "reference.log").read_text()
        s.events = json.loads(events.read_text())
        yield s
    finally:
        worker.close()


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    found = latest_checkpoint(run_dir)
    assert found is not None, f"no checkpoint in {run_dir}"
    return load_checkpoint(found).state_dict()


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [{k: v for k, v in json.loads(x).items() if k not in VOLATILE} for x in lines]


def check_checkpoints(run_dir: Path) -> int:
    """Every checkpoint on disk loads or is incomplete (never corrupt); ``latest`` loads.

    Returns the step of the newest loadable checkpoint (0 when there is none).
    """
    latest = latest_checkpoint(run_dir)
    root = run_dir / "checkpoints"
    dirs = sorted(root.iterdir()) if root.is_dir() else []
    for d in (p for p in dirs if p.is_dir()):
        try:
            state = load_training_state(d, load_checkpoint(d))
        except FileNotFoundError:  # killed before its last file was in place
            assert d != latest, f"latest names the incomplete {d}"
            continue
        assert int(state["step"]) == int(d.name.removeprefix("step_")), d
    if latest is None:
        return 0
    state = load_training_state(latest, load_checkpoint(latest))  # raises if corrupt
    return int(state["step"])


def test_forked_runs_train_like_a_fresh_interpreter(setup: Setup) -> None:
    """The server's children are real runs: ``python -m attnlab`` gives the same weights."""
    fresh = setup.tmp / "runs" / "fresh"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "attnlab", *argv(setup, fresh)],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    for key, value in weights(setup.reference).items():
        assert torch.equal(value, weights(fresh)[key]), key
    assert metrics(fresh) == metrics(setup.reference)
    kinds = {e.split()[0] for e in setup.events}
    assert kinds == {"fsync", "replace-before", "replace-after", "write_text"}, kinds
    assert sum("checkpoints/" in e for e in setup.events) >= STEPS // 2 * 4


@pytest.mark.parametrize("trial", range(N_TRIALS))
def test_killed_and_resumed_run_matches_the_uninterrupted_one(setup: Setup, trial: int) -> None:
    rng = random.Random(SEED + trial)
    kind = KINDS[trial % len(KINDS)]
    run_dir = setup.tmp / "runs" / f"trial{trial}"
    points = [e for e in setup.events if kind != "checkpoint-write" or "checkpoints/" in e]
    history = []
    for attempt in range(rng.randint(1, 3)):
        log = setup.tmp / f"trial{trial}-{attempt}.log"
        extra = ["--resume"] if attempt else []
        if kind == "timed":
            delay = rng.uniform(0.0, 0.8 * setup.seconds)
            status = setup.worker.run(request(setup, run_dir, log, *extra), kill_after=delay)
            while attempt == 0 and status == 0:  # it ran faster than the reference: kill sooner
                shutil.rmtree(run_dir)
                delay /= 2
                status = setup.worker.run(request(setup, run_dir, log), kill_after=delay)
            point = f"after {delay:.2f} s"
        else:
            k = rng.randint(1, math.ceil(len(points) * 0.6))  # resumed runs do fewer operations
            only = "checkpoints" if kind == "checkpoint-write" else None
            status = setup.worker.run(request(setup, run_dir, log, *extra, kill_at=k, only=only))
            point = f"at operation {k}"
        history.append(f"{kind} kill {point}: {'killed' if status is None else status}")
        assert status in (None, 0), f"{history}: {log.read_text()}"
        step = check_checkpoints(run_dir)
        history[-1] += f", newest checkpoint at step {step}"
        if status == 0:
            break
    assert "killed" in history[0], f"the first run was not killed: {history}"
    log = setup.tmp / f"trial{trial}-resume.log"
    status = setup.worker.run(request(setup, run_dir, log, "--resume"))
    assert status == 0, f"{history}: {log.read_text()}"
    assert check_checkpoints(run_dir) == STEPS
    reference = weights(setup.reference)
    for key, value in weights(run_dir).items():
        assert torch.equal(value, reference[key]), f"{history}: {key} differs"
    assert metrics(run_dir) == metrics(setup.reference), history
    stale = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*.tmp"))
    print(f"trial {trial}: {'; '.join(history)}; stale temporary files: {stale}")


@pytest.mark.parametrize("name", ["tokenizer.json", "train_config.json", "metrics.jsonl"])
def test_a_resume_killed_while_rewriting_a_run_file_resumes_again(setup: Setup, name: str) -> None:
    """A resume rewrites the run's plain files first (the tokenizer, the settings, the metrics
    cut back to the checkpoint's step); a kill tearing one of them must not break the next
    resume nor lose a metric."""
    run_dir = setup.tmp / "runs" / f"torn-{name}"
    moves = [i for i, e in enumerate(setup.events) if e == "replace-after checkpoints/latest"]
    k = moves[1] + 2  # just after the second checkpoint (step 4) is complete
    first = request(setup, run_dir, setup.tmp / f"torn-{name}-0.log", kill_at=k)
    assert setup.worker.run(first) is None
    assert check_checkpoints(run_dir) == 4
    log = setup.tmp / f"torn-{name}-1.log"
    assert setup.worker.run(request(setup, run_dir, log, "--resume", kill_at=1, only=name)) is None
    log = setup.tmp / f"torn-{name}-2.log"
    assert setup.worker.run(request(setup, run_dir, log, "--resume")) == 0, log.read_text()
    reference = weights(setup.reference)
    for key, value in weights(run_dir).items():
        assert torch.equal(value, reference[key]), key
    assert metrics(run_dir) == metrics(setup.reference)
