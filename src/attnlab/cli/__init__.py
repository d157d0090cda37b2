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
(:mod:`attnlab.cli.common`). A mistyped command, recipe, choice or flag is answered with the
closest valid ones (``did you mean --steps?``), not with all of them: ``--help`` lists those
(:class:`GuidingParser`, :func:`attnlab.cli.overrides.did_you_mean`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, NoReturn

from attnlab import __version__
from attnlab.cli import analyze, bench, convert, embed, evaluate, generate, sample, train, translate
from attnlab.cli import explore as explore_cli
from attnlab.cli import inspect as inspect_cli
from attnlab.cli import quantize as quantize_cli
from attnlab.cli import viz as viz_cli
from attnlab.cli.helptext import plain_help
from attnlab.cli.overrides import did_you_mean

_LONG_USAGE = 3  # lines: a longer usage is left to --help in an error


class GuidingParser(argparse.ArgumentParser):
    """argparse that answers a mistake with what was probably meant.

    An invalid choice (a command, a recipe, a ``--length-norm``) names the closest valid ones
    (``did you mean 'generate'?``) and lists them all only when none is close; an error prints
    the usage only when it is short (a few lines), else a one-line pointer to ``--help``.
    Every sub-command's parser is one of these (argparse makes sub-parsers of the parent's
    class).
    """

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = action.choices
        if choices is None or value in choices:
            return
        names = [str(c) for c in choices]
        hint = did_you_mean(str(value), names, quote=True)
        listed = hint or f" (choose from {', '.join(map(repr, names))})"
        raise argparse.ArgumentError(action, f"invalid choice: {value!r}{listed}")

    def short_usage(self) -> str:
        """The usage, or where it is long, its positional part and a pointer to ``--help``."""
        usage = self.format_usage()
        if usage.count("\n") <= _LONG_USAGE:
            return usage
        formatter = self._get_formatter()
        positionals = [a for a in self._actions if not a.option_strings]
        formatter.add_usage(None, positionals, [], prefix="usage: ")
        short = formatter.format_help().rstrip("\n").replace(self.prog, f"{self.prog} [options]", 1)
        return f"{short}  ({self.prog} --help lists the options)\n"

    def error(self, message: str) -> NoReturn:
        """Exit with status 2: the (short) usage and one ``error:`` line."""
        self.exit(2, f"{self.short_usage()}{self.prog}: error: {message}\n")


def leaf_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Any:
    """The parser of the sub-command ``args`` chose (``attnlab viz attention``'s)."""
    current = parser
    while True:
        subs = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, subs[0].dest, None) if subs and subs[0].dest else None
        if chosen is None or chosen not in subs[0].choices:
            return current
        current = subs[0].choices[chosen]


def command_flags(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string of ``parser`` (``--out``, ``-h`` ...)."""
    return [s for a in parser._actions for s in a.option_strings]


def _unrecognized(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """``unrecognized arguments: --promt x; did you mean --prompt?``"""
    first = next((e.partition("=")[0] for e in extras if e.startswith("--")), None)
    hint = did_you_mean(first, command_flags(parser)) if first else ""
    return f"unrecognized arguments: {' '.join(extras)}{hint}"


def build_parser() -> argparse.ArgumentParser:
    """The ``attnlab`` argument parser with every command."""
    import torch

    parser = GuidingParser(
        prog="attnlab", description="The Transformer family from first principles."
    )
    parser.add_argument(
        "--version", action="version", version=f"attnlab {__version__} (torch {torch.__version__})"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (train, sample, evaluate, generate, translate, analyze, embed, inspect_cli,
                   viz_cli, bench, convert, quantize_cli, explore_cli):  # fmt: skip
        module.add_parser(commands)
    return plain_help(parser)  # descriptions made from docstrings, without their reST markup


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``attnlab`` script; returns the exit status."""
    parser = build_parser()
    # Recipes take free-form --key=value overrides (checked against their configs); every other
    # command rejects unknown arguments as parse_args would.
    args, extras = parser.parse_known_args(argv)
    leaf = leaf_parser(parser, args)
    if extras and not getattr(args, "accepts_overrides", False):
        leaf.error(_unrecognized(leaf, extras))
    args.overrides = extras
    args.command_flags = command_flags(leaf)  # offered when an override is unknown
    return int(args.func(args))


__all__ = ["GuidingParser", "build_parser", "command_flags", "leaf_parser", "main"]
