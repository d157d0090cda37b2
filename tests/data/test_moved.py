"""The data sets moved from ``attnlab.training`` to ``attnlab.data`` (issue 48): every old path
still gives the same object for one release, with a ``DeprecationWarning`` that names the new
path and points at the line that used the old one; the library itself never uses an old path."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "attnlab"

# old module -> {old name: "new.module" or "new.module:new name"}
MOVED: dict[str, dict[str, str]] = {
    "attnlab.training.data": {
        **dict.fromkeys(
            ["TINY_SHAKESPEARE", "TINY_SHAKESPEARE_SHA256", "TINY_SHAKESPEARE_URL",
             "TokenStream", "load_text"],
            "attnlab.data.text",
        ),
        **dict.fromkeys(["ArrayImageDataset", "load_digits"], "attnlab.data.images"),
        **dict.fromkeys(["Split", "data_dir"], "attnlab.data.common"),
        "shard_batch": "attnlab.data.batches",
        **dict.fromkeys(["data_dirs", "find_data_file"], "attnlab.io"),
    },
    "attnlab.training.cifar10": dict.fromkeys(
        ["CLASSES", "FILES", "JPEG_COPY", "JPEG_COPY_SHA256", "MANIFEST", "MEAN", "ORIGINAL",
         "STD", "SUBDIR", "Cifar10", "Cifar10Arrays", "candidate_dirs", "find_cifar10",
         "load_cifar10", "read_manifest", "sha256_file", "stratified_split", "verify_cifar10"],
        "attnlab.data.cifar10",
    ),
    "attnlab.training.cifar10_download": dict.fromkeys(
        ["ARCHIVE", "ARCHIVE_MD5", "ARCHIVE_SHA256", "BATCH_SIZE", "FILES", "MANIFEST",
         "TEST_BATCH", "TRAIN_BATCHES", "URL", "RestrictedUnpickler", "convert_archive",
         "download_cifar10", "fetch", "read_batch", "sha256_file"],
        "attnlab.data.cifar10_download",
    ),
    "attnlab.training.augment": dict.fromkeys(
        ["RAND_AUGMENT_OPS", "AugmentConfig", "MixedBatch", "PadMode", "augment_batch",
         "crop_flip", "crop_flip_params", "mix_batch", "rand_augment", "random_crop_flip"],
        "attnlab.data.augment",
    ),
    "attnlab.training.tasks": {
        "ReverseTask": "attnlab.data.reverse",
        "Split": "attnlab.data.reverse:ReverseSplit",
        "Seq2SeqBatch": "attnlab.data.batches",
    },
    "attnlab.training.recall": dict.fromkeys(["QUERY", "RecallTask"], "attnlab.data.recall"),
    "attnlab.training": {
        **dict.fromkeys(["ArrayImageDataset", "load_digits"], "attnlab.data.images"),
        **dict.fromkeys(["TokenStream", "load_text"], "attnlab.data.text"),
        "ReverseTask": "attnlab.data.reverse",
        "find_data_file": "attnlab.io",
    },
}  # fmt: skip
SHIMS = [m for m in MOVED if m not in ("attnlab.training", "attnlab.training.recall")]
CASES = [(old, name, new) for old, table in MOVED.items() for name, new in table.items()]


@pytest.mark.parametrize(("old", "name", "new"), CASES, ids=[f"{o}.{n}" for o, n, _ in CASES])
def test_each_old_path_gives_the_same_object_with_a_deprecation_warning(
    old: str, name: str, new: str
) -> None:
    new_module, _, new_name = new.partition(":")
    new_name = new_name or name
    expected = getattr(importlib.import_module(new_module), new_name)
    module = importlib.import_module(old)  # importing the old module itself is silent
    with pytest.warns(DeprecationWarning, match=rf"moved to {new_module}\.{new_name}\b") as got:
        found = getattr(module, name)
    assert found is expected
    assert len(got) == 1 and got[0].filename == __file__  # stacklevel: the line using the path
    assert f"{old}.{name}" in str(got[0].message)


def test_from_imports_of_the_old_paths_still_work() -> None:
    namespace: dict[str, object] = {}
    with pytest.warns(DeprecationWarning, match="attnlab.data.text.TokenStream"):
        exec("from attnlab.training.data import TokenStream", namespace)
    with pytest.warns(DeprecationWarning, match="attnlab.data.reverse.ReverseTask"):
        exec("from attnlab.training import ReverseTask", namespace)
    from attnlab.data import ReverseTask, TokenStream

    assert namespace["TokenStream"] is TokenStream and namespace["ReverseTask"] is ReverseTask


def test_the_tables_cover_what_the_shims_resolve() -> None:
    for old, table in MOVED.items():
        shim = importlib.import_module(old)
        resolves = {
            name: f"{new[0].__name__}:{new[1]}" if isinstance(new, tuple) else new.__name__
            for name, new in shim._MOVED.items()
        }
        assert table == resolves, old


def test_unknown_names_and_what_stays_raise_no_warning() -> None:
    import attnlab.data
    import attnlab.training
    import attnlab.training.data
    import attnlab.training.objectives
    import attnlab.training.recall

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert not hasattr(attnlab.training.data, "no_such_name")
        assert not hasattr(attnlab.training, "no_such_name")
        # a plain data container that moved down: re-exported by the objectives, no warning
        assert attnlab.training.Seq2SeqBatch is attnlab.data.Seq2SeqBatch
        assert attnlab.training.objectives.Seq2SeqBatch is attnlab.data.Seq2SeqBatch
        assert attnlab.training.recall.RecallObjective is not None  # the objective stays
    for name in ("TokenStream", "ReverseTask", "load_text"):
        assert name not in attnlab.training.__all__


IMPORT_ALL = r"""
import importlib, pkgutil, warnings
# every DeprecationWarning raised at a line of attnlab fails; others' (torch ...) only show
warnings.simplefilter("error", DeprecationWarning)
warnings.filterwarnings("default", category=DeprecationWarning, module=r"(?!attnlab)")
import attnlab
names = [m.name for m in pkgutil.walk_packages(attnlab.__path__, "attnlab.")]
for name in names:
    if name != "attnlab.__main__":
        importlib.import_module(name)
print(len(names))
"""


def test_importing_every_attnlab_module_fires_no_deprecation_warning() -> None:
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) > 100  # it did walk the whole package


def test_the_library_never_imports_an_old_path() -> None:
    """Static: no module of ``src/attnlab`` imports a shim or a moved name from its old home
    (a lazy import inside a function included), so no user sees the warning because of us."""
    shims = set(SHIMS)
    children = {m.rpartition(".")[2] for m in shims}  # from attnlab.training import data
    wrong = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent)
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        if module in shims:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                wrong += [f"{rel}:{node.lineno}" for a in node.names if a.name in shims]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                old = set(MOVED.get(node.module, {}))
                if node.module == "attnlab.training":
                    old |= children
                if node.module in shims or {a.name for a in node.names} & old:
                    wrong.append(f"{rel}:{node.lineno}")
    assert not wrong, f"old import paths used by the library: {wrong}"
