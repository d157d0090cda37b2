"""attnlab: the Transformer family from first principles.

Public API: model configs and classes, :data:`PRESETS`, :func:`build_model`, checkpoints
(:func:`from_pretrained` for attnlab's and Hugging Face's formats, :func:`save_pretrained`),
sentence embeddings (:func:`embed`), text generation (:func:`generate`, greedy/sampling/beam
search with the KV cache), weight-only quantization (:func:`quantize`, int8/int4) and the layer
package :mod:`attnlab.layers`.
"""

from attnlab.analysis.params import count_params
from attnlab.generation.generate import generate
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
from attnlab.pretrained import from_pretrained, save_pretrained
from attnlab.sentence import embed
from attnlab.training import rundir as _rundir  # noqa: F401  (from_pretrained reads run dirs)
from attnlab.transforms import quantize

__version__ = "0.2.0"

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
    "embed",
    "from_pretrained",
    "generate",
    "mask_tokens",
    "quantize",
    "save_pretrained",
]
