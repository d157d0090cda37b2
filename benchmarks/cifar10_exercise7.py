"""Exercise 7 on CIFAR-10: a ResNet, a plain ViT and a CCT, each trained for the same wall clock.

    python benchmarks/cifar10_exercise7.py --sweep               # lr on the val split, 3 min each
    python benchmarks/cifar10_exercise7.py                       # 30 minutes per model
    python benchmarks/cifar10_exercise7.py --models vit --minutes 30 --profile
    python benchmarks/cifar10_exercise7.py --models vit --resume # continue an interrupted run
    python benchmarks/cifar10_exercise7.py --epochs 15           # the same epochs instead
    python benchmarks/cifar10_exercise7.py --smoke               # seconds, tiny subset, /tmp

Every run is the ``cifar10`` recipe (:mod:`attnlab.training.recipes.cifar10`) on the one Trainer,
into its own run directory (``<out>/runs/cifar10-<model>``: run.json, metrics.jsonl,
checkpoints every 5 minutes, so ``--resume`` continues a run cut short, bitwise). Per model
(``resnet``: ResNet-20; ``vit``: ViT with 4x4 patches; ``cct``: Compact Convolutional
Transformer): a short calibration on a throwaway copy measures the seconds per step (loader and
model apart) and per evaluation, and the step count is chosen so that the cosine schedule ends
with the budget; the run's ``max_minutes`` stops it at the budget regardless (the trainer's
time: training and evaluation), and ``schedule_clock="time"`` makes the cosine follow the clock
whenever the clock is ahead of the steps (steps slower than calibrated: the 2026-12-01 CCT run,
calibrated at 0.215 s per step, averaged 0.336 s and was cut at 68% of a step-only cosine).
``--compile auto`` (the default) calibrates the eager and the ``torch.compile``-d step and keeps
the faster; the compile warm-up is paid out of the budget. The validation split (5,000
training images, 500 per class) is scored ``--evals`` times for the accuracy-vs-time curve; the
10,000 test images are scored once, at the end. Learning rates (and, for the ViT, the size:
``vit-cifar`` or ``vit-cifar-small``) come from ``--sweep`` (each candidate trained for
``--sweep-minutes`` and scored on val; the best is stored in ``results/cifar10_sweep.json`` and
used by later runs; ``--lrs``/``--preset`` run part of the grid again) or the recipe's defaults;
the test split is never used to choose anything.

Recorded (``results/cifar10_exercise7.{json,md}``; a model's entry is replaced when it is run
again, unless ``--choose-on-val`` keeps the one with the higher val accuracy): parameters,
forward FLOPs per image (``attnlab.analysis.forward_flops`` for the ViT, ``FlopCounterMode`` for
the others), images/s, loader vs model milliseconds per step, the curve
(``cifar10_curves.png``), a confusion matrix per model (``cifar10_confusion_<model>.png``) and,
for the transformers, what the classifier reads on a few test images
(``cifar10_attention_<model>.png``: ViT's [CLS] attention over patches, last layer and rollout;
CCT's sequence-pooling weights). ``--profile`` adds torch.profiler's top ops of a few steps.
Every accuracy is on "CIFAR-10 (JPEG copy)" (the project's copy, ../shared/data/README.md) unless
the data came from the official archive.

Threads: the default is every core (2 here); on a shared machine, one thread per process avoids
OpenMP threads waiting on a descheduled partner (a 20x slowdown was seen with 2 threads on a
busy 2-core machine). THP_MEM_ALLOC_ENABLE=1 (set here unless given) lets torch back large
tensors with huge pages: fresh 32 MB activations were ~2x cheaper to allocate on this VM.
"""

from __future__ import annotations

import os

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # read by torch's CPU allocator

import argparse
import copy
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.analysis.attention_bench import describe_machine, machine_info
from attnlab.analysis.flops import forward_flops
from attnlab.analysis.measure import count_flops
from attnlab.analysis.params import count_params
from attnlab.data.cifar10 import CLASSES, Cifar10
from attnlab.models.vit import ViTConfig
from attnlab.training.metrics import read_metrics
from attnlab.training.recipes import Prepared, prepare, train_recipe
from attnlab.training.recipes.cifar10 import evaluate_split
from attnlab.training.rundir import RunDir
from attnlab.training.trainer import Trainer

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"

# competitor -> the recipe's --model candidates (the first is the default), its lr candidates,
# its layout and other recipe fields; the sweep chooses the (model, lr) pair on the val split
MODELS: dict[str, dict[str, Any]] = {
    "resnet": {"models": ("resnet20",), "lrs": (0.05, 0.1, 0.2, 0.4), "channels_last": True},
    "vit": {
        "models": ("vit-cifar", "vit-cifar-small"),
        "lrs": (5e-4, 1e-3, 2e-3),
        "channels_last": False,
    },
    "cct": {
        "models": ("cct-cifar", "cct-cifar-small"),
        "lrs": (5e-4, 1e-3, 2e-3, 4e-3),
        "channels_last": True,
        # the readable attention under bf16 autocast (float32 scores and softmax): 1.06x the
        # step speed of float32 SDPA (results/cct_attention_step.md)
        "fields": {"attn_backend": "math"},
    },
}
SMOKE = {"train_per_class": 20, "val_per_class": 10, "test_per_class": 10}
CALIBRATION = ("calibrated_s_per_step", "loader_ms_per_step", "model_ms_per_step", "eval_s")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="resnet,vit,cct", help="comma-separated: resnet,vit,cct")
    p.add_argument("--minutes", type=float, default=30.0, help="budget per model (train + eval)")
    p.add_argument("--epochs", type=float, default=None, help="fixed epochs instead of time")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=None, help="override the sweep/default lr")
    p.add_argument(
        "--preset", default=None, help="the recipe's --model, overriding the sweep's choice"
    )
    p.add_argument("--sweep", action="store_true", help="only choose lr on the val split")
    p.add_argument(
        "--lrs",
        default=None,
        help="--sweep: only these lrs (comma-separated) and only --preset (or every preset); "
        "their rows replace the same (preset, lr) rows of the stored sweep, the rest are kept",
    )
    p.add_argument(
        "--compile",
        choices=["auto", "on", "off"],
        default="auto",
        help="torch.compile the model; auto: calibrate eager and compiled, keep the faster",
    )
    p.add_argument("--sweep-minutes", type=float, default=3.0)
    p.add_argument("--evals", type=int, default=20, help="val evaluations per run")
    p.add_argument(
        "--precision",
        choices=["bf16", "fp32"],
        default="bf16",
        help="bf16: CPU autocast (AMX/AVX512-BF16), attention kept in fp32",
    )
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--profile", action="store_true", help="torch.profiler over a few steps")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="MODEL.KEY=VALUE",
        help="override a recipe field for one model, e.g. vit.d_model=128 or cct.mixup_alpha=0.2",
    )
    p.add_argument("--resume", action="store_true", help="continue the models' runs in --out")
    p.add_argument(
        "--choose-on-val",
        action="store_true",
        help="keep a model's recorded run when the new one scores lower on val (the new one "
        "goes on record as not chosen); default: the new run replaces it",
    )
    p.add_argument("--progress", action="store_true", help="the trainer's progress bar")
    p.add_argument(
        "--report-only", action="store_true", help="rewrite the report and curves from the json"
    )
    p.add_argument("--data", default=None, help="directory of train.npz/test.npz")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="tiny subset, seconds, writes to /tmp")
    p.add_argument("--out", type=Path, default=None, help=f"results directory ({RESULTS})")
    return p.parse_args()


def overrides(
    args: argparse.Namespace, name: str, lr: float | None, preset: str | None = None
) -> dict[str, Any]:
    """The recipe fields of competitor ``name``'s runs (the budget comes later)."""
    spec = MODELS[name]
    out: dict[str, Any] = {
        "model": preset or spec["models"][0],
        "precision": args.precision,
        "channels_last": spec["channels_last"],
        "batch_size": args.batch_size,
        "seed": args.seed,
        "data": args.data,
        "progress": args.progress,
    }
    out.update(spec.get("fields", {}))
    if lr is not None:
        out["lr"] = lr
    if args.smoke:
        out.update(SMOKE)
    for item in args.set:
        key, _, value = item.partition("=")
        model, _, field = key.partition(".")
        if model == name:
            try:
                out[field] = json.loads(value)  # numbers, true/false, lists
            except json.JSONDecodeError:
                out[field] = value  # a plain string (a norm, an activation)
    return out


def calibrate(over: dict[str, Any], steps: int = 8) -> dict[str, float]:
    """Median seconds per training step (and its loader part) of a throwaway copy after two
    warm-up steps, the warm-up's seconds beyond two such steps (``torch.compile``'s time, when
    ``over["compile"]``), and the seconds of one whole evaluation."""
    p = prepare("cifar10", {**over, "steps": 1000, "progress": False})
    trainer = Trainer(p.model, p.objective, p.train)
    step_s, loader_s, warm_up_s = [], [], 0.0
    for i in range(2 + steps):
        loader_before, start = trainer.stream.loader_seconds, time.perf_counter()  # type: ignore[attr-defined]
        trainer.train_step()
        if i >= 2:
            step_s.append(time.perf_counter() - start)
            loader_s.append(trainer.stream.loader_seconds - loader_before)  # type: ignore[attr-defined]
        else:
            warm_up_s += time.perf_counter() - start
    start = time.perf_counter()
    trainer.evaluate()
    eval_s = time.perf_counter() - start
    loader = statistics.median(loader_s)
    step = statistics.median(step_s)
    return {
        "step_s": step,
        "loader_s": loader,
        "model_s": statistics.median(s - ld for s, ld in zip(step_s, loader_s, strict=True)),
        "eval_s": eval_s,
        "compile_s": max(0.0, warm_up_s - 2 * step) if over.get("compile") else 0.0,
    }


def calibrate_choosing_compile(
    args: argparse.Namespace, over: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, float], dict[str, Any]]:
    """``over`` with ``compile`` decided (``--compile``; auto: the faster step of eager and
    compiled), its calibration, and what was measured to decide."""
    if args.compile != "auto":
        over = {**over, "compile": args.compile == "on"}
        cal = calibrate(over)
        return over, cal, {"compile": over["compile"], "compile_choice": args.compile}
    if over["model"] in _COMPILE_CHOICE:  # decided by an earlier run of this process
        note = _COMPILE_CHOICE[over["model"]]
        over = {**over, "compile": note["compile"]}
        return over, calibrate(over), note
    eager = calibrate({**over, "compile": False})
    compiled = calibrate({**over, "compile": True})
    use = compiled["step_s"] < eager["step_s"]
    note = {
        "compile": use,
        "compile_choice": "auto",
        "eager_s_per_step": round(eager["step_s"], 4),
        "compiled_s_per_step": round(compiled["step_s"], 4),
    }
    _COMPILE_CHOICE[over["model"]] = note
    return {**over, "compile": use}, compiled if use else eager, note


_COMPILE_CHOICE: dict[str, dict[str, Any]] = {}  # preset -> the measurements that decided


def budget(
    args: argparse.Namespace,
    cal: dict[str, float],
    minutes: float | None,
    n_train: int,
    *,
    fixed_epochs: bool,
) -> dict[str, Any]:
    """Steps, time limit and evaluation period: the cosine schedule ends with the budget."""
    if fixed_epochs and args.epochs is not None:
        steps = max(2, math.ceil(args.epochs * n_train / args.batch_size))
        return {"steps": steps, "max_minutes": None, "eval_every": max(1, steps // args.evals)}
    # the trainer's clock starts after torch.compile's warm-up: the budget pays for it here
    seconds = 60.0 * (minutes or 0.0)
    seconds = max(seconds - cal.get("compile_s", 0.0), 0.5 * seconds)
    evals = args.evals if not args.sweep else 3
    train_s = max(seconds - evals * cal["eval_s"], 0.5 * seconds)
    steps = max(2, int(0.97 * train_s / cal["step_s"]))
    # the cosine also runs on the clock: a run slower than calibrated still ends decayed
    return {
        "steps": steps,
        "max_minutes": round(seconds / 60.0, 4),
        "schedule_clock": "time",
        "eval_every": max(1, steps // evals),
    }


def run(
    args: argparse.Namespace,
    name: str,
    out_dir: Path,
    *,
    lr: float | None,
    minutes: float | None,
    final: bool,
    preset: str | None = None,
) -> tuple[Prepared, dict[str, Any]]:
    """One training run of competitor ``name`` into ``out_dir`` (resumed with ``--resume``)."""
    over = overrides(args, name, lr, preset)
    resume = args.resume and final and RunDir(out_dir).holds_run()
    cal: dict[str, float] = {}
    chosen: dict[str, Any] = {}
    if resume:  # the run's own settings (a new calibration would change its schedule)
        given: dict[str, Any] = {"progress": args.progress}
    else:
        over, cal, chosen = calibrate_choosing_compile(args, over)
        n_train = 10 * SMOKE["train_per_class"] if args.smoke else 45_000
        given = {**over, **budget(args, cal, minutes, n_train, fixed_epochs=final)}
    print(f"{name}: {'resuming' if resume else 'training'} -> {out_dir}", flush=True)
    prepared, result = train_recipe(
        "cifar10",
        out_dir,
        given,
        resume=resume,
        overwrite=not resume,
        command=machine_info()["command"],
    )
    stream = prepared.objective.stream  # type: ignore[attr-defined]
    records = read_metrics(out_dir)
    train_lines = [r for r in records if r["split"] == "train"]
    curve = [
        {
            "step": r["step"],
            "minutes": round(r["elapsed_s"] / 60, 3),
            "epoch": round(r["step"] * prepared.train.batch_size / stream.n_train, 3),
            "val_accuracy": round(r["accuracy"], 4),
            "val_loss": round(r["loss"], 4),
        }
        for r in records
        if r["split"] == "val"
    ]
    t = prepared.train
    record: dict[str, Any] = {
        "model": name,
        "preset_option": prepared.options.model,
        "lr": t.lr,
        "planned_steps": t.steps,
        "steps": result.step,
        "stopped_by": result.stopped_by,
        "finished_schedule": result.step == t.steps,
        "minutes": round(result.elapsed_s / 60, 2),
        "epochs": round(result.step * t.batch_size / stream.n_train, 2),
        "images_per_s": round(result.step * t.batch_size / max(result.elapsed_s, 1e-9), 1),
        "session_loader_s": round(stream.loader_seconds, 3),
        "val_accuracy": curve[-1]["val_accuracy"] if curve else None,
        "last_train_loss": train_lines[-1]["loss"] if train_lines else None,
        "last_lr": train_lines[-1].get("lr") if train_lines else None,
        "schedule_clock": t.schedule_clock,
        "curve": curve,
        "run_dir": str(out_dir),
        "resumed": resume,
        "compile_s": result.compile_s,
        **chosen,
    }
    if cal:
        record.update(
            {
                "calibrated_s_per_step": round(cal["step_s"], 4),
                "loader_ms_per_step": round(1000 * cal["loader_s"], 2),
                "model_ms_per_step": round(1000 * cal["model_s"], 2),
                "eval_s": round(cal["eval_s"], 2),
                "calibrated_compile_s": round(cal["compile_s"], 1),
            }
        )
    return prepared, record


def final_record(args: argparse.Namespace, name: str, p: Prepared, r: dict[str, Any]) -> None:
    """The one test score, the confusion matrix, size and cost of the trained model."""
    test = evaluate_split(p, "test")
    r.update(
        {
            "test_accuracy": round(test.accuracy, 4),
            "test_per_class": test.per_class,
            "confusion": test.confusion,
            "dataset": test.dataset,
            "model_config": p.record()["model"],
            "parameters": count_params(p.model),
            "overrides": {
                k: v
                for k, v in overrides(args, name, None, r["preset_option"]).items()
                if k not in ("data", "progress", "seed")
            },
        }
    )
    r.update(flops_per_image(p.model))
    if args.profile:
        over = overrides(args, name, r["lr"], r["preset_option"])
        r["profile"] = profile({**over, "compile": bool(r.get("compile"))})


def flops_per_image(model: nn.Module) -> dict[str, Any]:
    """Forward FLOPs of one 32x32 image: the closed form for ViT, FlopCounterMode otherwise."""
    config = model.config
    if isinstance(config, ViTConfig):
        return {
            "flops_per_image": forward_flops(config).forward,
            "flops_source": "attnlab.analysis.forward_flops",
        }
    measured_model = copy.deepcopy(model).float().to(memory_format=torch.contiguous_format).eval()  # type: ignore[call-overload]
    measured = count_flops(measured_model, (torch.randn(1, 3, 32, 32),))
    return {"flops_per_image": measured.forward, "flops_source": "FlopCounterMode"}


def profile(over: dict[str, Any], steps: int = 3) -> list[dict[str, Any]]:
    """The top ops (self CPU time) of a few training steps of a throwaway copy."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    p = prepare("cifar10", {**over, "steps": 1000, "progress": False})
    trainer = Trainer(p.model, p.objective, p.train)
    trainer.train_step()  # warm-up
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            trainer.train_step()
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    return [
        {"op": e.key, "ms_per_step": round(e.self_cpu_time_total / 1000 / steps, 2)} for e in rows
    ]


# -- outputs --------------------------------------------------------------------------------------


def attention_figure(model: nn.Module, data: Cifar10, name: str, out: Path) -> str | None:
    """What the transformer's classifier reads on 10 test images (one per class)."""
    from attnlab.viz.capture import attention_rollout, collect_attention
    from attnlab.viz.patch_attention import plot_patch_attention

    if not hasattr(model, "layers"):
        return None
    x, y = data.split("test")
    index = torch.stack([(y == k).nonzero()[0, 0] for k in range(len(CLASSES))])
    model = copy.deepcopy(model).float().to(memory_format=torch.contiguous_format).eval()  # type: ignore[call-overload]
    images = data.normalize(x[index])
    with torch.no_grad():
        pred = model(images).argmax(-1)
    maps = collect_attention(model, images)["self"]
    if hasattr(model, "pooling_weights"):
        with torch.no_grad():
            rows = [
                ("sequence pooling", model.pooling_weights(images)),  # type: ignore[operator]
                ("last layer, mean over queries", maps[-1].mean(1).mean(1)),
            ]
    else:
        rows = [
            ("[CLS] -> patches, last layer", maps[-1].mean(1)[:, 0, 1:]),
            ("[CLS] rollout", attention_rollout(maps)[:, 0, 1:]),
        ]
    titles = [f"{CLASSES[int(t)]} / {CLASSES[int(p)]}" for t, p in zip(y[index], pred, strict=True)]
    path = out / f"cifar10_attention_{name}.png"
    plot_patch_attention(
        x[index].permute(0, 2, 3, 1).numpy(),
        rows,
        titles=titles,
        title=f"{name}: true / predicted",
        path=path,
    )
    return path.name


def curves_figure(records: dict[str, Any], out: Path, label: str) -> None:
    from attnlab.viz._mpl import new_figure, save_figure

    fig = new_figure(10.0, 4.0)
    axes = fig.subplots(1, 2, sharey=True)
    for i, (name, r) in enumerate(sorted(records.items())):
        for ax, key in zip(axes, ("minutes", "epoch"), strict=True):
            ax.plot(
                [p[key] for p in r["curve"]],
                [p["val_accuracy"] for p in r["curve"]],
                "-o",
                ms=2,
                color=f"C{i}",
                label=f"{name} (test {r['test_accuracy']:.1%})",
            )
    axes[0].set(xlabel="minutes (training and evaluation)", ylabel=f"val accuracy, {label}")
    axes[1].set(xlabel="epochs")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    save_figure(fig, out / "cifar10_curves.png")


def _changed(fields: dict[str, Any] | None) -> str:
    shown = {k: v for k, v in (fields or {}).items() if k not in ("model", "batch_size")}
    return f" ({', '.join(f'{k}={v}' for k, v in shown.items())})" if shown else ""


def _stop(r: dict[str, Any]) -> str:
    """How a run ended, after its step count: its schedule, or the clock (decayed or cut)."""
    if r["finished_schedule"]:
        return ""
    timed = r.get("schedule_clock") == "time"
    return f" of {r['planned_steps']} ({'clock; lr decayed on time' if timed else 'cut'})"


def write_report(results: dict[str, Any], out: Path) -> None:
    label, meta = results["data"], results["meta"]
    lines = [
        "# Exercise 7 on CIFAR-10: ResNet vs ViT vs CCT (benchmarks/cifar10_exercise7.py)",
        "",
        f"{describe_machine(meta, meta.get('threads'))}, {meta['date_utc']}. Data: {label}; "
        "hyper-parameters chosen on the 5,000-image validation split, test scored once. Each "
        "model is the `cifar10` recipe (`attnlab train cifar10 --model ...`).",
        "",
        f"| model | recipe --model | params | fwd MFLOPs/img | steps | epochs | minutes | img/s | "
        f"loader / model ms per step | lr | val acc | test acc ({label}) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in sorted(results["models"].items()):
        split = (
            f"{r['loader_ms_per_step']} / {r['model_ms_per_step']}"
            if "loader_ms_per_step" in r
            else "-"
        )
        lines.append(
            f"| {name} | {r['preset_option']}{_changed(r.get('overrides'))}"
            f"{', compiled' if r.get('compile') else ''} | "
            f"{r['parameters'] / 1e6:.2f}M | {r['flops_per_image'] / 1e6:.0f} | {r['steps']}"
            f"{_stop(r)} | {r['epochs']} | {r['minutes']} | "
            f"{r['images_per_s']} | {split} | {r['lr']:g} | {r['val_accuracy']:.2%} | "
            f"{r['test_accuracy']:.2%} |"
        )
    lines += [
        "",
        "Curves: `cifar10_curves.png`; confusion matrices: `cifar10_confusion_*.png`; "
        "attention over patches: `cifar10_attention_*.png`.",
        "",
        *targets(results["models"], label),
        *history_table(results.get("history", [])),
        *sweep_table(out),
    ]
    for name, r in sorted(results["models"].items()):
        if "profile" in r:
            lines += [f"## Profile: {name} (self CPU ms per step)", "", "| op | ms |", "|---|---|"]
            lines += [f"| `{row['op']}` | {row['ms_per_step']} |" for row in r["profile"]] + [""]
        lines += [f"Command ({name}): `{r['command']}`; run directory `{r['run_dir']}`", ""]
    (out / "cifar10_exercise7.md").write_text("\n".join(lines), encoding="utf-8")


def targets(models: dict[str, Any], label: str) -> list[str]:
    """Issue 25's targets at 30 minutes: ResNet >= 85%, ViT >= 70%, CCT within 5 of ResNet."""
    acc = {name: r["test_accuracy"] for name, r in models.items()}
    checks = []
    if "resnet" in acc:
        checks.append(("ResNet >= 85%", acc["resnet"] >= 0.85))
    if "vit" in acc:
        checks.append(("plain ViT >= 70%", acc["vit"] >= 0.70))
    if "cct" in acc and "resnet" in acc:
        checks.append(("CCT within 5 points of ResNet", acc["resnet"] - acc["cct"] <= 0.05))
    rows = [f"- {what}: {'met' if ok else 'NOT met'}" for what, ok in checks]
    return [f"Targets (test accuracy, {label}):", "", *rows, ""] if rows else []


def history_table(history: list[dict[str, Any]]) -> list[str]:
    """The earlier runs that later runs of the same model replaced."""
    if not history:
        return []
    lines = [
        "## Other runs (replaced by the ones above, or not chosen over them on val)",
        "",
        "| model | --model | lr | schedule clock | compile | steps (planned) | epochs | minutes | "
        "val acc | test acc | date | outcome |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for h in history:
        lines.append(
            f"| {h['model']} | {h['preset_option']} | {h['lr']:g} | {h['schedule_clock']} | "
            f"{'yes' if h.get('compile') else 'no'} | {h['steps']} ({h['planned_steps']}) | "
            f"{h['epochs']} | {h['minutes']} | {h['val_accuracy']:.2%} | "
            f"{h['test_accuracy']:.2%} | {h.get('date_utc') or '-'} | "
            f"{h.get('outcome', 'replaced')} |"
        )
    return [*lines, ""]


def sweep_table(out: Path) -> list[str]:
    file = out / "cifar10_sweep.json"
    if not file.is_file():
        return []
    lines = ["## Learning-rate sweep (val accuracy after a short run; test never used)", ""]
    lines += ["| model | minutes each | lr: val accuracy | chosen |", "|---|---|---|---|"]
    for name, s in sorted(json.loads(file.read_text()).items()):
        default = MODELS[name]["models"][0]
        for preset in dict.fromkeys(r.get("preset", default) for r in s["runs"]):
            runs = ", ".join(
                f"{r['lr']:g}: {r['val_accuracy']:.2%}"
                for r in s["runs"]
                if r.get("preset", default) == preset
            )
            best = s.get("best_preset", default) == preset
            chosen = f"{s['best_lr']:g}" if best else "-"
            lines.append(f"| {name} `{preset}` | {s['minutes']} | {runs} | {chosen} |")
    return [*lines, ""]


def run_sweep(args: argparse.Namespace, out: Path) -> None:
    """Each (preset, lr) candidate for ``--sweep-minutes``, scored on val; the best pair is
    stored per competitor. ``--lrs`` runs a part of the grid and keeps the other stored rows."""
    file = out / "cifar10_sweep.json"
    sweep = json.loads(file.read_text()) if file.is_file() else {}
    for name in args.models.split(","):
        spec = MODELS[name]
        presets = [args.preset] if args.preset else list(spec["models"])
        lrs = [float(x) for x in args.lrs.split(",")] if args.lrs else list(spec["lrs"])
        old = sweep.get(name, {}) if args.lrs else {}
        rows = [
            {"preset": spec["models"][0], **row} for row in old.get("runs", [])
        ]  # rows from before presets were swept are the default preset's
        for preset in presets:
            for lr in lrs:
                tag = "" if preset == spec["models"][0] else f"-{preset}"
                run_dir = out / "runs" / "sweep" / f"cifar10-{name}{tag}-lr{lr:g}"
                p, r = run(
                    args, name, run_dir, lr=lr, minutes=args.sweep_minutes, final=False,
                    preset=preset,
                )  # fmt: skip
                rows = [row for row in rows if (row["preset"], row["lr"]) != (preset, lr)]
                rows.append(
                    {
                        "preset": preset,
                        "lr": lr,
                        "val_accuracy": r["val_accuracy"],
                        "steps": r["steps"],
                        "epochs": r["epochs"],
                        "schedule_clock": r["schedule_clock"],
                        "compile": r["compile"],
                        "date_utc": machine_info()["date_utc"],
                    }
                )
                print(f"sweep {name} {preset} lr {lr:g}: val {r['val_accuracy']:.2%}", flush=True)
        best = max(rows, key=lambda row: row["val_accuracy"])
        sweep[name] = {
            "minutes": args.sweep_minutes,
            "runs": sorted(rows, key=lambda row: (spec["models"].index(row["preset"]), row["lr"])),
            "best_lr": best["lr"],
            "best_preset": best["preset"],
            "data": p.data.info["dataset"],
            "meta": machine_info(),
        }
        file.write_text(json.dumps(sweep, indent=1) + "\n", encoding="utf-8")


HISTORY_KEYS = (
    "model", "preset_option", "lr", "lr_source", "schedule_clock", "compile", "planned_steps",
    "steps", "stopped_by", "minutes", "epochs", "images_per_s", "calibrated_s_per_step",
    "val_accuracy", "test_accuracy", "command",
)  # fmt: skip


def run_summary(r: dict[str, Any], outcome: str = "replaced") -> dict[str, Any]:
    """The figures of a run that a later run of the same model replaced (or that lost to the
    recorded one on val, ``--choose-on-val``)."""
    summary = {k: r[k] for k in HISTORY_KEYS if k in r}
    summary["outcome"] = outcome
    summary.setdefault("schedule_clock", "steps")  # runs before the field existed
    summary["date_utc"] = r.get("date_utc")  # None: recorded before runs carried a date
    return summary


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    out = args.out or (Path("/tmp/attnlab_cifar10_smoke") if args.smoke else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    if args.smoke:  # 200 train, 100 val, 100 test images; a few seconds per model
        args.minutes, args.sweep_minutes, args.batch_size, args.evals = 0.05, 0.03, 32, 3
        args.compile = "off" if args.compile == "auto" else args.compile  # seconds, not minutes
    if args.sweep:
        run_sweep(args, out)
        return
    file = out / "cifar10_exercise7.json"
    results = json.loads(file.read_text()) if file.is_file() else {"models": {}}
    sweep_file = out / "cifar10_sweep.json"
    sweep = json.loads(sweep_file.read_text()) if sweep_file.is_file() else {}
    for name in [] if args.report_only else args.models.split(","):
        lr = args.lr or sweep.get(name, {}).get("best_lr")
        preset = args.preset or sweep.get(name, {}).get("best_preset") or MODELS[name]["models"][0]
        run_dir = out / "runs" / f"cifar10-{preset}"
        p, r = run(args, name, run_dir, lr=lr, minutes=args.minutes, final=True, preset=preset)
        final_record(args, name, p, r)
        old = results["models"].get(name, {})
        for key in CALIBRATION if r["resumed"] else ():  # measured when the run started
            if key in old:
                r[key] = old[key]
        r["lr_source"] = "--lr" if args.lr else ("sweep" if name in sweep else "recipe default")
        r["command"] = machine_info()["command"]
        r["date_utc"] = machine_info()["date_utc"]
        recorded = results["models"].get(name)
        if args.choose_on_val and recorded and recorded["val_accuracy"] > r["val_accuracy"]:
            results.setdefault("history", []).append(run_summary(r, "not chosen: lower val"))
            file.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
            print(
                f"{name}: val {r['val_accuracy']:.2%} < the recorded run's "
                f"{recorded['val_accuracy']:.2%}; kept that one (test of this run: "
                f"{r['test_accuracy']:.2%})",
                flush=True,
            )
            continue
        r["attention_figure"] = attention_figure(p.model, p.data.value, name, out)
        from attnlab.viz.confusion import plot_confusion

        plot_confusion(
            r["confusion"],
            CLASSES,
            title=f"{name}, {r['dataset']}",
            path=out / f"cifar10_confusion_{name}.png",
        )
        if name in results["models"]:  # the run replaced stays on record, in brief
            results.setdefault("history", []).append(run_summary(results["models"][name]))
        results["models"][name] = r
        results["data"] = r["dataset"]
        results["meta"] = {**machine_info(), "threads": args.threads}
        file.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
        print(f"{name}: test accuracy {r['test_accuracy']:.2%} ({r['dataset']})", flush=True)
    curves_figure(results["models"], out, results["data"])
    write_report(results, out)


if __name__ == "__main__":
    main()
