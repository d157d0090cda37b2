"""``attnlab generate``: text (or token ids) from a model or run directory, streamed as it comes.

    attnlab generate MODEL_DIR --prompt "Once upon a time" --max-new-tokens 64
    attnlab generate runs/shakespeare-char --prompt "ROMEO:" --temperature 0.8 --seed 0
    attnlab generate MODEL_DIR --prompt "..." --num-beams 4 --num-return-sequences 2
    attnlab generate MODEL_DIR --ids 5,17,42 --max-new-tokens 16     # no tokenizer
    attnlab generate RUN --prompt "ROMEO:" --draft DRAFT_RUN --num-draft-tokens 4   # speculative

``MODEL_DIR`` is anything :func:`attnlab.from_pretrained` loads (attnlab's format or a Hugging
Face directory), or a run directory of ``attnlab train`` (its newest checkpoint). With a
tokenizer (the directory's ``tokenizer.json``, the run's, or ``--tokenizer``), ``--prompt`` is
text and the output is streamed token by token (one prompt, greedy or sampling); without one,
prompts are ids (``--ids``, repeatable) and ids are printed. Any of
``--temperature/--top-k/--top-p/--min-p`` switches sampling on (``--temperature 0``: greedy).
For an encoder-decoder model the prompt is the source, and it gets the model's EOS id at its end
when it does not end with it (attnlab's recipes and Hugging Face's seq2seq tokenizers train on
sources that end in EOS; ``--no-source-eos`` passes the ids as given). A long generation slides
its context like nanoGPT (``--context``); the decoding flags are :mod:`attnlab.cli.decoding`'s.
A run whose estimated memory (weights, KV cache, token buffers, a step's ``(rows, vocabulary)``
tensors and beam search's candidates, prefill, decoding copies) exceeds the available RAM exits
with status 2, before the model is loaded and again before the call allocates, unless
``--ignore-memory-check`` is given; so does a model whose weights
are not what its config says (a ``config.json`` edited after saving, tensor data changed, int or
bool tensors for float parameters: :func:`attnlab.from_pretrained`'s checks, naming the
mismatch), unless ``--no-verify`` is given. ``--quantize int8|int4``
quantizes the weights after loading (:mod:`attnlab.cli.quantize`); a quantized model directory
(``attnlab quantize``) loads as it is. ``--engine auto|eager|fused`` picks what runs the decoding
steps (:mod:`attnlab.generation.engines`); the first line on stderr says which one runs and why,
and ``--json`` prints it with the outputs as one JSON object.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, cast

from attnlab.analysis.memory_check import MemoryLimitError
from attnlab.cli.common import add_verify_argument, check_device, fail, guarded
from attnlab.cli.decoding import (
    add_decoding_arguments,
    context_message,
    decoding_config,
    engine_line,
    ids,
)
from attnlab.cli.quantize import add_quantize_argument, generation_estimate, quantize_loaded
from attnlab.cli.speculative import (  # speculative decoding (issue 27)
    add_speculative_arguments,
    decode,
    draft_options,
    load_draft,
    print_summary,
)
from attnlab.generation import ContextLengthError, GenerationConfig
from attnlab.training.hardware import PRECISIONS, Precision


def add_parser(commands: Any) -> None:
    """The ``generate`` command."""
    p = commands.add_parser(
        "generate",
        help="generate text from a model or run (greedy, sampling or beam search)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("model", help="model directory (attnlab or Hugging Face) or run directory")
    src = p.add_argument_group("prompt")
    src.add_argument("--prompt", action="append", help="prompt text (repeat for a batch)")
    src.add_argument("--ids", type=ids, action="append", help="prompt token ids, e.g. 1,2,3")
    src.add_argument("--tokenizer", help="tokenizer.json (default: the model's or run's, if any)")
    src.add_argument(
        "--no-source-eos",
        action="store_true",
        help="encoder-decoders: do not end each source with the model's EOS id",
    )
    add_decoding_arguments(p, max_new_tokens=64, temperature=None, seed=None)
    add_speculative_arguments(p)  # --draft, --num-draft-tokens
    p.add_argument("--no-stream", action="store_true", help="print only at the end")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: the decode engine, the options and every output",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, mps or auto")
    p.add_argument(
        "--precision",
        default="fp32",
        choices=PRECISIONS,
        help="fp32; bf16-mixed/fp16-mixed: autocast; bf16: bfloat16 weights (as training)",
    )
    add_quantize_argument(p)  # --quantize int8|int4 (attnlab.cli.quantize)
    # --ignore-memory-check: a decoding flag (attnlab.cli.decoding), sample's too
    add_verify_argument(p)  # --no-verify (the model and the --draft)
    p.set_defaults(func=guarded("attnlab generate", run_generate))


def resolve(path: str, tokenizer: str | None) -> tuple[Path, Any]:
    """The model directory of a model/run directory and its tokenizer (``None`` without one)."""
    from attnlab.tokenizers import load_tokenizer
    from attnlab.training.rundir import find_tokenizer, resolve_model_directory

    directory = resolve_model_directory(path)
    tok_file = Path(tokenizer) if tokenizer is not None else find_tokenizer(directory)
    return directory, (load_tokenizer(tok_file) if tok_file is not None else None)


def _stream_text(
    model: Any, tokenizer: Any, prompt: list[int], config: GenerationConfig, generator: Any,
    echo: bool, draft: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    """Print the text as it is produced. Each step decodes the whole sequence (after the echoed
    prompt, if any) and prints what is new, so spaces between pieces and characters spread
    over several tokens come out right."""
    from attnlab.generation import stream

    prefix = list(prompt) if echo else []
    shown = tokenizer.decode(prefix, skip_special_tokens=True) if prefix else ""
    echoed = shown
    sys.stdout.write(shown)
    out = prefix
    steps = stream(model, [prompt], config, generator=generator, **(draft or {}))
    for step in steps:
        out.append(int(step.tokens[0]))
        text = tokenizer.decode(out, skip_special_tokens=True)
        if text.startswith(shown):  # otherwise wait: a piece is still being merged
            sys.stdout.write(text[len(shown) :])
            sys.stdout.flush()
            shown = text
    sys.stdout.write("\n")
    sys.stdout.flush()
    print_summary(getattr(steps, "stats", None))  # with a draft: its acceptance statistics
    note_empty("attnlab generate", ["the prompt"] if shown == echoed else [])


EMPTY_REASON = "EOS came first, or only tokens without text; a short training run?"


def note_empty(prog: str, empty: list[str], noun: str = "output") -> None:
    """One note on stderr naming the outputs (``line 3``, ``output [1]``) the model left empty for a
    non-empty input: stdout keeps its empty lines (one per input) and the exit status stays 0,
    but an empty line alone looks like a bug of the command rather than of an undertrained
    model."""
    if not empty:
        return
    shown = ", ".join(empty[:5]) + (f" and {len(empty) - 5} more" if len(empty) > 5 else "")
    what = f"an empty {noun}" if len(empty) == 1 else f"empty {noun}s"
    print(f"{prog}: note: the model produced {what} for {shown} ({EMPTY_REASON})",
          file=sys.stderr)  # fmt: skip


def _check_memory(
    directory: Path, device: str, prompts: list[list[int]], config: GenerationConfig,
    quantize: str | None = None,
) -> None:  # fmt: skip
    """Refuse before loading when the weights, KV cache, token buffers, a step's tensors (beam
    search's candidates) and prefill cannot fit in RAM: the model the config describes is
    estimated in full (attnlab's, or a Hugging Face one read from its config and safetensors
    headers) with the sizes the call will have after the context policy; a ``.bin``
    checkpoint by its files' size. (The decoding call checks again once the model is loaded:
    ``GenerationConfig.memory_check``, off with ``--ignore-memory-check``.)"""
    from attnlab.analysis.memory_check import MemoryEstimate, check_fits
    from attnlab.generation.memory import planned_sizes
    from attnlab.interop.hf import hf_model_config, read_config
    from attnlab.models import config_from_json_dict
    from attnlab.pretrained import is_attnlab_config

    data = read_config(directory)
    model_config = (
        config_from_json_dict(data) if is_attnlab_config(data) else hf_model_config(directory)
    )
    if model_config is not None:
        # the sizes the call will have: max_new_tokens and the cache after the context policy
        sizes = planned_sizes(model_config, max(1, *map(len, prompts)), config)
        if not sizes:  # the context policy refuses the call: it fails later, naming the policy
            return
        # float32, a quantized directory or --quantize: attnlab.cli.quantize
        estimate = generation_estimate(
            directory, model_config, quantize=quantize, cpu=device.startswith("cpu"),
            engine=config.engine, batch=len(prompts), **sizes,
        )  # fmt: skip
    else:
        files = [f for f in directory.iterdir() if f.suffix in (".safetensors", ".bin")]
        estimate = MemoryEstimate(
            f"loading {directory}", {"weights": sum(f.stat().st_size for f in files)}
        )
    check_fits(estimate)


def _prompts(args: argparse.Namespace, tokenizer: Any) -> list[list[int]]:
    if args.prompt and args.ids:
        fail("pass --prompt or --ids, not both")
    if args.prompt:
        if tokenizer is None:
            fail(f"no tokenizer.json for {args.model}: pass --tokenizer, or token ids (--ids)")
        prompts = [tokenizer.encode(text) for text in args.prompt]
        empty = [repr(t) for t, p in zip(args.prompt, prompts, strict=True) if not p]
        if empty:
            fail(f"--prompt {empty[0]} has no tokens: give some text to continue")
        return prompts
    if args.ids:
        return [list(i) for i in args.ids]
    fail("pass --prompt TEXT or --ids 1,2,3")


def run_generate(args: argparse.Namespace) -> int:
    """``attnlab generate``: 0, or 2 with one ``error:`` line on bad input."""
    import torch

    import attnlab
    from attnlab.generation.request import prepare_request, resolve_eos
    from attnlab.models.family import Kind, find_family

    config, generator = decoding_config(args)
    device = check_device(args.device)
    directory, tokenizer = resolve(args.model, args.tokenizer)
    prompts = _prompts(args, tokenizer)
    if not args.ignore_memory_check:
        _check_memory(directory, device, prompts, config, args.quantize)
        if args.draft is not None:
            from attnlab.training.rundir import resolve_model_directory

            _check_memory(resolve_model_directory(args.draft), device, prompts, config)
    model = attnlab.from_pretrained(directory, device=device, verify=not args.no_verify)
    family = find_family(model)
    if family is None or not family.kind.generates:
        fail(f"{args.model} holds a {type(model).__name__}, which does not generate")
    seq2seq = family.kind is Kind.SEQ2SEQ
    decoder_only = not seq2seq
    if args.quantize is not None and args.precision != "fp32":
        fail(f"--quantize computes in float32; it does not combine with --precision "
             f"{args.precision}")  # fmt: skip
    qconfig = getattr(model, "quantization_config", None)  # a quantized model directory
    if qconfig is not None and args.precision != "fp32":  # before a prompt is printed
        fail(f"{args.model} is a quantized model ({qconfig.format} weights), which computes in "
             f"float32; it does not combine with --precision {args.precision} (leave it at "
             "fp32)")  # fmt: skip
    model = quantize_loaded(model, args.quantize, args.model)  # --quantize (cli.quantize)
    precision = Precision(args.precision, torch.device(device))
    precision.prepare_model(model)
    eos = set(resolve_eos(cast(Any, model), config.eos_ids))  # a model that generates
    source_eos = model.config.eos_id if seq2seq else None
    draft = load_draft(args, model, tokenizer, config, device)  # --draft (speculative decoding)
    if source_eos is not None and not args.no_source_eos:
        prompts = [p if p[-1:] == [source_eos] else [*p, source_eos] for p in prompts]
    rows = len(prompts) * max(config.num_beams, config.num_return_sequences)
    try:
        request = prepare_request(model, prompts, config)  # the input's errors come first
        engine = engine_line(model, config, rows, request.max_new_tokens)
        if not args.json:
            print(f"engine: {engine}", file=sys.stderr)  # the header: what decodes
        with precision.autocast():
            if args.json:
                return _emit_json(args, model, prompts, config, generator, draft, tokenizer,
                                  engine)  # fmt: skip
            return _emit(args, model, prompts, config, generator, draft, tokenizer, eos,
                         decoder_only)  # fmt: skip
    except (ContextLengthError, MemoryLimitError) as e:
        fail(context_message(e))


def _emit_json(
    args: argparse.Namespace, model: Any, prompts: list[list[int]], config: Any, generator: Any,
    draft: Any, tokenizer: Any, engine: str,
) -> int:  # fmt: skip
    """``--json``: one object with the engine, the options and every output row (ids, and text
    with a tokenizer; beam scores for beam search)."""
    import json

    from attnlab.generation import beam_search

    scores: list[float] | None = None
    if config.num_beams != 1:
        out = beam_search(model, prompts, config)
        rows = [seq[:n] for seq, n in zip(out.sequences.tolist(), out.lengths.tolist(),
                                          strict=True)]  # fmt: skip
        scores = [float(s) for s in out.scores]
    else:
        rows = decode(model, prompts, config, generator, args, draft).tolist()
    outputs: list[dict[str, Any]] = []
    for i, row in enumerate(rows):
        item: dict[str, Any] = {"ids": row}
        if tokenizer is not None:
            item["text"] = tokenizer.decode(row, skip_special_tokens=True)
        if scores is not None:
            item["score"] = scores[i]
        outputs.append(item)
    print(json.dumps({
        "engine": engine.split(" ", 1)[0], "engine_detail": engine,
        "max_new_tokens": config.max_new_tokens, "num_beams": config.num_beams,
        "do_sample": config.do_sample, "outputs": outputs,
    }, indent=2))  # fmt: skip
    return 0


def _emit(
    args: argparse.Namespace, model: Any, prompts: list[list[int]], config: Any, generator: Any,
    draft: Any, tokenizer: Any, eos: set[int], decoder_only: bool,
) -> int:  # fmt: skip
    """Generate and print (beam search, a streamed text, or rows)."""
    from attnlab.generation import beam_search

    def show(row: list[int]) -> str:
        if tokenizer is None:
            return " ".join(map(str, row))
        return str(tokenizer.decode(row, skip_special_tokens=True))

    def label(i: int, n: int) -> str:
        return f"[{i}] " if n > 1 else ""

    def produced(row: list[int]) -> bool:  # a token before EOS, with text
        kept = row[: next((j for j, t in enumerate(row) if t in eos), len(row))]
        return bool(kept) and (tokenizer is None or bool(show(kept)))

    def empty(rows: list[list[int]]) -> list[str]:
        return [f"output {label(i, 2).strip()}" for i, row in enumerate(rows) if not produced(row)]

    if config.num_beams != 1:
        out = beam_search(model, prompts, config)
        rows = out.sequences.tolist()
        for i, (seq, n) in enumerate(zip(rows, out.lengths.tolist(), strict=True)):
            print(f"{label(i, len(rows))}score={float(out.scores[i]):.4f}  {show(seq[:n])}")
        sys.stdout.flush()
        note_empty("attnlab generate", empty([s[:n] for s, n in zip(rows, out.lengths.tolist(),
                                                                     strict=True)]))  # fmt: skip
        return 0
    one = len(prompts) == 1 and config.num_return_sequences == 1
    if tokenizer is not None and one and not args.no_stream:
        _stream_text(model, tokenizer, prompts[0], config, generator, decoder_only,
                     draft_options(args, draft))  # fmt: skip
        return 0
    rows = decode(model, prompts, config, generator, args, draft).tolist()
    for i, row in enumerate(rows):
        end = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))  # through EOS
        print(f"{label(i, len(rows))}{show(row[:end])}")
    sys.stdout.flush()
    note_empty("attnlab generate", empty(rows))
    return 0


__all__ = ["add_parser", "note_empty", "resolve", "run_generate"]
