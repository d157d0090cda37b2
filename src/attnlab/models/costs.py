"""The closed forms a family declares for :mod:`attnlab.analysis`: parameters, FLOPs, memory.

A family's :class:`Costs` (its :attr:`~attnlab.models.family.Family.costs`) gives the analyser
its parameter breakdown, the matrix products of a forward pass, the activations one training
step keeps, and what decoding caches, all from a config alone (a 175B model is analysed without
being built). This module holds the building blocks those closed forms are made of, one per
module of :mod:`attnlab.layers` (linear, norm, attention, FFN, mixture of experts; a stack of
encoder or decoder layers), and the result types; :mod:`attnlab.analysis` documents the
conventions (2·m·k·p FLOPs per product, what autograd keeps) and evaluates a config through its
family's declaration. Tests keep every family's closed forms equal to its built modules and to
``FlopCounterMode``.

Shapes: B batch, T (target) length, S keys (source length for cross-attention), E d_model,
F d_ff, H heads, H_kv kv heads, D head dim, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from attnlab.layers.feedforward import GATED
from attnlab.models.common import check_size, moe_layer_indices

check_length = check_size  # the analysers' name for it


# -- parameters (one closed form per module in attnlab.layers) -----------------------------------


def linear_params(d_in: int, d_out: int, bias: bool = True) -> int:
    """``nn.Linear(d_in, d_out)``."""
    return d_in * d_out + (d_out if bias else 0)


def norm_params(d_model: int, norm: str = "layernorm", bias: bool = True) -> int:
    """LayerNorm or BatchNorm (weight + optional bias) or RMSNorm (weight only)."""
    return d_model * (2 if norm in ("layernorm", "batchnorm") and bias else 1)


def attention_params(
    d_model: int, n_heads: int, n_kv_heads: int | None, bias: bool, qkv_bias: bool | None = None
) -> int:
    """:class:`~attnlab.layers.multihead.MultiHeadAttention`: q, k, v and out projections
    (``qkv_bias``: biases on q/k/v only, ``None``: as ``bias``)."""
    d_head = d_model // n_heads
    kv = (n_kv_heads or n_heads) * d_head
    in_bias = bias if qkv_bias is None else qkv_bias
    return (linear_params(d_model, d_model, in_bias) + 2 * linear_params(d_model, kv, in_bias)
            + linear_params(d_model, d_model, bias))  # fmt: skip


def ffn_params(d_model: int, d_ff: int, activation: str, bias: bool) -> int:
    """:class:`~attnlab.layers.feedforward.FeedForward` (a gate projection for GLU variants)."""
    n_in = 2 if activation in GATED else 1
    return n_in * linear_params(d_model, d_ff, bias) + linear_params(d_ff, d_model, bias)


def expert_params(c: Any) -> int:
    """One routed expert of an MoE layer (an FFN of ``moe_d_ff``, default ``d_ff``)."""
    return ffn_params(c.d_model, c.moe_d_ff or c.d_ff, c.activation, c.bias)


def moe_layer_params(c: Any) -> int:
    """One :class:`~attnlab.layers.moe.MoEFeedForward`: router ``D·E`` + E experts + the
    shared experts (one FFN of ``n_shared · F_s``) + their gate ``D``."""
    total = c.d_model * c.n_experts + c.n_experts * expert_params(c)
    if c.n_shared_experts:
        width = c.n_shared_experts * (c.shared_expert_d_ff or c.moe_d_ff or c.d_ff)
        total += ffn_params(c.d_model, width, c.activation, c.bias)
        total += c.d_model if c.shared_expert_gate else 0
    return total


def ffn_stack_params(c: Any, n_layers: int) -> int:
    """The FFNs of a stack of ``n_layers`` layers: dense ones and MoE ones
    (:func:`~attnlab.models.common.is_moe_layer`)."""
    n_moe = len(moe_layer_indices(c, n_layers)) if getattr(c, "n_experts", 0) else 0
    dense = ffn_params(c.d_model, c.d_ff, c.activation, c.bias)
    return (n_layers - n_moe) * dense + (n_moe * moe_layer_params(c) if n_moe else 0)


def stack_attention_params(c: Any) -> int:
    """One attention block of a stack config (its sizes, GQA and biases; QK-norm's two
    RMSNorm weights of the head dim with ``qk_norm``)."""
    qkv_bias = getattr(c, "qkv_bias", None)
    qk_norm = 2 * c.d_head if getattr(c, "qk_norm", False) else 0
    return attention_params(c.d_model, c.n_heads, c.n_kv_heads, c.bias, qkv_bias) + qk_norm


def layer_params(c: Any, *, cross_attention: bool = False) -> int:
    """One (dense) encoder layer, or decoder layer with ``cross_attention``, from a config's
    sizes."""
    attn = stack_attention_params(c)
    norm = norm_params(c.d_model, c.norm, c.bias)
    n_attn = 2 if cross_attention else 1
    return n_attn * (attn + norm) + ffn_params(c.d_model, c.d_ff, c.activation, c.bias) + norm


LOOKUP_TABLES = ("embedding.token", "embedding.target", "embedding.segment", "embedding.position",
                 "embedding.value")  # fmt: skip


def total_params(breakdown: ParamBreakdown, exclude_embeddings: bool = False) -> int:
    """The breakdown's total, without the lookup tables (:data:`LOOKUP_TABLES`) when
    ``exclude_embeddings``."""
    if not exclude_embeddings:
        return breakdown.total
    return breakdown.total - sum(breakdown.components.get(name, 0) for name in LOOKUP_TABLES)


@dataclass(frozen=True)
class ParamBreakdown:
    """Parameters per component of a model, from its config.

    Attributes:
        components: component name -> parameters, summed over the layers of its stack
            (``"layers.self_attn"`` is all layers' attention). A tied weight is listed once,
            under the table that owns it; the tying module is named in ``tied``.
        n_layers: stack name (``"layers"``, ``"encoder"``, ``"decoder"``) -> its layer count.
        tied: tying component -> owning component (``{"lm_head": "embedding.token"}``).
    """

    components: dict[str, int]
    n_layers: dict[str, int]
    tied: dict[str, str] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """All parameters, tied weights once (equals :func:`count_params`)."""
        return sum(self.components.values())

    def per_layer(self, name: str) -> int:
        """Parameters of one layer of a stack component, e.g. ``per_layer("layers.ffn")``."""
        stack = name.split(".", 1)[0]
        if stack not in self.n_layers or name not in self.components:
            raise ValueError(f"{name!r} is not a per-layer component; valid: {self.layer_names}")
        return self.components[name] // self.n_layers[stack]

    @property
    def layer_names(self) -> list[str]:
        """The components that live inside the layers of a stack."""
        return [n for n in self.components if n.split(".", 1)[0] in self.n_layers]

    def grouped(self) -> dict[str, int]:
        """Totals per kind: embeddings, attention, ffn, norms, head (and conv, for models with
        convolutions)."""
        out = dict.fromkeys(("embeddings", "attention", "ffn", "norms", "head"), 0)
        for name, count in self.components.items():
            group = component_group(name)
            out[group] = out.get(group, 0) + count
        return out


def component_group(name: str) -> str:
    """The kind of a parameter component: embeddings, attention, ffn, norms, conv or head."""
    leaf = name.rsplit(".", 1)[-1]
    if name.startswith("embedding.") and leaf != "norm":
        return "embeddings"
    if leaf.startswith("conv"):
        return "conv"
    if leaf.endswith("attn"):
        return "attention"
    if leaf == "ffn":
        return "ffn"
    if "norm" in leaf:
        return "norms"
    return "head"


def stack_params(
    prefix: str, c: Any, n_layers: int, *, cross_attention: bool = False
) -> dict[str, int]:
    """Attention / FFN / norm parameters of ``n_layers`` layers named ``prefix.*``."""
    attn = stack_attention_params(c)
    norm = norm_params(c.d_model, c.norm, c.bias)
    out = {f"{prefix}.self_attn": n_layers * attn}
    if cross_attention:
        out[f"{prefix}.cross_attn"] = n_layers * attn
    out[f"{prefix}.ffn"] = ffn_stack_params(c, n_layers)
    out[f"{prefix}.norms"] = n_layers * norm * (3 if cross_attention else 2)
    return out


# -- FLOPs of the matrix products ----------------------------------------------------------

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


def stack_terms(
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


# -- activations: what autograd keeps (attnlab.analysis.memory) ------------------------------

FP32 = 4
INDEX_BYTES = 8  # int64 token ids / targets


def norm_elems(c: Any, t: int) -> int:
    """Elements a norm keeps besides its input: LayerNorm mean + rstd, RMSNorm x̂ and 1/rms."""
    return t * c.d_model + t if c.norm == "rmsnorm" else 2 * t


def attention_elems(
    c: Any, *, B: int, T: int, S: int, masked: bool, cross: bool = False
) -> tuple[int, int]:
    """(activation-dtype elements, float32 elements) of one attention sublayer (``cross``:
    cross-attention, whose q and k/v come from two inputs and are projected apart)."""
    E, H = c.d_model, c.n_heads
    t = B * T
    act = 2 * t * E + norm_elems(c, t)  # sublayer input + projection input (+ norm stats)
    act += B * S * E + t * E  # v operand (all heads) + output-projection input
    kv_width = (getattr(c, "n_kv_heads", None) or H) * (E // H)
    if not cross and t >= E + 2 * kv_width:  # the training step's stacked W^Q, W^K, W^V
        act += (E + 2 * kv_width) * E
    fp32 = t * E + B * S * E  # q and k operands of QKᵀ
    fp32 += (3 if masked else 2) * B * H * T * S  # scores, softmax output (+ masked weights)
    return act, fp32


def ffn_elems(c: Any, t: int) -> int:
    if c.activation in GATED:
        hidden = 4
    elif c.activation == "relu":
        hidden = 1
    else:
        hidden = 2
    return 2 * t * c.d_model + norm_elems(c, t) + hidden * t * c.d_ff


def stack_activations(
    c: Any, *, B: int, T: int, n_layers: int, masked: bool, memory_len: int | None = None,
    every: int = 0,
) -> tuple[int, int, int]:  # fmt: skip
    """(activation elements, float32 elements, of which score elements) of a stack; with
    ``every`` k > 0, every k-th block checkpointed (module docstring)."""
    act, fp32 = attention_elems(c, B=B, T=T, S=T, masked=masked)
    scores = (3 if masked else 2) * B * c.n_heads * T * T
    if memory_len is not None:
        a2, f2 = attention_elems(c, B=B, T=T, S=memory_len, masked=masked, cross=True)
        act, fp32 = act + a2, fp32 + f2
        scores += (3 if masked else 2) * B * c.n_heads * T * memory_len
    act += ffn_elems(c, B * T)
    if every <= 0:
        return n_layers * act, n_layers * fp32, n_layers * scores
    kept = n_layers - (n_layers + every - 1) // every  # blocks not checkpointed
    plain = min(kept + 1, n_layers)  # + the one block recomputed at a time
    inputs = (n_layers - kept) * B * T * c.d_model
    return plain * act + inputs, plain * fp32, plain * scores


def activation_result(
    act: int, fp32: int, scores: int, outside: int, a: int, **parts: int
) -> dict[str, int]:
    """The dict :func:`attnlab.analysis.activation_bytes` returns, from element counts of the
    layers (``act`` in the activation dtype of ``a`` bytes, ``fp32`` in at least float32, of
    which ``scores`` are the attention score tensors) and the bytes ``outside`` them."""
    layers = act * a + fp32 * max(a, FP32)
    return {
        "layers": layers,
        "outside_layers": outside,
        "attention_scores": scores * max(a, FP32),
        **parts,
        "total": layers + outside,
    }


# -- the declaration ----------------------------------------------------------------------------


@dataclass(frozen=True)
class KVShape:
    """What a decoder caches per position: ``layers`` self-attention caches of ``width`` =
    H_kv·D keys (and as many values); ``cross``: cross-attention keys/values of the source too."""

    layers: int
    width: int
    cross: bool = False


ParamsFn = Callable[[Any], ParamBreakdown]
FlopsFn = Callable[[Any, int, int, "int | None"], tuple[list[MatmulTerm], int]]


@dataclass(frozen=True)
class Costs:
    """A family's closed forms for :mod:`attnlab.analysis` (``None``: not modelled).

    Attributes:
        params: ``config -> ParamBreakdown``.
        flops: ``(config, B, T, S or None) -> (matmul terms, softmax FLOPs)`` of one forward.
        activations: ``(config, *, batch, seq_len, src_len, a, every) -> dict`` (as
            :func:`activation_result`): what one training step keeps, ``a`` bytes per element,
            activation checkpointing of every ``every``-th block (0: none).
        kv_cache: ``config -> KVShape`` for decoders that cache keys and values.
        state_bytes: ``(config, batch, a) -> bytes`` of a recurrent decoding state.
        decode_flops: ``(config, context) -> FLOPs`` of decoding one token after ``context``.
        elementwise: ``(config, seq_len, batch) -> {name: FLOPs}`` the matmul totals leave out
            that the report names (Mamba's selective scan).
        prefill_bytes: ``(config, batch, prompt_len) -> bytes`` a prefill holds besides the
            logits and one layer's attention scores (Mamba: the scan's tensors).
        default_seq_len: ``config -> length`` the figures use when none is given (``None``: the
            model has no context length; the analysers then need one).
        min_seq_len: the shortest valid length (ViT: [CLS] + one patch); ``min_seq_len_why``
            says why, for the error message.
        notes: ``(config, seq_len) -> lines`` a reader of the figures should know.
        unmeasured: why ``FlopCounterMode`` cannot check the closed form (``None``: it can).
    """

    params: ParamsFn
    flops: FlopsFn | None = None
    activations: Callable[..., dict[str, int]] | None = None
    kv_cache: Callable[[Any], KVShape] | None = None
    state_bytes: Callable[[Any, int, int], int] | None = None
    decode_flops: Callable[[Any, int], int] | None = None
    elementwise: Callable[[Any, int, int], dict[str, int]] | None = None
    prefill_bytes: Callable[[Any, int, int], int] | None = None
    default_seq_len: Callable[[Any], int | None] = field(
        default=lambda c: getattr(c, "max_seq_len", None)
    )
    min_seq_len: int = 1
    min_seq_len_why: str = ""
    notes: Callable[[Any, int], list[str]] | None = None
    unmeasured: str | None = None


__all__ = [
    "ATTENTION_PRODUCTS",
    "FLOP_GROUPS",
    "FP32",
    "INDEX_BYTES",
    "LOOKUP_TABLES",
    "PROJECTIONS",
    "RECURRENT_PROJECTIONS",
    "SOFTMAX_FLOPS_PER_SCORE",
    "Costs",
    "FlopBreakdown",
    "KVShape",
    "MatmulTerm",
    "ParamBreakdown",
    "activation_result",
    "attention_elems",
    "attention_params",
    "attention_terms",
    "check_length",
    "component_group",
    "expert_params",
    "ffn_elems",
    "ffn_params",
    "ffn_stack_params",
    "ffn_stack_terms",
    "ffn_terms",
    "layer_params",
    "linear_params",
    "moe_layer_params",
    "norm_elems",
    "norm_params",
    "stack_activations",
    "stack_attention_params",
    "stack_params",
    "stack_terms",
    "total_params",
]
