"""The explorer: an interactive page for looking inside a model (``attnlab explore MODEL``).

- :mod:`~attnlab.explore.data`: :class:`Explorer`, the views as JSON-able dicts (tokens,
  attention from :mod:`attnlab.inspect`, rollout, the neuron view);
  :mod:`~attnlab.explore.common`: :class:`Limits`, :func:`pack` / :func:`unpack`;
- :mod:`~attnlab.explore.seq2seq`: encoder-decoder models (three attention stacks, greedy vs
  beam); :mod:`~attnlab.explore.panels`: positional encodings and masks;
- :mod:`~attnlab.explore.lm`: the next-token distribution (the library's processors), one
  generation step, the logit lens, ``[MASK]`` filling;
- :mod:`~attnlab.explore.vision`: ViT models: an image (a data set's test sample or an upload)
  as patch tokens, the attention over the patch grid, the prediction;
- :mod:`~attnlab.explore.focus`: the view the page opens on (the strongest link between content
  tokens, :func:`~attnlab.explore.focus.first_view`) and the number formatter of its text;
- :mod:`~attnlab.explore.cost`: parameters, FLOPs and crossover lengths (:mod:`attnlab.analysis`);
- :mod:`~attnlab.explore.server`: the local HTTP server (standard library only) and its JSON API;
- :mod:`~attnlab.explore.page`: :func:`explore_html`, the self-contained static page.

The page (``static/``: one HTML, one JS, one CSS file, hand-written, no build step, nothing
fetched from elsewhere) is documented in ``docs/explore.md``.
"""

from attnlab.explore.data import Explorer, Limits, pack, unpack
from attnlab.explore.page import explore_html
from attnlab.explore.server import make_server
from attnlab.explore.vision import ImageSpec

__all__ = ["Explorer", "ImageSpec", "Limits", "explore_html", "make_server", "pack", "unpack"]
