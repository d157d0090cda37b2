"""The linear layer of every projection, and the input-major weight copies that decoding uses.

:class:`Linear` is ``torch.nn.Linear`` (same parameters, state dict and initialisation) plus two
decoding aids that :func:`attnlab.generation.layout.decode_layout` switches on for one call:
an optional :class:`DecodeWeight` (a copy of the weight in another memory layout that ``forward``
uses while it is current) and ``decode_block_rows`` (compute the product in blocks of output
rows, :func:`blocked_linear`).

Why a second layout: decoding one sequence turns every projection into a matrix-vector product
(GEMV) that streams the whole weight from memory once per token. ``nn.Linear`` stores ``W`` as
``(out, in)`` and computes ``x Wᵀ``; GPT-2's original ``Conv1D`` stores ``(in, out)`` and computes
``x W``. Same numbers, different BLAS kernels: on the CPU this was measured on (MKL, 1-2 threads)
the input-major kernel reads a *wide* matrix (out > in: the FFN's up projection, the vocabulary
head, q/k/v stacked) about 1.3-1.8x faster, while narrow/square matrices and batches of several
rows gain nothing or lose (benchmarks/generation.py and the CHANGELOG, issue 13). Training keeps
plain contiguous parameters: the copies are made by :func:`attnlab.generation.layout.decode_layout`
and attached only while a decoding call runs.

A copy is *current* while the layers it was made from still hold the same tensors, unchanged (same
storage and version counter): a weight updated in place (an optimizer step, ``load_state_dict``) or
replaced makes ``forward`` fall back to the parameter itself, never to stale numbers.

Why blocks: for a few input rows against a weight far larger than the CPU cache (the vocabulary
projection: 50257 x 768 floats, 154 MB), MKL's matrix product packs the whole weight at every
call, a second round trip to memory; in blocks of 2048 rows (6 MB) the packing stays in cache
(GPT-2 small, 8 rows: 27 -> 19 ms per product on one thread).

Shapes: (..., in) -> (..., out).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _stamps(linears: Sequence[nn.Linear]) -> tuple[tuple[int, int, int], ...]:
    """(identity, storage address, in-place version) of every weight and bias."""
    tensors = [t for lin in linears for t in (lin.weight, lin.bias) if t is not None]
    # Inference tensors keep no version counter (they cannot be changed outside inference mode).
    return tuple((id(t), t.data_ptr(), 0 if t.is_inference() else t._version) for t in tensors)


@dataclass(frozen=True)
class DecodeWeight:
    """Weights (and biases) of one or more linears stacked along ``out``, stored input-major.

    Attributes:
        weight: ``(sum out, in)`` with strides ``(1, sum out)``: an ``(in, out)`` buffer seen
            through a transposed view, so ``F.linear`` computes ``x @ buffer``.
        bias: ``(sum out,)`` or ``None``.
        sources: the layers copied; ``stamps``: their tensors' identity, storage and version at
            copy time.
    """

    weight: Tensor
    bias: Tensor | None
    sources: tuple[nn.Linear, ...]
    stamps: tuple[tuple[int, int, int], ...]

    @classmethod
    def stack(cls, linears: Sequence[nn.Linear]) -> DecodeWeight:
        """Copy ``linears``' weights (same ``in_features``) stacked in order, input-major.

        Raises:
            ValueError: if ``linears`` is empty, their input sizes differ, or only some have a bias.
        """
        if not linears:
            raise ValueError("DecodeWeight.stack needs at least one linear layer")
        if len({lin.in_features for lin in linears}) != 1:
            sizes = [lin.in_features for lin in linears]
            raise ValueError(f"stacked linears must share in_features, got {sizes}")
        biases = [lin.bias for lin in linears]
        if any(b is None for b in biases) and not all(b is None for b in biases):
            raise ValueError("stacked linears must all have a bias or all have none")
        with torch.no_grad():
            weights = [lin.weight for lin in linears]
            buffer = torch.cat([w.t() for w in weights], dim=1).contiguous()  # (in, sum out)
            bias = None if biases[0] is None else torch.cat([b for b in biases if b is not None])
        return cls(buffer.t(), bias, tuple(linears), _stamps(linears))

    def is_current(self) -> bool:
        """True while no source weight or bias has been replaced or modified in place."""
        return _stamps(self.sources) == self.stamps


def blocked_linear(x: Tensor, weight: Tensor, bias: Tensor | None, block_rows: int) -> Tensor:
    """``F.linear(x, weight, bias)`` computed ``block_rows`` output features at a time.

    Not differentiable (it writes into one preallocated output); for inference.

    Shapes:
        x ``(..., in)``, weight ``(out, in)``, bias ``(out,)`` -> ``(..., out)``.

    Raises:
        ValueError: if ``block_rows < 1``.
    """
    if block_rows < 1:
        raise ValueError(f"block_rows must be positive, got {block_rows}")
    n_out = weight.shape[0]
    out = x.new_empty(*x.shape[:-1], n_out)  # (..., out)
    x2, out2 = x.reshape(-1, x.shape[-1]), out.view(-1, n_out)  # (N, in), (N, out)
    for i in range(0, n_out, block_rows):
        w = weight[i : i + block_rows].t()  # (in, block)
        if bias is None:
            torch.mm(x2, w, out=out2[:, i : i + block_rows])
        else:
            torch.addmm(bias[i : i + block_rows], x2, w, out=out2[:, i : i + block_rows])
    return out


class Linear(nn.Linear):
    """``torch.nn.Linear`` with the decoding aids above (both off unless a decoder sets them).

    ``decode_weight``: used instead of the weight while current. ``decode_block_rows``: without
    autograd, compute the product in blocks of that many output features.

    Args: as ``nn.Linear`` (``in_features``, ``out_features``, ``bias``, ``device``, ``dtype``).
    """

    decode_weight: DecodeWeight | None = None
    decode_block_rows: int | None = None

    def forward(self, x: Tensor) -> Tensor:
        """x ``(..., in)`` -> ``(..., out)``."""
        d = self.decode_weight
        if d is not None and d.is_current():
            return F.linear(x, d.weight, d.bias)
        if self.decode_block_rows is not None and not torch.is_grad_enabled():
            return blocked_linear(x, self.weight, self.bias, self.decode_block_rows)
        return F.linear(x, self.weight, self.bias)


__all__ = ["DecodeWeight", "Linear", "blocked_linear"]
