"""Who owns a run directory: one writing process at a time, by an operating-system lock.

A process that writes into a run directory (a training session, fresh, resumed or
overwriting; a conversion of an old run) first takes the directory's lock and holds it until
it is done: ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``RUN_DIR/.lock``, before anything in the
directory is written. A second writer is refused at once (:class:`RunOwnedError`, naming the
directory and the owner's PID, which the owner writes into the lock file), having changed
nothing: the lock file is created only where it is missing, and written only by its owner.
Readers (``attnlab sample``, ``generate``, ``evaluate``) take no lock.

- The kernel releases the lock when its process ends, however it ends (``SIGKILL`` too), so a
  killed run never leaves a stale lock: the next ``--resume`` takes it. The owner deletes the
  lock file when it is done (and the run directory, when it made it and nothing else was
  written there: a refused run leaves no trace); a killed owner's file stays, unlocked, and
  is reused. Whoever takes the lock checks that the file it locked is still the one at
  ``.lock`` (not one an owner just deleted), else tries again.
- Within one process and thread the lock is re-entrant: :func:`own_run` inside
  :func:`own_run` of the same directory (the trainer's own inside ``train_recipe``'s) counts.
- Distributed training: only the process that writes (rank 0) takes it; the others wait
  for rank 0 in their collectives as they would for any error of rank 0, and ``torchrun``
  stops them when it fails.
- Where ``fcntl`` is missing (Windows), or the file system cannot lock files (``flock``
  fails with ``ENOLCK``, ``EOPNOTSUPP``, ...), there is no lock: a warning is logged and the
  run goes on as before run directories were locked.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from attnlab.training.rundir import RunDirError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

LOCK_NAME = ".lock"
_ATTEMPTS = 10  # an owner deleting its lock file between our open and our lock: try again
# flock's errors on a file system that cannot lock (some network and FUSE file systems)
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


class RunOwnedError(RunDirError):
    """Another process owns (is writing) the run directory; nothing was changed."""


class RunLock:
    """This process's ownership of one run directory (see the module docstring); release it
    with :meth:`release` (or use :func:`own_run`)."""

    def __init__(self, path: Path, fd: int | None, created: list[Path]) -> None:
        self.path, self._fd, self._created, self._count = path, fd, created, 1

    @property
    def file(self) -> Path:
        return self.path / LOCK_NAME

    def release(self) -> None:
        """Give the directory up (the last of nested owners does): delete the lock file and
        the directories this lock made where nothing else was written, then unlock."""
        self._count -= 1
        if self._count > 0:
            return
        _HELD.pop(_key(self.path), None)
        fd, self._fd = self._fd, None
        try:
            if fd is not None:
                with contextlib.suppress(OSError):  # still ours: delete it while it is locked
                    if os.path.samestat(os.fstat(fd), os.stat(self.file)):
                        os.unlink(self.file)
            for directory in reversed(self._created):  # innermost first; only when empty
                with contextlib.suppress(OSError):
                    directory.rmdir()
        finally:
            if fd is not None:
                os.close(fd)  # releases the lock


_HELD: dict[tuple[str, int], RunLock] = {}


def _key(path: Path) -> tuple[str, int]:
    return os.path.realpath(path), threading.get_ident()


def _missing_dirs(path: Path) -> list[Path]:
    """``path`` and its parents that do not exist yet, outermost first."""
    missing = []
    for p in [path, *path.parents]:
        if p.exists():
            break
        missing.append(p)
    return missing[::-1]


def _owner(file: Path) -> str:
    """`` (pid N)`` of the process that owns ``file``, when it has written its PID."""
    with contextlib.suppress(OSError, ValueError):
        text = file.read_text(encoding="ascii").strip()
        if text:
            return f" (pid {int(text)})"
    return ""


def acquire(run_dir: str | os.PathLike[str]) -> RunLock:
    """Take the lock of ``run_dir`` (made if missing), or fail at once.

    Raises:
        RunOwnedError: when another process (or another thread here) owns it.
        RunDirError: when ``run_dir`` is a file.
    """
    path = Path(run_dir)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"run directory {path} is a file, not a directory")
    held = _HELD.get(_key(path)) if path.is_dir() else None
    if held is not None:
        held._count += 1
        return held
    created = _missing_dirs(path)
    if fcntl is None:
        path.mkdir(parents=True, exist_ok=True)
        return _unlocked(path, created, "this platform has no fcntl")
    file = path / LOCK_NAME
    for _ in range(_ATTEMPTS):
        path.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the directory was deleted by an owner leaving: again
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunOwnedError(
                f"{path} is owned by another process{_owner(file)}, which is writing this "
                "run; wait for it to finish or stop it, then try again (nothing was changed)"
            ) from None
        except OSError as e:
            if e.errno not in _NO_LOCKS:
                os.close(fd)
                raise
            return _unlocked(path, created, f"its file system does not lock files ({e})", fd)
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(file))
        except FileNotFoundError:
            same = False
        if not same:  # we locked a file its owner deleted on leaving: lock the current one
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        lock = RunLock(path, fd, created)
        _HELD[_key(path)] = lock
        return lock
    raise RunOwnedError(f"{path}: could not take its lock {file} (it kept being replaced)")


def _unlocked(path: Path, created: list[Path], why: str, fd: int | None = None) -> RunLock:
    """Ownership without a lock (``why``), said in a warning: the run goes on as it did before
    run directories were locked."""
    logger.warning("%s is not locked against a second writer: %s", path, why)
    if fd is not None:
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_size == 0:  # an empty lock file: no owner wrote it
                os.unlink(path / LOCK_NAME)
        os.close(fd)
    lock = RunLock(path, None, created)
    _HELD[_key(path)] = lock
    return lock


@contextlib.contextmanager
def own_run(run_dir: str | os.PathLike[str], *, enabled: bool = True) -> Iterator[None]:
    """Own ``run_dir`` for the ``with`` block (:func:`acquire`; nothing when not
    ``enabled``: a process that does not write, another rank of a distributed run)."""
    lock = acquire(run_dir) if enabled else None
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def owns(run_dir: str | os.PathLike[str]) -> bool:
    """Whether this process (thread) holds ``run_dir``'s lock."""
    return _key(Path(run_dir)) in _HELD


__all__ = ["LOCK_NAME", "RunLock", "RunOwnedError", "acquire", "own_run", "owns"]
