"""CI runs README.md's set-up, main job and test command verbatim, in that order
(.ci/readme_path.py); the README must keep marking the three."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ci_reads_the_three_commands_from_the_readme_in_order() -> None:
    spec = importlib.util.spec_from_file_location("readme_path", ROOT / ".ci" / "readme_path.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = module.script()
    setup = text.index('pip install -e ".[all]"')
    main = text.index("attnlab train reverse\n")
    test = text.index("python -m pytest")
    assert setup < text.index("source .venv/bin/activate") < main < test
    assert "bash .ci/run" not in text and "--steps" not in text[main : text.index("\n", main)]
    assert "python3 .ci/readme_path.py" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
