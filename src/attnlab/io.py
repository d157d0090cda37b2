"""Files, written so that nothing is ever half-written, and read with errors that name the file.

Every file attnlab writes (model weights and configs, trainer state, run records, tokenizers,
pictures' data) goes through this module:

- :func:`atomic_write` fills a temporary file in the target's directory (``.NAME.XXXXXXXX.tmp``),
  fsyncs it, moves it over the target with ``os.replace`` and fsyncs the directory. A process
  killed at any instant leaves the old file or the new one, never a torn one — at worst a stale
  temporary file, which :func:`remove_stale_temp_files` recognises and deletes.
  :func:`atomic_write_bytes`, :func:`atomic_write_text`, :func:`atomic_write_json` and
  :func:`atomic_save_tensors` (safetensors) are its common cases.
- :func:`write_files_together` writes several files of one directory (a checkpoint's weights and
  config): every temporary file is complete before the first replacement, so a failing writer
  leaves all the old files in place. A write the file system refuses (a full disk: ``ENOSPC``)
  raises an ``OSError`` naming the file it was writing, never the temporary one or none.
- :func:`find_data_file` looks a data set up offline, in :func:`data_dirs`: ``$ATTNLAB_DATA``,
  ``../shared/data`` beside a source checkout of attnlab, ``~/.cache/attnlab``.
- :func:`read_json` and :func:`read_text` raise ``FileNotFoundError``/``ValueError`` naming the
  file and what is wrong with it (missing, a directory, invalid UTF-8, invalid JSON, nesting too
  deep, an integer too long), never a bare parser traceback.
- :func:`check_version`: the one check of a file's ``"format"`` and ``"version"`` (run records,
  trainer states, tokenizers, quantization records). A file of another format raises
  :class:`FormatError`; one written by a newer attnlab :class:`NewerVersionError`, which a
  caller never takes for damage (it refuses, and changes nothing).

Floor 0: imports nothing of attnlab.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

# The names of :func:`_write_temp`'s files: "." + the target's name + "." + mkstemp's 8 random
# characters + ".tmp" (e.g. ".model.safetensors.k2j9_x1a.tmp").
_TEMP_NAME = re.compile(r"\.(?P<target>.+)\.[A-Za-z0-9_]{8}\.tmp")

PathLike = str | os.PathLike[str]


def _file_mode() -> int:
    """The mode ``open()`` would give a new file: 0o666 less the umask (mkstemp's files are
    0o600, which would hide a run's files from its group and from other users)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


_FILE_MODE = _file_mode()


def fsync_dir(directory: PathLike) -> None:
    """Make the renames in ``directory`` durable (POSIX; a no-op where directories cannot be
    opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_error(target: Path, e: BaseException, tmp: str | None = None) -> OSError | None:
    """The ``OSError`` to raise for ``e``, a failed write of ``target``: one naming ``target``
    when ``e`` names no file or only the temporary one (a full disk: a writer's ``write``
    raises ``OSError(ENOSPC)`` without a file name, safetensors a ``SafetensorError`` naming
    the OS error and its temporary file), so that every message says which file could not be
    written; ``None`` to raise ``e`` as it is."""
    if isinstance(e, OSError):
        if e.filename is not None and str(e.filename) != str(tmp):
            return None
        code, text = e.errno, e.strerror or str(e) or type(e).__name__
    elif isinstance(e, SafetensorError) and re.search(r"I/O error|IoError", str(e)):
        # "Error while serializing: I/O error: No space left on device (os error 28) at ..."
        found = re.search(r"os error (\d+)|code: (\d+)", str(e))
        code = int(found.group(1) or found.group(2)) if found else None
        text = os.strerror(code) if code else str(e)
    else:
        return None
    return OSError(code, text, str(target))  # OSError picks the errno's subclass


def _write_temp(directory: Path, name: str, write: Callable[[str], None]) -> Path:
    """Run ``write(path)`` on a fresh temporary file in ``directory``, fsync it, return it.

    Raises:
        OSError: naming ``directory / name`` (not the temporary file) when the file system
            refuses (a full disk, no permission), as :func:`_write_error`.
    """
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    except OSError as e:
        raise (_write_error(directory / name, e, e.filename) or e) from None
    os.close(fd)
    try:
        write(tmp)
        with contextlib.suppress(OSError):  # after write: some writers recreate the file
            os.chmod(tmp, _FILE_MODE)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        named = _write_error(directory / name, e, tmp)
        if named is not None:
            raise named from e
        raise
    return Path(tmp)


def _replace(tmp: Path, target: Path) -> None:
    """``os.replace(tmp, target)``; an ``OSError`` names ``target`` (not the temporary file)."""
    try:
        os.replace(tmp, target)
    except OSError as e:
        raise (_write_error(target, e, str(tmp)) or e) from e


def _parent_dir(target: Path) -> Path:
    """``target``'s directory, created if missing.

    Raises:
        NotADirectoryError: if the parent (or one of its parents) is a file.
    """
    parent = target.parent
    if parent.exists() and not parent.is_dir():
        raise NotADirectoryError(f"cannot write {target}: {parent} is a file, not a directory")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise NotADirectoryError(
            f"cannot write {target}: a parent of {parent} is a file, not a directory"
        ) from None
    return parent


def atomic_write(path: PathLike, write: Callable[[str], None]) -> Path:
    """Write the file ``path`` atomically: ``write(tmp)`` fills a temporary file in the same
    directory (created if missing), which is fsync-ed and moved over ``path``.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        IsADirectoryError: if ``path`` is an existing directory.
        NotADirectoryError: if its parent is a file.
        OSError: naming ``path`` when the file system refuses the write (a full disk, no
            permission; the old file, if any, is left as it was).
    """
    target = Path(path)
    if target.is_dir():
        raise IsADirectoryError(f"cannot write {target}: it is a directory")
    parent = _parent_dir(target)
    tmp = _write_temp(parent, target.name, write)
    try:
        _replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(parent)
    return target


def atomic_write_bytes(path: PathLike, data: bytes) -> Path:
    """:func:`atomic_write` of ``data``."""

    def write(tmp: str) -> None:
        Path(tmp).write_bytes(data)

    return atomic_write(path, write)


def atomic_write_text(path: PathLike, text: str) -> Path:
    """:func:`atomic_write` of ``text`` (UTF-8).

    Raises:
        TypeError: if ``text`` is not a string (before anything is written).
    """
    if not isinstance(text, str):
        raise TypeError(f"atomic_write_text needs a str, got {type(text).__name__}")

    def write(tmp: str) -> None:
        Path(tmp).write_text(text, encoding="utf-8")

    return atomic_write(path, write)


def json_text(data: Any) -> str:
    """``data`` as indented JSON text with a final newline (NaN/inf refused: not JSON).

    Raises:
        ValueError: for a non-finite float. TypeError: for a value JSON cannot hold.
    """
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


def atomic_write_json(path: PathLike, data: Any) -> Path:
    """:func:`atomic_write_text` of :func:`json_text` (the text is made before any write)."""
    return atomic_write_text(path, json_text(data))


def atomic_save_tensors(
    path: PathLike, tensors: Mapping[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> Path:
    """Write a flat ``name -> tensor`` dict as safetensors to ``path`` atomically (tensors are
    copied to contiguous CPU memory first)."""
    data = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}

    def write(tmp: str) -> None:
        save_file(data, tmp, metadata=metadata)

    return atomic_write(path, write)


def write_files_together(directory: PathLike, writers: Mapping[str, Callable[[str], None]]) -> None:
    """Write several files of ``directory`` (created if missing): every ``writers[name](tmp)``
    fills and fsyncs a temporary file first, then all are moved into place and the directory is
    fsync-ed. If a writer fails, the temporary files already written are removed and nothing is
    replaced."""
    root = Path(directory)
    if root.exists() and not root.is_dir():
        raise NotADirectoryError(f"cannot write into {root}: it is a file, not a directory")
    root.mkdir(parents=True, exist_ok=True)
    temps: dict[str, Path] = {}
    try:
        for name, write in writers.items():
            temps[name] = _write_temp(root, name, write)
    except BaseException:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
        raise
    moved: set[str] = set()
    try:
        for name, tmp in temps.items():
            _replace(tmp, root / name)
            moved.add(name)
    except BaseException:  # no temporary file is left behind
        for name, tmp in temps.items():
            if name not in moved:
                tmp.unlink(missing_ok=True)
        raise
    fsync_dir(root)


def remove_stale_temp_files(directory: PathLike, *, recursive: bool = True) -> list[Path]:
    """Delete the temporary files that interrupted atomic writes left in ``directory`` (and, with
    ``recursive``, below it): only names of the form this module creates (``.NAME.XXXXXXXX.tmp``,
    regular files, not symlinks); anything else is left alone.

    Call it only when no other process writes there (a resuming run, before it writes).

    Returns:
        The files removed (a missing ``directory`` gives ``[]``).
    """
    root = Path(directory)
    if not root.is_dir():
        return []
    candidates = root.rglob(".*.tmp") if recursive else root.glob(".*.tmp")
    removed = []
    for file in sorted(candidates):
        if _TEMP_NAME.fullmatch(file.name) and file.is_file() and not file.is_symlink():
            with contextlib.suppress(FileNotFoundError):
                file.unlink()
                removed.append(file)
    return removed


def _checkout_data() -> Path | None:
    """``../shared/data`` beside the source checkout this package runs from, if any."""
    root = Path(__file__).resolve().parents[2]  # src/attnlab/io.py -> the checkout
    shared = root.parent / "shared" / "data"
    return shared if (root / "pyproject.toml").is_file() and shared.is_dir() else None


def data_dirs() -> list[Path]:
    """The folders data sets are looked up in, in order: ``$ATTNLAB_DATA``, ``../shared/data``
    beside a source checkout, ``~/.cache/attnlab``."""
    dirs = []
    env = os.environ.get("ATTNLAB_DATA")
    if env:
        dirs.append(Path(env))
    shared = _checkout_data()
    if shared is not None:
        dirs.append(shared)
    dirs.append(Path.home() / ".cache" / "attnlab")
    return dirs


def find_data_file(name: str) -> Path | None:
    """The first of :func:`data_dirs` holding ``name`` (a file or a folder), or ``None``."""
    for directory in data_dirs():
        if (directory / name).exists():
            return directory / name
    return None


def read_text(path: PathLike, *, what: str = "file") -> str:
    """The UTF-8 text of ``path``.

    Args:
        what: what the file is, for messages (e.g. ``"config"``).

    Raises:
        FileNotFoundError: if it is missing. IsADirectoryError: if it is a directory.
        ValueError: if it is not valid UTF-8 (naming the byte offset).
    """
    file = Path(path)
    if file.is_dir():
        raise IsADirectoryError(f"{what} {file} is a directory, expected a file")
    if not file.is_file():
        raise FileNotFoundError(f"missing {what} {file}")
    try:
        return file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} {file} is not valid UTF-8 text (byte {e.start})") from None


def parse_json(text: str, *, source: str) -> Any:
    """Parse JSON ``text``; ``source`` names where it came from in messages (e.g.
    ``"model config /x/config.json"``).

    Raises:
        ValueError: for invalid JSON, nesting too deep or an integer with too many digits,
            naming ``source``; never a bare ``RecursionError`` or parser traceback.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{source} is not valid JSON: {e}") from None
    except RecursionError:
        raise ValueError(f"{source} is nested too deeply to be a real config") from None
    except ValueError as e:  # e.g. "Exceeds the limit (4300 digits) for integer string"
        raise ValueError(f"{source} holds a value JSON parsing refused: {e}") from None


def parse_json_line(line: str) -> Any | None:
    """One line of a JSON-lines file, or ``None`` for a line that does not parse (a torn last
    line of a killed run, garbage, nesting too deep, an integer too long)."""
    try:
        return parse_json(line, source="line")
    except ValueError:
        return None


def read_json(path: PathLike, *, what: str = "JSON file", expect: type | None = None) -> Any:
    """Parse the JSON file ``path``.

    Args:
        what: what the file is, for messages (e.g. ``"model config"``).
        expect: the type the top-level value must have (e.g. ``dict``).

    Raises:
        FileNotFoundError / IsADirectoryError: as :func:`read_text`.
        ValueError: for invalid UTF-8 or JSON, nesting too deep, an integer with too many
            digits, or a top-level value that is not ``expect`` — each naming the file.
    """
    file = Path(path)
    data = parse_json(read_text(file, what=what), source=f"{what} {file}")
    if expect is not None and not isinstance(data, expect):
        raise ValueError(
            f"{what} {file} must hold a JSON {_json_kind(expect)}, got {_json_kind(type(data))}"
        )
    return data


def _json_kind(cls: type) -> str:
    return {dict: "object", list: "array", str: "string", int: "integer", float: "number"}.get(
        cls, "null" if cls is type(None) else cls.__name__
    )


class FormatError(ValueError):
    """A file that is not in a format this release reads: another program's, or a version it
    does not know (the message names the file, its format and version, and what is read)."""


class NewerVersionError(FormatError):
    """A file written by a newer attnlab: a format version above the one this release reads.
    Not damage: a caller that would fall back past a damaged file (an older checkpoint) refuses
    instead, and rewrites nothing."""


def check_version(
    file: PathLike,
    data: Mapping[str, Any],
    *,
    format: str,
    version: int,
    what: str = "an attnlab file",
    required: bool = False,
    oldest: int = 1,
) -> int:
    """Check the ``"format"`` and ``"version"`` of ``data`` (the JSON object read from
    ``file``) against what this release reads; returns the file's version.

    Args:
        format: the format name files of this kind carry (``"attnlab-run"``, ...).
        version: the newest format version this release reads.
        what: the kind of file, for messages (``"an attnlab run record"``).
        required: whether the ``"format"`` key must be present; otherwise a file without
            one is taken to be of this kind (files written before the key existed).
        oldest: the oldest version read; also the version of a file without ``"version"``
            (files written before the key existed).

    Raises:
        NewerVersionError: for a version above ``version`` ("``file`` was written by a newer
            attnlab (format version N; this release reads up to M)").
        FormatError: for another ``"format"`` (or none when ``required``), or a version that
            is not an integer from ``oldest`` up.
    """
    found = data.get("format")
    if found != format and (found is not None or required):
        got = "no format" if found is None else f"format {found!r}"
        raise FormatError(f"{file} is not {what}: it has {got} (expected {format!r})")
    number = data.get("version", oldest)
    if isinstance(number, bool) or not isinstance(number, int) or number < oldest:
        raise FormatError(
            f"{file} has format version {number!r}; {what} has versions {oldest} to {version}"
        )
    if number > version:
        raise NewerVersionError(
            f"{file} was written by a newer attnlab (format version {number}; this release "
            f"reads up to {version}): upgrade attnlab to use it"
        )
    return number


__all__ = [
    "FormatError",
    "NewerVersionError",
    "atomic_save_tensors",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "check_version",
    "data_dirs",
    "find_data_file",
    "fsync_dir",
    "json_text",
    "parse_json",
    "parse_json_line",
    "read_json",
    "read_text",
    "remove_stale_temp_files",
    "write_files_together",
]
