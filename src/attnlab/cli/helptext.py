"""Help texts made from docstrings: reST markup turned into plain text, and a recipe's own part
of its module's docstring.

The library's docstrings are reST (``code``, :mod:`x`, :func:`y`, literal blocks after ``::``);
``--help`` is read in a terminal, so :func:`plain_help` rewrites every description, epilog and
option help of a parser tree once, after the commands have added their parsers.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from typing import Any

from attnlab.cli.overrides import describe, flag

# :role:`target`, :role:`~a.b.Name` (the last part), :role:`text <target>` (the text)
_ROLE = re.compile(
    r":(?:mod|func|class|meth|attr|data|obj|exc|ref|doc|const):`(~?)([^`<]*?)\s*(?:<[^`>]*>)?`"
)
_LITERAL = re.compile(r"``(.+?)``", re.S)
_BULLET = re.compile(r"^- ``(?P<name>[\w.-]+)``:\s*", re.M)


def _role(m: re.Match[str]) -> str:
    tilde, target = m.group(1), m.group(2).strip()
    return target.rpartition(".")[2] if tilde else target


def plain(text: str) -> str:
    """``text`` without reST markup: ``x`` -> x, :mod:`a.b` -> a.b, :class:`~a.B` -> B, a
    paragraph's closing ``::`` -> ``:``.

    Args:
        text: a docstring or a part of one.

    Returns:
        The same text as a terminal shows it best; everything else is left alone.
    """
    text = _ROLE.sub(_role, text)
    text = _LITERAL.sub(lambda m: m.group(1), text)
    text = re.sub(r"(?<=\S)::(?=\s*$)", ":", text, flags=re.M)  # "... as follows::"
    return re.sub(r"^\s*::\s*$\n?", "", text, flags=re.M)  # a lone "::" line


def plain_help(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Rewrite with :func:`plain` the description, epilog and every option's help of
    ``parser`` and of its sub-commands, recursively; returns ``parser``."""
    seen: set[int] = set()

    def visit(p: argparse.ArgumentParser) -> None:
        if id(p) in seen:  # aliases share a parser
            return
        seen.add(id(p))
        if p.description:
            p.description = plain(p.description)
        if p.epilog:
            p.epilog = plain(p.epilog)
        for action in p._actions:
            if isinstance(action.help, str):
                action.help = plain(action.help)
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    if isinstance(choice.help, str):
                        choice.help = plain(choice.help)
                for sub in action.choices.values():
                    visit(sub)

    visit(parser)
    return parser


def recipe_details(name: str, module_doc: str | None) -> str:
    """The part of a recipe module's docstring that describes recipe ``name``: the paragraph
    after the summary line (and the list it introduces, when it ends with a colon). Where that
    paragraph is a list of recipes (``- ``name``: ...``, one module holding several recipes),
    only ``name``'s item.

    Args:
        name: the recipe's name (``shakespeare-char``).
        module_doc: the docstring of the module that defines it (``None``: no details).

    Returns:
        Plain text (:func:`plain`), or ``""`` when the docstring has no second paragraph.
    """
    paragraphs = [p.strip("\n") for p in (module_doc or "").strip().split("\n\n")]
    if len(paragraphs) < 2:
        return ""
    chosen = [paragraphs[1]]
    for extra in paragraphs[2:]:  # "... the loop is the one trainer:" + its list
        if not chosen[-1].rstrip().endswith(":"):
            break
        chosen.append(extra)
    text = "\n\n".join(chosen)
    heads = list(_BULLET.finditer(text))
    if heads and text.lstrip().startswith("- ``"):  # one item per recipe
        for i, head in enumerate(heads):
            if head.group("name") == name:
                end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
                item = text[head.end() : end].rstrip()
                text = re.sub(r"^  ", "", item, flags=re.M)  # the item's continuation indent
                break
    return plain(text)


def alias_table(aliases: Mapping[str, Any], types: Mapping[str, Any]) -> str:
    """The ``--help`` lines of a recipe's older option names, or ``""`` when it has none.

    Args:
        aliases: ``Recipe.aliases``: an older name -> the field it sets, or ``(function of
            the value, type)`` (the function's docstring says what it sets).
        types: the annotation of every flag, aliases included (``cli.train.recipe_types``).
    """
    if not aliases:
        return ""
    lines = ["Older names (attnlab 0.1), still accepted:"]
    for old, alias in aliases.items():
        kind = describe(types.get(old, str))
        if isinstance(alias, str):
            meaning = f"same as {flag(alias)}"
        else:
            doc = (getattr(alias[0], "__doc__", None) or "").strip()
            meaning = plain(doc.splitlines()[0]) if doc else "attnlab 0.1's option"
        lines.append(f"  {flag(old):<30} {kind:<22} {meaning}")
    return "\n".join(lines)


__all__ = ["alias_table", "plain", "plain_help", "recipe_details"]
