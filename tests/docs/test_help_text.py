"""``attnlab ... --help`` reads as plain text, and each recipe's help describes that recipe.

The descriptions come from docstrings, which are reST; ``attnlab.cli.helptext`` turns them into
plain text once for the whole parser tree.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator

import pytest

from attnlab.cli import build_parser
from attnlab.cli.helptext import alias_table, plain, recipe_details
from attnlab.training.recipes import RECIPES

MARKUP = re.compile(r"``|:(?:mod|func|class|meth|attr|data|obj|exc):`")


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield " ".join(("attnlab", *path)), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


@pytest.fixture(scope="module")
def helps() -> dict[str, str]:
    return {name: p.format_help() for name, p in _parsers(build_parser())}


def test_no_help_shows_rest_markup(helps: dict[str, str]) -> None:
    assert len(helps) > 20  # every command and sub-command was visited
    for name, text in helps.items():
        found = MARKUP.findall(text)
        assert not found, f"`{name} --help` shows reST markup {found[:3]}"


def test_plain_converts_the_markup_docstrings_use() -> None:
    text = "``x=1`` and :mod:`attnlab.io`, :class:`~attnlab.data.ReverseTask`, :func:`y <a.b>`"
    assert plain(text) == "x=1 and attnlab.io, ReverseTask, y"
    assert plain("The same command::\n\n    run it") == "The same command:\n\n    run it"
    assert (
        plain("no markup: `one` backtick, 50% and a: b")
        == "no markup: `one` backtick, 50% and a: b"
    )


@pytest.mark.parametrize("name", list(RECIPES))
def test_each_recipe_help_describes_that_recipe(name: str, helps: dict[str, str]) -> None:
    recipe = RECIPES.get(name)
    text = helps[f"attnlab train {name}"]
    description = text.split("\noptions:", 1)[0]
    assert recipe.description in description  # RawDescriptionHelpFormatter: not re-wrapped
    module = sys.modules[type(recipe.options).__module__]
    own = recipe_details(name, module.__doc__)
    assert own and own.splitlines()[0] in description
    for other in RECIPES:  # another recipe's details never stand in for this one's
        if other == name:
            continue
        theirs = recipe_details(
            other, sys.modules[type(RECIPES.get(other).options).__module__].__doc__
        )
        if theirs != own:
            assert theirs.splitlines()[0] not in description, f"{name} --help shows {other}'s text"


def test_the_shakespeare_recipes_keep_to_themselves(helps: dict[str, str]) -> None:
    char = helps["attnlab train shakespeare-char"].split("\noptions:", 1)[0]
    mlm = helps["attnlab train shakespeare-mlm"].split("\noptions:", 1)[0]
    assert "baby GPT" in char and "masked" not in char
    assert "masked" in mlm and "baby GPT" not in mlm


def test_translate_help_lists_the_older_names_it_accepts(helps: dict[str, str]) -> None:
    text = helps["attnlab train translate"]
    for old, new in (("--max-steps", "--steps"), ("--save-every", "--checkpoint-every")):
        line = next((ln for ln in text.splitlines() if ln.split()[:1] == [old]), None)
        assert line is not None, f"{old} is accepted but not listed in --help"
        assert f"same as {new}" in line
    for old in RECIPES.get("translate").aliases:
        assert "--" + old.replace("_", "-") in text


def test_alias_table_is_empty_without_aliases() -> None:
    assert alias_table({}, {}) == ""
    table = alias_table({"max_steps": "steps"}, {"max_steps": int})
    assert "--max-steps" in table and "same as --steps" in table
