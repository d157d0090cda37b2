"""Decoding with weight-only int8 / int4 weights: attnlab vs transformers, and floors (issue 27).

Same process, same random weights (``attnlab.build_model("gpt2-small", dropout=0.0)``, copied into
transformers' ``GPT2LMHeadModel`` with :func:`attnlab.interop.save_hf`), same prompts, greedy
decoding with EOS off (every run makes exactly the requested tokens); the competitors take turns
(A B C, B C A, ...) so a slow spell of a shared machine hits each alike. Competitors:

- attnlab fp32 (its decode-time weight copies on, as ``generate`` does), and attnlab quantized by
  :func:`attnlab.quantize`: ``int8`` / ``int4`` (linears; the tied LM head and embedding stay
  fp32), ``+head`` (the LM head quantized too: 31% of GPT-2 small's weights; the embedding keeps
  its fp32 table for look-ups, so the tie is broken). Their rows are float32 into attnlab's own
  kernels (:mod:`attnlab.kernels`, the default where they build);
  ``--with-bf16act`` adds ``-bf16act`` variants: bfloat16 rows into PyTorch's kernels
  (``aten._weight_int8pack_mm``, ``aten._weight_int4pack_mm_for_cpu``), the default before them;
- transformers fp32 ``generate``;
- transformers' dynamic int8: ``torch.ao.quantization.quantize_dynamic(model, {nn.Linear})``
  (fbgemm/x86; it quantizes the *activations* too, per tensor, at every call). GPT-2's blocks are
  ``Conv1D`` modules, not ``nn.Linear``, so as is only the LM head is quantized ("lm_head only");
  a second variant first rewrites every ``Conv1D`` as an ``nn.Linear`` (same weights,
  transposed) so the whole model runs dynamic int8 ("Conv1D->Linear").

Measured per (batch, competitor): tokens/s of one whole call (prefill included: batch x new
tokens / wall time), and the median time of one decode step (the prefill left out). The floor of
a step is the bytes one step streams (every weight read once: ``quantized_weight_bytes`` for
attnlab; parameters, embedding tables only where a linear reads them, for transformers) divided
by the memory bandwidth measured here (a 256 MiB tensor copy, read + write, as in
``benchmarks/generation.py``); the ratio step / floor says how close a format gets to it.

A kernel table comes first: one GPT-2 FFN projection (768 -> 3072) and the LM head (768 ->
50257), 1 and 8 rows, through ``F.linear`` (fp32), attnlab's fp32 decode copy, the int8 and int4
kernels (attnlab's with float32 rows; PyTorch's with bfloat16 and with float32 rows), and the
reference (dequantize + ``F.linear``).

Results: ``benchmarks/results/quantized_decoding.{md,json}``.

    python benchmarks/quantized_decoding.py            # the full run (~10-15 min on 2 cores)
    python benchmarks/quantized_decoding.py --smoke    # tiny sizes, seconds (results to /tmp)
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import attnlab
from attnlab import kernels as woq_kernels
from attnlab.analysis.attention_bench import cpu_model, describe_machine, machine_info
from attnlab.generation import stream
from attnlab.generation.engines import DecodeSession
from attnlab.transforms import quantize, quantized_weight_bytes

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generation import _rotations, _StepClock, copy_bandwidth

RESULTS = Path(__file__).resolve().parent / "results"
HF, HF_DYN, HF_DYN_ALL = (
    "transformers fp32",
    "transformers dyn-int8 (lm_head only)",
    ("transformers dyn-int8 (Conv1D->Linear)"),
)
VARIANT = re.compile(
    r"(?P<fmt>int8|int4)(?:g(?P<g>\d+))?(?P<head>\+head)?(?P<emb>\+emb)?(?P<act>-f32act|-bf16act)?"
)
Run = Callable[[torch.Tensor, int], tuple[torch.Tensor, list[float]]]  # -> tokens, stamps


def parse_variant(name: str, group_size: int = 128) -> dict[str, Any] | None:
    """``quantize`` keyword arguments of a variant name (``None`` for ``"fp32"``): ``int8``,
    ``int4``, ``int4g32`` (group size), ``+head``, ``+emb``, ``-f32act`` / ``-bf16act`` (the
    activation dtype; default: the library's), e.g. ``int4+head``.

    Raises:
        ValueError: for a name of another form.
    """
    if name == "fp32":
        return None
    m = VARIANT.fullmatch(name)
    if m is None:
        raise ValueError(
            f"variant {name!r}: expected fp32 or int8|int4[gN][+head][+emb][-f32act|-bf16act]"
        )
    return {
        "format": m["fmt"],
        "group_size": int(m["g"]) if m["g"] else group_size,
        "include_lm_head": bool(m["head"]),
        "include_embedding": bool(m["emb"]),
        "activation_dtype": {"-f32act": "float32", "-bf16act": "bfloat16"}.get(m["act"] or ""),
    }


def quantized_copy(model: nn.Module, name: str, group_size: int = 128) -> nn.Module:
    """``model`` itself for ``"fp32"``, else a quantized deep copy (see :func:`parse_variant`)."""
    options = parse_variant(name, group_size)
    if options is None:
        return model
    fmt = options.pop("format")
    return quantize(copy.deepcopy(model), fmt, **options)


# -- models ------------------------------------------------------------------------------------


def build_models(config: Any, directory: Path) -> tuple[nn.Module, Any]:
    """(attnlab GPT, transformers GPT2LMHeadModel) with the same random weights, eval mode."""
    import transformers

    from attnlab.interop import save_hf

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    ours = attnlab.build_model(config).eval()
    save_hf(ours, directory)
    hf = transformers.GPT2LMHeadModel.from_pretrained(directory).eval()
    hf.generation_config.eos_token_id = None  # exactly max_new_tokens tokens every run
    hf.generation_config.pad_token_id = 0
    return ours, hf


def conv1d_as_linear(model: nn.Module) -> nn.Module:
    """A deep copy of a transformers GPT-2 with every ``Conv1D`` (weight ``(in, out)``) replaced
    by the equivalent ``nn.Linear`` (weight ``(out, in)``)."""
    from transformers.pytorch_utils import Conv1D

    model = copy.deepcopy(model)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Conv1D):
                n_in, n_out = child.weight.shape
                lin = nn.Linear(n_in, n_out)
                with torch.no_grad():
                    lin.weight.copy_(child.weight.t())
                    lin.bias.copy_(child.bias)
                setattr(parent, name, lin)
    return model


def hf_dynamic_int8(model: nn.Module, all_layers: bool) -> nn.Module:
    """transformers' model through ``torch.ao.quantization.quantize_dynamic`` (qint8)."""
    import warnings

    from torch.ao.quantization import quantize_dynamic

    source = conv1d_as_linear(model) if all_layers else copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated (still shipped)
        return quantize_dynamic(source, {nn.Linear}, dtype=torch.qint8).eval()


def hf_bytes_per_token(model: nn.Module) -> int:
    """Bytes one step streams: parameters (embedding tables only where a linear reads them) and
    dynamic-int8 weights (1 byte each, fp32 biases)."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    total, seen = 0, set()
    for module in model.modules():
        if isinstance(module, DynamicLinear):
            bias = module.bias()
            total += module.weight().numel() + (0 if bias is None else bias.numel() * 4)
            continue
        if isinstance(module, nn.Embedding):
            continue
        for p in module.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel() * p.element_size()
    return total


# -- competitors -------------------------------------------------------------------------------


def ours_run(model: nn.Module, held: bool = False) -> Run:
    """attnlab's ``stream`` (the default engine, ``auto``); ``held``: through a
    :class:`~attnlab.generation.engines.DecodeSession` per batch size, made at the first
    (warm-up) call and kept, so the fused engine's copies are made once, not at every call."""
    sessions: dict[int, DecodeSession] = {}

    def run(ids: torch.Tensor, n: int) -> tuple[torch.Tensor, list[float]]:
        tokens, stamps = [], []
        session = None
        if held:
            session = sessions.get(ids.shape[0])
            if session is None:
                session = sessions[ids.shape[0]] = DecodeSession(model, rows=ids.shape[0])
        for step in stream(model, ids, max_new_tokens=n, eos_id=(), decode_session=session):
            tokens.append(step.tokens)
            stamps.append(time.perf_counter())
        return torch.stack(tokens, dim=1), stamps  # (B, n)

    return run


def hf_run(model: Any) -> Run:
    def run(ids: torch.Tensor, n: int) -> tuple[torch.Tensor, list[float]]:
        clock = _StepClock()
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                do_sample=False,
                streamer=clock,
            )
        return out[:, ids.shape[1] :], clock.stamps[1:]  # stamps[0]: the prompt

    return run


def decode_round(
    runs: dict[str, Run], ids: torch.Tensor, n: int, rounds: int, only_b1: set[str]
) -> dict[str, Any]:
    """Interleaved rounds: tokens/s per call and every decode step's seconds, per competitor."""
    labels = [k for k in runs if ids.shape[0] == 1 or k not in only_b1]
    for label in labels:
        runs[label](ids, 2)  # warm-up
    speed: dict[str, list[float]] = {k: [] for k in labels}
    steps: dict[str, list[float]] = {k: [] for k in labels}
    tokens: dict[str, torch.Tensor] = {}
    for order in _rotations(labels, rounds):
        for label in order:
            t0 = time.perf_counter()
            out, stamps = runs[label](ids, n)
            speed[label].append(ids.shape[0] * n / (time.perf_counter() - t0))
            steps[label] += [b - a for a, b in itertools.pairwise(stamps)]
            tokens[label] = out
    return {"speed": speed, "steps": steps, "tokens": tokens}


def _agreement(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    same = a == b  # (B, n)
    prefix = same.int().cumprod(dim=1).sum(dim=1).float()  # leading identical tokens per row
    return {"token_agreement": float(same.float().mean()), "same_prefix": float(prefix.mean())}


# -- kernels -----------------------------------------------------------------------------------


def kernel_table(shapes: list[tuple[int, int]], rows: list[int], reps: int) -> list[dict[str, Any]]:
    """µs per call (median of ``reps`` interleaved calls) of each path for each weight shape."""
    from attnlab.transforms import DecodeWeight, Int4Linear, Int8Linear

    table = []
    for n_out, n_in in shapes:
        torch.manual_seed(0)
        lin = nn.Linear(n_in, n_out, bias=False)
        nn.init.normal_(lin.weight, std=0.02)
        g = 128 if n_in % 128 == 0 else 32
        paths: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], int]] = {
            "fp32 F.linear": (lambda x, w=lin.weight: torch.nn.functional.linear(x, w), 4),
        }
        if torch.backends.mkldnn.is_available():
            copy_ = DecodeWeight.stack([lin], 1)
            paths["fp32 attnlab decode copy"] = (copy_, 4)
        for act in ("bfloat16", "float32"):
            q8 = Int8Linear.from_linear(lin, activation_dtype=act)
            q4 = Int4Linear.from_linear(lin, group_size=g, activation_dtype=act)
            if q8.kernel == woq_kernels.KERNEL_INT8:  # attnlab's own, then PyTorch's float32 path
                paths["int8 attnlab kernel, float32 rows"] = (q8, 1)
                q8 = copy.deepcopy(q8)
                q8.kernel = "aten._weight_int8pack_mm"
            if q4.kernel == woq_kernels.KERNEL_INT4:
                paths[f"int4 attnlab kernel (g{g}), float32 rows"] = (q4, 0.5)  # type: ignore[assignment]
                q4 = copy.deepcopy(q4)
                q4.kernel = "aten._weight_int4pack_mm_for_cpu"
                q4.prepare_kernel()
            paths[f"int8 aten kernel, {act} rows"] = (q8, 1)
            paths[f"int4 aten kernel (g{g}), {act} rows"] = (q4, 0.5)  # type: ignore[assignment]
        ref = Int8Linear.from_linear(lin)
        paths["int8 reference (dequantize + F.linear)"] = (
            lambda x, m=ref: torch.nn.functional.linear(x, m.dequantize()),
            1,
        )
        for m in rows:
            x = torch.randn(m, n_in)
            times: dict[str, list[float]] = {k: [] for k in paths}
            with torch.inference_mode():
                for fn, _ in paths.values():
                    fn(x)
                for order in _rotations(list(paths), reps):
                    for label in order:
                        t0 = time.perf_counter()
                        paths[label][0](x)
                        times[label].append(time.perf_counter() - t0)
            for label, (_, bytes_per_weight) in paths.items():
                t = statistics.median(times[label])
                gb_s = n_in * n_out * bytes_per_weight / t / 1e9
                table.append(
                    {"shape": [n_out, n_in], "rows": m, "path": label, "us": t * 1e6, "GB_s": gb_s}
                )
    return table


# -- report ------------------------------------------------------------------------------------


def kv_cache_bytes(config: Any, batch: int, positions: float) -> float:
    """Bytes of keys and values a step reads from the KV cache at ``positions`` cached
    positions: layers x (K and V) x H_kv x D x 4 bytes (float32) per position and sequence."""
    n_kv = config.n_kv_heads or config.n_heads
    per_position = config.n_layers * 2 * n_kv * (config.d_model // config.n_heads) * 4
    return batch * positions * per_position


def summarise(
    result: dict[str, Any],
    floors: dict[str, float],
    bytes_: dict[str, int],
    kv_floor_ms: float = 0.0,
) -> dict[str, Any]:
    """Medians, ratios, floors and token agreement of one batch size's rounds; ``kv_floor_ms``:
    the time the median step's KV-cache reads take at the copy bandwidth (added to each floor in
    ``floor_kv_ms``)."""
    rows: dict[str, Any] = {}
    ref = result["tokens"].get("fp32")
    for label, speeds in result["speed"].items():
        step = statistics.median(result["steps"][label]) if result["steps"][label] else None
        row: dict[str, Any] = {
            "tokens_per_s": statistics.median(speeds),
            "step_ms": None if step is None else step * 1e3,
            "bytes_per_token": bytes_[label],
            "floor_ms": floors[label],
        }
        row["step_over_floor"] = None if step is None else step * 1e3 / floors[label]
        row["floor_kv_ms"] = floors[label] + kv_floor_ms
        row["step_over_floor_kv"] = None if step is None else step * 1e3 / row["floor_kv_ms"]
        if ref is not None and label != "fp32":
            row |= _agreement(result["tokens"][label], ref)
        rows[label] = row
    for row in rows.values():
        for base in (HF, "fp32"):
            if base in rows:
                row[f"x_{base}"] = row["tokens_per_s"] / rows[base]["tokens_per_s"]
    return rows


def _label(name: str) -> str:
    return f"attnlab {name}" if not name.startswith("transformers") else name


def format_markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        "# Quantized decoding (benchmarks/quantized_decoding.py)",
        "",
        f"{describe_machine(meta, meta['threads'])} ({meta['cpu_model']}, ATen CPU capability "
        f"{meta['cpu_capability']}), transformers {meta['transformers']}, {meta['date_utc']}. "
        f"Model {meta['model']} (random weights), greedy, EOS off, {meta['prompt_len']}-token "
        f"prompts, {meta['new_tokens']} new tokens, medians of {meta['repeats']} interleaved "
        f"rounds. Memory copy (256 MiB, read + write): {meta['copy_gb_s']:.1f} GB/s.",
        "",
        "Floor of a step: the weight bytes it streams / copy bandwidth; `floor+KV`: plus the "
        "keys and values it reads from the KV cache at the median step "
        f"({meta['prompt_len'] + meta['new_tokens'] // 2} cached positions, float32; "
        "the same for every competitor). `x transformers`: tokens/s over "
        "transformers fp32's. Agreement: greedy tokens equal to attnlab fp32's (random weights: "
        "near-ties are common, so this is no quality measure; see quantized_quality.py).",
    ]
    for batch, rows in results["decoding"].items():
        lines += [
            "",
            f"## Batch {batch}",
            "",
            "| competitor | tokens/s | x transformers | x attnlab fp32 | ms/step | floor ms "
            "| step / floor | floor+KV ms | step / floor+KV | MB/step | token agreement "
            "| same prefix |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, r in rows.items():

            def f(key: str, fmt: str, row: dict[str, Any] = r) -> str:
                v = row.get(key)
                return "-" if v is None else format(v, fmt)

            lines.append(
                f"| {_label(name)} | {f('tokens_per_s', '.1f')} | {f('x_' + HF, '.2f')} "
                f"| {f('x_fp32', '.2f')} | {f('step_ms', '.2f')} | {f('floor_ms', '.2f')} "
                f"| {f('step_over_floor', '.2f')} | {f('floor_kv_ms', '.2f')} "
                f"| {f('step_over_floor_kv', '.2f')} | {r['bytes_per_token'] / 1e6:.1f} "
                f"| {f('token_agreement', '.3f')} | {f('same_prefix', '.1f')} |"
            )
    lines += [
        "",
        "## Kernels (µs per call, median; GB/s = weight bytes / time)",
        "",
        "| weight (out, in) | rows | path | µs | GB/s |",
        "|---|---|---|---|---|",
    ]
    for k in results["kernels"]:
        lines.append(
            f"| {tuple(k['shape'])} | {k['rows']} | {k['path']} | {k['us']:.0f} | {k['GB_s']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def _competitors(
    ours: nn.Module, hf: Any, args: argparse.Namespace
) -> tuple[dict[str, Run], dict[str, int]]:
    runs: dict[str, Run] = {}
    bytes_: dict[str, int] = {}
    for name in args.variants.split(","):
        model = quantized_copy(ours, name, args.group_size)
        runs[name] = ours_run(model)
        bytes_[name] = quantized_weight_bytes(model).per_token
        if args.held_sessions:  # the engine's copies made once per batch size, not per call
            runs[f"{name} (session)"] = ours_run(model, held=True)
            bytes_[f"{name} (session)"] = bytes_[name]
    if args.with_bf16act:
        for name in ("int8-bf16act", "int8+head-bf16act", "int4-bf16act", "int4+head-bf16act"):
            model = quantized_copy(ours, name, args.group_size)
            runs[name], bytes_[name] = ours_run(model), quantized_weight_bytes(model).per_token
    runs[HF], bytes_[HF] = hf_run(hf), hf_bytes_per_token(hf)
    if not args.no_dynamic:
        for label, all_layers in ((HF_DYN, False), (HF_DYN_ALL, True)):
            model = hf_dynamic_int8(hf, all_layers)
            runs[label], bytes_[label] = hf_run(model), hf_bytes_per_token(model)
    return runs, bytes_


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--model", default="gpt2-small", help="an attnlab GPT-2-shaped preset")
    parser.add_argument("--variants", default="fp32,int8,int8+head,int4,int4+head")
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kernel-reps", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument(
        "--with-bf16act", action="store_true", help="also bfloat16 rows into PyTorch's kernels"
    )
    parser.add_argument("--no-dynamic", action="store_true", help="skip transformers dyn-int8")
    parser.add_argument(
        "--held-sessions",
        action="store_true",
        help="also each attnlab variant through a DecodeSession held across calls",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes; results to a temp dir")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    config: Any = attnlab.config_for(args.model, dropout=0.0)
    shapes = [(4 * config.d_model, config.d_model), (config.vocab_size, config.d_model)]
    out_dir = RESULTS
    if args.smoke:
        config = attnlab.GPTConfig(
            vocab_size=256, d_model=64, n_heads=4, n_layers=2, d_ff=256, max_seq_len=64,
            eos_id=None, dropout=0.0,
        )  # fmt: skip
        shapes, args.group_size = [(256, 64)], 64
        args.prompt_len, args.new_tokens, args.repeats, args.kernel_reps = 8, 8, 1, 3
        args.batch_sizes, args.with_bf16act = "1,2", True
        out_dir = Path(tempfile.gettempdir())
    import transformers

    meta = machine_info() | {
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "cpu_model": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "model": "smoke (d_model 64)" if args.smoke else args.model,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "group_size": args.group_size,
        "copy_gb_s": copy_bandwidth(16 if args.smoke else 256, 3 if args.smoke else 5),
    }
    results: dict[str, Any] = {"meta": meta, "decoding": {}, "kernels": []}
    with tempfile.TemporaryDirectory() as tmp:
        ours, hf = build_models(config, Path(tmp))
    runs, bytes_ = _competitors(ours, hf, args)
    floors = {k: v / (meta["copy_gb_s"] * 1e9) * 1e3 for k, v in bytes_.items()}
    only_b1: set[str] = set()
    for batch in map(int, args.batch_sizes.split(",")):
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, config.vocab_size, (batch, args.prompt_len), generator=g)
        raw = decode_round(runs, ids, args.new_tokens, args.repeats, only_b1)
        kv = kv_cache_bytes(config, batch, args.prompt_len + args.new_tokens // 2)
        rows = summarise(raw, floors, bytes_, kv / (meta["copy_gb_s"] * 1e9) * 1e3)
        if "fp32" in raw["tokens"] and HF in raw["tokens"]:
            rows[HF]["same_tokens_as_attnlab_fp32"] = bool(
                torch.equal(raw["tokens"]["fp32"], raw["tokens"][HF])
            )
        results["decoding"][str(batch)] = rows
        print(json.dumps({"batch": batch, **rows}), flush=True)
    results["kernels"] = kernel_table(shapes, [1, 8], args.kernel_reps)
    markdown = format_markdown(results)
    print(markdown)
    json_path = Path(
        args.json or out_dir / f"quantized_decoding{'_smoke' if args.smoke else ''}.json"
    )
    md_path = Path(args.markdown or json_path.with_suffix(".md"))
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    md_path.write_text(markdown, encoding="utf-8")
    print(f"wrote {json_path} and {md_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
