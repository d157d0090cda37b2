"""What several test modules share (``tests/conftest.py`` puts this folder on ``sys.path``):

- :func:`run_cli`: ``attnlab.cli.main(argv)`` in process, its exit status and both outputs;
- :func:`word_corpus`: a small deterministic text for tiny character-level runs;
- :func:`tree_digest`: every file of a directory by its SHA-256 ("left byte for byte");
- :class:`ForkServer`: the client of ``hardening/kill_worker.py``'s fork server (one JSON request
  per line, a ``{"pid": ...}`` answer, then the child's wait status), used by the kill/resume
  trials and the Ctrl-C tests.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import select
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

KILL_WORKER = Path(__file__).resolve().parent / "hardening" / "kill_worker.py"


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``(exit status, stdout, stderr)`` of ``attnlab ARGV`` run in this process (argparse's
    exits included; any other exception propagates and fails the calling test)."""
    from attnlab.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
    return int(code), out.getvalue(), err.getvalue()


def word_corpus(lines: int = 80, seed: int = 0) -> str:
    """A small deterministic text of ten-word lines (a character vocabulary for tiny runs)."""
    rng = random.Random(seed)
    words = ["the", "king", "queen", "of", "and", "to", "a", "my", "lord", "thou", "art", "hath"]
    return "\n".join(" ".join(rng.choice(words) for _ in range(10)) for _ in range(lines)) + "\n"


def tree_digest(directory: Path) -> dict[str, str]:
    """Every file under ``directory``: its relative name -> the SHA-256 of its bytes."""
    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}  # fmt: skip


class ForkServer:
    """``kill_worker.py`` started once (torch imported there, not per run) and its protocol:
    :meth:`start` a request, then :meth:`wait` for the child's answer."""

    def __init__(self, run_timeout: float) -> None:
        self.run_timeout = run_timeout
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, str(KILL_WORKER)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert self.answer(120.0) == {"ready": True}

    def answer(self, timeout: float) -> dict[str, Any] | None:
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

    def start(self, request: dict[str, Any]) -> int:
        """Start a command; returns its process id (:meth:`wait` waits for it)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        started = self.answer(60.0)
        assert started is not None and "pid" in started, started
        return int(started["pid"])

    def wait(self, pid: int, log: Callable[[], str]) -> dict[str, Any]:
        """The answer for the child ``pid`` (``status``: its wait status, ``cpu_s``); a child
        that runs past ``run_timeout`` is killed (so the server answers the next request) and
        fails the test with its ``log()``."""
        answer = self.answer(self.run_timeout)
        if answer is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self.answer(30.0)
            raise AssertionError(f"the run did not end within {self.run_timeout:.0f} s:\n{log()}")
        return answer

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
