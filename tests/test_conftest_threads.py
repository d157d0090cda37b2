"""The thread share that tests/conftest.py gives each pytest-xdist worker."""

from __future__ import annotations

import os

import pytest

from conftest import thread_share, usable_cpus


def test_share_splits_the_usable_cpus() -> None:
    assert thread_share(2, 2) == 1
    assert thread_share(2, 16) == 8
    assert thread_share(3, 16) == 5
    assert thread_share(4, 2) == 1  # never zero threads


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no affinity mask here")
def test_usable_cpus_follow_the_affinity_mask() -> None:
    mask = os.sched_getaffinity(0)
    assert usable_cpus() == len(mask)
    if len(mask) < 2:
        pytest.skip("one CPU: nothing to narrow")
    one = {min(mask)}
    os.sched_setaffinity(0, one)
    try:
        assert usable_cpus() == 1  # os.cpu_count() would still say the machine's count
    finally:
        os.sched_setaffinity(0, mask)
