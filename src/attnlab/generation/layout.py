"""Decode-time weight layout: faster copies of the projections that run once per token.

Decoding is a chain of skinny matrix products, each streaming a whole weight from memory; on the
CPU, oneDNN's inner product on a reordered weight streams a large weight much faster than
``F.linear``, and small weights read by 1-2 rows go faster input-major
(:mod:`attnlab.layers.linear`; ``benchmarks/decode_kernels.py``). :func:`decode_layout` gives,
for the duration of one decoding call,

- every decoder self-attention a stacked q/k/v copy (one product instead of three),
- every other projection of the decoder layers that runs per token (self-attention output,
  cross-attention query and output, the FFN's linears) and the LM head a copy of its own,

where a copy pays: always for weights of at least
:data:`~attnlab.layers.linear.ONEDNN_MIN_NUMEL` elements (reordered), and for smaller ones
(input-major) only the stacked q/k/v and the wide projections (``out > in``) when at most
:data:`MAX_ROWS` rows are decoded; it detaches them afterwards. Cross-attention keys/values
are projected once per call from the encoder memory and keep the parameters. The parameters
themselves are never touched (training, optimizer state and checkpoints see plain contiguous
tensors); a copy whose source changes during the call is ignored
(:meth:`~attnlab.layers.linear.DecodeWeight.is_current`). Making the copies costs one pass over
the weights (~0.3 s for GPT-2 small), so they are kept with the model between calls and made
again only for weights that changed since (a model being trained gets fresh ones at each
sampling call); :func:`release_copies` frees them.

Measured effect (``benchmarks/generation.py``, GPT-2 small shapes, 2 threads): see
``benchmarks/results/generation.md`` and the CHANGELOG (issue 13). The price is memory: the
copies hold the decoder's weights again, about 1.0x GPT-2 small's weights (~0.5 GB), from the
first decoding call until the model goes or :func:`release_copies`; the memory check of
``attnlab generate`` counts them (:func:`copy_numel`). Models off the CPU, in another dtype than
fp32, or without oneDNN decode with the parameters.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from torch import nn

from attnlab.layers.blocks import DecoderLayer
from attnlab.layers.linear import ONEDNN_MIN_NUMEL, DecodeWeight, Linear, reordering_available
from attnlab.layers.multihead import MultiHeadAttention

MAX_ROWS = 2  # small (input-major) copies pay only for this many rows or fewer

# model -> {self-attention or linear -> its copy}; an entry goes with its model.
_COPIES: weakref.WeakKeyDictionary[nn.Module, dict[nn.Module, DecodeWeight]] = (
    weakref.WeakKeyDictionary()
)


def _decoder_parts(model: nn.Module) -> tuple[list[MultiHeadAttention], list[Linear]]:
    """The self-attentions (stacked q/k/v) and other linears that run once per decoded token."""
    attentions: list[MultiHeadAttention] = []
    linears: list[Linear] = []
    for module in model.modules():
        if isinstance(module, DecoderLayer):
            attentions.append(module.self_attn)
            linears.append(module.self_attn.out_proj)
            if module.cross_attn is not None:
                linears += [module.cross_attn.q_proj, module.cross_attn.out_proj]
            linears += [m for m in module.ffn.modules() if isinstance(m, Linear)]
    head = getattr(model, "lm_head", None)
    if isinstance(head, Linear):
        linears.append(head)
    return attentions, linears


def copy_numel(model: nn.Module) -> int:
    """Number of weight and bias elements :func:`decode_layout` may copy for ``model`` (at most;
    any device, ``meta`` included: for estimates before building)."""
    attentions, linears = _decoder_parts(model)
    layers = [lin for mha in attentions for lin in (mha.q_proj, mha.k_proj, mha.v_proj)]
    tensors = [t for lin in [*layers, *linears] for t in (lin.weight, lin.bias) if t is not None]
    return sum(t.numel() for t in tensors)


def _pays(linears: Sequence[nn.Linear], rows: int, stacked: bool) -> bool:
    """Whether a copy of ``linears`` speeds up decoding ``rows`` rows (see the module doc)."""
    if sum(lin.weight.numel() for lin in linears) >= ONEDNN_MIN_NUMEL:
        return True
    wide = stacked or all(lin.out_features > lin.in_features for lin in linears)
    return rows <= MAX_ROWS and wide


def _current_copy(
    copies: dict[nn.Module, DecodeWeight],
    owner: nn.Module,
    linears: Sequence[nn.Linear],
    rows: int,
) -> DecodeWeight:
    """``owner``'s cached copy of ``linears``, made again if they changed since."""
    old = copies.pop(owner, None)
    if old is not None and old.sources == tuple(linears) and old.is_current():
        copies[owner] = old
    else:
        del old  # free the stale copy before making the new one
        copies[owner] = DecodeWeight.stack(linears, rows)
    return copies[owner]


@contextmanager
def decode_layout(model: nn.Module, rows: int) -> Iterator[None]:
    """Give ``model``'s per-token projections reordered copies for one decoding call.

    The copies are kept with the model for the next call (made again only for weights that
    changed); :func:`release_copies` frees them.

    Args:
        model: the model about to decode (its modules get copies; parameters are unchanged).
        rows: how many rows are decoded together: decides which copies pay, and is a layout
            hint for new reordered copies (which serve any number of rows). A model whose
            weights are not fp32 on the CPU, or a torch without oneDNN, is left as it is.
    """
    attentions, linears = _decoder_parts(model)
    weights = [lin.weight for lin in linears] + [m.q_proj.weight for m in attentions]
    if not all(reordering_available(w) for w in weights):
        attentions, linears = [], []
    attentions = [m for m in attentions if _pays([m.q_proj, m.k_proj, m.v_proj], rows, True)]
    linears = [lin for lin in linears if _pays([lin], rows, False)]
    copies = _COPIES.setdefault(model, {}) if linears or attentions else {}
    try:
        for mha in attentions:
            mha.decode_qkv = _current_copy(copies, mha, [mha.q_proj, mha.k_proj, mha.v_proj], rows)
        for lin in linears:
            lin.decode_weight = _current_copy(copies, lin, [lin], rows)
        yield
    finally:
        for mha in attentions:
            mha.decode_qkv = None
        for lin in linears:
            lin.decode_weight = None


def release_copies(model: nn.Module) -> None:
    """Free the decoding copies kept for ``model`` (they are made again when needed)."""
    _COPIES.pop(model, None)


__all__ = ["MAX_ROWS", "copy_numel", "decode_layout", "release_copies"]
