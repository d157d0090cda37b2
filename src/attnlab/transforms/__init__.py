"""Transforms: functions applied to a built model from outside (floor 3).

The paper's layers describe the mathematics only; what changes *how* a model runs without
changing what it computes is applied here, to a model that already exists:

- :mod:`~attnlab.transforms.decode_weights`: reordered weight copies for the per-token
  projections of decoding on the CPU (used by :mod:`attnlab.generation` for one call);
- :mod:`~attnlab.transforms.precision`: attention computed in float32 inside a bfloat16-autocast
  model (the ``cifar10`` recipe's ``precision=bf16``).
"""

from attnlab.transforms.decode_weights import (
    MAX_ROWS,
    ONEDNN_MIN_NUMEL,
    DecodeWeight,
    copy_numel,
    decode_layout,
    release_copies,
    reordering_available,
)
from attnlab.transforms.precision import Float32Attention, float32_attention

__all__ = [
    "MAX_ROWS",
    "ONEDNN_MIN_NUMEL",
    "DecodeWeight",
    "Float32Attention",
    "copy_numel",
    "decode_layout",
    "float32_attention",
    "release_copies",
    "reordering_available",
]
