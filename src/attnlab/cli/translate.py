"""``attnlab translate``: translate text with a trained translation run, or score a test set.

    attnlab translate runs/de-en [--beam 4 --alpha 0.6 | --greedy] < input.de > output.en
    attnlab translate runs/de-en --eval test_2016_flickr [--data DIR] [--json scores.json]

``MODEL`` is a run directory of ``attnlab train translate`` (its ``averaged/``, else ``best/``,
else ``last/`` model) or one of those model directories. Stdin is read as UTF-8 and translated
line by line, one output line per input line (a non-empty line the model translates to nothing
stays an empty line, with a note on stderr); with ``--eval SPLIT`` the split's source side is
translated and scored with sacreBLEU (cased and lowercased, with signatures). Output files
(``--output``, ``--json``) are checked to be writable before anything is decoded; a batch of
beams whose estimated memory exceeds the memory available is refused before it is decoded
(``--ignore-memory-check``).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any

from attnlab.cli.common import check_writable, fail, guarded
from attnlab.cli.quantize import add_quantize_argument, quantize_loaded
from attnlab.io import atomic_write_json, atomic_write_text


def add_parser(commands: Any) -> None:
    """The ``translate`` command."""
    q = commands.add_parser(
        "translate",
        help="translate text (stdin -> stdout) or score a test set with sacreBLEU",
        description=(
            "Translate stdin line by line to stdout with a model directory written by "
            "'attnlab train translate' (a run directory: averaged/, else best/, else last/), or "
            "with --eval SPLIT translate a data split and report sacreBLEU (cased and "
            "lowercased, with signatures)."
        ),
    )
    q.add_argument("model", help="run directory or model directory")
    q.add_argument(
        "--checkpoint",
        choices=["averaged", "best", "last"],
        default=None,
        help="which model of a run directory (default: averaged, else best, else last)",
    )
    q.add_argument("--beam", type=int, default=4, help="beam size (default 4, as §6.1)")
    q.add_argument(
        "--alpha", type=float, default=0.6, help="GNMT length penalty (default 0.6, as §6.1)"
    )
    q.add_argument("--greedy", action="store_true", help="greedy decoding (same as --beam 1)")
    q.add_argument(
        "--batch-size", type=int, default=64, help="sentences decoded together (default 64)"
    )
    q.add_argument("--eval", metavar="SPLIT", default=None, help="score this split instead")
    q.add_argument(
        "--limit", type=int, default=None, help="--eval: only the first N sentences of the split"
    )
    q.add_argument("--no-progress", action="store_true", help="--eval: no progress bar")
    q.add_argument("--data", default=None, help="data directory (default: the run's)")
    q.add_argument("--src", default=None, help="source language (default: the model's)")
    q.add_argument("--tgt", default=None, help="target language (default: the model's)")
    q.add_argument("--output", default=None, help="--eval: also write the translations here")
    q.add_argument("--json", default=None, help="--eval: also write the scores as JSON here")
    add_quantize_argument(q)  # --quantize int8|int4 (attnlab.cli.quantize)
    q.add_argument(
        "--ignore-memory-check", action="store_true",
        help="decode even if a batch's memory estimate exceeds the available memory",
    )  # fmt: skip
    q.set_defaults(func=guarded("attnlab translate", run_translate))


@contextlib.contextmanager
def _flagged() -> Iterator[None]:
    """A decoding call's memory refusal said with this command's flags."""
    from attnlab.analysis.memory_check import MemoryLimitError
    from attnlab.generation.memory import OPTION

    try:
        yield
    except MemoryLimitError as e:
        fail(
            str(e)
            .replace(OPTION, "--ignore-memory-check")
            .replace("use a smaller model, batch or length", "use a smaller --beam or --batch-size")
        )


def _read_stdin() -> list[str]:
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # already text (a test's StringIO)
        return sys.stdin.read().splitlines()
    data = buffer.read()
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        fail(f"standard input is not UTF-8 text (byte {e.start}); convert it first")


def _note_empty(sources: list[str], translations: list[str]) -> None:
    """A note on stderr for the non-empty lines the model translated to nothing (an
    undertrained model often ends every sentence at once)."""
    from attnlab.cli.generate import note_empty

    empty = [f"line {i}" for i, (s, t) in enumerate(zip(sources, translations, strict=True), 1)
             if s.strip() and not t.strip()]  # fmt: skip
    note_empty("attnlab translate", empty, noun="translation")


def run_translate(args: argparse.Namespace) -> int:
    """``attnlab translate``."""
    from attnlab.training.recipes.translation import load_translator
    from attnlab.translation.data import load_pairs
    from attnlab.translation.evaluate import score_bleu, translate

    beam = 1 if args.greedy else args.beam
    if beam < 1 or args.batch_size < 1:
        fail(f"--beam and --batch-size must be >= 1, got {beam}, {args.batch_size}")
    if args.limit is not None and args.limit < 1:
        fail(f"--limit must be >= 1, got {args.limit}")
    check_writable(args.output, what="--output")
    check_writable(args.json, what="--json")
    t = load_translator(args.model, args.checkpoint)
    quantize_loaded(t.model, args.quantize, args.model)  # --quantize (cli.quantize)
    check = {"memory_check": not args.ignore_memory_check}
    if args.eval is None:
        lines = _read_stdin()
        with _flagged():
            out = translate(t.model, t.tokenizer, lines, beam=beam, alpha=args.alpha,
                            batch_size=args.batch_size, **check)  # fmt: skip
        for line in out:
            print(line)
        sys.stdout.flush()
        _note_empty(lines, out)  # stdout stays one line per input line
        return 0
    src = args.src or t.info.get("src")
    tgt = args.tgt or t.info.get("tgt")
    data = args.data or t.info.get("data")
    if not (src and tgt):
        fail(f"{t.path} does not record its languages: pass --src and --tgt")
    pairs = load_pairs(data, args.eval, src, tgt)[: args.limit]
    start = time.monotonic()
    with _flagged():
        hyps = translate(
            t.model,
            t.tokenizer,
            [s for s, _ in pairs],
            beam=beam,
            alpha=args.alpha,
            batch_size=args.batch_size,
            progress=not args.no_progress,
            **check,
        )
    seconds = time.monotonic() - start
    _note_empty([s for s, _ in pairs], hyps)
    scores = score_bleu(hyps, [r for _, r in pairs])
    decoding = f"beam {beam} (alpha {args.alpha})" if beam > 1 else "greedy"
    qconfig = getattr(t.model, "quantization_config", None)  # --quantize or a quantized model
    weights = "float32" if qconfig is None else f"{qconfig.format} weights"
    print(
        f"{args.eval} {src}->{tgt}: {len(pairs)} sentences, {decoding}, {weights}, {t.path} "
        f"(step {t.info.get('step', '?')}), {seconds:.1f} s"
    )
    print(f"BLEU (cased)      = {scores.bleu:.2f}  {scores.signature}")
    print(f"BLEU (lowercased) = {scores.bleu_lowercase:.2f}  {scores.signature_lowercase}")
    print(scores.detail)
    if args.output:
        atomic_write_text(args.output, "".join(h + "\n" for h in hyps))
    if args.json:
        record = {
            "split": args.eval,
            "src": src,
            "tgt": tgt,
            "model": str(t.path),
            "step": t.info.get("step"),
            "decoding": decoding,
            "weights": weights,
            "beam": beam,
            "alpha": args.alpha,
            "seconds": seconds,
            **scores.to_dict(),
        }
        atomic_write_json(args.json, record)
    return 0


__all__ = ["add_parser", "run_translate"]
