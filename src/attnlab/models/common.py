"""What every Transformer stack shares: :class:`StackConfig` and the builders of its layers.

:class:`StackConfig` holds the fields every family has (``d_model, n_heads, n_kv_heads, n_layers,
d_ff, dropout, attn_dropout, norm, norm_eps, norm_position, final_norm, activation, attn_backend,
attn_window, attn_options, attn_layer_backends, bias, qk_norm``), validates them once (types
from the annotations, see :mod:`attnlab.config`; then ranges and the registries' choices) and
derives ``d_head`` and the final-norm rule. Each model file's config derives from it, changes
defaults and adds its own fields; it is the only place a model reads its config.

The builders turn a config into layers: :func:`attention` (the backend of each layer, with its
window and its options), :func:`feed_forward`, :func:`norm`, and the blocks :func:`encoder_layer` /
:func:`decoder_layer`, which are assembled from those parts.

Mixture-of-Experts (issue 23) is a field group of every stack (``n_experts``, ``top_k``,
``moe_every``, ...): :func:`feed_forward` builds a
:class:`~attnlab.layers.moe.MoEFeedForward` for the layers :func:`is_moe_layer` names and the
dense FFN elsewhere. An encoder-decoder applies the same rule to both stacks (layer ``i`` of
the encoder and layer ``i`` of the decoder).

``qk_norm`` (default off) gives every attention, self and cross, QK-norm: an RMSNorm over the
head dimension of q and k, after the projections and before RoPE (Dehghani et al. 2023, §2.1;
Wortsman et al. 2023; OLMo 2, Qwen3 and the modded-nanogpt speedrun), with a learned weight of
size D per norm (Qwen3's form; the speedrun's norm has no weight, which equals this one at init).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import Config, check_choice, check_positive, check_probability
from attnlab.layers.attention_backends import (
    ATTENTION_BACKEND_FACTORIES,
    ATTENTION_BACKENDS,
    AttentionBackend,
    get_attention_backend,
)
from attnlab.layers.blocks import DecoderLayer, EncoderLayer
from attnlab.layers.feedforward import FeedForward, activation_names
from attnlab.layers.moe import MoEFeedForward
from attnlab.layers.multihead import MultiHeadAttention
from attnlab.layers.norm import NORMS, RMSNorm, build_norm
from attnlab.layers.positional import POSITIONAL_ENCODINGS, PositionalEncoding

_OPTIONAL_POSITIVE = ("vocab_size", "max_seq_len", "init_std")


@dataclass(frozen=True, kw_only=True)
class StackConfig(Config):
    """The fields of every Transformer stack (defaults: the paper's base model, Table 3)."""

    d_model: int = 512
    n_heads: int = 8
    n_kv_heads: int | None = None  # None: n_heads (multi-head); fewer: grouped-query attention
    n_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1  # embedding and residual dropout (§5.4)
    attn_dropout: float | None = None  # on the attention weights; None: same as dropout
    norm: Literal["layernorm", "rmsnorm", "batchnorm"] = "layernorm"  # batchnorm: comparison
    norm_eps: float = 1e-5
    norm_position: Literal["pre", "post"] = "post"
    final_norm: bool | None = None  # a norm after the last layer; None: only with pre-norm
    activation: str = "relu"
    attn_backend: str = "sdpa"
    attn_window: int | None = None  # keys per query of the "sliding_window" backend
    # options of the configurable backends, by backend name: {"bigbird": {"block": 16}}
    attn_options: dict[str, dict[str, Any]] | None = None
    attn_layer_backends: tuple[str, ...] | None = None  # per-layer override of attn_backend
    bias: bool = True  # biases in the linears and LayerNorms
    qkv_bias: bool | None = None  # biases on q/k/v only; None: same as bias (Qwen2: True)
    qk_norm: bool = False  # RMSNorm over the head dim of q and k, before RoPE (QK-norm)
    # -- Mixture-of-Experts FFNs (layers/moe.py, issue 23; validated in _validate_moe) ---------
    n_experts: int = 0  # routed experts per MoE layer; 0: every FFN is dense
    top_k: int = 2  # experts per token
    moe_every: int | tuple[int, ...] = 1  # n: layers i with (i+1) % n == 0; or layer indices
    moe_d_ff: int | None = None  # each expert's hidden width; None: d_ff (dense layers keep d_ff)
    moe_routing: Literal["topk_softmax", "softmax_topk"] = "topk_softmax"  # Mixtral / Switch
    norm_topk_prob: bool = True  # softmax_topk: renormalise the k chosen weights
    capacity_factor: float | None = None  # None: dropless; else ceil(f·N·k/E) per expert
    aux_loss_weight: float = 0.01  # Switch load-balancing loss weight (per MoE layer, summed)
    z_loss_weight: float = 0.0  # ST-MoE router z-loss weight
    n_shared_experts: int = 0  # always-on experts (DeepSeek-MoE / Qwen2-MoE)
    shared_expert_d_ff: int | None = None  # each shared expert's width; None: the expert width
    shared_expert_gate: bool = False  # sigmoid gate on the shared experts (Qwen2-MoE)
    router_bias_balancing: bool = False  # DeepSeek-V3 aux-loss-free selection bias
    router_bias_rate: float = 1e-3  # its update speed per optimizer step (DeepSeek-V3: 1e-3)
    # -- end of the MoE fields ------------------------------------------------------------------

    def validate(self) -> None:
        """Sizes, probabilities and the registries' choices.

        Raises:
            ValueError: naming the bad value and, for closed choices, the valid ones.
        """
        super().validate()
        check_positive(
            d_model=self.d_model, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads,
            n_layers=self.n_layers, d_ff=self.d_ff, norm_eps=self.norm_eps,
        )  # fmt: skip
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"n_heads={self.n_heads} does not divide d_model={self.d_model}")
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads != 0:
            raise ValueError(
                f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}"
            )
        # sizes some families have (ViT's max_seq_len is derived, and positive by construction)
        check_positive(**{n: getattr(self, n) for n in _OPTIONAL_POSITIVE if hasattr(self, n)})
        check_probability(dropout=self.dropout, attn_dropout=self.attn_dropout)
        check_choice("norm", self.norm, NORMS.keys())
        check_choice("activation", self.activation, activation_names())
        pos_encoding = getattr(self, "pos_encoding", None)
        if pos_encoding is not None:
            self._validate_positions(pos_encoding)
        self._validate_backends()
        self._validate_moe()

    def _validate_moe(self) -> None:
        """Ranges of the MoE fields (their types are checked from the annotations)."""
        check_positive(top_k=self.top_k, moe_d_ff=self.moe_d_ff,
                       shared_expert_d_ff=self.shared_expert_d_ff,
                       capacity_factor=self.capacity_factor)  # fmt: skip
        for name in ("n_experts", "n_shared_experts", "aux_loss_weight", "z_loss_weight",
                     "router_bias_rate"):  # fmt: skip
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.n_experts and not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k={self.top_k} must be in [1, n_experts={self.n_experts}]")
        if self.shared_expert_gate and not self.n_shared_experts:
            raise ValueError("shared_expert_gate=True needs n_shared_experts >= 1")
        every = self.moe_every
        if isinstance(every, int):
            if every < 1:
                raise ValueError(
                    f"moe_every must be >= 1 (every n-th layer) or layer indices, got {every}"
                )
            return
        depth = max(self.n_layers, getattr(self, "num_decoder_layers", 0))
        if not every or len(set(every)) != len(every) or not all(0 <= i < depth for i in every):
            raise ValueError(
                f"moe_every={list(every)} must list distinct layer indices in [0, {depth})"
            )

    def _validate_backends(self) -> None:
        check_choice("attn_backend", self.attn_backend, ATTENTION_BACKENDS.keys())
        per_layer = self.attn_layer_backends
        if per_layer is not None:
            if len(per_layer) != self.n_layers:
                raise ValueError(
                    f"attn_layer_backends has {len(per_layer)} entries; expected one per layer "
                    f"(n_layers={self.n_layers})"
                )
            for name in per_layer:
                check_choice("attn_layer_backends entry", name, ATTENTION_BACKENDS.keys())
        names = set(per_layer or ()) | {self.attn_backend}
        if self.attn_window is not None:
            if self.attn_window < 1:
                raise ValueError(f"attn_window must be a positive integer, got {self.attn_window}")
            if "sliding_window" not in names:
                raise ValueError(
                    f"attn_window={self.attn_window} needs the 'sliding_window' backend, "
                    f"but the model uses {sorted(names)}"
                )
        for name, options in (self.attn_options or {}).items():
            check_choice("attn_options key", name, ATTENTION_BACKEND_FACTORIES.keys())
            if name not in names:
                raise ValueError(
                    f"attn_options has options for {name!r}, but the model uses {sorted(names)}"
                )
            if name == "sliding_window" and "window" in options and self.attn_window is not None:
                raise ValueError(
                    "attn_window and attn_options['sliding_window']['window'] both set the "
                    "window; give one"
                )
            configured_backend(self, name)  # built once: the backend checks its own options

    def _validate_positions(self, pos_encoding: str) -> None:
        """Checks of a ``pos_encoding`` field (and of RoPE's fields, where the config has them)."""
        check_choice("pos_encoding", pos_encoding, POSITIONAL_ENCODINGS.keys())
        if pos_encoding == "rope" and self.d_head % 2:
            raise ValueError(f"rope needs an even head dim, got d_head={self.d_head}")
        check_positive(rope_base=getattr(self, "rope_base", None))
        if getattr(self, "rope_factor", 1.0) < 1.0:
            raise ValueError(f"rope_factor must be >= 1, got {getattr(self, 'rope_factor', 1.0)}")

    @property
    def d_head(self) -> int:
        """Per-head dimension d_k = d_v = d_model / n_heads."""
        return self.d_model // self.n_heads

    @property
    def use_final_norm(self) -> bool:
        """Whether the stack ends with a norm (``final_norm``, default: only with pre-norm)."""
        return self.norm_position == "pre" if self.final_norm is None else self.final_norm


def check_token_ids(config: object, names: tuple[str, ...], vocab_size: int) -> None:
    """Raise ``ValueError`` for a special token id of ``config`` outside ``[0, vocab_size)``."""
    for name in names:
        tok = getattr(config, name)
        if tok is not None and not 0 <= tok < vocab_size:
            raise ValueError(f"{name}={tok} is outside the vocabulary [0, {vocab_size})")


def check_pair_batch(src: Tensor, tgt: Tensor) -> None:
    """Raise ``ValueError`` when the ``(B, S)`` source and the ``(B, T)`` target ids of an
    encoder-decoder hold different numbers of sequences (other shapes: the embedding's check)."""
    if src.dim() == tgt.dim() == 2 and src.shape[0] != tgt.shape[0]:
        raise ValueError(
            f"src and tgt batch sizes differ: {tuple(src.shape)} and {tuple(tgt.shape)}"
        )


class Seq2SeqVocabulary:
    """What the encoder-decoder families' configs share about their vocabularies: one
    (``tgt_vocab_size=None``) or two, and ``share_embeddings`` needing one. A mixin of their
    dataclasses; the fields are theirs."""

    vocab_size: int
    tgt_vocab_size: int | None
    share_embeddings: bool

    @property
    def target_vocab_size(self) -> int:
        """The target vocabulary (the shared one unless ``tgt_vocab_size`` is set)."""
        return self.tgt_vocab_size or self.vocab_size

    def check_vocabularies(self) -> None:
        """Raise ``ValueError`` for ``share_embeddings`` with two vocabularies, or a special
        token id (``pad_id``, ``bos_id``, ``eos_id``) outside either vocabulary."""
        if self.share_embeddings and self.tgt_vocab_size not in (None, self.vocab_size):
            raise ValueError(
                f"share_embeddings needs one vocabulary, but vocab_size={self.vocab_size} and "
                f"tgt_vocab_size={self.tgt_vocab_size}"
            )
        vocab = min(self.vocab_size, self.target_vocab_size)
        check_token_ids(self, ("pad_id", "bos_id", "eos_id"), vocab)


# -- builders ------------------------------------------------------------------------------------


def token_loss(
    logits: Tensor, targets: Tensor, like: Tensor, *, ignore_index: int, name: str = "ids"
) -> Tensor:
    """Mean cross-entropy of ``logits`` ``(B, T, V)`` against ``targets`` ``(B, T)`` (shaped
    like ``like``, the model's ``name`` input), positions at ``ignore_index`` skipped; in
    float32 whatever the logits' dtype.

    Raises:
        ValueError: for targets of another shape, a non-integer dtype, or ids outside
            ``[0, V)`` other than ``ignore_index``.
    """
    if targets.shape != like.shape:
        raise ValueError(
            f"targets must match {name} {tuple(like.shape)}, got {tuple(targets.shape)}"
        )
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        raise ValueError(f"targets must be integer token ids, got dtype {targets.dtype}")
    V = logits.shape[-1]
    # reading the ids would break the graph when compiled: there an assertion inside the graph
    # stands in (a RuntimeError without the value) and the ids are clamped so that the loss
    # kernel never reads out of bounds before it reports (its own index check can abort the
    # process), as for the embedding's ids
    if targets.numel() and targets.device.type != "meta" and torch.compiler.is_compiling():
        ignored = targets == ignore_index
        inside = ignored | ((targets >= 0) & (targets < V))
        torch._assert_async(
            inside.all(), f"a target id is outside the vocabulary [0, {V}) (and not {ignore_index})"
        )
        targets = torch.where(ignored, targets, targets.clamp(0, V - 1))
    elif targets.numel() and targets.device.type != "meta":
        # one pass: ignored entries read as 0 (inside the range whatever ignore_index is)
        lo, hi = (int(t) for t in torch.aminmax(targets.masked_fill(targets == ignore_index, 0)))
        if lo < 0 or hi >= V:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"target id {bad} is outside the vocabulary [0, {V}) (and is not the ignored "
                f"id {ignore_index})"
            )
    return F.cross_entropy(
        logits.flatten(0, 1).float(), targets.flatten(), ignore_index=ignore_index
    )


def configured_backend(c: StackConfig, name: str) -> AttentionBackend:
    """The backend ``name`` built with the options ``c`` gives it (``attn_options[name]``, and
    ``attn_window`` for ``"sliding_window"``); the registered default when it has none.

    Raises:
        ValueError: for an option the backend does not take, or a value it refuses (naming
            the backend and the option).
    """
    options = dict((c.attn_options or {}).get(name, {}))
    if name == "sliding_window" and c.attn_window:
        options["window"] = c.attn_window
    if not options:
        return get_attention_backend(name)
    try:
        return get_attention_backend(name, **options)
    except TypeError as e:
        factory = ATTENTION_BACKEND_FACTORIES.get(name)
        valid = [p for p in inspect.signature(factory).parameters if not p.startswith("_")]
        bad = sorted(set(options) - set(valid))
        if not bad:
            raise ValueError(f"attn_options[{name!r}]: {e}") from None
        raise ValueError(
            f"attn_options[{name!r}]: unknown option(s) {bad}; {name!r} takes {valid}"
        ) from None
    except ValueError as e:
        raise ValueError(f"attn_options[{name!r}]: {e}") from None


def layer_backend(c: StackConfig, layer: int) -> AttentionBackend:
    """The attention backend of layer ``layer`` (per-layer override, with its options)."""
    name = c.attn_backend if c.attn_layer_backends is None else c.attn_layer_backends[layer]
    return configured_backend(c, name)


def layer_window(c: StackConfig, layer: int) -> int | None:
    """The causal window a KV cache of layer ``layer`` may keep, or ``None`` to keep everything.

    Only a sliding-window layer without global tokens can drop old keys (global tokens are
    attended by every later query).
    """
    backend = layer_backend(c, layer)
    window = getattr(backend, "window", None)
    if window is None or len(getattr(backend, "global_tokens", ())):
        return None
    return int(window)


def attention(
    c: StackConfig,
    layer: int,
    rotary: PositionalEncoding | None = None,
    *,
    value_embed: bool = False,
) -> MultiHeadAttention:
    """The (self- or cross-) attention of layer ``layer``; ``rotary`` for RoPE self-attention,
    QK-norm with ``c.qk_norm``, ``value_embed`` for a layer that mixes in value embeddings."""
    qk = (RMSNorm(c.d_head, eps=c.norm_eps), RMSNorm(c.d_head, eps=c.norm_eps)) if c.qk_norm else ()
    return MultiHeadAttention(
        c.d_model,
        c.n_heads,
        n_kv_heads=c.n_kv_heads,
        dropout=c.dropout if c.attn_dropout is None else c.attn_dropout,
        bias=c.bias,
        backend=layer_backend(c, layer),
        rotary=rotary,
        qkv_bias=c.qkv_bias,
        q_norm=qk[0] if qk else None,
        k_norm=qk[1] if qk else None,
        value_embed=value_embed,
    )


def is_moe_layer(c: StackConfig, layer: int) -> bool:
    """Whether layer ``layer``'s FFN is a mixture of experts: never with ``n_experts == 0``;
    with an int ``moe_every = n`` when ``(layer + 1) % n == 0`` (1: all; 2: 1, 3, 5, ..., as
    Qwen2-MoE's ``decoder_sparse_step``); with a tuple when ``layer`` is in it."""
    if not c.n_experts:
        return False
    every = c.moe_every
    return (layer + 1) % every == 0 if isinstance(every, int) else layer in every


def moe_layer_indices(c: StackConfig, n_layers: int | None = None) -> tuple[int, ...]:
    """The MoE layers of a stack of ``n_layers`` layers (default ``c.n_layers``)."""
    return tuple(i for i in range(c.n_layers if n_layers is None else n_layers)
                 if is_moe_layer(c, i))  # fmt: skip


def feed_forward(c: StackConfig, layer: int) -> nn.Module:
    """The position-wise FFN of layer ``layer``: eq. (2) or a GLU variant, or a mixture of
    experts of them (:func:`is_moe_layer`)."""
    if not is_moe_layer(c, layer):
        return FeedForward(c.d_model, c.d_ff, activation=c.activation, bias=c.bias)
    return MoEFeedForward(
        c.d_model, c.moe_d_ff or c.d_ff, c.n_experts, c.top_k, activation=c.activation,
        bias=c.bias, routing=c.moe_routing, norm_topk_prob=c.norm_topk_prob,
        capacity_factor=c.capacity_factor, aux_loss_weight=c.aux_loss_weight,
        z_loss_weight=c.z_loss_weight, n_shared_experts=c.n_shared_experts,
        shared_expert_d_ff=c.shared_expert_d_ff, shared_expert_gate=c.shared_expert_gate,
        bias_balancing=c.router_bias_balancing, bias_update_rate=c.router_bias_rate,
    )  # fmt: skip


def norm(c: StackConfig) -> nn.Module:
    """One norm of the stack (LayerNorm or RMSNorm, with the config's epsilon)."""
    return build_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias)


def final_norm(c: StackConfig) -> nn.Module | None:
    """The norm after the last layer, or ``None`` (:attr:`StackConfig.use_final_norm`)."""
    return norm(c) if c.use_final_norm else None


def encoder_layer(
    c: StackConfig, layer: int, rotary: PositionalEncoding | None = None
) -> EncoderLayer:
    """Self-attention + FFN, each with its norm (built in that order)."""
    self_attn, self_attn_norm = attention(c, layer, rotary), norm(c)
    ffn, ffn_norm = feed_forward(c, layer), norm(c)
    return EncoderLayer(
        self_attn, ffn, self_attn_norm, ffn_norm, dropout=c.dropout, norm_position=c.norm_position
    )


def decoder_layer(
    c: StackConfig,
    layer: int,
    rotary: PositionalEncoding | None = None,
    *,
    cross_attention: bool = True,
    value_embed: bool = False,
) -> DecoderLayer:
    """Masked self-attention (+ cross-attention) + FFN, each with its norm (in that order);
    ``cross_attention=False`` gives GPT's block; ``value_embed``: its self-attention mixes in a
    value embedding."""
    self_attn = attention(c, layer, rotary, value_embed=value_embed)
    self_attn_norm = norm(c)
    cross = (attention(c, layer), norm(c)) if cross_attention else (None, None)
    ffn, ffn_norm = feed_forward(c, layer), norm(c)
    return DecoderLayer(
        self_attn, ffn, self_attn_norm, ffn_norm, cross_attn=cross[0], cross_attn_norm=cross[1],
        dropout=c.dropout, norm_position=c.norm_position,
    )  # fmt: skip


def example_ids(vocab_size: int, batch: int, length: int, generator: torch.Generator) -> Tensor:
    """Random token ids ``(batch, length)`` for example inputs, avoiding ids 0-2 (pad/BOS/EOS-like
    in every family) when the vocabulary has more, so that no padding mask changes the work."""
    low = 3 if vocab_size > 3 else 0
    return torch.randint(low, vocab_size, (batch, length), generator=generator)


def token_inputs(
    c: Any,
    *,
    batch: int = 1,
    seq_len: int | None = None,
    src_len: int | None = None,
    generator: torch.Generator,
) -> tuple[tuple[Tensor, ...], dict[str, Tensor]]:
    """A text model's example inputs (a family's ``example_inputs``): ids ``(B, T)`` of its
    vocabulary, ``T = seq_len`` or its ``max_seq_len``.

    Raises:
        ValueError: for a non-positive length, or none for a model without a context length.
    """
    n = seq_len if seq_len is not None else getattr(c, "max_seq_len", None)
    if n is None:
        raise ValueError(f"{type(c).__name__} has no context length: pass seq_len")
    return (example_ids(c.vocab_size, batch, check_size("seq_len", n), generator),), {}


def seq2seq_inputs(
    c: Any,
    *,
    batch: int = 1,
    seq_len: int | None = None,
    src_len: int | None = None,
    generator: torch.Generator,
) -> tuple[tuple[Tensor, ...], dict[str, Tensor]]:
    """An encoder-decoder's example inputs: source ids ``(B, S)`` of its ``vocab_size`` and
    target ids ``(B, T)`` of its ``target_vocab_size``; ``T = seq_len`` or its ``max_seq_len``,
    ``S = src_len`` or ``T``.

    Raises:
        ValueError: for a non-positive length.
    """
    n = c.max_seq_len if seq_len is None else check_size("seq_len", seq_len)
    S = n if src_len is None else check_size("src_len", src_len)
    src = example_ids(c.vocab_size, batch, S, generator)  # (B, S)
    return (src, example_ids(c.target_vocab_size, batch, n, generator)), {}


def image_inputs(size: int) -> Callable[..., tuple[tuple[Tensor, ...], dict[str, Tensor]]]:
    """A convolutional classifier's ``example_inputs``: random images ``(B, C, size, size)``
    (``C`` = its ``in_channels``); it has no sequence length to vary."""

    def inputs(
        c: Any,
        *,
        batch: int = 1,
        seq_len: int | None = None,
        src_len: int | None = None,
        generator: torch.Generator,
    ) -> tuple[tuple[Tensor, ...], dict[str, Tensor]]:
        if seq_len is not None:
            raise ValueError(f"{type(c).__name__} has no sequence length (seq_len={seq_len})")
        shape = (check_size("batch", batch), c.in_channels, size, size)
        return (torch.randn(shape, generator=generator),), {}

    return inputs


def check_size(name: str, value: object) -> int:
    """A positive integer length or size, or ``ValueError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


__all__ = [
    "StackConfig",
    "attention",
    "check_size",
    "check_token_ids",
    "decoder_layer",
    "encoder_layer",
    "example_ids",
    "feed_forward",
    "final_norm",
    "image_inputs",
    "is_moe_layer",
    "layer_backend",
    "layer_window",
    "moe_layer_indices",
    "norm",
    "seq2seq_inputs",
    "token_inputs",
]
