"""The explorer's cost panel: what the loaded model costs, from :mod:`attnlab.analysis`.

Parameters per component (:func:`~attnlab.analysis.param_breakdown`, tied weights once), the
forward matmul FLOPs of the current input length per component and group
(:func:`~attnlab.analysis.forward_flops`), and the lengths where the ``n²·d`` attention products
overtake the ``n·d²`` projections (:func:`~attnlab.analysis.crossover`), placed against the
input's length. All closed forms from the config: nothing is timed.
"""

from __future__ import annotations

from typing import Any

from attnlab.analysis import crossover, forward_flops, param_breakdown


def cost_panel(config: Any, seq_len: int, src_len: int | None = None) -> dict[str, Any]:
    """Parameters, FLOPs at ``seq_len`` tokens (an encoder-decoder: ``seq_len`` target and
    ``src_len`` source tokens) and the crossover lengths of ``config``.

    Returns:
        ``{"params": {"total", "grouped", "components"}, "flops": {"seq_len", "forward",
        "grouped", "shares", "components"}, "crossover": {"block", "layer", "model"},
        "attention_share": float, "past": {"block", "layer", "model"}}`` where ``past`` says
        whether ``seq_len`` is beyond each crossover.

    Raises:
        ValueError: for a non-positive ``seq_len`` or a config without closed forms.
    """
    params = param_breakdown(config)
    flops = forward_flops(config, seq_len, src_len=src_len)
    cross = crossover(config)
    lengths = {"block": cross.block, "layer": cross.layer, "model": cross.model}
    shares = flops.shares()
    return {
        "params": {
            "total": params.total,
            "grouped": params.grouped(),
            "components": dict(params.components),
            "tied": dict(params.tied),
        },
        "flops": {
            "seq_len": seq_len,
            "src_len": src_len,
            "forward": flops.forward,
            "grouped": flops.grouped(),
            "shares": shares,
            "components": flops.by_component(),
        },
        "crossover": lengths,
        "attention_share": shares["attention"],
        "past": {k: seq_len > v for k, v in lengths.items()},
    }


__all__ = ["cost_panel"]
