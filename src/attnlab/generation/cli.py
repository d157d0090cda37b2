"""``attnlab generate``: text (or token ids) from a checkpoint directory, streamed as it comes.

The main CLI wires it in with :func:`add_generate_subparser` (which sets ``func`` to
:func:`run_generate`)::

    attnlab generate CHECKPOINT_DIR --prompt "Once upon a time" --max-new-tokens 64
    attnlab generate CHECKPOINT_DIR --prompt "..." --temperature 0.8 --top-p 0.95 --seed 0
    attnlab generate CHECKPOINT_DIR --prompt "..." --num-beams 4 --num-return-sequences 2
    attnlab generate CHECKPOINT_DIR --ids 5,17,42 --max-new-tokens 16     # no tokenizer

``CHECKPOINT_DIR`` is anything :func:`attnlab.from_pretrained` loads (attnlab's format or a
Hugging Face directory). With a ``tokenizer.json`` there (or ``--tokenizer``), ``--prompt`` is
text and the output is streamed to the terminal token by token (one prompt, greedy or sampling);
without one, prompts are given as ids (``--ids``, repeatable) and ids are printed. Any of
``--temperature/--top-k/--top-p/--min-p`` switches sampling on (``--temperature 0``: greedy).
For an encoder-decoder model the prompt is the source sentence. Bad input prints one
``error:`` line and returns 2, as does a run whose estimated memory (weights, KV cache, prefill,
decoding copies; :mod:`attnlab.analysis.memory_check`) exceeds the available RAM, unless
``--ignore-memory-check`` is given.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch


def _ids(text: str) -> list[int]:
    """``"1,2 3"`` -> ``[1, 2, 3]`` (argparse type)."""
    try:
        return [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected token ids like 1,2,3; got {text!r}") from None


def add_generate_subparser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``generate`` command to an ``argparse`` sub-parser collection."""
    p = subparsers.add_parser(
        "generate",
        help="generate text from a checkpoint (greedy, sampling or beam search)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("checkpoint", help="checkpoint directory (attnlab or Hugging Face)")
    src = p.add_argument_group("prompt")
    src.add_argument("--prompt", action="append", help="prompt text (repeat for a batch)")
    src.add_argument("--ids", type=_ids, action="append", help="prompt token ids, e.g. 1,2,3")
    src.add_argument("--tokenizer", help="tokenizer.json (default: the checkpoint's, if any)")
    dec = p.add_argument_group("decoding")
    dec.add_argument("--max-new-tokens", type=int, default=64)
    dec.add_argument("--do-sample", action="store_true", help="sample (implied by the filters)")
    dec.add_argument("--temperature", type=float, default=None)
    dec.add_argument("--top-k", type=int, default=None)
    dec.add_argument("--top-p", type=float, default=None)
    dec.add_argument("--min-p", type=float, default=None)
    dec.add_argument("--seed", type=int, default=None, help="seed of the sampling generator")
    dec.add_argument("--num-beams", type=int, default=1, help="> 1: beam search")
    dec.add_argument("--length-penalty", type=float, default=0.6, help="beam search α")
    dec.add_argument("--length-norm", default="gnmt", choices=["gnmt", "power"])
    dec.add_argument("--num-return-sequences", type=int, default=1)
    dec.add_argument("--eos-id", type=_ids, default=None, help="stop ids (default: config's)")
    dec.add_argument("--no-eos", action="store_true", help="never stop before max-new-tokens")
    dec.add_argument("--truncate", action="store_true", help="shorten to fit the context")
    dec.add_argument("--no-cache", action="store_true", help="recompute the prefix each step")
    dec.add_argument("--no-stream", action="store_true", help="print only at the end")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--ignore-memory-check",
        action="store_true",
        help="generate even if the memory estimate exceeds the available RAM",
    )
    p.set_defaults(func=run_generate)
    return p


def _tokenizer(args: argparse.Namespace) -> Any:
    from attnlab.interop.tokenizer import TOKENIZER_NAME, load_tokenizer

    if args.tokenizer is not None:
        return load_tokenizer(args.tokenizer)
    if (Path(args.checkpoint) / TOKENIZER_NAME).is_file():
        return load_tokenizer(args.checkpoint)
    return None


def _options(args: argparse.Namespace) -> dict[str, Any]:
    sampling = {
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": args.min_p,
    }
    given = {k: v for k, v in sampling.items() if v is not None}
    do_sample = args.do_sample or bool(given)
    if args.seed is not None and not do_sample:
        raise ValueError("--seed only matters when sampling")
    opts: dict[str, Any] = dict(
        max_new_tokens=args.max_new_tokens,
        eos_id=() if args.no_eos else args.eos_id,
        num_return_sequences=args.num_return_sequences,
        use_cache=not args.no_cache,
        truncate=args.truncate,
    )
    if args.num_beams != 1:
        opts.update(
            num_beams=args.num_beams,
            length_penalty=args.length_penalty,
            length_norm=args.length_norm,
        )
        if do_sample:
            raise ValueError("beam search does not sample: drop the sampling options")
        return opts
    if do_sample:
        generator = torch.Generator(device=args.device)
        if args.seed is not None:
            generator.manual_seed(args.seed)
        else:
            generator.seed()
        opts.update(do_sample=True, generator=generator, **given)
    return opts


def _stream_text(
    model: Any, tokenizer: Any, prompt: list[int], opts: dict[str, Any], echo: bool
) -> None:
    """Print the text as it is produced. Each step decodes the whole sequence (after the echoed
    prompt, if any) and prints what is new, so spaces between pieces and characters spread
    over several tokens come out right."""
    from attnlab.generation.generate import stream

    prefix = list(prompt) if echo else []
    shown = tokenizer.decode(prefix, skip_special_tokens=True) if prefix else ""
    sys.stdout.write(shown)
    out = prefix
    for step in stream(model, [prompt], **opts):
        out.append(int(step.tokens[0]))
        text = tokenizer.decode(out, skip_special_tokens=True)
        if text.startswith(shown):  # otherwise wait: a piece is still being merged
            sys.stdout.write(text[len(shown) :])
            sys.stdout.flush()
            shown = text
    sys.stdout.write("\n")


def _check_memory(args: argparse.Namespace, prompts: list[list[int]]) -> None:
    """Refuse before loading when the weights, KV cache and prefill cannot fit in RAM (an attnlab
    config is estimated in full; a Hugging Face one by its weight files' size)."""
    from attnlab.analysis.memory_check import MemoryEstimate, check_fits, estimate_generation
    from attnlab.interop.hf import read_config
    from attnlab.models import config_from_json_dict
    from attnlab.pretrained import is_attnlab_config

    data = read_config(args.checkpoint)
    if is_attnlab_config(data):
        estimate = estimate_generation(
            config_from_json_dict(data), batch=len(prompts),
            prompt_len=max(1, *map(len, prompts)), max_new_tokens=max(args.max_new_tokens, 0),
            num_beams=max(args.num_beams, args.num_return_sequences, 1),
            cpu=str(args.device).startswith("cpu"),
        )  # fmt: skip
    else:
        files = [f for f in Path(args.checkpoint).iterdir() if f.suffix in (".safetensors", ".bin")]
        estimate = MemoryEstimate(
            f"loading {args.checkpoint}", {"weights": sum(f.stat().st_size for f in files)}
        )
    check_fits(estimate)


def _generate(args: argparse.Namespace) -> int:
    import attnlab
    from attnlab.generation.beam import beam_search
    from attnlab.generation.generate import generate
    from attnlab.generation.request import resolve_eos

    tokenizer = _tokenizer(args)
    if args.prompt and args.ids:
        raise ValueError("pass --prompt or --ids, not both")
    if args.prompt:
        if tokenizer is None:
            raise ValueError(
                f"no tokenizer.json in {args.checkpoint}: pass --tokenizer, or token ids (--ids)"
            )
        prompts = [tokenizer.encode(text).ids for text in args.prompt]
    elif args.ids:
        prompts = args.ids
    else:
        raise ValueError("pass --prompt TEXT or --ids 1,2,3")
    opts = _options(args)
    if not args.ignore_memory_check:
        _check_memory(args, prompts)
    model = attnlab.from_pretrained(args.checkpoint, device=args.device)
    decoder_only = isinstance(model, attnlab.GPT)
    eos = set(resolve_eos(model, opts["eos_id"]))  # type: ignore[arg-type]

    def show(row: list[int]) -> str:
        if tokenizer is None:
            return " ".join(map(str, row))
        return str(tokenizer.decode(row, skip_special_tokens=True))

    def label(i: int, n: int) -> str:
        return f"[{i}] " if n > 1 else ""

    if args.num_beams != 1:
        out = beam_search(model, prompts, **opts)
        rows = out.sequences.tolist()
        for i, (seq, n) in enumerate(zip(rows, out.lengths.tolist(), strict=True)):
            print(f"{label(i, len(rows))}score={float(out.scores[i]):.4f}  {show(seq[:n])}")
        return 0
    one = len(prompts) == 1 and opts["num_return_sequences"] == 1
    if tokenizer is not None and one and not args.no_stream:
        _stream_text(model, tokenizer, prompts[0], opts, echo=decoder_only)
        return 0
    rows = generate(model, prompts, **opts).tolist()
    for i, row in enumerate(rows):
        end = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))  # through EOS
        print(f"{label(i, len(rows))}{show(row[:end])}")
    return 0


def run_generate(args: argparse.Namespace) -> int:
    """``attnlab generate``: returns 0, or 2 with one ``error:`` line on bad input."""
    try:
        return _generate(args)
    except (ValueError, TypeError, FileNotFoundError, ImportError) as e:
        print(f"attnlab generate: error: {e}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m attnlab.generation.cli CHECKPOINT ...``."""
    parser = argparse.ArgumentParser(prog="attnlab")
    add_generate_subparser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["generate", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["add_generate_subparser", "main", "run_generate"]
