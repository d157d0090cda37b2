"""The building blocks of "Attention Is All You Need", one paper concept per file.

This package never imports ``attnlab.models``, ``training``, ``generation`` or other upper layers.
"""

from attnlab.layers.attention import scaled_dot_product_attention
from attnlab.layers.attention_backends import (
    ATTENTION_BACKEND_FACTORIES,
    ATTENTION_BACKENDS,
    FULL_ATTENTION_BACKENDS,
    get_attention_backend,
)

# The efficient backends register themselves in ATTENTION_BACKENDS on import (after the registry).
from attnlab.layers.attention_bigbird import BigBirdAttention
from attnlab.layers.attention_chunked import ChunkedAttention, chunked_attention
from attnlab.layers.attention_linear import LinearAttention, linear_attention
from attnlab.layers.attention_lsh import LSHAttention
from attnlab.layers.attention_sliding import (
    SlidingWindowAttention,
    sliding_window_attention,
    sliding_window_mask,
)
from attnlab.layers.attention_sparse import FixedAttention, StridedAttention
from attnlab.layers.blocks import DecoderLayer, EncoderLayer
from attnlab.layers.embedding import TokenEmbedding, tie_weights
from attnlab.layers.feedforward import ACTIVATIONS, FeedForward, activation_names
from attnlab.layers.kv_cache import CrossKVCache, KVCache, LayerKVCache
from attnlab.layers.masks import (
    as_attention_mask,
    causal_mask,
    combine_masks,
    padding_mask_from_ids,
    padding_mask_from_lengths,
    to_additive,
)
from attnlab.layers.moe import MoEFeedForward
from attnlab.layers.moe_stats import collect_moe_stats
from attnlab.layers.multihead import MultiHeadAttention
from attnlab.layers.norm import NORMS, BatchNorm, LayerNorm, RMSNorm, build_norm
from attnlab.layers.positional import (
    POSITIONAL_ENCODINGS,
    ALiBi,
    LearnedPositionalEmbedding,
    NoPositionalEncoding,
    PositionalEncoding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    alibi_slopes,
    build_positional_encoding,
    sinusoidal_table,
)
from attnlab.layers.softcap import SoftCappedLinear, soft_cap

__all__ = [
    "ACTIVATIONS",
    "ATTENTION_BACKENDS",
    "ATTENTION_BACKEND_FACTORIES",
    "FULL_ATTENTION_BACKENDS",
    "NORMS",
    "POSITIONAL_ENCODINGS",
    "ALiBi",
    "BatchNorm",
    "BigBirdAttention",
    "ChunkedAttention",
    "CrossKVCache",
    "DecoderLayer",
    "EncoderLayer",
    "FeedForward",
    "FixedAttention",
    "KVCache",
    "LSHAttention",
    "LayerKVCache",
    "LayerNorm",
    "LearnedPositionalEmbedding",
    "LinearAttention",
    "MoEFeedForward",
    "MultiHeadAttention",
    "NoPositionalEncoding",
    "PositionalEncoding",
    "RMSNorm",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "SlidingWindowAttention",
    "SoftCappedLinear",
    "StridedAttention",
    "TokenEmbedding",
    "activation_names",
    "alibi_slopes",
    "as_attention_mask",
    "build_norm",
    "build_positional_encoding",
    "causal_mask",
    "chunked_attention",
    "collect_moe_stats",
    "combine_masks",
    "get_attention_backend",
    "linear_attention",
    "padding_mask_from_ids",
    "padding_mask_from_lengths",
    "scaled_dot_product_attention",
    "sinusoidal_table",
    "sliding_window_attention",
    "sliding_window_mask",
    "soft_cap",
    "tie_weights",
    "to_additive",
]
