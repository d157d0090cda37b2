"""The explorer's prediction views: the next-token distribution, one generation step, the logit
lens, and ``[MASK]`` filling.

The distribution is the library's own decoding chain: :func:`attnlab.generation.build_processors`
(temperature, then top-k, top-p, min-p) applied to the model's raw next-token logits, then the
softmax; a temperature of 0 is greedy (all the probability on the arg-max), as in
:func:`attnlab.generation.generate`. A step appends the arg-max or one seeded draw
(:func:`attnlab.generation.processors.select_tokens`) of exactly that distribution.

A GPT's steps carry a KV cache between requests (:class:`StepCache`): a step whose input
extends the sequence a recent step ended on runs only the new tokens through the model, as
:func:`attnlab.generate` does; an edited input (no cached prefix) is run whole. The token chosen
is the same either way (``tests/explore/test_data.py`` compares them). An encoder-decoder's steps
run the decoder input whole (its cross-attention cache is not kept between requests).

Shapes: T tokens, V vocabulary, L layers.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnlab.explore.common import ExplorerState, check_int
from attnlab.generation.processors import build_processors, select_tokens
from attnlab.inspect import logit_lens
from attnlab.layers import KVCache


@dataclass(frozen=True)
class Sampling:
    """The controls of the next-token panel (``None``: that filter is off)."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None

    @classmethod
    def from_request(cls, d: Mapping[str, Any]) -> Sampling:
        """Read and check the controls of a request body.

        Raises:
            ValueError: naming the bad control and its valid range.
        """
        t = d.get("temperature", 1.0)
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
            raise ValueError(f"temperature must be a finite number, got {t!r}")
        if not 0 <= t <= 100:
            raise ValueError(f"temperature must be in [0, 100] (0 = greedy), got {t}")
        k = d.get("top_k")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"top_k must be a positive integer or null, got {k!r}")
        probs = {}
        for name, low_open in (("top_p", True), ("min_p", False)):
            p = d.get(name)
            if p is not None:
                ok = not isinstance(p, bool) and isinstance(p, int | float)
                if not ok or not ((0 < p <= 1) if low_open else (0 <= p <= 1)):
                    bounds = "(0, 1]" if low_open else "[0, 1]"
                    raise ValueError(f"{name} must be a number in {bounds} or null, got {p!r}")
            probs[name] = None if p is None else float(p)
        return cls(float(t), k, probs["top_p"], probs["min_p"])

    def probs(self, logits: Tensor) -> Tensor:
        """``softmax(processors(logits))``; greedy (one-hot at the arg-max) for temperature 0.

        Shapes:
            logits ``(V,)`` -> ``(V,)`` float32.
        """
        chain = build_processors(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p
        )
        processed = chain(logits.float()[None])[0]  # (V,)
        if self.temperature == 0:
            out = torch.zeros_like(processed)
            out[int(processed.argmax())] = 1.0
            return out
        return torch.softmax(processed, dim=-1)


def _top_n(explorer: ExplorerState, n: object) -> int:
    return check_int("n", n, 1, explorer.limits.max_top + 1)


def next_token_view(
    explorer: ExplorerState, logits: Tensor, sampling: Sampling | None = None, n: int = 20
) -> dict[str, Any]:
    """The ``n`` most likely next tokens under ``sampling``: id, text, raw logit, probability.

    Shapes:
        logits ``(V,)``: the model's raw next-token logits.
    """
    s = sampling or Sampling()
    n = _top_n(explorer, n)
    p = s.probs(logits)  # (V,)
    # most probable first; among equal probabilities (e.g. 0 after a filter) the higher logit:
    # a stable sort by probability of the ids already sorted by logit
    by_logit = logits.argsort(descending=True, stable=True)  # (V,)
    by_prob = p[by_logit].argsort(descending=True, stable=True)  # (V,)
    order = by_logit[by_prob][:n].tolist()
    return {
        "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p,
        "kept": int((p > 0).sum()),
        "top": [
            {"id": i, "text": explorer.token_text(i), "logit": float(logits[i]),
             "prob": float(p[i])}
            for i in order
        ],
    }  # fmt: skip


def last_logits(explorer: ExplorerState, ids: list[int], target: list[int] | None = None) -> Tensor:
    """The model's raw next-token logits after ``ids`` (an encoder-decoder: after the decoder
    input ``target`` for the source ``ids``), shape ``(V,)``."""
    with explorer.lock, torch.no_grad():
        logits, _ = explorer.model(*explorer.inputs(ids, target))  # (1, T, V)
    return logits[0, -1].float()


class StepCache:
    """The KV caches of a GPT's last few generation steps, keyed by the sequence each holds.

    :meth:`logits` finds the longest cached sequence that is a prefix of the input, runs only
    the rest of the input through the model with that cache (extending it in place) and keeps
    the result under the input. At most ``size`` sequences are kept (the least recently used
    goes first), each a cache of ``max_tokens`` positions.
    """

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self.entries: OrderedDict[tuple[int, ...], tuple[KVCache, Tensor]] = OrderedDict()
        self.lock = threading.Lock()

    def logits(self, explorer: ExplorerState, ids: list[int]) -> tuple[Tensor, int]:
        """The next-token logits ``(V,)`` after ``ids`` and how many of its tokens came from the
        cache (``len(ids)`` when this very sequence was cached)."""
        key = tuple(ids)
        with explorer.lock, self.lock, torch.no_grad():
            if key in self.entries:
                self.entries.move_to_end(key)
                return self.entries[key][1], len(ids)
            prefix = max(
                (k for k in self.entries if len(k) < len(key) and key[: len(k)] == k),
                key=len, default=None,
            )  # fmt: skip
            if prefix is None:
                cache, reused = explorer.model.new_cache(explorer.max_tokens), 0
            else:
                cache, reused = self.entries.pop(prefix)[0], len(prefix)
            new = torch.tensor([ids[reused:]])  # (1, T_new)
            logits, _ = explorer.model(new, cache=cache)  # (1, T_new, V)
            last = logits[0, -1].float()
            self.entries[key] = (cache, last)
            while len(self.entries) > self.size:
                self.entries.popitem(last=False)
            return last, reused


def _check_lm(explorer: ExplorerState, what: str) -> None:
    if not explorer.language_model:
        raise ValueError(f"{what} needs a language model, not {explorer.family}")


def next_token(
    explorer: ExplorerState, ids: list[int], sampling: Sampling, n: int = 20,
    target: list[int] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """:func:`next_token_view` of the model's logits after ``ids`` (a language model; an
    encoder-decoder's after ``target`` for the source ``ids``)."""
    _check_lm(explorer, "the next-token view")
    return next_token_view(explorer, last_logits(explorer, ids, target), sampling, n)


def step(
    explorer: ExplorerState, ids: list[int], sampling: Sampling, *, sample: bool, seed: int = 0,
    n: int = 20, target: list[int] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Append one token to ``ids`` (an encoder-decoder: to the decoder input ``target``): the
    arg-max, or a draw seeded with ``seed``, of the distribution :func:`next_token` shows.

    Raises:
        ValueError: for a model that is no language model or an input already at the bound.
    """
    _check_lm(explorer, "a generation step")
    seq2seq = explorer.seq2seq
    grown = list(explorer.inputs(ids, target)[-1][0].tolist())
    if len(grown) + 1 > explorer.max_tokens:
        raise ValueError(
            f"the input has {len(grown)} tokens; one more would pass max_tokens="
            f"{explorer.max_tokens}"
        )
    cached = getattr(explorer, "step_cache", None)
    if cached is not None and target is None:
        logits, reused = cached.logits(explorer, list(ids))
    else:
        logits, reused = last_logits(explorer, ids, target), 0
    view = next_token_view(explorer, logits, sampling, n)
    p = sampling.probs(logits)  # (V,)
    generator = torch.Generator().manual_seed(int(seed))
    token = int(select_tokens(p.log()[None], sample=sample, generator=generator)[0])
    new = [*grown, token]
    decoded = new[1:] if seq2seq else new  # a decoder input starts with BOS
    tok = explorer.tokenizer
    text = tok.decode(decoded, skip_special_tokens=seq2seq) if tok is not None else None
    key = "target_ids" if seq2seq else "ids"
    return {
        key: new, "tokens": explorer.tokens(new), "text": text, "chosen": token, "next": view,
        "cache": {"reused": reused, "computed": len(grown) - reused},
    }  # fmt: skip


def lens_view(
    explorer: ExplorerState, ids: Sequence[int], *, position: int = -1, top: int = 5,
    target: list[int] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The logit lens (:func:`attnlab.inspect.logit_lens`) at one position: per row (embed,
    layer 0, ...) the ``top`` tokens and the probability of the model's final choice.

    Raises:
        ValueError: for a position out of range or ``top`` outside ``[1, max_top]``.
    """
    top = _top_n(explorer, top)
    with explorer.lock:
        inputs = explorer.inputs(list(ids), target)  # an encoder-decoder: its decoder is read
        lens = logit_lens(explorer.model, *inputs, positions=position)
    probs = lens.probs()[:, 0, 0]  # (L + 1, V)
    final = int(probs[-1].argmax())
    rows = []
    for label, p in zip(lens.labels, probs, strict=True):
        values, idx = p.topk(min(top, p.shape[-1]))
        rows.append({
            "label": label,
            "top": [{"id": int(i), "text": explorer.token_text(int(i)), "prob": float(v)}
                    for v, i in zip(values, idx, strict=True)],
            "p_final": float(p[final]),
        })  # fmt: skip
    return {"position": lens.positions[0], "final": final, "rows": rows}


def fill_mask(
    explorer: ExplorerState, ids: Sequence[int], logits: Tensor, top: int = 5
) -> list[dict[str, Any]]:
    """Per ``[MASK]`` of the input: the ``top`` tokens of the MLM head and their probabilities.

    Shapes:
        logits ``(T, V)``: the MLM head's logits for the input.
    """
    if explorer.tokenizer is None:
        return []
    try:
        mask_id = int(explorer.tokenizer.token_id("[MASK]"))
    except (KeyError, AttributeError, ValueError):
        return []
    out = []
    for pos, i in enumerate(ids):
        if int(i) == mask_id:
            values, idx = torch.softmax(logits[pos], dim=-1).topk(top)
            out.append({
                "position": pos,
                "top": [{"id": int(j), "text": explorer.token_text(int(j)), "prob": float(v)}
                        for v, j in zip(values, idx, strict=True)],
            })  # fmt: skip
    return out


__all__ = ["Sampling", "fill_mask", "lens_view", "next_token", "next_token_view", "step"]
