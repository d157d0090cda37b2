"""Record the attention weights of every layer of a whole model, and attention rollout.

:func:`record_attention` hooks the ``weights`` site (:mod:`attnlab.layers.hooks`, the mechanism
of :mod:`attnlab.inspect`) of every :class:`~attnlab.layers.multihead.MultiHeadAttention` of a
model: each layer recomputes its weights on the math path, with its backend's sparsity pattern,
so they are the real ones even for a model that runs on SDPA, while its output still comes from
its backend. No model code changes; the hooks are removed on exit. :func:`collect_attention`
runs a forward pass under it and groups the weights by stack:

- ``"self"``: the layers of a BERT, GPT or ViT (module names ``layers.<i>.self_attn``);
- ``"encoder"``, ``"decoder"``, ``"cross"``: an encoder-decoder's encoder self-attention, decoder
  (masked) self-attention and decoder cross-attention (queries: target, keys: source).

:func:`attention_rollout` is Abnar & Zuidema (2020), "Quantifying Attention Flow in Transformers":
the per-layer weights, averaged over heads, mixed with the identity for the residual connection
(``0.5·A + 0.5·I``), renormalised, and multiplied through the layers.

Shapes: B batch, H heads, T queries, S keys, L layers.
Masks: bool True = may attend, float additive; masked keys get weight exactly 0 on the math path.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn

from attnlab.layers.multihead import MultiHeadAttention

_NAME = re.compile(r"^(?:(?P<prefix>.+)\.)?layers\.(?P<index>\d+)\.(?P<attr>self_attn|cross_attn)$")

HeadFusion = Literal["mean", "max", "min"]


class _WeightsRecorder:
    """An attention module's ``activation_hook`` (:mod:`attnlab.layers.hooks`) that keeps the
    ``weights`` site: the layer then computes its weights on the math path beside its backend."""

    def __init__(self, calls: list[Tensor]) -> None:
        self.calls = calls

    def wants(self, site: str) -> bool:
        return site == "weights"

    def __call__(self, site: str, x: Tensor) -> Tensor:
        if site == "weights":
            self.calls.append(x.detach())
        return x


@contextlib.contextmanager
def record_attention(model: nn.Module) -> Iterator[dict[str, list[Tensor]]]:
    """Within the ``with`` block, every attention module of ``model`` records its weights.

    Yields a dict, filled as the model runs: module name -> the weights of each call, in call
    order, detached, ``(B, H, T, S)`` each. Works on any module tree (a model, one block).

    Raises:
        ValueError: if ``model`` has no :class:`MultiHeadAttention` or one is already hooked
            (by :mod:`attnlab.inspect`), or (while running) if a layer's backend computes no
            softmax weights (linear attention).
    """
    records: dict[str, list[Tensor]] = {}
    modules = [(n, m) for n, m in model.named_modules() if isinstance(m, MultiHeadAttention)]
    if not modules:
        raise ValueError(f"{type(model).__name__} has no MultiHeadAttention module to record")
    busy = [n for n, m in modules if "activation_hook" in m.__dict__]
    if busy:
        raise ValueError(
            f"attention modules {busy} are already hooked (attnlab.inspect); read the weights "
            "there: attnlab.inspect.capture(model, '*attn.weights')"
        )
    try:
        for name, module in modules:
            module.__dict__["activation_hook"] = _WeightsRecorder(records.setdefault(name, []))
        yield records
    finally:
        for _, module in modules:
            module.__dict__.pop("activation_hook", None)
        for name in [n for n, calls in records.items() if not calls]:
            del records[name]


def stack_of(name: str) -> tuple[str, int]:
    """``(stack, layer index)`` of an attention module's name.

    ``layers.3.self_attn`` -> ``("self", 3)``; ``encoder.layers.0.self_attn`` -> ``("encoder", 0)``;
    ``decoder.layers.1.self_attn`` -> ``("decoder", 1)``; ``decoder.layers.1.cross_attn`` ->
    ``("cross", 1)``. Other names are their own stack, with index 0.
    """
    m = _NAME.match(name)
    if m is None:
        return name, 0
    if m["attr"] == "cross_attn":
        return "cross", int(m["index"])
    return m["prefix"] or "self", int(m["index"])


def group_by_stack(records: Mapping[str, Sequence[Tensor]]) -> dict[str, list[Tensor]]:
    """Per stack, the weights of its layers in layer order (the first call of each module).

    Shapes:
        each ``(B, H, T, S)``.
    """
    stacks: dict[str, dict[int, Tensor]] = {}
    for name, calls in records.items():
        if calls:
            stack, index = stack_of(name)
            stacks.setdefault(stack, {})[index] = calls[0]
    return {s: [layers[i] for i in sorted(layers)] for s, layers in stacks.items()}


@torch.no_grad()
def collect_attention(model: nn.Module, *args: Any, **kwargs: Any) -> dict[str, list[Tensor]]:
    """Run ``model(*args, **kwargs)`` once in eval mode and return its attention weights by stack.

    The model's mode is restored afterwards. Keys: ``"self"`` (BERT, GPT, ViT) or ``"encoder"``,
    ``"decoder"``, ``"cross"`` (encoder-decoder); values: one ``(B, H, T, S)`` tensor per layer.

    Raises:
        ValueError: if the model has no attention module or no layer was called.
    """
    was_training = model.training
    model.eval()
    try:
        with record_attention(model) as records:
            model(*args, **kwargs)
    finally:
        model.train(was_training)
    stacks = group_by_stack(records)
    if not stacks:
        raise ValueError(f"no attention layer of {type(model).__name__} ran in this forward pass")
    return stacks


def fuse_heads(weights: Tensor, how: HeadFusion = "mean") -> Tensor:
    """Combine the heads of ``(..., H, T, S)`` weights into ``(..., T, S)``.

    Raises:
        ValueError: for an unknown ``how``.
    """
    if how == "mean":
        return weights.mean(dim=-3)
    if how == "max":
        return weights.amax(dim=-3)
    if how == "min":
        return weights.amin(dim=-3)
    raise ValueError(f"unknown head fusion {how!r}; valid: mean, max, min")


def attention_rollout(
    weights: Sequence[Tensor], *, residual: float = 0.5, head_fusion: HeadFusion = "mean"
) -> Tensor:
    """Attention rollout (Abnar & Zuidema 2020) through a stack of self-attention layers.

    Per layer ``l``: ``A_l = fuse_heads(W_l)``, ``Â_l = residual·I + (1 - residual)·A_l``, rows
    renormalised to sum to 1; the rollout is ``Â_L · ... · Â_2 · Â_1``. Row ``i`` then says how
    much of token ``i``'s final representation flows from each input token.

    Args:
        weights: per layer, ``(..., H, T, T)`` (first layer first).
        residual: weight of the identity (the residual connection); 0.5 in the paper.
        head_fusion: ``"mean"`` (the paper), ``"max"`` or ``"min"`` over heads.

    Shapes:
        returns ``(..., T, T)``, rows summing to 1.

    Raises:
        ValueError: for no layers, non-square weights, or ``residual`` outside [0, 1].
    """
    if not weights:
        raise ValueError("attention_rollout needs the weights of at least one layer")
    if not 0.0 <= residual <= 1.0:
        raise ValueError(f"residual must be in [0, 1], got {residual}")
    out = torch.empty(0)
    for i, w in enumerate(weights):
        if w.dim() < 3 or w.shape[-1] != w.shape[-2]:
            raise ValueError(
                f"rollout needs square self-attention weights (..., H, T, T); layer {i} has "
                f"shape {tuple(w.shape)}"
            )
        a = fuse_heads(w.double(), head_fusion)  # (..., T, T)
        eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
        a = residual * eye + (1.0 - residual) * a
        a = a / a.sum(dim=-1, keepdim=True).clamp_min(1e-12)
        out = a if i == 0 else a @ out
    return out.to(weights[0].dtype)


def head_scores(weights: Sequence[Tensor], query: int, keys: Sequence[int]) -> Tensor:
    """Weight from one query token to some key tokens (summed), for every layer and head.

    Args:
        weights: per layer, ``(H, T, S)`` (one sequence).
        query: the query index ``i``. keys: key indices ``j`` (e.g. a word's sub-word tokens).

    Shapes:
        returns ``(L, H)``: ``sum_j weights[l][h, i, j]``.

    Raises:
        ValueError: for an index out of range or weights that are not ``(H, T, S)``.
    """
    if not weights:
        raise ValueError("head_scores needs the weights of at least one layer")
    if any(w.dim() != 3 for w in weights):
        shapes = [tuple(w.shape) for w in weights]
        raise ValueError(f"weights must be (H, T, S) per layer, got shapes {shapes}")
    _, T, S = weights[0].shape
    if not 0 <= query < T:
        raise ValueError(f"query index {query} is out of range: valid 0..{T - 1}")
    bad = [j for j in keys if not 0 <= j < S]
    if bad or not keys:
        raise ValueError(f"key indices {list(keys)} must be non-empty and within 0..{S - 1}")
    idx = torch.tensor(list(keys), device=weights[0].device)
    return torch.stack([w[:, query].index_select(-1, idx).sum(-1) for w in weights])  # (L, H)


def rank_heads(scores: Tensor, top: int | None = None) -> list[tuple[int, int, float]]:
    """``(layer, head, score)`` sorted by score, highest first (the ``top`` first, or all).

    Shapes:
        scores ``(L, H)`` as from :func:`head_scores`.
    """
    H = scores.shape[1]
    order = torch.argsort(scores.flatten(), descending=True, stable=True).tolist()
    ranked = [(i // H, i % H, float(scores.flatten()[i])) for i in order]
    return ranked if top is None else ranked[:top]


__all__ = [
    "HeadFusion",
    "attention_rollout",
    "collect_attention",
    "fuse_heads",
    "group_by_stack",
    "head_scores",
    "rank_heads",
    "record_attention",
    "stack_of",
]
