"""A tiny name -> object registry for interchangeable parts (backends, encodings, norms, ...).

Lookups of unknown keys raise ``ValueError`` listing the valid keys, so a typo in a config or on
the command line is answered with the choices instead of a ``KeyError``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps string keys to objects of one kind.

    Args:
        name: What the registry holds, used in error messages (e.g. ``"attention backend"``).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._items: dict[str, T] = {}

    def register(self, key: str) -> Callable[[T], T]:
        """Decorator registering an object under ``key``; re-registering a key is an error."""

        def deco(obj: T) -> T:
            self.add(key, obj)
            return obj

        return deco

    def add(self, key: str, obj: T) -> None:
        """Register ``obj`` under ``key``.

        Raises:
            ValueError: if ``key`` is already registered.
        """
        if key in self._items:
            raise ValueError(f"{self.name} {key!r} is already registered")
        self._items[key] = obj

    def get(self, key: str) -> T:
        """Return the object registered under ``key``.

        Raises:
            ValueError: naming the unknown key and listing the valid ones.
        """
        try:
            return self._items[key]
        except KeyError:
            raise ValueError(
                f"unknown {self.name} {key!r}; valid: {', '.join(sorted(self._items))}"
            ) from None

    def find(self, key: str) -> T | None:
        """The object registered under ``key``, or ``None``."""
        return self._items.get(key)

    def remove(self, key: str) -> T:
        """Unregister ``key`` and return its object.

        Raises:
            ValueError: naming the unknown key and listing the valid ones.
        """
        obj = self.get(key)
        del self._items[key]
        return obj

    def values(self) -> list[T]:
        """The registered objects, in key order."""
        return [self._items[k] for k in self.keys()]

    def keys(self) -> list[str]:
        """The registered keys, sorted."""
        return sorted(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __repr__(self) -> str:
        return f"Registry({self.name!r}, keys={self.keys()})"
