"""What the heads of a trained translation model attend to (course exercise 5).

    python benchmarks/course_translation_heads.py RUN_DIR     # a run of `attnlab train translate`
    python benchmarks/course_translation_heads.py RUN_DIR --checkpoint last --sentences 200

Loads the run's model (``averaged/``, else ``best/``, else ``last/``, or ``--checkpoint``), runs
it teacher-forced on the first ``--sentences`` pairs of a Multi30k split (the validation split by
default: never the test split), one pair at a time so that no padding enters the averages,
records every attention layer on the math path (:func:`attnlab.viz.collect_attention`) and
scores each head, averaged over the sentences (weights ``A[i, j]``, query ``i``, key ``j``):

- ``diagonal``: the mean weight a query puts on its own position, ``A[i, i]``;
- ``previous``: on the token before it, ``A[i, i - 1]``; ``next``: after it, ``A[i, i + 1]``
  (the encoder only: the decoder cannot look ahead);
- ``special``: on the sequence's special token: the source's final ``</s>`` (encoder
  self-attention, cross-attention), the decoder input's ``<s>`` (decoder self-attention);
- ``broad``: the entropy of a query's weights over the keys it may see, divided by the log of
  their number (1: uniform, 0: one key);
- ``monotonic`` (cross-attention): the correlation, over the target positions, between the
  position and the attention-weighted mean source position (special tokens left out): near 1
  when the head walks along the source as the translation proceeds, an alignment.

Queries that may see fewer than two keys (the decoder's first) are left out. The rule, in this
order: a positional label (``diagonal``, ``previous-token``, ``next-token``) when its score is
>= 0.5 (most of the weight on one relative position); ``[EOS]`` / ``[BOS]`` when ``special``
>= 0.5; for cross-attention ``alignment`` when ``monotonic`` >= 0.7; ``broad`` when ``broad``
>= 0.75; else ``mixed``.

Writes ``benchmarks/results/course/translation_heads.json`` (scores, labels, the run and the
example sentence's attention maps, for the page's picture) and ``translation_heads.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnlab.translation import load_pairs
from attnlab.viz import collect_attention

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "course"
STACKS = ("encoder", "decoder", "cross")
THRESHOLDS = {"positional": 0.5, "special": 0.5, "monotonic": 0.7, "broad": 0.75}
SPECIAL = {"encoder": "[EOS]", "decoder": "[BOS]", "cross": "[EOS]"}


def head_scores(weights: Tensor, stack: str) -> dict[str, Tensor]:
    """Pattern scores of every head of one layer, for one sentence.

    Args:
        weights: ``(H, T, S)``; encoder and decoder self-attention are square, and the source's
            last key is its ``</s>``; the decoder's first key is its ``<s>``.
        stack: ``"encoder"``, ``"decoder"`` or ``"cross"``.

    Returns:
        score name -> ``(H,)`` (see the module docstring).
    """
    w = weights.double()
    _, T, S = w.shape
    visible = (
        torch.arange(T)[:, None] >= torch.arange(S)[None, :]
        if stack == "decoder"
        else torch.ones(T, S, dtype=torch.bool)
    )  # (T, S)
    rows = visible.sum(-1) >= 2  # (T,) queries with a choice
    entropy = -(w * w.clamp_min(1e-12).log()).sum(-1)  # (H, T)
    broad = (entropy / visible.sum(-1).clamp_min(2).log())[:, rows].mean(-1)
    special = w[:, rows, 0 if stack == "decoder" else S - 1].mean(-1)
    out = {"special": special, "broad": broad}
    if stack == "cross":
        out["monotonic"] = _monotonic(w)
        return out
    idx = torch.arange(T)
    out["diagonal"] = w[:, idx, idx][:, rows].mean(-1)
    out["previous"] = w[:, idx[1:], idx[1:] - 1][:, rows[1:]].mean(-1)
    if stack == "encoder":
        out["next"] = w[:, idx[:-1], idx[:-1] + 1].mean(-1)
    return out


def _monotonic(w: Tensor) -> Tensor:
    """``(H,)`` correlation of target position and expected source position (cross-attention).

    The source's ``</s>`` (last key) and the row producing ``</s>`` (last query) are left out;
    the weights are renormalised over the remaining keys."""
    a = w[:, :-1, :-1]  # (H, T-1, S-1)
    a = a / a.sum(-1, keepdim=True).clamp_min(1e-12)
    pos = (a * torch.arange(a.shape[-1], dtype=a.dtype)).sum(-1)  # (H, T-1)
    t = torch.arange(a.shape[1], dtype=a.dtype)
    if a.shape[1] < 3:
        return torch.full((w.shape[0],), math.nan, dtype=w.dtype)
    pc, tc = pos - pos.mean(-1, keepdim=True), t - t.mean()
    denom = (pc.norm(dim=-1) * tc.norm()).clamp_min(1e-12)
    return (pc * tc).sum(-1) / denom


def classify(stack: str, scores: dict[str, float]) -> str:
    """The label of one head from its (averaged) scores, by the rule of the module docstring."""
    positional = {"diagonal": "diagonal", "previous": "previous-token", "next": "next-token"}
    present = {k: scores[k] for k in positional if k in scores}
    if present:
        best = max(present, key=lambda k: present[k])
        if present[best] >= THRESHOLDS["positional"]:
            return positional[best]
    if scores["special"] >= THRESHOLDS["special"]:
        return SPECIAL[stack]
    if stack == "cross" and scores.get("monotonic", math.nan) >= THRESHOLDS["monotonic"]:
        return "alignment"
    if scores["broad"] >= THRESHOLDS["broad"]:
        return "broad"
    return "mixed"


@torch.no_grad()
def attention_stacks(model: Any, tokenizer: Any, source: str, target: str) -> dict[str, list]:
    """Every layer's weights ``(H, T, S)`` for one teacher-forced pair, by stack."""
    src = torch.tensor([[*tokenizer.encode(source), tokenizer.eos_id]])  # (1, S)
    tgt = torch.tensor([[tokenizer.bos_id, *tokenizer.encode(target)]])  # (1, T)
    stacks = collect_attention(model, src, tgt)
    return {s: [w[0].float() for w in stacks[s]] for s in STACKS}


def analyse(
    model: Any, tokenizer: Any, pairs: Sequence[tuple[str, str]], *, max_len: int | None = None
) -> dict[str, Any]:
    """Scores averaged over ``pairs`` and labels: ``{"heads": [...], "n_sentences": N}``.

    Each head: ``{"stack", "layer", "head", "label", "scores": {name: value}}``."""
    n = max_len or model.config.max_seq_len
    sums: dict[tuple[str, int], dict[str, Tensor]] = {}
    counts: dict[tuple[str, int], dict[str, Tensor]] = {}
    used = 0
    for source, target in pairs:
        if len(tokenizer.encode(source)) + 1 > n or len(tokenizer.encode(target)) + 1 > n:
            continue
        for stack, layers in attention_stacks(model, tokenizer, source, target).items():
            for layer, w in enumerate(layers):
                for name, value in head_scores(w, stack).items():
                    ok = ~torch.isnan(value)
                    key = (stack, layer)
                    sums.setdefault(key, {}).setdefault(name, torch.zeros_like(value))
                    counts.setdefault(key, {}).setdefault(name, torch.zeros_like(value))
                    sums[key][name] += torch.where(ok, value, 0.0)
                    counts[key][name] += ok
        used += 1
    heads = []
    for (stack, layer), named in sums.items():
        H = next(iter(named.values())).shape[0]
        for h in range(H):
            scores = {k: float(v[h] / counts[(stack, layer)][k][h]) for k, v in named.items()}
            heads.append(
                {"stack": stack, "layer": layer, "head": h, "label": classify(stack, scores),
                 "scores": {k: round(v, 4) for k, v in scores.items()}}
            )  # fmt: skip
    order = {s: i for i, s in enumerate(STACKS)}
    heads.sort(key=lambda r: (order[r["stack"]], r["layer"], r["head"]))
    return {"heads": heads, "n_sentences": used}


def example_maps(model: Any, tokenizer: Any, source: str, target: str) -> dict[str, Any]:
    """One pair's attention maps (rounded) and token labels, for the picture."""
    from attnlab.viz.attention import clean_token

    stacks = attention_stacks(model, tokenizer, source, target)
    src_ids = [*tokenizer.encode(source), tokenizer.eos_id]
    tgt_ids = [tokenizer.bos_id, *tokenizer.encode(target)]
    return {
        "source": source,
        "target": target,
        "source_tokens": [clean_token(t) for t in tokenizer.tokens(src_ids)],
        "target_tokens": [clean_token(t) for t in tokenizer.tokens(tgt_ids)],
        "maps": {s: [(torch.round(w * 1000) / 1000).tolist() for w in stacks[s]] for s in STACKS},
    }


def plot_heads(example: dict[str, Any], heads: list[dict[str, Any]], path: Any = None) -> Any:
    """A grid of the example's attention maps: one row per stack and layer, one column per
    head, each titled with the head's label and its deciding score."""
    from matplotlib.figure import Figure

    maps = example["maps"]
    rows = [(s, layer) for s in STACKS for layer in range(len(maps[s]))]
    H = len(maps[STACKS[0]][0])
    label = {(r["stack"], r["layer"], r["head"]): r for r in heads}
    fig = Figure(figsize=(2.0 * H + 0.6, 2.0 * len(rows) + 0.4), dpi=60)
    axes = fig.subplots(len(rows), H, squeeze=False)
    for r, (stack, layer) in enumerate(rows):
        for h in range(H):
            ax = axes[r][h]
            ax.imshow(maps[stack][layer][h], cmap="viridis", vmin=0, aspect="auto")
            info = label[(stack, layer, h)]
            key = deciding_score(info)
            score = info["scores"][key]
            ax.set_title(f"{stack} L{layer} H{h}\n{info['label']} ({key} {score:.2f})", fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(f"rows: queries, columns: keys — {example['source']!r}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    if path is not None:
        fig.savefig(path)
    return fig


def deciding_score(head: dict[str, Any]) -> str:
    """The score the label was decided by (for a ``mixed`` head: its largest positional one)."""
    by_label = {"diagonal": "diagonal", "previous-token": "previous", "next-token": "next",
                "[EOS]": "special", "[BOS]": "special", "alignment": "monotonic",
                "broad": "broad"}  # fmt: skip
    if head["label"] in by_label:
        return by_label[head["label"]]
    s = head["scores"]
    return max((k for k in ("diagonal", "previous", "next", "special", "monotonic") if k in s),
               key=lambda k: s[k])  # fmt: skip


def write_report(result: dict[str, Any], out: Path) -> None:
    lines = [
        "# Course exercise 5: what the heads of a translation model attend to",
        "",
        f"`{result['command']}` on {result['host']}, {result['date']} ({result['seconds']:.0f} s).",
        "",
        f"Model: `{result['model_dir']}` ({result['n_params']:,} parameters, "
        f"{result['train_steps']} training steps; at export: "
        + ", ".join(f"{k} {v:.3f}" for k, v in result["model_val"].items())
        + "). Scores averaged over the first "
        f"{result['n_sentences']} pairs of the {result['split']} split, teacher-forced.",
        "",
        "| stack | layer | head | label | " + " | ".join(SCORE_NAMES) + " |",
        "|---|---|---|---|" + "---|" * len(SCORE_NAMES),
    ]
    for h in result["heads"]:
        cells = [f"{h['scores'][k]:.2f}" if k in h["scores"] else "" for k in SCORE_NAMES]
        lines.append(f"| {h['stack']} | {h['layer']} | {h['head']} | {h['label']} | "
                     + " | ".join(cells) + " |")  # fmt: skip
    counts: dict[str, int] = {}
    for h in result["heads"]:
        counts[h["label"]] = counts.get(h["label"], 0) + 1
    lines += ["", "Labels: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), ""]
    (out / "translation_heads.md").write_text("\n".join(lines), encoding="utf-8")


SCORE_NAMES = ("diagonal", "previous", "next", "special", "monotonic", "broad")


def main() -> None:
    from attnlab.training.recipes.translation import load_translator

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path, help="a run directory of `attnlab train translate`")
    ap.add_argument("--checkpoint", choices=("averaged", "best", "last"), default=None)
    ap.add_argument("--split", default="val")
    ap.add_argument("--sentences", type=int, default=100)
    ap.add_argument("--example", type=int, default=0, help="the pair drawn in the picture")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    start = time.monotonic()
    tr = load_translator(args.run_dir, args.checkpoint)
    record = json.loads((args.run_dir / "run.json").read_text(encoding="utf-8"))
    opts = record.get("options", {})
    pairs = load_pairs(opts["data"], args.split, opts.get("src", "de"), opts.get("tgt", "en"),
                       limit=args.sentences)  # fmt: skip
    result = analyse(tr.model, tr.tokenizer, pairs)
    result.update(
        {
            "command": "python benchmarks/course_translation_heads.py " + " ".join(sys.argv[1:]),
            "host": f"{platform.machine()} {os.cpu_count()} cpus, {platform.platform()}",
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "torch": torch.__version__,
            "run_dir": str(args.run_dir),
            "model_dir": str(tr.path),
            "run_command": record.get("sessions", [{}])[0].get("command", ""),
            "n_params": sum(p.numel() for p in tr.model.parameters()),
            "train_steps": tr.info.get("step"),  # the exported model's step
            "model_val": {k: v for k, v in tr.info.items() if k.startswith("val_")},
            "split": args.split,
            "thresholds": THRESHOLDS,
            "example": example_maps(tr.model, tr.tokenizer, *pairs[args.example]),
        }
    )
    result["seconds"] = time.monotonic() - start
    args.out.mkdir(parents=True, exist_ok=True)
    text = json.dumps({**result, "example": "@example@"}, indent=1)  # the maps on one line
    text = text.replace('"@example@"', json.dumps(result["example"]))
    (args.out / "translation_heads.json").write_text(text + "\n", encoding="utf-8")
    write_report(result, args.out)
    for h in result["heads"]:
        print(f"{h['stack']:8s} L{h['layer']} H{h['head']}: {h['label']:15s} {h['scores']}")
    print(f"wrote {args.out / 'translation_heads.json'} ({result['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
