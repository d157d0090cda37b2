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
    "attnlab.registry": 0, "attnlab.config": 0, "attnlab.io": 0, "attnlab.integrity": 0,
    "attnlab.progress": 0, "attnlab.allocator": 0,
    "attnlab.kernels": 0,
    "attnlab.layers": 1, "attnlab.data": 1,
    "attnlab.models": 2,
    "attnlab.transforms": 3.0, "attnlab.interop": 3.0, "attnlab.analysis": 3.0,
    "attnlab.tokenizers": 3.0, "attnlab.inspect": 3.0,
    "attnlab.pretrained": 3.1, "attnlab.generation": 3.1,
    "attnlab.sentence": 3.2,
    "attnlab.translation": 4.0,
    "attnlab.training": 4.1,
    "attnlab.viz": 5.0,
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


def doc_floors() -> dict[str, float]:
    """The floors of docs/architecture.md's table: package -> floor, from each row's first two
    cells (``| 3.1 | `pretrained` | ...``; ``attnlab`` is the top-level package)."""
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index("| floor | package |") : text.index("\n\n", text.index("| floor |"))]
    found: dict[str, float] = {}
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        for name in re.findall(r"`([\w.]+)/?`", cells[1]):
            package = "attnlab" if name == "attnlab" else f"attnlab.{name}"
            assert package not in found, f"docs/architecture.md places {package} twice"
            found[package] = float(cells[0])
    return found


def test_the_architecture_page_states_exactly_these_floors() -> None:
    """The page's table and FLOORS agree package for package and floor for floor, and every
    package on a floor exists: neither can drift from the other or from the code."""
    assert doc_floors() == {k: float(v) for k, v in FLOORS.items()}
    mods = set(modules())
    missing = [p for p in FLOORS if p not in mods and not any(m.startswith(p + ".") for m in mods)]
    assert not missing, f"floors name packages that do not exist: {missing}"


# -- the family contract: the upper floors do not know families by class or name --------------

# the family classes: every class defined in a family's model file
FAMILY_MODULES = ("bert", "cct", "cnn", "gpt", "mamba", "resnet", "rnn", "rnn_seq2seq",
                  "transformer", "vit")  # fmt: skip
FAMILY_NAMES = {
    "gpt", "bert", "vit", "cnn", "cct", "resnet", "mamba", "rnn", "transformer", "seq2seq",
    "llama", "gpt2", "marian", "bloom", "mixtral", "qwen2_moe", "lstm", "gru", "rnn_seq2seq",
}  # fmt: skip
# (file, line text) of each justified exception, with why; at most 6 of each kind (issue 48)
ALLOWED_ISINSTANCE: dict[str, str] = {}
ALLOWED_NAME_COMPARISONS: dict[str, str] = {}


def _family_classes() -> set[str]:
    names: set[str] = set()
    for module in FAMILY_MODULES:
        tree = ast.parse((SRC / "models" / f"{module}.py").read_text(encoding="utf-8"))
        names |= {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    return names


def family_branches() -> tuple[list[str], list[str]]:
    """``isinstance`` checks on family classes, and comparisons of a string with a family name,
    outside ``models/`` and ``interop/`` (which may know families): ``"path:line"`` each."""
    classes = _family_classes()
    checks: list[str] = []
    comparisons: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if rel.parts[0] in ("models", "interop"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
                used = {getattr(n, "attr", getattr(n, "id", None)) for n in ast.walk(node.args[1])}
                if used & classes:
                    checks.append(f"{rel}:{node.lineno}")
            elif isinstance(node, ast.Compare) and any(
                isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops
            ):
                values = {
                    n.value
                    for side in (node.left, *node.comparators)
                    for n in ast.walk(side)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)
                }
                if values & FAMILY_NAMES:
                    comparisons.append(f"{rel}:{node.lineno}")
    return checks, comparisons


def test_upper_floors_dispatch_on_the_family_declaration() -> None:
    """Outside models/ and interop/, no floor tests a concrete family class or compares a
    family's name: it looks the declaration up (docs/architecture.md, "A model family")."""
    checks, comparisons = family_branches()
    assert len(ALLOWED_ISINSTANCE) <= 6 and len(ALLOWED_NAME_COMPARISONS) <= 6
    assert sorted(checks) == sorted(ALLOWED_ISINSTANCE), checks
    assert sorted(comparisons) == sorted(ALLOWED_NAME_COMPARISONS), comparisons


def test_the_family_counter_sees_what_it_counts(tmp_path: Path) -> None:
    """The counter itself: a branch on a family class and one on a family name are found."""
    assert {"GPT", "GPTConfig", "EncoderDecoderTransformer", "ViTConfig"} <= _family_classes()
    source = "def f(m, c):\n    return isinstance(m, GPT) or c.model_type == 'bert'\n"
    tree = ast.parse(source)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert calls and {"GPT"} & {getattr(n, "id", None) for n in ast.walk(calls[0].args[1])}
    compares = [n for n in ast.walk(tree) if isinstance(n, ast.Compare)]
    assert compares[0].comparators[0].value in FAMILY_NAMES  # type: ignore[attr-defined]
