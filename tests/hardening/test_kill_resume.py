"""Interrupted runs: ``attnlab train`` killed with SIGKILL at random points, then resumed.

A tiny ``shakespeare-char`` run (a 1-layer GPT on a small text file, a checkpoint every 2 steps,
dropout on so that the RNG state matters) is trained once without interruption, then again in
seeded trials, each killed 1 to 3 times before it is resumed to the end (``--resume``):

- *timed* kills: the run is ended by the kernel (``SIGPROF`` with its default action, as abrupt
  as SIGKILL) once it has used a random amount of CPU time within the uninterrupted run's
  (start-up, training, checkpoint writes, wherever it lands); CPU time rather than wall-clock
  time, so a loaded machine does not move the kill past the end of the run. A run that still
  finishes first is retried with a shorter delay, and is at worst a valid trial that checks the
  end state of a resumed finished run;
- *checkpoint-write* kills: the process SIGKILLs itself at a random file operation under
  ``checkpoints/`` (before a temporary file is made durable, before or after each atomic rename;
  see ``kill_worker.py``);
- *any-write* kills: the same over every file operation of the run directory, including the
  writes of ``run.json`` and ``tokenizer.json`` (atomic too: a torn temporary file) and
  of ``metrics.jsonl`` (a ``write_text`` is torn in half).

After every kill, every checkpoint on disk is checked: the one ``latest`` names loads (weights and
trainer state), and any other either loads or is incomplete (a file missing, never a corrupt
one). After the resume, the final weights equal the uninterrupted run's bitwise,
``metrics.jsonl`` holds the same records (nothing lost, nothing twice), and no temporary file of
an interrupted write is left in the run directory (a resume removes them).

A second writer (issue 49): while a run is held still in the middle of its session (owning its
directory), ``attnlab train`` on the same directory, fresh, ``--overwrite`` or ``--resume``, is
refused at once with exit status 2 and one error line naming the directory and the owner's PID,
and changes no byte there; the owner is then SIGKILLed, and the resume that follows takes the
directory (the kernel released the lock: no stale lock) and ends equal to the uninterrupted run.

A failing check names the trial's kills, the exit status and the whole output of the run.

Runs are forked from a server process that has already imported torch (``kill_worker.py``), so
a trial costs its training, not an interpreter start; one plain ``python -m attnlab`` run shows
that a forked run trains exactly like a fresh interpreter.
"""

from __future__ import annotations

import json
import math
import os
import random
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

from attnlab.cli import main
from attnlab.io import atomic_write_text, remove_stale_temp_files
from attnlab.pretrained import load_attnlab
from attnlab.training.metrics import TIMING_KEYS
from attnlab.training.rundir import latest_checkpoint
from attnlab.training.state import load_training_state
from testkit import ForkServer
from testkit import tree_digest as digest

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
VOLATILE = TIMING_KEYS  # wall-clock figures differ between runs


def _text() -> str:
    """A small deterministic corpus (about 6 kB): enough characters for a vocabulary."""
    rng = random.Random(0)
    words = ["the", "king", "queen", "of", "and", "to", "a", "my", "lord", "thou", "art", "hath"]
    lines = (" ".join(rng.choice(words) for _ in range(10)).capitalize() + "." for _ in range(120))
    return "\n".join(lines) + "\n"


RUN_TIMEOUT = 120.0  # seconds a run may take (it takes well under 1 s on a quiet machine)
KILL_SIGNALS = (signal.SIGKILL, signal.SIGPROF)  # the kill switch's, the CPU timer's


def _log(request: dict[str, Any]) -> str:
    path = Path(request["log"])
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else "(no log)"


@dataclass
class Outcome:
    """How a run ended: its wait status, CPU time and output."""

    status: int
    cpu_s: float
    log: str

    @property
    def killed(self) -> bool:
        return os.WIFSIGNALED(self.status) and os.WTERMSIG(self.status) in KILL_SIGNALS

    @property
    def ok(self) -> bool:
        return os.WIFEXITED(self.status) and os.WEXITSTATUS(self.status) == 0

    def __str__(self) -> str:
        if os.WIFSIGNALED(self.status):
            how = f"died of {signal.Signals(os.WTERMSIG(self.status)).name}"
        else:
            how = f"exited with status {os.WEXITSTATUS(self.status)}"
        return f"{how} after {self.cpu_s:.2f} s of CPU time; its output:\n{self.log}"


class Worker(ForkServer):
    """The fork server (``kill_worker.py``; ``tests/testkit.py``): runs to their ends."""

    def __init__(self) -> None:
        super().__init__(RUN_TIMEOUT)

    def run(self, request: dict[str, Any]) -> Outcome:
        """Run a command (see ``kill_worker.py``) to its end; returns how it ended."""
        return self.finish(request, self.start(request))

    def finish(self, request: dict[str, Any], pid: int) -> Outcome:
        """Wait for the command :meth:`start` started; returns how it ended."""
        answer = self.wait(pid, lambda: _log(request))
        out = Outcome(int(answer["status"]), float(answer["cpu_s"]), _log(request))
        assert out.killed or os.WIFEXITED(out.status), f"the run {out}"
        return out


@dataclass
class Setup:
    worker: Worker
    tmp: Path
    data: Path
    events: list[str]  # the file operations of one uninterrupted run (the kill points)
    cpu_s: float  # its CPU time
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
        out = worker.run(request(s, s.reference, tmp / "reference.log", events=str(events)))
        assert out.ok, f"the uninterrupted run {out}"
        s.cpu_s, s.events = out.cpu_s, json.loads(events.read_text())
        yield s
    finally:
        worker.close()


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    found = latest_checkpoint(run_dir)
    assert found is not None, f"no checkpoint in {run_dir}"
    return load_attnlab(found).state_dict()


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [{k: v for k, v in json.loads(x).items() if k not in VOLATILE} for x in lines]


def assert_same_run(run_dir: Path, reference: Path, what: str) -> None:
    """``run_dir`` ended bitwise as the uninterrupted ``reference``: every weight, every metric."""
    expected = weights(reference)
    for key, value in weights(run_dir).items():
        assert torch.equal(value, expected[key]), f"{what}: {key} differs"
    assert metrics(run_dir) == metrics(reference), what


def check_checkpoints(run_dir: Path) -> int:
    """Every checkpoint on disk loads or is incomplete (never corrupt); ``latest`` loads.

    Returns the step of the newest loadable checkpoint (0 when there is none).
    """
    latest = latest_checkpoint(run_dir)
    root = run_dir / "checkpoints"
    dirs = sorted(root.iterdir()) if root.is_dir() else []
    for d in (p for p in dirs if p.is_dir()):
        try:
            state = load_training_state(d, load_attnlab(d))
        except FileNotFoundError:  # killed before its last file was in place
            assert d != latest, f"latest names the incomplete {d}"
            continue
        assert int(state["step"]) == int(d.name.removeprefix("step_")), d
    if latest is None:
        return 0
    state = load_training_state(latest, load_attnlab(latest))  # raises if corrupt
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


def stale_temp_files(run_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*.tmp"))


@pytest.mark.parametrize("trial", range(N_TRIALS))
def test_killed_and_resumed_run_matches_the_uninterrupted_one(setup: Setup, trial: int) -> None:
    rng = random.Random(SEED + trial)
    kind = KINDS[trial % len(KINDS)]
    run_dir = setup.tmp / "runs" / f"trial{trial}"
    points = [e for e in setup.events if kind != "checkpoint-write" or "checkpoints/" in e]
    history: list[str] = []
    for attempt in range(rng.randint(1, 3)):
        log = setup.tmp / f"trial{trial}-{attempt}.log"
        extra = ["--resume"] if attempt else []
        if kind == "timed":
            delay = rng.uniform(0.0, 0.75 * setup.cpu_s)  # the reference paid cold caches
            out = setup.worker.run(request(setup, run_dir, log, *extra, cpu_kill_after=delay))
            for _ in range(3):  # the first run finished before the kill: kill it sooner
                if attempt or not out.ok:
                    break
                history.append(f"timed kill after {delay:.3f} s of CPU: finished first")
                shutil.rmtree(run_dir)
                delay /= 2
                out = setup.worker.run(request(setup, run_dir, log, cpu_kill_after=delay))
            point = f"after {delay:.3f} s of CPU"
        else:
            k = rng.randint(1, math.ceil(len(points) * 0.6))  # resumed runs do fewer operations
            only = "checkpoints" if kind == "checkpoint-write" else None
            out = setup.worker.run(request(setup, run_dir, log, *extra, kill_at=k, only=only))
            point = f"at operation {k}"
            if attempt == 0:  # a fresh run does every operation the reference did: always killed
                assert out.killed, f"{history}: the run was not killed at operation {k}: {out}"
        history.append(f"{kind} kill {point}: {'killed' if out.killed else 'finished'}")
        assert out.killed or out.ok, f"{history}: the run {out}"
        step = check_checkpoints(run_dir)
        history[-1] += f", newest checkpoint at step {step}"
        if out.ok:
            break
    stale = stale_temp_files(run_dir)
    log = setup.tmp / f"trial{trial}-resume.log"
    out = setup.worker.run(request(setup, run_dir, log, "--resume"))
    assert out.ok, f"{history}: the final resume {out}"
    assert check_checkpoints(run_dir) == STEPS, history
    assert_same_run(run_dir, setup.reference, history)
    assert stale_temp_files(run_dir) == [], f"{history}: left after the resume"
    print(f"trial {trial}: {'; '.join(history)}; temporary files the resume removed: {stale}")


@pytest.mark.parametrize("name", ["tokenizer.json", "run.json", "metrics.jsonl"])
def test_a_resume_killed_while_rewriting_a_run_file_resumes_again(setup: Setup, name: str) -> None:
    """A resume rewrites the run's files first (the tokenizer and the settings, atomically; the
    metrics cut back to the checkpoint's step, through a temporary file); a kill tearing the
    write (the temporary file) must not break the next resume, lose a metric, or leave the
    temporary file behind."""
    run_dir = setup.tmp / "runs" / f"torn-{name}"
    moves = [i for i, e in enumerate(setup.events) if e == "replace-after checkpoints/latest"]
    k = moves[1] + 2  # just after the second checkpoint (step 4) is complete
    first = setup.worker.run(request(setup, run_dir, setup.tmp / f"torn-{name}-0.log", kill_at=k))
    assert first.killed, f"the first run {first}"
    assert check_checkpoints(run_dir) == 4
    log = setup.tmp / f"torn-{name}-1.log"
    torn = setup.worker.run(request(setup, run_dir, log, "--resume", kill_at=1, only=name))
    assert torn.killed, f"the resume that writes {name} {torn}"
    stale = stale_temp_files(run_dir)  # the kill tore the temporary file, not the run's file
    assert len(stale) == 1 and stale[0].startswith(f".{name}."), stale
    if name != "metrics.jsonl":
        json.loads((run_dir / name).read_text(encoding="utf-8"))  # the old file, whole
    log = setup.tmp / f"torn-{name}-2.log"
    out = setup.worker.run(request(setup, run_dir, log, "--resume"))
    assert out.ok, f"the second resume {out}"
    assert_same_run(run_dir, setup.reference, "")
    assert stale_temp_files(run_dir) == []


def test_atomic_write_keeps_the_old_file_on_failure_and_stale_temp_files_are_recognised(
    tmp_path: Path,
) -> None:
    """The helpers the run's files go through: a failed write leaves the old file and no
    temporary file; the clean-up removes only attnlab's temporary names (``.NAME.XXXXXXXX.tmp``,
    from ``tempfile.mkstemp``), in sub-directories too."""
    file = tmp_path / "run.json"
    atomic_write_text(file, "old\n")
    with pytest.raises(TypeError):
        atomic_write_text(file, 3)  # type: ignore[arg-type]  # fails inside the write
    assert file.read_text() == "old\n" and stale_temp_files(tmp_path) == []
    step = tmp_path / "checkpoints" / "step_00000002"
    step.mkdir(parents=True)
    ours = [step / ".model.safetensors.k2j9_x1a.tmp", tmp_path / ".tokenizer.json.AbC123_z.tmp"]
    others = [tmp_path / "notes.tmp", step / ".model.safetensors.tmp", tmp_path / ".a.b.tmp",
              step / "model.safetensors", tmp_path / ".x.123456789.tmp"]  # fmt: skip
    for f in ours + others:
        f.write_text("x")
    assert remove_stale_temp_files(tmp_path / "checkpoints") == [ours[0]]
    assert remove_stale_temp_files(tmp_path, recursive=False) == [ours[1]]
    assert all(f.is_file() for f in others) and not any(f.exists() for f in ours)
    assert remove_stale_temp_files(tmp_path / "missing") == []


DAMAGES = ("pointer-to-missing-step", "pointer-outside-the-run", "pointer-garbage",
           "delete-newest", "truncate-newest-weights", "truncate-newest-state")  # fmt: skip
N_DAMAGE_TRIALS = 6


def valid_steps(run_dir: Path) -> list[int]:
    """The steps of the checkpoints on disk that load completely (weights and trainer state)."""
    root = run_dir / "checkpoints"
    steps = []
    for d in sorted(root.glob("step_*")) if root.is_dir() else []:
        try:
            state = load_training_state(d, load_attnlab(d))
        except Exception:  # incomplete, or damaged on purpose: not valid
            continue
        steps.append(int(state["step"]))
    return steps


def damage(run_dir: Path, what: str) -> str:
    """Break the run directory as ``what`` says; returns what was done (for the trial's log).
    The newest checkpoint is only damaged when an older valid one remains."""
    root = run_dir / "checkpoints"
    steps = valid_steps(run_dir)
    pointer = root / "latest"
    if what.startswith("pointer") or len(steps) < 2:
        text = {
            "pointer-to-missing-step": "step_99999999",
            "pointer-outside-the-run": "../../reference/checkpoints/step_00000020",
            "pointer-garbage": "\x00\xff junk",
        }
        what = what if what.startswith("pointer") else "pointer-garbage"
        if root.is_dir():
            pointer.write_bytes(text[what].encode("utf-8", "surrogateescape"))
        return f"{what} (valid {steps})"
    newest = root / f"step_{steps[-1]:08d}"
    if what == "delete-newest":
        shutil.rmtree(newest)
    else:
        name = "model.safetensors" if what == "truncate-newest-weights" else "trainer_state.json"
        file = newest / name
        file.write_bytes(file.read_bytes()[: max(1, file.stat().st_size // 2)])
    return f"{what} {newest.name} (valid {steps})"


def metrics_through(run_dir: Path, step: int) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl`` up to ``step`` (the history a checkpoint vouches for)."""
    if not (run_dir / "metrics.jsonl").is_file():
        return []
    records = []
    for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a torn last line of a killed run
            continue
        if record.get("step", 0) <= step:
            records.append({k: v for k, v in record.items() if k not in VOLATILE})
    return records


@pytest.mark.parametrize("trial", range(N_DAMAGE_TRIALS))
def test_kills_with_broken_pointers_and_damaged_steps_between_them(
    setup: Setup, trial: int
) -> None:
    """SIGKILLs at random file operations, and between them the run directory damaged: the
    ``latest`` pointer naming a missing step, a path outside the run or garbage; the newest
    step directory deleted, or its weights or trainer state truncated. After every resume
    (killed or not) no valid checkpoint older than the damage is lost, the newest valid step
    never goes back, and the metrics history up to it is the uninterrupted run's, line for line;
    the final resume ends bitwise equal to the uninterrupted run."""
    rng = random.Random(SEED + 1000 + trial)
    run_dir = setup.tmp / "runs" / f"damaged{trial}"
    history: list[str] = []
    k = rng.randint(len(setup.events) // 3, math.ceil(len(setup.events) * 0.8))
    out = setup.worker.run(request(setup, run_dir, setup.tmp / f"d{trial}-0.log", kill_at=k))
    assert out.killed, f"the first run was not killed at operation {k}: {out}"
    history.append(f"killed at operation {k}, valid {valid_steps(run_dir)}")
    for attempt in range(1, rng.randint(2, 4)):
        history.append(damage(run_dir, DAMAGES[(trial + attempt) % len(DAMAGES)]))
        before = valid_steps(run_dir)
        k = rng.randint(1, max(1, len(setup.events) // 3))
        log = setup.tmp / f"d{trial}-{attempt}.log"
        out = setup.worker.run(request(setup, run_dir, log, "--resume", kill_at=k))
        after = valid_steps(run_dir)
        history.append(f"resume {'killed' if out.killed else 'finished'} at operation {k}, "
                       f"valid {after}")  # fmt: skip
        assert out.killed or out.ok, f"{history}: the resume {out}"
        if before:
            assert max(after) >= max(before), f"{history}: the newest valid step went back"
            assert set(before) - set(after) <= {s for s in before if s < min(after)}, (
                f"{history}: a valid checkpoint disappeared out of rotation order"
            )
            newest = max(after)
            assert metrics_through(run_dir, newest) == metrics_through(setup.reference, newest), (
                f"{history}: the metrics history up to step {newest} differs"
            )
        if out.ok:
            break
    out = setup.worker.run(request(setup, run_dir, setup.tmp / f"d{trial}-end.log", "--resume"))
    assert out.ok, f"{history}: the final resume {out}"
    assert_same_run(run_dir, setup.reference, history)
    assert stale_temp_files(run_dir) == [], history
    print(f"damage trial {trial}: {'; '.join(history)}")


def wait_stopped(pid: int) -> None:
    """Wait until the process ``pid`` has stopped itself (``SIGSTOP``: state T)."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        if state in ("T", "t"):
            return
        assert state not in ("Z", "X"), f"the run {pid} ended instead of stopping"
        time.sleep(0.01)
    raise AssertionError(f"the run {pid} did not stop within {RUN_TIMEOUT:.0f} s")


@pytest.mark.parametrize("where", ["start", "step 4"])
def test_a_second_writer_is_refused_and_a_killed_owner_leaves_no_stale_lock(
    setup: Setup, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run held still (``SIGSTOP``) at its first file operation (nothing of the run written
    yet: before issue 49 a second fresh run went ahead) or just after its checkpoint of step 4
    owns its directory: a second ``attnlab train`` there (fresh, ``--overwrite``, ``--resume``)
    exits 2 with one error line naming the directory and the owner's PID, and no byte of the
    directory changes. The owner is SIGKILLed; the resume takes the directory (no stale lock),
    ends equal to the uninterrupted run and leaves no lock file."""
    run_dir = setup.tmp / "runs" / f"owned-{where.replace(' ', '')}"
    moves = [i for i, e in enumerate(setup.events) if e == "replace-after checkpoints/latest"]
    stop_at = 1 if where == "start" else moves[1] + 2
    owner = request(setup, run_dir, setup.tmp / f"{run_dir.name}-0.log", stop_at=stop_at)
    pid = setup.worker.start(owner)
    try:
        wait_stopped(pid)
        before = digest(run_dir)
        for extra in (["--resume"], ["--overwrite"], []):
            started = time.monotonic()
            code = main(argv(setup, run_dir, *extra))
            seconds = time.monotonic() - started
            err = [
                line
                for line in capsys.readouterr().err.splitlines()
                if line.strip() and not line.startswith("attnlab: note:")
            ]  # ARGS' spelling
            assert code == 2 and len(err) == 1, f"a second writer {extra}: exit {code}, {err}"
            assert err[0].startswith("attnlab train shakespeare-char: error: "), err
            assert f"{run_dir} is owned by another process (pid {pid})" in err[0], err
            assert digest(run_dir) == before, f"a second writer {extra} changed the directory"
            assert seconds < 5, f"a second writer {extra} was refused after {seconds:.1f} s"
        assert (run_dir / ".lock").read_text().strip() == str(pid)  # the owner's PID, as named
    finally:
        os.kill(pid, signal.SIGKILL)  # a stopped process dies of it too
        out = setup.worker.finish(owner, pid)
    assert out.killed, f"the owner {out}"
    step = check_checkpoints(run_dir)
    assert step == (0 if where == "start" else 4), step
    log = setup.tmp / f"{run_dir.name}-1.log"
    out = setup.worker.run(request(setup, run_dir, log, "--resume"))
    assert out.ok, f"the resume after the owner's kill {out}"
    assert_same_run(run_dir, setup.reference, "")
    assert stale_temp_files(run_dir) == [] and not (run_dir / ".lock").exists()
