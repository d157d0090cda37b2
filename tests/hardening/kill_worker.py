"""Fork server for ``test_kill_resume.py`` and ``tests/training/test_interrupt.py``: CLI runs.

Started once as ``python kill_worker.py``, it imports torch and attnlab (the slow part of starting
a run) and then serves one JSON request per stdin line::

    {"argv": [...], "log": PATH, "root": RUN_DIR, "kill_at": K or null, "only": TEXT or null,
     "cpu_kill_after": SECONDS or null, "events": PATH or null, "stop_at": K, [K, ...] or null}

For each it forks a child that runs ``attnlab.cli.main(argv)`` with stdout/stderr in ``log``,
answers ``{"pid": PID}``, waits for the child and answers ``{"status": WAIT_STATUS, "cpu_s":
SECONDS}`` (the child's CPU time, user + system).

Timed kill (at an arbitrary instruction, wherever it lands: start-up, a training step, the middle
of a ``safetensors`` write): with ``cpu_kill_after`` the child arms ``ITIMER_PROF``, so the kernel
sends it ``SIGPROF`` once it has used that much CPU time. ``SIGPROF`` keeps its default action,
which ends the process at once exactly like ``SIGKILL`` (no handler, no cleanup, no flush); its
wait status names ``SIGPROF``. CPU time, unlike wall-clock time, does not stretch when the machine
is loaded, so the point of progress a given delay reaches hardly varies between runs.

Kill switch (a kill from inside, at an exact point): the child counts the file operations it does
under ``root`` (those whose path relative to ``root`` contains ``only``, when given): ``os.fsync``
(about to make a file durable), ``os.replace`` (before and after the atomic rename), and
``Path.write_text`` (a non-atomic write). At the ``kill_at``-th one it SIGKILLs itself; a
``write_text`` kill writes half of the text first (a write torn by the kill). ``events`` receives
the list of the operations the child counted (when it is not killed), so the test knows how many
kill points a run has. With ``stop_at`` (one number or a list) the child instead stops itself
(``SIGSTOP``) at that operation: a run held still in the middle, owning its run directory, while
the test tries a second writer on it (and then ends it with SIGKILL), or sends it a signal
before it continues (``SIGCONT``; ``test_interrupt.py``).

A child handles SIGINT and SIGTERM as a process started from a terminal does (Python's
``KeyboardInterrupt`` and the default action), whatever the test runner inherited (a shell
without job control starts background jobs with SIGINT ignored).
Nothing here changes what the run computes.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo  # imported by the first optimizer: 1 s, paid once here, not per run

from attnlab.cli import main

_replace, _fsync, _write_text = os.replace, os.fsync, pathlib.Path.write_text


class KillSwitch:
    """Counts file operations under ``root`` and SIGKILLs the process at the ``kill_at``-th."""

    def __init__(
        self,
        root: str,
        kill_at: int | None,
        only: str | None,
        stop_at: int | list[int] | None = None,
    ) -> None:
        self.root, self.kill_at, self.only = os.path.realpath(root), kill_at, only
        self.stop_at = stop_at if isinstance(stop_at, list) else [stop_at]
        self.events: list[str] = []

    def event(self, kind: str, path: str, before_kill: Callable[[], None] | None = None) -> None:
        real = os.path.realpath(path)
        if not real.startswith(self.root + os.sep) and real != self.root:
            return
        name = re.sub(r"[.][^./]+[.]tmp$", ".tmp", os.path.relpath(real, self.root))
        if self.only is not None and self.only not in name:
            return
        self.events.append(f"{kind} {name}")
        if len(self.events) in self.stop_at:  # held still here until the test goes on
            os.kill(os.getpid(), signal.SIGSTOP)
        if len(self.events) == self.kill_at:
            if before_kill is not None:
                before_kill()
            os.kill(os.getpid(), signal.SIGKILL)

    def install(self) -> None:
        def replace(src: Any, dst: Any, **kw: Any) -> None:
            self.event("replace-before", os.fspath(dst))
            _replace(src, dst, **kw)
            self.event("replace-after", os.fspath(dst))

        def fsync(fd: Any) -> None:
            fd = fd if isinstance(fd, int) else fd.fileno()
            self.event("fsync", os.readlink(f"/proc/self/fd/{fd}"))
            _fsync(fd)

        def write_text(path: pathlib.Path, data: str, *args: Any, **kw: Any) -> int:
            def torn() -> None:  # half the text reaches the file, then the kill
                with open(path, "w", encoding=kw.get("encoding", "utf-8")) as f:
                    f.write(data[: len(data) // 2])

            self.event("write_text", os.fspath(path), torn)
            return _write_text(path, data, *args, **kw)

        os.replace = replace
        os.fsync = fsync
        pathlib.Path.write_text = write_text  # type: ignore[method-assign,assignment]


def child(request: dict[str, Any]) -> int:
    """Run one CLI command with its output in ``request["log"]``; returns the exit status."""
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    switch = KillSwitch(
        request["root"], request.get("kill_at"), request.get("only"), request.get("stop_at")
    )
    switch.install()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if request.get("cpu_kill_after") is not None:
        signal.signal(signal.SIGPROF, signal.SIG_DFL)  # the default action: terminate at once
        signal.setitimer(signal.ITIMER_PROF, max(float(request["cpu_kill_after"]), 1e-6))
    try:
        status = int(main(request["argv"]))
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
        status = 1
    if request.get("events"):
        with open(request["events"], "w", encoding="utf-8") as f:
            json.dump(switch.events, f)
    sys.stdout.flush()
    sys.stderr.flush()
    return status


def serve() -> None:
    torch.set_num_threads(1)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            os._exit(child(request))
        print(json.dumps({"pid": pid}), flush=True)
        _, status, usage = os.wait4(pid, 0)
        cpu = usage.ru_utime + usage.ru_stime
        print(json.dumps({"status": status, "cpu_s": cpu}), flush=True)


if __name__ == "__main__":
    serve()
