"""The floors of the house (docs/architecture.md): every import of ``src/attnlab`` — at the top of
a module or inside a function, ``TYPE_CHECKING`` blocks included — goes to the module's own
package or to a lower floor, and no import cycle exists anywhere."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "attnlab"
DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"

# package -> floor; a package may import its own modules and lower floors only
FLOORS = {
    "attnlab.registry": 0, "attnlab.config": 0, "attnlab.io": 0,
    "attnlab.layers": 1,
    "attnlab.models": 2,
    "attnlab.transforms": 3.0, "attnlab.interop": 3.0, "attnlab.analysis": 3.0,
    "attnlab.tokenizers": 3.0, "attnlab.inspect": 3.0,
    "attnlab.pretrained": 3.1, "attnlab.generation": 3.1,
    "attnlab.sentence": 3.2,
    "attnlab.translation": 4.0,
    "attnlab.training": 4.1,
    "attnlab.viz": 5,
    "attnlab.explore": 5.5,
    "attnlab.cli": 6,
    "attnlab.__main__": 7, "attnlab": 7,
}  # fmt: skip


def modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        name = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The attnlab modules ``name`` imports (absolute and relative, anywhere in the file)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [base, *(f"{base}.{a.name}" for a in node.names)]
        found |= {t for t in targets if t in known and t != name}
    return found


def floor_of(module: str) -> tuple[str, float]:
    for prefix in sorted(FLOORS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return prefix, FLOORS[prefix]
    raise AssertionError(f"{module} is on no floor: add its package to FLOORS and the doc")


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports(m, p, set(mods)) for m, p in mods.items()}


def test_every_module_is_on_a_floor_and_imports_only_downward() -> None:
    wrong = []
    for module, targets in graph().items():
        package, floor = floor_of(module)
        for target in targets:
            other, level = floor_of(target)
            if other != package and level >= floor and target != "attnlab":
                wrong.append(f"{module} (floor {floor}) -> {target} (floor {level})")
    assert not wrong, "imports against the floors:\n" + "\n".join(sorted(wrong))


def test_models_and_layers_import_only_layers_config_and_registry() -> None:
    allowed = ("attnlab.layers", "attnlab.config", "attnlab.registry", "attnlab.models")
    for module, targets in graph().items():
        if module.startswith(("attnlab.layers", "attnlab.models")):
            bad = [t for t in targets if not t.startswith(allowed)]
            assert not bad, f"{module} imports {bad}"


def test_no_import_cycles() -> None:
    g = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in g:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_no_argparse_outside_the_cli() -> None:
    for module, path in modules().items():
        if not module.startswith("attnlab.cli"):
            text = path.read_text(encoding="utf-8")
            assert not re.search(r"^\s*import argparse|^\s*from argparse", text, re.M), module


def test_the_architecture_page_lists_every_package_and_floor() -> None:
    text = DOC.read_text(encoding="utf-8")
    for package in FLOORS:
        if package not in ("attnlab", "attnlab.__main__"):
            short = package.removeprefix("attnlab.")
            assert f"`{short}" in text, f"docs/architecture.md does not place {package}"
