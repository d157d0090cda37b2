"""A token embedding whose table is quantized (row look-ups into an int8 / int4 table).

:class:`QuantizedEmbedding` reads its rows from one of the quantized linears of
:mod:`attnlab.transforms.quant_modules`, possibly the quantized LM head itself, so that a head
tied to the embedding (§3.4: "we share the same weight matrix between the two embedding layers
and the pre-softmax linear transformation") stays tied after quantization. Only the rows looked
up are dequantized.

Shapes: ids ``(B, T)`` -> ``(B, T, E)``; the table is ``(V, E)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.transforms.quant_modules import QuantizedLinear


class QuantizedEmbedding(nn.Module):
    """Token ids -> rows of a quantized ``(V, E)`` table, dequantized to float32 and multiplied
    by ``scale`` (as :class:`attnlab.layers.embedding.TokenEmbedding`).

    Args:
        table: the quantized table; pass the quantized LM head itself to keep a tie.
        scale: the embedding multiplier (``sqrt(E)`` in the paper, 1 for GPT/BERT).
        padding_idx: kept for reference (no gradient flows through a quantized table).

    Shapes: ids ``(B, T)`` -> ``(B, T, E)``.
    """

    def __init__(
        self, table: QuantizedLinear, *, scale: float = 1.0, padding_idx: int | None = None
    ) -> None:
        super().__init__()
        self.table = table
        self.vocab_size, self.d_model = table.out_features, table.in_features
        self.scale, self.padding_idx = scale, padding_idx

    @classmethod
    def from_embedding(cls, embedding: nn.Module, table: QuantizedLinear) -> QuantizedEmbedding:
        """A quantized stand-in for ``embedding`` (a ``TokenEmbedding`` or ``nn.Embedding``)
        reading ``table``.

        Raises:
            ValueError: if the table's shape is not the embedding's.
        """
        weight = embedding.weight
        if not isinstance(weight, Tensor):
            raise ValueError(f"{type(embedding).__name__} has no weight tensor to replace")
        if (table.out_features, table.in_features) != tuple(weight.shape):
            raise ValueError(
                f"table ({table.out_features}, {table.in_features}) does not match the "
                f"embedding {tuple(weight.shape)}"
            )
        scale = float(getattr(embedding, "scale", 1.0))
        return cls(table, scale=scale, padding_idx=getattr(embedding, "padding_idx", None))

    def forward(self, ids: Tensor) -> Tensor:
        """ids ``(B, T)`` int -> ``(B, T, E)`` float32.

        Raises:
            ValueError: for a non-integer tensor or ids outside ``[0, V)``.
        """
        if ids.is_floating_point() or ids.dtype == torch.bool:
            raise ValueError(f"token ids must be an integer tensor, got dtype {ids.dtype}")
        if ids.numel():
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= self.vocab_size:
                bad = lo if lo < 0 else hi
                raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        rows = self.table.dequantize_rows(ids.reshape(-1))  # (B·T, E)
        emb = rows.reshape(*ids.shape, self.d_model)  # (B, T, E)
        return emb * self.scale if self.scale != 1.0 else emb

    def extra_repr(self) -> str:
        return f"{self.vocab_size}, {self.d_model}, scale={self.scale:.4g}, bits={self.table.bits}"


__all__ = ["QuantizedEmbedding"]
