"""Analysis: what a model costs, in closed form from its config and measured on a real pass.

- :mod:`~attnlab.analysis.params`: parameter counts and the per-component breakdown;
- :mod:`~attnlab.analysis.flops`: forward/backward FLOPs per component (2·m·k·p per matmul);
- :mod:`~attnlab.analysis.moe`: total vs active parameters and FLOPs of mixture-of-experts models;
- :mod:`~attnlab.analysis.scaling`: the 6·N·tokens rule, crossover lengths, length sweeps;
- :mod:`~attnlab.analysis.memory`: weights, gradients, Adam state, activations, KV cache;
- :mod:`~attnlab.analysis.recurrent`: the same closed forms for Mamba and the LSTM/GRU, and their
  constant decoding state; :mod:`~attnlab.analysis.recurrent_memory` their training activations;
- :mod:`~attnlab.analysis.measure`: ``FlopCounterMode`` counts, saved-activation bytes, step
  time, peak FLOP/s and MFU;
- :mod:`~attnlab.analysis.report`: :func:`analyze`, the table and JSON of ``attnlab analyze``
  (:mod:`~attnlab.analysis.cli`).
"""

from attnlab.analysis.flops import FlopBreakdown, attention_block_flops, forward_flops
from attnlab.analysis.measure import count_flops, measure_flops, mfu
from attnlab.analysis.memory import (
    activation_bytes,
    kv_cache_bytes,
    kv_cache_bytes_per_token,
    training_memory,
)
from attnlab.analysis.moe import active_params, moe_summary
from attnlab.analysis.params import ParamBreakdown, count_params, param_breakdown
from attnlab.analysis.recurrent import (  # also registers the Mamba and RNN closed forms
    decode_state_bytes,
    recurrent_state_bytes,
    scan_elementwise_flops,
)
from attnlab.analysis.recurrent_memory import (  # registers their activations
    mamba_activation_bytes,
    rnn_activation_bytes,
)
from attnlab.analysis.report import Analysis, analyze
from attnlab.analysis.scaling import approximations, crossover, sweep_seq_len
from attnlab.analysis.text import format_report

__all__ = [
    "Analysis",
    "FlopBreakdown",
    "ParamBreakdown",
    "activation_bytes",
    "active_params",
    "analyze",
    "approximations",
    "attention_block_flops",
    "count_flops",
    "count_params",
    "crossover",
    "decode_state_bytes",
    "format_report",
    "forward_flops",
    "kv_cache_bytes",
    "kv_cache_bytes_per_token",
    "mamba_activation_bytes",
    "measure_flops",
    "mfu",
    "moe_summary",
    "param_breakdown",
    "recurrent_state_bytes",
    "rnn_activation_bytes",
    "scan_elementwise_flops",
    "sweep_seq_len",
    "training_memory",
]
