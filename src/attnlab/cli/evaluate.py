"""``attnlab evaluate RUN_DIR``: a trained run's validation metrics, as its trainer measures them.

The run is rebuilt from its ``run.json`` with the newest checkpoint's weights; the output is the
recipe's validation figures (loss, accuracy and the recipe's own: exact match, perplexity,
BLEU), for digits the accuracy on the whole validation and test splits, for cifar10 also the
test split's per-class accuracy and confusion matrix, and for the masked LM a filled-in sample.
``--json`` prints them as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

import torch

from attnlab.cli.common import check_device, fail, guarded


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_parser(commands: Any) -> None:
    """The ``evaluate`` command."""
    p = commands.add_parser("evaluate", help="evaluate a trained run on its validation split")
    p.add_argument("run", help="run directory (runs/NAME)")
    p.add_argument(
        "--batches", type=_positive, default=None, help="validation batches (default: all)"
    )
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N, mps, auto (default: cpu)")
    p.add_argument(
        "--precision",
        default=None,
        choices=("fp32", "bf16-mixed", "fp16-mixed", "bf16"),
        help="default: the run's own (its train config)",
    )
    p.set_defaults(func=guarded("attnlab evaluate", run_evaluate))


def run_evaluate(args: argparse.Namespace) -> int:
    """Print the run's validation metrics."""
    from attnlab.training import Trainer, load_run
    from attnlab.training.objectives import classification_accuracy

    if args.device is not None:  # flags first, said as the flag
        check_device(args.device)
    run = load_run(args.run)
    # the run's precision (or --precision) on --device; evaluation needs no compile/checkpointing
    run.train = dataclasses.replace(
        run.train, device=args.device, compile=False, activation_checkpointing=0,
        precision=args.precision or run.train.precision,
    )  # fmt: skip
    trainer = Trainer(run.model, run.objective, run.train, callbacks=run.callbacks)
    metrics: dict[str, Any] = trainer.evaluate(args.batches)
    whole: dict[str, float] = {}
    if run.recipe.name == "digits":
        for split in ("val", "test"):
            whole[split] = classification_accuracy(run.model, run.data.value, split)
    cifar = cifar10_report(run) if run.recipe.name == "cifar10" else None
    if cifar is not None:
        whole = {split: e.accuracy for split, e in cifar.items()}
    sample = mlm_fill_sample(run) if run.recipe.name == "shakespeare-mlm" else None
    if args.json:
        extra = {"splits": {k: e.to_dict() for k, e in cifar.items()}} if cifar else {}
        print(json.dumps({"recipe": run.recipe.name, "checkpoint": str(run.checkpoint),
                          "metrics": metrics, "whole_split_accuracy": whole,
                          "sample": sample, **extra}, indent=2))  # fmt: skip
        return 0
    print(f"{run.recipe.name} ({run.checkpoint}):")
    for key, value in metrics.items():
        shown = f"{value:.2%}" if "accuracy" in key or "exact_match" in key else f"{value:.4f}"
        print(f"  {key.replace('_', ' ')}: {shown}")
    for split, accuracy in whole.items():
        source = f", {cifar[split].dataset}" if cifar else ""
        print(f"  {split} accuracy (whole split{source}): {accuracy:.2%}")
    if cifar is not None:
        print_cifar10_report(cifar["test"])
    if sample is not None:
        print(sample)
    return 0


def cifar10_report(run: Any) -> dict[str, Any]:
    """``{split: SplitEvaluation}`` of a cifar10 run's whole validation and test splits."""
    from attnlab.data.common import Split
    from attnlab.training.recipes.cifar10 import evaluate_split

    splits: list[Split] = ["val", "test"]
    return {s: evaluate_split(run, s) for s in splits if s in run.data.value.splits}


def print_cifar10_report(e: Any) -> None:
    """Per-class accuracy and the confusion matrix of one split, as text."""
    print(f"  {e.split}: {e.images:,} images of {e.dataset}")
    print("  per class: " + ", ".join(f"{k} {v:.1%}" for k, v in e.per_class.items()))
    names = [k[:5] for k in e.per_class]
    print("  confusion (rows: true class, columns: predicted):")
    print("    " + " " * 6 + " ".join(f"{n:>5}" for n in names))
    for name, row in zip(names, e.confusion, strict=True):
        print(f"    {name:>5} " + " ".join(f"{v:>5}" for v in row))


def mlm_fill_sample(run: Any, *, seed: int = 0) -> str:
    """One masked validation block, shown with ``_`` at the masks, the model's fill-in and the
    original text."""
    inputs, targets = run.objective.sample("val", 1, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        device = next(iter(run.model.parameters())).device
        predicted = run.model(inputs.to(device)).logits.argmax(-1).cpu()  # (1, T)
    selected = targets[0] != -100
    tok = run.tokenizer
    if tok is None:
        fail(f"recipe {run.recipe.name!r} has no tokenizer; masked samples need text")
    shown = "".join(
        "_" if s else tok.decode([int(i)]) for i, s in zip(inputs[0], selected, strict=True)
    )
    filled = torch.where(selected, predicted[0], inputs[0])
    original = torch.where(selected, targets[0], inputs[0])
    right = int((predicted[0] == targets[0])[selected].sum())
    return (
        f"masked : {shown!r}\nfilled : {tok.decode(filled.tolist())!r}\n"
        f"truth  : {tok.decode(original.tolist())!r}\n({right}/{int(selected.sum())} masks right)"
    )


__all__ = [
    "add_parser",
    "cifar10_report",
    "mlm_fill_sample",
    "print_cifar10_report",
    "run_evaluate",
]
