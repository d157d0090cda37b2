"""The explorer as one self-contained HTML file: :func:`explore_html`.

The page of ``static/`` with its style sheet and script inlined and the data embedded in a
``<script type="application/json" id="explore-data">`` block: the model's info, one
:meth:`~attnlab.explore.data.Explorer.analyze` result and every layer's queries, keys and scores
(:meth:`~attnlab.explore.data.Explorer.qk`), from which the script computes the neuron view with
the same arithmetic as the server. Nothing is fetched: the file opens offline, in a notebook
(``IPython.display.HTML``) or attached to a paper. The head, model and neuron views, rollout, the
logit lens, ``[MASK]`` filling and the cost panel are shown; the input and the next-token
controls need the server.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from attnlab.explore.data import Explorer

_LINK = '<link rel="stylesheet" href="/static/explore.css">'
_SCRIPT = '<script src="/static/explore.js"></script>'


def _static(name: str) -> str:
    from attnlab.explore.server import STATIC

    return (STATIC / name).read_text(encoding="utf-8")


def embedded_json(data: Any) -> str:
    """``data`` as JSON that cannot end the ``<script>`` element holding it."""
    text = json.dumps(data, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def explore_html(
    explorer: Explorer, text: str | None = None, *, ids: Sequence[int] | None = None,
    target: str | None = None, image: Any = None, sample: int | None = None,
) -> str:  # fmt: skip
    """The static explorer page for one input (exactly one of ``text`` and ``ids``; for an
    encoder-decoder they are the source and ``target`` the decoder input after BOS; for a ViT
    exactly one of ``image`` (``{"shape": [H, W, C], "data": base64 uint8}``) and ``sample``,
    an index into its data set's test split).

    Raises:
        ValueError, TypeError: as :meth:`~attnlab.explore.data.Explorer.encode` (a ViT: as
            :meth:`~attnlab.explore.data.Explorer.read_image`).
    """
    from attnlab.explore.seq2seq import encode_target

    seq: Any
    if explorer.vision:
        if text is not None or ids is not None or target is not None:
            raise ValueError(
                f"a {type(explorer.model).__name__}'s page shows an image: give image or sample, "
                "not text"
            )
        seq = explorer.read_image(image, sample)
    else:
        if image is not None or sample is not None:
            raise ValueError(f"image and sample are for image models, not {explorer.family}")
        seq = explorer.encode(text, None if ids is None else list(ids))
    if target is not None and not explorer.seq2seq:
        raise ValueError("target is for encoder-decoder models")
    tgt = encode_target(explorer, target) if explorer.seq2seq else None
    data = {
        "info": explorer.info(),
        "text": text if text is not None else "",
        "target": target or "",
        "input": {"sample": sample} if sample is not None else None,
        "analysis": explorer.analyze(ids=seq, target=tgt),
        "qk": explorer.qk(seq, tgt),
    }
    page, css, js = _static("index.html"), _static("explore.css"), _static("explore.js")
    if "</script" in js.lower() or "</style" in css.lower():  # would end the inlined element
        raise ValueError("the page's script or style sheet holds a closing tag")
    page = page.replace(_LINK, f"<style>\n{css}</style>")
    blob = f'<script type="application/json" id="explore-data">{embedded_json(data)}</script>'
    page = page.replace(_SCRIPT, f"{blob}\n<script>\n{js}</script>")
    return page.replace(
        "<title>attnlab explore</title>",
        f"<title>attnlab explore: {_escape(explorer.name)}</title>",
    )


def _escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


__all__ = ["embedded_json", "explore_html"]
