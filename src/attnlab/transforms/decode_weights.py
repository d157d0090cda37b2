"""Decode-time weight layout: faster copies of the projections that run once per token.

Decoding is a chain of skinny matrix products (one row per sequence), each streaming a whole
weight from memory, so the kernel's memory bandwidth decides the time per token. On the CPU
this was measured on (2-core AMD EPYC, MKL and oneDNN as shipped in the torch 2.13 CPU wheel;
``benchmarks/decode_kernels.py``, GPT-2-small shapes, weights streamed so none is served from
cache), oneDNN's inner product on a *reordered* weight read the weights at 19-28 GB/s where
``F.linear`` (MKL) read 7-18 GB/s: 20.2 vs 35.2 ms of products per token for 1 row, 22.9 vs
57.4 ms for 8 rows. The reordered copy serves any number of rows (the reorder only takes the row
count as a hint). On Intel CPUs it is the other way round: on two 2-core Xeons of later sessions
``F.linear`` read the weights faster than the reordered copies (17.5 vs 12.2 GB/s; GPT-2 small
decoded at 26.6 ms per token without copies against 32.4 ms with them, interleaved rounds), as
one expects of MKL, Intel's library, which is known to take slower paths on other vendors' CPUs.
So large weights get reordered copies unless the CPU is an Intel one
(:func:`large_weight_library`; ``ATTNLAB_DECODE_LIBRARY=onednn|mkl`` decides by hand). Small
weights are another matter: oneDNN's fixed cost per call outweighs the
bandwidth (a d_model 128 GPT decoded 1.8x slower), so weights under :data:`ONEDNN_MIN_NUMEL`
elements get an *input-major* copy instead (``(in, out)`` storage used through a transposed
view; MKL's kernel for it beats ``nn.Linear``'s layout on wide matrices read by 1-2 rows).

:func:`decode_layout` applies this from outside, for the duration of one decoding call, to a
built model: every decoder self-attention gets its ``project_qkv`` replaced by one product on a
stacked q/k/v copy, and every other projection of the decoder layers that runs per token
(self-attention output, cross-attention query and output, the FFN's linears) and the LM head a
``forward`` that uses its own copy — where a copy pays: for weights of at least
:data:`ONEDNN_MIN_NUMEL` elements where oneDNN decodes them (reordered; not on Intel CPUs, where
the parameters themselves go to MKL), and for smaller ones (input-major) only the
stacked q/k/v and the wide projections (``out > in``) when at most :data:`MAX_ROWS` rows are
decoded. Afterwards the modules are as they were. Cross-attention keys/values are projected once
per call from the encoder memory and keep the parameters. The parameters themselves are never
touched (training, optimizer state and checkpoints see plain contiguous tensors), and a copy is
used only while autograd is off and its sources are unchanged (:meth:`DecodeWeight.is_current`:
same tensors, same storage, same in-place version), never with stale numbers.

Making the copies costs one pass over the weights (~0.3 s for GPT-2 small), so they are kept with
the model between calls and made again only for weights that changed since (a model being
trained gets fresh ones at each sampling call); :func:`release_copies` frees them. The price is
memory: about 1.0x the decoder's weights (~0.5 GB for GPT-2 small; with MKL for the large
weights, only the small ones' copies) from the first decoding call until the model goes or
:func:`release_copies`; the memory check of ``attnlab generate`` counts them (:func:`copy_numel`,
as if every copy were made). Models off the CPU, in another dtype than fp32, or without oneDNN
decode with their own modules; so do quantized projections
(:mod:`attnlab.transforms.quant_modules`), except a self-attention's q/k/v run by attnlab's int8
or int4 kernel: those are joined into one quantized layer (:class:`QuantizedStack`, a copy of
their codes: a quarter of a GPT decoder layer's quantized bytes, not counted by
:func:`copy_numel`), so that each token makes one kernel call for them instead of three, and
their attention backend (``sdpa``) runs attnlab's decode-attention kernel
(:func:`attnlab.transforms.woq_kernels.decode_attention`) for every step with one query per
sequence, no mask and autograd off (a prompt, a padded batch's masked steps, anything else:
``sdpa`` as before); the backend is restored afterwards. Where a whole decoder layer is of that
kind (int8/int4 projections on attnlab's kernels, LayerNorm or RMSNorm, a plain or gated FFN,
learned or rotary positions, no cross-attention), its ``forward`` is replaced too, for the
call: each one-token step runs as one C++ call (:mod:`attnlab.transforms.decode_layer`, bit for
bit the modules' result), any other step through the modules.

Shapes: (..., in) -> (..., out).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import attnlab.transforms.woq_kernels as wk
from attnlab.layers.attention_backends import sdpa_attention
from attnlab.layers.blocks import DecoderLayer
from attnlab.layers.multihead import MultiHeadAttention
from attnlab.models import build_model
from attnlab.models.gpt import GPT
from attnlab.transforms.decode_layer import (
    RotaryMemo,
    fused_forward,
    fused_stack,
    layer_plan,
    watch_registrations,
)
from attnlab.transforms.quant_modules import QuantizedLinear, stack_quantized, stackable


def _tensor_stamps(tensors: Sequence[Tensor]) -> tuple[tuple[int, int, int], ...]:
    """(identity, storage address, in-place version) of every tensor."""
    # Inference tensors keep no version counter (they cannot be changed outside inference mode).
    return tuple((id(t), t.data_ptr(), 0 if t.is_inference() else t._version) for t in tensors)


def _stamps(linears: Sequence[nn.Linear]) -> tuple[tuple[int, int, int], ...]:
    """:func:`_tensor_stamps` of every weight and bias."""
    return _tensor_stamps([t for lin in linears for t in (lin.weight, lin.bias) if t is not None])


ONEDNN_MIN_NUMEL = 1 << 18  # elements (1 MiB of fp32): smaller copies are input-major


def reordering_available(weight: Tensor) -> bool:
    """Whether :class:`DecodeWeight` can copy ``weight``: an fp32 CPU tensor with oneDNN present."""
    return (
        torch.backends.mkldnn.is_available()
        and weight.device.type == "cpu"
        and weight.dtype == torch.float32
    )


@dataclass(frozen=True)
class DecodeWeight:
    """Weights (and biases) of one or more linears stacked along ``out``, in a decoding layout.

    Calling it computes ``F.linear(x, stacked weight, stacked bias)`` (inference only: no
    autograd): with oneDNN's inner product for a reordered copy, with MKL for an input-major one.

    Attributes:
        weight: ``(sum out, in)``: a oneDNN tensor (``is_mkldnn``) in the kernel's layout, or,
            below :data:`ONEDNN_MIN_NUMEL` elements, an ``(in, sum out)`` buffer seen transposed
            (strides ``(1, sum out)``).
        bias: ``(sum out,)`` or ``None``.
        sources: the layers copied; ``stamps``: their tensors' identity, storage and version at
            copy time.
    """

    weight: Tensor
    bias: Tensor | None
    sources: tuple[nn.Linear, ...]
    stamps: tuple[tuple[int, int, int], ...]

    @classmethod
    def stack(cls, linears: Sequence[nn.Linear], rows: int | None = None) -> DecodeWeight:
        """Copy ``linears``' weights (same ``in_features``) stacked in order: reordered for
        oneDNN, or input-major below :data:`ONEDNN_MIN_NUMEL` elements.

        Args:
            linears: the layers, fp32 on the CPU.
            rows: the number of input rows expected (a layout hint; any number works).

        Raises:
            ValueError: if ``linears`` is empty, their input sizes differ, only some have a bias,
                or a weight is not an fp32 CPU tensor (or oneDNN is missing).
        """
        if not linears:
            raise ValueError("DecodeWeight.stack needs at least one linear layer")
        if len({lin.in_features for lin in linears}) != 1:
            sizes = [lin.in_features for lin in linears]
            raise ValueError(f"stacked linears must share in_features, got {sizes}")
        biases = [lin.bias for lin in linears]
        if any(b is None for b in biases) and not all(b is None for b in biases):
            raise ValueError("stacked linears must all have a bias or all have none")
        bad = [lin.weight for lin in linears if not reordering_available(lin.weight)]
        if bad:
            raise ValueError(
                "DecodeWeight needs fp32 CPU weights and oneDNN (torch.backends.mkldnn), got "
                f"{bad[0].dtype} on {bad[0].device}"
            )
        with torch.no_grad():
            weights = [lin.weight.detach() for lin in linears]
            if sum(w.numel() for w in weights) >= ONEDNN_MIN_NUMEL:
                stacked = weights[0] if len(weights) == 1 else torch.cat(weights)  # (out, in)
                copy = torch.ops.mkldnn._reorder_linear_weight(stacked.contiguous(), rows)
            else:
                copy = torch.cat([w.t() for w in weights], dim=1).contiguous().t()
            bias = None if biases[0] is None else torch.cat([b for b in biases if b is not None])
        return cls(copy, bias, tuple(linears), _stamps(linears))

    @property
    def reordered(self) -> bool:
        """True for a oneDNN copy, False for an input-major one."""
        return bool(self.weight.is_mkldnn)

    def __call__(self, x: Tensor) -> Tensor:
        """x ``(..., in)`` -> ``(..., sum out)`` (no autograd)."""
        if self.weight.is_mkldnn:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

    def is_current(self) -> bool:
        """True while no source weight or bias has been replaced or modified in place."""
        return _stamps(self.sources) == self.stamps


MAX_ROWS = 2  # small (input-major) copies pay only for this many rows or fewer

# model -> {self-attention or linear -> its copy}; an entry goes with its model.
_COPIES: weakref.WeakKeyDictionary[nn.Module, dict[nn.Module, Any]] = weakref.WeakKeyDictionary()


def _is_linear(m: object) -> bool:
    return isinstance(m, nn.Linear)


@dataclass(frozen=True)
class QuantizedStack:
    """Quantized q/k/v layers of one self-attention joined into one (see
    :func:`attnlab.transforms.quant_modules.stack_quantized`), with the sources' stamps.

    Calling it computes the joined layer (inference only); :meth:`is_current` as
    :meth:`DecodeWeight.is_current`, over the sources' codes, scales, zeros and biases.
    """

    layer: QuantizedLinear
    sources: tuple[QuantizedLinear, ...]
    stamps: tuple[tuple[int, int, int], ...]

    @classmethod
    def stack(cls, layers: Sequence[QuantizedLinear]) -> QuantizedStack:
        """Join ``layers`` (:func:`~attnlab.transforms.quant_modules.stackable` must hold)."""
        return cls(stack_quantized(list(layers)), tuple(layers), _quantized_stamps(layers))

    def __call__(self, x: Tensor) -> Tensor:
        """x ``(..., in)`` -> ``(..., sum out)``."""
        return self.layer(x)

    def is_current(self) -> bool:
        """True while no source tensor has been replaced or modified in place."""
        return _quantized_stamps(self.sources) == self.stamps


def _quantized_stamps(layers: Sequence[QuantizedLinear]) -> tuple[tuple[int, int, int], ...]:
    """:func:`_tensor_stamps` of every stored tensor (codes, scales, zeros, bias)."""
    return _tensor_stamps([t for layer in layers for t in layer.stored_tensors()])


def _quantized_qkv(model: nn.Module) -> list[MultiHeadAttention]:
    """The decoder self-attentions whose q/k/v are quantized layers that can be joined."""
    out = []
    for module in model.modules():
        if isinstance(module, DecoderLayer):
            mha = module.self_attn
            layers: list[nn.Module] = [mha.q_proj, mha.k_proj, mha.v_proj]
            quantized = [p for p in layers if isinstance(p, QuantizedLinear)]
            if len(quantized) == 3 and stackable(quantized):
                out.append(mha)
    return out


def _decoder_parts(model: nn.Module) -> tuple[list[MultiHeadAttention], list[nn.Linear]]:
    """The self-attentions (stacked q/k/v) and other linears that run once per decoded token
    (only plain ``nn.Linear`` projections: anything else, e.g. a quantized one, keeps running
    as it is)."""
    attentions: list[MultiHeadAttention] = []
    candidates: list[object] = []
    for module in model.modules():
        if isinstance(module, DecoderLayer):
            mha = module.self_attn
            if all(_is_linear(p) for p in (mha.q_proj, mha.k_proj, mha.v_proj)):
                attentions.append(mha)
            candidates.append(mha.out_proj)
            if module.cross_attn is not None:
                candidates += [module.cross_attn.q_proj, module.cross_attn.out_proj]
            candidates += list(module.ffn.modules())
    candidates.append(getattr(model, "lm_head", None))
    return attentions, [m for m in candidates if isinstance(m, nn.Linear)]


def copy_numel(model: nn.Module | Any) -> int:
    """Number of weight and bias elements :func:`decode_layout` may copy for ``model`` (at most;
    any device, ``meta`` included), or for the model a config builds (built on ``meta``: free,
    for estimates before building)."""
    if not isinstance(model, nn.Module):
        return _config_copy_numel(model)
    attentions, linears = _decoder_parts(model)
    layers = [lin for mha in attentions for lin in (mha.q_proj, mha.k_proj, mha.v_proj)]
    tensors = [t for lin in [*layers, *linears] for t in (lin.weight, lin.bias) if t is not None]
    return sum(t.numel() for t in tensors)


def _config_copy_numel(config: Any) -> int:
    """:func:`copy_numel` of the model ``config`` builds, from models of one and two layers
    (built on ``meta``), so that a config claiming a million layers costs nothing to estimate;
    a config whose layers are not alike (per-layer options) is built whole."""
    fields = [
        f.name for f in dataclasses.fields(config) if re.fullmatch(r"n_(\w+_)?layers", f.name)
    ]
    counts = {name: getattr(config, name) for name in fields}
    n = next(iter(counts.values()), None)
    if not isinstance(n, int) or n < 3 or any(v != n for v in counts.values()):
        return copy_numel(build_model(config, device="meta"))
    try:
        one = dataclasses.replace(config, **dict.fromkeys(fields, 1))
        two = dataclasses.replace(config, **dict.fromkeys(fields, 2))
    except (TypeError, ValueError):  # per-layer options tied to the layer count
        return copy_numel(build_model(config, device="meta"))
    c1, c2 = (
        copy_numel(build_model(one, device="meta")),
        copy_numel(build_model(two, device="meta")),
    )
    return c1 + (n - 1) * (c2 - c1)


@functools.cache
def _cpu_vendor() -> str:
    """The CPU's vendor string (``GenuineIntel``, ``AuthenticAMD``, ...; empty if unknown)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


LIBRARY_VARIABLE = "ATTNLAB_DECODE_LIBRARY"


def large_weight_library() -> str:
    """Which library decodes weights of at least :data:`ONEDNN_MIN_NUMEL` elements: ``"onednn"``
    (a reordered copy) or ``"mkl"`` (``F.linear`` on the parameter itself, no copy). Set by
    ``ATTNLAB_DECODE_LIBRARY`` (``onednn``, ``mkl`` or ``auto``); ``auto`` (the default) is
    ``mkl`` on Intel CPUs and ``onednn`` elsewhere (see the module doc).

    Raises:
        ValueError: for another value of ``ATTNLAB_DECODE_LIBRARY``.
    """
    choice = os.environ.get(LIBRARY_VARIABLE, "auto").strip().lower() or "auto"
    if choice not in ("auto", "onednn", "mkl"):
        raise ValueError(f"{LIBRARY_VARIABLE}={choice!r}: expected 'onednn', 'mkl' or 'auto'")
    if choice == "auto":
        return "mkl" if _cpu_vendor() == "GenuineIntel" else "onednn"
    return choice


def _pays(linears: Sequence[nn.Linear], rows: int, stacked: bool) -> bool:
    """Whether a copy of ``linears`` speeds up decoding ``rows`` rows (see the module doc)."""
    if sum(lin.weight.numel() for lin in linears) >= ONEDNN_MIN_NUMEL:
        return large_weight_library() == "onednn"
    wide = stacked or all(lin.out_features > lin.in_features for lin in linears)
    return rows <= MAX_ROWS and wide


_Copy = TypeVar("_Copy", DecodeWeight, QuantizedStack)


def _cached(
    copies: dict[nn.Module, Any],
    owner: nn.Module,
    kind: type[_Copy],
    sources: Sequence[nn.Module],
    make: Callable[[], _Copy],
) -> _Copy:
    """``owner``'s cached copy of ``sources`` (a ``kind``), made again by ``make`` if they
    changed since."""
    old = copies.pop(owner, None)
    if isinstance(old, kind) and old.sources == tuple(sources) and old.is_current():
        copies[owner] = old
        return old
    del old  # free the stale copy before making the new one
    fresh = make()
    copies[owner] = fresh
    return fresh


def _current_copy(
    copies: dict[nn.Module, Any],
    owner: nn.Module,
    linears: Sequence[nn.Linear],
    rows: int,
) -> DecodeWeight:
    """``owner``'s cached copy of ``linears``, made again if they changed since."""
    return _cached(copies, owner, DecodeWeight, linears, lambda: DecodeWeight.stack(linears, rows))


def _current_stack(copies: dict[nn.Module, Any], mha: MultiHeadAttention) -> QuantizedStack:
    """``mha``'s cached joined quantized q/k/v, made again if a source changed since."""
    layers = cast(
        "tuple[QuantizedLinear, QuantizedLinear, QuantizedLinear]",
        (mha.q_proj, mha.k_proj, mha.v_proj),
    )
    return _cached(copies, mha, QuantizedStack, layers, lambda: QuantizedStack.stack(layers))


@contextmanager
def decode_layout(model: nn.Module, rows: int) -> Iterator[None]:
    """Give ``model``'s per-token projections reordered copies for one decoding call.

    The copies are kept with the model for the next call (made again only for weights that
    changed); :func:`release_copies` frees them.

    Args:
        model: the model about to decode (its modules get copies; parameters are unchanged).
        rows: how many rows are decoded together: decides which copies pay, and is a layout
            hint for new reordered copies (which serve any number of rows). A model whose
            weights are not fp32 on the CPU, or a torch without oneDNN, is left as it is.
    """
    attentions, linears = _decoder_parts(model)
    weights = [lin.weight for lin in linears] + [m.q_proj.weight for m in attentions]
    if not all(reordering_available(w) for w in weights):
        attentions, linears = [], []
    attentions = [m for m in attentions if _pays([m.q_proj, m.k_proj, m.v_proj], rows, True)]
    linears = [lin for lin in linears if _pays([lin], rows, False)]
    quantized = _quantized_qkv(model)
    copies = _COPIES.setdefault(model, {}) if linears or attentions or quantized else {}
    patched: list[tuple[nn.Module, str]] = []
    backends: list[tuple[MultiHeadAttention, Any]] = []
    try:
        for mha in attentions:
            qkv = [mha.q_proj, mha.k_proj, mha.v_proj]
            _patch(mha, "project_qkv", _stacked_qkv(mha, _current_copy(copies, mha, qkv, rows)))
            patched.append((mha, "project_qkv"))
        stacks = {mha: _current_stack(copies, mha) for mha in quantized}
        for mha, stack in stacks.items():
            _patch(mha, "project_qkv", _stacked_qkv(mha, stack))
            patched.append((mha, "project_qkv"))
        for lin in linears:
            _patch(lin, "forward", _copy_forward(lin, _current_copy(copies, lin, [lin], rows)))
            patched.append((lin, "forward"))
        kernel_attention = [m for m in quantized if m.backend is sdpa_attention]
        if kernel_attention and wk.available():
            for mha in kernel_attention:
                backends.append((mha, mha.backend))
                mha.backend = _decode_attention(mha.backend)
            memo = RotaryMemo()  # a RoPE model's cos and sin, made once a step
            fused = 0
            for layer in _layers_of(model, kernel_attention):
                plan = layer_plan(layer, stacks[layer.self_attn])
                if plan is not None:  # one call per layer and token (decode_layer.py)
                    _patch(layer, "forward", fused_forward(layer, plan, memo))
                    patched.append((layer, "forward"))
                    fused += 1
            if fused and isinstance(model, GPT):
                # a GPT's layers back to back when all of them take their fused step
                # (and, where the embedding and final norm allow, the whole step in one call)
                whole = fused_stack(model, memo)
                _patch(model, "run_layers", whole.run_layers)
                _patch(model, "hidden_states", whole.hidden_states)
                patched += [(model, "run_layers"), (model, "hidden_states")]
        with watch_registrations():
            yield
    finally:
        for module, name in patched:
            module.__dict__.pop(name, None)  # back to the class's own method
        for mha, backend in backends:
            mha.backend = backend


def _layers_of(model: nn.Module, attentions: Sequence[MultiHeadAttention]) -> list[DecoderLayer]:
    """The decoder layers of ``model`` whose self-attention is one of ``attentions``."""
    wanted = {id(m) for m in attentions}
    return [m for m in model.modules() if isinstance(m, DecoderLayer) and id(m.self_attn) in wanted]


def _decode_attention(backend: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``backend`` (``sdpa``), but a single query per sequence with no mask, no dropout and
    autograd off runs :func:`attnlab.transforms.woq_kernels.decode_attention` (the one query sees
    every cached key, so ``is_causal`` changes nothing there): q ``(B, H, 1, D)``, k/v ``(B, H_kv,
    S, D)`` -> ``(B, H, 1, D)``."""

    def attention(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        dropout_p: float = 0.0,
        **options: Any,
    ) -> Tensor:
        if (
            mask is None
            and not options
            and dropout_p == 0.0
            and q.dim() == 4
            and q.shape[2] == 1
            and not torch.is_grad_enabled()
            and q.dtype == k.dtype == v.dtype == torch.float32
            and q.device.type == k.device.type == v.device.type == "cpu"
            and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
        ):
            return wk.decode_attention(q, k, v)
        return backend(q, k, v, mask=mask, is_causal=is_causal, dropout_p=dropout_p, **options)

    attention.decode_kernel = True  # type: ignore[attr-defined]  # for tests and inspection
    return attention


def _patch(module: nn.Module, name: str, method: Callable[..., object]) -> None:
    """Shadow ``module``'s method ``name`` by an instance attribute (removed afterwards)."""
    if name in module.__dict__:
        raise RuntimeError(f"{type(module).__name__}.{name} is already replaced (nested layout?)")
    module.__dict__[name] = method


def _copy_forward(lin: nn.Linear, copy: DecodeWeight) -> Callable[[Tensor], Tensor]:
    """``lin.forward`` on ``copy`` while it is current and autograd is off."""

    def forward(x: Tensor) -> Tensor:
        if not torch.is_grad_enabled() and copy.is_current():
            return copy(x)
        return F.linear(x, lin.weight, lin.bias)

    forward.copy = copy  # type: ignore[attr-defined]  # for active_copy
    return forward


def _stacked_qkv(
    mha: MultiHeadAttention, copy: DecodeWeight | QuantizedStack
) -> Callable[[Tensor], tuple[Tensor, Tensor, Tensor]]:
    """``mha.project_qkv`` as one product on the stacked q/k/v ``copy`` (while current)."""
    kv = mha.n_kv_heads * mha.d_head
    q_proj, k_proj, v_proj = mha.q_proj, mha.k_proj, mha.v_proj

    def project_qkv(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if not torch.is_grad_enabled() and copy.is_current():
            q, k, v = copy(x).split((mha.n_heads * mha.d_head, kv, kv), dim=-1)
            return q, k, v
        return q_proj(x), k_proj(x), v_proj(x)

    project_qkv.copy = copy  # type: ignore[attr-defined]  # for active_copy
    return project_qkv


def active_copy(module: nn.Module) -> DecodeWeight | QuantizedStack | None:
    """The copy ``module`` (a linear, or a self-attention's stacked q/k/v: a
    :class:`QuantizedStack` for quantized ones) decodes with inside :func:`decode_layout`, or
    ``None`` (outside it, or when no copy pays)."""
    method = module.__dict__.get(
        "project_qkv" if isinstance(module, MultiHeadAttention) else "forward"
    )
    copy = getattr(method, "copy", None)
    return copy if isinstance(copy, (DecodeWeight, QuantizedStack)) else None


def release_copies(model: nn.Module) -> None:
    """Free the decoding copies kept for ``model`` (they are made again when needed)."""
    _COPIES.pop(model, None)


__all__ = [
    "MAX_ROWS",
    "ONEDNN_MIN_NUMEL",
    "DecodeWeight",
    "QuantizedStack",
    "active_copy",
    "copy_numel",
    "decode_layout",
    "large_weight_library",
    "release_copies",
    "reordering_available",
]
