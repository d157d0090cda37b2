"""``attnlab quantize``: write a weight-only int8/int4 copy of a model or run directory.

    attnlab quantize runs/shakespeare-char --bits 8 --out runs/shakespeare-char-int8
    attnlab quantize MODEL_DIR --bits 4 --group-size 64 --include-lm-head --out MODEL_DIR-int4
    attnlab quantize runs/de-en --checkpoint averaged --bits 8 --out runs/de-en-int8

``MODEL_OR_RUN_DIR`` is anything :func:`attnlab.from_pretrained` loads (a run directory: its
newest complete checkpoint; ``--checkpoint NAME``: its ``best/``, ``last/`` or ``averaged/``
export). The output is a quantized model directory (:mod:`attnlab.transforms.quant_io`): the
config, ``quantization.json`` and the int8/int4 weights, with the source's tokenizer and export
record copied beside them, so ``attnlab generate``, ``sample``, ``translate`` and
:func:`attnlab.from_pretrained` take it like any model directory. ``--bits 4`` groups
``--group-size`` inputs per scale (default 128, or the largest of 64/32 that divides every
layer). The LM head and the token embedding stay float32 unless ``--include-lm-head`` /
``--include-embedding``. A source whose weights are not what its config says (an edited
``config.json``, changed tensor data) is refused unless ``--no-verify``; the copy written is
bound to the config it was made with.

This module also holds what the decoding commands share for ``--quantize int8|int4`` (quantize
the loaded model in memory) and the memory estimate of a quantized model.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from attnlab.cli.common import add_verify_argument, check_writable, fail, guarded

FORMATS = {"8": "int8", "4": "int4"}
# files of a source directory never copied beside the quantized weights
_OWN_FILES = ("config.json", "quantization.json", "trainer_state.json")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack")


def add_parser(commands: Any) -> None:
    """The ``quantize`` command."""
    p = commands.add_parser(
        "quantize",
        help="write a weight-only int8/int4 copy of a model or run directory",
        description=__doc__.split("\n\n")[2] if __doc__ else None,
    )
    p.add_argument("model", help="model directory (attnlab or Hugging Face) or run directory")
    p.add_argument("--bits", required=True, choices=sorted(FORMATS), help="8: int8, 4: int4")
    p.add_argument(
        "--group-size", type=int, default=None,
        help="--bits 4: inputs per scale (default 128, or the largest of 64/32 that fits)",
    )  # fmt: skip
    p.add_argument("--include-lm-head", action="store_true", help="quantize the LM head too")
    p.add_argument("--include-embedding", action="store_true", help="and the token embedding")
    p.add_argument(
        "--activation-dtype", choices=["bfloat16", "float32"], default=None,
        help="rows entering the kernels: float32 (exact; the default where attnlab's kernels "
        "build) or bfloat16 (PyTorch's kernels)",
    )  # fmt: skip
    p.add_argument(
        "--checkpoint", choices=["averaged", "best", "last"], default=None,
        help="a run directory's export to quantize (default: its newest checkpoint)",
    )  # fmt: skip
    p.add_argument("--out", required=True, help="the quantized model directory to write")
    add_verify_argument(p)  # --no-verify
    p.set_defaults(func=guarded("attnlab quantize", run_quantize))


# -- what generate, sample and translate share ---------------------------------------------------


def add_quantize_argument(p: argparse.ArgumentParser) -> None:
    """``--quantize int8|int4`` on a decoding command."""
    p.add_argument(
        "--quantize", choices=["int8", "int4"], default=None,
        help="weight-only quantize the model after loading (int4: group size 128, or the "
        "largest of 64/32 that fits; the LM head stays float32)",
    )  # fmt: skip


def quantize_options(model: Any, fmt: str, **options: Any) -> Any:
    """The :class:`~attnlab.transforms.QuantizationConfig` ``--quantize FMT`` applies to
    ``model`` (which may be on ``meta``): int4 gets :func:`~attnlab.transforms.fitting_group_size`
    unless ``options`` name a ``group_size``."""
    from attnlab.transforms import QuantizationConfig, fitting_group_size

    group = options.pop("group_size", None)
    if fmt == "int4" and group is None:
        group = fitting_group_size(
            model,
            include_lm_head=options.get("include_lm_head", False),
            include_embedding=options.get("include_embedding", False),
        )
    group = group if fmt == "int4" else None
    return QuantizationConfig(format=fmt, group_size=group, **options)  # type: ignore[arg-type]


def quantize_loaded(model: Any, fmt: str | None, source: str) -> Any:
    """``model`` quantized in memory as ``--quantize FMT`` asks (unchanged for ``None``).

    Raises:
        CommandError: for a model that is already quantized.
    """
    if fmt is None:
        return model
    from attnlab.transforms.quantize import apply_quantization

    done = getattr(model, "quantization_config", None)
    if done is not None:
        fail(f"--quantize {fmt}: {source} is already quantized ({done.format}); drop --quantize")
    return apply_quantization(model, quantize_options(model, fmt), empty=False)


def generation_estimate(
    directory: Path, config: Any, *, quantize: str | None, cpu: bool, engine: str = "auto",
    **sizes: Any,
) -> Any:  # fmt: skip
    """The memory estimate of generating with the model of ``directory`` (``config``): float32,
    a quantized directory (its quantized weights), or ``--quantize FMT`` (the larger of loading
    and quantizing the float weights, and decoding with the quantized ones); on the CPU, with
    the weight copies the decode ``engine`` may hold during the call. ``sizes``: the sizes of
    :func:`attnlab.analysis.memory_check.estimate_generation`."""
    from attnlab.analysis.memory_check import MemoryEstimate, estimate_generation
    from attnlab.analysis.params import count_params
    from attnlab.generation.engines import engine_copy_numel
    from attnlab.models import build_model
    from attnlab.transforms import quantized_footprint, read_quantization_config
    from attnlab.transforms.quant_io import is_quantized_dir

    if is_quantized_dir(directory):
        qconfig = read_quantization_config(directory)
    elif quantize is not None:
        qconfig = quantize_options(build_model(config, device="meta"), quantize)
    else:
        numel = engine_copy_numel(config, engine) if cpu else 0
        return estimate_generation(config, decode_copy_numel=numel, **sizes)
    footprint = quantized_footprint(config, qconfig)
    decode = estimate_generation(
        config, weight_bytes=footprint.weights,
        decode_copy_numel=footprint.decode_copy_numel if cpu and engine != "eager" else 0,
        **sizes,
    )  # fmt: skip
    if decode is None or is_quantized_dir(directory):
        return decode
    loading = MemoryEstimate(
        f"loading and quantizing {type(config).__name__} ({quantize})",
        {"float32_weights": count_params(config) * 4, "quantized_weights": footprint.weights},
    )
    return loading if loading.total > decode.total else decode


# -- attnlab quantize -------------------------------------------------------------------------


def _source(args: argparse.Namespace) -> Path:
    """The model directory to quantize."""
    from attnlab.training.rundir import resolve_model_directory

    if args.checkpoint is None:
        return resolve_model_directory(args.model)
    export = Path(args.model) / args.checkpoint
    if not (export / "model.safetensors").is_file():
        fail(f"--checkpoint {args.checkpoint}: {args.model} has no {args.checkpoint}/ export")
    return export


def _check_out(out: Path, source: Path) -> None:
    """Refuse an ``--out`` that is the source, a file, or a non-empty folder other than a
    quantized model directory (which is replaced)."""
    from attnlab.transforms.quant_io import is_quantized_dir

    if out.exists() and out.resolve() == source.resolve():
        fail(f"--out {out} is the source directory; choose another")
    if out.exists() and not out.is_dir():
        fail(f"--out {out} is a file; give a directory")
    if out.is_dir() and any(out.iterdir()) and not is_quantized_dir(out):
        fail(f"--out {out} is not empty (and not a quantized model directory); choose another")
    check_writable(out / "config.json", what="--out")


def side_files(source: Path) -> list[Path]:
    """The files to copy beside the quantized weights: the source's own (tokenizer, export
    record, ...; not weights, configs or trainer state) and a run's tokenizer."""
    from attnlab.training.rundir import find_tokenizer

    own = [
        f for f in sorted(source.iterdir())
        if f.is_file() and f.name not in _OWN_FILES and not f.name.startswith(".")
        and not f.name.endswith((*_WEIGHT_SUFFIXES, ".index.json"))
    ]  # fmt: skip
    tokenizer = find_tokenizer(source)
    if tokenizer is not None and tokenizer.parent != source:
        own.append(tokenizer)
    return own


def run_quantize(args: argparse.Namespace) -> int:
    """``attnlab quantize``: 0, or 2 with one ``error:`` line on bad input."""
    import attnlab
    from attnlab.io import atomic_write_bytes
    from attnlab.transforms import QuantizedLinear, quantized_weight_bytes
    from attnlab.transforms.quant_io import quantized_structure
    from attnlab.transforms.quantize import apply_quantization

    fmt = FORMATS[args.bits]
    if fmt == "int8" and args.group_size is not None:
        fail("--group-size applies to --bits 4 only (int8 has one scale per output channel)")
    source, out = _source(args), Path(args.out)
    _check_out(out, source)
    start = time.perf_counter()
    model = attnlab.from_pretrained(source, verify=not args.no_verify)
    done = getattr(model, "quantization_config", None)
    if done is not None:
        fail(f"{source} is already quantized ({done.format}); quantize its float model")
    options = {
        "include_lm_head": args.include_lm_head,
        "include_embedding": args.include_embedding,
        "activation_dtype": args.activation_dtype,
        "group_size": args.group_size,
    }
    qconfig = quantize_options(model, fmt, **options)
    quantized_structure(model.config, qconfig, device="meta")  # bad options fail before output
    grouping = f"groups of {qconfig.group_size}" if fmt == "int4" else "per output channel"
    print(f"quantize: {type(model).__name__} with {attnlab.count_params(model):,} parameters "
          f"from {source} -> {fmt} ({grouping}, {qconfig.activation_dtype} activations) -> {out}",
          flush=True)  # fmt: skip
    before = quantized_weight_bytes(model).total_stored / 1e6
    apply_quantization(model, qconfig, empty=False)
    attnlab.save_pretrained(model, out)
    copied = side_files(source)
    for file in copied:
        atomic_write_bytes(out / file.name, file.read_bytes())
    layers = sum(isinstance(m, QuantizedLinear) for m in model.modules())
    after = (out / "model.safetensors").stat().st_size / 1e6
    extra = f"; copied {', '.join(f.name for f in copied)}" if copied else ""
    print(f"wrote {out}: {layers} layers {fmt}, model.safetensors {after:.2f} MB (float32 weights "
          f"{before:.2f} MB, {before / max(after, 1e-9):.1f}x smaller) in "
          f"{time.perf_counter() - start:.1f} s{extra}")  # fmt: skip
    return 0


__all__ = [
    "add_parser",
    "add_quantize_argument",
    "generation_estimate",
    "quantize_loaded",
    "quantize_options",
    "run_quantize",
    "side_files",
]
