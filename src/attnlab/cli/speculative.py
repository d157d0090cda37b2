"""The speculative-decoding flags that ``attnlab generate`` and ``attnlab sample`` share.

    attnlab generate RUN --prompt "ROMEO:" --draft DRAFT_RUN --num-draft-tokens 4
    attnlab sample RUN --prompt "ROMEO:" --draft DRAFT_RUN

``--draft`` is a model or run directory of a smaller GPT on the same tokenizer; it proposes
``--num-draft-tokens`` tokens (default 4) that the model verifies in one forward
(:mod:`attnlab.generation.speculative`): greedy output is the model's own, sampling keeps the
model's distribution. The acceptance statistics go to stderr after the text, so the text on
stdout stays as it was.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch
from torch import Tensor

from attnlab.cli.common import fail
from attnlab.generation import GenerationConfig, SpeculativeStats


def add_speculative_arguments(p: argparse.ArgumentParser) -> None:
    """Add ``--draft`` and ``--num-draft-tokens`` to ``p``."""
    spec = p.add_argument_group("speculative decoding")
    spec.add_argument(
        "--draft", metavar="DRAFT_DIR",
        help="a smaller GPT (model or run directory, same tokenizer) proposing tokens",
    )  # fmt: skip
    spec.add_argument(
        "--num-draft-tokens", type=int, default=None, metavar="K",
        help="tokens the draft proposes per verification (default 4)",
    )  # fmt: skip


def load_draft(
    args: argparse.Namespace, model: Any, tokenizer: Any, config: GenerationConfig, device: str
) -> Any:
    """The draft model the flags name (``None`` without ``--draft``), checked against the
    model: a GPT, the same vocabulary and tokenizer, options that speculative decoding serves.

    Raises:
        CommandError: naming the flag and the problem.
    """
    import attnlab
    from attnlab.tokenizers import load_tokenizer
    from attnlab.training.rundir import find_tokenizer, resolve_model_directory

    if args.draft is None:
        if args.num_draft_tokens is not None:
            fail("--num-draft-tokens needs --draft DRAFT_DIR (the model that proposes them)")
        return None
    if config.num_beams != 1:
        fail("--draft does not combine with beam search: drop --num-beams")
    if not config.use_cache:
        fail("--draft rolls back the KV caches: drop --no-cache")
    k = args.num_draft_tokens
    if k is not None and k < 1:
        fail(f"--num-draft-tokens must be at least 1, got {k}")
    directory = resolve_model_directory(args.draft)
    tok_file = find_tokenizer(directory)
    draft_tokenizer = load_tokenizer(tok_file) if tok_file is not None else None
    verify = not getattr(args, "no_verify", False)  # generate's --no-verify
    draft: Any = attnlab.from_pretrained(directory, device=device, verify=verify)
    wrong = [m for m in (model, draft) if not _causal(m)]
    if wrong:  # it rolls back KV caches: causal LMs only
        fail(f"--draft needs a GPT model and a GPT draft (causal LMs), got a "
             f"{type(wrong[0]).__name__}")  # fmt: skip
    if draft.config.vocab_size != model.config.vocab_size:
        fail(
            f"--draft {args.draft} has a vocabulary of {draft.config.vocab_size} tokens, the "
            f"model {model.config.vocab_size}: the draft must use the model's tokenizer"
        )
    if tokenizer is not None and draft_tokenizer is not None:
        ids = range(model.config.vocab_size)
        if [tokenizer.decode([i]) for i in ids] != [draft_tokenizer.decode([i]) for i in ids]:
            fail(f"--draft {args.draft} has another tokenizer than the model (same size, "
                 "different tokens): train the draft on the model's tokenizer")  # fmt: skip
    return draft


def draft_options(args: argparse.Namespace, draft: Any) -> dict[str, Any]:
    """The keyword arguments of :func:`attnlab.generation.generate`/``stream`` for ``draft``."""
    if draft is None:
        return {}
    return {"draft_model": draft, "num_draft_tokens": args.num_draft_tokens}


def _causal(model: Any) -> bool:
    """Whether ``model``'s family is a causal LM (speculative decoding's target and draft)."""
    from attnlab.models.family import Kind, find_family

    family = find_family(model)
    return family is not None and family.kind is Kind.CAUSAL_LM


def decode(
    model: Any,
    prompts: list[list[int]],
    config: GenerationConfig,
    generator: torch.Generator | None,
    args: argparse.Namespace,
    draft: Any,
) -> Tensor:
    """:func:`attnlab.generation.generate`, speculatively when there is a draft (then the
    statistics line goes to stderr). ``(B·R, N)``."""
    from attnlab.generation import generate, speculative_generate

    if draft is None:
        return generate(model, prompts, config, generator=generator)
    out = speculative_generate(
        model, draft, prompts, config, generator=generator,
        **({} if args.num_draft_tokens is None else {"num_draft_tokens": args.num_draft_tokens}),
    )  # fmt: skip
    print_summary(out.stats)
    return out.sequences


def print_summary(stats: SpeculativeStats | None) -> None:
    """The acceptance statistics, one line on stderr."""
    if stats is not None:
        print(f"speculative decoding: {stats.summary()}", file=sys.stderr)


__all__ = ["add_speculative_arguments", "decode", "draft_options", "load_draft", "print_summary"]
