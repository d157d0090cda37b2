"""``attnlab embed MODEL_DIR --text ...``: sentence embeddings from a BERT-family checkpoint.

Mean-pooled (over the attention mask), L2-normalised sentence embeddings, as the
all-MiniLM-L6-v2 model card prescribes (:func:`attnlab.embed`); prints the cosine similarity
matrix, or the vectors with ``--json``. ``MODEL_DIR`` may also be a run directory or one of its
checkpoints (a character-level GPT's run embeds with its character tokenizer); a text longer than
the model takes is cut, with a warning on stderr.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from attnlab.cli.common import guarded


def add_parser(commands: Any) -> None:
    """The ``embed`` command."""
    p = commands.add_parser(
        "embed",
        help="sentence embeddings from a BERT-family checkpoint",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument("model", help="checkpoint directory (Hugging Face or attnlab) + tokenizer.json")
    p.add_argument("--text", action="append", required=True, help="a sentence (repeatable)")
    p.add_argument("--json", action="store_true", help="print the embeddings as JSON")
    p.set_defaults(func=guarded("attnlab embed", run_embed))


def run_embed(args: argparse.Namespace) -> int:
    """Print the cosine matrix (or the vectors)."""
    from attnlab.sentence import embed, load_embed_tokenizer
    from attnlab.training.rundir import find_tokenizer, resolve_model_directory

    directory = resolve_model_directory(args.model)  # a run directory: its newest checkpoint
    tokenizer = None
    found = find_tokenizer(directory)
    if found is not None and found.parent != directory:  # a checkpoint's: its run's tokenizer
        tokenizer = load_embed_tokenizer(found)
    vectors = embed(list(args.text), directory, tokenizer=tokenizer)
    if args.json:
        print(json.dumps({"texts": args.text, "embeddings": vectors.tolist()}))
        return 0
    print(f"{len(args.text)} sentences, {vectors.shape[-1]}-dimensional embeddings; cosine:")
    cos = vectors @ vectors.T
    for i, text in enumerate(args.text):
        row = " ".join(f"{float(c):6.3f}" for c in cos[i])
        print(f"{row}  {text}")
    return 0


__all__ = ["add_parser", "run_embed"]
