"""``benchmarks/time_to_loss.py``'s bookkeeping (issue 51), on synthetic records: the time to a
target is interpolated between evaluations, a rerun replaces only its own session's record,
ablations compare within a session (never against another session's reference) with the right
verdicts, and the main table leaves the ablated recipes to the ablation table."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "time_to_loss.py"


@pytest.fixture(scope="module")
def ttl() -> Any:
    spec = importlib.util.spec_from_file_location("time_to_loss_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def record(recipe: str, seed: int, loss: float, session: str | None = "s1", **kw: Any) -> dict:
    r = {
        "recipe": recipe,
        "minutes": 5.0,
        "seed": seed,
        "steps": kw.get("steps", 1000),
        "final_val_loss": loss,
        "curve": kw.get("curve", [[10.0, 2.0], [20.0, 1.8], [30.0, loss]]),
        "command": "python benchmarks/time_to_loss.py (test)",
        "cpu": "test cpu, 2 cpus",
    }
    if session is not None:
        r["session"] = session
    return r


def test_time_to_interpolates_between_evaluations(ttl: Any) -> None:
    curve = [(10.0, 2.0), (20.0, 1.8), (30.0, 1.6)]
    assert ttl.time_to(curve, 1.7) == pytest.approx(25.0)
    assert ttl.time_to(curve, 2.5) == 10.0  # reached at the first evaluation
    assert ttl.time_to(curve, 1.5) is None  # never reached


def test_merge_replaces_only_the_same_session_recipe_budget_and_seed(ttl: Any) -> None:
    old = [record("speedrun", 0, 1.50, session=None), record("speedrun", 1, 1.49)]
    assert ttl.session_of(old[0]) == "2026-12-06"  # records from before sessions were kept
    merged = ttl.merge(old, record("speedrun", 0, 1.40, session="2026-12-06"))
    assert sorted(r["final_val_loss"] for r in merged) == [1.40, 1.49]
    merged = ttl.merge(merged, record("speedrun", 0, 1.45, session="s2"))
    assert len(merged) == 3  # another session's seed 0 is another record


def groups_of(ttl: Any, records: list[dict]) -> dict:
    groups: dict = {}
    for r in records:
        groups.setdefault((ttl.session_of(r), r["recipe"], r["minutes"]), []).append(r)
    return groups


def test_ablation_verdicts_compare_within_a_session(ttl: Any) -> None:
    full = [record("speedrun", s, x) for s, x in enumerate([1.50, 1.51, 1.49])]
    helps = [
        record("speedrun-without-a", s, x, steps=500) for s, x in enumerate([1.60, 1.61, 1.59])
    ]
    hurts = [record("speedrun-without-b", s, x) for s, x in enumerate([1.40, 1.41, 1.39])]
    noise = [record("speedrun-without-c", s, x) for s, x in enumerate([1.52, 1.48, 1.50])]
    # another session's ablation has no reference of its own: it gets no row
    orphan = [record("speedrun-without-d", s, 1.0, session="s2") for s in range(3)]
    rows = ttl.ablation_table(groups_of(ttl, full + helps + hurts + noise + orphan))
    body = {line.split(" | ")[0].strip("| "): line for line in rows if line.startswith("| ")}
    assert set(body) >= {"a", "b", "c"} and "d" not in body
    assert body["a"].rstrip(" |").endswith("helps") and "+0.1000" in body["a"]
    assert "| 0.50 |" in body["a"]  # half the reference's steps
    assert body["b"].rstrip(" |").endswith("hurts") and "-0.1000" in body["b"]
    assert body["c"].rstrip(" |").endswith("no clear effect")


def test_report_keeps_ablations_out_of_the_main_table(ttl: Any, tmp_path: Path) -> None:
    records = [record("modern", s, 1.55 + 0.01 * s) for s in range(3)]
    records += [record("speedrun", s, 1.49 + 0.01 * s) for s in range(3)]
    records += [record("speedrun-without-a", s, 1.53 + 0.01 * s) for s in range(3)]
    args = argparse.Namespace(targets="1.70,1.50", baseline="modern")
    text = ttl.report(records, args, tmp_path / "ttl")
    main, _, ablations = text.partition("## Ablations")
    assert "| s1 | speedrun | 5 | 3 |" in main and "| s1 | modern | 5 | 3 |" in main
    assert "without" not in main.split("| session |")[1]
    assert "| a | s1 | 5 | 3 / 3 |" in ablations
    assert (tmp_path / "ttl.md").read_text() == text
