"""``save_pretrained`` / ``from_pretrained`` methods shared by every model class.

A thin mixin over :mod:`attnlab.hub`, which does the work (attnlab's own checkpoint format, and
Hugging Face checkpoints through :mod:`attnlab.interop`). The hub is imported inside the methods:
it sits above ``models`` in the dependency order.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

import torch

M = TypeVar("M", bound="PretrainedMixin")


class PretrainedMixin:
    """Adds :meth:`save_pretrained` and the class method :meth:`from_pretrained` to a model."""

    def save_pretrained(self, path: str | os.PathLike[str]) -> Path:
        """Write this model to the directory ``path`` in attnlab's format (``model.safetensors``
        + ``config.json``), atomically per file. Returns the directory."""
        from attnlab.hub import save_pretrained

        return save_pretrained(self, path)  # type: ignore[arg-type]

    @classmethod
    def from_pretrained(
        cls: type[M],
        path: str | os.PathLike[str],
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        strict: bool = True,
    ) -> M:
        """Load a checkpoint directory (attnlab's or Hugging Face's format) as this class.

        Same arguments as :func:`attnlab.from_pretrained`.

        Raises:
            TypeError: if the checkpoint holds a different model class.
        """
        from attnlab.hub import from_pretrained

        model: Any = from_pretrained(path, device=device, dtype=dtype, strict=strict)
        if not isinstance(model, cls):
            raise TypeError(
                f"{path} holds a {type(model).__name__}, not a {cls.__name__}; "
                "use attnlab.from_pretrained to load any model"
            )
        return model
