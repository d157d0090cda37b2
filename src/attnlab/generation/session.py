"""Decoding sessions: one object per generation call that turns "feed these tokens" into logits.

A session hides what differs between model kinds, so the greedy/sampling loop and beam search
are written once. These are the standard sessions of the kinds
(:class:`~attnlab.models.family.Kind`; a family may declare its own, any object with the
:class:`~attnlab.models.family.Session` methods):

- :class:`DecoderOnlySession` (``CAUSAL_LM``, e.g. GPT): the prompt is the prefix; the
  *prefill* runs it through the
  model in one call and fills the :class:`~attnlab.layers.kv_cache.KVCache`; each *step* feeds
  one token per row. Left-padded batches carry a key mask over every column so far and per-row
  positions (padding shifts them); unpadded batches need neither.
- :class:`EncoderDecoderSession` (``SEQ2SEQ``): the source is encoded once; the decoder
  starts from BOS; the
  cache holds the decoder's self-attention keys/values and, after the first step, each layer's
  cross-attention keys/values of the memory.

With ``use_cache=False`` every step recomputes the whole prefix without a cache (the reference
that cached decoding must equal, and the benchmark's baseline). A decoder-only session with a
``window`` (the ``context="slide"`` policy) conditions each token on at most the last
``window`` tokens, as nanoGPT does: while everything fits it decodes with the cache; once the
sequence is longer, each step recomputes the window (positions counted from its first token).

``select(index)`` keeps/reorders/repeats batch rows (beam search, several samples per prompt).

Shapes: B rows, P prompt length, S source length, N max new tokens, V vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attnlab.generation.prompts import Prompts
from attnlab.layers.kv_cache import KVCache
from attnlab.models.family import Session


class DecoderOnlySession:
    """Prefill + one-token steps of a causal LM over a left-padded prompt batch.

    Args:
        model: the model, of a ``CAUSAL_LM`` family (in eval mode; the caller handles modes
            and grad): ``new_cache``, ``hidden_states`` and ``lm_head``.
        prompts: left-padded prompts (:func:`~attnlab.generation.prompts.pack_prompts`).
        max_new_tokens: N; the cache holds ``P + N`` positions.
        use_cache: ``False`` recomputes the whole prefix at every step.
        window: the most tokens a step may see (``None``: all of them).
        runner: what runs ``hidden_states`` and ``lm_head`` (a decode engine,
            :mod:`attnlab.generation.engines`); default the model itself.
    """

    def __init__(
        self,
        model: Any,
        prompts: Prompts,
        max_new_tokens: int,
        use_cache: bool,
        *,
        window: int | None = None,
        runner: Any = None,
    ) -> None:
        self.model: Any = model
        self.runner: Any = model if runner is None else runner
        B, P = prompts.ids.shape
        total = P + max_new_tokens
        device = prompts.ids.device
        self.window = window
        self.length = P  # columns filled so far (prompt + fed tokens)
        fits = window is None or window >= P
        cache_len = total if window is None else min(total, window)
        self.cache: KVCache | None = model.new_cache(cache_len) if use_cache and fits else None
        self.padded = prompts.mask is not None
        # Buffers over all columns; padding only ever sits in the prompt part.
        self.mask = torch.ones(B, total, dtype=torch.bool, device=device)  # (B, P + N)
        self.positions = torch.zeros(B, total, dtype=torch.long, device=device)  # (B, P + N)
        if prompts.mask is not None:
            self.mask[:, :P] = prompts.mask
            self.positions[:, :P] = (prompts.mask.long().cumsum(dim=1) - 1).clamp_min(0)
            self.positions[:, P:] = prompts.lengths[:, None] + torch.arange(
                max_new_tokens, device=device
            )
        else:
            self.positions[:] = torch.arange(total, device=device)
        self.ids = torch.zeros(B, total, dtype=torch.long, device=device)  # (B, P + N)
        self.ids[:, :P] = prompts.ids

    def _logits(self, start: int) -> Tensor:
        """Run columns ``start .. length`` (with the cache, or the whole prefix without)."""
        end = self.length
        if self.window is not None and end > self.window:
            return self._window_logits(end - self.window)
        h = self.runner.hidden_states(
            self.ids[:, start:end],
            mask=self.mask[:, :end] if self.padded else None,
            positions=self.positions[:, start:end] if self.padded else None,
            cache=self.cache,
        )  # (B, end - start, E)
        return self.runner.lm_head(h[:, -1])  # (B, V): only the last column is needed

    def _window_logits(self, start: int) -> Tensor:
        """Recompute columns ``start .. length`` alone (no cache), positions from 0."""
        end = self.length
        self.cache = None  # slid past: the cached keys' positions no longer apply
        mask = self.mask[:, start:end]  # (B, W)
        positions = (mask.long().cumsum(dim=1) - 1).clamp_min(0) if self.padded else None
        h = self.runner.hidden_states(
            self.ids[:, start:end], mask=mask if self.padded else None, positions=positions
        )  # (B, W, E)
        return self.runner.lm_head(h[:, -1])  # (B, V)

    def prefill(self) -> Tensor:
        return self._logits(0)

    def step(self, tokens: Tensor) -> Tensor:
        self.ids[:, self.length] = tokens
        self.length += 1
        return self._logits(self.length - 1 if self.cache is not None else 0)

    def select(self, index: Tensor, *, same_source: bool = False) -> None:
        self.ids = self.ids.index_select(0, index)
        self.mask = self.mask.index_select(0, index)
        self.positions = self.positions.index_select(0, index)
        if self.cache is not None:
            self.cache.reorder(index)


class EncoderDecoderSession:
    """Encode once, then decode from BOS one token at a time.

    Args:
        model: the model, of a ``SEQ2SEQ`` family (in eval mode): ``encode``, ``decode``,
            ``new_cache``, ``default_src_mask``, ``config.bos_id``.
        source: right-padded sources; ``source.mask`` ``None`` means no padding.
        max_new_tokens: N; the decoder sees at most N tokens (BOS + N - 1 generated).
        use_cache: ``False`` re-decodes the whole target prefix at every step.
    """

    def __init__(
        self,
        model: Any,
        source: Prompts,
        max_new_tokens: int,
        use_cache: bool,
    ) -> None:
        self.model: Any = model
        B = source.batch_size
        device = source.ids.device
        self.src_mask = source.mask  # (B, S) or None
        default = model.default_src_mask(source.ids)
        if self.src_mask is None and default is not None and not bool(default.all()):
            # No padding, but real tokens equal to pad_id: encode must not mask them.
            self.src_mask = torch.ones_like(source.ids, dtype=torch.bool)
        self.memory = model.encode(source.ids, src_mask=self.src_mask)  # (B, S, E)
        self.cache: KVCache | None = model.new_cache(max_new_tokens) if use_cache else None
        self.tgt = torch.full(
            (B, max_new_tokens), model.config.bos_id, dtype=torch.long, device=device
        )  # (B, N): BOS, then the generated tokens
        self.length = 1

    def _logits(self, start: int) -> Tensor:
        logits = self.model.decode(
            self.tgt[:, start : self.length],
            self.memory,
            src_mask=self.src_mask,
            cache=self.cache,
        )  # (B, length - start, V)
        return logits[:, -1]

    def prefill(self) -> Tensor:
        return self._logits(0)

    def step(self, tokens: Tensor) -> Tensor:
        self.tgt[:, self.length] = tokens
        self.length += 1
        return self._logits(self.length - 1 if self.cache is not None else 0)

    def select(self, index: Tensor, *, same_source: bool = False) -> None:
        """``same_source=True`` promises every kept row keeps its source (beams of one prompt):
        the memory and the cross-attention caches then stay as they are."""
        self.tgt = self.tgt.index_select(0, index)
        if self.cache is not None:
            if same_source:
                for layer_cache in self.cache.self_attn:
                    layer_cache.reorder(index)
            else:
                self.cache.reorder(index)
        if not same_source:
            self.memory = self.memory.index_select(0, index)
            if self.src_mask is not None:
                self.src_mask = self.src_mask.index_select(0, index)


__all__ = ["DecoderOnlySession", "EncoderDecoderSession", "Session"]
