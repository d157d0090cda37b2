"""Closed forms for the recurrent models (Mamba, LSTM/GRU): parameters, FLOPs, decoding state.

Importing this module registers the Mamba and RNN configs in :data:`~attnlab.analysis.params.
BREAKDOWNS`, :data:`~attnlab.analysis.params.PARAM_FORMULAS` and :data:`~attnlab.analysis.flops.
FLOP_FORMULAS` (``attnlab.analysis`` imports it), so :func:`~attnlab.analysis.count_params`,
:func:`~attnlab.analysis.param_breakdown` and :func:`~attnlab.analysis.forward_flops` know them.

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

from attnlab.analysis.flops import (
    FLOP_FORMULAS,
    FlopBreakdown,
    MatmulTerm,
    attention_terms,
    check_length,
    ffn_terms,
)
from attnlab.analysis.memory import FP32, dtype_bytes, kv_cache_bytes, kv_cache_bytes_per_token
from attnlab.analysis.params import (
    BREAKDOWNS,
    PARAM_FORMULAS,
    ParamBreakdown,
    linear_params,
    norm_params,
)
from attnlab.models.gpt import GPTConfig
from attnlab.models.mamba import MambaConfig
from attnlab.models.rnn import RNNConfig

RecurrentConfig = MambaConfig | RNNConfig


def _gates(c: RNNConfig) -> int:
    return 4 if c.cell == "lstm" else 3


# -- parameters ----------------------------------------------------------------------------------


def mamba_layer_params(c: MambaConfig) -> dict[str, int]:
    """Parameters of one Mamba block, per part of the mixer (and its norm)."""
    E, D, N, R = c.d_inner, c.d_model, c.d_state, c.dt_rank_value
    return {
        "in_proj": linear_params(D, 2 * E, c.bias),
        "conv1d": E * c.d_conv + (E if c.conv_bias else 0),
        "x_proj": linear_params(E, R + 2 * N, bias=False),
        "dt_proj": linear_params(R, E),
        "ssm": E * N + E,  # A_log and D
        "out_proj": linear_params(E, D, c.bias),
        "norm": norm_params(D, "rmsnorm"),
    }


def _mamba_breakdown(c: MambaConfig) -> ParamBreakdown:
    L = c.n_layers
    comp = {"embedding.token": c.vocab_size * c.d_model}
    for part, n in mamba_layer_params(c).items():
        comp["layers.norms" if part == "norm" else f"layers.mixer.{part}"] = L * n
    comp["final_norm"] = norm_params(c.d_model, "rmsnorm")
    comp["lm_head"] = 0 if c.tie_output else c.vocab_size * c.d_model
    tied = {"lm_head": "embedding.token"} if c.tie_output else {}
    return ParamBreakdown(comp, {"layers": L}, tied)


def rnn_layer_params(c: RNNConfig, layer: int) -> int:
    """Parameters of layer ``layer`` of the LSTM/GRU stack (torch's two bias vectors)."""
    H, G = c.hidden_size, _gates(c)
    d_in = c.d_model if layer == 0 else H
    return G * H * (d_in + H) + (2 * G * H if c.bias else 0)


def _rnn_breakdown(c: RNNConfig) -> ParamBreakdown:
    comp = {
        "embedding.token": c.vocab_size * c.d_model,
        "layers.rnn": sum(rnn_layer_params(c, i) for i in range(c.n_layers)),
        "lm_head": 0 if c.tie_output else c.vocab_size * c.hidden_size,
    }
    tied = {"lm_head": "embedding.token"} if c.tie_output else {}
    return ParamBreakdown(comp, {"layers": c.n_layers}, tied)


def _total(b: ParamBreakdown, exclude_embeddings: bool) -> int:
    return b.total - (b.components["embedding.token"] if exclude_embeddings else 0)


def mamba_params(c: MambaConfig, exclude_embeddings: bool = False) -> int:
    """:class:`~attnlab.models.mamba.MambaLM`."""
    return _total(_mamba_breakdown(c), exclude_embeddings)


def rnn_params(c: RNNConfig, exclude_embeddings: bool = False) -> int:
    """:class:`~attnlab.models.rnn.RNNLM`."""
    return _total(_rnn_breakdown(c), exclude_embeddings)


# -- FLOPs ----------------------------------------------------------------------------------------


def _mamba_terms(c: MambaConfig, B: int, n: int, src: int | None) -> tuple[list[MatmulTerm], int]:
    t, L, E, D, N, R = B * n, c.n_layers, c.d_inner, c.d_model, c.d_state, c.dt_rank_value
    terms = [
        MatmulTerm("layers.mixer.in_proj", t, D, 2 * E, L),
        MatmulTerm("layers.mixer.conv1d", t, c.d_conv, E, L),  # depthwise: K taps per channel
        MatmulTerm("layers.mixer.x_proj", t, E, R + 2 * N, L),
        MatmulTerm("layers.mixer.dt_proj", t, R, E, L),
        MatmulTerm("layers.mixer.readout", t, N, E, L),  # y = C · h, per channel
        MatmulTerm("layers.mixer.out_proj", t, E, D, L),
        MatmulTerm("lm_head", t, D, c.vocab_size),
    ]
    return terms, 0  # no softmax; the scan's elementwise work: scan_elementwise_flops


def _rnn_terms(c: RNNConfig, B: int, n: int, src: int | None) -> tuple[list[MatmulTerm], int]:
    t, H, G = B * n, c.hidden_size, _gates(c)
    terms = []
    for i in range(c.n_layers):
        d_in = c.d_model if i == 0 else H
        terms.append(MatmulTerm("layers.rnn.input", t, d_in, G * H))  # W_ih x_t, all t at once
        terms.append(MatmulTerm("layers.rnn.hidden", t, H, G * H))  # W_hh h_{t-1}, step by step
    terms.append(MatmulTerm("lm_head", t, H, c.vocab_size))
    return terms, 0


def _doubling_flops(T: int) -> int:
    """Elementwise operations of recursive doubling over T steps, per state entry."""
    if T == 1:
        return 0
    n = T // 2
    return 3 * n + _doubling_flops(n) + 2 * ((T + 1) // 2)  # pair up, recurse, fix evens


def scan_elementwise_flops(
    config: MambaConfig, seq_len: int, *, batch: int = 1, scan: str = "parallel"
) -> int:
    """The selective scan's elementwise FLOPs over a forward pass (what ``FlopCounterMode``
    does not count): discretisation ``3EN + E``, the recurrence (``2EN`` per token sequentially;
    recursive doubling's exact count for ``"parallel"``), and the D skip ``2E``, per token and
    layer; exp counts as one.

    Raises:
        ValueError: for a non-positive length or batch, or an unknown scan.
    """
    T, B = check_length("seq_len", seq_len), check_length("batch", batch)
    if scan not in ("parallel", "sequential"):
        raise ValueError(f"scan={scan!r} is not valid; choose one of ['parallel', 'sequential']")
    E, N = config.d_inner, config.d_state
    recurrence = 2 * T if scan == "sequential" else _doubling_flops(T)
    per_layer = T * (3 * E * N + E + 2 * E) + recurrence * E * N
    return B * config.n_layers * per_layer


def decode_flops_per_token(config: Any, context_len: int) -> int:
    """Matmul FLOPs of decoding one token after ``context_len`` tokens (batch 1).

    Recurrent models: the same at every context (a one-token forward with the state). GPT: the
    projections and FFN of one token plus attention over ``context_len + 1`` cached keys.

    Raises:
        ValueError: for a non-positive context or a config that does not decode.
    """
    S = check_length("context_len", context_len) + 1
    if isinstance(config, MambaConfig | RNNConfig):
        terms, _ = FLOP_FORMULAS[type(config)](config, 1, 1, None)
        return sum(t.flops for t in terms)
    if not isinstance(config, GPTConfig):
        raise ValueError(f"decode FLOPs for GPT, Mamba or RNN configs, not {type(config).__name__}")
    c = config
    attn, _ = attention_terms(
        "layers.self_attn", batch=1, q_len=1, kv_len=S, d_model=c.d_model, n_heads=c.n_heads,
        n_kv_heads=c.n_kv_heads, count=c.n_layers, kv_input_len=1,
    )  # fmt: skip
    ffn = ffn_terms(
        "layers.ffn", tokens=1, d_model=c.d_model, d_ff=c.d_ff, activation=c.activation,
        count=c.n_layers,
    )  # fmt: skip
    head = MatmulTerm("lm_head", 1, c.d_model, c.vocab_size)
    return sum(t.flops for t in [*attn, *ffn, head])


def recurrent_flops(config: RecurrentConfig, seq_len: int, *, batch: int = 1) -> FlopBreakdown:
    """:func:`~attnlab.analysis.flops.forward_flops` for a recurrent model (``seq_len``
    required: these models have no context length)."""
    T, B = check_length("seq_len", seq_len), check_length("batch", batch)
    terms, _ = FLOP_FORMULAS[type(config)](config, B, T, None)
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
    c = config
    if isinstance(c, MambaConfig):
        return B * c.n_layers * (c.d_inner * (c.d_conv - 1) * size + c.d_inner * c.d_state * FP32)
    if isinstance(c, RNNConfig):
        return B * c.n_layers * c.hidden_size * (2 if c.cell == "lstm" else 1) * size
    raise ValueError(f"{type(c).__name__} is not a recurrent model (MambaConfig, RNNConfig)")


def decode_state_bytes(
    config: Any, context_len: int, *, batch: int = 1, dtype: str | int = "float32"
) -> int:
    """What a decoder keeps per ``batch`` sequences after ``context_len`` tokens: the recurrent
    state (constant) or the GPT's KV cache of ``context_len`` positions (growing).

    Raises:
        ValueError: for bad sizes or a config without a decoding state.
    """
    check_length("context_len", context_len)
    if isinstance(config, MambaConfig | RNNConfig):
        return recurrent_state_bytes(config, batch=batch, dtype=dtype)
    return kv_cache_bytes(config, context_len, batch=batch, dtype=dtype)


def state_crossover(
    recurrent: RecurrentConfig, gpt: GPTConfig, *, dtype: str | int = "float32"
) -> int:
    """The smallest context length at which ``gpt``'s KV cache is larger than ``recurrent``'s
    state (per sequence)."""
    per_token = kv_cache_bytes_per_token(gpt, dtype=dtype)
    return math.floor(recurrent_state_bytes(recurrent, dtype=dtype) / per_token) + 1


# -- what ``attnlab analyze`` adds for a recurrent model ---------------------------------------

ANALYZE_SEQ_LEN = 1024  # the length analyze uses for a model without a context length


def is_recurrent_config(config: Any) -> bool:
    """Whether ``config`` describes a recurrent model (Mamba, LSTM/GRU: no context length)."""
    return isinstance(config, MambaConfig | RNNConfig)


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
    """The elementwise FLOPs the matmul totals leave out that the report names:
    ``{"selective_scan": ...}`` for Mamba (:func:`scan_elementwise_flops` with the config's
    scan), nothing for the LSTM/GRU (their gates' arithmetic is ``O(t·H)``, not counted)."""
    if isinstance(config, MambaConfig):
        return {"selective_scan": scan_elementwise_flops(config, seq_len, batch=batch,
                                                         scan=config.scan)}  # fmt: skip
    return {}


BREAKDOWNS[MambaConfig] = _mamba_breakdown
BREAKDOWNS[RNNConfig] = _rnn_breakdown
PARAM_FORMULAS[MambaConfig] = mamba_params
PARAM_FORMULAS[RNNConfig] = rnn_params
FLOP_FORMULAS[MambaConfig] = _mamba_terms
FLOP_FORMULAS[RNNConfig] = _rnn_terms


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
