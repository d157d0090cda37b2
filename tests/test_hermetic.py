"""The suite is hermetic (issue 49, class 8): every test runs in an empty working directory of its
own, and one that writes into the checkout fails (tests/conftest.py). Checked by running a small
test session with the same conftest (pytest's ``pytester``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py")
CHECKOUT = CONFTEST.parents[1]


def _inner_conftest() -> str:
    text = CONFTEST.read_text(encoding="utf-8")
    line = "CHECKOUT = Path(__file__).resolve().parents[1]"
    assert line in text
    return text.replace(line, f"CHECKOUT = Path({str(CHECKOUT)!r})")


def test_each_test_starts_in_an_empty_directory_of_its_own(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(_inner_conftest())
    pytester.makepyfile(
        """
        import os
        from pathlib import Path

        def test_one():
            assert os.listdir(".") == []
            Path("runs").mkdir()

        def test_two():
            assert os.listdir(".") == []  # test_one's runs/ is not here
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_a_test_that_writes_into_the_checkout_fails(pytester: pytest.Pytester) -> None:
    stray = CHECKOUT / f"stray-{os.getpid()}.txt"
    pytester.makeconftest(_inner_conftest())
    pytester.makepyfile(
        f"""
        from pathlib import Path

        def test_writes():
            Path({str(stray)!r}).write_text("left behind")
        """
    )
    try:
        result = pytester.runpytest("-p", "no:cacheprovider")
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        result.stdout.fnmatch_lines([f"*wrote*{stray.name}*into the checkout*"])
    finally:
        stray.unlink(missing_ok=True)
