"""attnlab: the Transformer family from first principles.

Public API: model configs and classes, :data:`PRESETS`, :func:`build_model`, and the layer
package :mod:`attnlab.layers`.
"""

from attnlab.models import (
    MODEL_TYPES,
    PRESETS,
    EncoderDecoderTransformer,
    TransformerConfig,
    build_model,
    config_for,
)

__version__ = "0.1.0"

__all__ = [
    "MODEL_TYPES",
    "PRESETS",
    "EncoderDecoderTransformer",
    "TransformerConfig",
    "__version__",
    "build_model",
    "config_for",
]
