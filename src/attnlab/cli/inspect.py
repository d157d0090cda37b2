"""``attnlab inspect MODEL --text ...``: activations of one forward pass, or the logit lens.

Runs the model (a checkpoint or run directory with its ``tokenizer.json``) on one text or on
token ids and

- with ``--out FILE.safetensors``: writes the activations ``--names`` selects (names or glob
  patterns, default all; ``--dtype`` converts them), one safetensors entry per hook name, the
  input tokens in the file's metadata;
- with ``--lens``: prints the logit lens (language models): the top tokens the residual stream
  predicts after every layer at ``--position`` (default the last);
- with ``--list``: prints every hook name with its shape.

An encoder-decoder model reads ``--text`` as the source and ``--target`` (after BOS) as the
decoder input (default BOS alone).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from attnlab.cli.common import check_writable, fail, guarded

DTYPES = ("float32", "float16", "bfloat16")


def add_parser(commands: Any) -> None:
    """The ``inspect`` command."""
    p = commands.add_parser(
        "inspect",
        help="cache activations of one forward pass, or print the logit lens",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument("model", help="checkpoint or run directory (with tokenizer.json for --text)")
    p.add_argument("--text", help="the input text (an encoder-decoder's source)")
    p.add_argument("--ids", help="comma-separated token ids instead of --text")
    p.add_argument("--target", help="encoder-decoder: the decoder input text after BOS")
    p.add_argument("--tokenizer", help="a tokenizer.json to use instead of the model's")
    p.add_argument(
        "--names", action="append", help="hook names or glob patterns to cache (repeatable)"
    )
    p.add_argument("--out", help="write the cached activations here (safetensors)")
    p.add_argument("--dtype", choices=DTYPES, help="store the activations in this dtype")
    p.add_argument("--lens", action="store_true", help="print the logit lens table")
    p.add_argument("--top", type=int, default=5, help="tokens per layer in --lens (default 5)")
    p.add_argument(
        "--position", type=int, default=-1, help="position read by --lens (default -1: the last)"
    )
    p.add_argument("--list", action="store_true", help="print every hook name and its shape")
    p.set_defaults(func=guarded("attnlab inspect", run_inspect))


def _label(tokenizer: Any, i: int) -> str:
    backend = getattr(tokenizer, "backend", None)
    token = backend.id_to_token(i) if backend is not None else tokenizer.decode([i])
    return str(token if token is not None else i)


def _inputs(
    args: argparse.Namespace, model: Any, tokenizer: Any
) -> tuple[tuple[Any, ...], list[str]]:
    """The forward's positional inputs and the labels of the (source) tokens."""
    import torch

    from attnlab.models.family import Kind, find_family

    family = find_family(model)
    kind = family.kind if family is not None else None
    if kind is Kind.IMAGE_CLASSIFIER:
        fail(
            f"attnlab inspect takes text or token ids; a {type(model).__name__} takes images "
            "(use attnlab.inspect)"
        )
    if (args.text is None) == (args.ids is None):
        fail("pass exactly one of --text and --ids")
    if args.ids is not None:
        try:
            ids = [int(t) for t in args.ids.replace(" ", "").split(",") if t]
        except ValueError:
            fail(f"--ids must be comma-separated integers, got {args.ids!r}")
        vocab = getattr(model.config, "vocab_size", None)
        bad = [i for i in ids if i < 0 or (vocab is not None and i >= vocab)]
        if bad:  # before a tensor is made: an int64 holds no id of 2**63 or more
            fail(f"--ids: token id {bad[0]} is outside the vocabulary [0, {vocab})")
    else:
        if tokenizer is None:
            fail(f"{args.model} has no tokenizer.json: pass --ids or --tokenizer")
        ids = tokenizer.encode(args.text)
    if not ids:
        fail("the input has no tokens")
    labels = [_label(tokenizer, i) if tokenizer is not None else str(i) for i in ids]
    x = torch.tensor([ids])  # (1, T)
    if kind is not Kind.SEQ2SEQ:
        if args.target is not None:
            fail("--target is for encoder-decoder models")
        return (x,), labels
    tgt = [model.config.bos_id]
    if args.target is not None:
        if tokenizer is None:
            fail("--target needs a tokenizer")
        tgt += tokenizer.encode(args.target)
    return (x, torch.tensor([tgt])), labels


def _lens_table(
    model: Any, inputs: tuple[Any, ...], tokenizer: Any, args: argparse.Namespace
) -> None:
    from attnlab.inspect import logit_lens

    if args.top < 1:
        fail(f"--top must be >= 1, got {args.top}")
    lens = logit_lens(model, *inputs, positions=args.position)
    T = (inputs[-1]).shape[1]
    print(f"logit lens at position {lens.positions[0]} of {T}: top {args.top} next tokens")
    for label, row in zip(lens.labels, lens.top(args.top), strict=True):
        cells = "  ".join(
            f"{(_label(tokenizer, i) if tokenizer is not None else str(i))!r} {p:.3f}"
            for i, p in row
        )
        print(f"{label:>9}  {cells}")


def run_inspect(args: argparse.Namespace) -> int:
    """Cache, list, or print the lens."""
    import torch

    from attnlab.cli.generate import resolve
    from attnlab.inspect import hook_names, run_with_cache
    from attnlab.io import atomic_save_tensors
    from attnlab.pretrained import from_pretrained

    if not (args.out or args.lens or args.list):
        fail("say what to do: --out FILE.safetensors, --lens, or --list")
    check_writable(args.out, what="--out")
    directory, tokenizer = resolve(args.model, args.tokenizer)
    if hasattr(getattr(tokenizer, "backend", None), "no_padding"):
        tokenizer.backend.no_padding()  # one sequence: a checkpoint's padding is not wanted
    model = from_pretrained(directory)  # in eval mode
    inputs, labels = _inputs(args, model, tokenizer)
    print(f"tokens ({len(labels)}): {labels}")
    if args.list or args.out:
        names = args.names if args.names else None
        dtype = getattr(torch, args.dtype) if args.dtype else None
        with torch.no_grad():
            _, cache = run_with_cache(model, *inputs, names=names, dtype=dtype)
        if args.list:
            for name in hook_names(model):
                shape = tuple(cache[name].shape) if name in cache else "(not cached)"
                print(f"{name:<40} {shape}")
        if args.out:
            meta = {"tokens": json.dumps(labels), "model": str(args.model)}
            path = atomic_save_tensors(args.out, cache.tensors(), metadata=meta)
            print(f"wrote {path}: {len(cache)} activations, {cache.nbytes() / 2**20:.1f} MiB")
    if args.lens:
        _lens_table(model, inputs, tokenizer, args)
    return 0


__all__ = ["add_parser", "run_inspect"]
