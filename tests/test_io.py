"""attnlab.io: atomic writes (mode, no debris, nothing replaced on failure) and named errors."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

from attnlab.io import (
    atomic_save_tensors,
    atomic_write_json,
    atomic_write_text,
    json_text,
    read_json,
    read_text,
    remove_stale_temp_files,
    write_files_together,
)


def test_atomic_files_get_the_umask_mode_not_mkstemps_0600(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        # the module read the umask at import; the test process runs with the usual 022
        for file in (
            atomic_write_text(tmp_path / "a.txt", "x"),
            atomic_write_json(tmp_path / "b.json", {"a": 1}),
            atomic_save_tensors(tmp_path / "c.safetensors", {"w": torch.zeros(2)}),
        ):
            assert stat.S_IMODE(file.stat().st_mode) == 0o644, file
    finally:
        os.umask(old)


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "f.txt"
    atomic_write_text(target, "one")
    atomic_write_text(target, "two")
    assert target.read_text() == "two"
    assert sorted(p.name for p in target.parent.iterdir()) == ["f.txt"]


def test_json_text_refuses_nan_and_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    atomic_write_json(target, {"ok": 1})
    with pytest.raises(ValueError):
        atomic_write_json(target, {"bad": float("nan")})
    assert read_json(target) == {"ok": 1}
    assert json_text([1]).endswith("\n")


def test_write_files_together_replaces_nothing_when_one_writer_fails(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("old a")

    def good(p: str) -> None:
        Path(p).write_text("new a")

    def bad(p: str) -> None:
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_files_together(tmp_path, {"a": good, "b": bad})
    assert (tmp_path / "a").read_text() == "old a"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
    write_files_together(tmp_path, {"a": good})
    assert (tmp_path / "a").read_text() == "new a"


def test_parent_that_is_a_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(NotADirectoryError, match="is a file"):
        atomic_write_text(tmp_path / "f" / "x.txt", "x")


def test_remove_stale_temp_files_only_removes_ours(tmp_path: Path) -> None:
    ours = tmp_path / "d" / ".model.safetensors.k2j9_x1a.tmp"
    ours.parent.mkdir()
    ours.write_text("")
    other = tmp_path / ".notes.tmp"
    other.write_text("")
    assert remove_stale_temp_files(tmp_path) == [ours]
    assert other.exists() and not ours.exists()
    assert remove_stale_temp_files(tmp_path / "missing") == []


def test_read_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="missing config"):
        read_text(tmp_path / "nope", what="config")
    with pytest.raises(IsADirectoryError, match="is a directory"):
        read_text(tmp_path)
    (tmp_path / "bin").write_bytes(b"ab\xff")
    with pytest.raises(ValueError, match=r"not valid UTF-8 text \(byte 2\)"):
        read_text(tmp_path / "bin")
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.json is not valid JSON"):
        read_json(tmp_path / "bad.json")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    with pytest.raises(ValueError, match="nested too deeply"):
        read_json(tmp_path / "deep.json")
    (tmp_path / "big.json").write_text("1" * 5000, encoding="utf-8")
    with pytest.raises(ValueError, match="JSON parsing refused"):
        read_json(tmp_path / "big.json")
    (tmp_path / "list.json").write_text("[]", encoding="utf-8")
    with pytest.raises(ValueError, match="must hold a JSON object, got array"):
        read_json(tmp_path / "list.json", expect=dict)
