"""attnlab: the Transformer family from first principles.

Public API: model configs and classes, :data:`PRESETS`, :func:`build_model`, and the layer
package :mod:`attnlab.layers`.
"""

from attnlab.analysis.params import count_params
from attnlab.models import (
    BERT,
    GPT,
    MODEL_TYPES,
    PRESETS,
    BERTConfig,
    EncoderDecoderTransformer,
    GPTConfig,
    TransformerConfig,
    ViT,
    ViTConfig,
    build_model,
    config_for,
    mask_tokens,
)

__version__ = "0.1.0"

__all__ = [
    "BERT",
    "GPT",
    "MODEL_TYPES",
    "PRESETS",
    "BERTConfig",
    "EncoderDecoderTransformer",
    "GPTConfig",
    "TransformerConfig",
    "ViT",
    "ViTConfig",
    "__version__",
    "build_model",
    "config_for",
    "count_params",
    "mask_tokens",
]
