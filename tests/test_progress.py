"""attnlab.progress: a bar on a terminal, plain lines elsewhere (issue 52)."""

from __future__ import annotations

import io

import pytest

from attnlab.progress import Counter, is_interactive


def test_off_a_terminal_a_counter_writes_a_line_each_tenth(
    capsys: pytest.CaptureFixture[str],
) -> None:
    counter = Counter(40, "translating", "sentence", interactive=False)
    for _ in range(20):
        counter.update(2)
    counter.close()
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert lines[0] == "translating: 4/40 sentences (10%)"
    assert lines[-1] == "translating: 40/40 sentences (100%)"
    assert len(lines) == 10


def test_on_a_terminal_a_counter_is_a_bar(capsys: pytest.CaptureFixture[str]) -> None:
    counter = Counter(3, "translating", "sentence", interactive=True)
    counter.update(3)
    counter.close()
    assert counter.bar is not None and "3/3" in capsys.readouterr().err


def test_a_file_or_a_closed_stream_is_not_interactive() -> None:
    closed = io.StringIO()
    closed.close()
    assert not is_interactive(io.StringIO()) and not is_interactive(closed)
