"""Token embeddings (§3.4): a learned table scaled by sqrt(d_model), and weight tying.

"In our model, we share the same weight matrix between the two embedding layers and the
pre-softmax linear transformation ... In the embedding layers, we multiply those weights by
sqrt(d_model)." Tying is done by :func:`tie_weights`, which makes the output projection reuse the
embedding's parameter.

Shapes: B batch, T tokens, V vocabulary, E d_model.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class TokenEmbedding(nn.Module):
    """Token ids -> vectors, optionally multiplied by sqrt(d_model).

    Args:
        vocab_size: V. d_model: E.
        scale: multiply by sqrt(E) (the paper; BERT/GPT do not).
        padding_idx: optional pad id whose vector is kept at zero and gets no gradient.

    Raises:
        ValueError: for a non-positive size or a ``padding_idx`` outside ``[0, V)``.
    """

    def __init__(
        self, vocab_size: int, d_model: int, *, scale: bool = True, padding_idx: int | None = None
    ) -> None:
        super().__init__()
        if vocab_size < 1 or d_model < 1:
            raise ValueError(
                f"vocab_size and d_model must be positive, got vocab_size={vocab_size}, "
                f"d_model={d_model}"
            )
        if padding_idx is not None and not 0 <= padding_idx < vocab_size:
            raise ValueError(
                f"padding_idx={padding_idx} is outside the vocabulary [0, {vocab_size})"
            )
        self.vocab_size, self.d_model = vocab_size, d_model
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        self.padding_idx = padding_idx
        self.scale = math.sqrt(d_model) if scale else 1.0
        nn.init.normal_(self.weight, std=d_model**-0.5 if scale else 0.02)
        if padding_idx is not None:
            with torch.no_grad():
                self.weight[padding_idx].zero_()

    def forward(self, ids: Tensor) -> Tensor:
        """ids ``(B, T)`` int -> ``(B, T, E)``.

        Raises:
            ValueError: for a non-integer tensor, ids outside ``[0, V)``, or meta ids for
                real weights.
        """
        if ids.is_floating_point() or ids.dtype == torch.bool:
            raise ValueError(f"token ids must be an integer tensor, got dtype {ids.dtype}")
        if ids.device.type == "meta" and self.weight.device.type != "meta":
            # a meta model takes ids anywhere (shapes only); real weights need real ids
            raise ValueError(
                f"token ids are on the meta device (shapes, no values) but the embedding is on "
                f"{self.weight.device}: move them to one device"
            )
        # the range check reads values: under torch.compile that would break the graph, so
        # there an assertion inside the graph stands in (a RuntimeError without the value), and
        # the ids are clamped so that no kernel reads out of bounds before it reports (the
        # compiled embedding's own index check can abort the whole process)
        if ids.numel() and ids.device.type != "meta" and torch.compiler.is_compiling():
            inside = ((ids >= 0) & (ids < self.vocab_size)).all()
            torch._assert_async(
                inside, f"a token id is outside the vocabulary [0, {self.vocab_size})"
            )
            ids = ids.clamp(0, self.vocab_size - 1)
        elif ids.numel() and ids.device.type != "meta":
            lo, hi = (int(t) for t in torch.aminmax(ids))  # one pass over the ids
            if lo < 0 or hi >= self.vocab_size:
                bad = lo if lo < 0 else hi
                raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        emb = nn.functional.embedding(ids, self.weight, padding_idx=self.padding_idx)
        return emb * self.scale if self.scale != 1.0 else emb

    def extra_repr(self) -> str:
        return f"{self.vocab_size}, {self.d_model}, scale={self.scale:.4g}"


def tie_weights(output: nn.Linear, embedding: TokenEmbedding | nn.Embedding) -> None:
    """Make ``output`` (a ``(V, E)`` linear) share its weight with ``embedding`` (§3.4).

    Raises:
        ValueError: if the shapes differ.
    """
    if output.weight.shape != embedding.weight.shape:
        raise ValueError(
            f"cannot tie output weight {tuple(output.weight.shape)} to embedding "
            f"{tuple(embedding.weight.shape)}"
        )
    output.weight = embedding.weight
