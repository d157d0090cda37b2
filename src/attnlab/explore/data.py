"""The explorer's data layer: JSON-able views of one loaded model on one input.

:class:`Explorer` holds a model (GPT, BERT or encoder-decoder), its tokenizer and the input
bounds, and turns an input (text or token ids) into plain dicts the page draws and the tests
compare:

- :meth:`Explorer.analyze`: the tokens, every layer's and head's attention weights (the
  ``layers.L.attn.weights`` hook points of :mod:`attnlab.inspect`, not recomputed), attention
  rollout (:func:`attnlab.viz.capture.attention_rollout`), the cost panel, and for language
  models the next-token distribution and the logit lens, for masked LMs ``[MASK]`` filling;
- :meth:`Explorer.neuron`: eq. (1) of "Attention Is All You Need" step by step for one query and
  key of one head: the per-dimension products ``q_i k_i``, their sum, the scale ``1/sqrt(d_k)``,
  the score the model computed and the softmax row;
- the next-token view, one generation step, the logit lens (:mod:`attnlab.explore.lm`), an
  encoder-decoder's three stacks (:mod:`attnlab.explore.seq2seq`).

Large arrays travel packed (:func:`pack`: float32 little-endian bytes in base64, with their
shape) so a 64-token MiniLM analysis is a few hundred kilobytes, exactly the model's float32
values; :func:`unpack` turns one back into a tensor.

Every public method takes the model lock: the hook points are installed on the one shared model
for the duration of a pass, so concurrent requests are served one pass at a time.

Shapes: L layers, H heads, T tokens, D head dim, V vocabulary.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.explore.common import (
    STACKS,
    ByteTokenizer,
    Limits,
    check_int,
    finite_or_none,
    pack,
    unpack,
)
from attnlab.explore.cost import cost_panel
from attnlab.explore.focus import first_view, special_positions
from attnlab.explore.lm import StepCache, fill_mask, lens_view, next_token_view
from attnlab.explore.seq2seq import analyze_seq2seq
from attnlab.explore.vision import ImageSpec, VisionInput, analyze_image, read_image
from attnlab.inspect import run_with_cache
from attnlab.inspect.points import layout_of
from attnlab.models.family import Family, Kind, families, find_family
from attnlab.viz.capture import attention_rollout


def explorer_family(model: nn.Module) -> Family:
    """The family of a model the explorer shows: one that declares an explorer view
    (:attr:`~attnlab.models.family.Family.explorer`) and its hook points.

    Raises:
        TypeError: for any other model, naming the families the explorer shows.
    """
    family = find_family(model)
    if family is None or family.explorer is None or family.hooks is None:
        shown = ", ".join(f"{f.name} ({f.model.__name__})" for f in families() if f.explorer)
        raise TypeError(f"the explorer shows {shown} models, got {type(model).__name__}")
    return family


def __getattr__(name: str) -> Any:
    """``FAMILIES`` (model class -> view name): deprecated; the explorer reads each family's
    declaration (:func:`explorer_family`)."""
    if name == "FAMILIES":
        import warnings

        warnings.warn(
            "attnlab.explore.data.FAMILIES is deprecated: each family declares its explorer "
            "view (attnlab.models.family.Family.explorer)",
            DeprecationWarning,
            stacklevel=2,
        )
        return {f.model: f.name for f in families() if f.explorer is not None}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Explorer:
    """A model, its tokenizer and the input bounds; the views as JSON-able dicts.

    What it shows follows the model's family (:attr:`~attnlab.models.family.Family.explorer`,
    its :class:`~attnlab.models.family.Kind` and hook layout): attention for every family; the
    next token, a generation step and the logit lens for a causal LM or an encoder-decoder;
    ``[MASK]`` filling for an encoder with a masked-LM head; an image classifier's patch grid.

    Args:
        model: a model whose family declares an explorer view: GPT, BERT, the encoder-decoder
            Transformer, ViT (put in eval mode here). An image classifier's input is an image,
            not text (:mod:`attnlab.explore.vision`).
        tokenizer: an attnlab tokenizer (``encode``/``decode``); ``None`` uses UTF-8 bytes when
            the vocabulary has at least 256 entries, else only ids are accepted.
        name: what the page calls the model.
        limits: the input bounds.
        default_text: the text the page starts with.
        images: a ViT's :class:`~attnlab.explore.vision.ImageSpec` (default: from its config).

    Raises:
        TypeError: for another model family (naming the supported ones).
        ValueError: for a ViT whose tokens per image pass ``limits.max_tokens``.
    """

    def __init__(
        self, model: nn.Module, tokenizer: Any = None, *, name: str = "model",
        limits: Limits | None = None, default_text: str = "", images: ImageSpec | None = None,
    ) -> None:  # fmt: skip
        family = explorer_family(model)
        self.model = model.train(False)
        self.family = family.name  # for messages and info()
        self.kind = family.kind
        self.seq2seq = family.kind is Kind.SEQ2SEQ
        self.causal = family.kind is Kind.CAUSAL_LM  # next token from the prefix's logits
        self.language_model = self.causal or self.seq2seq  # next token, a step, the lens
        layout = layout_of(model)
        self.has_logits = layout.head is not None and family.kind.reads_text
        self.masked_lm = family.kind is Kind.ENCODER and self.has_logits
        self.name = name
        self.default_text = default_text
        self.limits = limits or Limits()
        c: Any = model.config
        self.config: Any = c
        if tokenizer is None and getattr(c, "vocab_size", 0) >= 256:
            tokenizer = ByteTokenizer()
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend", None)
        for method in ("no_padding", "no_truncation"):  # one sequence, never cut silently
            if hasattr(backend, method):
                getattr(backend, method)()
        self.max_tokens = min(self.limits.max_tokens, int(c.max_seq_len))
        self.lock = threading.RLock()
        self.step_cache = StepCache() if self.causal else None
        self.images: ImageSpec | None = None
        self.max_body_bytes = self.limits.max_body_bytes
        self.default_input: dict[str, Any] | None = None  # a ViT's first image (the page's)
        self.vision = not family.kind.reads_text
        if self.vision:
            self.images = images or ImageSpec.for_config(c)
            if c.max_seq_len > self.limits.max_tokens:
                raise ValueError(
                    f"this ViT reads {c.max_seq_len} tokens per image ([CLS] and "
                    f"{c.max_seq_len - 1} patches); max_tokens is {self.limits.max_tokens}: "
                    f"raise it (attnlab explore --max-tokens {c.max_seq_len})"
                )
            self.max_body_bytes = max(self.max_body_bytes, self.images.body_bytes())

    # -- input -------------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """What the page needs before the first input: sizes, capabilities, bounds."""
        c = self.config
        return {
            "name": self.name,
            "family": self.family,
            "kind": self.kind.value,
            "model_type": type(c).model_type,
            "n_layers": c.n_layers,
            "n_heads": c.n_heads,
            "n_kv_heads": c.n_kv_heads or c.n_heads,
            "d_model": c.d_model,
            "d_head": c.d_head,
            "vocab_size": getattr(c, "vocab_size", None),
            "max_tokens": self.max_tokens,
            "max_body_bytes": self.limits.max_body_bytes,
            "max_top": self.limits.max_top,
            "text_input": self.tokenizer is not None,
            "language_model": self.language_model,
            "seq2seq": self.seq2seq,
            "n_decoder_layers": self.n_layers("decoder") if self.seq2seq else None,
            "stacks": list(self.stacks()),
            "masked_lm": self.masked_lm,
            "mask_token": self._mask_token(),
            "default_text": self.default_text,
            "pos_encoding": c.pos_encoding,
            "vision": self._vision_info(),
            "default_input": self.default_input,
        }

    def _vision_info(self) -> dict[str, Any] | None:
        spec = self.images
        if spec is None:
            return None
        return {
            "size": spec.size, "channels": spec.channels, "patch": spec.patch,
            "grid": spec.grid, "dataset": spec.dataset, "classes": spec.classes,
            "n_samples": spec.n_samples(), "pool": self.config.pool,
        }  # fmt: skip

    def read_image(self, image: Any = None, sample: Any = None) -> VisionInput:
        """A ViT's input: an uploaded ``image`` or a test-split ``sample``
        (:func:`attnlab.explore.vision.read_image`).

        Raises:
            ValueError, TypeError: for a model that is no ViT, or a bad image or index.
        """
        if self.images is None:
            raise ValueError(f"images are for image models, not {self.family}: give text or ids")
        return read_image(self.images, image, sample)

    def _mask_token(self) -> str | None:
        if not self.masked_lm or self.tokenizer is None:
            return None
        try:
            self.tokenizer.token_id("[MASK]")
        except (KeyError, AttributeError, ValueError):
            return None
        return "[MASK]"

    def encode(self, text: str | None = None, ids: Sequence[int] | None = None) -> list[int]:
        """The token ids of exactly one of ``text`` and ``ids``, checked against the bounds.

        Raises:
            ValueError: for neither or both, a text without a tokenizer, no tokens, more than
                :attr:`max_tokens` tokens, or ids that are not integers of the vocabulary.
            TypeError: for a ``text`` that is not a string or ``ids`` that are not a list.
        """
        if (text is None) == (ids is None):
            raise ValueError("give exactly one of 'text' and 'ids'")
        if text is not None:
            if not isinstance(text, str):
                raise TypeError(f"'text' must be a string, got {type(text).__name__}")
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer: give 'ids' instead of 'text'")
            if len(text) > 16 * self.max_tokens:  # refuse before tokenizing a huge string
                raise ValueError(
                    f"the text has {len(text)} characters; at most {16 * self.max_tokens} "
                    f"are read (max_tokens={self.max_tokens})"
                )
            out = [int(i) for i in self.tokenizer.encode(text)]
        else:
            if not isinstance(ids, list | tuple):
                raise TypeError(f"'ids' must be a list of integers, got {type(ids).__name__}")
            V = self.config.vocab_size
            for n, i in enumerate(ids):
                check_int(f"ids[{n}]", i, 0, V)
            out = list(ids)
        if not out:
            raise ValueError("the input has no tokens")
        if len(out) > self.max_tokens:
            why = (
                f"max_tokens={self.max_tokens}"
                if self.max_tokens == self.limits.max_tokens
                else f"the model's context, max_seq_len={self.max_tokens}"
            )
            raise ValueError(
                f"the input has {len(out)} tokens; at most {self.max_tokens} are allowed ({why})"
            )
        return out

    def token_text(self, i: int) -> str:
        """How one token id is shown (the tokenizer's token string, else its decoded text)."""
        backend = getattr(self.tokenizer, "backend", None)
        if backend is not None and hasattr(backend, "id_to_token"):
            token = backend.id_to_token(int(i))
            if token is not None:
                return str(token)
        if self.tokenizer is None:
            return str(i)
        try:
            return str(self.tokenizer.decode([int(i)]))
        except (ValueError, KeyError, IndexError):
            return str(i)

    def tokens(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        """``[{"id", "text"}]`` per token."""
        return [{"id": int(i), "text": self.token_text(i)} for i in ids]

    # -- views -------------------------------------------------------------------------------

    def stacks(self) -> tuple[str, ...]:
        """The attention stacks of the model: ``("self",)`` or encoder, decoder, cross."""
        return ("encoder", "decoder", "cross") if self.seq2seq else ("self",)

    def n_layers(self, stack: str = "self") -> int:
        """Layers of one stack."""
        c = self.config
        return int(c.num_decoder_layers if stack in ("decoder", "cross") else c.n_layers)

    def inputs(self, ids: Any, target: list[int] | None = None) -> tuple[Tensor, ...]:
        """The forward's inputs: ``(ids,)``, or ``(src, tgt)`` (target default BOS alone), or a
        ViT's ``(images,)`` for ``ids`` a :class:`~attnlab.explore.vision.VisionInput`.

        Shapes:
            each ``(1, T)``; a ViT's ``(1, C, H, W)``.
        """
        if isinstance(ids, VisionInput):
            if target is not None:
                raise ValueError("a target is for encoder-decoder models")
            return (ids.input,)
        if not self.seq2seq:
            if target is not None:
                raise ValueError("a target is for encoder-decoder models")
            return (torch.tensor([ids]),)
        tgt = [int(self.config.bos_id)] if target is None else target
        return torch.tensor([ids]), torch.tensor([tgt])

    def source_len(self, ids: Any) -> int:
        """Tokens of an input: its ids, or a ViT image's [CLS] and patches."""
        return int(self.config.max_seq_len) if isinstance(ids, VisionInput) else len(ids)

    def _run(self, ids: Any, names: Any, target: list[int] | None = None) -> tuple[Any, Any]:
        with torch.no_grad():
            return run_with_cache(self.model, *self.inputs(ids, target), names=names)

    def attention(self, ids: list[int]) -> Tensor:
        """Every layer's weights from the ``layers.L.attn.weights`` hook points.

        Shapes:
            returns ``(L, H, T, T)`` float32.
        """
        with self.lock:
            _, cache = self._run(ids, "layers.*.attn.weights")
        L = self.config.n_layers
        return torch.stack([cache[f"layers.{i}.attn.weights"][0] for i in range(L)]).float()

    def analyze(
        self, text: str | None = None, ids: Sequence[int] | VisionInput | None = None,
        target: list[int] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Tokens, attention ``(L, H, T, T)``, rollout ``(L, T, T)`` (row ``l``: through layers
        ``0..l``), the cost panel, the view the page opens on (``focus``:
        :func:`attnlab.explore.focus.first_view`) and the family's prediction views, for one
        input (an encoder-decoder's source, ``target`` its decoder input:
        :func:`attnlab.explore.seq2seq.analyze_seq2seq`; a ViT's image, ``ids`` a
        :class:`~attnlab.explore.vision.VisionInput`: :func:`attnlab.explore.vision.analyze_image`).

        Raises:
            ValueError, TypeError: as :meth:`encode`.
        """
        if isinstance(ids, VisionInput):
            if self.images is None or text is not None or target is not None:
                raise ValueError("an image is for a ViT, alone (no text, no target)")
            return analyze_image(self, self.images, ids)
        if self.vision:
            raise ValueError(
                f"a {type(self.model).__name__} reads an image: give 'image' or 'sample', "
                "not text or ids"
            )
        if self.seq2seq:
            return analyze_seq2seq(self, self.encode(text, ids), target)
        if target is not None:
            raise ValueError("a target is for encoder-decoder models")
        seq = self.encode(text, ids)
        has_logits = self.has_logits
        with self.lock:
            names = ["layers.*.attn.weights", "layers.*.attn.v"] + (
                ["logits"] if has_logits else []
            )
            _, cache = self._run(seq, names)
            L = self.config.n_layers
            w = torch.stack([cache[f"layers.{i}.attn.weights"][0] for i in range(L)]).float()
            v = torch.stack([cache[f"layers.{i}.attn.v"][0] for i in range(L)])  # (L, H_kv, T, D)
            rollout = torch.stack([attention_rollout(list(w[: i + 1])) for i in range(L)])
            tokens = self.tokens(seq)
            out: dict[str, Any] = {
                "ids": seq,
                "tokens": tokens,
                "attention": pack(w),  # (L, H, T, T)
                "rollout": pack(rollout),  # (L, T, T)
                "cost": cost_panel(self.config, len(seq)),
                "focus": first_view(  # the head, query and key the page opens on
                    w,
                    v,
                    [t["text"] for t in tokens],
                    special=special_positions(self.config, seq),
                ),
            }
            logits = cache["logits"][0].float() if has_logits else None  # (T, V)
            if self.causal and logits is not None:
                out["next"] = next_token_view(self, logits[-1])
                out["lens"] = lens_view(self, seq, position=len(seq) - 1)
            elif logits is not None:
                out["fill_mask"] = fill_mask(self, seq, logits)
        return out

    def neuron(
        self, ids: Any, layer: int, head: int, query: int, key: int, *,
        stack: str = "self", target: list[int] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Eq. (1) for one (layer, head, query, key): ``q_i k_i`` per dimension, their sum, the
        scale ``1/sqrt(d_k)``, the model's score (the difference to ``sum·scale`` is the
        positional bias, e.g. ALiBi, or a mask: ``None`` when masked) and the softmax row.

        Raises:
            ValueError: for indices out of range (naming the index and its range).
        """
        c = self.config
        if stack not in self.stacks():
            raise ValueError(f"unknown stack {stack!r}; this model has {', '.join(self.stacks())}")
        prefix, queries, keys = STACKS[stack]
        tgt = self.inputs(ids, target)[-1][0]
        length = {"source": self.source_len(ids), "target": len(tgt)}
        check_int("layer", layer, 0, self.n_layers(stack))
        check_int("head", head, 0, c.n_heads)
        check_int("query", query, 0, length[queries])
        check_int("key", key, 0, length[keys])
        names = [f"{prefix.format(l=layer)}.{p}" for p in ("q", "k", "scores", "weights")]
        with self.lock:
            _, cache = self._run(ids, names, target)
        q, k, scores, weights = (cache[n][0] for n in names)
        n_rep = c.n_heads // (c.n_kv_heads or c.n_heads)
        qv = q[head, query].float()  # (D,)
        kv = k[head // n_rep, key].float()  # (D,): query head h reads kv head h // n_rep
        products = qv * kv  # (D,)
        scale = 1.0 / math.sqrt(qv.shape[0])
        dot = float(products.sum())
        score = float(scores[head, query, key])
        finite = math.isfinite(score) and score > torch.finfo(torch.float32).min / 2
        row = scores[head, query].float()
        return {
            "stack": stack,
            "layer": layer, "head": head, "query": query, "key": key, "d_head": int(qv.shape[0]),
            "q": qv.tolist(), "k": kv.tolist(), "products": products.tolist(),
            "dot": dot, "scale": scale, "scaled": dot * scale,
            "score": score if finite else None,
            "bias": (score - dot * scale) if finite else None,
            "masked": not finite,
            "scores_row": [
                finite_or_none(s) if s > torch.finfo(torch.float32).min / 2 else None
                for s in row.tolist()
            ],
            "weights_row": weights[head, query].float().tolist(),
            "weight": float(weights[head, query, key]),
        }  # fmt: skip

    def qk(self, ids: Any, target: list[int] | None = None) -> dict[str, Any]:
        """Every layer's queries, keys and scores per stack (the static page's neuron view).

        Returns:
            ``{stack: {"q": packed (L, H, T, D), "k": packed (L, H_kv, S, D), "scores": packed
            (L, H, T, S) with masked entries at float32's minimum}}``.
        """
        parts = ("q", "k", "scores")
        names = [STACKS[s][0].replace("{l}", "*") + f".{p}" for s in self.stacks() for p in parts]
        with self.lock:
            _, cache = self._run(ids, names, target)
        out: dict[str, Any] = {}
        for stack in self.stacks():
            prefix = STACKS[stack][0]
            out[stack] = {}
            for part in parts:
                layers = range(self.n_layers(stack))
                t = torch.stack([cache[f"{prefix.format(l=i)}.{part}"][0] for i in layers])
                out[stack][part] = pack(t.float().clamp_min(torch.finfo(torch.float32).min))
        return out


__all__ = ["STACKS", "Explorer", "Limits", "check_int", "explorer_family", "pack", "unpack"]
