"""RLHF in miniature on a CPU: base LM -> reward model -> DPO, with a before/after table.

1. base: ``attnlab train shakespeare-char`` (the baby GPT) for ``--base-steps`` steps, or the
   run given by ``--base``;
2. reward model: ``shakespeare-reward`` (Bradley-Terry on pairs of the base's samples judged by
   ``--property``, default ``no-e``: the completion has no letter e);
3. policy: ``shakespeare-dpo`` (DPO, β = ``--beta``) from the base, against its frozen copy;
4. evaluation on ``--n`` prompts from the held-out text (the validation split, never used for
   pairs): the property's rate and the reward model's mean reward on the base's and the
   policy's samples (same sampling seed), KL(π ‖ π_ref) per token on the policy's samples, the
   next-character loss on held-out text, and three samples side by side.

Results go to ``benchmarks/results/course/rlhf_mini.{json,md}`` (read by
``docs/course/*/lab4-rlhf-dpo.md``)::

    OMP_NUM_THREADS=1 python benchmarks/rlhf_mini.py             # about 6-8 minutes
    OMP_NUM_THREADS=1 python benchmarks/rlhf_mini.py --smoke     # seconds, to a temp folder
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import course_common as cc

from attnlab.training.preference import property_rate, sample_completions, sampled_kl
from attnlab.training.recipes import load_run, train_recipe

QUIET = {"progress": False, "checkpoint_every": 0, "log_every": 10**9}
EVAL_SEED = 1234
CPU_S: dict[str, float] = {}  # CPU seconds of this process per stage (the machine is shared)


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", default=None, help="a trained shakespeare-char run directory")
    p.add_argument("--base-steps", type=int, default=2000)
    p.add_argument("--reward-steps", type=int, default=100)
    p.add_argument("--property", default="no-e")
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--prompts", type=int, default=1024)
    p.add_argument("--n", type=int, default=512, help="evaluation prompts")


def stage(name: str, recipe: str, out: Path, overrides: dict[str, Any]) -> tuple[Any, Any, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    prepared, result = train_recipe(recipe, out, {**QUIET, **overrides})
    wall = time.perf_counter() - t0
    CPU_S[name] = round(time.process_time() - c0, 1)
    print(f"{name}: {recipe} {overrides} -> {result.evals[-1] if result.evals else {}} "
          f"({wall:.0f} s)", flush=True)  # fmt: skip
    return prepared, result, wall


@torch.no_grad()
def evaluate(base: Any, dpo: Any, reward: Any, n: int, prop: str) -> dict[str, Any]:
    """The before/after figures on ``n`` held-out prompts."""
    options, tok = dpo.options, dpo.tokenizer
    stream = base.data.value
    g = torch.Generator().manual_seed(EVAL_SEED)
    prompts = stream.blocks("val", n, options.prompt_len, g)  # (N, P)
    mask = torch.cat([torch.zeros(options.prompt_len, dtype=torch.bool),
                      torch.ones(options.completion_len, dtype=torch.bool)])  # fmt: skip
    reference = base.model.eval()
    reward_model = reward.model.eval()
    rows: dict[str, Any] = {}
    texts: dict[str, list[str]] = {}
    for name, model in (("base", reference), ("dpo", dpo.model.eval())):
        gen = torch.Generator().manual_seed(EVAL_SEED + 1)  # the same draws for both models
        samples = sample_completions(model, prompts, length=options.completion_len, generator=gen)
        ids = torch.cat([prompts, samples], 1)  # (N, P+C)
        texts[name] = [tok.decode(s.tolist()) for s in samples]
        rows[name] = {
            "rate": property_rate(texts[name], prop),
            "mean_reward": float(reward_model(ids).mean()),
            "kl_to_reference": sampled_kl(model, reference, ids, mask),
            "heldout_char_loss": cc.val_loss(model, stream, 64, batch=16, n_tokens=8192),
            "mean_e_per_completion": sum(t.lower().count("e") for t in texts[name]) / n,
        }
    side = [{"prompt": tok.decode(prompts[i].tolist()), "base": texts["base"][i],
             "dpo": texts["dpo"][i]} for i in range(3)]  # fmt: skip
    return {"n": n, "rows": rows, "samples": side}


def markdown(data: dict[str, Any]) -> str:
    rows = data["eval"]["rows"]
    lines = [
        f"# RLHF in miniature: DPO towards `{data['settings']['property']}`",
        "",
        f"{data['meta']['machine']}; {data['meta']['date_utc'][:16]}",
        f"command: `{data['meta']['command']}`",
        "",
        f"| model | rate of `{data['settings']['property']}` | mean reward "
        "| KL to ref (nats/token) | held-out char loss | e per completion |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['rate']:.3f} | {r['mean_reward']:.3f} | "
                     f"{r['kl_to_reference']:.3f} | {r['heldout_char_loss']:.3f} | "
                     f"{r['mean_e_per_completion']:.2f} |")  # fmt: skip
    lines += [
        "",
        f"N = {data['eval']['n']} held-out prompts; stages, wall (s): {data['wall_s']}; CPU (s): "
        f"{data['cpu_s']}",
        "",
    ]
    lines += ["| prompt | base | DPO |", "|---|---|---|"]
    for s in data["eval"]["samples"]:
        cells = [repr(s[k])[1:-1].replace("|", "\\|") for k in ("prompt", "base", "dpo")]
        lines.append("| " + " | ".join(f"`{c}`" for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args, steps, command = cc.parse("benchmarks/rlhf_mini.py", __doc__ or "", 60, argv, _args)
    cc.data_env()
    smoke = args.smoke
    work = Path(tempfile.mkdtemp(prefix="rlhf_mini_"))
    pairs = {"property": args.property, "prompts": 128 if smoke else args.prompts,
             "val_pairs": 8 if smoke else 64}  # fmt: skip
    wall: dict[str, float] = {}
    base_dir = args.base
    if base_dir is None:
        base_dir = str(work / "base")
        base_steps = 20 if smoke else args.base_steps
        _, _, wall["base"] = stage("base", "shakespeare-char", Path(base_dir),
                                   {"steps": base_steps})  # fmt: skip
    reward, reward_fit, wall["reward"] = stage(
        "reward", "shakespeare-reward", work / "reward",
        {"base": base_dir, **pairs, "steps": 4 if smoke else args.reward_steps},
    )  # fmt: skip
    dpo, dpo_fit, wall["dpo"] = stage(
        "dpo", "shakespeare-dpo", work / "dpo",
        {"base": base_dir, **pairs, "steps": steps, "beta": args.beta, "lr": args.lr,
         "eval_every": max(steps // 4, 1)},
    )  # fmt: skip
    base = load_run(base_dir)
    t0, c0 = time.perf_counter(), time.process_time()
    result = evaluate(base, dpo, reward, 16 if smoke else args.n, args.property)
    wall["eval"] = time.perf_counter() - t0
    CPU_S["eval"] = round(time.process_time() - c0, 1)
    data = {
        "meta": cc.meta(command),
        "settings": {
            **pairs,
            "beta": args.beta,
            "lr": args.lr,
            "dpo_steps": steps,
            "reward_steps": reward.train.steps,
            "base": args.base or "trained here",
            "base_steps": None if args.base else (20 if smoke else args.base_steps),
            "prompt_len": dpo.options.prompt_len,
            "completion_len": dpo.options.completion_len,
        },
        "pairs": dpo.data.info,
        "reward_evals": reward_fit.evals,
        "dpo_evals": dpo_fit.evals,
        "eval": result,
        "wall_s": {k: round(v, 1) for k, v in wall.items()},
        "cpu_s": dict(CPU_S),
    }
    out = cc.write("rlhf_mini", data, markdown(data))
    print(markdown(data))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
