"""``attnlab viz``: attention maps, positional encodings, masks, schedules, curves, benchmarks.

Each sub-command returns the exit status (0, or 2 with one ``error:`` line on bad input; the
output file is checked to be writable before anything is computed)::

    attnlab viz attention MODEL_DIR --text "The animal didn't cross the street because it was too
        tired." --layer 2 [--head 3] [--rollout] [--query it --key animal] [--out attention.png]
    attnlab viz positional --kind sinusoidal|learned|rope|alibi --d-model 128 --max-len 200
    attnlab viz masks --seq-len 12 --length 9 --window 4
    attnlab viz schedule --kind noam --d-model 512 --warmup 4000
    attnlab viz curves RUN_DIR [RUN_DIR ...] [--log-y]
    attnlab viz bench RESULTS.json
    attnlab viz confusion RUN_DIR [--split test|val] [--counts]
    attnlab viz experts RUN_DIR [--layers layers.0.ffn,layers.1.ffn]

Layers and heads count from 0. Every command writes a PNG (``--out``) and prints its path.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from attnlab.cli.common import check_writable, fail, guarded
from attnlab.viz._mpl import DPI, save_figure

COMMANDS = ("attention", "positional", "masks", "schedule", "curves", "bench", "confusion",
            "experts")  # fmt: skip


def _ints(text: str) -> list[int]:
    """``"1,2, 3"`` -> ``[1, 2, 3]`` (argparse type)."""
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def _output(p: argparse.ArgumentParser, default: str | None, what: str) -> None:
    """The ``--out`` and ``--dpi`` flags of a picture."""
    p.add_argument("--out", default=default, help=f"PNG to write (default {what})")
    p.add_argument(
        "--dpi", type=int, default=DPI, help="resolution of the PNG (default %(default)s)"
    )


def _suffixed(out: Path, suffix: str) -> Path:
    return out.with_name(f"{out.stem}_{suffix}{out.suffix or '.png'}")


def _attention(args: argparse.Namespace) -> int:
    """``attnlab viz attention``: per-head grids, cross-attention, rollout, head ranking."""
    from attnlab.viz.attention import STACK_TITLES, attention_for_text, find_token, load_for_viz
    from attnlab.viz.attention_plots import plot_layer, plot_rollout
    from attnlab.viz.capture import attention_rollout

    if args.text is None and args.ids is None:
        raise ValueError("pass --text (or --ids)")
    if (args.query is None) != (args.key is None):
        raise ValueError("--query and --key go together")
    check_writable(args.out, what="--out")
    model, tokenizer = load_for_viz(args.model, tokenizer=args.tokenizer)
    maps = attention_for_text(
        model,
        args.text,
        tokenizer=tokenizer,
        ids=args.ids,
        target=args.target,
        target_ids=args.target_ids,
        max_new_tokens=args.max_new_tokens,
    )
    print(f"tokens ({len(maps.tokens)}): {maps.tokens}")
    if maps.target_tokens is not None:
        print(f"target ({len(maps.target_tokens)}): {maps.target_tokens}")
    out = Path(args.out)
    stacks = [args.stack] if args.stack else list(maps.stacks)
    for stack in stacks:  # validate everything before drawing anything
        maps.layer(stack, args.layer, args.head)
    roll_stack = args.stack or ("encoder" if "encoder" in maps.stacks else stacks[0])
    if args.rollout and roll_stack == "cross":
        raise ValueError("rollout needs a self-attention stack (self, encoder, decoder), not cross")
    if args.query is not None:
        rank_stack = args.stack or next(iter(maps.stacks))
        queries, keys = maps.labels(rank_stack)
        q, k = find_token(queries, args.query), find_token(keys, args.key)
    for stack in stacks:
        path = out if len(stacks) == 1 else _suffixed(out, stack)
        fig = plot_layer(maps, args.layer, stack=stack, head=args.head)
        print(f"wrote {save_figure(fig, path, dpi=args.dpi)}  ({STACK_TITLES.get(stack, stack)})")
    if args.rollout:
        stack = roll_stack
        labels, _ = maps.labels(stack)
        rollout = attention_rollout(maps.check_stack(stack), head_fusion=args.head_fusion)
        fig = plot_rollout(
            rollout,
            labels,
            title=f"{maps.model_name} {stack}: attention rollout "
            f"over {len(maps.stacks[stack])} layers (heads: {args.head_fusion})",
        )
        written = save_figure(fig, _suffixed(out, "rollout"), dpi=args.dpi)
        print(f"wrote {written}  (attention rollout)")
    if args.query is not None:
        _ranking(args, maps, rank_stack, q[0], k, out)
    return 0


def _ranking(
    args: argparse.Namespace, maps: Any, stack: str, query: int, keys: list[int], out: Path
) -> None:
    """Print the heads ranked by the weight from ``--query`` to ``--key``, draw them."""
    from attnlab.viz.attention_plots import plot_head_scores
    from attnlab.viz.capture import head_scores, rank_heads

    scores = head_scores(maps.check_stack(stack), query, keys)
    ranked = rank_heads(scores, args.top)
    print(
        f"heads where {args.query!r} (token {query}) attends most to {args.key!r} "
        f"(tokens {keys}), {stack} stack:"
    )
    print(f"{'rank':>4} {'layer':>5} {'head':>4} {'weight':>7}")
    for i, (layer, head, w) in enumerate(ranked, 1):
        print(f"{i:>4} {layer:>5} {head:>4} {w:>7.3f}")
    best = ranked[0][:2]
    queries, key_labels = maps.labels(stack)
    fig = plot_head_scores(
        scores,
        maps.layer(stack, best[0], best[1])[query],
        key_labels,
        best=best,
        query=args.query,
        key=args.key,
        title=" ".join(queries),
    )
    print(f"wrote {save_figure(fig, _suffixed(out, 'heads'), dpi=args.dpi)}  (head ranking)")


def _at_most(**limits: tuple[int | list[int] | None, int]) -> None:
    """Refuse picture sizes nobody can see (and that would not fit in memory): each
    ``name=(value, most)``, value an int, a list of ints or None (not given)."""
    for name, (value, most) in limits.items():
        for v in value if isinstance(value, list) else [value]:
            if v is not None and v > most:
                fail(f"--{name.replace('_', '-')} {v} is more than a picture can show "
                     f"(at most {most:,})")  # fmt: skip


def _positional(args: argparse.Namespace) -> int:
    """``attnlab viz positional``: sinusoidal / learned / RoPE / ALiBi pictures."""
    from attnlab.viz.positional import plot_positional

    _at_most(d_model=(args.d_model, 8192), max_len=(args.max_len, 16384),
             n_heads=(args.n_heads, 1024), d_head=(args.d_head, 8192))  # fmt: skip
    out = args.out or f"positional_{args.kind}.png"
    check_writable(out, what="--out")
    model = None
    if args.model is not None:
        from attnlab.pretrained import from_pretrained

        model = from_pretrained(args.model)
    fig = plot_positional(
        args.kind,
        d_model=args.d_model,
        max_len=args.max_len,
        n_heads=args.n_heads,
        d_head=args.d_head,
        base=args.base,
        model=model,
    )
    print(f"wrote {save_figure(fig, out, dpi=args.dpi)}")
    return 0


def _masks(args: argparse.Namespace) -> int:
    """``attnlab viz masks``: causal, padding, sliding window, combined (and cached) masks."""
    from attnlab.viz.masks import plot_masks

    _at_most(seq_len=(args.seq_len, 1024), length=(args.length, 1024),
             window=(args.window, 1024), query_len=(args.query_len, 1024))  # fmt: skip
    check_writable(args.out, what="--out")
    fig = plot_masks(
        [k.strip() for k in args.kinds.split(",") if k.strip()],
        seq_len=args.seq_len,
        length=args.length,
        window=args.window,
        global_tokens=args.global_tokens or [],
        query_len=args.query_len,
    )
    print(f"wrote {save_figure(fig, args.out, dpi=args.dpi)}")
    return 0


def _schedule(args: argparse.Namespace) -> int:
    """``attnlab viz schedule``: the learning-rate curve(s)."""
    from attnlab.viz.schedule import plot_schedule

    _at_most(steps=(args.steps, 10**7), total_steps=(args.total_steps, 10**7))
    out = args.out or f"schedule_{args.kind}.png"
    check_writable(out, what="--out")
    fig = plot_schedule(
        args.kind,
        steps=args.steps,
        d_model=args.d_model,
        warmup=args.warmup,
        total_steps=args.total_steps,
        min_ratio=args.min_ratio,
        factor=args.factor,
        lr=args.lr,
        decay_fraction=args.decay_fraction,
        decay=args.decay,
    )
    print(f"wrote {save_figure(fig, out, dpi=args.dpi)}")
    return 0


def _curves(args: argparse.Namespace) -> int:
    """``attnlab viz curves``: loss curves of one or more runs, overlaid."""
    from attnlab.viz.curves import plot_curves, read_metrics

    check_writable(args.out, what="--out")
    runs = [read_metrics(r) for r in args.runs]
    for r in runs:
        last = f"{r.train[-1][1]:.4f} @ {r.train[-1][0]:g}" if r.train else "-"
        best = f"{min(v for _, v in r.val):.4f}" if r.val else "-"
        skipped = f", {r.skipped} lines skipped" if r.skipped else ""
        print(f"{r.name}: last train loss {last}, best val loss {best}{skipped}")
    fig = plot_curves(runs, log_y=args.log_y, title=args.title or "")
    print(f"wrote {save_figure(fig, args.out, dpi=args.dpi)}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    """``attnlab viz bench``: log-log time and memory vs n from a results JSON."""
    from attnlab.viz.bench import load_benchmark, plot_benchmark

    check_writable(args.out, what="--out")
    fig = plot_benchmark(
        load_benchmark(args.results),
        x=args.x,
        group=args.group,
        style=args.style or None,
        time_key=args.time_key,
        memory_key=args.memory_key or None,
        title=args.title or "",
    )
    print(f"wrote {save_figure(fig, args.out, dpi=args.dpi)}")
    return 0


def _confusion(args: argparse.Namespace) -> int:
    """``attnlab viz confusion``: the confusion matrix of a trained classification run."""
    from attnlab.training.recipes import load_run
    from attnlab.training.recipes.cifar10 import evaluate_split
    from attnlab.viz.confusion import plot_confusion

    check_writable(args.out, what="--out")
    run = load_run(args.run)
    if run.recipe.name != "cifar10":
        raise ValueError(
            f"{args.run} is a {run.recipe.name!r} run; viz confusion reads cifar10 runs"
        )
    e = evaluate_split(run, args.split)
    print(f"{e.split}: accuracy {e.accuracy:.2%} on {e.images:,} images of {e.dataset}")
    model = run.options.model
    title = args.title or f"{model}, {e.split} ({e.images:,} images, {e.dataset})"
    fig = plot_confusion(e.confusion, list(e.per_class), normalize=not args.counts, title=title)
    print(f"wrote {save_figure(fig, args.out, dpi=args.dpi)}")
    return 0


def _experts(args: argparse.Namespace) -> int:
    """``attnlab viz experts``: the expert load of a mixture-of-experts run over training (one
    heatmap per MoE layer: each expert's share of the layer's assignments at each logged step)."""
    from attnlab.viz.moe import plot_expert_load, read_expert_load

    check_writable(args.out, what="--out")
    load = read_expert_load(args.run)
    layers = [n.strip() for n in args.layers.split(",") if n.strip()] if args.layers else None
    for name, rows in load.layers.items():
        if layers is None or name in layers:
            last = rows[-1]
            print(f"{name}: {len(last)} experts, {len(rows)} logged steps; at step "
                  f"{load.steps[-1]:g} the busiest takes {max(last):.1%} "
                  f"(uniform {1 / len(last):.1%})")  # fmt: skip
    fig = plot_expert_load(load, layers=layers, title=args.title or "")
    print(f"wrote {save_figure(fig, args.out, dpi=args.dpi)}")
    return 0


_BODIES = {
    "attention": _attention, "positional": _positional, "masks": _masks,
    "schedule": _schedule, "curves": _curves, "bench": _bench, "confusion": _confusion,
    "experts": _experts,
}  # fmt: skip


def _command(sub: Any, name: str, help: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(name, help=help, description=_BODIES[name].__doc__)
    p.set_defaults(func=guarded(f"attnlab viz {name}", _BODIES[name]))
    return p


def _add_attention(sub: Any) -> None:
    p = _command(sub, "attention", "attention weights of every head of a layer")
    p.add_argument("model", help="checkpoint directory (attnlab or Hugging Face)")
    p.add_argument("--text", help="input text (the source of an encoder-decoder)")
    p.add_argument("--ids", type=_ints, help="token ids instead of --text, e.g. 5,9,2")
    p.add_argument("--tokenizer", help="tokenizer.json to use (default: the checkpoint's)")
    p.add_argument("--target", help="encoder-decoder: target text (default: greedy output)")
    p.add_argument("--target-ids", type=_ints, help="encoder-decoder: target ids")
    p.add_argument("--max-new-tokens", type=int, default=32, help="greedy target length cap")
    p.add_argument("--layer", type=int, default=0, help="layer, from 0 (default 0)")
    p.add_argument("--head", type=int, help="one head, from 0 (default: every head)")
    p.add_argument(
        "--stack",
        choices=["self", "encoder", "decoder", "cross"],
        help="which attention (default: all of the model's, one file each)",
    )
    p.add_argument("--rollout", action="store_true", help="also write the attention rollout")
    p.add_argument("--head-fusion", default="mean", choices=["mean", "max", "min"])
    p.add_argument("--query", help="rank heads by how much this token attends to --key")
    p.add_argument("--key", help="the attended token (a word: its sub-words are summed)")
    p.add_argument("--top", type=int, default=10, help="ranked heads printed (default 10)")
    _output(p, "attention.png", "attention.png")


def _add_positional(sub: Any) -> None:
    p = _command(sub, "positional", "positional encoding heatmaps")
    p.add_argument("--kind", required=True, choices=["sinusoidal", "learned", "rope", "alibi"])
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--max-len", type=int, default=200)
    p.add_argument("--n-heads", type=int, default=8, help="ALiBi heads")
    p.add_argument("--d-head", type=int, help="RoPE's rotated head dim (default --d-model)")
    p.add_argument("--base", type=float, default=10000.0)
    p.add_argument("--model", help="learned: checkpoint directory whose table to show")
    _output(p, None, "positional_<kind>.png")


def _add_masks(sub: Any) -> None:
    p = _command(sub, "masks", "attention masks as pictures")
    p.add_argument(
        "--kinds",
        default="causal,padding,sliding_window,combined",
        help="comma-separated of causal, padding, sliding_window, combined, cached",
    )
    p.add_argument("--seq-len", type=int, default=12)
    p.add_argument("--length", type=int, help="real tokens for padding (default seq-len - 3)")
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--global", dest="global_tokens", type=_ints, help="global token positions")
    p.add_argument("--query-len", type=int, help="queries of 'cached' (default seq-len // 3)")
    _output(p, "masks.png", "masks.png")


def _add_schedule(sub: Any) -> None:
    p = _command(sub, "schedule", "learning-rate schedule curve")
    p.add_argument("--kind", default="noam", choices=["noam", "cosine", "wsd", "constant"])
    p.add_argument("--d-model", type=int, nargs="+", default=[512], help="one or more widths")
    p.add_argument("--warmup", type=int, nargs="+", default=[4000], help="one or more")
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--total-steps", type=int,
                   help="cosine, wsd: end of the decay (default --steps)")  # fmt: skip
    p.add_argument("--min-ratio", type=float, default=0.0, help="cosine, wsd: floor")
    p.add_argument("--decay-fraction", type=float, default=0.2,
                   help="wsd: the last fraction of the steps that decays")  # fmt: skip
    p.add_argument("--decay", default="linear", choices=["linear", "sqrt", "cosine"],
                   help="wsd: the decay's shape (sqrt: 1 - sqrt)")  # fmt: skip
    p.add_argument("--factor", type=float, default=1.0, help="noam: multiplier")
    p.add_argument("--lr", type=float, help="cosine/wsd/constant: base learning rate")
    _output(p, None, "schedule_<kind>.png")


def _add_curves(sub: Any) -> None:
    p = _command(sub, "curves", "train/val loss of runs")
    p.add_argument("runs", nargs="+", help="run directories (metrics.jsonl) or metrics files")
    p.add_argument("--log-y", action="store_true")
    p.add_argument("--title")
    _output(p, "curves.png", "curves.png")


def _add_bench(sub: Any) -> None:
    p = _command(sub, "bench", "time and memory vs n (log-log)")
    p.add_argument("results", help="benchmark results JSON (rows, or an object with 'cases')")
    p.add_argument("--x", default="n")
    p.add_argument("--group", default="backend")
    p.add_argument("--style", default="mode", help="second split (line style); '' for none")
    p.add_argument("--time-key", default="time_s")
    p.add_argument("--memory-key", default="peak_mem_bytes", help="'' for time only")
    p.add_argument("--title")
    _output(p, "bench.png", "bench.png")


def _add_confusion(sub: Any) -> None:
    p = _command(sub, "confusion", "confusion matrix of a trained cifar10 run")
    p.add_argument("run", help="run directory (runs/NAME) of the cifar10 recipe")
    p.add_argument("--split", default="test", choices=["test", "val"], help="default test")
    p.add_argument("--counts", action="store_true", help="image counts instead of row rates")
    p.add_argument("--title")
    _output(p, "confusion.png", "confusion.png")


def _add_experts(sub: Any) -> None:
    p = _command(sub, "experts", "expert load over training of a mixture-of-experts run")
    p.add_argument("run", help="run directory (metrics.jsonl with moe_load) or metrics file")
    p.add_argument("--layers", help="comma-separated MoE layers to draw (default: all)")
    p.add_argument("--title")
    _output(p, "experts.png", "experts.png")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``viz`` with attention, positional, masks, schedule, curves, bench, confusion, experts."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "viz",
        help="pictures: attention maps, positional encodings, masks, schedules, curves, experts",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    metavar = "{" + ",".join(COMMANDS) + "}"
    sub = p.add_subparsers(dest="viz_command", required=True, metavar=metavar)
    for add in (_add_attention, _add_positional, _add_masks, _add_schedule, _add_curves,
                _add_bench, _add_confusion, _add_experts):  # fmt: skip
        add(sub)
    return p


__all__ = ["COMMANDS", "add_parser"]
