"""The C library's memory allocator: freed memory kept for the next training step.

PyTorch's CPU tensors come from the C library's ``malloc``. glibc's (Linux) serves a block above
its *mmap threshold* with a fresh ``mmap`` and returns it to the system when freed, and it gives
the top of its heap back (``trim``) once more than its *trim threshold* lies free there. Both
thresholds start at 128 KiB and follow the largest block freed so far (the mmap threshold up to
32 MiB, the trim threshold at twice that). A training step frees its activations when the
backward has used them, a lot of memory at once at the top of the heap, so glibc hands it back
to the system, and the next step's forward asks for it again: the kernel then maps and zeroes
every page anew, one page fault each (4 KiB): a median of 6,112 faults a step at the Shakespeare
shape of ``benchmarks/train_step.py`` (10.7M parameters, batch 8 x 256), 975 for the baby GPT
(``benchmarks/results/cpu_allocator.md``).

:func:`retain_freed_memory` fixes both thresholds (``mallopt``): blocks up to 32 MiB come from the
heap, and the heap is not trimmed, so a step reuses the pages its predecessor freed; the faults
per step fall to about zero. The process then holds on to its peak heap until it ends or calls
:func:`release_freed_memory` (``malloc_trim``): what a CUDA caching allocator does on a GPU.
``benchmarks/cpu_allocator.py`` measures the step time with and without it
(``benchmarks/results/cpu_allocator.md``). ``Trainer.fit`` calls it when it trains on the CPU with
``TrainConfig.retain_cpu_memory`` (the default). Elsewhere than glibc (macOS, Windows, musl) the
functions do nothing and say so; the same effect comes from ``GLIBC_TUNABLES`` before a process
starts (``glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=2147483647``), which
is how a process that is not ours (nanoGPT's ``train.py``) gets it.

The setting is the process's, not one model's; the values computed do not change (the
allocator only decides where tensors live). The system counts the memory a process keeps free
as used, so the trainer gives it back when ``fit`` returns (:func:`release_freed_memory`): a
memory check later in the process (:mod:`attnlab.analysis.memory_check`) then sees it available.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform

# mallopt's parameter numbers (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MAX_MMAP_THRESHOLD = 32 * 2**20  # glibc's largest accepted value on 64-bit (HEAP_MAX_SIZE / 2)
NEVER_TRIM = 2**31 - 1  # mallopt takes an int: about 2 GiB free at the heap's top before a trim
# the same two settings for a process started with them (glibc reads GLIBC_TUNABLES at start)
GLIBC_TUNABLES = (
    f"glibc.malloc.mmap_threshold={MAX_MMAP_THRESHOLD}:glibc.malloc.trim_threshold={NEVER_TRIM}"
)


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """This process's glibc, or ``None`` where the C library is another."""
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def retain_freed_memory(mmap_threshold: int = MAX_MMAP_THRESHOLD) -> bool:
    """Make glibc's ``malloc`` keep the memory this process frees for its next allocations.

    Sets the mmap threshold to ``mmap_threshold`` bytes (blocks up to it come from the heap) and
    the trim threshold to :data:`NEVER_TRIM`; both stop following the blocks freed. Repeating
    the call is harmless. Lasts for the process; :func:`release_freed_memory` gives the free
    memory back once.

    Args:
        mmap_threshold: the largest block served from the heap, 1 B to 32 MiB
            (:data:`MAX_MMAP_THRESHOLD`, glibc's limit on 64-bit).

    Returns:
        ``True`` when glibc took both settings; ``False`` where the C library is not glibc
        (nothing is changed) or refused one (a 32-bit glibc takes thresholds up to 512 KiB
        only): training goes on as before either way.

    Raises:
        ValueError: for a threshold outside 1 B to 32 MiB.
    """
    if not 1 <= mmap_threshold <= MAX_MMAP_THRESHOLD:
        raise ValueError(
            f"mmap_threshold must be 1 to {MAX_MMAP_THRESHOLD} bytes (32 MiB), got {mmap_threshold}"
        )
    libc = _glibc()
    if libc is None:
        return False
    return all(
        libc.mallopt(ctypes.c_int(param), ctypes.c_int(value)) == 1
        for param, value in ((_M_MMAP_THRESHOLD, mmap_threshold), (_M_TRIM_THRESHOLD, NEVER_TRIM))
    )


def release_freed_memory() -> bool:
    """Give the memory this process holds free back to the system (glibc's ``malloc_trim(0)``).

    Returns:
        ``True`` when glibc released some; ``False`` when there was nothing to release or the C
        library is not glibc.
    """
    libc = _glibc()
    return libc is not None and libc.malloc_trim(ctypes.c_size_t(0)) == 1
