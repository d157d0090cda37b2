"""Data-parallel (DDP) and sharded (FSDP2) training on ``torch.distributed``, launched by
``torchrun``.

The trainer runs unchanged under ``torchrun --nproc_per_node=N -m attnlab train <recipe> ...``:

- :func:`init_distributed` builds the process group from torchrun's environment (``RANK``,
  ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``): backend ``gloo`` on CPU,
  ``nccl`` (one GPU per process, ``cuda:LOCAL_RANK``) when CUDA is available.
- :func:`parallelize` is an outside-in transform of a built model: ``DistributedDataParallel``
  by default, or with ``fsdp=True`` FSDP2's ``fully_shard`` on every Transformer block
  (:class:`~attnlab.layers.blocks.EncoderLayer` / ``DecoderLayer``) and then on the root, so
  parameters, gradients and optimizer state are sharded over the processes and a block's
  weights are gathered only while it runs.
- Data: every process draws the same global batch from an identically seeded generator and
  keeps its slice (:func:`attnlab.data.batches.shard_batch`); the loss is normalised by the
  global number of loss terms, so N processes compute the gradient of exactly the batch one
  process would (up to float summation order).
- Checkpoints hold the *full* state dict (gathered for FSDP) and the full optimizer state keyed
  by parameter name (``torch.distributed.checkpoint.state_dict``), written by rank 0; on resume
  rank 0 reads them and they are broadcast (and re-sharded) to every process. So a checkpoint
  does not depend on the world size nor on DDP vs FSDP.

Everything is a no-op for a single process (``world_size == 1``): the same code path trains on a
laptop and under torchrun.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer

from attnlab.layers.blocks import DecoderLayer, EncoderLayer
from attnlab.training.state import flatten_state, unflatten_state

logger = logging.getLogger(__name__)

BACKENDS = ("gloo", "nccl")
BLOCK_TYPES: tuple[type[nn.Module], ...] = (EncoderLayer, DecoderLayer)
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE")


@dataclass(frozen=True)
class DistributedContext:
    """Where this process stands: its rank among ``world_size`` processes and its device.

    The default is a single process on the CPU.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None
    owns_group: bool = False  # init_distributed created the process group (and destroys it)

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"need 0 <= rank < world_size, got rank={self.rank}, world_size={self.world_size}"
            )

    @property
    def enabled(self) -> bool:
        """More than one process: gradients, metrics and checkpoints go through collectives."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that logs and writes checkpoints."""
        return self.rank == 0


def launched_by_torchrun() -> bool:
    """Whether the environment holds torchrun's ``RANK`` and ``WORLD_SIZE``."""
    return all(k in os.environ for k in _TORCHRUN_ENV)


def _env_int(name: str, default: int | None = None) -> int:
    text = os.environ.get(name)
    if text is None:
        if default is None:
            raise ValueError(f"${name} is not set; launch with torchrun")
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"${name} must be an integer, got {text!r}") from None


def init_distributed(
    *, backend: str | None = None, timeout_s: float | None = None
) -> DistributedContext:
    """Join the process group described by torchrun's environment.

    Without torchrun's variables this is a single process (nothing is initialised); with a
    process group already initialised (by the caller) its context is returned as is.

    Args:
        backend: ``"gloo"`` or ``"nccl"``; default ``nccl`` when CUDA is available, else
            ``gloo``.
        timeout_s: how long a collective may wait for the other processes (torch's default:
            10 min for nccl, 30 min for gloo). torchrun stops the others as soon as one process
            fails, so a crash does not wait for it.

    Raises:
        ValueError: for an unknown backend, ``nccl`` without CUDA, or malformed variables.
    """
    if dist.is_initialized():
        return current_context()
    if not launched_by_torchrun():
        return DistributedContext()
    if not dist.is_available():
        raise RuntimeError("this PyTorch build has no torch.distributed")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend 'nccl' needs CUDA; use 'gloo' on CPU")
    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    local_rank = _env_int("LOCAL_RANK", rank)
    device = torch.device("cpu")
    kwargs: dict[str, Any] = {}
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        kwargs["device_id"] = device
    if timeout_s is not None:
        kwargs["timeout"] = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend, rank=rank, world_size=world_size, **kwargs)
    return DistributedContext(rank, world_size, local_rank, device, backend, owns_group=True)


def current_context() -> DistributedContext:
    """The context of the initialised default process group (a single process if none)."""
    if not (dist.is_available() and dist.is_initialized()):
        if launched_by_torchrun() and os.environ.get("WORLD_SIZE", "1") != "1":
            logger.warning(
                "launched by torchrun (WORLD_SIZE=%s) but no process group is initialised: "
                "each process trains alone; call init_distributed() first",
                os.environ["WORLD_SIZE"],
            )
        return DistributedContext()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    backend = str(dist.get_backend())
    local_rank = _env_int("LOCAL_RANK", rank)
    cuda = "nccl" in backend and torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    return DistributedContext(rank, world_size, local_rank, device, backend)


def shutdown_distributed(ctx: DistributedContext) -> None:
    """Destroy the process group if :func:`init_distributed` created it."""
    if ctx.owns_group and dist.is_initialized():
        dist.destroy_process_group()


# -- the model ----------------------------------------------------------------------------------


def parallelize(
    model: nn.Module,
    ctx: DistributedContext,
    *,
    fsdp: bool = False,
    block_types: tuple[type[nn.Module], ...] = BLOCK_TYPES,
) -> nn.Module:
    """Wrap a built model for data-parallel training over ``ctx``'s processes.

    Every process must hold the same initial weights (build the model under the same seed; DDP
    also broadcasts rank 0's at construction).

    Args:
        model: the model; moved to ``ctx.device``.
        ctx: the processes; a single process returns ``model`` unchanged.
        fsdp: FSDP2 ``fully_shard`` per block of ``block_types`` then on the root (in place:
            the returned module *is* ``model``); otherwise ``DistributedDataParallel``.
        block_types: the module types sharded as units (default attnlab's Transformer blocks).

    Returns:
        The module to train (call it, not ``model``, in the forward pass).

    A single process returns ``model`` as it is, and with ``fsdp`` logs a warning that nothing
    is sharded (a run trained by several processes may be resumed by one; ``attnlab train
    --fsdp`` in one process is refused before this).
    """
    if not ctx.enabled:
        if fsdp:
            logger.warning(
                "fsdp=True shards over the processes of a distributed run; this is a single "
                "process, which trains the whole model unsharded (launch with torchrun "
                "--nproc_per_node=N, N >= 2, to shard it)"
            )
        return model
    model = model.to(ctx.device)
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        blocks = [m for m in model.modules() if isinstance(m, block_types)]
        for block in blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    device_ids = [ctx.device] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's model inside a DDP wrapper (an FSDP2 model is its own, sharded, self)."""
    while isinstance(model, DistributedDataParallel):
        model = model.module
    return model


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Run a forward + backward that reduces gradients over the processes only if ``enabled``
    (the last micro-batch of an accumulated step); the others just accumulate locally."""
    if enabled:
        yield
        return
    if isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
        return
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
        return
    yield


def move_to(batch: Any, device: torch.device) -> Any:
    """``batch`` (tensors, or tuples/lists/dicts of them) on ``device``."""
    if isinstance(batch, Tensor):
        return batch.to(device)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a NamedTuple
        return type(batch)(*(move_to(b, device) for b in batch))
    if isinstance(batch, tuple | list):
        return type(batch)(move_to(b, device) for b in batch)
    if isinstance(batch, Mapping):
        return {k: move_to(v, device) for k, v in batch.items()}
    return batch


# -- full state dicts (portable across world sizes) ---------------------------------------------

_GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The unsharded weights on the CPU, keyed like the unwrapped model's ``state_dict``.

    Distributed: every process must call it; rank 0 gets the weights, the others ``{}``.
    """
    state: dict[str, Tensor] = get_model_state_dict(model, options=_GATHER)  # type: ignore[assignment]
    return state


def full_optimizer_state_dict(model: nn.Module, optimizer: Optimizer) -> dict[str, Any]:
    """The unsharded optimizer state on the CPU, keyed by parameter *name* (not torch's
    position ids), so it loads into any world size or wrapping.

    Distributed: every process must call it; rank 0 gets the state, the others ``{}``.
    """
    return get_optimizer_state_dict(model, optimizer, options=_GATHER)


def load_full_state(
    model: nn.Module,
    optimizer: Optimizer | None,
    model_state: dict[str, Tensor] | None,
    optimizer_state: dict[str, Any] | None,
    ctx: DistributedContext,
) -> None:
    """Load full state dicts (as :func:`full_model_state_dict` / :func:`full_optimizer_state_dict`
    give) into a possibly wrapped or sharded model and its optimizer.

    Distributed, only rank 0 needs the dicts (others pass ``None``): they are broadcast and each
    process keeps its shard. The dicts are consumed (their tensors may be replaced).

    Raises:
        ValueError: if the main process has no model state.
        RuntimeError: for missing or unexpected weight names (strict).
    """
    if ctx.is_main and model_state is None:
        raise ValueError("the main process needs the model state to load")
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=ctx.enabled)
    keep = ctx.is_main or not ctx.enabled
    weights: dict[str, Any] = (model_state or {}) if keep else {}
    set_model_state_dict(model, weights, options=options)
    if optimizer is not None:
        optim = (optimizer_state or {}) if keep else {}
        set_optimizer_state_dict(model, optimizer, optim, options=options)


def load_full_optimizer_state_dict(
    model: nn.Module, optimizer: Optimizer, state: dict[str, Any]
) -> None:
    """Load a full, name-keyed optimizer state that *every* process holds (each keeps the part
    its shards need)."""
    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(model, optimizer, state, options=options)


# -- collectives on small values ----------------------------------------------------------------


def all_reduce_sum(values: Sequence[float], ctx: DistributedContext) -> list[float]:
    """``values`` summed element-wise over the processes (float64)."""
    if not ctx.enabled:
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t)
    return [float(v) for v in t.tolist()]


def any_rank(flag: bool, ctx: DistributedContext) -> bool:
    """Whether ``flag`` is true on at least one process (so that all take the same branch)."""
    return all_reduce_sum([1.0 if flag else 0.0], ctx)[0] > 0


def barrier(ctx: DistributedContext) -> None:
    """Wait for every process."""
    if ctx.enabled:
        dist.barrier()


def all_gather_stack(t: Tensor, ctx: DistributedContext) -> Tensor:
    """Every process's ``t`` (same shape and dtype everywhere), stacked: ``(world_size, *t.shape)``
    on the CPU."""
    if not ctx.enabled:
        return t.detach().cpu()[None]
    local = t.detach().to(ctx.device)
    out = [torch.empty_like(local) for _ in range(ctx.world_size)]
    dist.all_gather(out, local)
    return torch.stack([o.cpu() for o in out])


def broadcast_state(state: Any, ctx: DistributedContext) -> Any:
    """Rank 0's ``state`` (nested tensors/numbers/strings, as
    :func:`attnlab.training.state.flatten_state` accepts) on every process: its JSON as bytes,
    then its tensors, through the process group; no pickle. Other ranks pass anything
    (``None``)."""
    if not ctx.enabled:
        return state
    tensors: dict[str, Tensor] = {}
    header = b""
    if ctx.is_main:
        data, tensors = flatten_state(state)
        specs = {
            k: [str(v.dtype).removeprefix("torch."), list(v.shape)] for k, v in tensors.items()
        }
        header = json.dumps({"data": data, "tensors": specs}, allow_nan=False).encode("utf-8")
    size = torch.tensor([len(header)], dtype=torch.int64, device=ctx.device)
    dist.broadcast(size, src=0)
    buffer = torch.empty(int(size.item()), dtype=torch.uint8, device=ctx.device)
    if ctx.is_main:
        buffer.copy_(torch.frombuffer(bytearray(header), dtype=torch.uint8))
    dist.broadcast(buffer, src=0)
    decoded = json.loads(buffer.cpu().numpy().tobytes().decode("utf-8"))
    received: dict[str, Tensor] = {}
    for name in sorted(decoded["tensors"]):
        dtype_name, shape = decoded["tensors"][name]
        dtype = getattr(torch, dtype_name, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"broadcast tensor {name!r} has an unknown dtype {dtype_name!r}")
        t = (
            tensors[name].to(ctx.device)
            if ctx.is_main
            else torch.empty(shape, dtype=dtype, device=ctx.device)
        )
        dist.broadcast(t, src=0)
        received[name] = t.cpu()
    return unflatten_state(decoded["data"], received)


def rank_seed(seed: int, rank: int, step: int = 0) -> int:
    """The global torch seed (dropout) of process ``rank``: ``seed`` itself on rank 0 (so one
    process is seeded exactly as without torchrun), distinct derived seeds elsewhere."""
    if rank == 0 and step == 0:
        return seed
    return (seed + 0x9E3779B97F4A7C15 * rank + 0xBF58476D1CE4E5B9 * step) % 2**63


__all__ = [
    "BACKENDS",
    "BLOCK_TYPES",
    "DistributedContext",
    "all_gather_stack",
    "all_reduce_sum",
    "any_rank",
    "barrier",
    "broadcast_state",
    "current_context",
    "full_model_state_dict",
    "full_optimizer_state_dict",
    "gradient_sync",
    "init_distributed",
    "launched_by_torchrun",
    "load_full_optimizer_state_dict",
    "load_full_state",
    "move_to",
    "parallelize",
    "rank_seed",
    "shutdown_distributed",
    "unwrap_model",
]
