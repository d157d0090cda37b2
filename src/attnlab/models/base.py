"""What every attnlab model object offers besides its forward, defined here with its classes.

:class:`PretrainedModel` (every family's model class derives from it) gives the Hugging
Face-style ``Model.from_pretrained(path)`` and ``model.save_pretrained(path)``;
:class:`GenerationMixin` (the families that generate) gives ``model.generate(...)``. They are the
free functions :func:`attnlab.from_pretrained`, :func:`attnlab.save_pretrained` and
:func:`attnlab.generate` called on the model, which is all these methods do.

Why a lookup: those functions live on the floors above the models (the model-directory format,
the decoding loops), and a floor never imports upward. Each of them registers itself in
:data:`IMPLEMENTATIONS` when its module is imported (``attnlab.pretrained``,
``attnlab.generation.generate``), and Python imports the package ``attnlab`` — which imports
both — before any of its submodules, so the methods find them whenever a model exists.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

from torch import Tensor, nn

from attnlab.registry import Registry

IMPLEMENTATIONS: Registry[Any] = Registry("model method implementation")
"""``"from_pretrained"``, ``"save_pretrained"``, ``"generate"`` -> the free function."""

M = TypeVar("M", bound="PretrainedModel")


def _implementation(name: str) -> Any:
    found = IMPLEMENTATIONS.find(name)
    if found is None:  # only when attnlab's package __init__ has not run (it always does)
        raise RuntimeError(f"attnlab.{name} is not loaded: import attnlab first")
    return found


class PretrainedModel(nn.Module):
    """Base of every attnlab model: checkpoint conveniences (see the module doc)."""

    config: Any

    @classmethod
    def from_pretrained(cls: type[M], path: str | os.PathLike[str], **kwargs: Any) -> M:
        """:func:`attnlab.from_pretrained` (attnlab's, a quantized or a Hugging Face model
        directory), checked to give an instance of this class.

        Raises:
            TypeError: when the directory holds another kind of model.
            ValueError, FileNotFoundError: as :func:`attnlab.from_pretrained`.
        """
        model = _implementation("from_pretrained")(path, **kwargs)
        if not isinstance(model, cls):
            raise TypeError(
                f"{os.fspath(path)} holds a {type(model).__name__}, not a {cls.__name__}; "
                "use attnlab.from_pretrained to load any model"
            )
        return model

    def save_pretrained(self, path: str | os.PathLike[str], **kwargs: Any) -> Any:
        """:func:`attnlab.save_pretrained` of this model into ``path``; returns the directory."""
        return _implementation("save_pretrained")(self, path, **kwargs)


class GenerationMixin:
    """``model.generate(...)`` for the families that generate text."""

    def generate(self, input_ids: Any, *, max_new_tokens: int, **kwargs: Any) -> Tensor:
        """:func:`attnlab.generate` of this model: the new tokens ``(B·R, N)``; see
        :func:`attnlab.generation.generate` for every option."""
        return _implementation("generate")(self, input_ids, max_new_tokens=max_new_tokens, **kwargs)


__all__ = ["IMPLEMENTATIONS", "GenerationMixin", "PretrainedModel"]
