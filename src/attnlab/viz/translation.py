"""Cross-attention of a translation: which source subwords each output subword looked at.

:func:`cross_attention` runs the teacher-forced decoder on ``[BOS] + target`` with every layer on
the math path (:func:`~attnlab.viz.capture.collect_attention`) and returns the decoder's
cross-attention weights. Row ``i`` is the query that *produces* output token ``i`` (the last row
produces EOS), so rows are labelled by the produced tokens; columns are the source subwords and
EOS. :func:`plot_cross_attention` draws one layer, averaged over heads or per head.

Shapes: L decoder layers, H heads, T target tokens + 1 (EOS), S source tokens + 1 (EOS).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from attnlab.models.transformer import EncoderDecoderTransformer
from attnlab.translation.tokenizer import TranslationTokenizer
from attnlab.viz.attention import clean_token
from attnlab.viz.capture import collect_attention

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class CrossAttention:
    """Decoder cross-attention of one sentence pair.

    Attributes:
        weights: ``(L, H, T, S)``; each row sums to 1 over the source.
        target_labels: ``T`` produced tokens (the last is ``</s>``).
        source_labels: ``S`` source tokens (the last is ``</s>``).
    """

    weights: Tensor
    target_labels: list[str]
    source_labels: list[str]


@torch.no_grad()
def cross_attention(
    model: EncoderDecoderTransformer, tokenizer: TranslationTokenizer, source: str, target: str
) -> CrossAttention:
    """Cross-attention weights of ``model`` translating ``source`` into ``target`` (e.g. its own
    translation).

    Raises:
        ValueError: for an empty source or a pair longer than the model's ``max_seq_len``.
    """
    src_ids = [*tokenizer.encode(source), tokenizer.eos_id]
    tgt_ids = tokenizer.encode(target)
    if len(src_ids) == 1:
        raise ValueError("the source sentence is empty")
    n = model.config.max_seq_len
    if len(src_ids) > n or len(tgt_ids) + 1 > n:
        raise ValueError(f"source or target longer than the model's max_seq_len={n}")
    device = next(model.parameters()).device
    src = torch.tensor([src_ids], device=device)  # (1, S)
    tgt = torch.tensor([[tokenizer.bos_id, *tgt_ids]], device=device)  # (1, T)
    stacks = collect_attention(model, src, tgt)
    weights = torch.stack([w[0].float().cpu() for w in stacks["cross"]])  # (L, H, T, S)

    def labels(ids: list[int]) -> list[str]:
        return [clean_token(t) for t in tokenizer.tokens(ids)]

    return CrossAttention(weights, labels([*tgt_ids, tokenizer.eos_id]), labels(src_ids))


def plot_cross_attention(
    attention: CrossAttention,
    *,
    layer: int = -1,
    heads: Literal["mean", "all"] = "mean",
    title: str = "",
    path: str | os.PathLike[str] | None = None,
) -> Figure:
    """Heatmap of one decoder layer's cross-attention (rows: output tokens, columns: source).

    Raises:
        ValueError: for a layer out of range or an unknown ``heads``.
    """
    from attnlab.viz.attention_plots import plot_attention

    L = attention.weights.shape[0]
    if not -L <= layer < L:
        raise ValueError(f"layer {layer} is out of range for {L} decoder layers")
    if heads not in ("mean", "all"):
        raise ValueError(f"heads={heads!r} is not valid; choose 'mean' or 'all'")
    w = attention.weights[layer]  # (H, T, S)
    return plot_attention(
        w.mean(0) if heads == "mean" else w,
        attention.target_labels,
        attention.source_labels,
        title=title or f"cross-attention, decoder layer {layer % L} ({heads} of heads)",
        axis_labels=("source token (attended to)", "output token (being produced)"),
        colorbar_label="attention weight",
        annotate=False,
        path=path,
    )


__all__ = ["CrossAttention", "cross_attention", "plot_cross_attention"]
