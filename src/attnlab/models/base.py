"""Methods shared by model classes: checkpoints, and ``generate`` for the generative ones.

Thin mixins over :mod:`attnlab.hub` (attnlab's own checkpoint format, and Hugging Face
checkpoints through :mod:`attnlab.interop`) and :mod:`attnlab.generation`, which do the work.
Both are imported inside the methods: they sit above ``models`` in the dependency order.
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


class GenerationMixin:
    """Adds :meth:`generate`, a shortcut for :func:`attnlab.generation.generate`."""

    def generate(self, input_ids: Any, *, max_new_tokens: int, **kwargs: Any) -> torch.Tensor:
        """``attnlab.generate(self, input_ids, max_new_tokens=..., **kwargs)``: the new tokens
        ``(B·R, N)``; see :func:`attnlab.generation.generate` for every option."""
        from attnlab.generation.generate import generate

        return generate(self, input_ids, max_new_tokens=max_new_tokens, **kwargs)  # type: ignore[arg-type]
