"""Field checks for model configs that do not share the attention stack's fields (Mamba, RNN).

The Transformer configs validate their common fields in :mod:`attnlab.models.common`; the
recurrent models have other names (``d_state``, ``cell``, ...), so they list their own integer,
float and flag fields and call :func:`check_types`, then :func:`check_token_ids`.
"""

from __future__ import annotations

import math


def is_int(value: object) -> bool:
    """An ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_types(
    config: object, ints: tuple[str, ...], floats: tuple[str, ...], bools: tuple[str, ...]
) -> None:
    """Check the types of a config's fields (``None`` integers are skipped).

    Raises:
        TypeError: for an integer field holding ``2.0`` or ``"2"``, a float field holding a
            non-number, or a flag holding anything but ``True``/``False``.
        ValueError: for a float that is not finite.
    """
    for name in ints:
        v = getattr(config, name)
        if v is not None and not is_int(v):
            raise TypeError(f"{name} must be an integer, got {v!r}")
    for name in floats:
        v = getattr(config, name)
        if not isinstance(v, int | float) or isinstance(v, bool):
            raise TypeError(f"{name} must be a number, got {v!r}")
        if not math.isfinite(v):
            raise ValueError(f"{name} must be finite, got {v}")
    for name in bools:
        v = getattr(config, name)
        if not isinstance(v, bool):
            raise TypeError(f"{name} must be true or false, got {v!r}")


def check_token_ids(config: object, vocab_size: int) -> None:
    """``pad_id``, ``bos_id`` and ``eos_id`` are ``None`` or ids in ``[0, vocab_size)``.

    Raises:
        ValueError: naming the id and the vocabulary range.
    """
    for name in ("pad_id", "bos_id", "eos_id"):
        tok = getattr(config, name)
        if tok is not None and (not is_int(tok) or not 0 <= tok < vocab_size):
            raise ValueError(f"{name}={tok!r} is outside the vocabulary [0, {vocab_size})")


__all__ = ["check_token_ids", "check_types", "is_int"]
