"""The encoder-decoder Transformer of "Attention Is All You Need" (§3, Figure 1).

``TransformerConfig`` + ``Encoder``/``Decoder`` stacks + ``EncoderDecoderTransformer`` (source and
target embeddings scaled by sqrt(d_model), positional encoding, N encoder and N decoder layers, the
pre-softmax projection tied to the target embedding, §3.4) and the Table 3 presets.

Shapes: B batch, S source length, T target length, E d_model, V target vocabulary, H heads.
Masks: ``src_mask``/``tgt_mask`` are per-token key masks ``(B, S)``/``(B, T)``, True = real token
(Hugging Face's ``attention_mask`` convention); inside, attention masks are bool True = may
attend, broadcastable to (B, H, T, S).

Deviations from the paper: weight init (not specified there) is Xavier-uniform for linears and
N(0, d_model^-1/2) for embeddings; a final norm is added after each stack when pre-norm is used
(``final_norm``), as every pre-norm implementation does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import Tensor, nn

from attnlab.config import check_positive
from attnlab.layers.embedding import TokenEmbedding, tie_weights
from attnlab.layers.kv_cache import KVCache
from attnlab.layers.masks import as_attention_mask, combine_masks
from attnlab.layers.positional import (
    PositionalEncoding,
    RotaryEmbedding,
    build_positional_encoding,
)
from attnlab.models.base import GenerationMixin, PretrainedModel
from attnlab.models.common import (
    Seq2SeqVocabulary,
    StackConfig,
    check_pair_batch,
    check_size,
    decoder_layer,
    encoder_layer,
    final_norm,
    seq2seq_inputs,
    token_loss,
)
from attnlab.models.costs import (
    FP32,
    INDEX_BYTES,
    Costs,
    KVShape,
    MatmulTerm,
    ParamBreakdown,
    activation_result,
    norm_elems,
    norm_params,
    stack_activations,
    stack_params,
    stack_terms,
)
from attnlab.models.family import (
    ExplorerSpec,
    Family,
    HookLayout,
    HookStack,
    Kind,
    Readout,
    register_family,
)


@dataclass(frozen=True, kw_only=True)
class TransformerConfig(Seq2SeqVocabulary, StackConfig):
    """Hyper-parameters of the encoder-decoder Transformer (defaults: the base model, Table 3)."""

    model_type: ClassVar[str] = "transformer"

    vocab_size: int = 37000  # source (and shared) vocabulary
    tgt_vocab_size: int | None = None  # None: one vocabulary shared by source and target
    n_decoder_layers: int | None = None
    max_seq_len: int = 1024
    pos_encoding: str = "sinusoidal"
    rope_base: float = 10000.0
    rope_scaling: Literal["none", "linear", "ntk", "dynamic"] = "none"
    rope_factor: float = 1.0
    scale_embeddings: bool = True  # multiply embeddings by sqrt(d_model), §3.4
    share_embeddings: bool = True  # one table for source and target (needs a shared vocabulary)
    tie_output: bool = True  # pre-softmax projection = target embedding, §3.4
    output_bias: bool = False  # a bias on the pre-softmax projection (Marian has one)
    pad_id: int | None = 0
    bos_id: int = 1
    eos_id: int = 2

    def validate(self) -> None:
        super().validate()
        check_positive(tgt_vocab_size=self.tgt_vocab_size, n_decoder_layers=self.n_decoder_layers)
        if self.attn_layer_backends is not None and self.num_decoder_layers != self.n_layers:
            raise ValueError(
                "attn_layer_backends needs as many decoder as encoder layers, got "
                f"n_layers={self.n_layers}, n_decoder_layers={self.n_decoder_layers}"
            )
        self.check_vocabularies()

    @property
    def num_decoder_layers(self) -> int:
        return self.n_decoder_layers or self.n_layers


class Encoder(nn.Module):
    """N encoder layers (+ a final norm for pre-norm), on already-embedded inputs."""

    def __init__(self, config: TransformerConfig, rotary: PositionalEncoding | None = None) -> None:
        super().__init__()
        c = config
        self.layers = nn.ModuleList(encoder_layer(c, i, rotary) for i in range(c.n_layers))
        self.final_norm = final_norm(c)

    def forward(
        self, x: Tensor, *, mask: Tensor | None = None, positions: Tensor | None = None
    ) -> Tensor:
        """x ``(B, S, E)`` -> memory ``(B, S, E)``; ``mask`` broadcastable to (B, H, S, S)."""
        for layer in self.layers:
            x = layer(x, mask=mask, positions=positions)
        return self.final_norm(x) if self.final_norm is not None else x


class Decoder(nn.Module):
    """N decoder layers (+ a final norm for pre-norm), on already-embedded inputs."""

    def __init__(self, config: TransformerConfig, rotary: PositionalEncoding | None = None) -> None:
        super().__init__()
        c = config
        self.layers = nn.ModuleList(
            decoder_layer(c, i, rotary) for i in range(c.num_decoder_layers)
        )
        self.final_norm = final_norm(c)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        *,
        mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """x ``(B, T, E)``, memory ``(B, S, E)`` -> ``(B, T, E)``. ``mask`` is combined with the
        causal mask (bottom-right aligned with a cache)."""
        for i, layer in enumerate(self.layers):
            sc, cc = cache.layer(i) if cache is not None else (None, None)
            x = layer(
                x,
                memory,
                mask=mask,
                memory_mask=memory_mask,
                is_causal=True,
                positions=positions,
                cache=sc,
                cross_cache=cc,
            )
        return self.final_norm(x) if self.final_norm is not None else x


class EncoderDecoderTransformer(GenerationMixin, PretrainedModel):
    """The paper's model: ``forward(src, tgt) -> (logits, loss)``.

    Use :meth:`encode` once and :meth:`decode` per step (with a :class:`KVCache`) to generate.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        c = self.config = config
        self.src_embed = TokenEmbedding(c.vocab_size, c.d_model, scale=c.scale_embeddings)
        self.tgt_embed = (
            self.src_embed
            if c.share_embeddings
            else TokenEmbedding(c.target_vocab_size, c.d_model, scale=c.scale_embeddings)
        )
        self.pos_encoding = build_positional_encoding(
            c.pos_encoding,
            d_model=c.d_model,
            n_heads=c.n_heads,
            max_seq_len=c.max_seq_len,
            rope_base=c.rope_base,
            rope_scaling=c.rope_scaling,
            rope_factor=c.rope_factor,
        )
        rotary = self.pos_encoding if isinstance(self.pos_encoding, RotaryEmbedding) else None
        self.dropout = nn.Dropout(c.dropout)
        self.encoder = Encoder(c, rotary)
        self.decoder = Decoder(c, rotary)
        self.lm_head = nn.Linear(c.d_model, c.target_vocab_size, bias=c.output_bias)
        self.reset_parameters()
        if c.tie_output:
            tie_weights(self.lm_head, self.tgt_embed)

    def reset_parameters(self) -> None:
        """Xavier-uniform for every linear weight, zero biases (embeddings keep their init)."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def _positions(self, ids: Tensor, offset: int = 0) -> Tensor:
        T = ids.shape[1]
        if offset + T > self.config.max_seq_len and self.config.pos_encoding == "learned":
            raise ValueError(
                f"sequence of {offset + T} tokens exceeds max_seq_len={self.config.max_seq_len}"
            )
        return torch.arange(offset, offset + T, device=ids.device)  # (T,)

    def default_src_mask(self, src: Tensor) -> Tensor | None:
        """``src != pad_id`` ``(B, S)`` when the config has a pad id, else ``None``."""
        pad = self.config.pad_id
        return None if pad is None else src != pad

    def encode(self, src: Tensor, *, src_mask: Tensor | None = None) -> Tensor:
        """Source ids ``(B, S)`` -> memory ``(B, S, E)``.

        ``src_mask`` ``(B, S)`` is True for real tokens; default ``src != pad_id``.
        """
        if src.dim() != 2:
            raise ValueError(f"src must be (B, S) token ids, got shape {tuple(src.shape)}")
        src_mask = self.default_src_mask(src) if src_mask is None else src_mask
        pos = self._positions(src)
        x = self.dropout(self.pos_encoding.embed(self.src_embed(src), pos))  # (B, S, E)
        mask = combine_masks(
            as_attention_mask(src_mask) if src_mask is not None else None,
            self.pos_encoding.score_bias(pos, pos),
        )
        return self.encoder(x, mask=mask, positions=pos)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        *,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """Target ids ``(B, T)`` + memory ``(B, S, E)`` -> logits ``(B, T, V)``.

        ``src_mask`` ``(B, S)``: real source tokens (pass what :meth:`encode` used).
        ``tgt_mask`` ``(B, T_cached + T)``: real target tokens (optional; right padding needs
        none, since the causal mask keeps real positions from seeing it).
        ``cache``: a :class:`KVCache` with cross-attention, extended by this call.
        """
        if tgt.dim() != 2:
            raise ValueError(f"tgt must be (B, T) token ids, got shape {tuple(tgt.shape)}")
        offset = cache.seq_len if cache is not None else 0
        pos = self._positions(tgt, offset)  # (T,)
        x = self.dropout(self.pos_encoding.embed(self.tgt_embed(tgt), pos))  # (B, T, E)
        k_pos = torch.arange(offset + tgt.shape[1], device=tgt.device)  # (S_self,)
        self_mask = combine_masks(
            as_attention_mask(tgt_mask) if tgt_mask is not None else None,
            self.pos_encoding.score_bias(pos, k_pos),
        )
        memory_mask = as_attention_mask(src_mask) if src_mask is not None else None
        h = self.decoder(
            x, memory, mask=self_mask, memory_mask=memory_mask, positions=pos, cache=cache
        )
        return self.lm_head(h)

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        *,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        targets: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Teacher-forced pass.

        Args:
            src: source ids ``(B, S)``. tgt: decoder input ids ``(B, T)`` (BOS + target[:-1]).
            targets: ``(B, T)`` ids to predict; positions equal to ``pad_id`` are ignored.

        Returns:
            ``(logits (B, T, V), loss or None)``; the loss is the mean token cross-entropy.

        Raises:
            ValueError: for ids outside the vocabulary, masks or targets of the wrong shape.
        """
        check_pair_batch(src, tgt)
        src_mask = self.default_src_mask(src) if src_mask is None else src_mask
        memory = self.encode(src, src_mask=src_mask)
        logits = self.decode(tgt, memory, src_mask=src_mask, tgt_mask=tgt_mask)
        loss = None
        if targets is not None:
            ignore = self.config.pad_id if self.config.pad_id is not None else -100
            loss = token_loss(logits, targets, tgt, ignore_index=ignore, name="tgt")
        return logits, loss

    def new_cache(self, max_len: int) -> KVCache:
        """An empty :class:`KVCache` for decoding up to ``max_len`` target tokens."""
        return KVCache(self.config.num_decoder_layers, max_len, cross_attention=True)


PRESETS: dict[str, TransformerConfig] = {
    # Table 3, "base": N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1; shared BPE vocabulary of 37k.
    "transformer-base": TransformerConfig(),
    # Table 3, "big": d_model=1024, d_ff=4096, h=16, P_drop=0.3 (EN-DE).
    "transformer-big": TransformerConfig(d_model=1024, d_ff=4096, n_heads=16, dropout=0.3),
    # A CPU-sized model for the synthetic tasks and quick experiments.
    "transformer-tiny": TransformerConfig(
        vocab_size=64, d_model=64, n_heads=4, n_layers=2, d_ff=256, dropout=0.1, max_seq_len=64
    ),
}


# -- the family's declaration (attnlab.models.family) -----------------------------------------


def _params(c: TransformerConfig) -> ParamBreakdown:
    comp = {"embedding.token": c.vocab_size * c.d_model}
    tied: dict[str, str] = {}
    if c.share_embeddings:
        tied["embedding.target"] = "embedding.token"
    else:
        comp["embedding.target"] = c.target_vocab_size * c.d_model
    if c.pos_encoding == "learned":
        comp["embedding.position"] = c.max_seq_len * c.d_model
    comp.update(stack_params("encoder", c, c.n_layers))
    if c.use_final_norm:
        comp["encoder.final_norm"] = norm_params(c.d_model, c.norm, c.bias)
    comp.update(stack_params("decoder", c, c.num_decoder_layers, cross_attention=True))
    if c.use_final_norm:
        comp["decoder.final_norm"] = norm_params(c.d_model, c.norm, c.bias)
    comp["lm_head"] = 0 if c.tie_output else c.target_vocab_size * c.d_model
    if c.output_bias:  # Marian's bias on the pre-softmax projection
        comp["lm_head"] += c.target_vocab_size
    if c.tie_output:
        tied["lm_head"] = "embedding.target" if not c.share_embeddings else "embedding.token"
    return ParamBreakdown(comp, {"encoder": c.n_layers, "decoder": c.num_decoder_layers}, tied)


def _flops(c: TransformerConfig, B: int, n: int, src: int | None) -> tuple[list[MatmulTerm], int]:
    S = n if src is None else src
    terms, softmax = stack_terms("encoder", c, batch=B, n=S, n_layers=c.n_layers)
    dec, dec_softmax = stack_terms(
        "decoder", c, batch=B, n=n, n_layers=c.num_decoder_layers, memory_len=S
    )
    terms.append(MatmulTerm("lm_head", B * n, c.d_model, c.target_vocab_size))
    terms[-1:-1] = dec  # keep model order: encoder, decoder, head
    return terms, softmax + dec_softmax


def _activations(
    c: TransformerConfig, *, batch: int, seq_len: int, src_len: int | None, a: int, every: int
) -> dict[str, int]:
    B, T, t = batch, seq_len, batch * seq_len
    S = T if src_len is None else check_size("src_len", src_len)
    masked = c.pad_id is not None
    enc = stack_activations(c, B=B, T=S, n_layers=c.n_layers, masked=masked, every=every)
    dec = stack_activations(c, B=B, T=T, n_layers=c.num_decoder_layers, masked=True,
                            memory_len=S, every=every)  # fmt: skip
    act, fp32, scores = (x + y for x, y in zip(enc, dec, strict=True))
    outside = (B * S + 2 * t) * INDEX_BYTES  # source ids, target ids, targets
    outside += B * S * c.d_model * a  # the memory, input of every cross-attention k/v
    if c.use_final_norm:
        outside += ((B * S + t) * c.d_model + norm_elems(c, B * S) + norm_elems(c, t)) * a
    outside += t * c.d_model * a + t * c.target_vocab_size * FP32
    return activation_result(act, fp32, scores, outside, a)


COSTS = Costs(
    params=_params,
    flops=_flops,
    activations=_activations,
    kv_cache=lambda c: KVShape(
        c.num_decoder_layers, (c.n_kv_heads or c.n_heads) * c.d_head, cross=True
    ),
    notes=lambda c, n: ["tokens = target tokens (B·T) for the per-token and 6·N·tokens figures"],
)


def _hook_layout(model: EncoderDecoderTransformer) -> HookLayout:
    # the embeddings (shared when share_embeddings) and the positional encoding serve both
    # stacks: their points fire only inside encode() or decode()
    stacks = tuple(
        HookStack(
            f"{scope}.",
            (("embed.token", embed),),
            model.pos_encoding,
            stack.layers,
            stack.final_norm,
            runs_in=method,
        )
        for scope, embed, stack, method in (
            ("encoder", model.src_embed, model.encoder, "encode"),
            ("decoder", model.tgt_embed, model.decoder, "decode"),
        )
    )
    d = model.decoder
    readout = Readout("decoder.", d.layers, d.final_norm, model.lm_head)
    return HookLayout(stacks, head=model.lm_head, readout=readout)


FAMILY = register_family(
    Family(
        name="transformer",
        config=TransformerConfig,
        model=EncoderDecoderTransformer,
        kind=Kind.SEQ2SEQ,
        presets=PRESETS,
        description="the paper's encoder-decoder Transformer (Table 3)",
        hooks=_hook_layout,
        costs=COSTS,
        example_inputs=seq2seq_inputs,
        explorer=ExplorerSpec(),
    )
)
