"""The linear layer of every projection, and the reordered weight copies that decoding uses.

:class:`Linear` is ``torch.nn.Linear`` (same parameters, state dict and initialisation) plus one
decoding aid that :func:`attnlab.generation.layout.decode_layout` switches on for one call: an
optional :class:`DecodeWeight`, a copy of the weight (or of several weights stacked) in oneDNN's
preferred memory layout, which ``forward`` uses, without autograd, while it is current.

Why a second layout: decoding turns every projection into a skinny product (one row per
sequence) that streams the whole weight from memory once per token, so the kernel's memory
bandwidth decides the time per token. On the CPU this was measured on (2-core AMD EPYC, MKL and
oneDNN as shipped in the torch 2.13 CPU wheel; ``benchmarks/decode_kernels.py``, GPT-2-small
shapes, weights streamed so none is served from cache), oneDNN's inner product on a reordered
weight read the weights at 19-28 GB/s where ``F.linear`` (MKL) read 7-18 GB/s: 20.2 vs 35.2 ms
of products per token for 1 row, 22.9 vs 57.4 ms for 8 rows. The reordered copy serves any
number of rows (the reorder only takes the row count as a hint). Small weights are another
matter: oneDNN's fixed cost per call outweighs the bandwidth (a d_model 128 GPT decoded 1.8x
slower), so weights under :data:`ONEDNN_MIN_NUMEL` elements get an *input-major* copy instead
(``(in, out)`` storage, GPT-2's ``Conv1D`` layout, used through a transposed view; MKL's kernel
for it beats ``nn.Linear``'s layout on wide matrices read by 1-2 rows). Training keeps plain
contiguous parameters.

A copy is *current* while the layers it was made from still hold the same tensors, unchanged (same
storage and version counter): a weight updated in place (an optimizer step, ``load_state_dict``) or
replaced makes ``forward`` fall back to the parameter itself, never to stale numbers.

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


ONEDNN_MIN_NUMEL = 1 << 18  # elements (1 MiB of fp32): smaller copies are input-major


def reordering_available(weight: Tensor) -> bool:
    """Whether :class:`DecodeWeight` can copy ``weight``: an fp32 CPU tensor with oneDNN present."""
    return (
        torch.backends.mkldnn.is_available()
        and weight.device.type == "cpu"
        and weight.dtype == torch.float32
    )


@dataclass(frozen=True)
class DecodeWeight:
    """Weights (and biases) of one or more linears stacked along ``out``, in a decoding layout.

    Calling it computes ``F.linear(x, stacked weight, stacked bias)`` (inference only: no
    autograd): with oneDNN's inner product for a reordered copy, with MKL for an input-major one.

    Attributes:
        weight: ``(sum out, in)``: a oneDNN tensor (``is_mkldnn``) in the kernel's layout, or,
            below :data:`ONEDNN_MIN_NUMEL` elements, an ``(in, sum out)`` buffer seen transposed
            (strides ``(1, sum out)``).
        bias: ``(sum out,)`` or ``None``.
        sources: the layers copied; ``stamps``: their tensors' identity, storage and version at
            copy time.
    """

    weight: Tensor
    bias: Tensor | None
    sources: tuple[nn.Linear, ...]
    stamps: tuple[tuple[int, int, int], ...]

    @classmethod
    def stack(cls, linears: Sequence[nn.Linear], rows: int | None = None) -> DecodeWeight:
        """Copy ``linears``' weights (same ``in_features``) stacked in order: reordered for
        oneDNN, or input-major below :data:`ONEDNN_MIN_NUMEL` elements.

        Args:
            linears: the layers, fp32 on the CPU.
            rows: the number of input rows expected (a layout hint; any number works).

        Raises:
            ValueError: if ``linears`` is empty, their input sizes differ, only some have a bias,
                or a weight is not an fp32 CPU tensor (or oneDNN is missing).
        """
        if not linears:
            raise ValueError("DecodeWeight.stack needs at least one linear layer")
        if len({lin.in_features for lin in linears}) != 1:
            sizes = [lin.in_features for lin in linears]
            raise ValueError(f"stacked linears must share in_features, got {sizes}")
        biases = [lin.bias for lin in linears]
        if any(b is None for b in biases) and not all(b is None for b in biases):
            raise ValueError("stacked linears must all have a bias or all have none")
        bad = [lin.weight for lin in linears if not reordering_available(lin.weight)]
        if bad:
            raise ValueError(
                "DecodeWeight needs fp32 CPU weights and oneDNN (torch.backends.mkldnn), got "
                f"{bad[0].dtype} on {bad[0].device}"
            )
        with torch.no_grad():
            weights = [lin.weight.detach() for lin in linears]
            if sum(w.numel() for w in weights) >= ONEDNN_MIN_NUMEL:
                stacked = weights[0] if len(weights) == 1 else torch.cat(weights)  # (out, in)
                copy = torch.ops.mkldnn._reorder_linear_weight(stacked.contiguous(), rows)
            else:
                copy = torch.cat([w.t() for w in weights], dim=1).contiguous().t()
            bias = None if biases[0] is None else torch.cat([b for b in biases if b is not None])
        return cls(copy, bias, tuple(linears), _stamps(linears))

    @property
    def reordered(self) -> bool:
        """True for a oneDNN copy, False for an input-major one."""
        return bool(self.weight.is_mkldnn)

    def __call__(self, x: Tensor) -> Tensor:
        """x ``(..., in)`` -> ``(..., sum out)`` (no autograd)."""
        if self.weight.is_mkldnn:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

    def is_current(self) -> bool:
        """True while no source weight or bias has been replaced or modified in place."""
        return _stamps(self.sources) == self.stamps


class Linear(nn.Linear):
    """``torch.nn.Linear`` with the decoding aid above (off unless a decoder sets it).

    ``decode_weight``: used instead of the weight while current and autograd is off.

    Args: as ``nn.Linear`` (``in_features``, ``out_features``, ``bias``, ``device``, ``dtype``).
    """

    decode_weight: DecodeWeight | None = None

    def forward(self, x: Tensor) -> Tensor:
        """x ``(..., in)`` -> ``(..., out)``."""
        d = self.decode_weight
        if d is not None and not torch.is_grad_enabled() and d.is_current():
            return d(x)
        return F.linear(x, self.weight, self.bias)


__all__ = ["ONEDNN_MIN_NUMEL", "DecodeWeight", "Linear", "reordering_available"]
