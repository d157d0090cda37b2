"""Where the time goes (issue 13): torch.profiler over attnlab's Shakespeare-shape train step and a
GPT-2-small decode step, CPU self time grouped into matrix products, attention kernels, the
optimizer and everything else.

    python benchmarks/profile_step.py            # -> benchmarks/results/profile_step.md

The groups are by ATen op name: ``mm``/``addmm``/``bmm``/``matmul``/``linear`` (and their
backward ops) are matrix products; ``(_)scaled_dot_product*`` attention kernels;
``_fused_adamw*`` the optimizer; the rest (GELU, LayerNorm, softmax, copies, indexing, ...)
"other". Self time of leaf ops only, so nothing is counted twice.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_step import SHAPES, build_attnlab, make_trainee

from generation import build_pair

RESULTS = Path(__file__).resolve().parent / "results"
GROUPS = (
    ("matrix products", ("mm", "addmm", "bmm", "matmul", "linear", "_mkl_linear")),
    ("attention kernels", ("scaled_dot_product", "flash_attention", "efficient_attention")),
    ("optimizer", ("fused_adam",)),
)


def group_of(name: str) -> str:
    """The group of an ATen op name (``aten::addmm`` -> "matrix products")."""
    op = name.split("::")[-1].lstrip("_")
    for group, keys in GROUPS:
        if any(op == k or op.startswith(k) for k in keys):
            return group
    return "other"


def profile_fn(fn, repeats: int) -> tuple[dict[str, float], list[tuple[str, float]], float]:
    """(ms per call by group, top ops by ms per call, wall ms per call) of ``fn()``."""
    for _ in range(2):
        fn()  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        wall = (time.perf_counter() - start) / repeats * 1e3
    by_group: dict[str, float] = defaultdict(float)
    ops = []
    for e in prof.key_averages():
        self_ms = e.self_cpu_time_total / 1e3 / repeats
        if self_ms <= 0:
            continue
        by_group[group_of(e.key)] += self_ms
        ops.append((e.key, self_ms))
    ops.sort(key=lambda t: -t[1])
    return dict(by_group), ops[:8], wall


def table(title: str, groups: dict[str, float], ops: list[tuple[str, float]], wall: float) -> str:
    total = sum(groups.values())
    lines = [f"## {title}", "", f"Wall {wall:.1f} ms per call (under the profiler).", ""]
    lines += ["| group | ms per call | share |", "|---|---:|---:|"]
    for name, ms in sorted(groups.items(), key=lambda t: -t[1]):
        lines.append(f"| {name} | {ms:.1f} | {ms / total:.0%} |")
    lines += ["", "Top ops (self time):", "", "| op | ms per call |", "|---|---:|"]
    lines += [f"| `{k}` | {ms:.2f} |" for k, ms in ops]
    return "\n".join(lines) + "\n"


def main() -> int:
    torch.manual_seed(0)
    parts = [
        "# Profile (benchmarks/profile_step.py)",
        "",
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{time.strftime('%Y-%m-%d %H:%M')}. CPU self time of leaf ops, grouped.",
        "",
    ]
    s = SHAPES["shakespeare"]
    trainee = make_trainee(lambda shape: build_attnlab(shape, "gelu"), s)
    data = torch.randint(0, s.vocab, (s.batch, s.context + 1))
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    parts.append(table("Train step, Shakespeare shape (6L/6H/d384, ctx 256, batch 8)",
                       *profile_fn(lambda: trainee.step(x, y), repeats=3)))  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        _, ours = build_pair("gpt2-small", Path(tmp))
    for batch in (1, 8):
        ids = torch.randint(0, 50257, (batch, 32))

        def decode(ids: torch.Tensor = ids) -> None:
            import attnlab

            attnlab.generate(ours, ids, max_new_tokens=16)

        parts.append(table(f"Decoding GPT-2 small, batch {batch}, 32-token prompt + 16 new tokens",
                           *profile_fn(decode, repeats=2)))  # fmt: skip
    out = RESULTS / "profile_step.md"
    out.write_text("\n".join(parts))
    print(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
