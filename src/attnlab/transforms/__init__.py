"""Transforms: functions applied to a built model from outside (floor 3).

The paper's layers describe the mathematics only; what changes *how* a model runs without
changing what it computes (or, for quantization, what it stores) is applied here, to a model
that already exists:

- :mod:`~attnlab.transforms.decode_engine`: the fused CPU decode engine
  (:class:`FusedDecoder`), which runs a causal LM's decoding steps from outside the model on
  decode-time weight copies (:mod:`~attnlab.transforms.decode_weights`) or attnlab's C++ steps
  (:mod:`~attnlab.transforms.decode_layer`, :mod:`attnlab.kernels`); chosen by
  ``GenerationConfig(engine=...)`` (:mod:`attnlab.generation.engines`) for one call.
- :mod:`~attnlab.transforms.precision`: attention computed in float32 inside a bfloat16-autocast
  model (the trainer's mixed precisions on the CPU).
- :mod:`~attnlab.transforms.activation_checkpointing`: recompute every (k-th) block in the
  backward (:func:`checkpoint_blocks`; :func:`activation_memory` measures what it saves).
- :mod:`~attnlab.transforms.compile`: ``torch.compile`` of a model (:func:`compile_model`,
  :func:`uncompiled`).
- weight-only quantization: :func:`quantize` (int8 per channel / int4 group-wise on PyTorch's
  packed CPU kernels; :mod:`~attnlab.transforms.quantize`); the quantized layers
  (:mod:`~attnlab.transforms.quant_modules`, :mod:`~attnlab.transforms.quant_embedding`); formats
  and kernels (:mod:`~attnlab.transforms.quant_formats`); weight bytes for bandwidth floors and
  memory estimates (:mod:`~attnlab.transforms.quant_bytes`); quantized model directories
  (:func:`save_quantized`, :func:`load_quantized`; :mod:`~attnlab.transforms.quant_io`), which
  :func:`attnlab.from_pretrained` and :func:`attnlab.save_pretrained` read and write.

The layers and models keep no quantization code.
"""

from attnlab.transforms.activation_checkpointing import (
    activation_memory,
    checkpoint_blocks,
    checkpointed_blocks,
    remove_checkpointing,
)
from attnlab.transforms.compile import compile_model, is_compiled, uncompiled
from attnlab.transforms.decode_engine import FusedDecoder
from attnlab.transforms.decode_weights import (
    MAX_ROWS,
    ONEDNN_MIN_NUMEL,
    DecodeWeight,
    copy_numel,
    copy_pays,
    decode_layout,
    release_copies,
    reordering_available,
)
from attnlab.transforms.precision import Float32Attention, float32_attention
from attnlab.transforms.quant_bytes import (
    QuantizedFootprint,
    WeightBytes,
    quantized_footprint,
    quantized_weight_bytes,
)
from attnlab.transforms.quant_embedding import QuantizedEmbedding
from attnlab.transforms.quant_io import (
    QUANTIZATION_NAME,
    is_quantized_dir,
    load_quantized,
    read_quantization_config,
    save_quantized,
)
from attnlab.transforms.quant_modules import Int4Linear, Int8Linear, QuantizedLinear
from attnlab.transforms.quantize import (
    FORMATS,
    QuantizationConfig,
    fitting_group_size,
    quantize,
)

__all__ = [
    "FORMATS",
    "MAX_ROWS",
    "ONEDNN_MIN_NUMEL",
    "QUANTIZATION_NAME",
    "DecodeWeight",
    "Float32Attention",
    "FusedDecoder",
    "Int4Linear",
    "Int8Linear",
    "QuantizationConfig",
    "QuantizedEmbedding",
    "QuantizedFootprint",
    "QuantizedLinear",
    "WeightBytes",
    "activation_memory",
    "checkpoint_blocks",
    "checkpointed_blocks",
    "compile_model",
    "copy_numel",
    "copy_pays",
    "decode_layout",
    "fitting_group_size",
    "float32_attention",
    "is_compiled",
    "is_quantized_dir",
    "load_quantized",
    "quantize",
    "quantized_footprint",
    "quantized_weight_bytes",
    "read_quantization_config",
    "release_copies",
    "remove_checkpointing",
    "reordering_available",
    "save_quantized",
    "uncompiled",
]
