"""Who owns a run directory (issue 49, class 1): one writing process at a time.

A writer takes ``RUN_DIR/.lock`` with ``flock`` before it reads or writes anything there and holds
it for its whole session (:mod:`attnlab.training.runlock`). Here another process holds that lock
the way attnlab does (``flock`` on ``.lock``, its PID written in it), and every command that writes
a run (``attnlab train`` fresh, ``--overwrite``, ``--resume``; ``attnlab convert-run``; the
library's ``Trainer.fit``) is refused at once, with exit status 2 and one error line naming the
directory and the owner's PID, and changes no byte of the directory; readers go on. When the owner
is SIGKILLed, the kernel releases its lock: the next writer takes the directory. The lock is
re-entrant within a thread, exclusive between threads, released (and its file removed) when the
session ends, and absent with a warning where there is no ``fcntl``. Under torchrun only rank 0
takes it, and a refused rank 0 stops the whole job promptly (no process waits for it forever).

The kill/resume trials with a second writer in the middle of a run are in
``test_kill_resume.py``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from attnlab.cli import main
from attnlab.data.text import TokenStream
from attnlab.models import GPT, GPTConfig
from attnlab.training import runlock
from attnlab.training.config import TrainConfig
from attnlab.training.objectives import CausalLMObjective
from attnlab.training.runlock import LOCK_NAME, RunOwnedError, acquire, own_run, owns
from attnlab.training.trainer import Trainer
from testkit import tree_digest as digest
from testkit import word_corpus

pytestmark = [
    pytest.mark.usefixtures("one_thread"),  # tests/conftest.py
    pytest.mark.skipif(runlock.fcntl is None, reason="no fcntl: run directories are not locked"),
]

ARGS = ["--warmup=1", "--checkpoint-every=2", "--log-every=1", "--eval-every=2",
        "--eval-batches=1", "--d-model=16", "--n-heads=2", "--n-layers=1", "--d-ff=32",
        "--max-seq-len=16", "--batch-size=4", "--no-progress"]  # fmt: skip
HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
os.write(fd, f"{os.getpid()}\\n".encode())
print("locked", flush=True)
sys.stdin.read()
"""


def train(run: Path, steps: int, *extra: str) -> list[str]:
    return ["train", "shakespeare-char", "--data=corpus.txt", *ARGS, f"--steps={steps}",
            "--out", str(run), *extra]  # fmt: skip


@contextlib.contextmanager
def held(run_dir: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process owning ``run_dir`` as attnlab's writers do; killed (SIGKILL) at the end,
    so its lock file stays behind, unlocked."""
    run_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir / LOCK_NAME)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def refused_by_owner(
    argv: list[str], run_dir: Path, pid: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """``attnlab ARGV`` exits 2 at once with one error line naming ``run_dir`` and ``pid``."""
    started = time.monotonic()
    code = main(argv)
    seconds = time.monotonic() - started
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1, f"attnlab {' '.join(argv)}: exit {code}, stderr {err}"
    assert f"attnlab {argv[0]}" in err[0] and ": error: " in err[0], err
    assert f"{run_dir} is owned by another process (pid {pid})" in err[0], err
    assert seconds < 5, f"attnlab {argv[0]} was refused after {seconds:.1f} s, not at once"


@pytest.fixture
def place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text(word_corpus(), encoding="utf-8")
    return tmp_path


def test_every_writer_is_refused_while_another_process_owns_the_run(
    place: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before issue 49 a fresh run into an owned (empty) directory, ``--resume`` and
    ``--overwrite`` of an owned run all trained (exit 0) over the owner's files."""
    run, empty = place / "run", place / "empty"
    assert main(train(run, 2)) == 0
    assert not (run / LOCK_NAME).exists()  # released, and its file removed, at the end
    capsys.readouterr()
    with held(run) as owner, held(empty) as other:
        before, before_empty = digest(run), digest(empty)
        for argv in (train(run, 4, "--resume"), train(run, 2, "--overwrite"), train(run, 2),
                     ["convert-run", str(run)]):  # fmt: skip
            refused_by_owner(argv, run, owner.pid, capsys)
            assert digest(run) == before, f"attnlab {' '.join(argv)} changed the run"
        refused_by_owner(train(empty, 2), empty, other.pid, capsys)  # two fresh runs, one --out
        assert digest(empty) == before_empty
        # readers take no lock
        assert main(["sample", str(run), "--max-new-tokens", "3", "--seed", "1",
                     "--do-sample"]) == 0  # fmt: skip
        assert main(["evaluate", str(run)]) == 0
    assert digest(run) == before


def test_a_killed_owner_leaves_no_stale_lock(place: Path) -> None:
    """The kernel releases a killed process's lock: its file stays (with its PID), unlocked,
    and the next writer takes it and removes it when done."""
    run = place / "run"
    assert main(train(run, 2)) == 0
    with held(run) as owner:
        pid = owner.pid
    assert (run / LOCK_NAME).read_text().strip() == str(pid)
    assert main(train(run, 4, "--resume")) == 0
    assert not (run / LOCK_NAME).exists()


def test_trainer_fit_is_refused_on_an_owned_run_and_writes_nothing(place: Path) -> None:
    config = TrainConfig(steps=2, batch_size=4, warmup=1, progress=False, checkpoint_every=1)
    model = GPT(GPTConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                          max_seq_len=8, eos_id=None))  # fmt: skip
    stream = TokenStream(torch.randint(11, (500,), generator=torch.Generator().manual_seed(1)))
    trainer = Trainer(model, CausalLMObjective(stream, block_size=8), config, run_dir="run")
    with held(place / "run") as owner:
        with pytest.raises(
            RunOwnedError, match=rf"is owned by another process \(pid {owner.pid}\)"
        ):
            trainer.fit()
        assert sorted(p.name for p in (place / "run").iterdir()) == [LOCK_NAME]
    assert trainer.fit().step == 2  # the owner is gone
    assert not (place / "run" / LOCK_NAME).exists()


def test_a_refused_fresh_run_leaves_no_directory(place: Path) -> None:
    """The lock file, and the directories the lock made, go when the refused session ends."""
    argv = train(place / "runs" / "new", 2)
    argv[2] = "--data=missing.txt"  # refused once the recipe reads its data: after the lock
    assert main(argv) == 2
    assert not (place / "runs").exists()
    lock = acquire(place / "a" / "b")
    lock.release()
    assert not (place / "a").exists()


def test_the_lock_is_reentrant_in_a_thread_and_exclusive_between_threads(tmp_path: Path) -> None:
    run = tmp_path / "run"
    refused: list[BaseException] = []
    with own_run(run):
        with own_run(run):  # the trainer's own inside train_recipe's
            assert owns(run)
        assert owns(run) and (run / LOCK_NAME).read_text().strip() == str(os.getpid())
        worker = threading.Thread(target=lambda: refused.extend(_try(run)))
        worker.start()
        worker.join()
    assert len(refused) == 1 and isinstance(refused[0], RunOwnedError)
    assert not owns(run) and not (run / LOCK_NAME).exists()
    assert _try(run) == []  # free again


def _try(run: Path) -> list[BaseException]:
    try:
        acquire(run).release()
    except RunOwnedError as e:
        return [e]
    return []


def test_without_fcntl_or_file_locks_there_is_no_lock_and_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Windows (no ``fcntl``), or a file system whose ``flock`` fails with ``ENOLCK``: the run
    goes on unlocked, saying so; it leaves no lock file, nor a directory it made for nothing."""

    class NoLocks:
        LOCK_EX, LOCK_NB = 2, 4

        @staticmethod
        def flock(fd: int, operation: int) -> None:
            raise OSError(errno.ENOLCK, "No locks available")

    for stand_in, why in ((None, "this platform has no fcntl"), (NoLocks, "does not lock")):
        monkeypatch.setattr(runlock, "fcntl", stand_in)
        caplog.clear()
        with (
            caplog.at_level(logging.WARNING, logger="attnlab.training.runlock"),
            own_run(tmp_path / "run"),
        ):
            assert sorted(os.listdir(tmp_path / "run")) == []
        assert "is not locked against a second writer" in caplog.text and why in caplog.text
        assert not (tmp_path / "run").exists()


# -- torchrun ------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(
    sys.platform != "linux" or not (dist.is_available() and dist.is_gloo_available()),
    reason="torchrun with gloo on Linux",
)
def test_under_torchrun_a_refused_rank_0_stops_every_process_promptly(place: Path) -> None:
    """Only rank 0 takes the lock (a 2-process run that owns its directory trains: see
    tests/training/test_distributed.py); when it is refused, the other rank, which went on to
    wait for rank 0, is stopped by torchrun instead of waiting forever."""
    run = place / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MASTER_ADDR="127.0.0.1")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
               "--nnodes=1", "--master_addr=127.0.0.1", f"--master_port={_free_port()}",
               "-m", "attnlab", *train(run, 2)]  # fmt: skip
    with held(run) as owner:
        before = digest(run)
        started = time.monotonic()
        try:
            done = subprocess.run(command, cwd=place, env=env, capture_output=True, text=True,
                                  timeout=180, start_new_session=True)  # fmt: skip
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"torchrun did not stop within 180 s (a process waited): {e.output}")
        seconds = time.monotonic() - started
        log = done.stdout + done.stderr
        assert done.returncode != 0, log
        assert f"is owned by another process (pid {owner.pid})" in log, log
        assert digest(run) == before
    assert seconds < 120, f"the job took {seconds:.0f} s to stop"
    print(f"refused torchrun launch: {seconds:.1f} s")
