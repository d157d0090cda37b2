"""The logit lens and direct logit attribution: reading predictions off the residual stream.

:func:`logit_lens` (nostalgebraist 2020) applies the model's read-out (the final norm, then the
unembedding) to the residual stream before the first layer and after every layer: what the model
would predict if it stopped there. After the last layer it *is* the model's logits.

:func:`direct_logit_attribution` splits one logit (or a logit difference) into what each
component writes into the residual stream: the embeddings, every attention head (``z_h`` times
its slice of W^O), each attention bias, each FFN, and the read-out's biases. In a pre-norm stack
the final residual is exactly the sum of those terms. The final norm is not linear; its scale is
taken from the actual final residual and held fixed (LayerNorm: each term is centred, divided by
the residual's ``sqrt(var + eps)`` and multiplied by γ, and β is a term of its own; RMSNorm: each
term is divided by the residual's ``sqrt(mean(x²) + eps)`` and multiplied by γ). With that scale
the decomposition is exact: the terms sum to the logit (difference) the model computes, up to
float64 rounding of float32 inputs. Post-norm stacks (BERT, the paper's Transformer) renormalise
after every sublayer, so there the logit is no sum of per-component terms and the function
refuses.

Shapes: L layers, B batch, T positions, P chosen positions, E d_model, H heads, D head dim,
V vocabulary, C components.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from attnlab.inspect.cache import ActivationCache, run_with_cache
from attnlab.inspect.points import layout_of
from attnlab.layers.blocks import DecoderLayer, EncoderLayer
from attnlab.layers.multihead import MultiHeadAttention
from attnlab.layers.norm import LayerNorm, RMSNorm
from attnlab.models.family import Readout


def _readout(model: nn.Module) -> Readout:
    """The read-out the model's family declares (its hook layout's).

    Raises:
        TypeError: for a model that is no language model. ValueError: for a language model
            built without its head (a BERT without the MLM head).
    """
    layout = layout_of(model)
    if layout.readout is not None:
        return layout.readout
    if layout.no_readout is not None:
        raise ValueError(f"the logit lens needs an LM head: {layout.no_readout}")
    raise TypeError(
        f"the logit lens needs a language model (a causal LM, a masked LM with its head, an "
        f"encoder-decoder), got {type(model).__name__}"
    )


def _positions(T: int, positions: int | Sequence[int] | None) -> list[int]:
    chosen = list(range(T)) if positions is None else [positions] if isinstance(
        positions, int
    ) else [int(p) for p in positions]  # fmt: skip
    bad = [p for p in chosen if not -T <= p < T]
    if bad or not chosen:
        raise ValueError(f"positions {bad or chosen} are out of range for {T} tokens")
    return [p % T for p in chosen]


@dataclass(frozen=True)
class LogitLens:
    """Next-token logits read from the residual stream before the first and after every layer.

    Attributes:
        logits: ``(L + 1, B, P, V)``: row 0 reads the embeddings (the stream entering layer 0),
            row ``l + 1`` the stream leaving layer ``l``; the last row equals the model's logits.
        labels: ``("embed", "layer 0", ..., "layer L-1")``.
        positions: the P positions read.
    """

    logits: Tensor
    labels: tuple[str, ...]
    positions: tuple[int, ...]

    def probs(self) -> Tensor:
        """Softmax of :attr:`logits` over the vocabulary (float32)."""
        return torch.softmax(self.logits.float(), dim=-1)

    def top(
        self, k: int = 5, *, batch: int = 0, position: int = -1
    ) -> list[list[tuple[int, float]]]:
        """Per row (embed, layer 0, ...): the ``k`` most likely ``(token id, probability)`` at
        one of the read positions (index into :attr:`positions`).

        Raises:
            ValueError: for ``k < 1``.
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        p = self.probs()[:, batch, position]  # (L + 1, V)
        values, ids = p.topk(min(k, p.shape[-1]), dim=-1)
        return [
            [(int(i), float(v)) for i, v in zip(ids[r], values[r], strict=True)]
            for r in range(p.shape[0])
        ]


@torch.no_grad()
def logit_lens(
    model: nn.Module, *args: Any, positions: int | Sequence[int] | None = None, **kwargs: Any
) -> LogitLens:
    """The logit lens of one forward pass ``model(*args, **kwargs)``.

    Args:
        model: a GPT, an encoder-decoder (its decoder stack is read) or a BERT with an MLM head.
        args, kwargs: the forward's inputs (``ids``; ``src, tgt``).
        positions: positions to read (default all; an int or a list; negative from the end).

    Raises:
        TypeError: for a model without an LM head. ValueError: for positions out of range.
    """
    r = _readout(model)
    L = len(r.layers)
    names = [f"{r.prefix}layers.0.resid_pre"] + [
        f"{r.prefix}layers.{i}.resid_post" for i in range(L)
    ]
    _, cache = run_with_cache(model, *args, names=names, **kwargs)
    T = cache[names[0]].shape[1]
    pos = _positions(T, positions)
    rows = []
    for name in names:
        x = cache[name] if positions is None else cache[name][:, pos]  # (B, P, E)
        rows.append(r.head(r.norm(x) if r.norm is not None else x))  # (B, P, V)
    labels = ("embed", *(f"layer {i}" for i in range(L)))
    return LogitLens(torch.stack(rows), labels, tuple(pos))


@dataclass(frozen=True)
class LogitAttribution:
    """A logit (difference) split into what each component writes into the residual stream.

    Attributes:
        contributions: ``(C, B)`` float64, one row per component (``labels``).
        labels: ``"embed"``, ``"L{l}.H{h}"`` (heads), ``"L{l}.attn_bias"``, ``"L{l}.X{h}"`` and
            ``"L{l}.cross_bias"`` (cross-attention), ``"L{l}.ffn"``, ``"norm_bias"``,
            ``"head_bias"``.
        total: ``(B,)`` the logit (difference) of the model's own output.
        n_layers, n_heads: for :meth:`heads`.
    """

    contributions: Tensor
    labels: tuple[str, ...]
    total: Tensor
    n_layers: int
    n_heads: int

    def heads(self) -> Tensor:
        """``(L, H, B)``: the self-attention heads' contributions."""
        idx = [
            self.labels.index(f"L{li}.H{h}")
            for li in range(self.n_layers)
            for h in range(self.n_heads)
        ]
        return self.contributions[idx].reshape(self.n_layers, self.n_heads, -1)

    def error(self) -> Tensor:
        """``(B,)``: ``total - contributions.sum(0)`` (rounding only, for a pre-norm stack)."""
        return self.total - self.contributions.sum(dim=0)


def _norm_scale(norm: nn.Module | None, x: Tensor) -> tuple[Tensor, bool]:
    """The frozen per-row scale of the final norm ``(B, 1)`` and whether terms are centred."""
    if norm is None:
        return torch.ones_like(x[..., :1]), False
    if isinstance(norm, LayerNorm):
        var = x.var(dim=-1, unbiased=False, keepdim=True)
        return torch.rsqrt(var + norm.eps), True
    if isinstance(norm, RMSNorm):
        return torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps), False
    raise ValueError(
        f"direct logit attribution knows LayerNorm and RMSNorm, not {type(norm).__name__}"
    )


def _direction(head: nn.Module, target: int, other: int | None) -> tuple[Tensor, Tensor]:
    """``W_U[target] - W_U[other]`` ``(E,)`` float64 and the same of the head's bias."""
    if not isinstance(head, nn.Linear):
        raise ValueError(
            f"direct logit attribution needs a linear unembedding, got {type(head).__name__}"
        )
    V = head.out_features
    for name, tok in (("target", target), ("other", other)):
        if tok is not None and not 0 <= tok < V:
            raise ValueError(f"{name} token {tok} is outside the vocabulary [0, {V})")
    w = head.weight.double()
    d = w[target] - (w[other] if other is not None else 0.0)
    b = head.bias.double() if head.bias is not None else torch.zeros(V, dtype=torch.float64)
    return d, b[target] - (b[other] if other is not None else 0.0)


def _terms(
    layer: EncoderLayer | DecoderLayer, cache: ActivationCache, name: str, pos: int
) -> list[tuple[str, Tensor]]:
    """The ``(label, (B, E) float64)`` terms one layer adds to the residual stream at ``pos``."""
    i = int(name.split(".")[-1])
    out: list[tuple[str, Tensor]] = []
    attns: list[tuple[str, str, MultiHeadAttention, str]] = [
        ("H", "attn", layer.self_attn, "attn_bias")
    ]
    if isinstance(layer, DecoderLayer) and layer.cross_attn is not None:
        attns.append(("X", "cross_attn", layer.cross_attn, "cross_bias"))
    for tag, site, attn, bias_label in attns:
        z = cache[f"{name}.{site}.z"][:, pos].double()  # (B, H, D)
        E, H, D = attn.d_model, attn.n_heads, attn.d_head
        w = attn.out_proj.weight.double().view(E, H, D)  # (E, H, D): W^O's columns by head
        per_head = torch.einsum("bhd,ehd->hbe", z, w)  # (H, B, E)
        out += [(f"L{i}.{tag}{h}", per_head[h]) for h in range(H)]
        if attn.out_proj.bias is not None:
            out.append((f"L{i}.{bias_label}", attn.out_proj.bias.double().expand_as(per_head[0])))
    out.append((f"L{i}.ffn", cache[f"{name}.ffn.out"][:, pos].double()))
    return out


def _pre_norm_layers(model: nn.Module, r: Readout) -> list[EncoderLayer | DecoderLayer]:
    """The read stack's layers, checked: a linear read-out, eval mode, pre-norm layers."""
    if not r.linear:
        raise ValueError(
            f"direct logit attribution needs a linear read-out; {type(model).__name__}'s head "
            f"({type(r.head).__name__}) is not"
        )
    if model.training:
        raise ValueError(
            "direct logit attribution needs eval mode (dropout breaks the sum): model.eval()"
        )
    layers = [layer for layer in r.layers if isinstance(layer, EncoderLayer | DecoderLayer)]
    if len(layers) != len(r.layers) or not all(layer.pre_norm for layer in layers):
        raise ValueError(
            "direct logit attribution needs a pre-norm stack: post-norm layers renormalise the "
            "residual stream after every sublayer, so the logit is no sum of component terms"
        )
    return layers


@torch.no_grad()
def direct_logit_attribution(
    model: nn.Module,
    *args: Any,
    target: int,
    other: int | None = None,
    position: int = -1,
    **kwargs: Any,
) -> LogitAttribution:
    """Each component's direct contribution to ``logit[target] - logit[other]`` at ``position``.

    Args:
        model: a pre-norm GPT or encoder-decoder (its decoder), in eval mode.
        args, kwargs: the forward's inputs.
        target: the token whose logit is explained. other: subtract this token's logit
            (a logit difference, the usual metric); ``None`` explains the logit itself.
        position: the position read (negative from the end).

    Returns:
        A :class:`LogitAttribution` whose contributions sum to :attr:`LogitAttribution.total`.

    Raises:
        ValueError: for a post-norm stack, tokens outside the vocabulary, a position out of
            range, or a model in training mode (dropout would break the sum).
        TypeError: for a model without an LM head.
    """
    r = _readout(model)
    layers = _pre_norm_layers(model, r)
    p = r.prefix
    names = [f"{p}layers.0.resid_pre", f"{p}layers.{len(layers) - 1}.resid_post"]
    names += [f"{p}layers.*.ffn.out", f"{p}layers.*.attn.z"]
    if any(isinstance(layer, DecoderLayer) and layer.cross_attn is not None for layer in layers):
        names.append(f"{p}layers.*.cross_attn.z")
    out, cache = run_with_cache(model, *args, names=names, **kwargs)
    pos = _positions(cache[names[0]].shape[1], position)[0]
    d, bias = _direction(r.head, target, other)
    final = cache[names[1]][:, pos].double()  # (B, E)
    scale, centre = _norm_scale(r.norm, final)  # (B, 1): the final norm's scale, held fixed
    gamma = cast(Tensor, r.norm.weight).double() if r.norm is not None else torch.ones_like(d)
    terms = [("embed", cache[names[0]][:, pos].double())]
    for i, layer in enumerate(layers):
        terms += _terms(layer, cache, f"{p}layers.{i}", pos)
    rows = [((t - t.mean(-1, keepdim=True) if centre else t) * scale * gamma) @ d for _, t in terms]
    labels = [label for label, _ in terms]
    beta = getattr(r.norm, "bias", None)
    if beta is not None:
        rows.append((beta.double() @ d).expand(final.shape[0]))
        labels.append("norm_bias")
    if getattr(r.head, "bias", None) is not None:
        rows.append(bias.expand(final.shape[0]))
        labels.append("head_bias")
    logits = (out[0] if isinstance(out, tuple) else out)[:, pos].double()  # (B, V)
    total = logits[:, target] - (logits[:, other] if other is not None else 0.0)
    H = layers[0].self_attn.n_heads
    return LogitAttribution(torch.stack(rows), tuple(labels), total, len(layers), H)


__all__ = ["LogitAttribution", "LogitLens", "direct_logit_attribution", "logit_lens"]
