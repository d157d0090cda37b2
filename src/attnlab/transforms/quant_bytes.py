"""How many bytes a model's weights take, and how many one decoded token streams: the
numerator of the bandwidth floor (time per token >= bytes read per token / memory bandwidth).

Decoding a token multiplies every linear weight by one row per sequence, so each weight is read
once per step; token and position tables are only indexed (a few rows), so they are left out
unless a linear reads them too (a tied LM head). Quantized layers count what their active path
reads: the stored tensors for attnlab's float32 kernels and the reference path, PyTorch's
kernel operands otherwise (int8 codes + bfloat16 scales; int4's packed codes + bfloat16 scales
and zeros).

:func:`quantized_footprint` estimates the memory of a quantized model from its configs alone (the
structure built on the ``meta`` device with one and two layers, nothing allocated), for the
memory check of ``attnlab generate`` before a quantized model is loaded or a float one quantized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from attnlab.layers.embedding import TokenEmbedding
from attnlab.layers.positional import PositionalEncoding
from attnlab.transforms.decode_weights import copy_numel
from attnlab.transforms.quant_embedding import QuantizedEmbedding
from attnlab.transforms.quant_io import measure_structure
from attnlab.transforms.quant_modules import QuantizedLinear


@dataclass(frozen=True)
class WeightBytes:
    """Bytes of a model's weights.

    ``stored``: the state dict's tensors by format (``"int8"``/``"int4"``: the quantized
    layers' codes, scales, zeros and biases; unquantized tensors under their dtype's name), each
    shared tensor once. ``kernel_copies``: extra bytes held for the kernels (int4's CPU packing,
    scales in the activation dtype). ``per_token``: what one decoding step streams: every linear
    (float or quantized, the tensors its active path reads) and every other parameter once,
    token and position tables excluded (rows are looked up) unless a linear shares them.
    """

    stored: dict[str, int]
    kernel_copies: int
    per_token: int

    @property
    def total_stored(self) -> int:
        return sum(self.stored.values())


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def quantized_weight_bytes(model: nn.Module) -> WeightBytes:
    """The :class:`WeightBytes` of ``model`` (quantized or not)."""
    stored: dict[str, int] = {}
    seen_stored: set[int] = set()
    seen_read: set[int] = set()
    per_token = kernel = 0
    lookups = (TokenEmbedding, nn.Embedding, PositionalEncoding, QuantizedEmbedding)
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            fmt = f"int{module.bits}"
            for t in module.stored_tensors():
                if id(t) not in seen_stored:
                    seen_stored.add(id(t))
                    stored[fmt] = stored.get(fmt, 0) + _nbytes(t)
            for n in module._non_persistent_buffers_set:
                extra = module._buffers.get(n)
                if extra is not None and id(extra) not in seen_stored:
                    seen_stored.add(id(extra))
                    kernel += _nbytes(extra)
            reads = module.read_tensors()
        else:
            tensors: list[Tensor] = list(module.parameters(recurse=False))
            for t in tensors:
                if id(t) not in seen_stored:
                    seen_stored.add(id(t))
                    name = str(t.dtype).removeprefix("torch.")
                    stored[name] = stored.get(name, 0) + _nbytes(t)
            reads = [] if isinstance(module, lookups) else list(tensors)
        for t in reads:
            if id(t) not in seen_read:
                seen_read.add(id(t))
                per_token += _nbytes(t)
    return WeightBytes(stored, kernel, per_token)


@dataclass(frozen=True)
class QuantizedFootprint:
    """Memory of a quantized model, in bytes (``decode_copy_numel``: elements).

    ``stored``: its state dict (each shared tensor once); ``kernel_copies``: the kernel
    operands made beside it on the CPU; ``decode_copy_numel``: the float32 weights that
    decoding still copies (:func:`attnlab.transforms.decode_weights.copy_numel`: the layers
    left unquantized, e.g. the LM head by default).
    """

    stored: int
    kernel_copies: int
    decode_copy_numel: int

    @property
    def weights(self) -> int:
        return self.stored + self.kernel_copies


def quantized_footprint(config: Any, qconfig: Any) -> QuantizedFootprint:
    """The :class:`QuantizedFootprint` of the model ``config`` builds, quantized as ``qconfig``
    (a :class:`~attnlab.transforms.quantize.QuantizationConfig`), computed on ``meta``.

    Raises:
        ValueError: as :func:`~attnlab.transforms.quantize.quantize` for options that do not
            fit the model.
    """

    def measure(model: nn.Module) -> tuple[int, int, int]:
        linears = [m for m in model.modules() if isinstance(m, QuantizedLinear)]  # each once
        kernel = sum(m.kernel_copy_bytes() for m in linears)
        return quantized_weight_bytes(model).total_stored, kernel, copy_numel(model)

    return QuantizedFootprint(*measure_structure(config, qconfig, measure))


__all__ = ["QuantizedFootprint", "WeightBytes", "quantized_footprint", "quantized_weight_bytes"]
