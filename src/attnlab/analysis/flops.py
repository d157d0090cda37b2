"""Analytic FLOPs of a forward and backward pass, per component, from a config alone.

Convention: multiplying an ``(m x k)`` by a ``(k x p)`` matrix costs ``2·m·k·p`` FLOPs (a multiply
and an add per term), the convention of ``torch.utils.flop_counter.FlopCounterMode``, Kaplan et
al. and the lesson. Only matrix products (and the ViT patch convolution, a matmul per patch) are
in the totals, so they can be compared with a measured count exactly; the softmax is estimated
and reported separately (:data:`SOFTMAX_FLOPS_PER_SCORE`); norms, activations, residual adds,
bias adds and the score scaling/masking are not counted, as in the measured count.

For one attention block of ``n`` tokens with ``d = d_model`` (no GQA) the terms are the lesson's:
projections ``q, k, v, out`` = ``4 · 2nd²`` = ``8nd²``, scores ``QKᵀ`` = ``2n²d``, weighted sum
``AV`` = ``2n²d``, softmax ``O(n²h)``, whatever the head count ``h``.

Backward: each product costs two products of the same size (the gradients of both operands), so
twice the forward, except where an operand needs no gradient (the images entering ViT's patch
projection: only the weight gradient, once the forward).

Mixture-of-experts FFNs (:func:`ffn_stack_terms`): the router, and the k chosen experts per
token (the *active* FLOPs; dropless dispatch runs exactly the ``N·k`` assignments).

The causal mask does not halve the attention terms here: attnlab's math path (like SDPA's math
fallback) computes every score and masks afterwards.

Shapes: B batch, T query (target) length, S key (source) length, E d_model, H heads, H_kv kv
heads, D head dim, F d_ff, V vocabulary, P patches, K classes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnlab.layers.feedforward import GATED
from attnlab.models.bert import BERTConfig
from attnlab.models.common import moe_layer_indices
from attnlab.models.gpt import GPTConfig
from attnlab.models.transformer import TransformerConfig
from attnlab.models.vit import ViTConfig

# max, subtract, exp, sum, divide per score; a convention (an exp is many instructions).
SOFTMAX_FLOPS_PER_SCORE = 5

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")
# the linear maps of the recurrent layers, by parent module: Mamba's mixer, the LSTM/GRU
RECURRENT_PROJECTIONS = {"mixer": ("in_proj", "x_proj", "dt_proj"), "rnn": ("input", "hidden")}
ATTENTION_PRODUCTS = ("scores", "weighted_sum")
FLOP_GROUPS = ("projections", "attention", "ffn", "other")


@dataclass(frozen=True)
class MatmulTerm:
    """``count`` products of an ``(m x k)`` by a ``(k x p)`` matrix, named like the module.

    ``name`` is a component path summed over a stack's layers (``"layers.self_attn.q_proj"`` is
    the q projection of every layer). ``weight_grad_only``: the input needs no gradient, so the
    backward computes the weight gradient alone.
    """

    name: str
    m: int
    k: int
    p: int
    count: int = 1
    weight_grad_only: bool = False

    @property
    def flops(self) -> int:
        """Forward FLOPs, ``2·m·k·p·count``."""
        return 2 * self.m * self.k * self.p * self.count

    @property
    def backward_flops(self) -> int:
        """Backward FLOPs: 2x the forward (1x with ``weight_grad_only``)."""
        return self.flops * (1 if self.weight_grad_only else 2)

    @property
    def group(self) -> str:
        """``"projections"``, ``"attention"``, ``"ffn"`` or ``"other"`` (embeddings, heads;
        Mamba's convolution and read-out)."""
        parts = self.name.split(".")
        if parts[-1] in PROJECTIONS:
            return "projections"
        if len(parts) > 1 and parts[-1] in RECURRENT_PROJECTIONS.get(parts[-2], ()):
            return "projections"
        if parts[-1] in ATTENTION_PRODUCTS:
            return "attention"
        if len(parts) > 1 and parts[-2] == "ffn":
            return "ffn"
        return "other"


@dataclass(frozen=True)
class FlopBreakdown:
    """The matmul terms of one forward pass, plus the separately reported softmax.

    Attributes:
        terms: every matrix product, per component.
        softmax: estimated softmax FLOPs of the forward (not in ``forward``).
        batch, seq_len: B and the (target) length T. src_len: S for encoder-decoders.
        tokens: positions the step processes for the per-token and 6·N·tokens figures
            (``B·T``; target tokens for encoder-decoders, ``B·(P + 1)`` for ViT).
    """

    terms: tuple[MatmulTerm, ...]
    softmax: int
    batch: int
    seq_len: int
    src_len: int | None
    tokens: int

    @property
    def forward(self) -> int:
        """Forward matmul FLOPs (what ``FlopCounterMode`` counts)."""
        return sum(t.flops for t in self.terms)

    @property
    def backward(self) -> int:
        """Backward matmul FLOPs."""
        return sum(t.backward_flops for t in self.terms)

    @property
    def training(self) -> int:
        """Forward + backward matmul FLOPs of one training step (no recomputation)."""
        return self.forward + self.backward

    @property
    def forward_per_token(self) -> float:
        return self.forward / self.tokens

    @property
    def training_per_token(self) -> float:
        return self.training / self.tokens

    def by_component(self, *, backward: bool = False) -> dict[str, int]:
        """Component path -> forward (or backward) FLOPs, in model order."""
        out: dict[str, int] = {}
        for t in self.terms:
            out[t.name] = out.get(t.name, 0) + (t.backward_flops if backward else t.flops)
        return out

    def grouped(self) -> dict[str, int]:
        """Forward FLOPs per group: projections, attention (scores + AV), ffn, other."""
        out = dict.fromkeys(FLOP_GROUPS, 0)
        for t in self.terms:
            out[t.group] += t.flops
        return out

    def shares(self) -> dict[str, float]:
        """Each group's fraction of the forward matmul FLOPs."""
        total = self.forward
        return {k: v / total for k, v in self.grouped().items()}


# -- validation ------------------------------------------------------------------------------------


def check_length(name: str, value: object) -> int:
    """A positive integer length/size, or ``ValueError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


# -- building blocks -----------------------------------------------------------------------------


def attention_terms(
    prefix: str,
    *,
    batch: int,
    q_len: int,
    kv_len: int,
    d_model: int,
    n_heads: int,
    n_kv_heads: int | None = None,
    count: int = 1,
    kv_input_len: int | None = None,
) -> tuple[list[MatmulTerm], int]:
    """The products of ``count`` multi-head attention blocks, and their softmax FLOPs.

    Args:
        prefix: component path, e.g. ``"layers.self_attn"``.
        q_len: T queries. kv_len: S keys attended to. kv_input_len: tokens whose keys and
            values are projected (default ``kv_len``; fewer with a KV cache).
        n_kv_heads: H_kv (grouped-query attention shrinks the k/v projections only: the
            scores and the weighted sum run over all H query heads).
    """
    B, T, S, E, H = batch, q_len, kv_len, d_model, n_heads
    D = E // H
    kv = (n_kv_heads or H) * D
    S_in = S if kv_input_len is None else kv_input_len
    terms = [
        MatmulTerm(f"{prefix}.q_proj", B * T, E, H * D, count),
        MatmulTerm(f"{prefix}.k_proj", B * S_in, E, kv, count),
        MatmulTerm(f"{prefix}.v_proj", B * S_in, E, kv, count),
        MatmulTerm(f"{prefix}.scores", T, D, S, count * B * H),  # Q Kᵀ
        MatmulTerm(f"{prefix}.weighted_sum", T, S, D, count * B * H),  # softmax(·) V
        MatmulTerm(f"{prefix}.out_proj", B * T, H * D, E, count),
    ]
    return terms, SOFTMAX_FLOPS_PER_SCORE * count * B * H * T * S


def ffn_terms(
    prefix: str, *, tokens: int, d_model: int, d_ff: int, activation: str, count: int = 1
) -> list[MatmulTerm]:
    """The products of ``count`` FFNs on ``tokens`` positions (a third one when gated)."""
    terms = [MatmulTerm(f"{prefix}.up_proj", tokens, d_model, d_ff, count)]
    if activation in GATED:
        terms.append(MatmulTerm(f"{prefix}.gate_proj", tokens, d_model, d_ff, count))
    terms.append(MatmulTerm(f"{prefix}.down_proj", tokens, d_ff, d_model, count))
    return terms


def _stack_terms(
    prefix: str, c: Any, *, batch: int, n: int, n_layers: int, memory_len: int | None = None
) -> tuple[list[MatmulTerm], int]:
    """Self-attention (+ cross-attention to ``memory_len`` positions) + FFN of a stack."""
    kw = dict(d_model=c.d_model, n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, count=n_layers)
    terms, softmax = attention_terms(f"{prefix}.self_attn", batch=batch, q_len=n, kv_len=n, **kw)
    if memory_len is not None:
        cross, cross_softmax = attention_terms(
            f"{prefix}.cross_attn", batch=batch, q_len=n, kv_len=memory_len, **kw
        )
        terms += cross
        softmax += cross_softmax
    terms += ffn_stack_terms(f"{prefix}.ffn", c, tokens=batch * n, n_layers=n_layers)
    return terms, softmax


def ffn_stack_terms(prefix: str, c: Any, *, tokens: int, n_layers: int) -> list[MatmulTerm]:
    """The FFN products of a stack: dense layers on the N = ``tokens`` rows; each MoE layer's
    router ``(N x E)·(E x n_experts)``, its experts on the ``N·top_k`` (token, slot) rows that
    dropless dispatch runs (a capacity factor drops some: then this is an upper bound), its
    shared experts on N rows and their gate ``(N x E)·(E x 1)``."""
    moe = moe_layer_indices(c, n_layers) if getattr(c, "n_experts", 0) else ()
    kw: dict[str, Any] = dict(d_model=c.d_model, activation=c.activation)
    terms = []
    if n_layers > len(moe):
        terms += ffn_terms(prefix, tokens=tokens, d_ff=c.d_ff, count=n_layers - len(moe), **kw)
    if not moe:
        return terms
    n_moe, width = len(moe), c.moe_d_ff or c.d_ff
    terms.append(MatmulTerm(f"{prefix}.router", tokens, c.d_model, c.n_experts, n_moe))
    terms += ffn_terms(prefix, tokens=tokens * c.top_k, d_ff=width, count=n_moe, **kw)
    if c.n_shared_experts:
        shared = c.n_shared_experts * (c.shared_expert_d_ff or width)
        for t in ffn_terms(prefix, tokens=tokens, d_ff=shared, count=n_moe, **kw):
            leaf = t.name.rsplit(".", 1)[-1]
            terms.append(MatmulTerm(f"{prefix}.shared_{leaf}", t.m, t.k, t.p, t.count))
        if c.shared_expert_gate:
            terms.append(MatmulTerm(f"{prefix}.shared_expert_gate", tokens, c.d_model, 1, n_moe))
    return terms


# -- whole models --------------------------------------------------------------------------------


def _gpt_terms(c: GPTConfig, B: int, n: int, src: int | None) -> tuple[list[MatmulTerm], int]:
    terms, softmax = _stack_terms("layers", c, batch=B, n=n, n_layers=c.n_layers)
    terms.append(MatmulTerm("lm_head", B * n, c.d_model, c.vocab_size))
    return terms, softmax


def _bert_terms(c: BERTConfig, B: int, n: int, src: int | None) -> tuple[list[MatmulTerm], int]:
    terms, softmax = _stack_terms("layers", c, batch=B, n=n, n_layers=c.n_layers)
    if c.pooler:
        terms.append(MatmulTerm("pooler", B, c.d_model, c.d_model))  # [CLS] only
    if c.mlm_head:
        terms.append(MatmulTerm("mlm.dense", B * n, c.d_model, c.d_model))
        terms.append(MatmulTerm("mlm.decoder", B * n, c.d_model, c.vocab_size))
    return terms, softmax


def _vit_terms(c: ViTConfig, B: int, n: int, src: int | None) -> tuple[list[MatmulTerm], int]:
    # The patch projection is a matmul per patch: (C·p·p) inputs -> E; images need no gradient.
    patch_in = c.in_channels * c.patch_size**2
    terms = [MatmulTerm("patch_embed.proj", B * (n - 1), patch_in, c.d_model, 1, True)]
    stack, softmax = _stack_terms("layers", c, batch=B, n=n, n_layers=c.n_layers)
    terms += stack
    if getattr(c, "pooler", False):
        terms.append(MatmulTerm("pooler", B, c.d_model, c.d_model))  # on the pooled vector
    if c.n_classes:
        terms.append(MatmulTerm("head", B, c.d_model, c.n_classes))
    return terms, softmax


def _transformer_terms(
    c: TransformerConfig, B: int, n: int, src: int | None
) -> tuple[list[MatmulTerm], int]:
    S = n if src is None else src
    terms, softmax = _stack_terms("encoder", c, batch=B, n=S, n_layers=c.n_layers)
    dec, dec_softmax = _stack_terms(
        "decoder", c, batch=B, n=n, n_layers=c.num_decoder_layers, memory_len=S
    )
    terms.append(MatmulTerm("lm_head", B * n, c.d_model, c.target_vocab_size))
    terms[-1:-1] = dec  # keep model order: encoder, decoder, head
    return terms, softmax + dec_softmax


TermBuilder = Callable[[Any, int, int, "int | None"], tuple[list[MatmulTerm], int]]
FLOP_FORMULAS: dict[type[Any], TermBuilder] = {
    GPTConfig: _gpt_terms,
    BERTConfig: _bert_terms,
    ViTConfig: _vit_terms,
    TransformerConfig: _transformer_terms,
}


def default_seq_len(config: Any) -> int:
    """The natural length of a config: ``max_seq_len`` (ViT: its patches + [CLS])."""
    flop_formula(config)
    if getattr(config, "max_seq_len", None) is None:  # recurrent models have no context length
        raise ValueError(f"{type(config).__name__} has no max_seq_len: pass seq_len")
    return int(config.max_seq_len)


def flop_formula(config: Any) -> TermBuilder:
    """The term builder registered for ``config``'s class (``ValueError`` if none)."""
    fn = FLOP_FORMULAS.get(type(config))
    if fn is None:
        valid = ", ".join(cls.__name__ for cls in FLOP_FORMULAS)
        raise ValueError(
            f"no FLOP formula for {type(config).__name__}; valid config types: {valid}"
        )
    return fn


def forward_flops(
    config: Any, seq_len: int | None = None, *, batch: int = 1, src_len: int | None = None
) -> FlopBreakdown:
    """Matmul FLOPs of one forward pass of the model ``config`` describes, per component.

    Args:
        config: a model config (GPT, BERT, ViT, encoder-decoder Transformer).
        seq_len: T tokens per sequence (the target length for encoder-decoders); default the
            config's ``max_seq_len`` (ViT: patches + 1; another value means ``seq_len - 1``
            patches, i.e. another image size).
        batch: B sequences.
        src_len: S source tokens of an encoder-decoder (default ``seq_len``).

    Raises:
        ValueError: for non-positive lengths, ``src_len`` on a model without an encoder, a ViT
            length below 2, or an unknown config type.
    """
    build = flop_formula(config)
    n = default_seq_len(config) if seq_len is None else check_length("seq_len", seq_len)
    check_length("batch", batch)
    if src_len is not None:
        check_length("src_len", src_len)
        if not isinstance(config, TransformerConfig):
            raise ValueError(
                f"src_len applies to encoder-decoder models, not {type(config).__name__}"
            )
    if isinstance(config, ViTConfig) and n < 2:
        raise ValueError(f"a ViT sequence is [CLS] + at least one patch; got seq_len={n}")
    terms, softmax = build(config, batch, n, src_len)
    return FlopBreakdown(tuple(terms), softmax, batch, n, src_len, batch * n)


def attention_block_flops(
    seq_len: int,
    d_model: int,
    n_heads: int,
    *,
    n_kv_heads: int | None = None,
    kv_len: int | None = None,
    batch: int = 1,
) -> FlopBreakdown:
    """One :class:`~attnlab.layers.multihead.MultiHeadAttention` forward (no bias FLOPs).

    Without GQA and with ``kv_len = seq_len = n``: ``8·n·d² + 4·n²·d``, independent of the heads.

    Raises:
        ValueError: for non-positive sizes or heads that do not divide ``d_model``.
    """
    for name, v in (("seq_len", seq_len), ("d_model", d_model), ("n_heads", n_heads)):
        check_length(name, v)
    check_length("batch", batch)
    if d_model % n_heads:
        raise ValueError(f"n_heads={n_heads} does not divide d_model={d_model}")
    if n_kv_heads is not None and n_heads % check_length("n_kv_heads", n_kv_heads):
        raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
    S = seq_len if kv_len is None else check_length("kv_len", kv_len)
    terms, softmax = attention_terms(
        "attn",
        batch=batch,
        q_len=seq_len,
        kv_len=S,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
    )
    return FlopBreakdown(tuple(terms), softmax, batch, seq_len, None, batch * seq_len)


__all__ = [
    "FLOP_FORMULAS",
    "FLOP_GROUPS",
    "SOFTMAX_FLOPS_PER_SCORE",
    "FlopBreakdown",
    "MatmulTerm",
    "attention_block_flops",
    "attention_terms",
    "check_length",
    "default_seq_len",
    "ffn_stack_terms",
    "ffn_terms",
    "flop_formula",
    "forward_flops",
]
