"""The course companion (docs/course/): every page runs, checks what it claims, and both editions
carry the same code.

A page's ``python`` fences are its cells, run in order in one namespace with the page's directory
as the working directory (as Jupyter runs the notebook jupytext makes of it) and
``ATTNLAB_COURSE_FAST=1`` (small sizes where a page trains). Tracebacks name ``page.md:LINE``.

    pytest tests/course -k 02-self-attention      # one page
    ATTNLAB_COURSE_FAST=0 pytest tests/course      # the pages at their full sizes (slow)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs"))
import doc_commands as dc

COURSE = dc.ROOT / "docs" / "course"
EN = COURSE / "en"
ZH = COURSE / "zh-CN"
PAGES = sorted(EN.glob("*.md"))
LANGS = {"python", "text"}  # cells and their shown output
PAGE_SECONDS = 240

DRIVER = """
import json, sys
cells = json.load(open(sys.argv[1], encoding="utf-8"))
ns = {"__name__": "__main__"}
for name, code in cells:
    exec(compile(code, name, "exec"), ns)
"""


def cells(page: Path) -> list[dc.Block]:
    """The page's code cells."""
    return [b for b in dc.blocks(page) if b.lang == "python"]


def test_there_is_a_course() -> None:
    assert len(PAGES) >= 1
    assert (COURSE / "README.md").exists()


def test_every_page_is_in_the_index_and_in_both_editions() -> None:
    index = (COURSE / "README.md").read_text(encoding="utf-8")
    en = {p.name for p in PAGES}
    zh = {p.name for p in ZH.glob("*.md")}
    assert en == zh, f"only English: {sorted(en - zh)}; only Chinese: {sorted(zh - en)}"
    for name in sorted(en):
        assert f"en/{name}" in index, f"docs/course/README.md does not link en/{name}"
        assert f"zh-CN/{name}" in index, f"docs/course/README.md does not link zh-CN/{name}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_editions_share_their_code(page: Path) -> None:
    """The Chinese page is the English page's twin: the same cells, in the same order (comments
    and printed text may be translated; the code may not differ)."""
    strip = re.compile(r"#.*$|(['\"]).*?\1", re.M)  # comments and string literals may differ
    twin = ZH / page.name
    en = [strip.sub("", b.code).split() for b in cells(page)]
    zh = [strip.sub("", b.code).split() for b in cells(twin)]
    assert len(en) == len(zh), f"{page.name}: {len(en)} cells in English, {len(zh)} in Chinese"
    for i, (a, b) in enumerate(zip(en, zh, strict=True)):
        assert a == b, f"{page.name}: cell {i + 1} differs between the editions"


BOTH = [*PAGES, *sorted(ZH.glob("*.md"))]


@pytest.mark.parametrize("page", BOTH, ids=lambda p: p.parent.name + "/" + p.stem)
def test_pages_are_well_formed(page: Path) -> None:
    blocks = dc.blocks(page)
    for b in blocks:
        where = f"{page.name}:{b.line}"
        assert b.lang in LANGS, f"{where}: a {b.lang or 'plain'} fence (use python or text)"
    code = cells(page)
    assert code, f"{page.name}: no code cells"
    assert "from companion import" in code[0].code, f"{page.name}: the first cell sets up the page"
    assert any(re.search(r"^\s*assert\b", b.code, re.M) for b in code), (
        f"{page.name}: no check cell (a cell that asserts what the page claims)"
    )
    assert page.read_text(encoding="utf-8").startswith("# "), f"{page.name}: start with a title"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_pages_open_as_notebooks(page: Path) -> None:
    jupytext = pytest.importorskip("jupytext")
    nb = jupytext.read(page)
    sources = [c.source for c in nb.cells if c.cell_type == "code"]
    assert sources == [b.code for b in cells(page)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_page_runs(page: Path, tmp_path: Path) -> None:
    """The page's cells run, in order, and every check holds."""
    rel = page.relative_to(dc.ROOT)
    spec = [(f"{rel}:{b.line + 1}", b.code) for b in cells(page)]
    (tmp_path / "cells.json").write_text(json.dumps(spec), encoding="utf-8")
    env = {
        **os.environ,
        "ATTNLAB_COURSE_FAST": os.environ.get("ATTNLAB_COURSE_FAST", "1"),
        "ATTNLAB_COURSE_OUT": str(tmp_path),
        "MPLBACKEND": "Agg",
    }
    env.pop("ATTNLAB_COURSE_WRITE_IMAGES", None)
    shared = dc.shared_dir()
    if shared is not None:
        env.setdefault("ATTNLAB_DATA", str(shared / "data"))
    elif "ATTNLAB_DATA" not in env and any(re.search(r"\bDATA\b", b.code) for b in cells(page)):
        pytest.skip("shared data missing (the page reads ../shared/data)")
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tmp_path / "cells.json")],
        cwd=page.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=PAGE_SECONDS,
    )
    assert proc.returncode == 0, f"{rel} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


def test_the_paper_map_links_existing_pages() -> None:
    """docs/paper_map.md's course table links each paper section to pages that exist."""
    text = (dc.ROOT / "docs" / "paper_map.md").read_text(encoding="utf-8")
    section = text.split("## The paper in the course", 1)[1]
    links = re.findall(r"\]\((course/[\w/.-]+\.md)\)", section)
    assert len(links) >= 20
    for link in links:
        assert (dc.ROOT / "docs" / link).exists(), f"docs/paper_map.md links a missing {link}"
    for sec in (
        "§3.1",
        "§3.2.1",
        "§3.2.2",
        "§3.2.3",
        "§3.3",
        "§3.4",
        "§3.5",
        "§4",
        "§5.3",
        "§5.4",
        "§6.1",
    ):
        assert f"| {sec}" in section, f"no course page for the paper's {sec}"
