"""Analysis: parameter counts (closed form and measured); FLOPs and memory to follow."""

from attnlab.analysis.params import count_params

__all__ = ["count_params"]
