"""Decode-time weight layouts: faster copies of the projections that run once per token.

Decoding is a chain of skinny matrix products (one row per sequence), each streaming a whole
weight from memory, so the kernel's memory bandwidth decides the time per token. On the CPU
this was measured on (2-core AMD EPYC, MKL and oneDNN as shipped in the torch 2.13 CPU wheel;
``benchmarks/decode_kernels.py``, GPT-2-small shapes, weights streamed so none is served from
cache), oneDNN's inner product on a *reordered* weight read the weights at 19-28 GB/s where
``F.linear`` (MKL) read 7-18 GB/s: 20.2 vs 35.2 ms of products per token for 1 row, 22.9 vs
57.4 ms for 8 rows. The reordered copy serves any number of rows (the reorder only takes the row
count as a hint). On Intel CPUs it is the other way round: on two 2-core Xeons of later sessions
``F.linear`` read the weights faster than the reordered copies (17.5 vs 12.2 GB/s; GPT-2 small
decoded at 26.6 ms per token without copies against 32.4 ms with them, interleaved rounds), as
one expects of MKL, Intel's library, which is known to take slower paths on other vendors' CPUs.
So large weights get reordered copies unless the CPU is an Intel one
(:func:`large_weight_library`; ``ATTNLAB_DECODE_LIBRARY=onednn|mkl`` decides by hand). Small
weights are another matter: oneDNN's fixed cost per call outweighs the
bandwidth (a d_model 128 GPT decoded 1.8x slower), so weights under :data:`ONEDNN_MIN_NUMEL`
elements get an *input-major* copy instead (``(in, out)`` storage used through a transposed
view; MKL's kernel for it beats ``nn.Linear``'s layout on wide matrices read by 1-2 rows).
:func:`copy_pays` says which copies pay for a number of rows: for weights of at least
:data:`ONEDNN_MIN_NUMEL` elements where oneDNN decodes them, and for smaller ones (input-major)
only a stacked q/k/v and wide projections (``out > in``) when at most :data:`MAX_ROWS` rows are
decoded.

:class:`DecodeWeight` is such a copy of one or more linears (a self-attention's q, k and v
stacked into one product); :class:`QuantizedStack` joins a self-attention's int8/int4 q/k/v
layers into one (a copy of their codes). Both record the identity, storage and in-place
version of what they copied (:meth:`DecodeWeight.is_current`), so a copy whose source changed is
never used with stale numbers. The fused decode engine (:mod:`attnlab.transforms.decode_engine`)
makes them for one generation call (or a session the caller holds) and frees them when it ends;
the parameters themselves are never touched. :func:`copy_numel` is what the engine may copy (the
memory check of ``attnlab generate`` counts it).

Shapes: (..., in) -> (..., out).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.layers.blocks import DecoderLayer
from attnlab.layers.feedforward import FeedForward
from attnlab.layers.multihead import MultiHeadAttention
from attnlab.models import build_model
from attnlab.models.family import decoder_stack
from attnlab.transforms.quant_modules import QuantizedLinear, stack_quantized


def _tensor_stamps(tensors: Sequence[Tensor]) -> tuple[tuple[int, int, int], ...]:
    """(identity, storage address, in-place version) of every tensor."""
    # Inference tensors keep no version counter (they cannot be changed outside inference mode).
    return tuple((id(t), t.data_ptr(), 0 if t.is_inference() else t._version) for t in tensors)


def _stamps(linears: Sequence[nn.Linear]) -> tuple[tuple[int, int, int], ...]:
    """:func:`_tensor_stamps` of every weight and bias."""
    return _tensor_stamps([t for lin in linears for t in (lin.weight, lin.bias) if t is not None])


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


MAX_ROWS = 2  # small (input-major) copies pay only for this many rows or fewer


@dataclass(frozen=True)
class QuantizedStack:
    """Quantized q/k/v layers of one self-attention joined into one (see
    :func:`attnlab.transforms.quant_modules.stack_quantized`), with the sources' stamps.

    Calling it computes the joined layer (inference only); :meth:`is_current` as
    :meth:`DecodeWeight.is_current`, over the sources' codes, scales, zeros and biases.
    """

    layer: QuantizedLinear
    sources: tuple[QuantizedLinear, ...]
    stamps: tuple[tuple[int, int, int], ...]

    @classmethod
    def stack(cls, layers: Sequence[QuantizedLinear]) -> QuantizedStack:
        """Join ``layers`` (:func:`~attnlab.transforms.quant_modules.stackable` must hold)."""
        return cls(stack_quantized(list(layers)), tuple(layers), _quantized_stamps(layers))

    def __call__(self, x: Tensor) -> Tensor:
        """x ``(..., in)`` -> ``(..., sum out)``."""
        return self.layer(x)

    def is_current(self) -> bool:
        """True while no source tensor has been replaced or modified in place."""
        return _quantized_stamps(self.sources) == self.stamps


def _quantized_stamps(layers: Sequence[QuantizedLinear]) -> tuple[tuple[int, int, int], ...]:
    """:func:`_tensor_stamps` of every stored tensor (codes, scales, zeros, bias)."""
    return _tensor_stamps([t for layer in layers for t in layer.stored_tensors()])


def decoder_linears(model: nn.Module) -> tuple[list[MultiHeadAttention], list[nn.Linear]]:
    """The self-attentions (q/k/v stacked) and other plain linears that the fused engine may
    copy: those of the decoder layers its family's :class:`~attnlab.models.family.DecoderStack`
    names (self-attention output, a plain FFN's projections) and the LM head. Anything else
    (quantized projections, a mixture of experts) keeps running as it is."""
    stack = decoder_stack(model)
    if stack is None or stack.eager_only is not None:  # the engine does not run it
        return [], []
    attentions: list[MultiHeadAttention] = []
    candidates: list[object] = []
    for layer in stack.layers:
        if not isinstance(layer, DecoderLayer) or layer.cross_attn is not None:
            continue
        mha = layer.self_attn
        if all(isinstance(p, nn.Linear) for p in (mha.q_proj, mha.k_proj, mha.v_proj)):
            attentions.append(mha)
        candidates.append(mha.out_proj)
        if isinstance(layer.ffn, FeedForward):
            ffn = layer.ffn
            candidates += [ffn.up_proj, ffn.gate_proj, ffn.down_proj]
    candidates.append(stack.head)
    # plain linears only (a soft-capped head computes more; the engine runs it as it is)
    return attentions, [m for m in candidates if type(m) is nn.Linear]


def copy_numel(model: nn.Module | Any) -> int:
    """Number of weight and bias elements the fused engine may copy for ``model`` (at most; any
    device, ``meta`` included), or for the model a config builds (built on ``meta``: free,
    for estimates before building)."""
    if not isinstance(model, nn.Module):
        return _config_copy_numel(model)
    attentions, linears = decoder_linears(model)
    layers = [lin for mha in attentions for lin in (mha.q_proj, mha.k_proj, mha.v_proj)]
    tensors = [t for lin in [*layers, *linears] for t in (lin.weight, lin.bias) if t is not None]
    return sum(t.numel() for t in tensors)


def _config_copy_numel(config: Any) -> int:
    """:func:`copy_numel` of the model ``config`` builds, from models of one and two layers
    (built on ``meta``), so that a config claiming a million layers costs nothing to estimate;
    a config whose layers are not alike (per-layer options) is built whole."""
    fields = [
        f.name for f in dataclasses.fields(config) if re.fullmatch(r"n_(\w+_)?layers", f.name)
    ]
    counts = {name: getattr(config, name) for name in fields}
    n = next(iter(counts.values()), None)
    if not isinstance(n, int) or n < 3 or any(v != n for v in counts.values()):
        return copy_numel(build_model(config, device="meta"))
    try:
        one = dataclasses.replace(config, **dict.fromkeys(fields, 1))
        two = dataclasses.replace(config, **dict.fromkeys(fields, 2))
    except (TypeError, ValueError):  # per-layer options tied to the layer count
        return copy_numel(build_model(config, device="meta"))
    c1, c2 = (
        copy_numel(build_model(one, device="meta")),
        copy_numel(build_model(two, device="meta")),
    )
    return c1 + (n - 1) * (c2 - c1)


@functools.cache
def _cpu_vendor() -> str:
    """The CPU's vendor string (``GenuineIntel``, ``AuthenticAMD``, ...; empty if unknown)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


LIBRARY_VARIABLE = "ATTNLAB_DECODE_LIBRARY"


def large_weight_library() -> str:
    """Which library decodes weights of at least :data:`ONEDNN_MIN_NUMEL` elements: ``"onednn"``
    (a reordered copy) or ``"mkl"`` (``F.linear`` on the parameter itself, no copy). Set by
    ``ATTNLAB_DECODE_LIBRARY`` (``onednn``, ``mkl`` or ``auto``); ``auto`` (the default) is
    ``mkl`` on Intel CPUs and ``onednn`` elsewhere (see the module doc).

    Raises:
        ValueError: for another value of ``ATTNLAB_DECODE_LIBRARY``.
    """
    choice = os.environ.get(LIBRARY_VARIABLE, "auto").strip().lower() or "auto"
    if choice not in ("auto", "onednn", "mkl"):
        raise ValueError(f"{LIBRARY_VARIABLE}={choice!r}: expected 'onednn', 'mkl' or 'auto'")
    if choice == "auto":
        return "mkl" if _cpu_vendor() == "GenuineIntel" else "onednn"
    return choice


def copy_pays(linears: Sequence[nn.Linear], rows: int, stacked: bool = False) -> bool:
    """Whether a copy of ``linears`` (``stacked``: a self-attention's q/k/v) speeds up decoding
    ``rows`` rows (see the module doc)."""
    if sum(lin.weight.numel() for lin in linears) >= ONEDNN_MIN_NUMEL:
        return large_weight_library() == "onednn"
    wide = stacked or all(lin.out_features > lin.in_features for lin in linears)
    return rows <= MAX_ROWS and wide


# -- deprecated: the copies used to be kept with the model and patched into it -----------------


def _deprecated(name: str) -> None:
    warnings.warn(
        f"attnlab.transforms.decode_weights.{name} is deprecated and does nothing: decoding "
        "copies belong to the fused decode engine for one call or session "
        "(GenerationConfig(engine=...), attnlab.generation.engines)",
        DeprecationWarning,
        stacklevel=3,
    )


@contextmanager
def decode_layout(model: nn.Module, rows: int) -> Iterator[None]:
    """Deprecated, does nothing: the fused decode engine makes and owns the copies."""
    _deprecated("decode_layout")
    yield


def release_copies(model: nn.Module) -> None:
    """Deprecated, does nothing: no copies are kept with a model any more."""
    _deprecated("release_copies")


def active_copy(module: nn.Module) -> None:
    """Deprecated: always ``None`` (nothing is patched into a model any more)."""
    _deprecated("active_copy")


__all__ = [
    "LIBRARY_VARIABLE",
    "MAX_ROWS",
    "ONEDNN_MIN_NUMEL",
    "DecodeWeight",
    "QuantizedStack",
    "active_copy",
    "copy_numel",
    "copy_pays",
    "decode_layout",
    "decoder_linears",
    "large_weight_library",
    "release_copies",
    "reordering_available",
]
