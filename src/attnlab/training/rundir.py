"""The run directory: one layout for every recipe.

::

    runs/<name>/
      run.json                  what the run is: recipe, its options, model and train configs,
                                data, parameter count, one entry per session (command, steps)
      metrics.jsonl             one JSON object per logged step or evaluation (training.metrics)
      tokenizer.json            the recipe's tokenizer, when it has one
      checkpoints/
        step_00000100/          model.safetensors + config.json (a model directory) +
                                trainer_state.json + trainer_state.safetensors (training.state)
        latest                  the name of the newest complete checkpoint
      best/  last/  averaged/   exported model directories, when the recipe asks for them
                                (model files + tokenizer.json + export.json)

The ``latest`` pointer is a *name* inside ``checkpoints/`` (``step_`` and 8 digits), never a
path: anything else is ignored. :meth:`RunDir.resume_candidates` lists the checkpoints a resume
may use, newest first (the pointer's first); the trainer verifies each by loading it and falls
back to the previous one when a checkpoint is damaged, saying so. A run directory is never
started over by accident: a new run refuses a directory that holds a run unless asked to
overwrite it (:meth:`RunDir.prepare`).

Older layouts: a run of attnlab 0.1's recipes (``train_config.json`` instead of ``run.json``)
still loads and resumes (its trainer state is read as version 1); a run of 0.1's translation
loop (``run.json`` with a ``config`` key, ``checkpoints/step_*/state.json``) is recognised and
refused with the way to convert it (:func:`attnlab.training.legacy.convert_translation_run`).
A ``run.json`` of a newer attnlab (a higher ``version``), or of another ``format``, is refused
(:func:`check_record`) and never rewritten as this version's.

One process writes a run directory at a time: it owns the directory's ``.lock``
(:mod:`attnlab.training.runlock`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from attnlab.io import (
    atomic_write_json,
    atomic_write_text,
    check_version,
    read_json,
    remove_stale_temp_files,
)
from attnlab.pretrained import (
    CONFIG_NAME,
    DIRECTORY_RESOLVERS,
    WEIGHT_FILES,
    WEIGHTS_NAME,
    holds_weights,
    save_pretrained,
)
from attnlab.training.metrics import METRICS_NAME
from attnlab.training.state import STATE_NAME, STATE_TENSORS_NAME, write_training_state

logger = logging.getLogger(__name__)

RUN_NAME = "run.json"
LEGACY_RUN_NAME = "train_config.json"  # attnlab 0.1's recipes
TOKENIZER_NAME = "tokenizer.json"
EXPORT_INFO_NAME = "export.json"
LEGACY_EXPORT_INFO_NAME = "translation.json"  # attnlab 0.1's translation exports
CHECKPOINTS_DIR = "checkpoints"
LATEST_NAME = "latest"
EXPORTS = ("best", "last", "averaged")
RUN_FORMAT = "attnlab-run"
RUN_VERSION = 1
_STEP_NAME = re.compile(r"step_(\d{8})")


class RunDirError(ValueError):
    """A run directory that cannot be used as asked (the message says why and what to do)."""


def step_name(step: int) -> str:
    """``step_<step, 8 digits>``."""
    return f"step_{step:08d}"


class RunDir:
    """Paths and files of one run directory (see the module docstring).

    Args:
        path: the directory (need not exist yet).

    Raises:
        RunDirError: if ``path`` exists and is not a directory.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(f"run directory {self.path} is a file, not a directory")

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS_DIR

    @property
    def record_file(self) -> Path:
        return self.path / RUN_NAME

    def checkpoint(self, step: int) -> Path:
        """The directory the checkpoint of ``step`` has (or would have)."""
        return self.checkpoints / step_name(step)

    # -- what is here ----------------------------------------------------------------------

    def holds_run(self) -> bool:
        """Whether the directory holds a run (its record, metrics or checkpoints)."""
        names = (RUN_NAME, LEGACY_RUN_NAME, METRICS_NAME, CHECKPOINTS_DIR)
        return any((self.path / n).exists() for n in names)

    def is_legacy_translation(self) -> bool:
        """Whether this is a run of attnlab 0.1's translation loop."""
        if not self.record_file.is_file():
            return False
        try:
            data = read_json(self.record_file, what="run record", expect=dict)
        except ValueError:
            return False
        return "config" in data and "format" not in data

    def read_record(self) -> dict[str, Any]:
        """``run.json`` (or an attnlab 0.1 recipe's ``train_config.json``, as ``{"recipe",
        "options", "train", "model"}``).

        Raises:
            FileNotFoundError: if neither exists. RunDirError: for a translation run of attnlab
            0.1, or a record that is not a run record. FormatError / NewerVersionError
            (``ValueError`` s): for a record of another format or of a newer attnlab.
        """
        if self.is_legacy_translation():
            raise RunDirError(
                f"{self.path} is a translation run written by attnlab 0.1 (another layout). Its "
                "model directories (averaged/, best/, last/) still load with `attnlab "
                "translate`; to continue training it, convert it first: `attnlab convert-run "
                f"{self.path}` (keeps a copy of the old files in {self.path}/legacy-0.1/)"
            )
        for name in (RUN_NAME, LEGACY_RUN_NAME):
            file = self.path / name
            if file.is_file():
                data: dict[str, Any] = read_json(file, what="run record", expect=dict)
                if name == RUN_NAME:
                    check_record(file, data)
                missing = [k for k in ("recipe", "options", "train", "model") if k not in data]
                if missing:
                    raise RunDirError(
                        f"{file} is not a run record: missing {missing} (expected recipe, "
                        "options, train, model)"
                    )
                return data
        raise FileNotFoundError(
            f"{self.path} is not a run directory: no {RUN_NAME} (written by `attnlab train`)"
        )

    def write_record(self, record: Mapping[str, Any], *, session: Mapping[str, Any]) -> None:
        """Write ``run.json``: ``record`` plus the sessions so far and this one appended."""
        sessions: list[Any] = []
        if self.record_file.is_file():
            try:
                old = read_json(self.record_file, what="run record", expect=dict)
            except ValueError:  # torn by a kill in an older version: the sessions are lost
                logger.warning("%s was unreadable; its session list starts again", self.record_file)
            else:  # a newer attnlab's record is never rewritten as this version's
                check_record(self.record_file, old)
                sessions = list(old.get("sessions", []))
        data = {"format": RUN_FORMAT, "version": RUN_VERSION, **record}
        data["sessions"] = [*sessions, {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), **session}]
        atomic_write_json(self.record_file, data)

    # -- a fresh run -----------------------------------------------------------------------

    def prepare(self, *, resume: bool, overwrite: bool) -> None:
        """Make the directory ready for a run: a fresh run needs an empty (or no) directory,
        or ``overwrite`` (which deletes the old run's files); ``resume`` keeps everything and
        removes temporary files of writes a kill interrupted.

        Raises:
            RunDirError: for a directory holding a run without ``resume`` or ``overwrite``, or
                a legacy translation run when resuming.
        """
        if resume:
            if self.is_legacy_translation():
                self.read_record()  # raises with the conversion hint
            remove_stale_temp_files(self.checkpoints)
            remove_stale_temp_files(self.path, recursive=False)
            return
        if not self.holds_run():
            self.path.mkdir(parents=True, exist_ok=True)
            return
        if not overwrite:
            raise RunDirError(
                f"{self.path} already holds a run: pass --resume to continue it, --overwrite to "
                "replace it, or another --out/--name"
            )
        for name in (RUN_NAME, LEGACY_RUN_NAME, METRICS_NAME, TOKENIZER_NAME, "tb"):
            target = self.path / name
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
        for name in (CHECKPOINTS_DIR, *EXPORTS):
            shutil.rmtree(self.path / name, ignore_errors=True)

    # -- checkpoints -----------------------------------------------------------------------

    def checkpoint_dirs(self) -> list[Path]:
        """Every ``step_XXXXXXXX`` directory, oldest first (complete or not)."""
        if not self.checkpoints.is_dir():
            return []
        found = [p for p in self.checkpoints.iterdir() if _STEP_NAME.fullmatch(p.name)]
        return sorted(p for p in found if p.is_dir() and not p.is_symlink())

    def pointer_target(self) -> Path | None:
        """The checkpoint the ``latest`` pointer names, if it is a valid name of an existing
        directory here (a path, ``..``, or a missing step gives ``None``)."""
        pointer = self.checkpoints / LATEST_NAME
        if not pointer.is_file() or pointer.is_symlink():
            return None
        try:
            name = pointer.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return None
        if not _STEP_NAME.fullmatch(name):
            return None
        target = self.checkpoints / name
        return target if target.is_dir() and not target.is_symlink() else None

    def resume_candidates(self) -> list[Path]:
        """Checkpoints a resume may try, best first: the pointer's target, then every other
        complete one, newest first. "Complete" only means its four files exist; the trainer
        verifies a candidate by loading it."""
        ordered = list(reversed(self.checkpoint_dirs()))
        target = self.pointer_target()
        if target is not None:
            ordered.remove(target)
            ordered.insert(0, target)
        return [p for p in ordered if is_complete(p)]

    def latest(self) -> Path | None:
        """The newest complete checkpoint (the pointer's, else the newest), or ``None``."""
        candidates = self.resume_candidates()
        return candidates[0] if candidates else None

    def save_checkpoint(
        self,
        model: nn.Module,
        state: Mapping[str, Any],
        *,
        keep: int,
        model_state: Mapping[str, Tensor] | None = None,
    ) -> Path:
        """Write ``model`` and the trainer ``state`` (holding ``"step"``) as the checkpoint of
        that step, point ``latest`` at it, and delete all but the ``keep`` newest (up to it).

        A checkpoint is written into its own directory (every file through a temporary file,
        fsync and ``os.replace``) before the pointer moves, so a process killed at any point
        leaves ``latest`` naming a complete checkpoint.
        """
        directory = self.checkpoint(int(state["step"]))
        save_pretrained(model, directory, state_dict=model_state)
        write_training_state(directory, state)
        atomic_write_text(self.checkpoints / LATEST_NAME, directory.name + "\n")
        older = [p for p in reversed(self.checkpoint_dirs()) if p.name <= directory.name]
        for old in older[keep:]:
            shutil.rmtree(old, ignore_errors=True)
        return directory

    # -- exports ---------------------------------------------------------------------------

    def export(self, name: str, model: nn.Module, info: Mapping[str, Any]) -> Path:
        """Write a self-contained model directory ``name/``: the model files, the run's
        tokenizer (when it has one) and ``info`` as ``export.json``."""
        directory = save_pretrained(model, self.path / name)
        tokenizer = self.path / TOKENIZER_NAME
        if tokenizer.is_file():
            atomic_write_text(directory / TOKENIZER_NAME, tokenizer.read_text(encoding="utf-8"))
        atomic_write_json(directory / EXPORT_INFO_NAME, dict(info))
        return directory


def check_record(file: Path, data: Mapping[str, Any]) -> int:
    """The version of the run record ``data`` (read from ``file``): attnlab's format, a version
    this release reads (a record without one is version 1).

    Raises:
        FormatError: for another format. NewerVersionError: for a newer attnlab's record.
    """
    return check_version(file, data, format=RUN_FORMAT, version=RUN_VERSION,
                         what="an attnlab run record")  # fmt: skip


def is_complete(checkpoint: Path) -> bool:
    """Whether ``checkpoint`` holds the model files and the trainer state files."""
    names = (WEIGHTS_NAME, CONFIG_NAME, STATE_NAME, STATE_TENSORS_NAME)
    return all((checkpoint / n).is_file() for n in names)


def latest_checkpoint(path: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint of a run directory (a checkpoint or model directory is
    returned as is); ``None`` when there is none."""
    p = Path(path)
    if (p / WEIGHTS_NAME).is_file():
        return p
    return RunDir(p).latest() if p.is_dir() else None


def resolve_model_directory(path: str | os.PathLike[str]) -> Path:
    """The model directory a command should load for ``path``: ``path`` itself when it holds
    weights (a model directory, an export, a checkpoint), else the newest complete checkpoint
    of the run directory ``path``.

    Raises:
        FileNotFoundError: when ``path`` is neither (naming what it looked for).
        NotADirectoryError: for a file.
    """
    p = Path(path)
    if p.is_file():
        raise NotADirectoryError(f"{p} is a file; expected a model or run directory")
    if holds_weights(p):
        return p
    if p.is_dir() and RunDir(p).holds_run():
        latest = RunDir(p).latest()
        if latest is None:
            raise FileNotFoundError(f"run directory {p} has no complete checkpoint yet")
        return latest
    if not p.exists():
        raise FileNotFoundError(f"model directory {p} does not exist")
    raise FileNotFoundError(
        f"{p} holds no model (one of {', '.join(WEIGHT_FILES)}) and is not a run directory"
    )


def _run_model_directory(path: Path) -> Path | None:
    """For :func:`attnlab.pretrained.from_pretrained`: a run directory's newest checkpoint."""
    if RunDir(path).holds_run():
        return resolve_model_directory(path)
    return None


DIRECTORY_RESOLVERS.append(_run_model_directory)


def find_tokenizer(model_dir: str | os.PathLike[str]) -> Path | None:
    """The ``tokenizer.json`` that goes with a model directory: its own, else (a checkpoint
    inside a run) the run's; ``None`` when there is none."""
    p = Path(model_dir)
    for candidate in (p / TOKENIZER_NAME, p.parent.parent / TOKENIZER_NAME):
        if candidate.is_file() and (candidate.parent == p or p.parent.name == CHECKPOINTS_DIR):
            return candidate
    return None


def read_export_info(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``export.json`` (or attnlab 0.1's ``translation.json``) of an exported model
    directory; ``{}`` when it has neither."""
    for name in (EXPORT_INFO_NAME, LEGACY_EXPORT_INFO_NAME):
        file = Path(directory) / name
        if file.is_file():
            data: dict[str, Any] = read_json(file, what="export info", expect=dict)
            return data
    return {}


__all__ = [
    "CHECKPOINTS_DIR",
    "EXPORTS",
    "EXPORT_INFO_NAME",
    "LATEST_NAME",
    "RUN_NAME",
    "TOKENIZER_NAME",
    "RunDir",
    "RunDirError",
    "check_record",
    "find_tokenizer",
    "is_complete",
    "latest_checkpoint",
    "read_export_info",
    "resolve_model_directory",
    "step_name",
]
