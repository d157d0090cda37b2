"""Time to loss (issue 51): train char-level Tiny Shakespeare recipes for a wall-clock budget,
several seeds each, and tabulate validation loss against seconds.

    python benchmarks/time_to_loss.py --recipes modern,speedrun --minutes 5 --seeds 0,1,2
    python benchmarks/time_to_loss.py --ablate speedrun --minutes 5 --seeds 0,1,2
    python benchmarks/time_to_loss.py --recipes speedrun --minutes 15 --seeds 0,1,2
    python benchmarks/time_to_loss.py --nanogpt /path/to/nanoGPT --minutes 5 --seeds 0,1,2
    python benchmarks/time_to_loss.py --report            # tables and curves from the JSON

Every run is ``attnlab train shakespeare-char`` (through :func:`train_recipe`) with
``max_minutes`` as its budget: the trainer's clock, which counts training and the periodic
evaluations (the same cadence for every recipe: ``--eval-every`` steps, or with
``--eval-every-s S`` every S seconds of each recipe's own steady step rate; ``--eval-batches``
batches of the validation split, the last 10% of the text; nothing is tuned on a test split).
Each record keeps two curves: ``curve`` against the trainer's clock and ``train_curve``
against training seconds alone (each evaluation's logged ``eval_s`` taken out), from which the
report's "time to target, evaluations excluded" table is made.
Cosine and WSD schedules run on the time clock (``schedule_clock="time"``) so that each run
ends decayed whatever its step rate (other schedules take their step count from a measured step
rate: ``--steps-per-s``, or a 20-second probe).

For each recipe: the validation loss at the end of the budget (mean, sample standard deviation,
min/max over seeds), the seconds to reach each ``--targets`` loss (linearly interpolated between
evaluations; "-" when a seed never got there), and Welch's t-test of the final losses against
``--baseline`` (one-sided: lower). ``--ablate R`` runs R with each of its techniques removed in
turn (:data:`ABLATIONS`). ``--nanogpt DIR`` runs nanoGPT's own ``train.py`` (Karpathy's
README's CPU "baby GPT" command) from a copy of DIR, its ``max_iters`` scaled to the budget by a
30-iteration probe; its training seconds are the sum of its per-iteration times with the
evaluation iterations' times replaced by the median (its log gives no eval time). nanoGPT has
no seed option (it seeds with 1337): seed s runs a copy whose seed is 1337 + s.

Run it alone on the machine: two processes on 2 cores make every number noise. Results append
to ``benchmarks/results/time_to_loss.json`` (``--out``; one record per run, replaced when the
same session, recipe, budget and seed run again); ``time_to_loss.md`` and ``time_to_loss.png``
are regenerated. Records carry their ``--session`` (default: the UTC date) and the CPU, and are
compared only within a session: hosts differ between sessions, so a comparison that does not fit
in one session (the ablations take 2.5 hours) is split, each part with its own reference runs,
e.g. ``--ablate speedrun --techniques muon,wsd,rope`` (the full recipe runs too). The ablation
table sets each ``R-without-T`` against ``R`` of its session; the main table leaves them out.
``--nanogpt`` runs take their turn in each seed's round with the rest.
Data: ``$ATTNLAB_DATA`` or ``../shared/data`` (``tinyshakespeare.txt``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
RUNS = RESULTS / "runs" / "time_to_loss"

# recipe name -> overrides of the shakespeare-char recipe (the speedrun preset is the library's)
RECIPES: dict[str, dict[str, Any]] = {
    "baby": {},  # nanoGPT's baby GPT in attnlab (learned positions, GELU, LayerNorm)
    "modern": {"arch": "modern"},  # RoPE, SwiGLU, RMSNorm: today's best attention recipe
    "speedrun": {"preset": "speedrun"},
    # modern in bf16-mixed: what the preset's bfloat16 alone would give the baseline
    "modern-bf16": {"arch": "modern", "precision": "bf16-mixed"},
    # the preset with a batch-size warmup: 4 -> 12 rows over the first 300 updates
    "speedrun-batch-warmup": {
        "preset": "speedrun",
        "batch_warmup": 300,
        "batch_warmup_start": 4,
        "batch_warmup_multiple": 2,
    },
    # 15-minute candidates (the preset overfits where 15 minutes buy ~10,000 steps): the preset
    # with dropout 0.1 (no help on an AVX2-only host, docs/time_to_loss.md), and a wider, deeper
    # model (6 layers, 192 wide, 2.7M parameters) with dropout 0.1 (too few steps there)
    "speedrun-dropout": {"preset": "speedrun", "dropout": 0.1},
    "speedrun-wide-dropout": {
        "preset": "speedrun",
        "d_model": 192,
        "n_heads": 6,
        "n_layers": 6,
        "d_ff": 768,
        "dropout": 0.1,
    },
    # 15-minute candidate: the preset on nanoGPT's shakespeare-char context (256 positions),
    # with the same characters per step (6 rows of 256 rather than 12 of 128)
    "speedrun-context-256": {"preset": "speedrun", "max_seq_len": 256, "batch_size": 6},
    # 15-minute candidate: the preset 6 layers deep (1.2M parameters), since 13% more steps of
    # the preset itself barely moved its 15-minute loss on the AVX2-only host
    "speedrun-deep": {"preset": "speedrun", "n_layers": 6},
    # the preset with a sequence-length warmup: 32 -> 128 positions over the first 200 updates
    # (the best of a one-seed screen of 200/500-update sequence and batch warmups)
    "speedrun-seq-warmup": {
        "preset": "speedrun",
        "seq_warmup": 200,
        "seq_warmup_start": 32,
        "seq_warmup_multiple": 16,
    },
}
# recipe -> technique -> the overrides that remove it (the rest of the recipe unchanged)
ABLATIONS: dict[str, dict[str, dict[str, Any]]] = {
    "speedrun": {},  # filled from the preset's own list (attnlab.training.recipes.text)
}


def data_file() -> Path:
    base = Path(os.environ.get("ATTNLAB_DATA", ROOT.parent.parent / "shared" / "data"))
    path = base / "tinyshakespeare.txt"
    if not path.is_file():
        sys.exit(f"time_to_loss: no {path} (set ATTNLAB_DATA to the folder holding it)")
    return path


def recipe_overrides(name: str) -> dict[str, Any]:
    """The overrides of recipe ``name``, or of an ablation ``recipe-without-technique``."""
    if name in RECIPES:
        return dict(RECIPES[name])
    base, _, technique = name.partition("-without-")
    ablations = ablations_of(base)
    if technique not in ablations:
        raise SystemExit(f"unknown recipe {name!r}: have {sorted(RECIPES)} and their ablations")
    return {**RECIPES[base], **ablations[technique]}


def ablations_of(recipe: str) -> dict[str, dict[str, Any]]:
    if recipe == "speedrun":
        from attnlab.training.recipes.text import SPEEDRUN_ABLATIONS

        return dict(SPEEDRUN_ABLATIONS)
    return ABLATIONS.get(recipe, {})


def timed_overrides(
    overrides: dict[str, Any], minutes: float, seed: int, args: argparse.Namespace
) -> dict[str, Any]:
    """The run's overrides: the budget, the evaluation cadence, the seed, and a schedule that
    ends decayed at the budget."""
    from attnlab.training.recipes import get_recipe
    from attnlab.training.recipes.text import SPEEDRUN_TRAIN

    preset = SPEEDRUN_TRAIN if overrides.get("preset") == "speedrun" else {}
    default = get_recipe("shakespeare-char").train.schedule
    schedule = overrides.get("schedule", preset.get("schedule", default))
    out: dict[str, Any] = {
        **overrides,
        "data": str(data_file()),
        "max_minutes": minutes,
        "seed": seed,
        "eval_every": eval_every(overrides, args),
        "eval_batches": args.eval_batches,
        "checkpoint_every": 0,
        "progress": False,
        "log_every": 50,
    }
    if schedule in ("cosine", "wsd"):
        out.update(steps=10**7, schedule_clock="time")
    else:  # other schedules count steps: set them from the step rate
        rate = args.steps_per_s or probe_steps_per_s(overrides)
        out["steps"] = max(10, int(rate * 60 * minutes))
    return out


def eval_every(overrides: dict[str, Any], args: argparse.Namespace) -> int:
    """Steps between evaluations: ``--eval-every``, or with ``--eval-every-s`` the recipe's
    measured step rate times those seconds, so that recipes of different step rates are
    evaluated at one cadence in seconds."""
    if args.eval_every_s is None:
        return int(args.eval_every)
    steady = {
        k: v for k, v in overrides.items() if not k.startswith(("seq_warmup", "batch_warmup"))
    }
    return max(1, round(probe_steps_per_s(steady) * args.eval_every_s))  # the rate after warmups


_PROBED: dict[str, float] = {}


def probe_steps_per_s(overrides: dict[str, Any]) -> float:
    """Steps per second of a recipe, measured over a 20-second run (the first 10 steps apart)."""
    from attnlab.training.recipes import train_recipe

    key = json.dumps(overrides, sort_keys=True)
    if key not in _PROBED:
        with tempfile.TemporaryDirectory() as tmp:
            probe = {**overrides, "data": str(data_file()), "steps": 10**7, "max_minutes": 1 / 3,
                     "schedule": "constant", "warmup": 0, "progress": False, "log_every": 10,
                     "eval_every": 0, "checkpoint_every": 0}  # fmt: skip
            train_recipe("shakespeare-char", Path(tmp) / "probe", probe)
            rows = [r for r in read_metrics(Path(tmp) / "probe") if r["split"] == "train"]
            first, last = rows[0], rows[-1]
            _PROBED[key] = (last["step"] - first["step"]) / (last["elapsed_s"] - first["elapsed_s"])
    return _PROBED[key]


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    text = (run_dir / "metrics.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def run_attnlab(name: str, minutes: float, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    from attnlab.training.recipes import train_recipe

    overrides = timed_overrides(recipe_overrides(name), minutes, seed, args)
    run_dir = RUNS / f"{name}-{minutes:g}min-seed{seed}"
    start = time.perf_counter()
    prepared, result = train_recipe("shakespeare-char", run_dir, overrides, overwrite=True)
    wall = time.perf_counter() - start
    vals = [r for r in read_metrics(run_dir) if r["split"] == "val"]
    curve = [(r["elapsed_s"], r["loss"]) for r in vals]
    curve.append((result.elapsed_s, result.evals[-1]["val_loss"]))  # the final evaluation
    return {
        "recipe": name,
        "minutes": minutes,
        "seed": seed,
        "overrides": {k: v for k, v in overrides.items() if k != "data"},
        "parameters": sum(p.numel() for p in prepared.model.parameters()),
        "precision": prepared.train.precision,  # the preset's depends on the host (bf16)
        "steps": result.step,
        "train_s": round(result.elapsed_s, 1),
        "wall_s": round(wall, 1),
        "final_val_loss": round(result.evals[-1]["val_loss"], 4),
        "curve": sorted({(round(t, 2), round(v, 4)) for t, v in curve}),
        "train_curve": training_curve(vals),
    }


def training_curve(vals: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(training seconds, val loss) of a run's evaluation records: each record's
    ``elapsed_s`` less the seconds of the evaluations before it (``eval_s``), so that the time
    to a target does not depend on how often the run was evaluated."""
    out, spent = [], 0.0
    for r in vals:
        out.append((round(r["elapsed_s"] - spent, 2), round(r["loss"], 4)))
        spent += r.get("eval_s", 0.0)
    return out


NANOGPT_ARGS = [
    "--device=cpu", "--compile=False", "--eval_iters=20", "--log_interval=1", "--block_size=64",
    "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128", "--dropout=0.0",
    "--always_save_checkpoint=False", "--eval_interval=250",
]  # fmt: skip
_ITER = re.compile(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms")
_EVAL = re.compile(r"^step (\d+): train loss [\d.]+, val loss ([\d.]+)")


def run_nanogpt(source: Path, minutes: float, seed: int) -> dict[str, Any]:
    """nanoGPT's own train.py, baby CPU config, ``max_iters`` scaled to ``minutes``."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "nanoGPT"
        shutil.copytree(source, work, ignore=shutil.ignore_patterns(".git", "out*"))
        write_nanogpt_data(work / "data" / "shakespeare_char")
        # nanoGPT seeds torch with 1337 + rank and has no seed option: the copy's seed moves
        script = (work / "train.py").read_text()
        if "torch.manual_seed(1337 + seed_offset)" not in script:
            raise SystemExit("nanoGPT's train.py changed: no torch.manual_seed(1337 + seed_offset)")
        script = script.replace("1337 + seed_offset", f"{1337 + seed} + seed_offset")
        (work / "train.py").write_text(script)
        config = ["config/train_shakespeare_char.py", *NANOGPT_ARGS]
        probe = _nanogpt(
            work, [*config, "--max_iters=30", "--lr_decay_iters=30", "--warmup_iters=3"]
        )
        ms = statistics.median(t for i, t, _ in probe["iters"] if i > 0)
        # a multiple of the eval interval: nanoGPT evaluates only at iter % 250 == 0 (the end too)
        iters = max(250, round(60_000 * minutes / ms / 250) * 250)
        config += [f"--max_iters={iters}", f"--lr_decay_iters={iters}",
                   f"--warmup_iters={min(100, iters // 10)}"]  # fmt: skip
        out = _nanogpt(work, config)
    times = {i: t for i, t, _ in out["iters"]}
    median = statistics.median(times.values())
    evals = out["evals"]
    train_ms, curve = 0.0, []
    for i in sorted(times):  # iteration i's time; eval iterations (i % 250 == 0) -> the median
        train_ms += median if i in evals else times[i]
        if i in evals:
            curve.append((round(train_ms / 1000, 2), evals[i]))
    return {
        "recipe": "nanogpt",
        "minutes": minutes,
        "seed": seed,
        "overrides": {
            "seed": f"torch.manual_seed({1337 + seed})",
            "command": "python train.py " + " ".join(config),
        },
        "parameters": None,
        "steps": iters,
        "train_s": round(train_ms / 1000, 1),
        "wall_s": round(out["wall_s"], 1),
        "final_val_loss": curve[-1][1],
        "curve": curve,
    }


def write_nanogpt_data(folder: Path) -> None:
    """nanoGPT's shakespeare_char files (train.bin, val.bin: uint16 character ids of the first
    90% and the last 10%; meta.pkl: the vocabulary), made here from the local text, in the
    format its train.py reads (its prepare.py would download the text and needs requests)."""
    import pickle

    import numpy as np

    text = data_file().read_text()
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    ids = np.array([stoi[ch] for ch in text], dtype=np.uint16)
    n = int(len(ids) * 0.9)
    ids[:n].tofile(folder / "train.bin")
    ids[n:].tofile(folder / "val.bin")
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump(meta, f)


def _nanogpt(work: Path, argv: list[str]) -> dict[str, Any]:
    from attnlab.allocator import GLIBC_TUNABLES

    start = time.perf_counter()
    # with the allocator setting attnlab's trainer makes on the CPU (retain_cpu_memory): set
    # before the process starts, where glibc reads it, so both sides page-fault alike
    env = {**os.environ, "GLIBC_TUNABLES": GLIBC_TUNABLES}
    done = subprocess.run([sys.executable, "train.py", *argv], cwd=work, capture_output=True,
                          text=True, check=False, env=env)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"nanoGPT failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    iters, evals = [], {}
    for line in done.stdout.splitlines():
        if m := _ITER.match(line):
            iters.append((int(m[1]), float(m[2]), line))
        elif m := _EVAL.match(line):
            evals[int(m[1])] = float(m[2])
    return {"iters": iters, "evals": evals, "wall_s": time.perf_counter() - start}


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    """Seconds at which the validation loss first reaches ``target`` (linear between evals)."""
    previous: tuple[float, float] | None = None
    for t, loss in curve:
        if loss <= target:
            if previous is None or previous[1] == loss:
                return t
            (t0, l0) = previous
            return t0 + (t - t0) * (l0 - target) / (l0 - loss)
        previous = (t, loss)
    return None


def load(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text()) if path.is_file() else []


def save(records: list[dict[str, Any]], path: Path) -> None:
    path.write_text(json.dumps(records, indent=1) + "\n")


def session_of(record: dict[str, Any]) -> str:
    """The measuring session a record belongs to (records before sessions were kept: the
    first one's, 2026-12-06)."""
    return str(record.get("session", "2026-12-06"))


def record_key(r: dict[str, Any]) -> tuple[str, str, float, int]:
    return (session_of(r), r["recipe"], r["minutes"], r["seed"])


Groups = dict[tuple[str, str, float], list[dict[str, Any]]]  # (session, recipe, minutes) -> runs


def group_records(records: list[dict[str, Any]]) -> Groups:
    """The records by (session, recipe, budget in minutes): the unit every table compares."""
    groups: Groups = {}
    for r in records:
        groups.setdefault((session_of(r), r["recipe"], r["minutes"]), []).append(r)
    return groups


def is_ablation(recipe: str) -> bool:
    """Whether ``recipe`` is a recipe less one technique (``R-without-T``): it belongs in the
    ablation table, not in the main table, the time-to-target table or the plot."""
    return "-without-" in recipe


def merge(records: list[dict[str, Any]], new: dict[str, Any]) -> list[dict[str, Any]]:
    """``records`` with ``new`` added, replacing a record of the same session, recipe, budget
    and seed."""
    kept = [r for r in records if record_key(r) != record_key(new)]
    return [*kept, new]


def ablation_table(
    groups: Groups,
) -> list[str]:
    """Each ``R-without-T`` group against ``R`` of the same session and budget: the change of
    the final loss when T is taken out (positive: T helps), its spread, and Welch's one-sided
    p that the recipe without T ends higher."""
    from attnlab.analysis.stats import summarize, welch_t_test

    rows = []
    for (session, recipe, minutes), runs in sorted(groups.items()):
        base, _, technique = recipe.partition("-without-")
        full = groups.get((session, base, minutes))
        if not technique or not full:
            continue
        without = [r["final_val_loss"] for r in runs]
        reference = [r["final_val_loss"] for r in full]
        delta = summarize(without).mean - summarize(reference).mean
        p = welch_t_test(reference, without).p_less if len(runs) >= 2 <= len(full) else None
        verdict = "-"
        if p is not None:
            verdict = "helps" if p < 0.05 else ("hurts" if 1 - p < 0.05 else "no clear effect")
        steps = statistics.mean(r["steps"] for r in runs) / statistics.mean(
            r["steps"] for r in full
        )
        rows.append(
            f"| {technique} | {session} | {minutes:g} | {len(runs)} / {len(full)} | "
            f"{summarize(without).mean:.4f} ± {summarize(without).std:.4f} | "
            f"{summarize(reference).mean:.4f} ± {summarize(reference).std:.4f} | {delta:+.4f} | "
            f"{steps:.2f} | {'-' if p is None else f'{p:.3g}'} | {verdict} |"
        )
    if not rows:
        return []
    return [
        "",
        "## Ablations",
        "",
        "Each technique taken out of its recipe alone, against the full recipe measured in the "
        "same session (hosts differ between sessions). Δ = loss without − loss with: positive "
        "means the technique helps at this budget. p: Welch's one-sided t-test that the full "
        'recipe ends lower; "hurts" when the recipe without it is lower at p < 0.05. Steps: '
        "the ablated run's steps relative to the full recipe's in the same time.",
        "",
        "| technique taken out | session | budget min | seeds (without / with) | val loss "
        "without | val loss with | Δ | steps ratio | p | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]


def training_time_table(
    groups: Groups,
    targets: list[float],
    baseline: str,
) -> list[str]:
    """Seconds of training (evaluations excluded) to each target, for the groups whose runs
    logged their evaluations' seconds, with the ratio to ``baseline``'s of the same session
    and budget."""
    from attnlab.analysis.stats import summarize

    def times(runs: list[dict[str, Any]], target: float) -> list[float]:
        got = [time_to([tuple(p) for p in r["train_curve"]], target) for r in runs]
        return [x for x in got if x is not None]

    rows = []
    for (session, recipe, minutes), runs in sorted(groups.items()):
        if is_ablation(recipe) or not all("train_curve" in r for r in runs):
            continue
        every = sorted({r["overrides"].get("eval_every") for r in runs})
        cells = []
        base = groups.get((session, baseline, minutes), [])
        for target in targets:
            got = times(runs, target)
            if not got:
                cells.append("-")
                continue
            s = summarize(got) if len(got) > 1 else None
            cell = f"{statistics.mean(got):.1f}" + (f" ± {s.std:.1f}" if s else "")
            cell += f" ({len(got)}/{len(runs)})"
            ref = times(base, target) if all("train_curve" in r for r in base) else []
            if ref and recipe != baseline:
                cell += f", {statistics.mean(got) / statistics.mean(ref):.2f}x"
            cells.append(cell)
        rows.append(
            f"| {session} | {recipe} | {minutes:g} | {len(runs)} | "
            f"{', '.join(str(e) for e in every)} |" + "".join(f" {c} |" for c in cells)
        )
    if not rows:
        return []
    header = "| session | recipe | budget min | seeds | eval every (steps) |"
    header += "".join(f" training s to {t:g} |" for t in targets)
    return [
        "",
        "## Time to target, evaluations excluded",
        "",
        "Seconds of training alone (each evaluation's own seconds taken out of the clock) until "
        "the validation loss first reaches the target, linear between evaluations; mean ± "
        f"sample std (seeds that got there), and the ratio to `{baseline}`'s mean. Runs made "
        "with `--eval-every-s` are evaluated at one cadence in seconds whatever their step rate.",
        "",
        header,
        "|" + "---|" * (header.count("|") - 1),
        *rows,
    ]


def report(records: list[dict[str, Any]], args: argparse.Namespace, out: Path) -> str:
    from attnlab.analysis.stats import summarize, welch_t_test

    targets = [float(t) for t in args.targets.split(",")]
    lines = [
        "# Time to loss: char-level Tiny Shakespeare (issue 51)",
        "",
        "Written by `benchmarks/time_to_loss.py` (its docstring says how each figure is made). "
        "Validation loss on the last 10% of the text; the budget is the trainer's clock "
        "(training and the periodic evaluations). Mean ± sample std over seeds; p: Welch's "
        f"one-sided t-test that the recipe's final loss is lower than `{args.baseline}`'s at the "
        "same budget.",
        "",
    ]
    sessions: dict[str, set[str]] = {}
    for r in records:
        sessions.setdefault(session_of(r), set()).add(r.get("cpu") or r.get("machine", "?"))
    lines += [f"Session {k}: {', '.join(sorted(v))}." for k, v in sorted(sessions.items())]
    lines += [""]
    header = "| session | recipe | budget min | seeds | steps | val loss at budget | min / max |"
    header += "".join(f" s to {t:g} |" for t in targets) + " p vs baseline |"
    lines += [header, "|" + "---|" * (header.count("|") - 1)]
    groups = group_records(records)
    order = sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1]))
    for (session, recipe, minutes), runs in order:
        if is_ablation(recipe):  # in the ablation table
            continue
        finals = [r["final_val_loss"] for r in runs]
        s = summarize(finals)
        cells = []
        for target in targets:
            reached = [time_to([tuple(p) for p in r["curve"]], target) for r in runs]
            got = [x for x in reached if x is not None]
            cells.append(f"{statistics.mean(got):.0f} ({len(got)}/{len(runs)})" if got else "-")
        base = groups.get((session, args.baseline, minutes))
        p = "-"
        if base and recipe != args.baseline and len(base) >= 2 and len(runs) >= 2:
            p = f"{welch_t_test(finals, [b['final_val_loss'] for b in base]).p_less:.3g}"
        steps = statistics.mean(r["steps"] for r in runs)
        lines.append(
            f"| {session} | {recipe} | {minutes:g} | {len(runs)} | {steps:.0f} | "
            f"{s.mean:.4f} ± {s.std:.4f} | "
            f"{s.low:.4f} / {s.high:.4f} |" + "".join(f" {c} |" for c in cells) + f" {p} |"
        )
    lines += training_time_table(groups, targets, args.baseline)
    lines += ablation_table(groups)
    lines += ["", "Commands: " + ", ".join(sorted({f"`{r['command']}`" for r in records}))]
    text = "\n".join(lines) + "\n"
    (out.with_suffix(".md")).write_text(text)
    plot(groups, out.with_suffix(".png"))
    return text


def plot(groups: Groups, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    shown = sorted(kv for kv in groups.items() if not is_ablation(kv[0][1]))
    for n, ((session, recipe, minutes), runs) in enumerate(shown):
        for i, r in enumerate(runs):
            xs, ys = zip(*r["curve"], strict=True)
            ax.plot([x / 60 for x in xs], ys, color=f"C{n % 10}", alpha=0.7,
                    label=f"{recipe} ({minutes:g} min, {session})" if i == 0 else None)  # fmt: skip
    ax.set(xlabel="training minutes", ylabel="validation loss", ylim=(1.4, 2.6),
           title="Tiny Shakespeare (char): validation loss against time")  # fmt: skip
    ax.axhline(1.4697, color="gray", ls=":", lw=1, label="nanoGPT 10.7M on a GPU (1.4697)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", default="", help="comma-separated: " + ", ".join(RECIPES))
    parser.add_argument("--ablate", default=None, help="a recipe: run it without each technique")
    parser.add_argument(
        "--techniques",
        default="",
        help="--ablate: only these techniques (default: all of the recipe's)",
    )
    parser.add_argument("--nanogpt", type=Path, default=None, help="a nanoGPT checkout")
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--baseline", default="modern")
    parser.add_argument("--targets", default="1.70,1.60,1.50")
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--eval-every-s", type=float, default=None,
                        help="evaluate every this many seconds of each recipe's measured step "
                             "rate instead of every --eval-every steps")  # fmt: skip
    parser.add_argument("--eval-batches", type=int, default=20)
    parser.add_argument("--steps-per-s", type=float, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / "time_to_loss.json")
    parser.add_argument("--report", action="store_true", help="only rewrite the tables")
    parser.add_argument("--session", default=time.strftime("%Y-%m-%d", time.gmtime()),
                        help="the measuring session's name (default: today, UTC): records are "
                             "compared only within a session")  # fmt: skip
    args = parser.parse_args()
    import torch

    from attnlab.analysis.attention_bench import cpu_model
    from attnlab.training.hardware import native_bf16

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    records = load(args.out)
    names = [n for n in args.recipes.split(",") if n]
    if args.ablate:
        techniques = ablations_of(args.ablate)
        chosen = [t for t in args.techniques.split(",") if t] or list(techniques)
        unknown = sorted(set(chosen) - set(techniques))
        if unknown:
            parser.error(f"--techniques: unknown {unknown}; {args.ablate} has {list(techniques)}")
        names += [args.ablate] + [f"{args.ablate}-without-{t}" for t in chosen]
    if args.nanogpt:
        names.append("nanogpt")
    jobs: list[tuple[str, int]] = [(n, int(s)) for s in args.seeds.split(",") for n in names]
    command = " ".join(["python", "benchmarks/time_to_loss.py", *sys.argv[1:]])
    for name, seed in [] if args.report else jobs:  # seeds outermost: drift hits all alike
        if name == "nanogpt":
            record = run_nanogpt(args.nanogpt, args.minutes, seed)
        else:
            record = run_attnlab(name, args.minutes, seed, args)
        record.update(
            command=command,
            machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus",
            cpu=f"{cpu_model()}, {os.cpu_count()} cpus",  # hosts differ between sessions
            native_bf16=native_bf16("cpu"),  # AVX512-BF16 or AMX: the preset trains in bf16
            session=args.session,
            threads=torch.get_num_threads(),
            torch=torch.__version__,
            date=time.strftime("%Y-%m-%d %H:%M:%S"),
        )
        print(f"{name} seed {seed}: val loss {record['final_val_loss']:.4f} after "
              f"{record['train_s']:.0f} s, {record['steps']} steps", flush=True)  # fmt: skip
        records = merge(records, record)
        save(records, args.out)
    if records:
        print(report(records, args, args.out.with_suffix("")))


if __name__ == "__main__":
    main()
