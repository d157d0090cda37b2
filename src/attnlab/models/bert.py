"""BERT: a bidirectional encoder pre-trained as a masked language model (lesson §10).

Token + learned position + segment (token type) embeddings, summed and normalised; a post-norm
encoder stack (the paper's residual layout); an optional pooler (tanh dense on [CLS]); an optional
masked-LM head (dense + activation + norm, then a decoder tied to the token embedding plus a
per-token bias); an optional next-sentence-prediction head (a 2-way linear classifier on the
pooled [CLS]: IsNext / NotNext, Devlin et al. §3.1 "Task #2"). With both heads the model is
Hugging Face's ``BertForPreTraining``. :func:`mask_tokens` implements the 80/10/10 corruption
of Devlin et al. §3.1.

Shapes: B batch, T tokens, E d_model, V vocabulary, H heads.
Masks: ``mask`` is a per-token key mask ``(B, T)``, True/1 = real token (Hugging Face's
``attention_mask``); inside, attention masks are bool True = may attend, broadcast to (B, H, T, T).

NSP labels follow Hugging Face's convention: 0 = IsNext (segment B follows A), 1 = NotNext.

Deviations from the references: none in the architecture.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import check_positive
from attnlab.layers.embedding import TokenEmbedding, tie_weights
from attnlab.layers.feedforward import ACTIVATIONS, GATED
from attnlab.layers.masks import as_attention_mask, combine_masks
from attnlab.layers.norm import build_norm
from attnlab.layers.positional import (
    RotaryEmbedding,
    build_positional_encoding,
)
from attnlab.models.base import PretrainedModel
from attnlab.models.common import (
    StackConfig,
    check_token_ids,
    encoder_layer,
    final_norm,
    token_inputs,
    token_loss,
)
from attnlab.models.costs import (
    FP32,
    INDEX_BYTES,
    Costs,
    MatmulTerm,
    ParamBreakdown,
    activation_result,
    linear_params,
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
class BERTConfig(StackConfig):
    """Hyper-parameters of BERT (defaults: BERT-base, uncased WordPiece vocabulary)."""

    model_type: ClassVar[str] = "bert"

    vocab_size: int = 30522
    type_vocab_size: int = 2  # segments A/B
    d_model: int = 768
    n_heads: int = 12
    n_layers: int = 12
    d_ff: int = 3072
    max_seq_len: int = 512
    norm_eps: float = 1e-12
    activation: str = "gelu"  # exact (erf) GELU
    pos_encoding: str = "learned"
    rope_base: float = 10000.0
    pooler: bool = True  # tanh(dense([CLS])) for sentence-level tasks
    mlm_head: bool = True  # transform + norm + tied decoder + bias
    tie_output: bool = True  # MLM decoder shares the token embedding
    nsp_head: bool = False  # next-sentence classifier (2 logits) on the pooled [CLS]
    init_std: float = 0.02
    ignore_index: int = -100
    pad_id: int | None = 0
    cls_id: int = 101
    sep_id: int = 102
    mask_id: int = 103

    def validate(self) -> None:
        super().validate()
        check_positive(type_vocab_size=self.type_vocab_size)
        check_token_ids(self, ("pad_id", "cls_id", "sep_id", "mask_id"), self.vocab_size)
        if self.nsp_head and not self.pooler:
            raise ValueError(
                "nsp_head=True needs pooler=True: the next-sentence classifier reads the pooled "
                "[CLS] vector"
            )

    @property
    def special_ids(self) -> tuple[int, ...]:
        """Token ids never chosen for masking: [PAD], [CLS], [SEP], [MASK]."""
        ids = (self.pad_id, self.cls_id, self.sep_id, self.mask_id)
        return tuple(i for i in ids if i is not None)


class BERTOutput(NamedTuple):
    """What :meth:`BERT.forward` returns (fields are ``None`` when not computed)."""

    hidden: Tensor  # (B, T, E) last encoder layer
    pooled: Tensor | None  # (B, E) pooler output on [CLS]
    logits: Tensor | None  # (B, T, V) masked-LM logits
    loss: Tensor | None  # mean MLM cross-entropy + mean NSP cross-entropy (those with labels)
    nsp_logits: Tensor | None = None  # (B, 2) next-sentence logits: 0 IsNext, 1 NotNext


class MLMHead(nn.Module):
    """Masked-LM head: dense + activation + norm, then a decoder to the vocabulary (+ bias)."""

    def __init__(
        self, d_model: int, vocab_size: int, *, activation: str, norm: str, norm_eps: float
    ) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.act = ACTIVATIONS.get(GATED.get(activation, activation))
        self.norm = build_norm(norm, d_model, eps=norm_eps)
        self.decoder = nn.Linear(d_model, vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, h: Tensor) -> Tensor:
        """h ``(B, T, E)`` -> logits ``(B, T, V)``."""
        return self.decoder(self.norm(self.act(self.dense(h)))) + self.bias


NSP_CLASSES = 2  # IsNext (0), NotNext (1)


def nsp_loss(nsp_logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy of next-sentence logits ``(B, 2)`` against labels ``(B,)`` in {0, 1}
    (0 = IsNext, 1 = NotNext), in float32.

    Raises:
        ValueError: for labels of another shape, a non-integer dtype, or values outside {0, 1}.
    """
    B = nsp_logits.shape[0]
    if labels.shape != (B,):
        raise ValueError(f"nsp_labels must have shape ({B},), got {tuple(labels.shape)}")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(f"nsp_labels must be integer class ids, got dtype {labels.dtype}")
    if labels.numel() and not torch.compiler.is_compiling():
        lo, hi = int(labels.min()), int(labels.max())
        if lo < 0 or hi >= NSP_CLASSES:
            raise ValueError(
                f"nsp_labels must be 0 (IsNext) or 1 (NotNext), got values in [{lo}, {hi}]"
            )
    return F.cross_entropy(nsp_logits.float(), labels)


class BERT(PretrainedModel):
    """BERT encoder with optional pooler, masked-LM head and next-sentence head:
    ``forward(ids) -> BERTOutput``."""

    def __init__(self, config: BERTConfig) -> None:
        super().__init__()
        c = self.config = config
        self.tok_embed = TokenEmbedding(c.vocab_size, c.d_model, scale=False)
        self.segment_embed = TokenEmbedding(c.type_vocab_size, c.d_model, scale=False)
        self.pos_encoding = build_positional_encoding(
            c.pos_encoding,
            d_model=c.d_model,
            n_heads=c.n_heads,
            max_seq_len=c.max_seq_len,
            rope_base=c.rope_base,
        )
        rotary = self.pos_encoding if isinstance(self.pos_encoding, RotaryEmbedding) else None
        self.embed_norm = build_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias)
        self.dropout = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(encoder_layer(c, i, rotary) for i in range(c.n_layers))
        # Pre-norm stacks need a closing norm; the post-norm layers end normalised already.
        self.final_norm = final_norm(c)
        self.pooler = nn.Linear(c.d_model, c.d_model) if c.pooler else None
        self.mlm = (
            MLMHead(
                c.d_model, c.vocab_size, activation=c.activation, norm=c.norm, norm_eps=c.norm_eps
            )
            if c.mlm_head
            else None
        )
        self.nsp = nn.Linear(c.d_model, NSP_CLASSES) if c.nsp_head else None
        self.reset_parameters()
        if self.mlm is not None and c.tie_output:
            tie_weights(self.mlm.decoder, self.tok_embed)

    def reset_parameters(self) -> None:
        """BERT init: N(0, init_std) for linears and embeddings, zero biases."""
        std = self.config.init_std
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, TokenEmbedding):
                nn.init.normal_(m.weight, std=std)

    def default_mask(self, ids: Tensor) -> Tensor | None:
        """``ids != pad_id`` ``(B, T)`` when the config has a pad id, else ``None``."""
        return None if self.config.pad_id is None else ids != self.config.pad_id

    def embed(self, ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """Token + position + segment embeddings, normalised: ids ``(B, T)`` -> ``(B, T, E)``."""
        c = self.config
        if ids.dim() != 2:
            raise ValueError(f"ids must be (B, T) token ids, got shape {tuple(ids.shape)}")
        T = ids.shape[1]
        if T == 0:
            raise ValueError(
                f"ids must hold at least one token (the pooler reads [CLS]), got shape "
                f"{tuple(ids.shape)}"
            )
        if c.pos_encoding == "learned" and c.max_seq_len < T:
            raise ValueError(
                f"sequence of {T} tokens exceeds max_seq_len={c.max_seq_len} "
                "(the learned position table)"
            )
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(ids)
        elif token_type_ids.shape != ids.shape:
            raise ValueError(
                f"token_type_ids must match ids {tuple(ids.shape)}, got "
                f"{tuple(token_type_ids.shape)}"
            )
        elif token_type_ids.numel() and (
            int(token_type_ids.min()) < 0 or int(token_type_ids.max()) >= c.type_vocab_size
        ):
            raise ValueError(
                f"token_type_ids must lie in [0, {c.type_vocab_size}), got values in "
                f"[{int(token_type_ids.min())}, {int(token_type_ids.max())}]"
            )
        pos = torch.arange(T, device=ids.device)  # (T,)
        x = self.tok_embed(ids) + self.segment_embed(token_type_ids)  # (B, T, E)
        x = self.pos_encoding.embed(x, pos)
        return self.dropout(self.embed_norm(x))

    def forward(
        self,
        ids: Tensor,
        *,
        token_type_ids: Tensor | None = None,
        mask: Tensor | None = None,
        targets: Tensor | None = None,
        nsp_labels: Tensor | None = None,
    ) -> BERTOutput:
        """Encode (and predict masked tokens and whether segment B follows segment A).

        Args:
            ids: token ids ``(B, T)``, e.g. from :func:`mask_tokens`.
            token_type_ids: segment ids ``(B, T)`` in ``[0, type_vocab_size)``; default all 0.
            mask: ``(B, T)`` key mask, True/1 = real token; default ``ids != pad_id``.
            targets: ``(B, T)`` MLM labels: the original token at masked positions,
                ``config.ignore_index`` elsewhere (the second output of :func:`mask_tokens`).
            nsp_labels: ``(B,)`` next-sentence labels, 0 = IsNext, 1 = NotNext.

        Returns:
            :class:`BERTOutput` ``(hidden, pooled, logits, loss, nsp_logits)``; ``loss`` is the
            sum of the mean MLM and mean NSP cross-entropies of the labels given (Hugging
            Face's ``BertForPreTraining`` total loss when both are).

        Raises:
            ValueError: for ids/segments out of range, an empty or too long sequence,
                ``targets`` without an MLM head or of another shape than ``ids``, or
                ``nsp_labels`` without an NSP head or not in {0, 1}.
        """
        mask = self.default_mask(ids) if mask is None else mask
        x = self.embed(ids, token_type_ids)  # (B, T, E)
        pos = torch.arange(ids.shape[1], device=ids.device)  # (T,)
        attn_mask = combine_masks(
            as_attention_mask(mask) if mask is not None else None,
            self.pos_encoding.score_bias(pos, pos),
        )
        for layer in self.layers:
            x = layer(x, mask=attn_mask, positions=pos)
        if self.final_norm is not None:
            x = self.final_norm(x)
        pooled = torch.tanh(self.pooler(x[:, 0])) if self.pooler is not None else None  # (B, E)
        logits = self.mlm(x) if self.mlm is not None else None  # (B, T, V)
        nsp_logits = None
        if self.nsp is not None and pooled is not None:
            nsp_logits = self.nsp(pooled)  # (B, 2)
        loss = None
        if targets is not None:
            if logits is None:
                raise ValueError("targets need the MLM head; build with mlm_head=True")
            loss = token_loss(logits, targets, ids, ignore_index=self.config.ignore_index)
        if nsp_labels is not None:
            if nsp_logits is None:
                raise ValueError("nsp_labels need the NSP head; build with nsp_head=True")
            nsp = nsp_loss(nsp_logits, nsp_labels)
            loss = nsp if loss is None else loss + nsp
        return BERTOutput(x, pooled, logits, loss, nsp_logits)


def mask_tokens(
    ids: Tensor,
    *,
    vocab_size: int,
    mask_id: int,
    special_ids: tuple[int, ...] | list[int] = (),
    mask_prob: float = 0.15,
    ignore_index: int = -100,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """BERT's masked-LM corruption (Devlin et al. §3.1, "Task #1").

    Each non-special token is selected with probability ``mask_prob``; a selected token becomes
    ``mask_id`` with probability 0.8, a uniformly random token of ``[0, vocab_size)`` with 0.1,
    and stays unchanged with 0.1. Only selected positions get a target.

    Args:
        ids: token ids ``(B, T)`` (any shape works). vocab_size: V for random replacements.
        mask_id: the [MASK] id. special_ids: ids never selected ([CLS], [SEP], [PAD], ...).
        mask_prob: selection probability. ignore_index: target of unselected positions.
        generator: a seeded ``torch.Generator`` for reproducible masks (on ``ids``' device).

    Returns:
        ``(inputs, targets)`` of ``ids``' shape: corrupted ids, and the original ids at the
        selected positions (``ignore_index`` elsewhere).

    Raises:
        ValueError: for a probability outside [0, 1] or a non-integer ``ids``.
    """
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(f"ids must be an integer tensor, got dtype {ids.dtype}")
    if not 0.0 <= mask_prob <= 1.0:
        raise ValueError(f"mask_prob must be in [0, 1], got {mask_prob}")

    def draw(p: float) -> Tensor:
        return torch.rand(ids.shape, generator=generator, device=ids.device) < p

    special = torch.zeros_like(ids, dtype=torch.bool)
    for s in special_ids:
        special |= ids == s
    selected = draw(mask_prob) & ~special
    to_mask = selected & draw(0.8)
    to_random = selected & ~to_mask & draw(0.5)  # half of the remaining 20%
    random_ids = torch.randint(
        vocab_size, ids.shape, generator=generator, device=ids.device, dtype=ids.dtype
    )
    inputs = torch.where(to_mask, torch.full_like(ids, mask_id), ids)
    inputs = torch.where(to_random, random_ids, inputs)
    targets = torch.where(selected, ids, torch.full_like(ids, ignore_index))
    return inputs, targets


def mask_tokens_for(
    config: BERTConfig, ids: Tensor, *, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """:func:`mask_tokens` with the vocabulary, [MASK] id, special ids and ignore index of
    ``config``."""
    return mask_tokens(
        ids,
        vocab_size=config.vocab_size,
        mask_id=config.mask_id,
        special_ids=config.special_ids,
        ignore_index=config.ignore_index,
        generator=generator,
    )


PRESETS: dict[str, BERTConfig] = {
    # Devlin et al. 2019, Table/§3: the encoder and pooler as published (Hugging Face's
    # BertModel). Pass mlm_head=True (and nsp_head=True) to pre-train with the masked-LM (and
    # next-sentence) head.
    "bert-base": BERTConfig(mlm_head=False),
    "bert-large": BERTConfig(d_model=1024, n_heads=16, n_layers=24, d_ff=4096, mlm_head=False),
    # A CPU-sized masked LM (Turc et al. 2019's BERT-Tiny shape: L=2, H=128, A=2).
    "bert-tiny": BERTConfig(d_model=128, n_heads=2, n_layers=2, d_ff=512),
}


# -- the family's declaration (attnlab.models.family) -----------------------------------------


def _params(c: BERTConfig) -> ParamBreakdown:
    comp = {
        "embedding.token": c.vocab_size * c.d_model,
        "embedding.segment": c.type_vocab_size * c.d_model,
    }
    if c.pos_encoding == "learned":
        comp["embedding.position"] = c.max_seq_len * c.d_model
    comp["embedding.norm"] = norm_params(c.d_model, c.norm, c.bias)
    comp.update(stack_params("layers", c, c.n_layers))
    if c.norm_position == "pre":
        comp["final_norm"] = norm_params(c.d_model, c.norm, c.bias)
    if c.pooler:
        comp["pooler"] = linear_params(c.d_model, c.d_model)
    tied: dict[str, str] = {}
    if c.mlm_head:
        comp["mlm.transform"] = linear_params(c.d_model, c.d_model) + norm_params(c.d_model, c.norm)
        comp["mlm.decoder"] = c.vocab_size + (0 if c.tie_output else c.vocab_size * c.d_model)
        if c.tie_output:
            tied["mlm.decoder"] = "embedding.token"
    if c.nsp_head:
        comp["nsp"] = linear_params(c.d_model, NSP_CLASSES)
    return ParamBreakdown(comp, {"layers": c.n_layers}, tied)


def _flops(c: BERTConfig, B: int, n: int, src: int | None) -> tuple[list[MatmulTerm], int]:
    terms, softmax = stack_terms("layers", c, batch=B, n=n, n_layers=c.n_layers)
    if c.pooler:
        terms.append(MatmulTerm("pooler", B, c.d_model, c.d_model))  # [CLS] only
    if c.mlm_head:
        terms.append(MatmulTerm("mlm.dense", B * n, c.d_model, c.d_model))
        terms.append(MatmulTerm("mlm.decoder", B * n, c.d_model, c.vocab_size))
    if c.nsp_head:
        terms.append(MatmulTerm("nsp", B, c.d_model, NSP_CLASSES))  # pooled [CLS] only
    return terms, softmax


def _activations(
    c: BERTConfig, *, batch: int, seq_len: int, src_len: int | None, a: int, every: int
) -> dict[str, int]:
    B, T, t = batch, seq_len, batch * seq_len
    masked = c.pad_id is not None
    act, fp32, scores = stack_activations(c, B=B, T=T, n_layers=c.n_layers, masked=masked,
                                          every=every)  # fmt: skip
    outside = 2 * t * INDEX_BYTES  # ids, segment ids
    outside += (t * c.d_model + norm_elems(c, t)) * a  # embedding norm
    if c.norm_position == "pre":
        outside += (t * c.d_model + norm_elems(c, t)) * a
    if c.pooler:
        # tanh output; the pooler's input is a view of the last hidden state, which keeps
        # its whole storage alive (already counted when the MLM head keeps it too)
        outside += (B + (0 if c.mlm_head else t)) * c.d_model * a
    if c.mlm_head:
        # dense input, activation input, norm input (+ stats), decoder input; log-softmax
        outside += (4 * t * c.d_model + norm_elems(c, t)) * a + t * c.vocab_size * FP32
    if c.nsp_head:  # its input is the pooler's tanh output (kept above); its log-softmax
        outside += B * NSP_CLASSES * FP32
    return activation_result(act, fp32, scores, outside, a)


COSTS = Costs(params=_params, flops=_flops, activations=_activations)


def _hook_layout(model: BERT) -> HookLayout:
    inputs = (("embed.token", model.tok_embed), ("embed.segment", model.segment_embed))
    stack = HookStack("", inputs, model.pos_encoding, model.layers, model.final_norm)
    if model.mlm is None:
        return HookLayout((stack,), no_readout="this BERT has no MLM head")
    readout = Readout("", model.layers, model.final_norm, model.mlm, linear=False)
    return HookLayout((stack,), head=model.mlm, readout=readout)


FAMILY = register_family(
    Family(
        name="bert",
        config=BERTConfig,
        model=BERT,
        kind=Kind.ENCODER,
        presets=PRESETS,
        description="BERT encoders, with a pooler, a masked-LM head and a next-sentence head",
        hooks=_hook_layout,
        costs=COSTS,
        example_inputs=token_inputs,
        explorer=ExplorerSpec(),
    )
)
