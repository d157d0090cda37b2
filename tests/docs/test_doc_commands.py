"""Every command of README.md and docs/*.md runs, in order, in a fresh copy of the checkout.

The runner and the ``<!-- ci: ... -->`` markers are :mod:`doc_commands` (beside this file).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import doc_commands as dc

DOCUMENTS = [dc.ROOT / "README.md", *sorted((dc.ROOT / "docs").glob("*.md"))]
PROMPT = re.compile(r"^\s*\$ ")


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: p.name)
def test_commands_are_marked_as_such(doc: Path) -> None:
    """Commands sit in ``bash`` fences (which run); usage and output in ``text`` fences. Every
    ``ci:`` marker is complete."""
    for b in dc.blocks(doc):
        where = f"{doc.name}:{b.line}"
        assert b.lang, f"{where}: name the fence's language (bash or python: run; text: not)"
        if b.lang == "text":  # usage synopses and output; a shell prompt marks a command
            prompts = [ln for ln in b.code.splitlines() if PROMPT.match(ln)]
            assert not prompts, f"{where}: a command in a text fence: {prompts[0]}"
        if b.directive == "skip":
            assert b.argument, f"{where}: say why a block is skipped"
        if b.directive == "instead":
            assert b.argument.strip(), f"{where}: an empty CI variant"
        if b.directive is not None:
            assert b.lang in ("bash", "sh", "python"), f"{where}: a ci: marker on a {b.lang} fence"


def test_the_scripts_name_every_block() -> None:
    text = dc.script(dc.ROOT / "README.md")
    assert text.startswith("set -euo pipefail")
    assert "### README.md:" in text and "(CI variant)" in text and "not run (setup)" in text
    assert "source .venv/bin/activate" in text  # the README activates the environment itself
    full = dc.script(dc.ROOT / "README.md", full=True)
    assert "pip install -e" in full and "(CI variant)" not in full
    first_hour = dc.script(dc.ROOT / "README.md", full=True, until="Translation")
    assert "attnlab train reverse" in first_hour and "train translate" not in first_hour
    with pytest.raises(ValueError, match="no heading"):
        dc.script(dc.ROOT / "README.md", until="No such heading")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if dc.shared_dir() is None:
        pytest.skip("no ../shared/data beside the checkout: the documents' data is missing")
    try:
        files = dc.tracked_files(dc.ROOT)
    except (OSError, dc.subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    assert files
    tmp = tmp_path_factory.mktemp("docs")
    (tmp / "home").mkdir()
    return dc.fresh_copy(tmp, venv=Path(sys.prefix))


@pytest.mark.slow
@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: p.name)
def test_document_commands_run(doc: Path, checkout: Path) -> None:
    """README.md first (the later documents start from its environment and runs)."""
    text = dc.script(doc, activate=doc.name != "README.md")
    done = dc.run(text, checkout, timeout=900, home=checkout.parent / "home")
    ran = [ln for ln in done.stderr.splitlines() if ln.startswith("### ")]
    assert done.returncode == 0, (
        f"{doc.name}: exit {done.returncode} in block {ran[-1] if ran else '?'}\n"
        f"--- stdout (end)\n{done.stdout[-3000:]}\n--- stderr (end)\n{done.stderr[-3000:]}"
    )
