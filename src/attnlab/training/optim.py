"""Optimizer parameter groups, and the optimizer and scheduler a :class:`TrainConfig` asks for.

Weight decay (decoupled, AdamW) shrinks weights toward 0. It is meant for the matrices of the
linear maps; decaying a norm's gain pulls it toward 0 instead of its natural 1, decaying a bias
has no regularising purpose, and decaying embedding rows penalises rare tokens that are seldom
updated. So by default only parameters with two or more dimensions that are not embeddings are
decayed; ``decay_norms_and_biases`` / ``decay_embeddings`` opt in. A parameter marked
``_no_weight_decay = True`` (Mamba's ``A_log`` and ``D``, as the reference marks them: log decay
rates, not weight matrices) is treated like a bias.

Embeddings are recognised by module type (``nn.Embedding``, :class:`TokenEmbedding`,
:class:`LearnedPositionalEmbedding`) and by the ``cls_token`` parameter name (ViT). Tied weights
(the LM head sharing the token embedding, §3.4) appear once, under their first name.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from attnlab.layers.embedding import TokenEmbedding
from attnlab.layers.norm import BatchNorm, LayerNorm, RMSNorm
from attnlab.layers.positional import LearnedPositionalEmbedding
from attnlab.models.family import find_family
from attnlab.training.config import TrainConfig
from attnlab.training.muon import Muon
from attnlab.training.schedules import lambda_lr, make_schedule

_EMBEDDINGS = (nn.Embedding, TokenEmbedding, LearnedPositionalEmbedding)
_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d, LayerNorm, RMSNorm,
          BatchNorm)  # fmt: skip
_EMBEDDING_NAMES = ("cls_token",)


def classify_parameters(model: nn.Module) -> dict[str, str]:
    """Each trainable parameter's kind: ``"weight"``, ``"bias"``, ``"norm"`` or ``"embedding"``.

    Keys are the names of :meth:`nn.Module.named_parameters` (shared tensors once).
    """
    kinds: dict[str, str] = {}
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            name = f"{module_name}.{pname}" if module_name else pname
            if isinstance(module, _EMBEDDINGS) or pname in _EMBEDDING_NAMES:
                kinds[name] = "embedding"
            elif isinstance(module, _NORMS):
                kinds[name] = "norm"
            elif p.ndim < 2 or getattr(p, "_no_weight_decay", False):
                kinds[name] = "bias"
            else:
                kinds[name] = "weight"
    return kinds


def parameter_groups(
    model: nn.Module,
    weight_decay: float,
    *,
    decay_norms_and_biases: bool = False,
    decay_embeddings: bool = False,
) -> list[dict[str, Any]]:
    """Two optimizer groups: ``{"params": decayed, "weight_decay": weight_decay}`` and
    ``{"params": the rest, "weight_decay": 0.0}`` (empty groups are dropped).

    Raises:
        ValueError: for a negative ``weight_decay``.
    """
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    params = dict(model.named_parameters())
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, kind in classify_parameters(model).items():
        decayed = (
            kind == "weight"
            or (kind in ("norm", "bias") and decay_norms_and_biases)
            or (kind == "embedding" and decay_embeddings)
        )
        (decay if decayed else no_decay).append(params[name])
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


def build_optimizer(model: nn.Module, config: TrainConfig) -> Optimizer:
    """The optimizer of ``config`` over :func:`parameter_groups` of ``model``.

    ``adam`` applies weight decay as L2 in the gradient (torch's Adam); ``adamw`` decouples it.
    ``config.optimizer_impl`` chooses the implementation of each (:func:`optimizer_impl`); for
    ``sgd``, ``"auto"`` is torch's own default (the for-loop on the CPU).

    Raises:
        ValueError: for ``optimizer_impl="fused"`` where torch's fused kernel does not apply.
    """
    groups = parameter_groups(
        model,
        config.weight_decay,
        decay_norms_and_biases=config.decay_norms_and_biases,
        decay_embeddings=config.decay_embeddings,
    )
    if config.optimizer == "muon":
        return _build_muon(model, groups, config)
    impl = optimizer_impl(groups, config.optimizer_impl)
    kwargs = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
    if config.optimizer == "sgd":  # torch's SGD has the same three implementations
        if config.optimizer_impl == "auto":  # unchanged since SGD first ran: torch's choice
            kwargs = {}
        return torch.optim.SGD(groups, lr=config.lr, momentum=config.betas[0], **kwargs)
    cls = torch.optim.AdamW if config.optimizer == "adamw" else torch.optim.Adam
    return cls(groups, lr=config.lr, betas=config.betas, eps=config.adam_eps, **kwargs)


def muon_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters Muon updates: the hidden layers' matrices.

    That is every ``"weight"`` of :func:`classify_parameters` (two or more dimensions, not an
    embedding, norm or ``_no_weight_decay`` parameter) except the output head's, which the
    model's family names (:attr:`HookLayout.head`); a model of no family keeps every weight.
    """
    head_ids: set[int] = set()
    family = find_family(model)
    if family is not None and family.hooks is not None:
        head = family.hooks(model).head
        if head is not None:
            head_ids = {id(p) for p in head.parameters()}
    params = dict(model.named_parameters())
    return [
        params[name]
        for name, kind in classify_parameters(model).items()
        if kind == "weight" and id(params[name]) not in head_ids
    ]


def _build_muon(model: nn.Module, groups: list[dict[str, Any]], config: TrainConfig) -> Muon:
    """:class:`Muon` over the hidden matrices, AdamW over the rest, decayed as ``groups`` say."""
    if config.optimizer_impl not in ("auto", "for-loop"):
        raise ValueError(
            f"optimizer='muon' has one implementation (for-loop); got optimizer_impl="
            f"{config.optimizer_impl!r}"
        )
    hidden = {id(p) for p in muon_parameters(model)}
    muon_groups: list[dict[str, Any]] = []
    for group in groups:
        muon = [p for p in group["params"] if id(p) in hidden]
        rest = [p for p in group["params"] if id(p) not in hidden]
        wd = group["weight_decay"]
        if muon:
            muon_groups.append({"params": muon, "use_muon": True, "weight_decay": wd})
        if rest:
            muon_groups.append({"params": rest, "use_muon": False, "weight_decay": wd})
    return Muon(
        muon_groups, lr=config.muon_lr, momentum=config.muon_momentum, adam_lr=config.lr,
        betas=config.betas, eps=config.adam_eps, ns_steps=config.muon_ns_steps,
        ns_dtype=config.muon_ns_dtype,
    )  # fmt: skip


def optimizer_impl(groups: list[dict[str, Any]], asked: str) -> str:
    """The implementation of Adam(W) or SGD to use: ``"auto"`` picks ``fused`` (one kernel over
    all tensors, several times faster on the CPU) where it applies, else ``for-loop``
    (:func:`build_optimizer` keeps torch's own default for SGD's ``"auto"``).

    The implementations agree to rounding, not bitwise: one ulp of difference in the first
    update is amplified by Adam on parameters whose gradient is only rounding noise (a key
    projection's bias, whose exact gradient is 0), so a run reproduces another bitwise only
    with the same implementation.

    Raises:
        ValueError: for ``fused`` where it does not apply, or an unknown name.
    """
    if asked not in ("auto", "fused", "foreach", "for-loop"):
        raise ValueError(
            f"optimizer_impl={asked!r} is not valid; choose auto, fused, foreach, for-loop"
        )
    if asked == "auto":
        return "fused" if _can_fuse(groups) else "for-loop"
    if asked == "fused" and not _can_fuse(groups):
        raise ValueError(
            "optimizer_impl='fused' needs plain float parameters on CPU or CUDA (sharded or "
            "other tensors take 'for-loop' or 'foreach')"
        )
    return asked


def describe_optimizer(optimizer: Optimizer) -> str:
    """``"AdamW (fused)"``: the class and the implementation an optimizer runs."""
    d = optimizer.defaults
    if isinstance(optimizer, Muon):
        return "Muon + AdamW (for-loop)"
    impl = "fused" if d.get("fused") else "foreach" if d.get("foreach") else "for-loop"
    return f"{type(optimizer).__name__} ({impl})"


def _can_fuse(groups: list[dict[str, Any]]) -> bool:
    """Whether torch's fused Adam(W) kernel applies: plain float tensors on CPU or CUDA.

    Sharded parameters (FSDP2's DTensors) and other tensor subclasses take the for-loop path.
    """
    params = [p for g in groups for p in g["params"]]
    return bool(params) and all(
        type(p) in (torch.Tensor, nn.Parameter)
        and p.dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16)
        and p.device.type in ("cpu", "cuda")
        for p in params
    )


def build_scheduler(
    optimizer: Optimizer,
    config: TrainConfig,
    *,
    d_model: int,
    elapsed_s: Callable[[], float] | None = None,
) -> LambdaLR:
    """The ``LambdaLR`` of ``config.schedule`` (:mod:`attnlab.training.schedules`).

    ``noam`` needs the model width ``d_model`` (eq. (3)); its values multiply ``config.lr``.
    With ``config.schedule_clock == "time"`` the cosine or WSD schedule is evaluated at
    ``max(step, ceil(steps * elapsed_s() / (60 * max_minutes)))``: the further along of the
    step count and the time budget (``elapsed_s`` reads the training seconds so far).

    Raises:
        ValueError: for ``schedule_clock="time"`` without ``elapsed_s``.
    """
    if config.schedule == "noam":
        schedule = make_schedule("noam", d_model=d_model, warmup=config.warmup)
    elif config.schedule == "cosine":
        schedule = make_schedule(
            "cosine", warmup=config.warmup, total_steps=config.steps, min_ratio=config.min_lr_ratio
        )
    elif config.schedule == "wsd":
        schedule = make_schedule(
            "wsd", warmup=config.warmup, total_steps=config.steps,
            decay_fraction=config.decay_fraction, min_ratio=config.min_lr_ratio,
            decay=config.wsd_decay,
        )  # fmt: skip
    else:
        schedule = make_schedule("constant", warmup=config.warmup)
    if config.schedule_clock == "time":
        if elapsed_s is None:
            raise ValueError("schedule_clock='time' needs elapsed_s, the training time so far")
        schedule = _on_time(schedule, config, elapsed_s)
    return lambda_lr(optimizer, schedule)


def _on_time(
    schedule: Callable[[int], float], config: TrainConfig, elapsed_s: Callable[[], float]
) -> Callable[[int], float]:
    """``schedule`` at the step the time budget has reached, when that is ahead of ``step``."""
    steps, budget_s = config.steps or 1, 60.0 * (config.max_minutes or 0.0)

    def at(step: int) -> float:
        by_time = math.ceil(steps * min(1.0, elapsed_s() / budget_s))
        return schedule(max(step, by_time))

    return at


__all__ = [
    "build_optimizer",
    "build_scheduler",
    "classify_parameters",
    "describe_optimizer",
    "optimizer_impl",
    "parameter_groups",
]
