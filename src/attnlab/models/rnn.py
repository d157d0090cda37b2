"""The recurrent baseline: a character-level LSTM or GRU language model (the model attention
replaced; char-rnn's shape: embedding, a stacked ``torch.nn.LSTM``/``nn.GRU``, a linear head).

The cell is PyTorch's (Hochreiter & Schmidhuber 1997; Cho et al. 2014): the point of this model
is the comparison with attention and Mamba, not a hand-written cell. It has the interface of
every attnlab LM: ``forward(ids, targets=, state=) -> (logits, loss)``, and for decoding
:meth:`RNNLM.new_state` makes an :class:`RNNState` (``h``, and ``c`` for the LSTM: constant size
per row) that ``forward`` continues and updates in place. No positions, no context limit.

The head is tied to the embedding (``tie_output``) when the hidden size equals the embedding
size (``d_hidden`` ``None`` or ``d_model``).

Shapes: B batch, T tokens, E d_model (embedding), H d_hidden, L n_layers, V vocabulary.

Deviations: none; PyTorch's default cell init (uniform ±1/sqrt(H)), embeddings N(0, init_std).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import Tensor, nn

from attnlab.config import Config, check_positive, check_probability
from attnlab.layers.embedding import TokenEmbedding, tie_weights
from attnlab.models.base import GenerationMixin, PretrainedModel
from attnlab.models.common import check_token_ids, token_inputs, token_loss
from attnlab.models.costs import FP32, INDEX_BYTES, Costs, MatmulTerm, ParamBreakdown
from attnlab.models.family import Family, Kind, register_family

CELLS = ("lstm", "gru")


@dataclass(frozen=True, kw_only=True)
class RNNConfig(Config):
    """Hyper-parameters of an LSTM/GRU LM (defaults: char-rnn's 2-layer LSTM at the baby GPT's
    parameter count). Field types are checked by :class:`~attnlab.config.Config`."""

    model_type: ClassVar[str] = "rnn"

    cell: Literal["lstm", "gru"] = "lstm"
    vocab_size: int = 256
    d_model: int = 220  # the embedding size (and the hidden size unless d_hidden says otherwise)
    d_hidden: int | None = None  # None: d_model
    n_layers: int = 2
    dropout: float = 0.0  # on the embeddings, between layers, and before the head
    bias: bool = True  # the cells' biases
    tie_output: bool = True  # needs d_hidden == d_model
    init_std: float = 0.02  # embeddings
    ignore_index: int = -100
    pad_id: int | None = None
    bos_id: int | None = None
    eos_id: int | None = None

    def validate(self) -> None:
        """Sizes, the dropout rate, tying and the special ids.

        Raises:
            ValueError: naming the bad value.
        """
        super().validate()
        check_positive(
            vocab_size=self.vocab_size, d_model=self.d_model, d_hidden=self.d_hidden,
            n_layers=self.n_layers, init_std=self.init_std,
        )  # fmt: skip
        check_probability(dropout=self.dropout)
        if self.tie_output and self.hidden_size != self.d_model:
            raise ValueError(
                f"tie_output needs d_hidden == d_model, got d_hidden={self.d_hidden}, "
                f"d_model={self.d_model} (set tie_output=False)"
            )
        check_token_ids(self, ("pad_id", "bos_id", "eos_id"), self.vocab_size)

    @property
    def hidden_size(self) -> int:
        """H: ``d_hidden``, or ``d_model`` when unset."""
        return self.d_model if self.d_hidden is None else self.d_hidden


class RNNState:
    """Decoding state of an :class:`RNNLM`: ``h`` ``(L, B, H)`` and, for the LSTM, ``c``.

    Args:
        h, c: as ``torch.nn.LSTM``/``nn.GRU`` take them (``c`` ``None`` for the GRU).
    """

    def __init__(self, h: Tensor, c: Tensor | None = None) -> None:
        self.h, self.c = h, c

    @property
    def batch_size(self) -> int:
        return int(self.h.shape[1])

    def reorder(self, index: Tensor) -> None:
        """Keep/reorder/repeat batch rows ``index`` ``(B',)`` (beam search, several samples)."""
        self.h = self.h.index_select(1, index)
        if self.c is not None:
            self.c = self.c.index_select(1, index)

    @classmethod
    def cat(cls, states: Sequence[RNNState]) -> RNNState:
        """The rows of ``states`` stacked in order.

        Raises:
            ValueError: for no states.
        """
        if not states:
            raise ValueError("cat needs one or more states")
        c = None if states[0].c is None else torch.cat([s.c for s in states if s.c is not None], 1)
        return cls(torch.cat([s.h for s in states], 1), c)

    def nbytes(self) -> int:
        """Bytes held (the same for any number of tokens consumed)."""
        return sum(t.numel() * t.element_size() for t in (self.h, self.c) if t is not None)


class RNNLM(GenerationMixin, PretrainedModel):
    """LSTM/GRU language model: ``forward(ids, targets=, state=) -> (logits, loss)``."""

    def __init__(self, config: RNNConfig) -> None:
        super().__init__()
        c = self.config = config
        self.tok_embed = TokenEmbedding(c.vocab_size, c.d_model, scale=False)
        nn.init.normal_(self.tok_embed.weight, std=c.init_std)
        cell = nn.LSTM if c.cell == "lstm" else nn.GRU
        self.rnn = cell(
            c.d_model,
            c.hidden_size,
            num_layers=c.n_layers,
            bias=c.bias,
            batch_first=True,
            dropout=c.dropout if c.n_layers > 1 else 0.0,
        )
        self.dropout = nn.Dropout(c.dropout)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_output:
            tie_weights(self.lm_head, self.tok_embed)

    def new_state(self, batch: int, *, device: torch.device | str | None = None) -> RNNState:
        """A zero decoding state for ``batch`` sequences (constant size)."""
        w = self.tok_embed.weight
        shape = (self.config.n_layers, batch, self.config.hidden_size)
        dev = torch.device(device) if device is not None else w.device
        h = torch.zeros(shape, device=dev, dtype=w.dtype)
        return RNNState(h, torch.zeros_like(h) if self.config.cell == "lstm" else None)

    def hidden_states(self, ids: Tensor, *, state: RNNState | None = None) -> Tensor:
        """The top layer's outputs ``(B, T, H)``; arguments as :meth:`forward`."""
        if ids.dim() != 2:
            raise ValueError(f"ids must be (B, T) token ids, got shape {tuple(ids.shape)}")
        if state is not None and state.batch_size != ids.shape[0]:
            raise ValueError(f"state holds {state.batch_size} rows, ids has {ids.shape[0]}")
        x = self.dropout(self.tok_embed(ids))  # (B, T, E)
        if state is None:
            out, _ = self.rnn(x)  # (B, T, H)
        elif state.c is not None:
            out, (state.h, state.c) = self.rnn(x, (state.h, state.c))
        else:
            out, state.h = self.rnn(x, state.h)
        return out

    def forward(
        self, ids: Tensor, *, targets: Tensor | None = None, state: RNNState | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """Next-token logits (and the loss).

        Args:
            ids: token ids ``(B, T)``; with a ``state``, the tokens after those it has seen.
            targets: ``(B, T)`` the next token at each position; ``config.ignore_index`` skipped.
            state: an :class:`RNNState` from :meth:`new_state`, updated in place.

        Returns:
            ``(logits (B, T, V), mean token cross-entropy or None)``.

        Raises:
            ValueError: for ids outside the vocabulary, a state of another batch size, or
                targets of another shape, dtype or outside the vocabulary.
        """
        logits = self.lm_head(self.dropout(self.hidden_states(ids, state=state)))  # (B, T, V)
        loss = None
        if targets is not None:
            loss = token_loss(logits, targets, ids, ignore_index=self.config.ignore_index)
        return logits, loss


PRESETS: dict[str, RNNConfig] = {
    # char-rnn's 2-layer shape at the baby GPT's size: 834,240 parameters with vocab 256
    # (gpt-char-baby: 834,304), 792,220 at the Shakespeare recipe's vocab 65 (GPT: 804,096).
    "lstm-char-baby": RNNConfig(cell="lstm", d_model=220),
    "gru-char-baby": RNNConfig(cell="gru", d_model=252),  # 829,584 (vocab 256), 781,452 (65)
    "lstm-tiny": RNNConfig(cell="lstm", d_model=32, vocab_size=64),
}


# -- the family's declaration (attnlab.models.family) -----------------------------------------
# The closed forms below are documented with their derivations in attnlab.analysis.recurrent
# (parameters, FLOPs, decoding state) and attnlab.analysis.recurrent_memory (activations).


def _gates(c: RNNConfig) -> int:
    return 4 if c.cell == "lstm" else 3


def rnn_layer_params(c: RNNConfig, layer: int) -> int:
    """Parameters of layer ``layer`` of the LSTM/GRU stack (torch's two bias vectors)."""
    H, G = c.hidden_size, _gates(c)
    d_in = c.d_model if layer == 0 else H
    return G * H * (d_in + H) + (2 * G * H if c.bias else 0)


def _params(c: RNNConfig) -> ParamBreakdown:
    comp = {
        "embedding.token": c.vocab_size * c.d_model,
        "layers.rnn": sum(rnn_layer_params(c, i) for i in range(c.n_layers)),
        "lm_head": 0 if c.tie_output else c.vocab_size * c.hidden_size,
    }
    tied = {"lm_head": "embedding.token"} if c.tie_output else {}
    return ParamBreakdown(comp, {"layers": c.n_layers}, tied)


def _flops(c: RNNConfig, B: int, n: int, src: int | None) -> tuple[list[MatmulTerm], int]:
    t, H, G = B * n, c.hidden_size, _gates(c)
    terms = []
    for i in range(c.n_layers):
        d_in = c.d_model if i == 0 else H
        terms.append(MatmulTerm("layers.rnn.input", t, d_in, G * H))  # W_ih x_t, all t at once
        terms.append(MatmulTerm("layers.rnn.hidden", t, H, G * H))  # W_hh h_{t-1}, step by step
    terms.append(MatmulTerm("lm_head", t, H, c.vocab_size))
    return terms, 0


def rnn_activation_bytes(c: RNNConfig, *, batch: int, seq_len: int, a: int) -> dict[str, int]:
    """Bytes autograd keeps for one training step (PyTorch's native cell; oneDNN's LSTM keeps
    more: :mod:`attnlab.analysis.recurrent_memory`).

    Returns:
        ``layers``, ``outside_layers``, ``attention_scores`` (0) and ``total``.
    """
    t, H = batch * seq_len, c.hidden_size
    layers = sum(t * (c.d_model if i == 0 else H) + 7 * t * H for i in range(c.n_layers)) * a
    outside = 2 * t * INDEX_BYTES + t * H * a + t * c.vocab_size * FP32
    return {"layers": layers, "outside_layers": outside, "attention_scores": 0,
            "total": layers + outside}  # fmt: skip


COSTS = Costs(
    params=_params,
    flops=_flops,
    activations=lambda c, *, batch, seq_len, src_len, a, every: rnn_activation_bytes(
        c, batch=batch, seq_len=seq_len, a=a
    ),
    # LSTM: h and c per layer and sequence; GRU: h
    state_bytes=lambda c, batch, a: (
        batch * c.n_layers * c.hidden_size * (2 if c.cell == "lstm" else 1) * a
    ),
    decode_flops=lambda c, context: sum(t.flops for t in _flops(c, 1, 1, None)[0]),
    default_seq_len=lambda c: None,
    notes=lambda c, n: [
        "the cells' gate arithmetic (elementwise, O(B·T·H)) is not in the FLOPs; the "
        "activation figure is PyTorch's native cell (the CPU LSTM's oneDNN kernel keeps "
        "a larger workspace)"
    ],
    unmeasured="FlopCounterMode does not see the CPU LSTM's oneDNN kernel",
)


FAMILY = register_family(
    Family(
        name="rnn",
        config=RNNConfig,
        model=RNNLM,
        kind=Kind.RECURRENT_LM,
        presets=PRESETS,
        description="LSTM and GRU language models",
        costs=COSTS,
        example_inputs=token_inputs,
    )
)
