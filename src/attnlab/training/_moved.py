"""The old import paths of names that moved out of :mod:`attnlab.training` (issue 48).

A module that lost names keeps a table ``{old name: new module}`` (or ``(new module, new name)``
where the name changed too) and a module-level ``__getattr__`` that calls :func:`moved`: the
name is looked up in its new home and a ``DeprecationWarning`` naming that home is issued,
pointing at the line that used the old path. The library itself never goes through these paths
(``tests/data/test_moved.py`` checks it); they go away in the release after the move.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from types import ModuleType
from typing import Any

Moved = Mapping[str, ModuleType | tuple[ModuleType, str]]


def moved(module: str, name: str, table: Moved) -> Any:
    """The object ``module.name`` now is, with a ``DeprecationWarning`` naming its new path.

    Raises:
        AttributeError: for a name not in ``table`` (what a missing module attribute raises).
    """
    if name not in table:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    new = table[name]
    home, new_name = new if isinstance(new, tuple) else (new, name)
    warnings.warn(
        f"{module}.{name} moved to {home.__name__}.{new_name}; import it from there (the old "
        "path goes away in the next release)",
        DeprecationWarning,
        stacklevel=3,  # stacklevel=2 of the module's __getattr__: the line using the old path
    )
    return getattr(home, new_name)


__all__ = ["Moved", "moved"]
