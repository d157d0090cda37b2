"""What every command shares: one error convention, writable-output checks, the device flag.

Every command returns an exit status: 0 on success; 2 with one line ``attnlab COMMAND: error:
MESSAGE`` on stderr for bad input (a value, a missing or damaged file, a model that cannot fit,
an option that needs a package that is missing), never a traceback for those
(``ATTNLAB_DEBUG=1`` shows it); 130 when interrupted. :func:`guarded` gives a command that
behaviour.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from safetensors import SafetensorError

from attnlab.cli.overrides import flag_message

EXPECTED_ERRORS = (
    ValueError,
    TypeError,
    KeyError,
    OSError,
    ImportError,
    SafetensorError,
    UnicodeDecodeError,
)


class CommandError(Exception):
    """Bad input found by a command itself (exit 2 with its message)."""


def fail(message: str) -> NoReturn:
    """Stop the running command with exit status 2 and ``message``."""
    raise CommandError(message)


def _message(e: BaseException) -> str:
    if isinstance(e, KeyError) and e.args:
        return f"unknown key {e.args[0]!r}"
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        return f"{e.strerror}: {e.filename}"
    return str(e).replace("\n", " ").strip() or type(e).__name__


def guarded(prog: str, body: Callable[[argparse.Namespace], int]) -> Callable[..., int]:
    """``body`` returning 2 with one error line on bad input, 130 on Ctrl-C."""

    def run(args: argparse.Namespace) -> int:
        try:
            return int(body(args))
        except (CommandError, *EXPECTED_ERRORS) as e:
            if os.environ.get("ATTNLAB_DEBUG") == "1":  # the traceback, for bug reports
                raise
            # Library messages name Python arguments (``seq_len must ...``); say the flag.
            names = [k for k in vars(args) if "_" in k and not k.startswith("_")]
            print(f"{prog}: error: {flag_message(_message(e), names)}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(f"{prog}: interrupted", file=sys.stderr)
            return 130

    run.__doc__ = body.__doc__
    return run


def check_writable(path: str | os.PathLike[str] | None, *, what: str = "output") -> Path | None:
    """Refuse an output path that cannot be written, before any work is done: an existing
    directory where a file is wanted, a parent that is a file, or a read-only folder.

    Raises:
        CommandError: naming the path and the problem.
    """
    if path is None:
        return None
    target = Path(path)
    if target.is_dir():
        fail(f"{what} {target} is a directory; give a file name")
    parent = target.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        fail(f"{what} {target}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK):
        fail(f"{what} {target}: {parent} is not writable")
    try:  # what access() cannot tell (root, read-only or special file systems): try it
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        fail(f"{what} {target}: cannot write in {parent} ({e.strerror or e})")
    return target


def check_device(name: str) -> str:
    """``name`` if torch can use that device here (``auto``: CUDA when present, else CPU).

    The valid forms are those of :class:`~attnlab.training.TrainConfig`'s ``device``: ``cpu``,
    ``cuda``, ``cuda:N``, ``mps``, ``auto`` (torch also parses ``cpu:1`` or ``meta``, which no
    command can run on).

    Raises:
        CommandError: for a device that is absent or unknown, naming ``--device`` and the valid
            forms.
    """
    import torch

    from attnlab.training.config import DEVICE_PATTERN

    if not isinstance(name, str) or not DEVICE_PATTERN.fullmatch(name):
        # torch.device parses more ("cpu:1", "meta", ...) than any command can run on
        kind = str(name).partition(":")[0]
        hint = f"; {kind} is one device, give {kind}" if kind in ("cpu", "mps") else ""
        fail(f"--device {name!r} is not valid; choose cpu, cuda, cuda:N (N = 0, 1, ...), mps "
             f"or auto{hint}")  # fmt: skip
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        fail(f"--device {name}: this machine has no CUDA device (torch {torch.__version__})")
    if (
        device.type == "cuda"
        and device.index is not None
        and (device.index >= torch.cuda.device_count())
    ):
        fail(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) here")
    if device.type == "mps" and not torch.backends.mps.is_available():
        fail(f"--device {name}: MPS is not available on this machine")
    return name


def add_verify_argument(p: argparse.ArgumentParser) -> None:
    """``--no-verify``: :func:`attnlab.from_pretrained`'s ``verify=False``."""
    p.add_argument(
        "--no-verify", action="store_true",
        help="load the model even if its weights are not what its config says: a config.json "
        "edited after saving, tensor data changed in place (the digests the weights record), "
        "int or bool tensors for float parameters (cast)",
    )  # fmt: skip


__all__ = [
    "CommandError",
    "add_verify_argument",
    "check_device",
    "check_writable",
    "fail",
    "guarded",
]
