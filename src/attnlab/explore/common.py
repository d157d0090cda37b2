"""What the explorer's modules share: the input bounds, packed arrays, integer checks, the
byte tokenizer of presets built without one, the attention stacks' hook names, and
:class:`ExplorerState`, what the view modules need of an
:class:`~attnlab.explore.data.Explorer` (so they need not import it: it imports them).

Shapes: any; :func:`pack` keeps the tensor's shape.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True)
class Limits:
    """Input bounds of an explorer.

    Attributes:
        max_tokens: most tokens one input may have (also capped by the model's context).
        max_body_bytes: largest request body the server reads.
        max_top: most entries a distribution or lens row may list.
    """

    max_tokens: int = 128
    max_body_bytes: int = 64 * 1024
    max_top: int = 100

    def __post_init__(self) -> None:
        for name in ("max_tokens", "max_body_bytes", "max_top"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")


def pack(t: Tensor) -> dict[str, Any]:
    """A float tensor as ``{"shape": [...], "dtype": "float32", "data": base64}``."""
    a = np.ascontiguousarray(t.detach().to(torch.float32).cpu().numpy(), dtype="<f4")
    return {
        "shape": list(a.shape),
        "dtype": "float32",
        "data": base64.b64encode(a.tobytes()).decode(),
    }


def unpack(d: dict[str, Any]) -> Tensor:
    """The tensor of a :func:`pack` dict."""
    raw = np.frombuffer(base64.b64decode(d["data"]), dtype="<f4")
    return torch.from_numpy(raw.copy()).reshape(d["shape"])


def check_int(name: str, value: object, low: int, high: int) -> int:
    """``value`` if it is an int in ``[low, high)``, else ``ValueError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}), got {value!r}")
    return value


def finite_or_none(x: float) -> float | None:
    """JSON has no infinities: a masked score becomes ``None``."""
    return x if math.isfinite(x) else None


class ByteTokenizer:
    """UTF-8 bytes as ids, for a preset built without a tokenizer (vocabulary >= 256)."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


# attention stack -> (hook-name prefix of layer l, which token sequences are queries / keys)
STACKS = {
    "self": ("layers.{l}.attn", "source", "source"),
    "encoder": ("encoder.layers.{l}.attn", "source", "source"),
    "decoder": ("decoder.layers.{l}.attn", "target", "target"),
    "cross": ("decoder.layers.{l}.cross_attn", "target", "source"),
}


class ExplorerState(Protocol):
    """The parts of an :class:`~attnlab.explore.data.Explorer` the view modules use."""

    model: Any
    tokenizer: Any
    config: Any
    family: str  # the family's name, for messages
    seq2seq: bool  # an encoder-decoder: a source and a decoder input
    language_model: bool  # next-token views (a causal LM or an encoder-decoder)
    limits: Limits
    max_tokens: int
    lock: Any

    def token_text(self, i: int) -> str: ...

    def tokens(self, ids: Sequence[int]) -> list[dict[str, Any]]: ...

    def inputs(self, ids: list[int], target: list[int] | None = None) -> tuple[Tensor, ...]: ...

    def stacks(self) -> tuple[str, ...]: ...

    def n_layers(self, stack: str = "self") -> int: ...

    def _run(
        self, ids: list[int], names: Any, target: list[int] | None = None
    ) -> tuple[Any, Any]: ...


__all__ = [
    "STACKS",
    "ByteTokenizer",
    "ExplorerState",
    "Limits",
    "check_int",
    "finite_or_none",
    "pack",
    "unpack",
]
