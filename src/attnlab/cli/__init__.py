"""The ``attnlab`` command line (floor 6: the only argparse of the library).

Each module adds one command group and turns its flags into library calls:

    attnlab train RECIPE [--key=value ...]   cli.train   (reverse, shakespeare-char, translate, ...)
    attnlab sample RUN_DIR --prompt TEXT     cli.sample
    attnlab evaluate RUN_DIR                 cli.evaluate
    attnlab generate MODEL_OR_RUN --prompt   cli.generate
    attnlab translate MODEL_OR_RUN           cli.translate
    attnlab analyze PRESET_OR_CONFIG         cli.analyze
    attnlab embed MODEL_DIR --text ...       cli.embed
    attnlab inspect MODEL --text ...         cli.inspect  (activation cache, logit lens)
    attnlab explore MODEL                    cli.explore  (the interactive page)
    attnlab viz KIND ...                     cli.viz
    attnlab bench attention ...              cli.bench
    attnlab convert-run RUN_DIR              cli.convert
    attnlab quantize MODEL_OR_RUN --bits 8   cli.quantize

Flags are ``--kebab-case``; every command exits 0, or 2 with one ``error:`` line on bad input
(:mod:`attnlab.cli.common`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from attnlab import __version__
from attnlab.cli import analyze, bench, convert, embed, evaluate, generate, sample, train, translate
from attnlab.cli import explore as explore_cli
from attnlab.cli import inspect as inspect_cli
from attnlab.cli import quantize as quantize_cli
from attnlab.cli import viz as viz_cli


def build_parser() -> argparse.ArgumentParser:
    """The ``attnlab`` argument parser with every command."""
    import torch

    parser = argparse.ArgumentParser(
        prog="attnlab", description="The Transformer family from first principles."
    )
    parser.add_argument(
        "--version", action="version", version=f"attnlab {__version__} (torch {torch.__version__})"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (train, sample, evaluate, generate, translate, analyze, embed, inspect_cli,
                   viz_cli, bench, convert, quantize_cli, explore_cli):  # fmt: skip
        module.add_parser(commands)
    return parser


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


__all__ = ["build_parser", "main"]
