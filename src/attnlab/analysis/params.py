"""Parameter counts: measured on a model, or in closed form from its config alone.

:func:`count_params` accepts either. On a module it sums the unique parameters (a tied weight is
one parameter, counted once). On a config it evaluates the closed form the config's family declares
(:attr:`~attnlab.models.costs.Costs.params` of its :class:`~attnlab.models.family.Family`), so a
175B-parameter model is counted without building it. :func:`param_breakdown` is that closed form
per component (token/position tables, attention, FFN and norms summed over each stack's layers,
heads), built from the per-layer counts of :mod:`attnlab.models.costs` (re-exported here), which
mirror the modules in :mod:`attnlab.layers` (mixture-of-experts FFNs included: router, every
expert, shared experts; :mod:`attnlab.analysis.moe` has the active count); the totals are its
sums. Tests keep the closed form and the built modules in agreement for every preset.

``exclude_embeddings`` drops the lookup tables (token, segment and learned position embeddings),
as Kaplan et al. and Hugging Face's ``num_parameters(exclude_embeddings=True)`` do; an LM head tied
to the token table goes with it, an untied one stays.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn

from attnlab.layers.embedding import TokenEmbedding
from attnlab.layers.positional import LearnedPositionalEmbedding
from attnlab.models.costs import (
    LOOKUP_TABLES,
    Costs,
    ParamBreakdown,
    attention_params,
    component_group,
    expert_params,
    ffn_params,
    ffn_stack_params,
    layer_params,
    linear_params,
    moe_layer_params,
    norm_params,
    total_params,
)
from attnlab.models.family import families, find_family

EMBEDDING_TYPES: tuple[type[nn.Module], ...] = (
    TokenEmbedding,
    nn.Embedding,
    LearnedPositionalEmbedding,
)


def family_costs(config: Any, what: str) -> Costs:
    """The closed forms of ``config``'s family.

    Raises:
        ValueError: for a config of no family, or one whose family declares no closed forms,
            naming ``what`` was asked and the config types that have them.
    """
    family = None if isinstance(config, type) else find_family(config)
    if family is None or family.costs is None:
        valid = ", ".join(f.config.__name__ for f in families() if f.costs is not None)
        raise ValueError(f"no {what} for {type(config).__name__}; valid config types: {valid}")
    return family.costs


def param_breakdown(config: Any) -> ParamBreakdown:
    """Parameters per component of the model ``config`` describes (closed form, no model built).

    Per layer: attention ``2·E·E + 2·E·(H_kv·D)`` (+ biases; ``4·E²`` without GQA), FFN
    ``2·E·F`` (``3·E·F`` gated) + biases, norms. Tied weights are counted once.

    Raises:
        ValueError: for a config whose family declares no closed form.
    """
    return family_costs(config, "parameter breakdown").params(config)


def count_params(model_or_config: nn.Module | Any, *, exclude_embeddings: bool = False) -> int:
    """Number of parameters of a model, or of the model a config describes (closed form).

    Args:
        model_or_config: an ``nn.Module`` (meta-device modules work) or a model config.
        exclude_embeddings: leave out token/segment/position lookup tables (and a head tied
            to them).

    Raises:
        ValueError: for a config without a closed form.
    """
    if isinstance(model_or_config, nn.Module):
        params = {id(p): p for p in model_or_config.parameters()}
        if exclude_embeddings:
            for m in model_or_config.modules():
                if isinstance(m, EMBEDDING_TYPES):
                    for p in m.parameters(recurse=False):
                        params.pop(id(p), None)
        return sum(p.numel() for p in params.values())
    costs = family_costs(model_or_config, "closed-form parameter count")
    return total_params(costs.params(model_or_config), exclude_embeddings)


def has_closed_form(config: Any) -> bool:
    """Whether ``config``'s family declares a closed-form parameter count."""
    family = None if isinstance(config, type) else find_family(config)
    return family is not None and family.costs is not None


_PER_FAMILY = ("gpt_params", "bert_params", "vit_params", "transformer_params")


def __getattr__(name: str) -> Any:
    """Deprecated: ``BREAKDOWNS`` / ``PARAM_FORMULAS`` (views, config class -> formula, of what
    the families declare: :attr:`attnlab.models.family.Family.costs`) and the per-family
    ``gpt_params`` / ``bert_params`` / ``vit_params`` / ``transformer_params``
    (:func:`count_params` of a config)."""
    if name in _PER_FAMILY:
        warnings.warn(
            f"attnlab.analysis.params.{name} is deprecated: use count_params(config, "
            "exclude_embeddings=...), which reads the config's family's closed form",
            DeprecationWarning,
            stacklevel=2,
        )
        return lambda c, exclude_embeddings=False: count_params(
            c, exclude_embeddings=exclude_embeddings
        )
    if name in ("BREAKDOWNS", "PARAM_FORMULAS"):
        warnings.warn(
            f"attnlab.analysis.params.{name} is deprecated: each family declares its closed "
            "forms (attnlab.models.family.Family.costs); use param_breakdown / count_params",
            DeprecationWarning,
            stacklevel=2,
        )
        have = [f for f in families() if f.costs is not None]
        if name == "BREAKDOWNS":
            return {f.config: f.costs.params for f in have}
        return {
            f.config: (lambda c, exclude=False, _f=f: total_params(_f.costs.params(c), exclude))
            for f in have
        }
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "EMBEDDING_TYPES",
    "LOOKUP_TABLES",
    "ParamBreakdown",
    "attention_params",
    "component_group",
    "count_params",
    "expert_params",
    "family_costs",
    "ffn_params",
    "ffn_stack_params",
    "has_closed_form",
    "layer_params",
    "linear_params",
    "moe_layer_params",
    "norm_params",
    "param_breakdown",
    "total_params",
]
