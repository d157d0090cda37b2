"""docs/paper_map.md stays honest: every ``file::symbol`` it lists exists and imports."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENTRY = re.compile(r"`src/(attnlab/[\w/]+)\.py::([\w.]+)`")


def _entries() -> list[tuple[str, str]]:
    text = (ROOT / "docs" / "paper_map.md").read_text(encoding="utf-8")
    return ENTRY.findall(text)


def test_paper_map_has_entries() -> None:
    assert len(_entries()) >= 20


@pytest.mark.parametrize(("path", "symbol"), _entries())
def test_paper_map_symbol_imports(path: str, symbol: str) -> None:
    module = importlib.import_module(path.replace("/", ".").removesuffix(".__init__"))
    obj: object = module
    for part in symbol.split("."):
        assert hasattr(obj, part), f"{path}.py has no {symbol}"
        obj = getattr(obj, part)
