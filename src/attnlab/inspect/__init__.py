"""Look inside a running model: named hook points, an activation cache, edits, patching, lenses.

- :mod:`~attnlab.inspect.points`: :func:`hook_names` (the naming table), selecting names;
- :mod:`~attnlab.inspect.cache`: :func:`run_with_cache`, :func:`capture`, :class:`ActivationCache`;
- :mod:`~attnlab.inspect.hooks`: :func:`run_with_hooks`, :func:`hooked`, :func:`add_hooks`;
- :mod:`~attnlab.inspect.edits`: zero/mean ablation of heads, layers and FFN neurons; steering;
- :mod:`~attnlab.inspect.patching`: :func:`activation_patching` -> :class:`PatchingResult`;
- :mod:`~attnlab.inspect.lens`: :func:`logit_lens`, :func:`direct_logit_attribution`.

Works on every Transformer family (GPT, BERT, ViT, CCT, the encoder-decoder), every backend,
and during generation (``with capture(model, names) as cache: generate(model, ...)``). Nothing
is installed on a model while nothing is hooked. Guide: ``docs/inspect.md``.
"""

from attnlab.inspect.cache import ActivationCache, capture, run_with_cache
from attnlab.inspect.edits import ablate_heads, ablate_layers, ablate_neurons, steer
from attnlab.inspect.hooks import HookFn, HookHandle, add_hooks, hooked, is_hooked, run_with_hooks
from attnlab.inspect.lens import (
    LogitAttribution,
    LogitLens,
    direct_logit_attribution,
    logit_lens,
)
from attnlab.inspect.patching import PatchingResult, activation_patching, logit_difference
from attnlab.inspect.points import HookPoint, hook_names, hook_points, select

__all__ = [
    "ActivationCache",
    "HookFn",
    "HookHandle",
    "HookPoint",
    "LogitAttribution",
    "LogitLens",
    "PatchingResult",
    "ablate_heads",
    "ablate_layers",
    "ablate_neurons",
    "activation_patching",
    "add_hooks",
    "capture",
    "direct_logit_attribution",
    "hook_names",
    "hook_points",
    "hooked",
    "is_hooked",
    "logit_difference",
    "logit_lens",
    "run_with_cache",
    "run_with_hooks",
    "select",
    "steer",
]
