"""Hook sites: the places inside a layer where an activation may be read or replaced.

A layer with hook sites has a class attribute ``activation_hook = None`` and, at each site,

    if self.activation_hook is not None:
        x = self.activation_hook("site", x)

With nothing hooked (the class default ``None``), a site costs one attribute read and one
comparison: no call, no copy. :mod:`attnlab.inspect` sets the attribute on the instances it hooks
(from outside, for the duration of a ``with`` block) to an object of the :class:`ActivationHook`
protocol, which maps the layer's local site names (``"q"``, ``"resid_mid"``, ...) to the model's
hook names (``"layers.3.attn.q"``) and calls the user's functions; a hook returns the tensor
itself (read only) or a replacement. The layers never learn what is hooked.

Sites by layer: :class:`~attnlab.layers.multihead.MultiHeadAttention` ``q, k, v, scores, weights,
z, out``; :class:`~attnlab.layers.feedforward.FeedForward` ``gate, hidden``;
:class:`~attnlab.layers.blocks.EncoderLayer` / ``DecoderLayer`` ``resid_pre, resid_mid,
resid_cross, ffn.out, resid_post``; the additive positional encodings ``position``.
"""

from __future__ import annotations

from typing import Protocol

from torch import Tensor


class ActivationHook(Protocol):
    """What a layer's ``activation_hook`` attribute holds while hooked."""

    def __call__(self, site: str, x: Tensor) -> Tensor:
        """The activation at ``site`` (``x`` itself, or a replacement of the same shape)."""
        ...

    def wants(self, site: str) -> bool:
        """Whether anything is hooked at ``site`` (lets a layer skip optional work, such as
        computing attention scores that its backend never forms)."""
        ...


__all__ = ["ActivationHook"]
