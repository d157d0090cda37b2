"""The explorer for encoder-decoder models: source and decoder input side by side, the three
attention stacks (encoder self-attention, masked decoder self-attention, cross-attention from
the target to the source), and greedy decoding against beam search.

:func:`analyze_seq2seq` is :meth:`~attnlab.explore.data.Explorer.analyze` for an
:class:`~attnlab.models.EncoderDecoderTransformer`: the weights are the hook points
``encoder.layers.L.attn.weights``, ``decoder.layers.L.attn.weights`` and
``decoder.layers.L.cross_attn.weights`` of :mod:`attnlab.inspect`; the next-token view and the
logit lens read the decoder after the decoder input (BOS + the target so far);
:func:`translate` runs :func:`attnlab.generation.generate` (greedy) and
:func:`attnlab.generation.beam_search` on the source.

Shapes: S source tokens, T decoder-input tokens, L layers, H heads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from attnlab.explore.common import STACKS, ExplorerState, check_int, pack
from attnlab.explore.cost import cost_panel
from attnlab.explore.focus import first_view, special_positions
from attnlab.explore.lm import lens_view, next_token_view
from attnlab.generation import beam_search, generate
from attnlab.viz.capture import attention_rollout


def encode_target(
    explorer: ExplorerState, text: str | None = None, ids: Sequence[int] | None = None
) -> list[int] | None:
    """The decoder input: BOS + the tokens of ``text``, or ``ids`` as given (they must start
    with BOS); ``None`` (BOS alone) when both are ``None``.

    Raises:
        ValueError: for both, ids outside the target vocabulary, ids not starting with BOS, or
            more than ``max_tokens`` tokens. TypeError: for a text that is not a string.
    """
    if text is None and ids is None:
        return None
    if text is not None and ids is not None:
        raise ValueError("give at most one of 'target' and 'target_ids'")
    bos, V = int(explorer.config.bos_id), int(explorer.config.target_vocab_size)
    if text is not None:
        if not isinstance(text, str):
            raise TypeError(f"'target' must be a string, got {type(text).__name__}")
        if explorer.tokenizer is None:
            raise ValueError("this model has no tokenizer: give 'target_ids'")
        out = [bos, *(int(i) for i in explorer.tokenizer.encode(text))] if text else [bos]
    else:
        if not isinstance(ids, list | tuple) or not ids:
            raise TypeError("'target_ids' must be a non-empty list of integers")
        out = [check_int(f"target_ids[{n}]", i, 0, V) for n, i in enumerate(ids)]
        if out[0] != bos:
            raise ValueError(f"target_ids must start with BOS ({bos}), got {out[0]}")
    if len(out) > explorer.max_tokens:
        raise ValueError(
            f"the decoder input has {len(out)} tokens; at most {explorer.max_tokens} are allowed"
        )
    return out


def analyze_seq2seq(
    explorer: ExplorerState, src: list[int], target: list[int] | None
) -> dict[str, Any]:
    """Source and decoder-input tokens, the three stacks' weights, the encoder's rollout, the
    cost panel, the encoder view the page opens on (:func:`attnlab.explore.focus.first_view`),
    the next-token view and the logit lens after the decoder input."""
    tgt = list(explorer.inputs(src, target)[-1][0].tolist())
    names = [STACKS[s][0].replace("{l}", "*") + ".weights" for s in explorer.stacks()]
    with explorer.lock:
        _, cache = explorer._run(src, [*names, "encoder.layers.*.attn.v", "logits"], tgt)
        stacks = []
        weights = {}
        for stack in explorer.stacks():
            prefix, queries, keys = STACKS[stack]
            w = torch.stack(
                [cache[f"{prefix.format(l=i)}.weights"][0] for i in range(explorer.n_layers(stack))]
            ).float()  # (L, H, T_q, T_k); fmt: skip
            weights[stack] = w
            stacks.append({"name": stack, "queries": queries, "keys": keys, "attention": pack(w)})
        enc = weights["encoder"]
        n_enc = explorer.n_layers("encoder")
        values = torch.stack([cache[f"encoder.layers.{i}.attn.v"][0] for i in range(n_enc)])
        tokens = explorer.tokens(src)
        rollout = torch.stack([attention_rollout(list(enc[: i + 1])) for i in range(len(enc))])
        logits = cache["logits"][0].float()  # (T, V)
        return {
            "ids": src,
            "tokens": tokens,
            "target_ids": tgt,
            "target_tokens": explorer.tokens(tgt),
            "attention": stacks[0]["attention"],  # the encoder's, as for one-stack models
            "stacks": stacks,
            "rollout": pack(rollout),
            "cost": cost_panel(explorer.config, len(tgt), src_len=len(src)),
            "focus": first_view(  # the page opens on the encoder's most telling link
                enc,
                values,
                [t["text"] for t in tokens],
                special=special_positions(explorer.config, src),
                stack="encoder",
            ),
            "next": next_token_view(explorer, logits[-1]),
            "lens": lens_view(explorer, src, position=len(tgt) - 1, target=tgt),
        }


def translate(
    explorer: ExplorerState, src: list[int], *, num_beams: int = 4, max_new_tokens: int = 32
) -> dict[str, Any]:
    """Greedy decoding and beam search (``num_beams``) of the source ``src``: ids and text.

    Raises:
        ValueError: for ``num_beams`` outside ``[1, 8]`` or ``max_new_tokens`` outside
            ``[1, max_tokens]``.
    """
    check_int("num_beams", num_beams, 1, 9)
    check_int("max_new_tokens", max_new_tokens, 1, explorer.max_tokens + 1)
    with explorer.lock:
        greedy = generate(explorer.model, [src], max_new_tokens=max_new_tokens)[0].tolist()
        beam = beam_search(
            explorer.model, [src], num_beams=num_beams, max_new_tokens=max_new_tokens
        )
    best = beam.sequences[0, : int(beam.lengths[0])].tolist()
    out: dict[str, Any] = {}
    for name, ids in (("greedy", greedy), ("beam", best)):
        text = None
        if explorer.tokenizer is not None:
            text = explorer.tokenizer.decode(ids, skip_special_tokens=True)
        out[name] = {"ids": ids, "tokens": explorer.tokens(ids), "text": text}
    out["beam"]["score"] = float(beam.scores[0])
    out["num_beams"] = num_beams
    return out


__all__ = ["analyze_seq2seq", "encode_target", "translate"]
