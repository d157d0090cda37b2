"""A newcomer's path through README.md, verbatim: its set-up command, its main job, then its test
command, in that order, in this checkout (issue 49: the suite must pass after the main job).

The three commands are read from the README itself (tests/docs/doc_commands.py parses its fenced
blocks): the block marked ``<!-- ci: setup -->``, the first ``bash`` block after "The main job"
(run in full, not its CI variant), and the block whose ``ci: skip`` reason says it is the test
suite. They run as one bash script, the virtual environment activated after the set-up, as the
README tells a reader to do.

    python3 .ci/readme_path.py            # run them
    python3 .ci/readme_path.py --print    # show the script
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "docs"))

from doc_commands import Block, blocks  # noqa: E402


def readme_path() -> tuple[Block, Block, Block]:
    """(set-up, main job, test command) blocks of README.md.

    Raises:
        ValueError: when the README does not mark one of them (naming which).
    """
    readme = ROOT / "README.md"
    found = blocks(readme)
    setup = [b for b in found if b.directive == "setup"]
    tests = [b for b in found if b.directive == "skip" and "test suite" in b.argument]
    lines = readme.read_text(encoding="utf-8").splitlines()
    heading = next((i + 1 for i, line in enumerate(lines) if "The main job" in line), None)
    main = [b for b in found if heading is not None and b.line > heading and b.lang == "bash"]
    for what, hits in (("set-up (ci: setup)", setup), ("test command (ci: skip ... test suite)",
                       tests), ("main job (a bash block after 'The main job')", main)):  # fmt: skip
        if not hits:
            raise ValueError(f"README.md marks no {what}")
    return setup[0], main[0], tests[0]


def script() -> str:
    setup, main, test = readme_path()
    # each step's wall time is printed (the README quotes them), and the test command must leave
    # the environment's installed packages as it found them (issue 52: tests never install)
    return "\n".join([
        "set -euo pipefail",
        f"echo '### README.md:{setup.line} (set-up)'",
        "SECONDS=0",
        setup.code,
        "echo \"### set-up: ${SECONDS} s\"",
        "source .venv/bin/activate",
        f"echo '### README.md:{main.line} (the main job)'",
        "SECONDS=0",
        main.code,
        "echo \"### main job: ${SECONDS} s\"",
        f"echo '### README.md:{test.line} (the test command)'",
        "SECONDS=0",
        "frozen=$(mktemp) && python -m pip freeze > \"$frozen\"",
        test.code,
        "echo \"### test command: ${SECONDS} s\"",
        "python -m pip freeze > \"$frozen.after\"",
        "if ! diff -u \"$frozen\" \"$frozen.after\"; then",
        "    echo '### the test command changed the installed packages (above)' >&2; exit 1",
        "fi",
    ])  # fmt: skip


def main(argv: list[str]) -> int:
    text = script()
    if "--print" in argv:
        print(text)
        return 0
    return subprocess.run(["bash", "-c", text], cwd=ROOT, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
