"""Training and inference memory from a config: weights, gradients, Adam state, activations, KV
cache.

Weights, gradients and optimizer state are per parameter (:func:`training_memory`):

- float32 training: 4 (weights) + 4 (gradients) + 8 (Adam's two moments) = 16 bytes/parameter;
- 16-bit mixed precision: 2 + 2 + 4 (float32 master weights) + 8 = 16 bytes/parameter.

Activations (:func:`activation_bytes`) are the tensors autograd keeps for the backward of one
training step, as attnlab's layers produce them with the ``"math"`` attention backend, no
activation checkpointing and no dropout (dropout adds a 1-byte mask per dropped element on CUDA;
PyTorch's CPU dropout keeps more). Per layer, with t = B·T tokens, E = d_model, F = d_ff,
H heads and S keys:

- each sublayer (attention or FFN): its input and its normalised input, ``2·t·E`` (RMSNorm keeps
  one more ``t·E``), plus the norm's per-token statistics;
- attention: the ``q``, ``k``, ``v`` operands of the two products (``k``/``v`` expanded to all
  H heads under GQA, as the math path does) and the output projection's input, ``t·E + 2·B·S·E +
  t·E``; the scores before the softmax (kept for the masking/clamping) and the softmax output,
  ``2·B·H·T·S``, plus the masked weights when a mask applies (``3·B·H·T·S``); the ``q``/``k``
  operands and the scores are float32 (the math path computes scores in at least float32);
- FFN: the hidden activations, ``2·t·F`` (ReLU keeps its output only: ``t·F``; GLU variants
  ``4·t·F``).

Outside the layers: the token ids, the final norm and head inputs, and for language models the
float32 log-softmax of the logits kept by the cross-entropy, ``t·V``. Small tensors that do not
grow with the batch (boolean masks of ``T·S`` bytes, RoPE tables) are left out. A fused attention
kernel (SDPA/flash) keeps O(T) per row instead of the ``B·H·T·S`` score tensors: the difference
:func:`activation_bytes` shows as ``"attention_scores"``.

Activation checkpointing (``checkpoint_every=k``: the blocks ``0, k, 2k, ...`` of each stack,
:mod:`attnlab.transforms.activation_checkpointing`): a checkpointed block keeps only its input,
``t·E``, and the backward recomputes one block at a time, so the stack holds
``(n - c)·block + c·t·E + block`` for ``c`` checkpointed blocks of ``n``.

KV cache (:func:`kv_cache_bytes`): ``2 (k and v) · layers · H_kv · D · bytes`` per cached position
and sequence; a sliding window of ``w`` keys caps the positions at ``w`` (attnlab's
:class:`~attnlab.layers.kv_cache.LayerKVCache` preallocates ``max_len`` positions and does not
evict, so without a window its allocation is the full context).

Shapes: B batch, T (target) length, S keys (source length for cross-attention), E d_model,
F d_ff, H heads, H_kv kv heads, D head dim, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnlab.analysis.flops import check_length, default_seq_len
from attnlab.analysis.params import count_params
from attnlab.layers.feedforward import GATED
from attnlab.models.bert import BERTConfig
from attnlab.models.gpt import GPTConfig
from attnlab.models.transformer import TransformerConfig
from attnlab.models.vit import ViTConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
ADAM_STATE_BYTES = 8  # two float32 moments per parameter
FP32 = 4
INDEX_BYTES = 8  # int64 token ids / targets
# the trainer's precision -> bytes per (activation element, weight, gradient, Adam state) of a
# parameter; the mixed modes' weights are the float32 master + autocast's 16-bit copy
PRECISION_BYTES = {
    "fp32": (4, 4, 4, 8),
    "bf16-mixed": (2, 4 + 2, 4, 8),
    "fp16-mixed": (2, 4 + 2, 4, 8),
    "bf16": (2, 2, 2, 4),
}


def dtype_bytes(dtype: str | int) -> int:
    """Bytes per element of a dtype name (``"float32"``, ``"bfloat16"``...) or a byte count.

    Raises:
        ValueError: for an unknown name or a non-positive count.
    """
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        return check_length("dtype bytes", dtype)
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes of one training step (Adam), by kind."""

    weights: int
    gradients: int
    optimizer: int  # Adam moments (+ float32 master weights under mixed precision)
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations

    def as_dict(self) -> dict[str, int]:
        return {
            "weights": self.weights,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "total": self.total,
        }


# -- activations ---------------------------------------------------------------------------------


def _norm_elems(c: Any, t: int) -> int:
    """Elements a norm keeps besides its input: LayerNorm mean + rstd, RMSNorm x̂ and 1/rms."""
    return t * c.d_model + t if c.norm == "rmsnorm" else 2 * t


def _attention_elems(c: Any, *, B: int, T: int, S: int, masked: bool) -> tuple[int, int]:
    """(activation-dtype elements, float32 elements) of one attention sublayer."""
    E, H = c.d_model, c.n_heads
    t = B * T
    act = 2 * t * E + _norm_elems(c, t)  # sublayer input + projection input (+ norm stats)
    act += B * S * E + t * E  # v operand (all heads) + output-projection input
    fp32 = t * E + B * S * E  # q and k operands of QKᵀ
    fp32 += (3 if masked else 2) * B * H * T * S  # scores, softmax output (+ masked weights)
    return act, fp32


def _ffn_elems(c: Any, t: int) -> int:
    if c.activation in GATED:
        hidden = 4
    elif c.activation == "relu":
        hidden = 1
    else:
        hidden = 2
    return 2 * t * c.d_model + _norm_elems(c, t) + hidden * t * c.d_ff


def _layer_stack(
    c: Any, *, B: int, T: int, n_layers: int, masked: bool, memory_len: int | None = None,
    every: int = 0,
) -> tuple[int, int, int]:  # fmt: skip
    """(activation elements, float32 elements, of which score elements) of a stack; with
    ``every`` k > 0, every k-th block checkpointed (module docstring)."""
    act, fp32 = _attention_elems(c, B=B, T=T, S=T, masked=masked)
    scores = (3 if masked else 2) * B * c.n_heads * T * T
    if memory_len is not None:
        a2, f2 = _attention_elems(c, B=B, T=T, S=memory_len, masked=masked)
        act, fp32 = act + a2, fp32 + f2
        scores += (3 if masked else 2) * B * c.n_heads * T * memory_len
    act += _ffn_elems(c, B * T)
    if every <= 0:
        return n_layers * act, n_layers * fp32, n_layers * scores
    kept = n_layers - (n_layers + every - 1) // every  # blocks not checkpointed
    plain = min(kept + 1, n_layers)  # + the one block recomputed at a time
    inputs = (n_layers - kept) * B * T * c.d_model
    return plain * act + inputs, plain * fp32, plain * scores


# Families whose activations are not an attention stack's register their formula here:
# ``fn(config, *, batch, seq_len, a) -> {"layers", "outside_layers", "attention_scores", "total",
# ...}`` with ``a`` bytes per element (attnlab.analysis.recurrent_memory: Mamba, LSTM/GRU).
ACTIVATION_FORMULAS: dict[type[Any], Callable[..., dict[str, int]]] = {}


def activation_bytes(
    config: Any,
    seq_len: int | None = None,
    *,
    batch: int = 1,
    src_len: int | None = None,
    dtype: str | int = "float32",
    checkpoint_every: int = 0,
) -> dict[str, int]:
    """Bytes autograd keeps for the backward of one training step (assumptions: module doc);
    ``checkpoint_every``: activation checkpointing of every k-th block (0: none).

    Returns:
        ``{"layers": ..., "outside_layers": ..., "attention_scores": ..., "total": ...}``;
        ``attention_scores`` is the part of ``layers`` held by the ``B·H·T·S`` score tensors.

    Raises:
        ValueError: for non-positive sizes or an unknown config type.
    """
    a = dtype_bytes(dtype)
    B = check_length("batch", batch)
    T = default_seq_len(config) if seq_len is None else check_length("seq_len", seq_len)
    if checkpoint_every < 0:
        raise ValueError(f"checkpoint_every must be >= 0, got {checkpoint_every}")
    formula = ACTIVATION_FORMULAS.get(type(config))
    if formula is not None:  # recurrent families: checkpointing not modelled (an upper bound)
        return formula(config, batch=B, seq_len=T, a=a)
    c, k = config, checkpoint_every
    t = B * T
    outside = 0
    if isinstance(c, GPTConfig):
        act, fp32, scores = _layer_stack(c, B=B, T=T, n_layers=c.n_layers, masked=True, every=k)
        outside += 2 * t * INDEX_BYTES  # ids, targets
        if getattr(c, "embed_norm", False):
            outside += (t * c.d_model + _norm_elems(c, t)) * a
        final = (t * c.d_model + _norm_elems(c, t)) if c.use_final_norm else 0
        outside += (final + t * c.d_model) * a + t * c.vocab_size * FP32  # head in, log-softmax
    elif isinstance(c, BERTConfig):
        masked = c.pad_id is not None
        act, fp32, scores = _layer_stack(c, B=B, T=T, n_layers=c.n_layers, masked=masked,
                                         every=k)  # fmt: skip
        outside += 2 * t * INDEX_BYTES  # ids, segment ids
        outside += (t * c.d_model + _norm_elems(c, t)) * a  # embedding norm
        if c.norm_position == "pre":
            outside += (t * c.d_model + _norm_elems(c, t)) * a
        if c.pooler:
            # tanh output; the pooler's input is a view of the last hidden state, which keeps
            # its whole storage alive (already counted when the MLM head keeps it too)
            outside += (B + (0 if c.mlm_head else t)) * c.d_model * a
        if c.mlm_head:
            # dense input, activation input, norm input (+ stats), decoder input; log-softmax
            outside += (4 * t * c.d_model + _norm_elems(c, t)) * a + t * c.vocab_size * FP32
    elif isinstance(c, ViTConfig):
        if T < 2:
            raise ValueError(f"a ViT sequence is [CLS] + at least one patch; got seq_len={T}")
        act, fp32, scores = _layer_stack(c, B=B, T=T, n_layers=c.n_layers, masked=False, every=k)
        outside += (t * c.d_model + _norm_elems(c, t)) * a  # final norm
        outside += B * (T - 1) * c.in_channels * c.patch_size**2 * a  # images (conv weight grad)
        # what the pooler/head keeps: [CLS] is a view keeping the final hidden state alive, a
        # mean is a new (B, E); a pooler keeps its tanh output too (the head's input)
        pooler = getattr(c, "pooler", False)
        if pooler or c.n_classes:
            outside += (t if c.pool == "cls" else B) * c.d_model * a
        if pooler:
            outside += B * c.d_model * a
    elif isinstance(c, TransformerConfig):
        S = T if src_len is None else check_length("src_len", src_len)
        masked = c.pad_id is not None
        enc = _layer_stack(c, B=B, T=S, n_layers=c.n_layers, masked=masked, every=k)
        dec = _layer_stack(c, B=B, T=T, n_layers=c.num_decoder_layers, masked=True,
                           memory_len=S, every=k)  # fmt: skip
        act, fp32, scores = (x + y for x, y in zip(enc, dec, strict=True))
        outside += (B * S + 2 * t) * INDEX_BYTES  # source ids, target ids, targets
        outside += B * S * c.d_model * a  # the memory, input of every cross-attention k/v
        if c.use_final_norm:
            outside += ((B * S + t) * c.d_model + _norm_elems(c, B * S) + _norm_elems(c, t)) * a
        outside += t * c.d_model * a + t * c.target_vocab_size * FP32
    else:
        raise ValueError(f"no activation formula for {type(c).__name__}")
    layers = act * a + fp32 * max(a, FP32)
    return {
        "layers": layers,
        "outside_layers": outside,
        "attention_scores": scores * max(a, FP32),
        "total": layers + outside,
    }


def training_memory(
    config: Any,
    seq_len: int | None = None,
    *,
    batch: int = 1,
    src_len: int | None = None,
    dtype: str | int = "float32",
    precision: str | None = None,
    checkpoint_every: int = 0,
) -> TrainingMemory:
    """Weights + gradients + Adam state + activations of one training step, in bytes.

    ``dtype`` is the weights' and activations' dtype; below 4 bytes, mixed precision is assumed
    (float32 master weights kept by the optimizer). ``precision`` (the trainer's, overrides
    ``dtype``): ``"fp32"``; ``"bf16-mixed"``/``"fp16-mixed"`` (autocast: float32 weights,
    gradients and Adam state, plus the 16-bit copies of the weights autocast makes, counted in
    ``weights``; 16-bit activations); ``"bf16"`` (everything in bfloat16, Adam's moments too).
    ``checkpoint_every``: activation checkpointing (:func:`activation_bytes`).

    Raises:
        ValueError: for an unknown ``precision`` or ``dtype``.
    """
    N = count_params(config)
    if precision is None:
        a = dtype_bytes(dtype)
        weights, grads = N * a, N * a
        optimizer = N * (ADAM_STATE_BYTES + (FP32 if a < FP32 else 0))
    elif precision in PRECISION_BYTES:
        a, w, g, o = PRECISION_BYTES[precision]
        weights, grads, optimizer = N * w, N * g, N * o
    else:
        raise ValueError(f"unknown precision {precision!r}; valid: {', '.join(PRECISION_BYTES)}")
    acts = activation_bytes(config, seq_len, batch=batch, src_len=src_len, dtype=a,
                            checkpoint_every=checkpoint_every)["total"]  # fmt: skip
    return TrainingMemory(weights, grads, optimizer, acts)


# -- KV cache ------------------------------------------------------------------------------------


def _decoder_sizes(config: Any) -> tuple[int, int, bool]:
    """(decoder layers, H_kv · D, has cross-attention) of a model that decodes with a cache."""
    if isinstance(config, GPTConfig):
        layers, cross = config.n_layers, False
    elif isinstance(config, TransformerConfig):
        layers, cross = config.num_decoder_layers, True
    else:
        raise ValueError(
            f"{type(config).__name__} is an encoder: it has no KV cache "
            "(decoder models: GPTConfig, TransformerConfig)"
        )
    kv = (config.n_kv_heads or config.n_heads) * config.d_head
    return layers, kv, cross


def kv_cache_bytes_per_token(config: Any, *, dtype: str | int = "float32") -> int:
    """Self-attention cache bytes per cached position and sequence: ``2·layers·H_kv·D·bytes``.

    Raises:
        ValueError: for an encoder-only config (no cache) or an unknown dtype.
    """
    layers, kv, _ = _decoder_sizes(config)
    return 2 * layers * kv * dtype_bytes(dtype)


def kv_cache_bytes(
    config: Any,
    context_len: int | None = None,
    *,
    batch: int = 1,
    src_len: int | None = None,
    window: int | None = None,
    dtype: str | int = "float32",
) -> int:
    """Bytes of a full KV cache: ``batch`` sequences of ``context_len`` positions.

    Args:
        context_len: cached target positions (default ``max_seq_len``).
        src_len: encoder-decoders also cache the cross-attention keys/values of ``src_len``
            source positions (default ``context_len``).
        window: sliding-window attention keeps only the last ``window`` positions.

    Raises:
        ValueError: for non-positive sizes or an encoder-only config.
    """
    layers, kv, cross = _decoder_sizes(config)
    full = config.max_seq_len if context_len is None else check_length("context_len", context_len)
    check_length("batch", batch)
    n = full if window is None else min(full, check_length("window", window))
    per_position = 2 * layers * kv * dtype_bytes(dtype)
    total = batch * n * per_position
    if cross:  # cross-attention keys/values of every source position, whatever the window
        S = full if src_len is None else check_length("src_len", src_len)
        total += batch * S * per_position
    elif src_len is not None:
        raise ValueError("src_len applies to encoder-decoder models")
    return total


__all__ = [
    "ACTIVATION_FORMULAS",
    "ADAM_STATE_BYTES",
    "DTYPE_BYTES",
    "PRECISION_BYTES",
    "TrainingMemory",
    "activation_bytes",
    "dtype_bytes",
    "kv_cache_bytes",
    "kv_cache_bytes_per_token",
    "training_memory",
]
