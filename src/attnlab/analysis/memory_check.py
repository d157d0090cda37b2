"""Refuse a run that cannot fit in RAM before it starts, instead of being killed half-way.

The command line (``attnlab train <recipe>``, ``attnlab generate``) estimates the memory a run
needs from its config alone (:mod:`attnlab.analysis.memory`: nothing is allocated), compares it
with the memory this process may still use (:func:`available_memory`) and, when the estimate is
larger, exits with status 2 and a message naming both figures; ``--ignore-memory-check`` skips it.

- Training (:func:`estimate_training`): float32 weights + gradients + Adam's two moments +
  the activations of one micro-batch of ``batch`` full-length sequences
  (:func:`~attnlab.analysis.memory.training_memory`), in the run's ``precision`` (the mixed
  modes add autocast's 16-bit weight copies and keep 16-bit activations; pure ``bf16`` halves
  everything) and with its activation checkpointing (a checkpointed block keeps its input only).
  On a CUDA device the figure is compared with that device's free memory.
- Generation (:func:`estimate_generation`): the weights, a KV cache of ``prompt + new`` positions
  for every sequence (beams included), the prefill's transient tensors (the logits of every
  prompt position and one layer's attention scores and probabilities) and the weight copies
  the fused decode engine holds during the call when the caller counts them (fp32 on the CPU:
  :func:`attnlab.transforms.decode_weights.copy_numel`). A recurrent model (Mamba, LSTM/GRU)
  keeps its constant-size state instead of the cache; its prefill holds the prompt's logits and
  one layer's scan tensors (Mamba: Ā, B̄x and the states, ``(B, P, E, N)`` float32 each).

The estimates are lower bounds (the allocator, the framework and the data add their own), so a
run that passes can still come close to the limit; one that fails cannot fit.

Available memory (Linux): ``MemAvailable`` of ``/proc/meminfo``, lowered to the room left under
the process's cgroup limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``) when there is one,
counting reclaimable page cache (``inactive_file``) as free. Elsewhere it is unknown and the check
passes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.analysis.flops import default_seq_len
from attnlab.analysis.memory import (
    FP32,
    dtype_bytes,
    kv_cache_bytes,
    training_memory,
)
from attnlab.analysis.params import count_params
from attnlab.analysis.recurrent import recurrent_state_bytes
from attnlab.analysis.text import human_bytes
from attnlab.models.family import Kind, find_family

IGNORE_FLAG = "--ignore-memory-check"
MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")
_NO_LIMIT = 2**60  # cgroup v1 writes "no limit" as a huge page-aligned number


class MemoryLimitError(ValueError):
    """A run's estimated memory exceeds the memory available (the message gives both)."""


@dataclass(frozen=True)
class MemoryEstimate:
    """What a run needs, in bytes by part (``parts``), and what run it is (``what``)."""

    what: str
    parts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        """``"1.50 GiB (weights 0.40 GiB, ...)"``."""
        parts = ", ".join(f"{k.replace('_', ' ')} {human_bytes(v)}" for k, v in self.parts.items())
        return f"{human_bytes(self.total)} ({parts})"


def estimate_training(
    config: Any,
    *,
    batch: int,
    seq_len: int | None = None,
    dtype: str = "float32",
    precision: str | None = None,
    activation_checkpointing: int = 0,
) -> MemoryEstimate | None:
    """Memory of one Adam training step on ``batch`` sequences of ``seq_len`` tokens (default:
    the config's full context; a recurrent model has none and needs it); ``None`` for a config
    the analysis has no formula for. ``precision`` (the trainer's; overrides ``dtype``) and
    ``activation_checkpointing`` (every k-th block; 0: none): see
    :func:`~attnlab.analysis.memory.training_memory`.

    Raises:
        ValueError: for a non-positive ``batch`` or ``seq_len``, an unknown ``dtype``, or no
            ``seq_len`` for a model without a context length.
    """
    family = None if isinstance(config, type) else find_family(config)
    costs = family.costs if family is not None else None
    if costs is None or costs.flops is None or costs.activations is None:
        return None  # no closed forms for the activations (CNNs, CCT: no estimate)
    m = training_memory(config, seq_len, batch=batch, dtype=dtype, precision=precision,
                        checkpoint_every=activation_checkpointing)  # fmt: skip
    T = seq_len if seq_len is not None else default_seq_len(config)
    how = dtype if precision in (None, "fp32") else str(precision)
    if activation_checkpointing:
        every = "every block" if activation_checkpointing == 1 else (
            f"every {activation_checkpointing}th block")  # fmt: skip
        how += f", checkpointing {every}"
    what = f"training {type(config).__name__} ({how}, Adam, batch {batch} x {T} tokens)"
    return MemoryEstimate(
        what,
        {
            "weights": m.weights,
            "gradients": m.gradients,
            "optimizer": m.optimizer,
            "activations": m.activations,
        },
    )


def estimate_generation(
    config: Any,
    *,
    batch: int,
    prompt_len: int,
    max_new_tokens: int,
    num_beams: int = 1,
    dtype: str = "float32",
    decode_copy_numel: int = 0,
    weight_bytes: int | None = None,
) -> MemoryEstimate | None:
    """Memory of generating ``max_new_tokens`` after ``batch`` prompts of ``prompt_len`` tokens
    (``num_beams`` sequences each); ``None`` for a config that does not generate.
    ``decode_copy_numel``: elements of the weight copies the fused decode engine holds during
    the call (fp32 on the CPU; see :func:`attnlab.transforms.decode_weights.copy_numel`),
    counted as ``decode_copies``.
    ``weight_bytes``: the weights' bytes when they are not the parameter count times the
    dtype's size (a quantized model: :func:`attnlab.transforms.quantized_footprint`).

    Raises:
        ValueError: for non-positive sizes or an unknown ``dtype``.
    """
    family = None if isinstance(config, type) else find_family(config)
    kind = family.kind if family is not None else None
    if family is None or family.costs is None or kind is None or not kind.generates:
        return None
    recurrent = kind is Kind.RECURRENT_LM
    for name, value in (("batch", batch), ("prompt_len", prompt_len), ("num_beams", num_beams)):
        if value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    rows, a = batch * num_beams, dtype_bytes(dtype)
    if recurrent:
        return _recurrent_generation(
            config, batch=batch, rows=rows, prompt_len=prompt_len, max_new_tokens=max_new_tokens,
            dtype=dtype, decode_copy_numel=decode_copy_numel,
        )  # fmt: skip
    if kind is Kind.CAUSAL_LM:  # prompt and new tokens share one cache
        context, src = prompt_len + max_new_tokens, None
        logits = batch * prompt_len * config.vocab_size * FP32  # the prefill's logits
    else:  # the decoder caches its tokens (from BOS) and the source's cross-attention keys/values
        context, src = max(max_new_tokens, 1), prompt_len
        logits = batch * config.target_vocab_size * FP32  # one step's logits
    kv = kv_cache_bytes(config, context, batch=rows, src_len=src, dtype=dtype)
    scores = 2 * batch * config.n_heads * prompt_len**2 * max(a, FP32)  # one layer, prefill
    what = (
        f"generating with {type(config).__name__} ({dtype}, {rows} sequence{'s' * (rows > 1)} "
        f"of {prompt_len} + {max_new_tokens} tokens)"
    )
    weights = count_params(config) * a if weight_bytes is None else weight_bytes
    parts = {"weights": weights, "kv_cache": kv, "prefill": logits + scores}
    if decode_copy_numel:
        parts["decode_copies"] = decode_copy_numel * a
    return MemoryEstimate(what, parts)


def _recurrent_generation(
    config: Any, *, batch: int, rows: int, prompt_len: int, max_new_tokens: int, dtype: str,
    decode_copy_numel: int,
) -> MemoryEstimate:  # fmt: skip
    """:func:`estimate_generation` for a model that decodes with a constant-size state."""
    a = dtype_bytes(dtype)
    prefill = batch * prompt_len * config.vocab_size * FP32  # the prompt's logits
    family = find_family(config)
    costs = family.costs if family is not None else None
    if costs is not None and costs.prefill_bytes is not None:  # e.g. Mamba's scan tensors
        prefill += costs.prefill_bytes(config, batch, prompt_len)
    what = (
        f"generating with {type(config).__name__} ({dtype}, {rows} sequence{'s' * (rows > 1)} "
        f"of {prompt_len} + {max_new_tokens} tokens)"
    )
    parts = {
        "weights": count_params(config) * a,
        "state": recurrent_state_bytes(config, batch=rows, dtype=dtype),
        "prefill": prefill,
    }
    if decode_copy_numel:
        parts["decode_copies"] = decode_copy_numel * a
    return MemoryEstimate(what, parts)


def _read_int(file: Path) -> int | None:
    try:
        text = file.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _inactive_file(stat: Path, key: str) -> int:
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _cgroup_room(root: Path) -> int | None:
    """Bytes left under this process's cgroup memory limit; ``None`` without a limit."""
    for limit_file, usage_file, stat, key in (
        ("memory.max", "memory.current", "memory.stat", "inactive_file"),  # v2
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes", "memory/memory.stat",
         "total_inactive_file"),  # v1
    ):  # fmt: skip
        limit, usage = _read_int(root / limit_file), _read_int(root / usage_file)
        if limit is None or usage is None or limit >= _NO_LIMIT:
            continue
        return max(limit - usage + _inactive_file(root / stat, key), 0)
    return None


def available_memory(
    meminfo: str | Path = MEMINFO, cgroup: str | Path = CGROUP
) -> tuple[int, str] | None:
    """``(bytes, where the figure comes from)`` this process may still allocate, or ``None``
    where that cannot be read (not Linux). Arguments: the files to read (for tests)."""
    try:
        lines = Path(meminfo).read_text().splitlines()
    except OSError:
        return None
    found: tuple[int, str] | None = None
    for line in lines:
        name, _, rest = line.partition(":")
        if name == "MemAvailable" and rest.split():
            kib = rest.split()[0]
            found = (int(kib) * 1024, "MemAvailable in /proc/meminfo") if kib.isdigit() else None
    room = _cgroup_room(Path(cgroup))
    if room is not None and (found is None or room < found[0]):
        found = (room, "room under the cgroup memory limit")
    return found


def check_fits(
    estimate: MemoryEstimate | None,
    *,
    available: tuple[int, str] | None = None,
    flag: str = IGNORE_FLAG,
) -> None:
    """Raise unless ``estimate`` fits in the available memory (passes when either is unknown).

    Args:
        estimate: from :func:`estimate_training` / :func:`estimate_generation`.
        available: ``(bytes, source)``; default :func:`available_memory`.
        flag: the option that skips the check, named in the message.

    Raises:
        MemoryLimitError: naming the estimate, its parts and the available memory.
    """
    if estimate is None:
        return
    room = available if available is not None else available_memory()
    if room is None or estimate.total <= room[0]:
        return
    raise MemoryLimitError(
        f"{estimate.what} needs an estimated {estimate.describe()}, more than the "
        f"{human_bytes(room[0])} of memory available ({room[1]}); use a smaller model, batch or "
        f"length, or pass {flag} to try anyway"
    )


def check_training_fits(
    config: Any,
    batch_size: int,
    seq_len: int | None = None,
    *,
    precision: str | None = None,
    activation_checkpointing: int = 0,
    device: Any = None,
) -> None:
    """:func:`check_fits` for training ``config`` on micro-batches of ``batch_size`` sequences
    of ``seq_len`` tokens (default: the config's context), in ``precision`` with
    ``activation_checkpointing``, on ``device`` (a ``torch.device``; CUDA: its free memory).

    Raises:
        MemoryLimitError: when the estimate exceeds the available memory.
    """
    estimate = estimate_training(config, batch=batch_size, seq_len=seq_len, precision=precision,
                                 activation_checkpointing=activation_checkpointing)  # fmt: skip
    check_fits(estimate, available=device_memory(device))


def device_memory(device: Any) -> tuple[int, str] | None:
    """``(free bytes, source)`` of a CUDA ``device``; ``None`` for any other (the RAM figure
    of :func:`available_memory` applies)."""
    if device is None or getattr(device, "type", None) != "cuda":
        return None
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    return free, f"free memory of {device} (torch.cuda.mem_get_info)"


__all__ = [
    "IGNORE_FLAG",
    "MemoryEstimate",
    "MemoryLimitError",
    "available_memory",
    "check_fits",
    "check_training_fits",
    "device_memory",
    "estimate_generation",
    "estimate_training",
]
