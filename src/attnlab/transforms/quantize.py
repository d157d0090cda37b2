"""Weight-only quantization of a built model: :func:`quantize` (int8 / int4), applied from outside.

Decoding one token streams every weight from memory once, so on a CPU the bytes per weight set
the speed (the "floor": weight bytes / memory bandwidth). :func:`quantize` swaps every
``nn.Linear`` for an :class:`~attnlab.transforms.quant_modules.Int8Linear` (1 byte per weight +
a scale per output channel) or :class:`~attnlab.transforms.quant_modules.Int4Linear` (half a
byte + a scale and a zero per group of inputs), as gpt-fast and llama.cpp do; the layers
themselves keep no quantization code. Formats, kernels and their shape limits:
:mod:`attnlab.transforms.quant_formats`.

The LM head and the token embedding are kept in float32 unless asked for. A head *tied* to the
token embedding (GPT, the paper's §3.4 sharing) is handled as follows:

- neither included (default): both keep the one shared float32 parameter; the tie is intact;
- both included: one quantized table serves the head (a packed matmul) and the embedding (row
  look-ups through :class:`~attnlab.transforms.quant_embedding.QuantizedEmbedding`): still tied;
- only one included: the tie is broken on purpose: the quantized side gets its own copy and the
  other keeps the float32 parameter (so the model holds both). This is logged and recorded in
  ``model.quantization_config.untied``; :func:`~attnlab.transforms.quant_io.load_quantized`
  rebuilds the same structure.

Deviations from gpt-fast: float32 models and float32 activations (gpt-fast runs bfloat16 models),
through attnlab's own CPU kernels where they build (:mod:`attnlab.kernels`), else
bfloat16 rows into PyTorch's (``activation_dtype``; :mod:`attnlab.transforms.quant_formats`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from torch import Tensor, nn

import attnlab.transforms.quant_formats as qf
from attnlab.layers.embedding import TokenEmbedding
from attnlab.transforms.quant_embedding import QuantizedEmbedding
from attnlab.transforms.quant_modules import (
    ActivationDtype,
    Int4Linear,
    Int8Linear,
    QuantizedLinear,
    activation_dtype_name,
    default_activation_dtype,
)

logger = logging.getLogger(__name__)

Format = Literal["int8", "int4"]
FORMATS: tuple[str, ...] = ("int8", "int4")


@dataclass(frozen=True, kw_only=True)
class QuantizationConfig:
    """How a model was quantized (``model.quantization_config``; ``quantization.json``).

    ``modules``: every name (aliases included) of the modules replaced, in module order;
    ``untied``: ``(head, embedding)`` module names whose shared weight is now held twice.
    """

    format: Format
    group_size: int | None = None  # int4 only
    include_lm_head: bool = False
    include_embedding: bool = False
    # float32 where attnlab's kernels are available here, else bfloat16 (None: the same)
    activation_dtype: ActivationDtype = field(default_factory=default_activation_dtype)
    modules: tuple[str, ...] = ()
    untied: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format={self.format!r} is not valid; choose one of {list(FORMATS)}")
        if self.format == "int4":
            g = self.group_size
            if isinstance(g, bool) or not isinstance(g, int) or g < 1:
                raise ValueError(f"group_size={g!r} must be a positive integer for int4")
        elif self.group_size is not None:
            raise ValueError(f"group_size={self.group_size!r} applies to int4 only (int8: None)")
        object.__setattr__(self, "activation_dtype", activation_dtype_name(self.activation_dtype))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QuantizationConfig:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: for unknown keys or invalid values.
        """
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown quantization keys {unknown}; valid: {sorted(known)}")
        values = dict(data)
        values["modules"] = tuple(values.get("modules", ()))
        values["untied"] = tuple(tuple(pair) for pair in values.get("untied", ()))
        return cls(**values)


@dataclass
class _Plan:
    """What :func:`quantize` replaces: module id -> (every name of it, the module)."""

    linears: dict[int, tuple[list[str], nn.Linear]] = field(default_factory=dict)
    embeddings: dict[int, tuple[list[str], TokenEmbedding]] = field(default_factory=dict)
    heads: set[int] = field(default_factory=set)  # linears tied to an embedding, or lm_head
    ties: list[tuple[int, int, str, str]] = field(default_factory=list)  # head, embedding


def _plan(model: nn.Module, config: QuantizationConfig) -> _Plan:
    """Choose the linears and embeddings to replace, and find the tied (head, embedding) pairs."""
    names: dict[int, tuple[list[str], nn.Module]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        names.setdefault(id(module), ([], module))[0].append(name)
    tables = {
        id(m.weight): (k, n[0]) for k, (n, m) in names.items() if isinstance(m, TokenEmbedding)
    }
    plan = _Plan()
    for key, (aliases, module) in names.items():
        if isinstance(module, nn.Linear):
            tied = tables.get(id(module.weight))
            if tied is not None:
                plan.ties.append((key, tied[0], aliases[0], tied[1]))
            if tied is not None or any(n.split(".")[-1] == "lm_head" for n in aliases):
                plan.heads.add(key)
            if config.include_lm_head or key not in plan.heads:
                _check_plain(aliases[0], module)
                plan.linears[key] = (aliases, module)
        elif isinstance(module, TokenEmbedding) and config.include_embedding:
            plan.embeddings[key] = (aliases, module)
    return plan


def _check_plain(name: str, linear: nn.Linear) -> None:
    """Refuse a subclass of ``nn.Linear`` that computes more than ``x Wᵀ + b`` (a soft-capped
    head): a quantized linear in its place would silently drop the rest.

    Raises:
        ValueError: naming the module, its class and what to do instead.
    """
    if type(linear).forward is not nn.Linear.forward:
        cap = getattr(linear, "softcap", None)
        what = f" (logit soft-capping, cap {cap})" if cap is not None else ""
        raise ValueError(
            f"cannot quantize {name!r}: a {type(linear).__name__} computes more than a linear "
            f"map{what}, which a quantized linear would drop; keep it in float "
            "(include_lm_head=False for a head)"
        )


def _input_sizes(plan: _Plan) -> list[tuple[str, int]]:
    """(name, inputs per row) of every layer the plan quantizes."""
    shapes = [(names[0], m.in_features) for names, m in plan.linears.values()]
    return shapes + [(names[0], m.d_model) for names, m in plan.embeddings.values()]


def _check_group_size(plan: _Plan, config: QuantizationConfig) -> None:
    if config.format != "int4":
        return
    g = config.group_size
    shapes = _input_sizes(plan)
    bad = [(n, k) for n, k in shapes if k % (g or 1)]
    if bad:
        name, k = bad[0]
        raise ValueError(
            f"group_size={g} does not divide in_features={k} of {name!r}"
            + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
        )


def fitting_group_size(
    model: nn.Module,
    *,
    preferred: int = 128,
    include_lm_head: bool = False,
    include_embedding: bool = False,
) -> int:
    """The int4 group size to use for ``model``: ``preferred`` when it divides the input size of
    every layer :func:`quantize` would replace, else the largest of the kernel's sizes (256, 128,
    64, 32) below it that does, else the largest divisor of them all below it (which runs the
    reference path). E.g. 128 for GPT-2 small, 32 for a ``d_model`` 96 model.

    Raises:
        ValueError: for a ``preferred`` that is not a positive integer.
    """
    if isinstance(preferred, bool) or not isinstance(preferred, int) or preferred < 1:
        raise ValueError(f"preferred={preferred!r} must be a positive integer")
    options = QuantizationConfig(format="int4", group_size=preferred,
                                 include_lm_head=include_lm_head,
                                 include_embedding=include_embedding)  # fmt: skip
    sizes = [k for _, k in _input_sizes(_plan(model, options))]
    common = math.gcd(*sizes) if sizes else preferred
    if common % preferred == 0:
        return preferred
    kernel = [g for g in qf.INT4_KERNEL_GROUP_SIZES if g < preferred and common % g == 0]
    if kernel:
        return max(kernel)
    return max(d for d in range(1, min(preferred, common) + 1) if common % d == 0)


def new_quantized_linear(
    weight: Tensor | None,
    bias: Tensor | None,
    config: QuantizationConfig,
    *,
    shape: tuple[int, int] | None = None,
    has_bias: bool = False,
) -> QuantizedLinear:
    """A quantized linear of ``weight (N, K)`` (and ``bias``), or an empty one of ``shape`` /
    ``has_bias`` when ``weight`` is None (to be filled by ``load_state_dict``)."""
    N, K = shape if weight is None else weight.shape  # type: ignore[misc]
    bias_flag = has_bias if weight is None else bias is not None
    act = config.activation_dtype
    if config.format == "int8":
        q8 = Int8Linear(K, N, bias=bias_flag, activation_dtype=act)
        if weight is not None:
            q8.set_codes(*qf.quantize_int8(weight), None if bias is None else bias.detach())
        return q8
    g = int(config.group_size or 0)
    q4 = Int4Linear(K, N, bias=bias_flag, group_size=g, activation_dtype=act)
    if weight is not None:
        q4.set_codes(*qf.quantize_int4(weight, g), None if bias is None else bias.detach())
    return q4


def _replace_all(model: nn.Module, old: nn.Module, new: nn.Module) -> None:
    """Put ``new`` in every place of ``model`` that holds ``old`` as a sub-module."""
    for parent in list(model.modules()):
        for attr, child in list(parent._modules.items()):
            if child is old:
                setattr(parent, attr, new)


def apply_quantization(model: nn.Module, config: QuantizationConfig, *, empty: bool) -> nn.Module:
    """Replace ``model``'s modules as ``config`` says; ``empty``: build the quantized modules
    without reading the weights (for loading). Sets ``model.quantization_config``.

    Raises:
        ValueError: as :func:`quantize`.
    """
    if any(isinstance(m, QuantizedLinear | QuantizedEmbedding) for m in model.modules()):
        raise ValueError(f"{type(model).__name__} is already quantized; quantize a float model")
    plan = _plan(model, config)
    if not plan.linears and not plan.embeddings:
        raise ValueError(
            f"{type(model).__name__} has no torch.nn.Linear to quantize "
            f"(include_lm_head={config.include_lm_head})"
        )
    _check_group_size(plan, config)
    if any(m.weight.device.type == "meta" for _, m in plan.linears.values()) and not empty:
        raise ValueError("cannot quantize a model on the meta device (its weights are not set)")
    made: dict[int, QuantizedLinear] = {}
    for key, (_, lin) in plan.linears.items():
        shape = (lin.out_features, lin.in_features)
        weight = None if empty else lin.weight
        made[key] = new_quantized_linear(
            weight, lin.bias, config, shape=shape, has_bias=lin.bias is not None
        )
    shared = {emb: head for head, emb, _, _ in plan.ties if head in plan.linears}
    embeds: dict[int, QuantizedEmbedding] = {}
    for key, (_, emb) in plan.embeddings.items():
        if key in shared:
            table = made[shared[key]]  # the quantized head serves the look-ups: still tied
        else:
            shape = (emb.vocab_size, emb.d_model)
            table = new_quantized_linear(None if empty else emb.weight, None, config, shape=shape)
        embeds[key] = QuantizedEmbedding.from_embedding(emb, table)
    untied = [
        (head_name, emb_name)
        for head, emb, head_name, emb_name in plan.ties
        if (head in plan.linears) != (emb in plan.embeddings)
    ]
    for key, (_, lin) in plan.linears.items():
        _replace_all(model, lin, made[key])
    for key, (_, emb) in plan.embeddings.items():
        _replace_all(model, emb, embeds[key])
    modules = [n for n, m in model.named_modules(remove_duplicate=False) if _is_quantized(m)]
    for head, emb_name in untied:
        logger.info("quantize: %s no longer shares its weight with %s", head, emb_name)
    setattr(model, "quantization_config", _replace_config(config, tuple(modules), tuple(untied)))  # noqa: B010
    return model


def _is_quantized(module: nn.Module) -> bool:
    return isinstance(module, QuantizedLinear | QuantizedEmbedding)


def _replace_config(
    config: QuantizationConfig, modules: tuple[str, ...], untied: tuple[tuple[str, str], ...]
) -> QuantizationConfig:
    return QuantizationConfig(**{**config.to_dict(), "modules": modules, "untied": untied})


def quantize(
    model: nn.Module,
    format: str,
    *,
    group_size: int = 128,
    include_lm_head: bool = False,
    include_embedding: bool = False,
    activation_dtype: str | None = None,
) -> nn.Module:
    """Quantize ``model``'s linear layers in place (weight-only) and return it.

    Quantizing takes one pass over the weights (a few seconds for GPT-2 small). A fused decode
    engine open on the model (a held :class:`~attnlab.generation.engines.DecodeSession`) sees
    its layers replaced and runs the model's own modules from then on.

    Args:
        model: a float32 model (any ``nn.Module`` holding ``nn.Linear`` layers).
        format: ``"int8"`` (per-output-channel scales) or ``"int4"`` (per-group scales and zeros).
        group_size: int4 only: inputs per group; must divide every quantized layer's
            ``in_features`` (the int4 kernel takes 32, 64, 128, 256; others use the reference).
        include_lm_head: also quantize the LM head (``lm_head``, or any linear sharing its
            weight with a token embedding); see the module doc for tied heads.
        include_embedding: also quantize token embeddings (row look-ups into a quantized table).
        activation_dtype: the rows entering the quantized layers: ``"float32"`` (exact; attnlab's
            own kernels, :mod:`~attnlab.kernels`) or ``"bfloat16"`` (PyTorch's
            kernels' vectorised path: rows rounded to bfloat16 on the way in). ``None``
            (default): float32 where attnlab's kernels could be built here, else bfloat16.

    Returns:
        ``model``, with ``model.quantization_config`` (a :class:`QuantizationConfig`) set.

    Raises:
        ValueError: for an unknown ``format`` or ``activation_dtype``, a ``group_size`` that is
            not a positive integer or does not divide a layer's ``in_features`` (nothing is
            changed then), a model without ``nn.Linear`` layers (or already quantized), or one
            on the meta device.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"quantize expects a torch.nn.Module, got {type(model).__name__}")
    config = QuantizationConfig(
        format=format,  # type: ignore[arg-type]
        group_size=group_size if format == "int4" else None,
        include_lm_head=include_lm_head,
        include_embedding=include_embedding,
        activation_dtype=activation_dtype_name(activation_dtype),
    )
    return apply_quantization(model, config, empty=False)


__all__ = [
    "FORMATS",
    "QuantizationConfig",
    "apply_quantization",
    "fitting_group_size",
    "new_quantized_linear",
    "quantize",
]
