"""Decode-time weight layout: input-major copies of the wide projections while decoding 1-2 rows.

Decoding a sequence is a chain of matrix-vector products, each streaming a whole weight from
memory; on CPU the input-major kernel (``x @ W`` with ``W`` stored ``(in, out)``, GPT-2's
``Conv1D``) reads wide matrices faster than ``nn.Linear``'s ``(out, in)`` layout (see
:mod:`attnlab.layers.linear`). :func:`decode_layout` gives, for the duration of one decoding call,

- every decoder self-attention a stacked q/k/v copy (one product instead of three), and
- every wide :class:`~attnlab.layers.linear.Linear` of the decoder layers and the LM head
  (``out_features > in_features``: the FFN's up/gate projections, the vocabulary projection)
  an input-major copy,
- or, decoding more rows, the LM head a blocked product (no copy; see
  :func:`~attnlab.layers.linear.blocked_linear`: 8 rows of GPT-2 small, 82 -> 73 ms per token
  on one thread, 110 -> 78 ms on two),

and detaches them afterwards. The parameters themselves are never touched (training, optimizer
state and checkpoints see plain contiguous tensors); a copy whose source changes during the call
is ignored (:meth:`~attnlab.layers.linear.DecodeWeight.is_current`). Making the copies costs a
transposing copy of each weight (~0.4 s for GPT-2 small, the cost of ~40 tokens), so they are
kept with the model between calls and made again only for weights that changed since (a model
being trained gets fresh ones at each sampling call); :func:`release_copies` frees them.

When it pays (GPT-2 small shapes, interleaved A/B of decode steps on the 2-core dev machine,
indicative): 1 row, 27% less time per token (42 -> 31 ms, 1 thread); 2 rows, 29% less
(76 -> 54 ms); 4 rows, no gain; 8 rows, 18% *more* with 2 threads. So only CPU models decoding
at most :data:`MAX_ROWS` rows use it. The price is memory: the copies hold about 70% of GPT-2
small's weights again (350 MB), from the first such call until the model goes or
:func:`release_copies`.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from torch import nn

from attnlab.layers.blocks import DecoderLayer
from attnlab.layers.linear import DecodeWeight, Linear
from attnlab.layers.multihead import MultiHeadAttention

MAX_ROWS = 2  # decoding more rows at once: small matrix products, no gain from the copies
HEAD_BLOCK_ROWS = 2048  # vocabulary rows per block of the LM head's product for more rows

# model -> {self-attention or linear -> its copy}; an entry goes with its model.
_COPIES: weakref.WeakKeyDictionary[nn.Module, dict[nn.Module, DecodeWeight]] = (
    weakref.WeakKeyDictionary()
)


def _decoder_parts(model: nn.Module) -> tuple[list[MultiHeadAttention], list[Linear]]:
    """The self-attentions and wide linears that run once per decoded token."""
    attentions: list[MultiHeadAttention] = []
    linears: list[Linear] = []
    for module in model.modules():
        if isinstance(module, DecoderLayer):
            attentions.append(module.self_attn)
            linears += [m for m in module.ffn.modules() if isinstance(m, Linear)]
    head = getattr(model, "lm_head", None)
    if isinstance(head, Linear):
        linears.append(head)
    wide = [lin for lin in linears if lin.out_features > lin.in_features]
    if not all(lin.weight.device.type == "cpu" for lin in wide):
        return [], []
    return attentions, wide


def _current_copy(
    copies: dict[nn.Module, DecodeWeight], owner: nn.Module, linears: Sequence[nn.Linear]
) -> DecodeWeight:
    """``owner``'s cached copy of ``linears``, made again if they changed since."""
    old = copies.pop(owner, None)
    if old is not None and old.sources == tuple(linears) and old.is_current():
        copies[owner] = old
    else:
        del old  # free the stale copy before making the new one
        copies[owner] = DecodeWeight.stack(linears)
    return copies[owner]


@contextmanager
def decode_layout(model: nn.Module, rows: int) -> Iterator[None]:
    """Give ``model``'s per-token projections input-major copies while decoding a few rows.

    The copies are kept with the model for the next call (made again only for weights that
    changed); :func:`release_copies` frees them.

    Args:
        model: the model about to decode (its modules get copies; parameters are unchanged).
        rows: how many rows are decoded together; more than :data:`MAX_ROWS` decodes with the
            parameters themselves, the LM head in blocks of :data:`HEAD_BLOCK_ROWS` vocabulary
            rows (:func:`~attnlab.layers.linear.blocked_linear`). A model off the CPU is left
            as it is.
    """
    attentions, wide = _decoder_parts(model)  # none off the CPU
    head = next((lin for lin in wide if lin is getattr(model, "lm_head", None)), None)
    if rows > MAX_ROWS:  # no copies; the LM head's product in blocks
        attentions, wide = [], []
    else:
        head = None
    copies = _COPIES.setdefault(model, {}) if wide or attentions else {}
    try:
        for mha in attentions:
            mha.decode_qkv = _current_copy(copies, mha, [mha.q_proj, mha.k_proj, mha.v_proj])
        for lin in wide:
            lin.decode_weight = _current_copy(copies, lin, [lin])
        if head is not None:
            head.decode_block_rows = HEAD_BLOCK_ROWS
        yield
    finally:
        for mha in attentions:
            mha.decode_qkv = None
        for lin in wide:
            lin.decode_weight = None
        if head is not None:
            head.decode_block_rows = None


def release_copies(model: nn.Module) -> None:
    """Free the decoding copies kept for ``model`` (they are made again when needed)."""
    _COPIES.pop(model, None)


__all__ = ["HEAD_BLOCK_ROWS", "MAX_ROWS", "decode_layout", "release_copies"]
