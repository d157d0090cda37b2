"""What the hook sites of attnlab.inspect cost when nothing is hooked (issue 21: <= 2%).

Each hook site in the layers is ``if self.activation_hook is not None: ...`` (one attribute read
and a comparison). This measures it: the same model, with the same weights and inputs, run

- ``hooked``: attnlab's layers as they are (hook sites present, nothing attached: the forward
  everyone runs);
- ``plain``: the same modules with their class swapped for a subclass whose ``forward`` is the
  site-free code of before issue 21 (written out below, line for line; the outputs are checked
  bitwise equal to ``hooked``'s);
- ``one hook elsewhere`` (information): a read-only function attached to ``logits`` only, so
  only the LM head's forward hook runs; every layer stays on its fast path;

in one process, interleaved (the row order rotates every round so a slow spell of a shared
machine hits every row alike), each round timing ``--iters`` forwards in inference mode; the
figure is the median over ``--rounds`` rounds of the per-forward time, and the overhead the
ratio of the medians ``hooked / plain - 1``.

    python benchmarks/inspect_overhead.py            # baby GPT, GPT-2 small, BERT-base
    python benchmarks/inspect_overhead.py --smoke    # tiny, 3 rounds: checks the script runs

Results: ``benchmarks/results/inspect_overhead.{md,json}`` (``--smoke``: ``..._smoke``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.analysis.attention_bench import describe_machine, machine_info
from attnlab.inspect import hooked
from attnlab.layers.blocks import DecoderLayer, EncoderLayer
from attnlab.layers.feedforward import FeedForward
from attnlab.layers.kv_cache import positions_for
from attnlab.layers.multihead import MultiHeadAttention
from attnlab.layers.positional import LearnedPositionalEmbedding, check_positions
from attnlab.models import build_model

RESULTS = Path(__file__).resolve().parent / "results"

# name -> (preset, overrides, batch, tokens, mode): "forward" times model(ids) over B x T tokens;
# "decode" times generate() of DECODE_TOKENS greedy tokens after a T-token prompt (KV cache: one
# token per step, where a Python-level cost would show most).
DECODE_TOKENS = 32
SHAPES: dict[str, tuple[str, dict[str, Any], int, int, str]] = {
    "baby GPT (T=64)": ("gpt-char-baby", {"dropout": 0.0}, 12, 64, "forward"),
    "baby GPT decode (32 tokens)": ("gpt-char-baby", {"dropout": 0.0}, 1, 16, "decode"),
    "GPT-2 small (T=256)": ("gpt2-small", {"dropout": 0.0}, 1, 256, "forward"),
    "BERT-base (T=128)": ("bert-base", {"dropout": 0.0}, 1, 128, "forward"),
}
SMOKE = {
    "tiny GPT (smoke)": ("gpt-char-baby", {"dropout": 0.0, "n_layers": 2}, 2, 16, "forward"),
    "tiny GPT decode (smoke)": ("gpt-char-baby", {"dropout": 0.0, "n_layers": 2}, 1, 4, "decode"),
}


# ---- the site-free forwards (attnlab's code before issue 21) ---------------------------------


class PlainAttention(MultiHeadAttention):
    def forward(  # type: ignore[override]
        self, x: Tensor, memory: Tensor | None = None, *, mask: Tensor | None = None,
        is_causal: bool = False, need_weights: bool = False, positions: Tensor | None = None,
        cache: Any = None, cross_cache: Any = None,
    ) -> tuple[Tensor, Tensor | None]:  # fmt: skip
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (B, T, {self.d_model}), got shape {tuple(x.shape)}")
        B, T, _ = x.shape
        cross = memory is not None or cross_cache is not None
        if cross and cache is not None:
            raise ValueError("cross-attention takes cross_cache, not a self-attention cache")
        if not cross:
            q, k, v = self._self_projections(x)
            if self.rotary is not None:
                if positions is None:
                    positions = positions_for(T, cache, x.device)
                q = self.rotary.rotate(q, positions)
                k = self.rotary.rotate(k, positions)
            if cache is not None:
                k, v = cache.update(k, v)
        else:
            q = self._heads(self.q_proj(x), self.n_heads)
            k, v = self._cross_keys_values(memory, cross_cache, B)
        dropout_p = self.dropout if self.training else 0.0
        weights: Tensor | None = None
        if need_weights:
            out, weights = self._attention_with_weights(q, k, v, mask, is_causal, dropout_p)
        else:
            out = self.backend(q, k, v, mask=mask, is_causal=is_causal, dropout_p=dropout_p)
        out = out.transpose(1, 2).reshape(B, T, self.n_heads * self.d_head)
        return self.out_proj(out), weights


class PlainFeedForward(FeedForward):
    def forward(self, x: Tensor) -> Tensor:
        if self.gate_proj is not None:
            h = self.act(self.gate_proj(x)) * self.up_proj(x)
        else:
            h = self.act(self.up_proj(x))
        return self.down_proj(self.dropout(h))


class PlainEncoderLayer(EncoderLayer):
    def forward(  # type: ignore[override]
        self, x: Tensor, *, mask: Tensor | None = None, is_causal: bool = False,
        positions: Tensor | None = None, cache: Any = None,
    ) -> Tensor:  # fmt: skip
        a, _ = self.self_attn(
            self.enter(x, self.self_attn_norm), mask=mask, is_causal=is_causal,
            positions=positions, cache=cache,
        )  # fmt: skip
        x = self.leave(x, a, self.self_attn_norm)
        return self.leave(x, self.ffn(self.enter(x, self.ffn_norm)), self.ffn_norm)


class PlainDecoderLayer(DecoderLayer):
    def forward(  # type: ignore[override]
        self, x: Tensor, memory: Tensor | None = None, *, mask: Tensor | None = None,
        memory_mask: Tensor | None = None, is_causal: bool = True,
        positions: Tensor | None = None, cache: Any = None, cross_cache: Any = None,
    ) -> Tensor:  # fmt: skip
        a, _ = self.self_attn(
            self.enter(x, self.self_attn_norm), mask=mask, is_causal=is_causal,
            positions=positions, cache=cache,
        )  # fmt: skip
        x = self.leave(x, a, self.self_attn_norm)
        if self.cross_attn is not None and self.cross_attn_norm is not None:
            q = self.enter(x, self.cross_attn_norm)
            c, _ = self.cross_attn(q, memory, mask=memory_mask, cross_cache=cross_cache)
            x = self.leave(x, c, self.cross_attn_norm)
        return self.leave(x, self.ffn(self.enter(x, self.ffn_norm)), self.ffn_norm)


class PlainLearnedPositions(LearnedPositionalEmbedding):
    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        check_positions(positions, x, 1)
        if (
            positions.numel()
            and positions.device.type != "meta"
            and int(positions.max()) >= self.max_seq_len
        ):
            raise ValueError("position outside the learned table")
        return x + self.weight[positions].to(x.dtype)


PLAIN: dict[type[nn.Module], type[nn.Module]] = {
    MultiHeadAttention: PlainAttention,
    FeedForward: PlainFeedForward,
    EncoderLayer: PlainEncoderLayer,
    DecoderLayer: PlainDecoderLayer,
    LearnedPositionalEmbedding: PlainLearnedPositions,
}


def set_plain(model: nn.Module, plain: bool) -> None:
    """Swap every hook-site module's class for its site-free twin (or back)."""
    back = {v: k for k, v in PLAIN.items()}
    for m in model.modules():
        table = PLAIN if plain else back
        if type(m) in table:
            m.__class__ = table[type(m)]


# ---- timing -------------------------------------------------------------------------------------


def _inputs(model: nn.Module, batch: int, tokens: int) -> Tensor:
    vocab = model.config.vocab_size  # type: ignore[union-attr]
    g = torch.Generator().manual_seed(0)
    return torch.randint(1, vocab, (batch, tokens), generator=g)  # (B, T), no padding id


def _time(fn: Callable[[], Any], iters: int) -> float:
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def bench(name: str, preset: str, overrides: dict[str, Any], batch: int, tokens: int, mode: str,
          args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    from attnlab.generation import generate

    torch.manual_seed(0)
    model = build_model(preset, **overrides).eval()
    ids = _inputs(model, batch, tokens)

    def run() -> Any:
        if mode == "decode":
            return generate(model, ids, max_new_tokens=DECODE_TOKENS, eos_id=None)
        with torch.inference_mode():
            return model(ids)

    def first(out: Any) -> Tensor:
        return out[0] if isinstance(out, tuple) else out

    set_plain(model, True)
    reference = first(run())
    set_plain(model, False)
    assert torch.equal(first(run()), reference), "the hooked forward must equal the plain one"

    def plain() -> float:
        set_plain(model, True)
        try:
            return _time(run, args.iters)
        finally:
            set_plain(model, False)

    where = "logits" if "logits" in _names(model) else "layers.0.resid_pre"

    def elsewhere() -> float:
        with hooked(model, {where: lambda t, n: None}):
            return _time(run, args.iters)

    rows: dict[str, Callable[[], float]] = {
        "plain": plain,
        "hooked": lambda: _time(run, args.iters),
        "one hook elsewhere": elsewhere,
    }
    for fn in rows.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {k: [] for k in rows}
    order = list(rows)
    for r in range(args.rounds):
        for key in order[r % len(order) :] + order[: r % len(order)]:
            times[key].append(rows[key]())
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "shape": name, "preset": preset, "overrides": overrides, "batch": batch, "tokens": tokens,
        "mode": mode, "median_s": med, "times_s": times,
        "overhead": med["hooked"] / med["plain"] - 1.0,
        "overhead_one_hook": med["one hook elsewhere"] / med["plain"] - 1.0,
    }  # fmt: skip


def _names(model: nn.Module) -> list[str]:
    from attnlab.inspect import hook_names

    return hook_names(model)


def markdown(results: list[dict[str, Any]], meta: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        "# attnlab.inspect: the hook sites' cost with nothing hooked"
        + (" (SMOKE)" if args.smoke else ""),
        "",
        describe_machine(meta, torch.get_num_threads()) + ".",
        f"Median over {args.rounds} interleaved rounds of {args.iters} calls each (a forward, or "
        f"a {DECODE_TOKENS}-token greedy generate for the decode rows), inference mode.",
        "",
        "| shape | plain (ms) | hooked, nothing attached (ms) | overhead "
        "| one hook on logits (ms) | overhead |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        m = r["median_s"]
        lines.append(
            f"| {r['shape']} | {1e3 * m['plain']:.3f} | {1e3 * m['hooked']:.3f} | "
            f"{100 * r['overhead']:+.2f}% | {1e3 * m['one hook elsewhere']:.3f} | "
            f"{100 * r['overhead_one_hook']:+.2f}% |"
        )
    if args.smoke:
        lines += ["", "Smoke run: tiny sizes and few rounds; these numbers say nothing."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--iters", type=int, default=10, help="forwards per timed burst")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny model, 3 rounds of 2")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    shapes = SMOKE if args.smoke else SHAPES
    if args.smoke:
        args.rounds, args.iters = 3, 2
    meta = machine_info()
    results = [bench(name, *spec, args) for name, spec in shapes.items()]
    stem = "inspect_overhead_smoke" if args.smoke else "inspect_overhead"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(
        json.dumps({"meta": meta, "results": results}, indent=2) + "\n", encoding="utf-8"
    )
    text = markdown(results, meta, args)
    (RESULTS / f"{stem}.md").write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
