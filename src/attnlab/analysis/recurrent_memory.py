"""Training activations of the recurrent models (Mamba, LSTM/GRU): what autograd keeps for the
backward of one step, as attnlab's layers produce them.

The formulas, :func:`mamba_activation_bytes` and :func:`rnn_activation_bytes`, are the Mamba and
RNN families' own declarations (:attr:`~attnlab.models.costs.Costs.activations`, beside the
models), so :func:`~attnlab.analysis.memory.activation_bytes`, :func:`~attnlab.analysis.memory.
training_memory`, the training memory check and ``attnlab analyze`` know them; this module
derives them. Assumptions as
:mod:`~attnlab.analysis.memory`: no dropout, no activation checkpointing; t = B·T tokens.

Mamba, per layer (D d_model, E d_inner, N d_state, R dt_rank, K d_conv), element by element what
:class:`~attnlab.layers.ssm.MambaMixer` saves:

- the block's RMSNorm: its input, 1/rms, x̂ and its output (``in_proj``'s input), ``3·t·D + t``;
- ``10·t·E + B·E·(T + K - 1) + t·(R + 2N)`` in the model dtype: ``in_proj``'s output (x and z,
  ``2tE``), the padded convolution input, the convolution output (SiLU's input), x (and the
  contiguous copy ``x_proj`` reads, made when B > 1 and T > 1: ``9·t·E`` otherwise),
  ``x_proj``'s output (Δ's rank-R input, B and C are views of it), ``dt_proj``'s output
  (softplus's input), Δ, and the gated output's three operands (y, SiLU(z), ``out_proj``'s
  input);
- in float32: ``Δ·x`` (``t·E``), ``A = -exp(A_log)`` and its exp (``2·E·N``, batch-independent),
  and the scan's ``(B, T, E, N)`` tensors: Ā and the states, ``2·t·E·N`` for the parallel scan
  (its backward is the adjoint scan, :class:`~attnlab.layers.ssm_scan._DoublingScan`); the
  Python-loop scan keeps every step's previous state besides, ``3·t·E·N``. These are
  ``"scan_states"``: at d_state 16 they are most of the total, where a fused CUDA kernel keeps
  none (it recomputes the states in the backward).

LSTM/GRU, per layer (``d_in`` = d_model for the first layer, H after): the contiguous input the
input-to-hidden product reads, ``t·d_in``, and what PyTorch's native fused cell keeps per step
(the gates, the states before and after), ``7·t·H`` for the LSTM and the GRU alike. PyTorch's CPU
LSTM runs oneDNN by default, which keeps a larger workspace of its own (2.2-3.1x the native
figure on small shapes, measured; the GRU never uses it): the estimate is then a lower bound.

Outside the layers (both): the token ids and targets (int64), the head's input (Mamba: the final
RMSNorm's ``3·t·D + t``; RNN: a copy of the top layer's output, ``t·H``) and the cross-entropy's
float32 log-softmax, ``t·V``.

Checked element for element against the tensors autograd saves (``tests/analysis/
test_recurrent_memory.py``); 16-bit figures count the float32 parts in float32 and the rest in
the dtype (the float32 copies a 16-bit model makes for the scan are not counted).

Shapes: B batch, T tokens, D d_model, E d_inner, N d_state, R dt_rank, K d_conv, H hidden size,
V vocabulary.
"""

from __future__ import annotations

from attnlab.models.mamba import mamba_activation_bytes
from attnlab.models.rnn import rnn_activation_bytes

__all__ = ["mamba_activation_bytes", "rnn_activation_bytes"]
