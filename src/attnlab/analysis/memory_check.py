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
  for every sequence (beams included; fewer under a sliding window), the prefill's transient
  tensors (logits and one layer's attention scores and probabilities), the token buffers a
  session preallocates (``(rows, prompt + new)`` ids, key mask and positions), the ``(rows, V)``
  tensors every step holds (beam search: seven, ``topk``'s working copy included), beam
  search's hypotheses and candidates ``(B, K, N)``, and the weight copies the fused decode
  engine holds during the call when the caller counts them (fp32 on the CPU:
  :func:`attnlab.transforms.decode_weights.copy_numel`). A recurrent model (Mamba, LSTM/GRU)
  keeps its constant-size state instead of the cache; its prefill holds the prompt's logits and
  one layer's scan tensors (Mamba: Ā, B̄x and the states, ``(B, P, E, N)`` float32 each).
  :func:`estimate_speculative` adds a draft's cache and a verification round's logits. The
  Python API (:func:`attnlab.generate` and the other decoding calls) checks the same estimate,
  less the weights it already holds, before allocating (``GenerationConfig.memory_check``).

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
    num_return_sequences: int = 1,
    dtype: str | int = "float32",
    decode_copy_numel: int = 0,
    weight_bytes: int | None = None,
    cache_len: int | None = None,
    recompute_len: int = 0,
    n_eos: int = 1,
    sampling: bool = False,
) -> MemoryEstimate | None:
    """Memory of generating ``max_new_tokens`` after ``batch`` prompts of ``prompt_len`` tokens
    (``num_beams > 1``: beam search of that many beams; else ``num_return_sequences`` rows per
    prompt); ``None`` for a config that does not generate. What the decoding loops allocate
    (:mod:`attnlab.generation`), part by part:

    - ``weights``; ``decode_copies``: the fused engine's weight copies, ``decode_copy_numel``
      elements (fp32 on the CPU; :func:`attnlab.transforms.decode_weights.copy_numel`);
    - ``kv_cache``: ``cache_len`` positions per row (default ``prompt_len + max_new_tokens``;
      an encoder-decoder's decoder ``max_new_tokens``, and its source's cross-attention keys;
      ``0``: no cache, e.g. ``use_cache=False`` or a prompt longer than a sliding window), or
      a recurrent model's ``state``;
    - ``prefill``: the prompt's logits (a causal LM's session projects the last position
      only; a recurrent model's forward all of them) and one layer's attention scores and
      probabilities (plus the family's own prefill tensors, e.g. Mamba's scan); ``recompute``:
      one layer's scores and probabilities of a step that reruns ``recompute_len`` positions
      without the cache (a sliding window, ``use_cache=False``); ``encoder_memory``: an
      encoder-decoder's encoder output, repeated for every row;
    - ``token_buffers``: the ``(rows, prompt_len + max_new_tokens)`` token ids, key mask and
      positions a session preallocates (twice for beam search: every step reorders them);
    - ``step_logits``: the ``(rows, V)`` float32 tensors alive during a step: the logits
      beside the previous step's (greedy: 1 more than the prefill's); sampling: the processed
      scores and the probabilities too (4); beam search: the logits, log-probabilities, summed
      scores and ``topk``'s working copy of them (values with int64 indices: 4 more; 7 in
      all; measured: peaks 1.0-1.8x the estimate on a tiny model, 1.0x where these dominate);
    - ``beam_candidates``: beam search's ``(B, K, N)`` running and finished hypotheses, its
      ``(B, C, N)`` candidates with ``C = (1 + max(1, n_eos))·K`` and their concatenation with
      the finished ones, all alive at once while they merge, plus one layer's keys reordered.

    Args:
        dtype: the weights' and cache's dtype (a name or bytes per element).
        weight_bytes: the weights' bytes when they are not the parameter count times the
            dtype's size (a quantized model: :func:`attnlab.transforms.quantized_footprint`).
        n_eos: stop ids (beam search examines ``1 + n_eos`` candidates per beam).
        sampling: the call samples (one more ``(rows, V)`` tensor: the probabilities).

    Raises:
        ValueError: for non-positive sizes, negative lengths or an unknown ``dtype``.
    """
    family = None if isinstance(config, type) else find_family(config)
    kind = family.kind if family is not None else None
    if family is None or family.costs is None or kind is None or not kind.generates:
        return None
    # one comparison each on the way (this runs in every decoding call), the names on a failure
    if min(batch, prompt_len, num_beams, num_return_sequences) < 1:
        _refuse_below(1, batch=batch, prompt_len=prompt_len, num_beams=num_beams,
                      num_return_sequences=num_return_sequences)  # fmt: skip
    if min(max_new_tokens, recompute_len, cache_len or 0, n_eos) < 0:
        _refuse_below(0, max_new_tokens=max_new_tokens, recompute_len=recompute_len,
                      cache_len=cache_len or 0, n_eos=n_eos)  # fmt: skip
    beams = num_beams > 1
    rows = batch * (num_beams if beams else num_return_sequences)
    a = dtype_bytes(dtype)
    B, P, N = batch, prompt_len, max_new_tokens
    parts: dict[str, int] = {}
    if kind is Kind.RECURRENT_LM:
        parts["weights"] = count_params(config) * a if weight_bytes is None else weight_bytes
        parts["state"] = recurrent_state_bytes(config, batch=rows, dtype=dtype)
        prefill = B * P * config.vocab_size * FP32  # the prompt's logits
        if family.costs.prefill_bytes is not None:  # e.g. Mamba's scan tensors
            prefill += family.costs.prefill_bytes(config, B, P)
        parts["prefill"] = prefill
        vocab, columns, per_column, layer_kv = config.vocab_size, P + N, 8, 0
    else:
        seq2seq = kind is not Kind.CAUSAL_LM
        if seq2seq:  # the decoder caches its tokens (from BOS) and the source's keys/values
            default, src = max(N, 1), P
            vocab = config.target_vocab_size
            logits = B * vocab * FP32  # one step's logits
            columns, per_column = max(N, 1), 8  # the target ids
        else:  # prompt and new tokens share one cache
            default, src = P + N, None
            vocab = config.vocab_size
            logits = B * vocab * FP32  # the prefill's logits: the session reads the last column
            columns, per_column = P + N, 17  # ids and positions (int64), the key mask (bool)
        positions = default if cache_len is None else cache_len
        shape = family.costs.kv_cache(config) if family.costs.kv_cache is not None else None
        layer_kv = rows * positions * shape.width * a if shape is not None else 0  # one k
        # kv_cache_bytes' formula, on the shape already read (this runs in every decoding call)
        kv = 2 * shape.layers * layer_kv if shape is not None else 0
        if shape is not None and shape.cross and positions:
            kv += 2 * shape.layers * rows * src * shape.width * a  # the source's keys/values
        parts["weights"] = count_params(config) * a if weight_bytes is None else weight_bytes
        parts["kv_cache"] = kv
        scores = 2 * B * config.n_heads * P**2 * max(a, FP32)  # one layer, prefill
        parts["prefill"] = logits + scores
        if recompute_len:
            parts["recompute"] = 2 * rows * config.n_heads * recompute_len**2 * max(a, FP32)
        if seq2seq:
            parts["encoder_memory"] = (B + (rows if rows > B else 0)) * P * config.d_model * a
    # the buffers every step writes into; beam search reorders them (old and new alive)
    copies = 2 * rows if beams else rows + (B if rows > B else 0)
    parts["token_buffers"] = copies * columns * per_column
    # greedy: the step's logits beside the previous step's (the first are the prefill's)
    parts["step_logits"] = rows * vocab * FP32 * (7 if beams else 4 if sampling else 1)
    if beams:
        K = num_beams
        C = min((1 + max(1, n_eos)) * K, K * vocab)
        parts["beam_candidates"] = B * N * 8 * (4 * K + 2 * C) + layer_kv
    if decode_copy_numel:
        parts["decode_copies"] = decode_copy_numel * a
    how = f", {num_beams} beams per prompt" if beams else ""
    what = (
        f"generating with {type(config).__name__} ({_dtype_name(dtype)}, {rows} "
        f"sequence{'s' * (rows > 1)} of {P} + {N} tokens{how})"
    )
    return MemoryEstimate(what, parts)


def estimate_speculative(
    config: Any,
    draft_config: Any,
    *,
    batch: int,
    prompt_len: int,
    max_new_tokens: int,
    num_draft_tokens: int,
    num_return_sequences: int = 1,
    dtype: str | int = "float32",
    decode_copy_numel: int = 0,
    weight_bytes: int | None = None,
    padded: bool = True,
    sampling: bool = False,
) -> MemoryEstimate | None:
    """Memory of speculative decoding (:mod:`attnlab.generation.speculative`): the target's
    :func:`estimate_generation` (without its session's buffers) plus the draft's KV cache, the
    shared ``(rows, prompt_len + max_new_tokens)`` token columns (ids; key mask and positions
    when ``padded``) and a round's ``(rows, k + 1, V)`` logits (sampling: scores and
    probabilities too, and the draft's ``(rows, k, V)`` distributions). The target's weights
    are counted, the draft's are not (the command line checks the draft's directory apart).

    Raises:
        ValueError: as :func:`estimate_generation`, and for ``num_draft_tokens < 1``.
    """
    if num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens must be positive, got {num_draft_tokens}")
    k = num_draft_tokens
    rows = batch * num_return_sequences
    total = prompt_len + max_new_tokens
    target = estimate_generation(
        config, batch=rows, prompt_len=prompt_len, max_new_tokens=max_new_tokens, dtype=dtype,
        decode_copy_numel=decode_copy_numel, weight_bytes=weight_bytes,
        cache_len=min(total, config.max_seq_len), sampling=sampling,
    )  # fmt: skip
    if target is None:
        return None
    parts = dict(target.parts)
    del parts["token_buffers"], parts["step_logits"]
    # the verifier's first forward projects every prompt column (and the first proposals)
    parts["prefill"] += rows * (prompt_len + k) * config.vocab_size * FP32
    draft_positions = min(total, draft_config.max_seq_len)
    parts["draft_kv_cache"] = kv_cache_bytes(draft_config, draft_positions, batch=rows,
                                             dtype=dtype)  # fmt: skip
    parts["token_buffers"] = rows * total * (17 if padded else 8)
    V = config.vocab_size
    # a round's target logits (and the previous round's, still yielded), the draft's step;
    # sampling: the processed scores and probabilities, the draft's k distributions and the
    # acceptance rule's residuals
    per_row = 2 * (k + 1) + 1 + (2 * (k + 1) + 2 * k if sampling else 0)
    parts["step_logits"] = rows * V * FP32 * per_row
    what = (
        f"speculative decoding with {type(config).__name__} and a {type(draft_config).__name__} "
        f"draft ({_dtype_name(dtype)}, {rows} sequence{'s' * (rows > 1)} of {prompt_len} + "
        f"{max_new_tokens} tokens, {k} draft tokens per round)"
    )
    return MemoryEstimate(what, parts)


def _refuse_below(low: int, **values: int) -> None:
    """Raise ``ValueError`` for the first of ``values`` below ``low``."""
    for name, value in values.items():
        if value < low:
            what = "positive" if low == 1 else f">= {low}"
            raise ValueError(f"{name} must be {what}, got {value}")


def _dtype_name(dtype: str | int) -> str:
    return dtype if isinstance(dtype, str) else f"{dtype}-byte"


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
    "estimate_speculative",
    "estimate_training",
]
