"""Exercise 7 on CIFAR-10: a ResNet, a plain ViT and a CCT, each trained for the same wall clock.

    python benchmarks/cifar10_exercise7.py --sweep               # lr on the val split, 3 min each
    python benchmarks/cifar10_exercise7.py                       # 30 minutes per model
    python benchmarks/cifar10_exercise7.py --models vit --minutes 30 --profile
    python benchmarks/cifar10_exercise7.py --epochs 15           # the same epochs instead
    python benchmarks/cifar10_exercise7.py --smoke               # seconds, tiny subset, /tmp

Per model (``resnet``: ResNet-20; ``vit``: ViT with 4x4 patches; ``cct``: Compact Convolutional
Transformer): the number of optimizer steps that fits the budget is estimated from a short
calibration run, so the cosine schedule ends when the time does (training time only;
evaluation is timed apart and excluded); the run stops at the budget regardless. The validation
split (5,000 training images, 500 per class) is scored every ``--evals``-th of the run for the
accuracy-vs-time curve; the 10,000 test images are scored once, at the end. Learning rates come
from ``--sweep`` (each candidate trained for ``--sweep-minutes`` and scored on val; the best is
stored in ``results/cifar10_sweep.json`` and used by later runs) or the defaults below; the test
split is never used to choose anything.

Recorded (``results/cifar10_exercise7.{json,md}``; a model's entry is replaced when it is run
again): parameters, forward FLOPs per image (``attnlab.analysis.forward_flops`` for the ViT,
``FlopCounterMode`` for the others), images/s, loader vs model seconds per step, the curve
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
import dataclasses
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.analysis.attention_bench import describe_machine, machine_info
from attnlab.analysis.flops import forward_flops
from attnlab.analysis.measure import count_flops
from attnlab.analysis.params import count_params
from attnlab.models import build_model, config_for
from attnlab.models.vit import ViTConfig
from attnlab.training.augment import AugmentConfig
from attnlab.training.cifar10 import CLASSES, Cifar10
from attnlab.training.config import TrainConfig
from attnlab.training.image_objective import (
    AugmentedClassificationObjective,
    attention_in_float32,
    confusion_matrix,
    predict,
)
from attnlab.training.trainer import Trainer

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
N_TRAIN = 45000


@dataclass(frozen=True)
class Spec:
    """One competitor: a preset, its optimisation, its augmentation, its lr candidates."""

    preset: str
    train: dict[str, Any]
    lrs: tuple[float, ...]
    augment: AugmentConfig = field(default_factory=AugmentConfig)  # crop (reflect) + flip
    channels_last: bool = False


_ADAMW = dict(
    optimizer="adamw", betas=(0.9, 0.999), adam_eps=1e-8, label_smoothing=0.1, clip_grad_norm=1.0
)
SPECS = {
    # He et al.: SGD, momentum 0.9, batch 128, lr 0.1; wd 5e-4 (short schedules), cosine.
    "resnet": Spec(
        "resnet20-cifar",
        dict(optimizer="sgd", betas=(0.9, 0.999), lr=0.1, weight_decay=5e-4, label_smoothing=0.0),
        (0.05, 0.1, 0.2),
        channels_last=True,
    ),
    # ViT-Lite / CCT recipes (Hassani et al.): AdamW, wd 0.05, label smoothing 0.1, warmup.
    "vit": Spec("vit-cifar", dict(lr=1e-3, weight_decay=0.05, **_ADAMW), (5e-4, 1e-3, 2e-3)),
    "cct": Spec(
        "cct-cifar",
        dict(lr=1e-3, weight_decay=0.05, **_ADAMW),
        (5e-4, 1e-3, 2e-3),
        channels_last=True,
    ),
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="resnet,vit,cct", help="comma-separated: resnet,vit,cct")
    p.add_argument("--minutes", type=float, default=30.0, help="training budget per model")
    p.add_argument("--epochs", type=float, default=None, help="fixed epochs instead of time")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=None, help="override the sweep/default lr")
    p.add_argument("--sweep", action="store_true", help="only choose lr on the val split")
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
        help="override a model config field, e.g. vit.d_model=128",
    )
    p.add_argument("--data", default=None, help="directory of train.npz/test.npz")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="tiny subset, seconds, writes to /tmp")
    p.add_argument("--out", type=Path, default=None, help=f"results directory ({RESULTS})")
    return p.parse_args()


def overrides(args: argparse.Namespace, model: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in args.set:
        key, _, value = item.partition("=")
        name, _, fld = key.partition(".")
        if name == model:
            try:
                out[fld] = json.loads(value)  # numbers, true/false, lists
            except json.JSONDecodeError:
                out[fld] = value  # a plain string (a norm, an activation)
    return out


def make_run(
    spec: Spec,
    args: argparse.Namespace,
    data: Cifar10,
    name: str,
    *,
    lr: float,
    steps: int,
    run_dir: Path | None = None,
) -> tuple[nn.Module, Any, Trainer]:
    """Model (seeded), objective and trainer with a cosine schedule over ``steps``."""
    torch.manual_seed(args.seed)
    model = build_model(config_for(spec.preset, **overrides(args, name)))
    bf16 = args.precision == "bf16"
    if spec.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if bf16:
        attention_in_float32(model)
    objective = AugmentedClassificationObjective(
        data, spec.augment, seed=args.seed, autocast=bf16, channels_last=spec.channels_last
    )
    warmup = max(1, min(steps // 20, 500))
    train = TrainConfig(
        **{**spec.train, "lr": lr},
        steps=steps,
        batch_size=args.batch_size,
        schedule="cosine",
        warmup=min(warmup, steps - 1) if steps > 1 else 0,
        progress=False,
        seed=args.seed,
    )
    extra = {"model": dataclasses.asdict(model.config), "augment": dataclasses.asdict(spec.augment)}
    trainer = Trainer(model, objective, train, run_dir=run_dir, extra_config=extra)
    return model, objective, trainer


def seconds_per_step(spec: Spec, args: argparse.Namespace, data: Cifar10, name: str) -> float:
    """Median time of a few training steps of a throwaway copy (2 warm-up steps first)."""
    _, _, trainer = make_run(spec, args, data, name, lr=spec.train["lr"], steps=1000)
    times = []
    for i in range(2 + (3 if args.smoke else 8)):
        start = time.perf_counter()
        trainer.train_step()
        if i >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def accuracy(
    model: nn.Module,
    data: Cifar10,
    split: str,
    spec: Spec,
    args: argparse.Namespace,
) -> tuple[float, torch.Tensor, torch.Tensor]:
    pred, labels = predict(
        model,
        data,
        split,
        autocast=args.precision == "bf16",  # type: ignore[arg-type]
        channels_last=spec.channels_last,
    )
    return float((pred == labels).float().mean()), pred, labels


def train(
    spec: Spec,
    args: argparse.Namespace,
    data: Cifar10,
    name: str,
    *,
    lr: float,
    minutes: float | None,
    run_dir: Path | None,
    final: bool,
) -> dict[str, Any]:
    """Train to the budget, evaluating val along the way; test once at the end if ``final``."""
    step_s = seconds_per_step(spec, args, data, name)
    n_train = len(data.split("train")[1])
    if args.epochs is not None and final:
        steps = max(2, math.ceil(args.epochs * n_train / args.batch_size))
        budget = math.inf
    else:
        budget = 60.0 * (minutes or 0.0)
        steps = max(2, int(0.97 * budget / step_s))
    model, objective, trainer = make_run(
        spec, args, data, name, lr=lr, steps=steps, run_dir=run_dir
    )
    every = max(1, steps // args.evals)
    curve, step_times, loader_times, losses = [], [], [], []
    train_s = eval_s = 0.0
    while trainer.step < steps and train_s < budget:
        loader_before, start = objective.loader_seconds, time.perf_counter()
        loss, _, _ = trainer.train_step()
        elapsed = time.perf_counter() - start
        train_s += elapsed
        step_times.append(elapsed)
        loader_times.append(objective.loader_seconds - loader_before)
        losses.append(loss)
        if trainer.step % every == 0 or trainer.step == steps or train_s >= budget:
            start = time.perf_counter()
            val, _, _ = accuracy(model, data, "val", spec, args)
            eval_s += time.perf_counter() - start
            curve.append(
                {
                    "step": trainer.step,
                    "train_minutes": round(train_s / 60, 3),
                    "epoch": round(trainer.step * args.batch_size / n_train, 3),
                    "train_loss": round(statistics.fmean(losses[-every:]), 4),
                    "val_accuracy": round(val, 4),
                }
            )
            print(
                f"  {name} step {trainer.step}/{steps} {train_s / 60:.1f} min "
                f"loss {curve[-1]['train_loss']:.3f} val {val:.2%}",
                flush=True,
            )
    record: dict[str, Any] = {
        "model": name,
        "preset": spec.preset,
        "overrides": overrides(args, name),
        "lr": lr,
        "planned_steps": steps,
        "steps": trainer.step,
        "finished_schedule": trainer.step == steps,
        "calibrated_s_per_step": round(step_s, 4),
        "train_minutes": round(train_s / 60, 2),
        "eval_minutes": round(eval_s / 60, 2),
        "epochs": round(trainer.step * args.batch_size / n_train, 2),
        "images_per_s": round(trainer.step * args.batch_size / max(train_s, 1e-9), 1),
        "loader_ms_per_step": round(1000 * statistics.median(loader_times), 2),
        "model_ms_per_step": round(
            1000
            * statistics.median([s - ld for s, ld in zip(step_times, loader_times, strict=True)]),
            2,
        ),
        "val_accuracy": curve[-1]["val_accuracy"],
        "curve": curve,
        "train_config": trainer.config.to_dict(),
        "augment": dataclasses.asdict(spec.augment),
    }
    if final:
        test, pred, labels = accuracy(model, data, "test", spec, args)  # the one test score
        record["test_accuracy"] = round(test, 4)
        record["confusion"] = confusion_matrix(pred, labels, len(CLASSES)).tolist()
        record["model_config"] = dataclasses.asdict(model.config)
        record["parameters"] = count_params(model)
        record.update(flops_per_image(model))
        if run_dir is not None:
            record["checkpoint"] = str(trainer.save())
        if args.profile:
            record["profile"] = profile(trainer)
        record["_model"] = model
    return record


def flops_per_image(model: nn.Module) -> dict[str, Any]:
    """Forward FLOPs of one 32x32 image: the closed form for ViT, FlopCounterMode otherwise."""
    config = model.config  # type: ignore[attr-defined]
    if isinstance(config, ViTConfig):
        return {
            "flops_per_image": forward_flops(config).forward,
            "flops_source": "attnlab.analysis.forward_flops",
        }
    measured_model = copy.deepcopy(model).float().to(memory_format=torch.contiguous_format).eval()
    measured = count_flops(measured_model, (torch.randn(1, 3, 32, 32),))
    return {"flops_per_image": measured.forward, "flops_source": "FlopCounterMode"}


def profile(trainer: Trainer, steps: int = 3) -> list[dict[str, Any]]:
    """The top ops (self CPU time) of a few training steps."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

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
    model = copy.deepcopy(model).float().to(memory_format=torch.contiguous_format).eval()
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
        for ax, key in zip(axes, ("train_minutes", "epoch"), strict=True):
            ax.plot(
                [p[key] for p in r["curve"]],
                [p["val_accuracy"] for p in r["curve"]],
                "-o",
                ms=2,
                color=f"C{i}",
                label=f"{name} (test {r['test_accuracy']:.1%})",
            )
    axes[0].set(xlabel="training minutes", ylabel=f"val accuracy, {label}")
    axes[1].set(xlabel="epochs")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    save_figure(fig, out / "cifar10_curves.png")


def _changed(fields: dict[str, Any] | None) -> str:
    return f" ({', '.join(f'{k}={v}' for k, v in fields.items())})" if fields else ""


def write_report(results: dict[str, Any], out: Path) -> None:
    label, meta = results["data"], results["meta"]
    lines = [
        "# Exercise 7 on CIFAR-10: ResNet vs ViT vs CCT (benchmarks/cifar10_exercise7.py)",
        "",
        f"{describe_machine(meta, meta.get('threads'))}, {meta['date_utc']}. Data: {label}; "
        "hyper-parameters chosen on the 5,000-image validation split, test scored once.",
        "",
        f"| model | preset | params | fwd MFLOPs/img | steps | epochs | train min | img/s | "
        f"loader / model ms per step | lr | val acc | test acc ({label}) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in sorted(results["models"].items()):
        lines.append(
            f"| {name} | {r['preset']}{_changed(r.get('overrides'))} | "
            f"{r['parameters'] / 1e6:.2f}M | "
            f"{r['flops_per_image'] / 1e6:.0f} | {r['steps']}"
            f"{'' if r['finished_schedule'] else ' (cut)'} | {r['epochs']} | "
            f"{r['train_minutes']} | {r['images_per_s']} | {r['loader_ms_per_step']} / "
            f"{r['model_ms_per_step']} | {r['lr']:g} | {r['val_accuracy']:.2%} | "
            f"{r['test_accuracy']:.2%} |"
        )
    lines += [
        "",
        "Curves: `cifar10_curves.png`; confusion matrices: `cifar10_confusion_*.png`; "
        "attention over patches: `cifar10_attention_*.png`.",
        "",
        *targets(results["models"], label),
        *sweep_table(out),
    ]
    for name, r in sorted(results["models"].items()):
        if "profile" in r:
            lines += [f"## Profile: {name} (self CPU ms per step)", "", "| op | ms |", "|---|---|"]
            lines += [f"| `{row['op']}` | {row['ms_per_step']} |" for row in r["profile"]] + [""]
        lines += [f"Command ({name}): `{r['command']}`", ""]
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


def sweep_table(out: Path) -> list[str]:
    file = out / "cifar10_sweep.json"
    if not file.is_file():
        return []
    lines = ["## Learning-rate sweep (val accuracy after a short run; test never used)", ""]
    lines += ["| model | minutes each | lr: val accuracy | chosen |", "|---|---|---|---|"]
    for name, s in sorted(json.loads(file.read_text()).items()):
        runs = ", ".join(f"{r['lr']:g}: {r['val_accuracy']:.2%}" for r in s["runs"])
        lines.append(f"| {name} | {s['minutes']} | {runs} | {s['best_lr']:g} |")
    return [*lines, ""]


def run_sweep(args: argparse.Namespace, data: Cifar10, out: Path) -> None:
    file = out / "cifar10_sweep.json"
    sweep = json.loads(file.read_text()) if file.is_file() else {}
    for name in args.models.split(","):
        spec = SPECS[name]
        rows = []
        for lr in spec.lrs:
            r = train(
                spec, args, data, name, lr=lr, minutes=args.sweep_minutes, run_dir=None, final=False
            )
            rows.append(
                {
                    "lr": lr,
                    "val_accuracy": r["val_accuracy"],
                    "steps": r["steps"],
                    "epochs": r["epochs"],
                }
            )
            print(f"sweep {name} lr {lr:g}: val {r['val_accuracy']:.2%}", flush=True)
        best = max(rows, key=lambda row: row["val_accuracy"])
        sweep[name] = {
            "minutes": args.sweep_minutes,
            "runs": rows,
            "best_lr": best["lr"],
            "data": data.source,
            "meta": machine_info(),
        }
    file.write_text(json.dumps(sweep, indent=1) + "\n", encoding="utf-8")


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    out = args.out or (Path("/tmp/attnlab_cifar10_smoke") if args.smoke else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    data = Cifar10.load(args.data, n_val=5000, seed=0)
    if args.smoke:  # 200 train, 100 val, 100 test images; a few seconds per model
        data = data.subset({"train": 20, "val": 10, "test": 10})
        args.minutes, args.sweep_minutes, args.batch_size, args.evals = 0.05, 0.03, 32, 3
    if args.sweep:
        run_sweep(args, data, out)
        return
    file = out / "cifar10_exercise7.json"
    results = json.loads(file.read_text()) if file.is_file() else {"models": {}}
    sweep_file = out / "cifar10_sweep.json"
    sweep = json.loads(sweep_file.read_text()) if sweep_file.is_file() else {}
    for name in args.models.split(","):
        spec = SPECS[name]
        lr = args.lr or sweep.get(name, {}).get("best_lr") or spec.train["lr"]
        r = train(
            spec,
            args,
            data,
            name,
            lr=lr,
            minutes=args.minutes,
            final=True,
            run_dir=out / "runs" / f"cifar10_{name}",
        )
        model = r.pop("_model")
        r["lr_source"] = "--lr" if args.lr else ("sweep" if name in sweep else "default")
        r["command"] = machine_info()["command"]
        r["attention_figure"] = attention_figure(model, data, name, out)
        from attnlab.viz.confusion import plot_confusion

        plot_confusion(
            r["confusion"],
            CLASSES,
            title=f"{name}, {data.source}",
            path=out / f"cifar10_confusion_{name}.png",
        )
        results["models"][name] = r
        results["data"] = data.source
        results["meta"] = {**machine_info(), "threads": args.threads}
        file.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
        print(f"{name}: test accuracy {r['test_accuracy']:.2%} ({data.source})", flush=True)
    curves_figure(results["models"], out, results["data"])
    write_report(results, out)


if __name__ == "__main__":
    main()
