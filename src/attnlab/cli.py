"""The ``attnlab`` command line: thin wrappers that parse, build configs and call the library.

    attnlab train reverse [--steps N --batch-size B --d-model E ... --out DIR]
    attnlab train {shakespeare-char,shakespeare-mlm,digits} [--key=value ...] [--resume]
    attnlab sample RUN_DIR --prompt TEXT     attnlab evaluate RUN_DIR   (attnlab.training.cli)
    attnlab generate CHECKPOINT_DIR ...      (attnlab.generation.cli)
    attnlab viz {attention,positional,...}   (attnlab.viz.cli)
    attnlab analyze PRESET_OR_CONFIG ...     (attnlab.analysis.cli)

Subcommands nest (``train <task>``) so later ones (``train gpt``, ``translate``) slot in beside
these. Each subcommand sets ``func(args) -> exit status``. Only CLI modules print.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence

import torch

from attnlab.analysis.attention_bench import add_bench_subparser
from attnlab.analysis.cli import add_analyze_subparser
from attnlab.analysis.memory_check import IGNORE_FLAG, check_training_fits
from attnlab.generation.cli import add_generate_subparser
from attnlab.models import EncoderDecoderTransformer, TransformerConfig
from attnlab.training import (
    LoopConfig,
    ReverseTask,
    evaluate_exact_match,
    save_pretrained,
    train,
)
from attnlab.training.cli import (
    add_evaluate_subparser,
    add_recipe_parsers,
    add_sample_subparser,
)
from attnlab.translation.cli import add_translate_parsers
from attnlab.viz.cli import add_viz_subparser


def _number(kind: type, *, low: float, inclusive: bool) -> Callable[[str], float]:
    """An argparse ``type`` parsing ``kind`` and requiring ``> low`` (or ``>= low``)."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid {kind.__name__}") from None
        if value < low or (value == low and not inclusive):
            bound = f">= {low}" if inclusive else f"> {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    return parse


positive_int = _number(int, low=0, inclusive=False)
positive_float = _number(float, low=0.0, inclusive=False)
nonnegative_float = _number(float, low=0.0, inclusive=True)


def _add_reverse_parser(tasks: argparse._SubParsersAction) -> None:
    p = tasks.add_parser(
        "reverse",
        help="train a small encoder-decoder to reverse random sequences",
        description=(
            "Train a small encoder-decoder Transformer to reverse random token sequences, report "
            "held-out exact match (greedy decoding) and save a checkpoint. The defaults reach "
            ">= 99% exact match on lengths 8-16 in about a minute on 2 CPU cores."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("task")
    g.add_argument("--vocab", type=positive_int, default=32, help="vocabulary incl. pad/BOS/EOS")
    g.add_argument("--min-len", type=positive_int, default=8, help="shortest sequence")
    g.add_argument("--max-len", type=positive_int, default=16, help="longest sequence")
    g.add_argument("--eval-size", type=positive_int, default=1000, help="held-out sequences")
    g = p.add_argument_group("model")
    g.add_argument("--d-model", type=positive_int, default=64, help="model width")
    g.add_argument("--layers", type=positive_int, default=2, help="encoder and decoder layers")
    g.add_argument("--heads", type=positive_int, default=4, help="attention heads")
    g.add_argument("--d-ff", type=positive_int, default=256, help="FFN inner size")
    g.add_argument("--dropout", type=nonnegative_float, default=0.0, help="dropout rate")
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=positive_int, default=1500, help="optimizer updates")
    g.add_argument("--batch-size", type=positive_int, default=128, help="sequences per step")
    g.add_argument("--warmup", type=positive_int, default=100, help="Noam warmup steps (§5.3)")
    g.add_argument("--lr-factor", type=positive_float, default=0.16, help="multiplies eq. (3)")
    g.add_argument(
        "--schedule",
        choices=["noam", "cosine"],
        default="cosine",
        help="eq. (3) throughout, or its warmup and peak then a cosine to 0 (no late loss spikes)",
    )
    g.add_argument(
        "--beta2",
        type=nonnegative_float,
        default=0.999,
        help="Adam beta2 (the paper's 0.98 gives recurring loss spikes on this tiny task)",
    )
    g.add_argument("--label-smoothing", type=nonnegative_float, default=0.1, help="§5.4 eps_ls")
    g.add_argument("--clip", type=positive_float, default=None, help="max gradient norm")
    g.add_argument("--seed", type=int, default=0, help="seeds init, data and dropout")
    g.add_argument("--max-minutes", type=positive_float, default=None, help="training time cap")
    g.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--out", default="runs/reverse", help="checkpoint directory")
    p.add_argument(
        IGNORE_FLAG, action="store_true", help="train even if the memory estimate exceeds RAM"
    )
    p.set_defaults(func=_train_reverse, parser=p)


def _add_embed_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "embed",
        help="sentence embeddings from a BERT-family checkpoint",
        description=(
            "Mean-pooled (over the attention mask), L2-normalised sentence embeddings, as the "
            "all-MiniLM-L6-v2 model card prescribes; prints the cosine similarity matrix, or the "
            "vectors with --json."
        ),
    )
    p.add_argument("model", help="checkpoint directory (Hugging Face or attnlab) + tokenizer.json")
    p.add_argument("--text", action="append", required=True, help="a sentence (repeatable)")
    p.add_argument("--json", action="store_true", help="print the embeddings as JSON")
    p.set_defaults(func=_embed, parser=p)


def _embed(args: argparse.Namespace) -> int:
    from attnlab.sentence import embed

    try:
        vectors = embed(list(args.text), args.model)
    except (ValueError, TypeError, OSError) as e:
        args.parser.error(str(e))
    if args.json:
        print(json.dumps({"texts": args.text, "embeddings": vectors.tolist()}))
        return 0
    print(f"{len(args.text)} sentences, {vectors.shape[-1]}-dimensional embeddings; cosine:")
    cos = vectors @ vectors.T
    for i, text in enumerate(args.text):
        row = " ".join(f"{float(c):6.3f}" for c in cos[i])
        print(f"{row}  {text}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``attnlab`` argument parser (``train reverse``, ``generate``, ``viz``, ``analyze``)."""
    parser = argparse.ArgumentParser(
        prog="attnlab", description="The Transformer family from first principles."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    train_p = commands.add_parser("train", help="train a model on a task")
    tasks = train_p.add_subparsers(dest="task", metavar="TASK", required=True)
    _add_reverse_parser(tasks)
    add_recipe_parsers(tasks)
    add_generate_subparser(commands)
    add_sample_subparser(commands)
    add_evaluate_subparser(commands)
    add_viz_subparser(commands)
    add_analyze_subparser(commands)
    _add_embed_parser(commands)
    add_bench_subparser(commands)
    add_translate_parsers(tasks, commands)
    return parser


def _train_reverse(args: argparse.Namespace) -> int:
    start = time.monotonic()
    try:
        task = ReverseTask(vocab_size=args.vocab, min_len=args.min_len, max_len=args.max_len)
        model_config = TransformerConfig(
            vocab_size=args.vocab,
            d_model=args.d_model,
            n_heads=args.heads,
            n_layers=args.layers,
            d_ff=args.d_ff,
            dropout=args.dropout,
            max_seq_len=task.seq_len,
        )
        train_config = LoopConfig(
            steps=args.steps,
            warmup=args.warmup,
            lr_factor=args.lr_factor,
            schedule=args.schedule,
            betas=(0.9, args.beta2),
            label_smoothing=args.label_smoothing,
            clip_grad_norm=args.clip,
            seed=args.seed,
            progress=not args.no_progress,
            max_minutes=args.max_minutes,
        )
        if not args.ignore_memory_check:  # exits 2 naming the estimate (a MemoryLimitError)
            check_training_fits(model_config, args.batch_size)
        heldout = task.heldout(args.eval_size, seed=args.seed + 1)
    except ValueError as e:
        args.parser.error(str(e))
    torch.manual_seed(args.seed)
    model = EncoderDecoderTransformer(model_config)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"reverse: vocab {args.vocab}, lengths {args.min_len}-{args.max_len}; model d_model "
        f"{args.d_model}, {args.layers}+{args.layers} layers, {args.heads} heads, d_ff "
        f"{args.d_ff}, {n_params:,} parameters",
        flush=True,
    )
    result = train(model, task.batches(args.batch_size, seed=args.seed), train_config)
    stopped = " (stopped early: time limit)" if result.stopped_early else ""
    print(
        f"trained {result.steps} steps in {result.seconds:.1f} s, loss {result.loss:.4f}{stopped}"
    )
    accuracy = evaluate_exact_match(model, heldout)
    n = sum(len(b) for b in heldout)
    print(
        f"held-out exact match: {accuracy:.2%} ({round(accuracy * n)}/{n} sequences of length "
        f"{args.min_len}-{args.max_len}, greedy decoding)"
    )
    out = save_pretrained(model, args.out)
    print(f"checkpoint: {out} ({time.monotonic() - start:.1f} s total)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``attnlab`` script; returns the exit status."""
    parser = build_parser()
    # Recipes take free-form --key=value overrides (checked against their configs); every other
    # command rejects unknown arguments as parse_args would.
    args, extras = parser.parse_known_args(argv)
    if extras and not getattr(args, "accepts_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    args.overrides = extras
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
