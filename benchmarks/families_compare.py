"""Before and after attention (issue 24): the baby GPT, the modern GPT, Mamba, the LSTM (and the
GRU) side by side on the same tasks at the same parameter count (~0.8M, 65 characters), all
trained by the one ``Trainer`` through the recipes.

Four parts (``--only``), each writing ``benchmarks/results/families_<part>.{md,json,png}``:

1. ``shakespeare``: ``attnlab train shakespeare-char --arch ARCH`` (``train_recipe``: its data,
   objective and ``TrainConfig``: AdamW 1e-3, cosine, batch 12, blocks of 64) for every family,
   each into its own run directory under ``--runs`` (default ``runs/families``). *Equal
   steps*: ``--steps`` (the recipe's 2000) each. *Equal wall time*: the first family's training
   time (its steps x its median step time); every other family is trained again for as many
   steps as its median step time allows in it (the cosine schedule over those steps).
   Reported: the final validation loss on the recipe's fixed batches (``--eval-batches``),
   training tokens/s (the median of the trainer's per-step ``tokens_per_s``: the steps after an
   evaluation are the slow tail, not the median), the curves (``attnlab.viz.plot_curves`` of the
   run directories).
2. ``seqlen``: training tokens/s (``Trainer.train_step``: forward, backward, clipping, AdamW) of
   the recipe's models on blocks of T = 64 .. 4096 at ``--tokens-per-batch`` tokens per batch
   (B = tokens / T; the GPTs' context is T), and the fitted exponent of time per token in T: the
   LSTM's T sequential steps against attention's and the scan's parallelism.
3. ``recall``: ``attnlab train recall --arch ARCH --kind K --distance d`` for every family, the
   same steps (``--recall-steps``), batch and optimizer; the accuracy is the run's last
   validation accuracy over ``--recall-eval`` fresh sequences (chance 1/16). ``--recall-backends``
   adds the GPTs on other attention backends, ``--recall-options`` their options (the model's
   ``attn_options``, e.g. a window or block below the distances).
4. ``decode``: per-token decoding latency through the generation session ``generate`` uses
   (KV cache for the GPTs, the constant state for Mamba/LSTM; batch 1, greedy, after a prefill of
   n tokens; the decode-time weight layout applied as ``generate`` applies it) and the bytes kept
   per sequence (measured on the session's cache/state, and the closed form), n = 128 .. 8192;
   where the curves cross.

Timing: every family runs in this process on the same inputs; medians over ``--rounds`` rounds
(the family order rotated each round in ``seqlen`` and ``decode``).

    python benchmarks/families_compare.py --only seqlen,decode  # the two speed parts
    python benchmarks/families_compare.py --only shakespeare    # hours on a CPU
    python benchmarks/families_compare.py --smoke               # tiny sizes, to /tmp

Data: ``$ATTNLAB_DATA``, else ``../shared/data`` beside the checkout. ``--smoke`` shrinks
everything (a few steps, short blocks, small contexts) and writes to
``/tmp/attnlab_families_smoke`` unless ``--out`` says otherwise; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from attnlab.analysis import decode_state_bytes
from attnlab.analysis.attention_bench import describe_machine, machine_info
from attnlab.analysis.attention_bench_report import crossover, fit_exponent
from attnlab.analysis.recurrent import state_crossover
from attnlab.generation import GenerationConfig
from attnlab.generation.engines import resolve_engine, runner_for
from attnlab.generation.recurrent import is_recurrent
from attnlab.generation.request import eval_mode, open_session, prepare_request
from attnlab.layers import ATTENTION_BACKENDS, get_attention_backend
from attnlab.training import Trainer
from attnlab.training.recipes import prepare, train_recipe

RESULTS = Path(__file__).resolve().parent / "results"
FAMILIES = {"gpt": "classic", "gpt-modern": "modern", "mamba": "mamba", "lstm": "lstm",
            "gru": "gru"}  # fmt: skip  # family -> shakespeare-char's arch
DEFAULT_FAMILIES = "gpt,gpt-modern,mamba,lstm"
QUIET = {"progress": False}


def is_gpt(family: str) -> bool:
    return FAMILIES[family] in ("classic", "modern")


def write(args: argparse.Namespace, part: str, meta: dict[str, Any], data: dict[str, Any],
          md: list[str]) -> None:  # fmt: skip
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / f"families_{part}.json").write_text(json.dumps({"meta": meta, **data}, indent=2) + "\n")
    head = [f"# Families, part {part} (benchmarks/families_compare.py, issue 24)", ""]
    head += [describe_machine(meta, torch.get_num_threads()) + ".", ""]
    if args.smoke:
        head += ["**Smoke run: tiny sizes, the numbers mean nothing.**", ""]
    (out / f"families_{part}.md").write_text("\n".join(head + md) + "\n")
    print("\n".join(md))
    print(f"wrote {out / f'families_{part}.md'}")


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]


def rotations(items: list[str], rounds: int) -> list[list[str]]:
    """``rounds`` orders of ``items``, each rotated by one (a slow spell hits every item)."""
    return [items[r % len(items) :] + items[: r % len(items)] for r in range(rounds)]


def plot(args: argparse.Namespace, draw: Callable[[Path], Any], part: str) -> None:
    if args.no_plots:
        return
    try:
        draw(args.out / f"families_{part}.png")
        print(f"wrote {args.out / f'families_{part}.png'}")
    except ImportError as e:  # matplotlib missing: the tables are the result
        print(f"no picture for {part}: {e}")


# -- 1. Tiny Shakespeare -------------------------------------------------------------------------


def shakespeare_run(args: argparse.Namespace, family: str, steps: int, name: str) -> dict[str, Any]:
    """Train ``family`` for ``steps`` steps with the recipe into ``--runs/name``; what it did."""
    over = {**QUIET, **args.lm, "arch": FAMILIES[family], "steps": steps,
            "eval_every": max(1, steps // 10), "eval_batches": args.eval_batches, "log_every": 1,
            "warmup": min(args.lm.get("warmup", 100), steps // 4)}  # fmt: skip
    run = args.runs / name
    prepared, result = train_recipe("shakespeare-char", run, over, overwrite=True)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rates = [m["tokens_per_s"] for m in lines if m["split"] == "train"]
    tokens = prepared.train.batch_size * prepared.objective.block_size  # type: ignore[attr-defined]
    tok_s = statistics.median(rates)
    return {"run": str(run), "params": prepared.n_params, "steps": result.step,
            "val_loss": result.evals[-1]["val_loss"], "tokens_per_s": tok_s,
            "median_step_s": tokens / tok_s, "train_s": result.step * tokens / tok_s,
            "elapsed_s": result.elapsed_s}  # fmt: skip


def part_shakespeare(args: argparse.Namespace, meta: dict[str, Any]) -> None:
    runs: dict[str, dict[str, Any]] = {}
    for family in args.families:  # equal steps
        runs[family] = {"equal_steps": shakespeare_run(args, family, args.steps, family)}
    first = args.families[0]
    budget = runs[first]["equal_steps"]["train_s"]
    for family in args.families:  # equal wall time: the first family's training time
        done = runs[family]["equal_steps"]
        steps = max(1, int(budget / done["median_step_s"]))
        same = family == first or steps == done["steps"]
        runs[family]["equal_time"] = done if same else shakespeare_run(
            args, family, steps, f"{family}-equal-time"
        )  # fmt: skip
    rows = [[f, f"{r['equal_steps']['params']:,}", r["equal_steps"]["steps"],
             f"{r['equal_steps']['val_loss']:.4f}", f"{r['equal_steps']['tokens_per_s']:,.0f}",
             r["equal_time"]["steps"], f"{r['equal_time']['train_s']:.0f}",
             f"{r['equal_time']['val_loss']:.4f}"] for f, r in runs.items()]  # fmt: skip
    md = [f"Equal wall time = {first}'s training time ({budget:.0f} s: steps x median step).", ""]
    md += table(["family", "params", "steps", "val loss", "train tok/s", "steps (equal time)",
                 "train s", "val loss (equal time)"], rows)  # fmt: skip
    write(args, "shakespeare", meta, {"budget_s": budget, "runs": runs}, md)

    def draw(path: Path) -> None:
        from attnlab.viz import plot_curves

        plot_curves([r["equal_steps"]["run"] for r in runs.values()],
                    title="Tiny Shakespeare, equal steps", path=path)  # fmt: skip

    plot(args, draw, "shakespeare")


# -- 2. training throughput vs sequence length --------------------------------------------------


def make_trainer(family: str, B: int, T: int) -> Trainer:
    """A trainer of the recipe's ``family`` model on ``B`` blocks of ``T`` tokens."""
    over = {**QUIET, "arch": FAMILIES[family], "block_size": T, "batch_size": B,
            **({"max_seq_len": T} if is_gpt(family) else {})}  # fmt: skip
    p = prepare("shakespeare-char", over)
    trainer = Trainer(p.model, p.objective, p.train)
    trainer.train_step()  # warm-up
    return trainer


def timed_steps(trainer: Trainer, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        trainer.train_step()
        out.append(time.perf_counter() - t0)
    return out


def part_seqlen(args: argparse.Namespace, meta: dict[str, Any]) -> None:
    results: dict[str, dict[int, float]] = {f: {} for f in args.families}
    cases = []
    for T in args.seq_lens:
        B = max(1, args.tokens_per_batch // T)
        trainers = {f: make_trainer(f, B, T) for f in args.families}
        times: dict[str, list[float]] = {f: [] for f in args.families}
        for order in rotations(args.families, args.rounds):
            for f in order:
                times[f] += timed_steps(trainers[f], args.repeats)
        for f in args.families:
            step = statistics.median(times[f])
            results[f][T] = B * T / step
            cases.append({"n": T, "backend": f, "time_s": step / (B * T)})
            print(f"T={T} {f}: {B * T / step:,.0f} tok/s")
    exps = {f: fit_exponent(list(r), [1 / v for v in r.values()]) for f, r in results.items()}
    rows = [[T, *(f"{results[f][T]:,.0f}" for f in args.families)] for T in args.seq_lens]
    rows.append(
        [
            "exponent of time/token in T",
            *(f"{exps[f]:.2f}" if exps[f] is not None else "-" for f in args.families),
        ]
    )
    md = [f"Training tokens/s (Trainer.train_step), {args.tokens_per_batch} tokens per batch "
          "(B = tokens / T).", ""]  # fmt: skip
    md += table(["T", *args.families], rows)
    write(args, "seqlen", meta, {"tokens_per_s": results, "exponent_time_per_token": exps}, md)

    def draw(path: Path) -> None:
        from attnlab.viz import plot_benchmark

        plot_benchmark(cases, memory_key=None, style=None, x_label="block length T",
                       title="Training time per token", path=path)  # fmt: skip

    plot(args, draw, "seqlen")


# -- 3. long-range recall ------------------------------------------------------------------------


def part_recall(args: argparse.Namespace, meta: dict[str, Any]) -> None:
    results: dict[str, dict[str, dict[int, dict[str, float]]]] = {}
    # --recall-backends: each GPT family again with those attention backends ("gpt+bigbird")
    columns = [*args.families, *(f"{f}+{b}" for f in args.families if is_gpt(f)
                                 for b in args.recall_backends)]  # fmt: skip
    for kind in args.kinds:
        results[kind] = {f: {} for f in columns}
        for d in args.distances:
            for f in columns:
                family, _, backend = f.partition("+")
                options = args.recall_options.get(backend)
                over = {**QUIET, **args.recall_sizes, "arch": FAMILIES[family], "kind": kind,
                        **({"attn_backend": backend} if backend else {}),
                        **({"attn_options": {backend: options}} if options else {}),
                        "distance": d, "steps": args.recall_steps,
                        "batch_size": args.recall_batch, "eval_every": 0,
                        "eval_batches": max(1, args.recall_eval // args.recall_batch),
                        "warmup": min(100, args.recall_steps // 4)}  # fmt: skip
                run = args.runs / f"recall-{kind}-d{d}-{f}"
                _, result = train_recipe("recall", run, over, overwrite=True)
                acc = result.evals[-1]["val_accuracy"]
                results[kind][f][d] = {"accuracy": acc, "train_s": result.elapsed_s}
                print(f"recall {kind} d={d} {f}: {acc:.3f} ({result.elapsed_s:.0f} s)")
    md = [f"Accuracy (chance 1/16) after {args.recall_steps} steps of batch {args.recall_batch}, "
          "per distance d (`attnlab train recall`).", ""]  # fmt: skip
    if args.recall_backends:
        md += ["Backends: " + "; ".join(
            f"`{b}`: `{get_attention_backend(b, **args.recall_options.get(b, {}))!r}`"
            for b in args.recall_backends) + ".", ""]  # fmt: skip
    for kind in args.kinds:
        rows = [[d, *(f"{results[kind][f][d]['accuracy']:.3f}" for f in columns)]
                for d in args.distances]  # fmt: skip
        md += [f"### {kind}", "", *table(["d", *columns], rows), ""]
    data = {"steps": args.recall_steps, "options": args.recall_options, "results": results}
    write(args, "recall", meta, data, md)

    def draw(path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(args.kinds), figsize=(5 * len(args.kinds), 3.6),
                                 squeeze=False)  # fmt: skip
        for ax, kind in zip(axes[0], args.kinds, strict=True):
            for f in columns:
                ax.plot(args.distances, [results[kind][f][d]["accuracy"] for d in args.distances],
                        "o-", label=f)  # fmt: skip
            ax.axhline(1 / 16, color="grey", ls=":", lw=0.8)
            ax.set(xscale="log", xlabel="distance d", ylabel="accuracy", ylim=(0, 1.05),
                   title=f"{kind} at distance d")  # fmt: skip
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    plot(args, draw, "recall")


# -- 4. decoding latency and memory vs context ---------------------------------------------------


def kept_bytes(session: Any) -> int:
    """Bytes a session keeps for its sequences: the state, or the filled part of the cache."""
    state = getattr(session, "state", None)
    if state is not None:
        return int(state.nbytes())
    total = 0
    for layer in session.cache.self_attn:
        n = layer.length
        total += layer.k[:, :, :n].nbytes + layer.v[:, :, :n].nbytes
    return total


def decode_case(model: Any, n: int, steps: int) -> tuple[list[float], int]:
    """Per-token times of ``steps`` greedy steps after an ``n``-token prefill, through the
    generation session (as ``generate`` runs it); the bytes the session keeps."""
    prompt = torch.randint(
        3, model.config.vocab_size, (n,), generator=torch.Generator().manual_seed(n)
    )
    config = GenerationConfig(max_new_tokens=steps + 1, context="error")
    request = prepare_request(model, [prompt.tolist()], config)
    times = []
    engine = resolve_engine(model, "auto", rows=1, max_new_tokens=steps + 1)
    with eval_mode(model), runner_for(model, engine, 1) as runner, torch.inference_mode():
        session = open_session(request, runner=runner)
        logits = session.prefill()
        for _ in range(steps):
            token = logits.argmax(-1)
            t0 = time.perf_counter()
            logits = session.step(token)
            times.append(time.perf_counter() - t0)
        return times, kept_bytes(session)


def part_decode(args: argparse.Namespace, meta: dict[str, Any]) -> None:
    top = max(args.contexts) + args.decode_steps + 2
    models = {}
    for f in args.families:
        over = {**QUIET, "arch": FAMILIES[f], **({"max_seq_len": top} if is_gpt(f) else {})}
        models[f] = prepare("shakespeare-char", over).model.eval()
    for f in args.families:  # warm-up: the first call makes the decode-time weight copies
        decode_case(models[f], args.contexts[0], 1)
    lat: dict[str, dict[int, float]] = {f: {} for f in args.families}
    mem: dict[str, dict[int, dict[str, int]]] = {f: {} for f in args.families}
    cases = []
    for n in args.contexts:
        times: dict[str, list[float]] = {f: [] for f in args.families}
        for order in rotations(args.families, args.rounds):
            for f in order:
                t, nbytes = decode_case(models[f], n, args.decode_steps)
                times[f] += t
                closed = decode_state_bytes(models[f].config, n + args.decode_steps)
                mem[f][n] = {"measured": nbytes, "closed_form": closed}
        for f in args.families:
            lat[f][n] = statistics.median(times[f])
            cases.append({"n": n, "backend": f, "time_s": lat[f][n],
                          "peak_mem_bytes": mem[f][n]["measured"]})  # fmt: skip
    gpts = [f for f in args.families if is_gpt(f)]
    others = [f for f in args.families if f not in gpts]
    # The smallest context from which a recurrent family decodes faster than a GPT, for good;
    # and the context at which the GPT's KV cache outgrows the recurrent state (closed form).
    cross = {f"{f} vs {g}": crossover(lat[f], lat[g]) for f in others for g in gpts}
    mem_cross = {f"{f} vs {g}": state_crossover(models[f].config, models[g].config)
                 for f in others for g in gpts}  # fmt: skip
    rows = [[n, *(f"{1e3 * lat[f][n]:.2f}" for f in args.families),
             *(f"{mem[f][n]['measured'] / 1024:,.0f}" for f in args.families)]
            for n in args.contexts]  # fmt: skip
    md = ["Per-token decode latency (ms, median) and KiB kept per sequence, batch 1.", ""]
    header = ["context", *(f"{f} ms" for f in args.families), *(f"{f} KiB" for f in args.families)]
    md += [*table(header, rows), ""]
    md += [f"- faster from context {n} on: {k}" for k, n in cross.items()]
    md += [f"- KV cache larger than the state from context {n}: {k}" for k, n in mem_cross.items()]
    data = {"latency_s": lat, "bytes": mem, "faster_from": cross, "memory_crossover": mem_cross,
            "recurrent": [f for f in args.families if is_recurrent(models[f])]}  # fmt: skip
    write(args, "decode", meta, data, md)

    def draw(path: Path) -> None:
        from attnlab.viz import plot_benchmark

        plot_benchmark(cases, style=None, x_label="context n (tokens before the new one)",
                       title="Decoding one token: latency and memory kept", path=path)  # fmt: skip

    plot(args, draw, "decode")


PARTS: dict[str, Callable[[argparse.Namespace, dict[str, Any]], None]] = {
    "shakespeare": part_shakespeare,
    "seqlen": part_seqlen,
    "recall": part_recall,
    "decode": part_decode,
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    def ints(s: str) -> list[int]:
        return [int(x) for x in s.split(",")]

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--only", default=",".join(PARTS), help="parts, comma-separated")
    p.add_argument("--families", default=DEFAULT_FAMILIES, help=f"of {', '.join(FAMILIES)}")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (checks the script runs)")
    p.add_argument("--out", type=Path, default=None, help="results directory")
    p.add_argument(
        "--runs",
        type=Path,
        default=None,
        help="where the trained runs go (default runs/families; smoke: OUT/runs)",
    )
    p.add_argument("--no-plots", action="store_true", help="tables only")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--steps", type=int, default=2000, help="shakespeare: steps per family")
    p.add_argument("--eval-batches", type=int, default=50, help="shakespeare: val batches")
    p.add_argument("--seq-lens", type=ints, default=[64, 128, 256, 512, 1024, 2048, 4096])
    p.add_argument("--tokens-per-batch", type=int, default=4096, help="seqlen: B·T")
    p.add_argument("--rounds", type=int, default=3, help="seqlen/decode: rotated rounds")
    p.add_argument("--repeats", type=int, default=3, help="seqlen: timed steps per round")
    p.add_argument("--kinds", default="copy", help="recall: copy,associative")
    p.add_argument("--recall-backends", default="",
                   help="recall: also train each GPT family with these attention backends, "
                        "e.g. sparse_strided,sparse_fixed,bigbird,lsh")  # fmt: skip
    p.add_argument("--recall-options", type=json.loads, default={},
                   help="recall: the backends' options as JSON, by backend name (the model's "
                        "attn_options), e.g. '{\"bigbird\": {\"block\": 16}}'")  # fmt: skip
    p.add_argument("--distances", type=ints, default=[4, 16, 64, 256])
    p.add_argument("--recall-steps", type=int, default=1000)
    p.add_argument("--recall-batch", type=int, default=16)
    p.add_argument("--recall-eval", type=int, default=2048, help="recall: validation sequences")
    p.add_argument("--contexts", type=ints, default=[128, 256, 512, 1024, 2048, 4096, 8192])
    p.add_argument("--decode-steps", type=int, default=16, help="decode: timed tokens per round")
    args = p.parse_args(argv)
    args.only = [x for x in args.only.split(",") if x]
    args.families = [x for x in args.families.split(",") if x]
    args.kinds = [x for x in args.kinds.split(",") if x]
    args.recall_backends = [x for x in args.recall_backends.split(",") if x]
    if not isinstance(args.recall_options, dict):
        p.error(f"--recall-options must be a JSON object, got {args.recall_options!r}")
    for name, valid in (
        ("only", PARTS),
        ("families", FAMILIES),
        ("kinds", ("copy", "associative")),
        ("recall_backends", ATTENTION_BACKENDS.keys()),
        ("recall_options", args.recall_backends),
    ):
        bad = sorted(set(getattr(args, name)) - set(valid))
        if bad:
            p.error(f"--{name.replace('_', '-')}: unknown {bad}; valid: {', '.join(valid)}")
    args.lm, args.recall_sizes = {}, {}
    if args.smoke:
        args.steps, args.eval_batches, args.seq_lens, args.tokens_per_batch = 3, 1, [16, 32], 64
        args.rounds, args.repeats, args.distances, args.recall_steps = 1, 1, [2, 4], 2
        args.recall_eval, args.contexts, args.decode_steps = 32, [8, 16], 2
        args.lm = {"batch_size": 2, "block_size": 16, "warmup": 1}
        args.out = args.out or Path("/tmp/attnlab_families_smoke")
    args.runs = args.runs or (args.out / "runs" if args.smoke else Path("runs") / "families")
    args.out = args.out or RESULTS
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    os.environ.setdefault(
        "ATTNLAB_DATA", str(Path(__file__).resolve().parents[2] / "shared" / "data")
    )
    if args.threads:
        torch.set_num_threads(args.threads)
    meta = machine_info()
    for part in args.only:
        PARTS[part](args, meta)


if __name__ == "__main__":
    main()
