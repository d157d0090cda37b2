"""Parameter counts: measured on a model, or in closed form from its config alone.

:func:`count_params` accepts either. On a module it sums the unique parameters (a tied weight is
one parameter, counted once). On a config it evaluates the closed form registered for the config's
class in :data:`PARAM_FORMULAS`, so a 175B-parameter model is counted without building it.
:func:`param_breakdown` is that closed form per component (token/position tables, attention,
FFN and norms summed over each stack's layers, heads), built from the per-layer counts below,
which mirror the modules in :mod:`attnlab.layers` (mixture-of-experts FFNs included: router,
every expert, shared experts; :mod:`attnlab.analysis.moe` has the active count); the totals are
its sums. Tests keep the closed
form and the built modules in agreement for every preset.

``exclude_embeddings`` drops the lookup tables (token, segment and learned position embeddings),
as Kaplan et al. and Hugging Face's ``num_parameters(exclude_embeddings=True)`` do; an LM head tied
to the token table goes with it, an untied one stays.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from attnlab.layers.embedding import TokenEmbedding
from attnlab.layers.feedforward import GATED
from attnlab.layers.positional import LearnedPositionalEmbedding
from attnlab.models.bert import BERTConfig
from attnlab.models.cct import CCTConfig
from attnlab.models.common import moe_layer_indices
from attnlab.models.gpt import GPTConfig
from attnlab.models.resnet import ResNetConfig
from attnlab.models.transformer import TransformerConfig
from attnlab.models.vit import ViTConfig

EMBEDDING_TYPES: tuple[type[nn.Module], ...] = (
    TokenEmbedding,
    nn.Embedding,
    LearnedPositionalEmbedding,
)


# -- per-layer closed forms (one per module in attnlab.layers) ----------------------------------


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


def _attention(c: Any) -> int:
    qkv_bias = getattr(c, "qkv_bias", None)
    return attention_params(c.d_model, c.n_heads, c.n_kv_heads, c.bias, qkv_bias)


def layer_params(c: Any, *, cross_attention: bool = False) -> int:
    """One (dense) encoder layer, or decoder layer with ``cross_attention``, from a config's
    sizes."""
    attn = _attention(c)
    norm = norm_params(c.d_model, c.norm, c.bias)
    n_attn = 2 if cross_attention else 1
    return n_attn * (attn + norm) + ffn_params(c.d_model, c.d_ff, c.activation, c.bias) + norm


# -- whole models: closed forms from the per-component breakdown below -------------------------

LOOKUP_TABLES = ("embedding.token", "embedding.target", "embedding.segment", "embedding.position")


def _total(breakdown: ParamBreakdown, exclude_embeddings: bool) -> int:
    if not exclude_embeddings:
        return breakdown.total
    return breakdown.total - sum(breakdown.components.get(name, 0) for name in LOOKUP_TABLES)


def gpt_params(c: GPTConfig, exclude_embeddings: bool = False) -> int:
    """:class:`~attnlab.models.gpt.GPT`."""
    return _total(_gpt_breakdown(c), exclude_embeddings)


def bert_params(c: BERTConfig, exclude_embeddings: bool = False) -> int:
    """:class:`~attnlab.models.bert.BERT` (pooler and MLM head as configured)."""
    return _total(_bert_breakdown(c), exclude_embeddings)


def vit_params(c: ViTConfig, exclude_embeddings: bool = False) -> int:
    """:class:`~attnlab.models.vit.ViT`."""
    return _total(_vit_breakdown(c), exclude_embeddings)


def transformer_params(c: TransformerConfig, exclude_embeddings: bool = False) -> int:
    """:class:`~attnlab.models.transformer.EncoderDecoderTransformer`."""
    return _total(_transformer_breakdown(c), exclude_embeddings)


# -- per-component breakdown ---------------------------------------------------------------------


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


def _stack(prefix: str, c: Any, n_layers: int, *, cross_attention: bool = False) -> dict[str, int]:
    """Attention / FFN / norm parameters of ``n_layers`` layers named ``prefix.*``."""
    attn = _attention(c)
    norm = norm_params(c.d_model, c.norm, c.bias)
    out = {f"{prefix}.self_attn": n_layers * attn}
    if cross_attention:
        out[f"{prefix}.cross_attn"] = n_layers * attn
    out[f"{prefix}.ffn"] = ffn_stack_params(c, n_layers)
    out[f"{prefix}.norms"] = n_layers * norm * (3 if cross_attention else 2)
    return out


def _gpt_breakdown(c: GPTConfig) -> ParamBreakdown:
    comp = {"embedding.token": c.vocab_size * c.d_model}
    if c.pos_encoding == "learned":
        comp["embedding.position"] = c.max_seq_len * c.d_model
    if getattr(c, "embed_norm", False):  # BLOOM's norm on the embeddings
        comp["embedding.norm"] = norm_params(c.d_model, c.norm, c.bias)
    comp.update(_stack("layers", c, c.n_layers))
    if c.use_final_norm:
        comp["final_norm"] = norm_params(c.d_model, c.norm, c.bias)
    comp["lm_head"] = 0 if c.tie_output else c.vocab_size * c.d_model
    tied = {"lm_head": "embedding.token"} if c.tie_output else {}
    return ParamBreakdown(comp, {"layers": c.n_layers}, tied)


def _bert_breakdown(c: BERTConfig) -> ParamBreakdown:
    comp = {
        "embedding.token": c.vocab_size * c.d_model,
        "embedding.segment": c.type_vocab_size * c.d_model,
    }
    if c.pos_encoding == "learned":
        comp["embedding.position"] = c.max_seq_len * c.d_model
    comp["embedding.norm"] = norm_params(c.d_model, c.norm, c.bias)
    comp.update(_stack("layers", c, c.n_layers))
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
    return ParamBreakdown(comp, {"layers": c.n_layers}, tied)


def _vit_breakdown(c: ViTConfig) -> ParamBreakdown:
    comp = {
        "embedding.patch": c.in_channels * c.patch_size**2 * c.d_model + c.d_model,
        "embedding.cls": c.d_model,
    }
    if c.pos_encoding == "learned":
        comp["embedding.position"] = c.max_seq_len * c.d_model
    comp.update(_stack("layers", c, c.n_layers))
    comp["final_norm"] = norm_params(c.d_model, c.norm, c.bias)
    if getattr(c, "pooler", False):
        comp["pooler"] = linear_params(c.d_model, c.d_model)
    if c.n_classes:  # 0: a feature extractor without a head
        comp["head"] = linear_params(c.d_model, c.n_classes)
    return ParamBreakdown(comp, {"layers": c.n_layers})


def _transformer_breakdown(c: TransformerConfig) -> ParamBreakdown:
    comp = {"embedding.token": c.vocab_size * c.d_model}
    tied: dict[str, str] = {}
    if c.share_embeddings:
        tied["embedding.target"] = "embedding.token"
    else:
        comp["embedding.target"] = c.target_vocab_size * c.d_model
    if c.pos_encoding == "learned":
        comp["embedding.position"] = c.max_seq_len * c.d_model
    comp.update(_stack("encoder", c, c.n_layers))
    if c.use_final_norm:
        comp["encoder.final_norm"] = norm_params(c.d_model, c.norm, c.bias)
    comp.update(_stack("decoder", c, c.num_decoder_layers, cross_attention=True))
    if c.use_final_norm:
        comp["decoder.final_norm"] = norm_params(c.d_model, c.norm, c.bias)
    comp["lm_head"] = 0 if c.tie_output else c.target_vocab_size * c.d_model
    if getattr(c, "output_bias", False):  # Marian's bias on the pre-softmax projection
        comp["lm_head"] += c.target_vocab_size
    if c.tie_output:
        tied["lm_head"] = "embedding.target" if not c.share_embeddings else "embedding.token"
    return ParamBreakdown(comp, {"encoder": c.n_layers, "decoder": c.num_decoder_layers}, tied)


def _cct_breakdown(c: CCTConfig) -> ParamBreakdown:
    widths = [c.in_channels] + [c.conv_channels] * (c.conv_layers - 1) + [c.d_model]
    k2 = c.conv_kernel**2
    comp = {"tokenizer.conv": sum(k2 * a * b for a, b in itertools.pairwise(widths))}
    if c.pos_encoding == "learned":
        comp["embedding.position"] = c.max_seq_len * c.d_model
    comp.update(_stack("layers", c, c.n_layers))
    if c.use_final_norm:
        comp["final_norm"] = norm_params(c.d_model, c.norm, c.bias)
    comp["pool"] = linear_params(c.d_model, 1)  # sequence pooling's scores
    if c.n_classes:
        comp["head"] = linear_params(c.d_model, c.n_classes)
    return ParamBreakdown(comp, {"layers": c.n_layers})


def _resnet_breakdown(c: ResNetConfig) -> ParamBreakdown:
    """3x3 convolutions without bias, BN gain + shift after each, option-B projections."""
    width = c.stage_channels[0]
    comp = {"stem.conv": 9 * c.in_channels * width, "stem.norm": 2 * width}
    conv = norms = projection = projection_norms = 0
    for i, (channels, n) in enumerate(zip(c.stage_channels, c.blocks_per_stage, strict=True)):
        for j in range(n):
            conv += 9 * width * channels + 9 * channels * channels
            norms += 2 * 2 * channels
            changes = (i > 0 and j == 0) or width != channels
            if changes and c.shortcut == "B":
                projection += width * channels
                projection_norms += 2 * channels
            width = channels
    comp.update({"stages.conv": conv, "stages.norms": norms})
    if projection:
        comp.update({"stages.conv_shortcut": projection, "stages.shortcut_norms": projection_norms})
    comp["head"] = linear_params(width, c.n_classes)
    return ParamBreakdown(comp, {})


BREAKDOWNS: dict[type[Any], Callable[[Any], ParamBreakdown]] = {
    GPTConfig: _gpt_breakdown,
    BERTConfig: _bert_breakdown,
    ViTConfig: _vit_breakdown,
    TransformerConfig: _transformer_breakdown,
    CCTConfig: _cct_breakdown,
    ResNetConfig: _resnet_breakdown,
}


def param_breakdown(config: Any) -> ParamBreakdown:
    """Parameters per component of the model ``config`` describes (closed form, no model built).

    Per layer: attention ``2·E·E + 2·E·(H_kv·D)`` (+ biases; ``4·E²`` without GQA), FFN
    ``2·E·F`` (``3·E·F`` gated) + biases, norms. Tied weights are counted once.

    Raises:
        ValueError: for a config class the analyser does not know.
    """
    fn = BREAKDOWNS.get(type(config))
    if fn is None:
        valid = ", ".join(cls.__name__ for cls in BREAKDOWNS)
        raise ValueError(
            f"no parameter breakdown for {type(config).__name__}; valid config types: {valid}"
        )
    return fn(config)


PARAM_FORMULAS: dict[type[Any], Callable[[Any, bool], int]] = {
    GPTConfig: gpt_params,
    BERTConfig: bert_params,
    ViTConfig: vit_params,
    TransformerConfig: transformer_params,
    CCTConfig: lambda c, exclude: _total(_cct_breakdown(c), exclude),
    ResNetConfig: lambda c, exclude: _total(_resnet_breakdown(c), exclude),
}


def count_params(model_or_config: nn.Module | Any, *, exclude_embeddings: bool = False) -> int:
    """Number of parameters of a model, or of the model a config describes (closed form).

    Args:
        model_or_config: an ``nn.Module`` (meta-device modules work) or a model config.
        exclude_embeddings: leave out token/segment/position lookup tables (and a head tied
            to them).

    Raises:
        ValueError: for a config class without a registered closed form.
    """
    if isinstance(model_or_config, nn.Module):
        params = {id(p): p for p in model_or_config.parameters()}
        if exclude_embeddings:
            for m in model_or_config.modules():
                if isinstance(m, EMBEDDING_TYPES):
                    for p in m.parameters(recurse=False):
                        params.pop(id(p), None)
        return sum(p.numel() for p in params.values())
    formula = PARAM_FORMULAS.get(type(model_or_config))
    if formula is None:
        valid = ", ".join(cls.__name__ for cls in PARAM_FORMULAS)
        raise ValueError(
            f"no closed-form parameter count for {type(model_or_config).__name__}; "
            f"valid config types: {valid} (or pass a model)"
        )
    return formula(model_or_config, exclude_embeddings)


__all__ = [
    "BREAKDOWNS",
    "EMBEDDING_TYPES",
    "LOOKUP_TABLES",
    "PARAM_FORMULAS",
    "ParamBreakdown",
    "attention_params",
    "component_group",
    "count_params",
    "expert_params",
    "ffn_params",
    "ffn_stack_params",
    "layer_params",
    "linear_params",
    "moe_layer_params",
    "norm_params",
    "param_breakdown",
]
