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
  self-attention also keeps its q, k and v weights stacked, ``(E + 2·H_kv·D)·E``, where
  ``t >= E + 2·H_kv·D`` (the training step's one product through them,
  :class:`~attnlab.layers.MultiHeadAttention`), which cross-attention, projecting two inputs,
  does not;
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

import warnings
from dataclasses import dataclass
from typing import Any

from attnlab.analysis.flops import check_length, default_seq_len
from attnlab.analysis.params import count_params, family_costs
from attnlab.models.costs import FP32, INDEX_BYTES, KVShape
from attnlab.models.family import families

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
ADAM_STATE_BYTES = 8  # two float32 moments per parameter
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
# The formulas are the families' (attnlab.models.family.Family.costs.activations), built from the
# stack blocks of attnlab.models.costs (norm_elems, attention_elems, ffn_elems,
# stack_activations), which implement the assumptions of this module's docstring.


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
    costs = family_costs(config, "activation formula")
    if costs.activations is None:
        raise ValueError(f"no activation formula for {type(config).__name__}")
    if costs.min_seq_len > T:
        why = costs.min_seq_len_why or f"{type(config).__name__} needs {costs.min_seq_len}"
        raise ValueError(f"{why}; got seq_len={T}")
    return costs.activations(
        config, batch=B, seq_len=T, src_len=src_len, a=a, every=checkpoint_every
    )


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


def _decoder_sizes(config: Any) -> KVShape:
    """What a model that decodes with a cache keeps per position (its family's declaration).

    Raises:
        ValueError: for an encoder (or any model without a KV cache).
    """
    costs = family_costs(config, "memory formula")
    if costs.kv_cache is None:
        decoders = ", ".join(
            f.config.__name__ for f in families() if f.costs is not None and f.costs.kv_cache
        )
        raise ValueError(
            f"{type(config).__name__} has no KV cache: it is no decoder that caches keys and "
            f"values (decoder models: {decoders})"
        )
    return costs.kv_cache(config)


def kv_cache_bytes_per_token(config: Any, *, dtype: str | int = "float32") -> int:
    """Self-attention cache bytes per cached position and sequence: ``2·layers·H_kv·D·bytes``.

    Raises:
        ValueError: for an encoder-only config (no cache) or an unknown dtype.
    """
    shape = _decoder_sizes(config)
    return 2 * shape.layers * shape.width * dtype_bytes(dtype)


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
    shape = _decoder_sizes(config)
    layers, kv, cross = shape.layers, shape.width, shape.cross
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


def __getattr__(name: str) -> Any:
    """``ACTIVATION_FORMULAS``: deprecated (each family declares its activation formula)."""
    if name == "ACTIVATION_FORMULAS":
        warnings.warn(
            "attnlab.analysis.memory.ACTIVATION_FORMULAS is deprecated: each family declares "
            "its activation formula (attnlab.models.family.Family.costs.activations)",
            DeprecationWarning,
            stacklevel=2,
        )
        return {
            f.config: f.costs.activations
            for f in families()
            if f.costs is not None and f.costs.activations is not None
        }
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ADAM_STATE_BYTES",
    "DTYPE_BYTES",
    "FP32",
    "INDEX_BYTES",
    "PRECISION_BYTES",
    "TrainingMemory",
    "activation_bytes",
    "dtype_bytes",
    "kv_cache_bytes",
    "kv_cache_bytes_per_token",
    "training_memory",
]
