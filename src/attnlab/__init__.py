"""attnlab: the Transformer family from first principles.

Public API: model configs and classes, :data:`PRESETS`, :func:`build_model`, checkpoints
(:func:`from_pretrained` for attnlab's and Hugging Face's formats, :func:`save_pretrained`),
sentence embeddings (:func:`embed`), text generation (:func:`generate`, greedy/sampling/beam
search with the KV cache; :class:`DecodeSession` holds the fused decode engine across calls),
weight-only quantization (:func:`quantize`, int8/int4), the family contract (:class:`Family`,
:class:`Kind`, :func:`register_family`, :func:`family_of`: what each model family declares for
the upper floors) and the layer package :mod:`attnlab.layers`.
"""

from attnlab.analysis.params import count_params
from attnlab.generation.engines import DecodeSession
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
from attnlab.models.family import Family, Kind, family_of, register_family
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
    "DecodeSession",
    "EncoderDecoderTransformer",
    "Family",
    "GPTConfig",
    "Kind",
    "TransformerConfig",
    "ViT",
    "ViTConfig",
    "__version__",
    "build_model",
    "config_for",
    "count_params",
    "embed",
    "family_of",
    "from_pretrained",
    "generate",
    "mask_tokens",
    "quantize",
    "register_family",
    "save_pretrained",
]
