"""``attnlab sample RUN_DIR --prompt TEXT``: sample text from a trained language-model run.

``attnlab generate`` with a language model's defaults: 200 new tokens, sampled at temperature
0.8 with a fixed seed (0), the prompt echoed, the context sliding past the model's
``max_seq_len`` as nanoGPT's sampling does. The decoding flags are ``generate``'s
(:mod:`attnlab.cli.decoding`); ``--greedy`` decodes by arg-max. As ``generate``, a run whose
estimated memory exceeds the available RAM exits with status 2 (``--ignore-memory-check``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from attnlab.analysis.memory_check import MemoryLimitError
from attnlab.cli.common import fail, guarded
from attnlab.cli.decoding import (
    add_decoding_arguments,
    context_message,
    decoding_config,
    engine_line,
)
from attnlab.cli.quantize import add_quantize_argument, quantize_loaded
from attnlab.cli.speculative import add_speculative_arguments, decode, load_draft  # issue 27
from attnlab.generation import ContextLengthError


def add_parser(commands: Any) -> None:
    """The ``sample`` command."""
    p = commands.add_parser(
        "sample",
        help="sample text from a trained language-model run",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument("run", help="run directory (runs/NAME), one of its checkpoints or exports")
    p.add_argument("--prompt", default="\n", help="text to continue (default: a new line)")
    add_decoding_arguments(p, max_new_tokens=200, temperature=None, seed=None)
    add_speculative_arguments(p)  # --draft, --num-draft-tokens
    add_quantize_argument(p)  # --quantize int8|int4 (attnlab.cli.quantize)
    p.set_defaults(func=guarded("attnlab sample", run_sample))


def run_sample(args: argparse.Namespace) -> int:
    """Print the prompt and its continuation."""
    import attnlab
    from attnlab.cli.generate import _check_memory, note_empty, resolve
    from attnlab.models.family import find_family

    if not args.greedy and args.temperature is None and args.num_beams == 1:
        args.temperature = 0.8  # sampling by default
    config, generator = decoding_config(args, default_seed=0)
    directory, tokenizer = resolve(args.run, None)
    if tokenizer is None:
        fail(f"{args.run} has no tokenizer.json: sample needs a language-model run")
    prompt = tokenizer.encode(args.prompt)
    if prompt and not args.ignore_memory_check:  # before loading (the call checks again)
        _check_memory(directory, "cpu", [prompt], config, args.quantize)
    model = attnlab.from_pretrained(directory)
    family = find_family(model)
    if family is None or not family.kind.language_model:
        fail(
            f"{args.run} holds a {type(model).__name__}, not a language model "
            "(a causal LM such as GPT, or a recurrent one: Mamba, LSTM/GRU)"
        )
    model = quantize_loaded(model, args.quantize, args.run)  # --quantize (cli.quantize)
    draft = load_draft(args, model, tokenizer, config, "cpu")  # --draft (speculative decoding)
    if not prompt:
        fail("--prompt is empty: give at least one character to continue")
    rows = max(config.num_beams, config.num_return_sequences)
    print(f"engine: {engine_line(model, config, rows, config.max_new_tokens)}", file=sys.stderr)
    try:
        out = decode(model, [prompt], config, generator, args, draft)
    except (ContextLengthError, MemoryLimitError) as e:
        fail(context_message(e))
    continuation = tokenizer.decode(out[0].tolist())
    print(args.prompt + continuation, flush=True)
    note_empty("attnlab sample", [] if continuation else ["the prompt"])
    return 0


__all__ = ["add_parser", "run_sample"]
