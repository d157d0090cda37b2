"""Closed forms for the recurrent models (Mamba, LSTM/GRU): parameters, FLOPs, decoding state.

The closed forms are the Mamba and RNN families' own (their :class:`~attnlab.models.costs.Costs`,
beside the models in :mod:`attnlab.models.mamba` and :mod:`attnlab.models.rnn`), so
:func:`~attnlab.analysis.count_params`, :func:`~attnlab.analysis.param_breakdown` and
:func:`~attnlab.analysis.forward_flops` know them; this module derives them and adds the
decoding-state figures every recurrent family has (kind ``RECURRENT_LM``).

Parameters per Mamba layer, with D = d_model, E = expand·D, N = d_state, R = dt_rank, K = d_conv:
``in_proj 2DE + out_proj ED`` (+ biases), ``conv1d EK (+E)``, ``x_proj E(R + 2N)``, ``dt_proj
RE + E``, ``A_log EN``, ``D E``, ``norm D``. Per LSTM (GRU) layer, G = 4 (3) gates: ``G·H·(in +
H) + 2GH`` biases.

FLOPs (2·m·k·p per matmul, as :mod:`~attnlab.analysis.flops`): the matmul terms are every
projection, the depthwise convolution (``2·T·E·K``, which ``FlopCounterMode`` counts as a
convolution), the SSM read-out ``y = C·h`` (``2·T·E·N``, an einsum, i.e. a ``bmm``) and the head.
``FlopCounterMode`` sees exactly these on the parallel path; what it cannot see is the selective
scan itself, elementwise work reported separately by :func:`scan_elementwise_flops`:
discretisation (Δ·A, its exp, Δ·x·B: ``3EN + E`` per token) and the recurrence (``2EN`` per token
sequentially, about ``5EN`` with recursive doubling, which trades twice the work for log-depth),
plus the D skip. For the LSTM it sees the cell's products only with oneDNN off (PyTorch's CPU
LSTM runs a fused oneDNN kernel that it does not count; the GRU is always counted).

Decoding memory: a recurrent model carries a state of fixed size per sequence
(:func:`recurrent_state_bytes`: Mamba ``L·(E·(K-1)·bytes + E·N·4)``, the SSM state in float32;
LSTM ``2·L·H·bytes``, GRU ``L·H·bytes``), whereas a GPT's KV cache grows by
``2·L·H_kv·D_head·bytes`` per token (:func:`~attnlab.analysis.memory.kv_cache_bytes`);
:func:`decode_state_bytes` gives either for a context length and :func:`state_crossover` the
context at which the cache outgrows the state.

Shapes: B batch, T tokens, D d_model, E d_inner, N d_state, R dt_rank, K d_conv, H hidden size,
L layers, V vocabulary.
"""

from __future__ import annotations

import math
from typing import Any

from attnlab.analysis.flops import FlopBreakdown, check_length, flop_formula
from attnlab.analysis.memory import dtype_bytes, kv_cache_bytes, kv_cache_bytes_per_token
from attnlab.analysis.params import family_costs
from attnlab.models.costs import total_params
from attnlab.models.family import Kind, find_family
from attnlab.models.mamba import MambaConfig, mamba_layer_params, scan_elementwise_flops
from attnlab.models.rnn import RNNConfig, rnn_layer_params

RecurrentConfig = Any  # a config of a RECURRENT_LM family (Mamba, LSTM/GRU)


def mamba_params(c: MambaConfig, exclude_embeddings: bool = False) -> int:
    """:class:`~attnlab.models.mamba.MambaLM`."""
    return total_params(family_costs(c, "parameter count").params(c), exclude_embeddings)


def rnn_params(c: RNNConfig, exclude_embeddings: bool = False) -> int:
    """:class:`~attnlab.models.rnn.RNNLM`."""
    return total_params(family_costs(c, "parameter count").params(c), exclude_embeddings)


def is_recurrent_config(config: Any) -> bool:
    """Whether ``config`` describes a recurrent model (its family's kind is ``RECURRENT_LM``:
    Mamba, LSTM/GRU; no context length)."""
    family = None if isinstance(config, type) else find_family(config)
    return family is not None and family.kind is Kind.RECURRENT_LM


def decode_flops_per_token(config: Any, context_len: int) -> int:
    """Matmul FLOPs of decoding one token after ``context_len`` tokens (batch 1).

    Recurrent models: the same at every context (a one-token forward with the state). GPT: the
    projections and FFN of one token plus attention over ``context_len + 1`` cached keys.

    Raises:
        ValueError: for a non-positive context or a config that does not decode.
    """
    context = check_length("context_len", context_len)
    family = None if isinstance(config, type) else find_family(config)
    costs = family.costs if family is not None else None
    if costs is None or costs.decode_flops is None:
        raise ValueError(f"decode FLOPs for GPT, Mamba or RNN configs, not {type(config).__name__}")
    return int(costs.decode_flops(config, context))


def recurrent_flops(config: RecurrentConfig, seq_len: int, *, batch: int = 1) -> FlopBreakdown:
    """:func:`~attnlab.analysis.flops.forward_flops` for a recurrent model (``seq_len``
    required: these models have no context length)."""
    T, B = check_length("seq_len", seq_len), check_length("batch", batch)
    terms, _ = flop_formula(config)(config, B, T, None)
    return FlopBreakdown(tuple(terms), 0, B, T, None, B * T)


# -- decoding state -------------------------------------------------------------------------------


def recurrent_state_bytes(
    config: RecurrentConfig, *, batch: int = 1, dtype: str | int = "float32"
) -> int:
    """Bytes of the decoding state of ``batch`` sequences, whatever the context length.

    Mamba: conv ``(E, K - 1)`` in ``dtype`` + SSM ``(E, N)`` in float32 per layer; LSTM: h and
    c ``(H,)`` per layer; GRU: h. Equals :meth:`~attnlab.layers.ssm.MambaState.nbytes` /
    :meth:`~attnlab.models.rnn.RNNState.nbytes` of a state from ``new_state``.

    Raises:
        ValueError: for a non-positive batch, an unknown dtype or another config.
    """
    B, size = check_length("batch", batch), dtype_bytes(dtype)
    family = None if isinstance(config, type) else find_family(config)
    costs = family.costs if family is not None else None
    if costs is None or costs.state_bytes is None:
        raise ValueError(
            f"{type(config).__name__} is not a recurrent model (MambaConfig, RNNConfig)"
        )
    return int(costs.state_bytes(config, B, size))


def decode_state_bytes(
    config: Any, context_len: int, *, batch: int = 1, dtype: str | int = "float32"
) -> int:
    """What a decoder keeps per ``batch`` sequences after ``context_len`` tokens: the recurrent
    state (constant) or the GPT's KV cache of ``context_len`` positions (growing).

    Raises:
        ValueError: for bad sizes or a config without a decoding state.
    """
    check_length("context_len", context_len)
    if is_recurrent_config(config):
        return recurrent_state_bytes(config, batch=batch, dtype=dtype)
    return kv_cache_bytes(config, context_len, batch=batch, dtype=dtype)


def state_crossover(recurrent: RecurrentConfig, gpt: Any, *, dtype: str | int = "float32") -> int:
    """The smallest context length at which ``gpt``'s KV cache is larger than ``recurrent``'s
    state (per sequence)."""
    per_token = kv_cache_bytes_per_token(gpt, dtype=dtype)
    return math.floor(recurrent_state_bytes(recurrent, dtype=dtype) / per_token) + 1


# -- what ``attnlab analyze`` adds for a recurrent model ---------------------------------------

ANALYZE_SEQ_LEN = 1024  # the length analyze uses for a model without a context length


def state_figures(
    config: RecurrentConfig, *, batch: int = 1, dtype: str | int = "float32"
) -> dict[str, int]:
    """The decoding state next to a KV cache, for the report.

    Returns:
        ``bytes_per_sequence`` and ``total`` (``batch`` sequences) of the state, the
        ``kv_cache_per_token`` of a Transformer decoder of the same ``d_model`` and ``n_layers``
        (full multi-head attention: ``2·L·d_model·bytes``), and ``kv_cache_larger_from``: the
        context at which that cache outgrows the state.

    Raises:
        ValueError: for a non-positive batch or an unknown dtype.
    """
    per_seq = recurrent_state_bytes(config, dtype=dtype)
    kv = 2 * config.n_layers * config.d_model * dtype_bytes(dtype)
    return {
        "bytes_per_sequence": per_seq,
        "batch": check_length("batch", batch),
        "total": per_seq * batch,
        "kv_cache_per_token": kv,
        "kv_cache_larger_from": per_seq // kv + 1,
    }


def elementwise_flops(config: RecurrentConfig, seq_len: int, *, batch: int = 1) -> dict[str, int]:
    """The elementwise FLOPs the matmul totals leave out that the report names (its family's
    declaration): ``{"selective_scan": ...}`` for Mamba (:func:`scan_elementwise_flops` with
    the config's scan), nothing for the LSTM/GRU (their gates' arithmetic is ``O(t·H)``, not
    counted)."""
    costs = family_costs(config, "FLOP formula")
    return {} if costs.elementwise is None else costs.elementwise(config, seq_len, batch)


__all__ = [
    "ANALYZE_SEQ_LEN",
    "decode_flops_per_token",
    "decode_state_bytes",
    "elementwise_flops",
    "is_recurrent_config",
    "mamba_layer_params",
    "mamba_params",
    "recurrent_flops",
    "recurrent_state_bytes",
    "rnn_layer_params",
    "rnn_params",
    "scan_elementwise_flops",
    "state_crossover",
    "state_figures",
]
