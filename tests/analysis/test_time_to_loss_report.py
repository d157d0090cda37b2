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


def test_ablation_verdicts_compare_within_a_session(ttl: Any) -> None:
    full = [record("speedrun", s, x) for s, x in enumerate([1.50, 1.51, 1.49])]
    helps = [
        record("speedrun-without-a", s, x, steps=500) for s, x in enumerate([1.60, 1.61, 1.59])
    ]
    hurts = [record("speedrun-without-b", s, x) for s, x in enumerate([1.40, 1.41, 1.39])]
    noise = [record("speedrun-without-c", s, x) for s, x in enumerate([1.52, 1.48, 1.50])]
    # another session's ablation has no reference of its own: it gets no row
    orphan = [record("speedrun-without-d", s, 1.0, session="s2") for s in range(3)]
    rows = ttl.ablation_table(ttl.group_records(full + helps + hurts + noise + orphan))
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


def test_training_curve_takes_out_the_evaluations_seconds(ttl: Any) -> None:
    """Each evaluation's ``elapsed_s`` is the trainer's clock before it, which counts every
    earlier evaluation: those seconds come out, its own do not (it has not run yet)."""
    vals = [
        {"elapsed_s": 10.0, "loss": 2.0, "eval_s": 1.0},
        {"elapsed_s": 21.0, "loss": 1.8, "eval_s": 1.5},
        {"elapsed_s": 32.5, "loss": 1.6, "eval_s": 0.5},
    ]
    assert ttl.training_curve(vals) == [(10.0, 2.0), (20.0, 1.8), (30.0, 1.6)]
    assert ttl.training_curve([{"elapsed_s": 5.0, "loss": 2.0}]) == [(5.0, 2.0)]  # older logs


def test_training_time_table_compares_seconds_of_training(ttl: Any) -> None:
    def run(recipe: str, seed: int, curve: list[list[float]]) -> dict:
        r = record(recipe, seed, curve[-1][1])
        r.update(train_curve=curve, overrides={"eval_every": 50 if recipe == "modern" else 20})
        return r

    records = [run("modern", s, [[50.0, 1.9], [100.0 + 10 * s, 1.7]]) for s in range(3)]
    records += [run("speedrun", s, [[25.0, 1.9], [50.0 + 5 * s, 1.7]]) for s in range(3)]
    records.append(record("baby", 0, 1.8))  # no training curve (an older record): no row
    rows = ttl.training_time_table(ttl.group_records(records), [1.70, 1.50], "modern")
    body = {line.split(" | ")[1]: line for line in rows if line.startswith("| s1")}
    assert set(body) == {"modern", "speedrun"}
    assert "| 110.0 ± 10.0 (3/3) | - |" in body["modern"]
    assert "| 20 | 55.0 ± 5.0 (3/3), 0.50x | - |" in body["speedrun"]


def test_eval_every_in_seconds_follows_each_recipes_steady_step_rate(
    ttl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    probed: list[dict] = []

    def rate(overrides: dict) -> float:
        probed.append(overrides)
        return 10.0 if overrides.get("preset") == "speedrun" else 30.0

    monkeypatch.setattr(ttl, "probe_steps_per_s", rate)
    by_steps = argparse.Namespace(eval_every=250, eval_every_s=None)
    assert ttl.eval_every({"arch": "modern"}, by_steps) == 250 and not probed
    by_time = argparse.Namespace(eval_every=250, eval_every_s=5.0)
    assert ttl.eval_every({"arch": "modern"}, by_time) == 150
    warm = ttl.recipe_overrides("speedrun-seq-warmup")
    assert ttl.eval_every(warm, by_time) == 50
    assert probed[-1] == {"preset": "speedrun"}  # probed without its warmup: the steady rate
