"""``attnlab train translate`` and ``attnlab translate``.

    attnlab train translate --src de --tgt en --data DIR --out runs/de-en [--max-minutes 90]
        [--max-steps N] [--label-smoothing 0.1 | --no-label-smoothing] [--resume] ...
    attnlab translate runs/de-en [--beam 4 --alpha 0.6 | --greedy] < input.de > output.en
    attnlab translate runs/de-en --eval test_2016_flickr [--data DIR] [--json scores.json]

Every :class:`~attnlab.translation.config.TranslateConfig` field is an option (``--d-model``,
``--warmup``, ...). Bad input (unknown language, missing data directory, a run that exists
without ``--resume``) exits with status 2 and a message naming the problem.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from attnlab.translation.config import TranslateConfig

_HELP = {
    "vocab_size": "joint BPE vocabulary (4 specials + 256 byte tokens included)",
    "min_frequency": "BPE: least frequency of a merge",
    "d_model": "model width",
    "n_layers": "encoder and decoder layers",
    "n_heads": "attention heads",
    "d_ff": "FFN inner size",
    "dropout": "dropout rate (§5.4)",
    "norm_position": "post-norm (the paper) or pre-norm",
    "max_len": "model max_seq_len; longer training pairs are dropped with a counted warning",
    "max_tokens": "padded tokens per batch (n_pairs x longest side)",
    "lr_factor": "multiplies eq. (3)",
    "warmup": "warmup steps of eq. (3)",
    "adam_beta1": "Adam beta1",
    "adam_beta2": "Adam beta2",
    "adam_eps": "Adam epsilon",
    "label_smoothing": "epsilon_ls (§5.4); 0 turns it off",
    "clip_grad_norm": "max gradient norm ('none' to disable)",
    "seed": "seeds the initialisation, data order and dropout",
    "train_limit": "use only the first N training pairs",
    "max_steps": "stop after this many updates",
    "max_minutes": "stop after this much training wall time (validation included)",
    "max_epochs": "stop after this many epochs",
    "eval_every": "validate every N steps",
    "eval_bleu_sentences": "greedy BLEU on the first N validation pairs (0: loss only)",
    "best_metric": "what selects best/",
    "save_every": "resumable snapshot every N steps",
    "save_every_minutes": "also snapshot after this many minutes",
    "average_last": "snapshots kept and averaged into averaged/ (§6.1)",
    "log_every": "log the training loss every N steps",
}


def _error(args: argparse.Namespace, message: str) -> NoReturn:
    parser: argparse.ArgumentParser = args.parser
    parser.error(message)


def _parse_type(annotation: str) -> Any:
    base = annotation.split("|")[0].strip()
    kind = {"int": int, "float": float}.get(base, str)
    if "None" not in annotation:
        return kind

    def parse(text: str) -> Any:
        return None if text.lower() in ("none", "null") else kind(text)

    parse.__name__ = base
    return parse


def add_translate_parsers(tasks: Any, commands: Any) -> None:
    """Add ``train translate`` to ``tasks`` and ``translate`` to ``commands`` (argparse
    sub-parser actions of ``attnlab train`` and of ``attnlab``)."""
    p = tasks.add_parser(
        "translate",
        help="train an encoder-decoder translation model (Multi30k de->en by default)",
        description=(
            "Train the paper's encoder-decoder on a parallel corpus (Multi30k layout: "
            "<split>.<lang>[.gz]) with a joint BPE vocabulary, the §5 recipe, periodic "
            "validation, best/last/averaged checkpoints and exact resume."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--src", default="de", help="source language")
    p.add_argument("--tgt", default="en", help="target language")
    p.add_argument("--data", default=None, help="data directory (default $ATTNLAB_DATA/multi30k)")
    p.add_argument("--out", default=None, help="run directory (default runs/translate-SRC-TGT)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--no-label-smoothing", action="store_true", help="same as --label-smoothing 0")
    p.add_argument(
        "--ignore-memory-check", action="store_true", help="train even if the estimate exceeds RAM"
    )
    defaults = {"max_minutes": 90.0}  # the budget; the library has no default budget
    for f in dataclasses.fields(TranslateConfig):
        if f.name in _HELP:
            choices = ("bleu", "loss") if f.name == "best_metric" else None
            choices = ("pre", "post") if f.name == "norm_position" else choices
            p.add_argument(
                "--" + f.name.replace("_", "-"),
                type=_parse_type(str(f.type)),
                choices=choices,
                default=defaults.get(f.name, f.default),
                help=_HELP[f.name],
            )
    p.set_defaults(func=run_train_translate, parser=p)

    q = commands.add_parser(
        "translate",
        help="translate text (stdin -> stdout) or score a test set with sacreBLEU",
        description=(
            "Translate stdin line by line to stdout with a model directory written by "
            "'attnlab train translate' (a run directory: averaged/, else best/, else last/), or "
            "with --eval SPLIT translate a data split and report sacreBLEU (cased and "
            "lowercased, with signatures)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    q.add_argument("model", help="run directory or model directory")
    q.add_argument("--checkpoint", choices=["averaged", "best", "last"], default=None)
    q.add_argument("--beam", type=int, default=4, help="beam size (§6.1: 4)")
    q.add_argument("--alpha", type=float, default=0.6, help="GNMT length penalty (§6.1: 0.6)")
    q.add_argument("--greedy", action="store_true", help="greedy decoding (same as --beam 1)")
    q.add_argument("--batch-size", type=int, default=64, help="sentences decoded together")
    q.add_argument("--eval", metavar="SPLIT", default=None, help="score this split instead")
    q.add_argument("--data", default=None, help="data directory (default: the run's)")
    q.add_argument("--src", default=None, help="source language (default: the model's)")
    q.add_argument("--tgt", default=None, help="target language (default: the model's)")
    q.add_argument("--output", default=None, help="--eval: also write the translations here")
    q.add_argument("--json", default=None, help="--eval: also write the scores as JSON here")
    q.set_defaults(func=run_translate, parser=q)


def run_train_translate(args: argparse.Namespace) -> int:
    """``attnlab train translate``."""
    from attnlab.translation.train import train_translation

    values = {name: getattr(args, name) for name in _HELP}
    if args.no_label_smoothing:
        values["label_smoothing"] = 0.0
    out = args.out or f"runs/translate-{args.src}-{args.tgt}"
    try:
        config = TranslateConfig(
            src=args.src, tgt=args.tgt, progress=not args.no_progress, **values
        )
        if not args.ignore_memory_check:  # before any data is read; a MemoryLimitError exits 2
            from attnlab.analysis.memory_check import check_training_fits

            # the largest batch: max_tokens padded tokens as sequences of the full length
            batch = max(1, config.max_tokens // config.max_len)
            check_training_fits(config.model_config(config.vocab_size), batch)
        command = "attnlab " + " ".join(sys.argv[1:]) if sys.argv else ""
        run = train_translation(
            config, args.data, out, resume=args.resume, extra={"command": command}
        )
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        _error(args, str(e))
    except KeyboardInterrupt:
        from attnlab.translation.checkpoints import latest_snapshot

        snapshot = latest_snapshot(out)
        where = f"from {snapshot.name}" if snapshot else "(no snapshot was written yet)"
        print(f"interrupted; continue with the same command and --resume {where}", file=sys.stderr)
        return 130
    print(
        f"trained {run.step} steps ({run.epoch} full epochs, stopped by {run.stopped_by}) in "
        f"{run.seconds / 60:.1f} min; {run.tokens:,} target / {run.src_tokens:,} source tokens; "
        f"{run.n_params:,} parameters"
    )
    for name, scores in run.final.items():
        shown = ", ".join(f"{k} {v:.3f}" for k, v in scores.items())
        print(f"{name}: {shown}")
    print(f"best (step {run.best['best_step']}): {run.best['best_metrics']}")
    print(f"models: {run.out}/averaged, {run.out}/best, {run.out}/last")
    return 0


def run_translate(args: argparse.Namespace) -> int:
    """``attnlab translate``."""
    from attnlab.translation.data import load_pairs
    from attnlab.translation.evaluate import load_translator, score_bleu, translate

    beam = 1 if args.greedy else args.beam
    if beam < 1 or args.batch_size < 1:
        _error(args, f"--beam and --batch-size must be >= 1, got {beam}, {args.batch_size}")
    try:
        t = load_translator(args.model, args.checkpoint)
        if args.eval is None:
            lines = sys.stdin.read().splitlines()
            for line in translate(
                t.model, t.tokenizer, lines, beam=beam, alpha=args.alpha, batch_size=args.batch_size
            ):
                print(line)
            return 0
        src = args.src or t.info.get("src")
        tgt = args.tgt or t.info.get("tgt")
        data = args.data or t.info.get("data")
        if not (src and tgt):
            _error(args, f"{t.path} does not record its languages: pass --src and --tgt")
        pairs = load_pairs(data, args.eval, src, tgt)
        start = time.monotonic()
        hyps = translate(
            t.model,
            t.tokenizer,
            [s for s, _ in pairs],
            beam=beam,
            alpha=args.alpha,
            batch_size=args.batch_size,
        )
        seconds = time.monotonic() - start
        scores = score_bleu(hyps, [r for _, r in pairs])
    except (ValueError, FileNotFoundError) as e:
        _error(args, str(e))
    decoding = f"beam {beam} (alpha {args.alpha})" if beam > 1 else "greedy"
    print(
        f"{args.eval} {src}->{tgt}: {len(pairs)} sentences, {decoding}, {t.path} "
        f"(step {t.info.get('step', '?')}), {seconds:.1f} s"
    )
    print(f"BLEU (cased)      = {scores.bleu:.2f}  {scores.signature}")
    print(f"BLEU (lowercased) = {scores.bleu_lowercase:.2f}  {scores.signature_lowercase}")
    print(scores.detail)
    if args.output:
        Path(args.output).write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    if args.json:
        record = {
            "split": args.eval,
            "src": src,
            "tgt": tgt,
            "model": str(t.path),
            "step": t.info.get("step"),
            "decoding": decoding,
            "beam": beam,
            "alpha": args.alpha,
            "seconds": seconds,
            **scores.to_dict(),
        }
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return 0


__all__ = ["add_translate_parsers", "run_train_translate", "run_translate"]
