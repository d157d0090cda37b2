"""An explicit key/value cache for autoregressive decoding, passed through ``forward``.

Self-attention caches are preallocated to ``max_len`` on their first write (so decoding does not
reallocate) and grow by ``T`` tokens per call; a layer with a causal sliding window of ``w`` keys
keeps only the last ``w - 1`` keys instead (all that a future query can see), so its memory stays
constant however long the sequence grows; cross-attention caches hold the encoder memory's
keys/values, computed once and reused at every step. Keys are cached *after* RoPE, so cached
positions never need re-rotating. With grouped-query attention the cache stores the ``H_kv`` heads.

:meth:`LayerKVCache.truncate` rolls a cache back to an earlier length (speculative decoding
discards the keys of rejected draft tokens). A windowed cache can only step back as far as the
keys it kept: built with ``rollback=r`` it keeps ``r`` keys more than its window needs, so any
truncation by at most ``r`` positions (since the last update) works; the extra keys lie outside
the window and the attention's band masks them out.

Shapes: B batch, H_kv key/value heads, L max_len, S cached length, D head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor


class LayerKVCache:
    """Keys/values of one self-attention layer, preallocated to ``max_len``.

    Args:
        max_len: most positions the layer will ever see (absolute positions stay below it).
        window: the layer's causal sliding window ``w``; the cache then keeps only the last
            ``w - 1 + rollback`` keys/values (``None``: keep everything).
        rollback: how many positions a windowed cache must be able to :meth:`truncate` away
            (extra keys it keeps); a cache without a window can always truncate.
    """

    def __init__(self, max_len: int, window: int | None = None, rollback: int = 0) -> None:
        if max_len <= 0:
            raise ValueError(f"max_len must be positive, got {max_len}")
        if window is not None and window < 1:
            raise ValueError(f"window must be positive, got {window}")
        if isinstance(rollback, bool) or not isinstance(rollback, int) or rollback < 0:
            raise ValueError(f"rollback must be a non-negative integer, got {rollback!r}")
        self.max_len = max_len
        self.window = window
        self.rollback = rollback
        self.length = 0  # tokens seen so far (absolute), also with a window
        self._start = 0  # absolute position of the first kept key (windowed caches)
        self.k: Tensor | None = None  # (B, H_kv, L, D)
        self.v: Tensor | None = None  # (B, H_kv, L, D)

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``T`` new positions and return all cached keys/values so far.

        Shapes:
            k, v ``(B, H_kv, T, D)`` -> ``(B, H_kv, S + T, D)`` each (views into the buffer).

        Raises:
            ValueError: if the cache would exceed ``max_len`` or shapes change between calls.
        """
        B, H_kv, T, D = k.shape
        if self.window is not None:
            return self._update_window(k, v)
        if self.k is None or self.v is None:
            self.k = k.new_zeros(B, H_kv, self.max_len, D)
            self.v = v.new_zeros(B, H_kv, self.max_len, v.shape[-1])
        elif self.k.shape[:2] != (B, H_kv) or self.k.shape[-1] != D:
            raise ValueError(
                f"cache holds (B, H_kv, D) = ({self.k.shape[0]}, {self.k.shape[1]}, "
                f"{self.k.shape[-1]}), got new keys of shape {tuple(k.shape)}"
            )
        end = self.length + T
        if end > self.max_len:
            raise ValueError(
                f"KV cache overflow: {self.length} cached + {T} new > max_len={self.max_len}"
            )
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def _update_window(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Rolling variant: attend over the kept keys + the new ones, then keep the last w - 1."""
        T = k.shape[2]
        if self.length + T > self.max_len:
            raise ValueError(
                f"KV cache overflow: {self.length} seen + {T} new > max_len={self.max_len}"
            )
        if self.k is not None and self.v is not None:
            k = torch.cat((self.k, k), dim=2)  # (B, H_kv, kept + T, D)
            v = torch.cat((self.v, v), dim=2)
        keep = min(int(self.window or 1) - 1 + self.rollback, k.shape[2])
        self.k, self.v = k[:, :, k.shape[2] - keep :], v[:, :, v.shape[2] - keep :]
        self.length += T
        self._start = self.length - keep
        return k, v

    def truncate(self, length: int) -> None:
        """Forget every position from ``length`` on, as if only ``length`` tokens had been fed.

        The preallocated buffer is kept (later updates overwrite the forgotten part); a windowed
        cache drops its keys past ``length``.

        Raises:
            ValueError: if ``length`` is negative or beyond what the cache holds, or a windowed
                cache no longer holds the keys a query at ``length`` would see (build it with a
                larger ``rollback``).
        """
        if isinstance(length, bool) or not isinstance(length, int):
            raise ValueError(f"length must be an integer, got {length!r}")
        if not 0 <= length <= self.length:
            raise ValueError(
                f"cannot truncate to {length}: the cache holds {self.length} positions"
            )
        if length == 0:  # forgetting everything always works
            if self.window is not None:
                self.k = self.v = None
                self._start = 0
        elif self.window is not None and self.k is not None and self.v is not None:
            needed = max(0, length - (self.window - 1))  # first key a query at `length` sees
            if needed < self._start:
                raise ValueError(
                    f"cannot truncate a window-{self.window} cache from {self.length} to {length}: "
                    f"it kept keys from position {self._start} only (rollback={self.rollback}; "
                    f"needs rollback >= {self.length - length})"
                )
            self.k = self.k[:, :, : length - self._start]
            self.v = self.v[:, :, : length - self._start]
        self.length = length

    def key_positions(self, T: int, device: torch.device | str | None = None) -> Tensor:
        """Absolute positions of the keys that :meth:`update` with ``T`` new tokens returns.

        Shapes:
            returns ``(S,)``: ``0 .. length + T - 1``, or only the kept window and the new tokens.
        """
        return torch.arange(self.key_start, self.length + T, device=device)

    @property
    def key_start(self) -> int:
        """Absolute position of the first key the next :meth:`update` returns."""
        return 0 if self.window is None else self._start

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search). index ``(B',)`` int.

        A same-size index (a beam reorder) moves only the filled part of the preallocated
        buffer, in place; a new batch size (repeating rows) allocates a new buffer.
        """
        if self.k is None or self.v is None:
            return
        in_place_ok = not self.k.is_inference() or torch.is_inference_mode_enabled()
        if self.window is None and index.numel() == self.k.shape[0] and in_place_ok:
            n = self.length
            self.k[:, :, :n] = self.k[:, :, :n].index_select(0, index)
            self.v[:, :, :n] = self.v[:, :, :n].index_select(0, index)
            return
        self.k = self.k.index_select(0, index)
        self.v = self.v.index_select(0, index)


class CrossKVCache:
    """Keys/values of the encoder memory for one cross-attention layer, computed once."""

    def __init__(self) -> None:
        self.k: Tensor | None = None  # (B, H_kv, S, D)
        self.v: Tensor | None = None

    @property
    def is_set(self) -> bool:
        return self.k is not None

    def set(self, k: Tensor, v: Tensor) -> None:
        self.k, self.v = k, v

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search). index ``(B',)`` int."""
        if self.k is not None and self.v is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)


class KVCache:
    """The cache of a whole model: one :class:`LayerKVCache` per layer (+ cross caches).

    Args:
        n_layers: number of (decoder) layers.
        max_len: maximum number of positions the self-attention caches hold.
        cross_attention: also keep a :class:`CrossKVCache` per layer (encoder-decoder models).
        windows: per-layer causal sliding windows (``None`` entries keep everything).
        rollback: positions every windowed layer must be able to :meth:`truncate` away.
    """

    def __init__(
        self,
        n_layers: int,
        max_len: int,
        *,
        cross_attention: bool = False,
        windows: list[int | None] | None = None,
        rollback: int = 0,
    ) -> None:
        if windows is not None and len(windows) != n_layers:
            raise ValueError(f"windows has {len(windows)} entries for {n_layers} layers")
        ws = windows or [None] * n_layers
        self.self_attn = [LayerKVCache(max_len, w, rollback) for w in ws]
        self.cross_attn = [CrossKVCache() for _ in range(n_layers)] if cross_attention else None
        self.max_len = max_len

    @property
    def seq_len(self) -> int:
        """Positions cached so far (those of the first layer)."""
        return self.self_attn[0].length if self.self_attn else 0

    def reorder(self, index: Tensor) -> None:
        """Select batch rows in every layer (beam search). index ``(B',)`` int."""
        for c in self.self_attn:
            c.reorder(index)
        for cc in self.cross_attn or []:
            cc.reorder(index)

    def truncate(self, length: int) -> None:
        """Roll every self-attention layer back to ``length`` positions (cross-attention caches
        hold the encoder memory and stay); see :meth:`LayerKVCache.truncate`.

        Raises:
            ValueError: as :meth:`LayerKVCache.truncate`.
        """
        for c in self.self_attn:
            c.truncate(length)

    def layer(self, i: int) -> tuple[LayerKVCache, CrossKVCache | None]:
        """The self- and cross-attention caches of layer ``i``."""
        return self.self_attn[i], (self.cross_attn[i] if self.cross_attn is not None else None)


def positions_for(T: int, cache: LayerKVCache | None, device: torch.device) -> Tensor:
    """Absolute positions of ``T`` new tokens after what ``cache`` holds. Returns ``(T,)``."""
    offset = cache.length if cache is not None else 0
    return torch.arange(offset, offset + T, device=device)
