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

The terms of a whole model are what its family declares (:attr:`~attnlab.models.costs.Costs.
flops`), built from the blocks of :mod:`attnlab.models.costs` (re-exported here).

The causal mask does not halve the attention terms here: attnlab's math path (like SDPA's math
fallback) computes every score and masks afterwards.

Shapes: B batch, T query (target) length, S key (source) length, E d_model, H heads, H_kv kv
heads, D head dim, F d_ff, V vocabulary, P patches, K classes.
"""

from __future__ import annotations

import warnings
from typing import Any

from attnlab.analysis.params import family_costs
from attnlab.models.costs import (
    ATTENTION_PRODUCTS,
    FLOP_GROUPS,
    PROJECTIONS,
    RECURRENT_PROJECTIONS,
    SOFTMAX_FLOPS_PER_SCORE,
    FlopBreakdown,
    FlopsFn,
    MatmulTerm,
    attention_terms,
    check_length,
    ffn_stack_terms,
    ffn_terms,
)
from attnlab.models.family import Kind, families, find_family

TermBuilder = FlopsFn


def flop_formula(config: Any) -> TermBuilder:
    """The term builder ``config``'s family declares (``ValueError`` if none)."""
    family = None if isinstance(config, type) else find_family(config)
    fn = family.costs.flops if family is not None and family.costs is not None else None
    if fn is None:
        valid = ", ".join(
            f.config.__name__ for f in families() if f.costs is not None and f.costs.flops
        )
        raise ValueError(
            f"no FLOP formula for {type(config).__name__}; valid config types: {valid}"
        )
    return fn


def default_seq_len(config: Any) -> int:
    """The natural length of a config: ``max_seq_len`` (ViT: its patches + [CLS]).

    Raises:
        ValueError: for a config without a FLOP formula, or one with no context length (a
            recurrent model: pass ``seq_len``).
    """
    flop_formula(config)
    n = family_costs(config, "FLOP formula").default_seq_len(config)
    if n is None:  # recurrent models have no context length
        raise ValueError(f"{type(config).__name__} has no max_seq_len: pass seq_len")
    return int(n)


def forward_flops(
    config: Any, seq_len: int | None = None, *, batch: int = 1, src_len: int | None = None
) -> FlopBreakdown:
    """Matmul FLOPs of one forward pass of the model ``config`` describes, per component.

    Args:
        config: a model config whose family declares a FLOP formula (GPT, BERT, ViT,
            encoder-decoder Transformer, Mamba, LSTM/GRU).
        seq_len: T tokens per sequence (the target length for encoder-decoders); default the
            config's ``max_seq_len`` (ViT: patches + 1; another value means ``seq_len - 1``
            patches, i.e. another image size).
        batch: B sequences.
        src_len: S source tokens of an encoder-decoder (default ``seq_len``).

    Raises:
        ValueError: for non-positive lengths, ``src_len`` on a model without an encoder, a
            length below the family's shortest (ViT: 2), or an unknown config type.
    """
    build = flop_formula(config)
    costs = family_costs(config, "FLOP formula")
    n = default_seq_len(config) if seq_len is None else check_length("seq_len", seq_len)
    check_length("batch", batch)
    if src_len is not None:
        check_length("src_len", src_len)
        family = find_family(config)
        if family is None or family.kind is not Kind.SEQ2SEQ:
            raise ValueError(
                f"src_len applies to encoder-decoder models, not {type(config).__name__}"
            )
    if n < costs.min_seq_len:
        why = costs.min_seq_len_why or f"{type(config).__name__} needs {costs.min_seq_len}"
        raise ValueError(f"{why}; got seq_len={n}")
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


def __getattr__(name: str) -> Any:
    """``FLOP_FORMULAS``: a deprecated view (config class -> term builder) of what the families
    declare (:attr:`attnlab.models.family.Family.costs`)."""
    if name == "FLOP_FORMULAS":
        warnings.warn(
            "attnlab.analysis.flops.FLOP_FORMULAS is deprecated: each family declares its "
            "closed forms (attnlab.models.family.Family.costs); use flop_formula(config)",
            DeprecationWarning,
            stacklevel=2,
        )
        return {
            f.config: f.costs.flops
            for f in families()
            if f.costs is not None and f.costs.flops is not None
        }
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ATTENTION_PRODUCTS",
    "FLOP_GROUPS",
    "PROJECTIONS",
    "RECURRENT_PROJECTIONS",
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
