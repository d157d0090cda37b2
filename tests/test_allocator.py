"""``attnlab.allocator``: with freed memory retained, a training-like pattern of
allocations stops page-faulting (the trainer's side: tests/training/test_hardware.py)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from attnlab import allocator
from attnlab.allocator import (
    MAX_MMAP_THRESHOLD,
    release_freed_memory,
    retain_freed_memory,
)

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

# A fresh process (the setting is the process's): "steps" that each take eight 4 MiB blocks
# from malloc, write them and free them, as a forward allocates activations and the backward
# frees them (through ctypes, so that no other allocation lands between them on the heap). The
# page faults per step with glibc's own thresholds, then after retain_freed_memory().
_FAULTS = """
import ctypes, json, resource
from attnlab.allocator import retain_freed_memory

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
SIZE = 4 << 20

def step():
    blocks = [libc.malloc(SIZE) for _ in range(8)]
    for b in blocks:
        ctypes.memset(b, 1, SIZE)
    for b in reversed(blocks):
        libc.free(b)

def faults_per_step(steps=10):
    for _ in range(3):
        step()  # glibc's thresholds settle on the block size first
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        step()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start) / steps

before = faults_per_step()
retained = retain_freed_memory()
print(json.dumps({"before": before, "retained": retained, "after": faults_per_step()}))
"""


@glibc_only
def test_retained_memory_stops_the_page_faults_of_each_step() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", _FAULTS], capture_output=True, text=True,
                         env=env, timeout=120, check=True)  # fmt: skip
    faults = json.loads(out.stdout.strip().splitlines()[-1])
    assert faults["retained"] is True
    # 32 MiB given back and faulted in again each step: 8,192 pages of 4 KiB
    assert faults["before"] > 4000, faults
    assert faults["after"] < 100, faults


@glibc_only
def test_retain_sets_glibc_and_checks_its_threshold() -> None:
    assert retain_freed_memory() is True
    assert retain_freed_memory(1 << 20) is True  # repeating is harmless
    assert retain_freed_memory() is True  # back to the default
    assert isinstance(release_freed_memory(), bool)
    for bad in (0, MAX_MMAP_THRESHOLD + 1):
        with pytest.raises(ValueError, match=f"mmap_threshold must be 1 to .*got {bad}"):
            retain_freed_memory(bad)


def test_without_glibc_nothing_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "_glibc", lambda: None)
    assert retain_freed_memory() is False
    assert release_freed_memory() is False
