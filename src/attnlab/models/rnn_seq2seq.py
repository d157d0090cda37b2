"""The recurrent encoder-decoder, with and without attention: the step between the RNN and the
Transformer (the course's §1.2).

Encoder: embeddings, then a bidirectional GRU/LSTM of ``n_layers`` run over the real source
tokens only (packed: padding never enters a recurrence). Its top layer gives the *memory*
``h_j = [→h_j; ←h_j]`` ``(B, S, 2H)``, one vector per source token.

Decoder: a GRU/LSTM of ``n_layers`` that starts from the encoder's final states,
``s_0 = tanh(W_init [→h_last; ←h_first])``, and reads the target embeddings ``y_{t-1}``. What
else it sees of the source is ``attention``:

- ``"none"`` (Sutskever et al. 2014; Cho et al. 2014): nothing. The whole source reaches the
  decoder through ``s_0``, one vector of fixed size: the bottleneck attention removed.
- ``"bahdanau"`` (Bahdanau, Cho & Bengio 2015, additive): before step ``t`` the previous state
  scores every source vector, ``e_tj = v^T tanh(W_s s_{t-1} + W_h h_j + b)``, ``α_t =
  softmax_j(e_t)`` over the real tokens, the context ``c_t = Σ_j α_tj h_j`` joins the input:
  ``s_t = RNN(s_{t-1}, [E y_{t-1}; c_t])``. Step ``t`` needs ``s_{t-1}``: the decoder runs one
  step at a time, in training too.
- ``"luong"`` (Luong, Pham & Manning 2015, multiplicative "general" score): ``s_t = RNN(s_{t-1},
  E y_{t-1})`` for all ``t`` in one call, then ``e_tj = s_t^T W_a h_j``, ``α_t``, ``c_t`` as
  above, after the step.

Read-out (all three): Luong's attentional hidden state ``o_t = tanh(W_c [c_t; s_t])``
(``tanh(W_c s_t)`` without attention), then ``logits = W_out o_t`` with ``W_out`` tied to the
target embedding (``tie_output``). Attention weights are exactly 0 on padded source positions.

Decoding one token at a time (``new_cache``/``decode(..., cache=)``) carries the decoder's state
and the source's projected keys (computed once, as a Transformer caches cross-attention keys);
it equals teacher-forced decoding of the whole prefix. ``decode(..., return_attention=True)``
also returns ``α`` ``(B, T, S)`` for pictures (:meth:`RNNSeq2Seq.attention_weights`).

Shapes: B batch, S source length, T target length, E d_model (embeddings, read-out), H d_hidden
(each encoder direction, the decoder), A d_attn, L n_layers, V vocabulary.

Deviations: Bahdanau's read-out is a maxout layer over ``(s_{t-1}, y_{t-1}, c_t)`` and his
decoder starts from the backward encoder state alone; Luong feeds ``o_{t-1}`` back as input
("input feeding"), and Sutskever reverses the source of a unidirectional 4-layer LSTM. Here one
read-out, one initial state and one bidirectional encoder serve all three variants, so that they
differ only in the attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnlab.config import Config, check_positive, check_probability
from attnlab.layers.embedding import TokenEmbedding, tie_weights
from attnlab.layers.recurrent_attention import AdditiveAttention, BilinearAttention, attend
from attnlab.models.base import GenerationMixin, PretrainedModel
from attnlab.models.common import (
    Seq2SeqVocabulary,
    check_pair_batch,
    check_size,
    seq2seq_inputs,
    token_loss,
)
from attnlab.models.costs import Costs, ParamBreakdown, linear_params
from attnlab.models.family import Family, Kind, PromptBatch, register_family

RNNState = Tensor | tuple[Tensor, Tensor]  # GRU: h (L, B, H); LSTM: (h, c)


@dataclass(frozen=True, kw_only=True)
class RNNSeq2SeqConfig(Seq2SeqVocabulary, Config):
    """Hyper-parameters of the recurrent encoder-decoder (defaults: the translation recipe's
    size, d_model 256, one layer of 512 per direction). Field types are checked on creation."""

    model_type: ClassVar[str] = "rnn_seq2seq"

    cell: Literal["gru", "lstm"] = "gru"
    attention: Literal["bahdanau", "luong", "none"] = "bahdanau"
    vocab_size: int = 8000  # source (and shared) vocabulary
    tgt_vocab_size: int | None = None  # None: one vocabulary shared by source and target
    d_model: int = 256  # E: embeddings and the read-out o_t
    d_hidden: int = 512  # H: each encoder direction, and the decoder
    d_attn: int | None = None  # A: Bahdanau's score layer; None: d_hidden
    n_layers: int = 1  # L: encoder and decoder layers
    dropout: float = 0.2  # embeddings, between layers, before the output projection
    max_seq_len: int = 256  # longest source and target (a recurrence has no limit of its own)
    share_embeddings: bool = True  # one table for source and target (needs one vocabulary)
    tie_output: bool = True  # W_out = the target embedding
    bias: bool = True
    init_std: float = 0.1  # embeddings; linears and cells keep PyTorch's default init
    pad_id: int | None = 0
    bos_id: int = 1
    eos_id: int = 2

    def validate(self) -> None:
        """Sizes, dropout, embedding sharing and the special ids.

        Raises:
            ValueError: naming the bad value.
        """
        super().validate()
        check_positive(
            vocab_size=self.vocab_size, tgt_vocab_size=self.tgt_vocab_size, d_model=self.d_model,
            d_hidden=self.d_hidden, d_attn=self.d_attn, n_layers=self.n_layers,
            max_seq_len=self.max_seq_len, init_std=self.init_std,
        )  # fmt: skip
        check_probability(dropout=self.dropout)
        self.check_vocabularies()

    @property
    def attention_size(self) -> int:
        """A: ``d_attn``, or ``d_hidden`` when unset."""
        return self.d_attn or self.d_hidden

    @property
    def n_heads(self) -> int:
        """One attention distribution per decoder step (what the memory estimates read)."""
        return 1


# -- the decoding cache ------------------------------------------------------------------------


class RNNSeq2SeqCache:
    """What incremental decoding carries: the decoder state after the tokens fed so far, and
    the source's projected keys (computed at the first step).

    Args:
        max_len: the most target tokens it will see (as a KV cache's length).
    """

    def __init__(self, max_len: int) -> None:
        self.max_len = check_size("max_len", max_len)
        self.state: RNNState | None = None  # (L, B, H), LSTM: (h, c)
        self.keys: Tensor | None = None  # (B, S, A)
        self.seq_len = 0

    def reorder(self, index: Tensor, *, keys: bool = True) -> None:
        """Keep/reorder/repeat rows ``index`` ``(B',)``; ``keys=False`` leaves the source's
        keys as they are (beams of one source share them)."""
        if isinstance(self.state, tuple):
            self.state = (
                self.state[0].index_select(1, index),
                self.state[1].index_select(1, index),
            )
        elif self.state is not None:
            self.state = self.state.index_select(1, index)
        if keys and self.keys is not None:
            self.keys = self.keys.index_select(0, index)


# -- the model -----------------------------------------------------------------------------------


class RNNSeq2Seq(GenerationMixin, PretrainedModel):
    """The recurrent encoder-decoder: ``forward(src, tgt) -> (logits, loss)``; :meth:`encode`
    once and :meth:`decode` per step (with :meth:`new_cache`) to generate."""

    def __init__(self, config: RNNSeq2SeqConfig) -> None:
        super().__init__()
        c = self.config = config
        H, L = c.d_hidden, c.n_layers
        self.src_embed = TokenEmbedding(c.vocab_size, c.d_model, scale=False)
        self.tgt_embed = (
            self.src_embed
            if c.share_embeddings
            else TokenEmbedding(c.target_vocab_size, c.d_model, scale=False)
        )
        for embed in {id(e): e for e in (self.src_embed, self.tgt_embed)}.values():
            nn.init.normal_(embed.weight, std=c.init_std)
        cell = nn.GRU if c.cell == "gru" else nn.LSTM
        between = c.dropout if L > 1 else 0.0
        self.encoder = cell(c.d_model, H, num_layers=L, bias=c.bias, batch_first=True,
                            dropout=between, bidirectional=True)  # fmt: skip
        self.init_proj = nn.Linear(2 * H, L * H, bias=c.bias)  # W_init
        self.attention: AdditiveAttention | BilinearAttention | None = None
        if c.attention == "bahdanau":
            self.attention = AdditiveAttention(H, 2 * H, c.attention_size, bias=c.bias)
        elif c.attention == "luong":
            self.attention = BilinearAttention(H, 2 * H)
        d_input = c.d_model + (2 * H if c.attention == "bahdanau" else 0)
        self.decoder = cell(d_input, H, num_layers=L, bias=c.bias, batch_first=True,
                            dropout=between)  # fmt: skip
        d_readout = H + (2 * H if self.attention is not None else 0)
        self.out_proj = nn.Linear(d_readout, c.d_model, bias=c.bias)  # W_c
        self.dropout = nn.Dropout(c.dropout)
        self.lm_head = nn.Linear(c.d_model, c.target_vocab_size, bias=False)  # W_out
        if c.tie_output:
            tie_weights(self.lm_head, self.tgt_embed)

    # -- the encoder -------------------------------------------------------------------------

    def default_src_mask(self, src: Tensor) -> Tensor | None:
        """``src != pad_id`` ``(B, S)`` when the config has a pad id, else ``None``."""
        pad = self.config.pad_id
        return None if pad is None else src != pad

    def encode(self, src: Tensor, *, src_mask: Tensor | None = None) -> Tensor:
        """Source ids ``(B, S)`` -> memory ``(B, S, 2H)`` (zeros at padded positions).

        ``src_mask`` ``(B, S)``: True for real tokens, a prefix of each row (right padding);
        default ``src != pad_id``.

        Raises:
            ValueError: for a source that is not ``(B, S)``, a mask of another shape, padding
                that is not on the right, or a row without a real token.
        """
        if src.dim() != 2:
            raise ValueError(f"src must be (B, S) token ids, got shape {tuple(src.shape)}")
        src_mask = self.default_src_mask(src) if src_mask is None else src_mask
        x = self.dropout(self.src_embed(src))  # (B, S, E)
        lengths = _lengths(src_mask, src.shape)
        if lengths is None:
            memory, _ = self.encoder(x)  # (B, S, 2H)
            return memory
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.encoder(packed)
        memory, _ = pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])
        return memory  # (B, S, 2H)

    def initial_state(self, memory: Tensor, src_mask: Tensor | None = None) -> RNNState:
        """``s_0 = tanh(W_init [→h_last; ←h_first])``, per decoder layer: ``(L, B, H)`` (LSTM:
        and a zero cell state)."""
        B, S, _ = memory.shape
        H, L = self.config.d_hidden, self.config.n_layers
        last = torch.full((B,), S - 1, device=memory.device, dtype=torch.long)
        if src_mask is not None:
            last = src_mask.long().sum(1).clamp_min(1) - 1  # (B,)
        forward_last = memory[torch.arange(B, device=memory.device), last, :H]  # (B, H)
        final = torch.cat([forward_last, memory[:, 0, H:]], dim=-1)  # (B, 2H)
        h = torch.tanh(self.init_proj(final)).view(B, L, H).transpose(0, 1).contiguous()
        return (h, torch.zeros_like(h)) if self.config.cell == "lstm" else h  # (L, B, H)

    # -- the decoder -------------------------------------------------------------------------

    def new_cache(self, max_len: int) -> RNNSeq2SeqCache:
        """An empty :class:`RNNSeq2SeqCache` for decoding up to ``max_len`` target tokens."""
        return RNNSeq2SeqCache(max_len)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        *,
        src_mask: Tensor | None = None,
        cache: RNNSeq2SeqCache | None = None,
        return_attention: bool = False,
    ) -> Any:
        """Target ids ``(B, T)`` + memory ``(B, S, 2H)`` -> logits ``(B, T, V)``.

        Args:
            src_mask: ``(B, S)`` real source tokens (pass what :meth:`encode` used; ``None``:
                all). cache: continues from (and updates) its state: ``tgt`` are the tokens
                after those it has seen. return_attention: also return ``α``.

        Returns:
            logits, or ``(logits, weights (B, T, S))`` with ``return_attention`` (weights: zeros
            without attention).

        Raises:
            ValueError: for ids that are not ``(B, T)``, a memory of another batch or width,
                or more tokens than the cache's ``max_len``.
        """
        B, T = _check_decode(tgt, memory, 2 * self.config.d_hidden)
        if cache is not None and cache.seq_len + T > cache.max_len:
            raise ValueError(
                f"the cache holds {cache.max_len} target tokens; {cache.seq_len} seen + {T} new"
            )
        state = cache.state if cache is not None and cache.seq_len else None
        if state is None:
            state = self.initial_state(memory, src_mask)
        keys = cache.keys if cache is not None else None
        if keys is None and self.attention is not None:
            keys = self.attention.keys(memory)  # (B, S, A)
        x = self.dropout(self.tgt_embed(tgt))  # (B, T, E)
        if isinstance(self.attention, AdditiveAttention) and keys is not None:
            out, context, weights, state = self._additive_steps(
                self.attention, x, memory, keys, src_mask, state
            )
        else:
            out, state = self.decoder(x, state)  # (B, T, H): all steps in one call
            context, weights = None, memory.new_zeros(B, T, memory.shape[1])
            if self.attention is not None and keys is not None:
                context, weights = attend(self.attention.scores(out, keys), memory, src_mask)
        readout = out if context is None else torch.cat([context, out], dim=-1)  # (B, T, 3H)
        logits = self.lm_head(self.dropout(torch.tanh(self.out_proj(readout))))  # (B, T, V)
        if cache is not None:
            cache.state, cache.keys, cache.seq_len = state, keys, cache.seq_len + T
        return (logits, weights) if return_attention else logits

    def _additive_steps(
        self,
        attention: AdditiveAttention,
        x: Tensor,
        memory: Tensor,
        keys: Tensor,
        src_mask: Tensor | None,
        state: RNNState,
    ) -> tuple[Tensor, Tensor, Tensor, RNNState]:
        """Bahdanau's loop: the context of step t from ``s_{t-1}``, then the step. Returns the
        top-layer states ``(B, T, H)``, contexts ``(B, T, 2H)``, weights ``(B, T, S)``, state."""
        outs, contexts, weights = [], [], []
        for t in range(x.shape[1]):
            query = (state[0] if isinstance(state, tuple) else state)[-1][:, None]  # (B, 1, H)
            context, w = attend(attention.scores(query, keys), memory, src_mask)
            out, state = self.decoder(torch.cat([x[:, t : t + 1], context], dim=-1), state)
            outs.append(out)
            contexts.append(context)
            weights.append(w)
        return torch.cat(outs, 1), torch.cat(contexts, 1), torch.cat(weights, 1), state

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        *,
        src_mask: Tensor | None = None,
        targets: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Teacher-forced pass.

        Args:
            src: source ids ``(B, S)``. tgt: decoder input ids ``(B, T)`` (BOS + target[:-1]).
            src_mask: ``(B, S)`` True = real token (default ``src != pad_id``).
            targets: ``(B, T)`` ids to predict; positions equal to ``pad_id`` are ignored.

        Returns:
            ``(logits (B, T, V), mean token cross-entropy or None)``.

        Raises:
            ValueError: for ids outside the vocabulary, masks or targets of the wrong shape.
        """
        check_pair_batch(src, tgt)
        src_mask = self.default_src_mask(src) if src_mask is None else src_mask
        logits = self.decode(tgt, self.encode(src, src_mask=src_mask), src_mask=src_mask)
        loss = None
        if targets is not None:
            ignore = self.config.pad_id if self.config.pad_id is not None else -100
            loss = token_loss(logits, targets, tgt, ignore_index=ignore, name="tgt")
        return logits, loss

    @torch.no_grad()
    def attention_weights(
        self, src: Tensor, tgt: Tensor, *, src_mask: Tensor | None = None
    ) -> Tensor:
        """The decoder's attention ``α`` ``(B, T, S)`` teacher-forced on ``tgt`` (rows sum to 1
        over the real source tokens).

        Raises:
            ValueError: for a model without attention (``attention="none"``).
        """
        if self.attention is None:
            raise ValueError("attention='none': this decoder has no attention weights")
        src_mask = self.default_src_mask(src) if src_mask is None else src_mask
        memory = self.encode(src, src_mask=src_mask)
        _, weights = self.decode(tgt, memory, src_mask=src_mask, return_attention=True)
        return weights


def _lengths(src_mask: Tensor | None, shape: torch.Size) -> Tensor | None:
    """Real tokens per row ``(B,)`` of a right-padded mask, or ``None`` when nothing is padded.

    Raises:
        ValueError: for a mask of another shape, padding before a real token, an empty row.
    """
    if src_mask is None:
        return None
    if src_mask.shape != shape:
        raise ValueError(f"src_mask must be {tuple(shape)}, got {tuple(src_mask.shape)}")
    if bool(src_mask.all()):
        return None
    lengths = src_mask.long().sum(1)  # (B,)
    prefix = torch.arange(shape[1], device=src_mask.device)[None] < lengths[:, None]  # (B, S)
    if not torch.equal(prefix, src_mask.bool()):
        raise ValueError("src_mask must be right padding: each row's real tokens come first")
    if bool((lengths == 0).any()):
        raise ValueError("every source needs at least one real token (a row is all padding)")
    return lengths


def _check_decode(tgt: Tensor, memory: Tensor, width: int) -> tuple[int, int]:
    """``(B, T)`` of a decode call, checked against the memory ``(B, S, 2H)``."""
    if tgt.dim() != 2:
        raise ValueError(f"tgt must be (B, T) token ids, got shape {tuple(tgt.shape)}")
    if memory.dim() != 3 or memory.shape[0] != tgt.shape[0] or memory.shape[2] != width:
        raise ValueError(
            f"memory must be (B={tgt.shape[0]}, S, {width}), got {tuple(memory.shape)}"
        )
    return int(tgt.shape[0]), int(tgt.shape[1])


# -- generation: the family's own session --------------------------------------------------------


class RNNSeq2SeqSession:
    """Encode once, then decode from BOS one token at a time, carrying the decoder state (the
    :class:`~attnlab.models.family.Session` of this family; a KV cache's session would reorder
    per-layer key caches this model does not have).

    Args:
        model: an :class:`RNNSeq2Seq` in eval mode. source: right-padded sources.
        max_new_tokens: N. use_cache: ``False`` re-decodes the whole prefix at every step.
    """

    def __init__(
        self, model: RNNSeq2Seq, source: PromptBatch, max_new_tokens: int, use_cache: bool
    ) -> None:
        self.model = model
        self.src_mask = source.mask  # (B, S) or None
        default = model.default_src_mask(source.ids)
        if self.src_mask is None and default is not None and not bool(default.all()):
            self.src_mask = torch.ones_like(source.ids, dtype=torch.bool)  # real pad-id tokens
        self.memory = model.encode(source.ids, src_mask=self.src_mask)  # (B, S, 2H)
        self.cache = model.new_cache(max_new_tokens) if use_cache else None
        self.tgt = torch.full((source.batch_size, max_new_tokens), model.config.bos_id,
                              dtype=torch.long, device=source.ids.device)  # fmt: skip  # (B, N)
        self.length = 1

    def _logits(self, start: int) -> Tensor:
        logits = self.model.decode(self.tgt[:, start : self.length], self.memory,
                                   src_mask=self.src_mask, cache=self.cache)  # fmt: skip
        return logits[:, -1]  # (B, V)

    def prefill(self) -> Tensor:
        return self._logits(0)

    def step(self, tokens: Tensor) -> Tensor:
        self.tgt[:, self.length] = tokens
        self.length += 1
        return self._logits(self.length - 1 if self.cache is not None else 0)

    def select(self, index: Tensor, *, same_source: bool = False) -> None:
        self.tgt = self.tgt.index_select(0, index)
        if self.cache is not None:
            self.cache.reorder(index, keys=not same_source)
        if not same_source:
            self.memory = self.memory.index_select(0, index)
            if self.src_mask is not None:
                self.src_mask = self.src_mask.index_select(0, index)


PRESETS: dict[str, RNNSeq2SeqConfig] = {
    # the translation recipe's sizes (vocabulary 8000): bidirectional GRU encoder, GRU decoder
    "seq2seq-gru-bahdanau": RNNSeq2SeqConfig(attention="bahdanau"),
    "seq2seq-gru-luong": RNNSeq2SeqConfig(attention="luong"),
    "seq2seq-gru-none": RNNSeq2SeqConfig(attention="none"),
    # a CPU-sized model for tests and the course
    "seq2seq-tiny": RNNSeq2SeqConfig(
        vocab_size=64, d_model=32, d_hidden=32, dropout=0.0, max_seq_len=64
    ),
}


# -- the family's declaration (attnlab.models.family) -----------------------------------------


def rnn_params(cell: str, d_in: int, H: int, n_layers: int, *, layer_in: int, bias: bool) -> int:
    """Parameters of one direction of a torch GRU/LSTM stack (its two bias vectors):
    ``d_in`` the first layer's input, ``layer_in`` the later layers'."""
    G = 4 if cell == "lstm" else 3
    return sum(
        G * H * ((d_in if i == 0 else layer_in) + H) + (2 * G * H if bias else 0)
        for i in range(n_layers)
    )


def _params(c: RNNSeq2SeqConfig) -> ParamBreakdown:
    H, L, E, A = c.d_hidden, c.n_layers, c.d_model, c.attention_size
    comp = {"embedding.token": c.vocab_size * E}
    tied: dict[str, str] = {}
    if c.share_embeddings:
        tied["embedding.target"] = "embedding.token"
    else:
        comp["embedding.target"] = c.target_vocab_size * E
    comp["encoder.rnn"] = 2 * rnn_params(c.cell, E, H, L, layer_in=2 * H, bias=c.bias)
    comp["decoder.init"] = linear_params(2 * H, L * H, c.bias)
    d_input = E + (2 * H if c.attention == "bahdanau" else 0)
    comp["decoder.rnn"] = rnn_params(c.cell, d_input, H, L, layer_in=H, bias=c.bias)
    attn = {"none": 0, "luong": 2 * H * H,
            "bahdanau": H * A + linear_params(2 * H, A, c.bias) + A}  # fmt: skip
    comp["decoder.cross_attn"] = attn[c.attention]
    d_readout = H + (0 if c.attention == "none" else 2 * H)
    comp["decoder.readout"] = linear_params(d_readout, E, c.bias)
    comp["lm_head"] = 0 if c.tie_output else c.target_vocab_size * E
    if c.tie_output:
        tied["lm_head"] = "embedding.token" if c.share_embeddings else "embedding.target"
    return ParamBreakdown(comp, {"encoder": L, "decoder": L}, tied)


COSTS = Costs(
    params=_params,
    notes=lambda c, n: ["a recurrent encoder-decoder: only the parameter count is modelled"],
)


FAMILY = register_family(
    Family(
        name="rnn_seq2seq",
        config=RNNSeq2SeqConfig,
        model=RNNSeq2Seq,
        kind=Kind.SEQ2SEQ,
        presets=PRESETS,
        description="recurrent encoder-decoder: Bahdanau or Luong attention, or none (§1.2)",
        costs=COSTS,
        session=RNNSeq2SeqSession,
        example_inputs=seq2seq_inputs,
    )
)


__all__ = [
    "PRESETS",
    "RNNSeq2Seq",
    "RNNSeq2SeqCache",
    "RNNSeq2SeqConfig",
    "RNNSeq2SeqSession",
    "rnn_params",
]
