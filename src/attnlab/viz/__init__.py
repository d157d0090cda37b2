"""Pictures: attention maps, positional encodings, masks, schedules, training curves, benchmarks.

matplotlib is an optional extra (``pip install attnlab[viz]``), imported only when something is
drawn; importing this package does not need it. Every ``plot_*`` function returns a matplotlib
``Figure`` (no ``pyplot``; saved through the headless Agg canvas) and writes it when given a
``path``. The data behind each picture comes from the library itself and is exposed separately
(:func:`collect_attention`, :func:`positional_data`, :func:`mask_data`, :func:`schedule_curves`,
:func:`read_metrics`), so it can be checked, not just looked at.

- attention (:mod:`~attnlab.viz.capture`, :mod:`~attnlab.viz.attention`,
  :mod:`~attnlab.viz.attention_plots`): every layer's weights from the math path
  (``need_weights=True``) through forward hooks, per-head grids with token labels,
  cross-attention of encoder-decoder models, attention rollout, heads ranked by the weight from
  one token to another;
- :mod:`~attnlab.viz.positional`: sinusoidal / learned tables, RoPE and ALiBi score patterns;
- :mod:`~attnlab.viz.masks`: causal, padding, sliding window, combined, cached-decoding masks;
- :mod:`~attnlab.viz.schedule`: the §5.3 learning-rate curve (and cosine, constant);
- :mod:`~attnlab.viz.curves`: train/val loss from JSON Lines metrics files, runs overlaid;
- :mod:`~attnlab.viz.bench`: time and memory vs n on log-log axes, for the benchmarks;
- :mod:`~attnlab.viz.moe`: expert load over training of mixture-of-experts runs;
- :mod:`~attnlab.viz.inspect_plots`: activation patching heatmaps, the logit lens
  (:mod:`attnlab.inspect`);
- :mod:`~attnlab.viz.cli`: ``attnlab viz ...`` (:func:`add_viz_subparser`).
"""

from attnlab.viz.attention import AttentionMaps, attention_for_text, find_token, load_for_viz
from attnlab.viz.attention_plots import plot_attention, plot_head_scores, plot_layer, plot_rollout
from attnlab.viz.bench import load_benchmark, plot_benchmark
from attnlab.viz.capture import (
    attention_rollout,
    collect_attention,
    head_scores,
    rank_heads,
    record_attention,
)
from attnlab.viz.curves import RunMetrics, plot_curves, read_metrics
from attnlab.viz.inspect_plots import plot_logit_lens, plot_patching
from attnlab.viz.masks import MASK_KINDS, mask_data, plot_masks
from attnlab.viz.moe import plot_expert_load, read_expert_load
from attnlab.viz.positional import POSITIONAL_KINDS, plot_positional, positional_data
from attnlab.viz.schedule import plot_schedule, schedule_curves

__all__ = [
    "MASK_KINDS",
    "POSITIONAL_KINDS",
    "AttentionMaps",
    "RunMetrics",
    "attention_for_text",
    "attention_rollout",
    "collect_attention",
    "find_token",
    "head_scores",
    "load_benchmark",
    "load_for_viz",
    "mask_data",
    "plot_attention",
    "plot_benchmark",
    "plot_curves",
    "plot_expert_load",
    "plot_head_scores",
    "plot_layer",
    "plot_logit_lens",
    "plot_masks",
    "plot_patching",
    "plot_positional",
    "plot_rollout",
    "plot_schedule",
    "positional_data",
    "rank_heads",
    "read_expert_load",
    "read_metrics",
    "record_attention",
    "schedule_curves",
]
