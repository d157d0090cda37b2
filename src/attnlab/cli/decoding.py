"""The decoding flags that ``attnlab generate`` and ``attnlab sample`` share.

They are the fields of :class:`~attnlab.generation.GenerationConfig` (``--max-new-tokens``,
``--temperature``, ``--top-k``, ``--top-p``, ``--min-p``, ``--num-beams``, ``--length-penalty``,
``--length-norm``, ``--num-return-sequences``, ``--eos-id``, ``--context``, ...,
``--ignore-memory-check``: ``memory_check=False``) plus the seed of the sampling generator (an
integer in ``[0, 2**64 - 1]``); the two commands differ only in their defaults (``sample``
samples 200 tokens at temperature 0.8, ``generate`` decodes 64 greedily unless a sampling flag
is given).
Errors speak of these flags, not of the Python arguments.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from attnlab.analysis.memory_check import MemoryLimitError
from attnlab.cli.common import fail
from attnlab.generation import ContextLengthError, GenerationConfig
from attnlab.generation.memory import OPTION as MEMORY_OPTION


def ids(text: str) -> list[int]:
    """``"1,2 3"`` -> ``[1, 2, 3]`` (argparse type)."""
    try:
        return [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected token ids like 1,2,3; got {text!r}") from None


def seed_value(text: str) -> int:
    """A sampling seed: an integer in ``[0, 2**64 - 1]``, what ``torch.Generator.manual_seed``
    takes (argparse type; a larger one would fail there naming no flag)."""
    from attnlab.config import SEED_RANGE

    lo, hi = SEED_RANGE
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not lo <= value <= hi:
        raise argparse.ArgumentTypeError(
            f"expected an integer in [0, 2**64 - 1] ({hi}), got {text!r}"
        )
    return value


def add_decoding_arguments(
    p: argparse.ArgumentParser, *, max_new_tokens: int, temperature: float | None, seed: int | None
) -> None:
    """Add the decoding flags to ``p`` (defaults as given)."""
    dec = p.add_argument_group("decoding")
    dec.add_argument("--max-new-tokens", type=int, default=max_new_tokens, help="tokens to add")
    dec.add_argument("--do-sample", action="store_true", help="sample (implied by the filters)")
    dec.add_argument("--greedy", action="store_true", help="arg-max decoding, no sampling")
    dec.add_argument("--temperature", type=float, default=temperature, help="0: greedy")
    dec.add_argument("--top-k", type=int, default=None)
    dec.add_argument("--top-p", type=float, default=None)
    dec.add_argument("--min-p", type=float, default=None)
    dec.add_argument(
        "--seed", type=seed_value, default=seed,
        help="seed of the sampling generator, an integer in [0, 2**64 - 1]",
    )  # fmt: skip
    dec.add_argument("--num-beams", type=int, default=1, help="> 1: beam search")
    dec.add_argument("--length-penalty", type=float, default=0.6, help="beam search α")
    dec.add_argument("--length-norm", default="gnmt", choices=["gnmt", "power"])
    dec.add_argument("--num-return-sequences", type=int, default=1)
    dec.add_argument("--eos-id", type=ids, default=None, help="stop ids (default: the model's)")
    dec.add_argument("--no-eos", action="store_true", help="never stop before --max-new-tokens")
    dec.add_argument(
        "--context", choices=["slide", "truncate", "error"], default="slide",
        help="past the model's context: slide a window over the text (decoder-only; nanoGPT's "
        "cropping), shorten --max-new-tokens, or stop with an error",
    )  # fmt: skip
    dec.add_argument("--truncate", action="store_true", help="same as --context truncate")
    dec.add_argument("--no-cache", action="store_true", help="recompute the prefix each step")
    dec.add_argument(
        "--ignore-memory-check", action="store_true",
        help="generate even if the memory estimate exceeds the available memory",
    )  # fmt: skip
    dec.add_argument(
        "--engine",
        default="auto",
        choices=["auto", "eager", "fused"],
        help="what runs the decoding steps: the model's modules (eager), the fused CPU engine "
        "(fused), or whichever pays (auto); the tokens are the same",
    )


def decoding_config(
    args: argparse.Namespace, *, default_seed: int | None = None
) -> tuple[GenerationConfig, torch.Generator | None]:
    """The :class:`GenerationConfig` and the sampling generator the flags ask for (seeded by
    ``--seed``, else ``default_seed``, else at random).

    Raises:
        CommandError: for flags that contradict each other, or a bad value (naming the flag).
    """
    filters = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
               "min_p": args.min_p}  # fmt: skip
    given = {k: v for k, v in filters.items() if v is not None}
    sample = (args.do_sample or bool(given)) and not args.greedy
    beams = args.num_beams != 1
    if beams and (args.do_sample or given):
        fail("beam search does not sample: drop the sampling options (--temperature, --top-k, "
             "--top-p, --min-p, --do-sample)")  # fmt: skip
    if args.seed is not None and not sample:
        fail("--seed only matters when sampling")
    options: dict[str, Any] = dict(
        max_new_tokens=args.max_new_tokens, num_return_sequences=args.num_return_sequences,
        eos_id=() if args.no_eos else (tuple(args.eos_id) if args.eos_id else None),
        use_cache=not args.no_cache, context="truncate" if args.truncate else args.context,
        engine=getattr(args, "engine", "auto"),
        memory_check=not getattr(args, "ignore_memory_check", False),
    )  # fmt: skip
    if beams:
        options.update(num_beams=args.num_beams, length_penalty=args.length_penalty,
                       length_norm=args.length_norm)  # fmt: skip
    elif sample:
        options.update(do_sample=True, **given)
    try:
        config = GenerationConfig(**options)
    except (ValueError, TypeError) as e:
        fail(_flags(str(e)))
    generator = None
    if sample:
        generator = torch.Generator()
        seed = args.seed if args.seed is not None else default_seed
        if seed is not None:
            generator.manual_seed(seed)
        else:
            generator.seed()
    return config, generator


_NAMES = ("max_new_tokens", "num_return_sequences", "num_beams", "length_penalty", "top_k",
          "top_p", "min_p", "temperature", "eos_id", "do_sample")  # fmt: skip


def engine_line(model: Any, config: GenerationConfig, rows: int, max_new_tokens: int) -> str:
    """The decode engine a command's call runs on, said in one line (its header, on stderr).

    Raises:
        CommandError: for ``--engine fused`` on a model the fused engine cannot run.
    """
    from attnlab.generation.engines import resolve_engine

    try:
        choice = resolve_engine(model, config.engine, rows=rows, max_new_tokens=max_new_tokens,
                                use_cache=config.use_cache)  # fmt: skip
    except ValueError as e:
        message = str(e).replace("engine='fused'", "--engine fused")
        fail(message.replace("use 'eager'", "use --engine eager"))
    return choice.describe()


def _flags(message: str) -> str:
    """``message`` with the Python argument names of generation written as flags."""
    for name in _NAMES:
        message = message.replace(name, "--" + name.replace("_", "-"))
    message = message.replace(MEMORY_OPTION, "--ignore-memory-check")
    return message.replace("context='truncate'", "--context truncate").replace(
        "context='slide'", "--context slide"
    )


def context_message(e: ContextLengthError | MemoryLimitError) -> str:
    """A :class:`ContextLengthError` (or the decoding call's ``MemoryLimitError``) said with
    the command's flags."""
    return _flags(str(e))


__all__ = [
    "add_decoding_arguments",
    "context_message",
    "decoding_config",
    "engine_line",
    "ids",
    "seed_value",
]
