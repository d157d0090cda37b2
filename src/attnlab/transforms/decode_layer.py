"""The C++ step of a quantized decoder layer, and of a whole stack (for the fused decode engine).

At one token per sequence a quantized GPT-2-small layer is seven kernel calls of a few hundred
microseconds and some twenty small operations (norms, head views, the KV-cache write, residual
adds, the activation) of a few microseconds each, every one of them dispatched from Python; on
issue 27's 2-core Xeon those small steps cost 3.3 ms per token, as much as the int4 products.
``attnlab/kernels/csrc/decode_layer.cpp`` runs a whole layer's step in C++ with attnlab's int8/int4
and decode-attention kernels, computing what the modules compute in the same order, so the result
is bit for bit the modules' (to 1e-5 with the exact GELU; tests/transforms/test_decode_layer.py).

:func:`layer_plan` describes a layer for that operator, or returns ``None`` when the layer is
not one it covers: a :class:`~attnlab.layers.blocks.DecoderLayer` without cross-attention (nor
QK-norm, nor value embeddings),
attnlab's ``LayerNorm`` or ``RMSNorm``, a :class:`~attnlab.layers.feedforward.FeedForward` (plain
or gated), an ``sdpa`` self-attention (RoPE or none) whose q/k/v can be joined in a
:class:`~attnlab.transforms.decode_weights.QuantizedStack` (the step reads q, k and v from their
own layers), and an output projection and FFN of int8/int4 layers run by attnlab's kernels.
:func:`takes_step` says whether a step is one the plan covers (one new token per sequence, no
mask, autograd off, no hooks, a plain cache with room, no active dropout) and :func:`layer_step`
runs it. :class:`CppStack` runs a decoder's whole stack in one call when every layer has a plan
(and, with a plain embedding and final norm, the whole step from token ids to the final norm);
the engine (:mod:`attnlab.transforms.decode_engine`) calls it from outside the model, which it
never changes.

Shapes: x ``(B, 1, E)`` -> ``(B, 1, E)``; the cache ``(B, H_kv, L, D)`` gains position
``length``.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn
from torch.nn.modules import module as torch_module

import attnlab.kernels as wk
from attnlab.layers.blocks import DecoderLayer
from attnlab.layers.embedding import TokenEmbedding
from attnlab.layers.feedforward import GATED, FeedForward
from attnlab.layers.kv_cache import KVCache, LayerKVCache, positions_for
from attnlab.layers.multihead import MultiHeadAttention
from attnlab.layers.norm import LayerNorm, RMSNorm
from attnlab.layers.positional import (
    LearnedPositionalEmbedding,
    NoPositionalEncoding,
    RotaryEmbedding,
    check_positions,
)
from attnlab.models.family import DecoderStack
from attnlab.transforms.quant_modules import QuantizedLinear

# the codes of csrc/decode_layer.cpp
NORM_KINDS: dict[type, int] = {LayerNorm: 0, RMSNorm: 1}
ACTIVATION_CODES = {"relu": 0, "gelu": 1, "gelu_tanh": 2, "silu": 3}
ROTARY_LAYOUTS = {"half": 1, "interleaved": 2}


def _kernel_layer(m: object) -> QuantizedLinear | None:
    """``m`` if it is a quantized linear that attnlab's int8/int4 kernel runs, else ``None``."""
    if (
        isinstance(m, QuantizedLinear)
        and m.kernel in (wk.KERNEL_INT8, wk.KERNEL_INT4)
        and m.qweight.device.type == "cpu"
    ):
        return m
    return None


def _linear_entries(layer: QuantizedLinear | None) -> tuple[list[Tensor | None], list[int]]:
    """(codes, scales, zeros, bias) and (bits, group size) of a kernel layer (``None``: absent)."""
    if layer is None:
        return [None] * 4, [0, 0]
    zeros = getattr(layer, "zeros", None) if layer.bits == 4 else None
    group = int(getattr(layer, "group_size", 0)) if layer.bits == 4 else 0
    return [layer.qweight, layer.scales, zeros, layer.bias], [layer.bits, group]


Watched = tuple[dict[str, Any], str, Tensor]  # (a module's tensor dict, name, tensor)


def _watch(modules: Sequence[nn.Module]) -> tuple[Watched, ...]:
    """Every parameter and buffer of ``modules`` (not of their children) as it is now."""
    out: list[Watched] = []
    for m in modules:
        for store in (m._parameters, m._buffers):
            out += [(store, name, t) for name, t in store.items() if t is not None]
    return tuple(out)


def _unchanged(watched: Sequence[Watched]) -> bool:
    """True while no watched tensor has been replaced."""
    return all(store.get(name) is t for store, name, t in watched)


@dataclass(frozen=True)
class LayerPlan:
    """What ``torch.ops.attnlab_decode.layer_step`` needs of one layer.

    Attributes:
        tensors: norm 1 (weight, bias), norm 2 (weight, bias), then (codes, scales, zeros,
            bias) of q, k, v, out, up, gate and down (``None`` where absent).
        config: pre-norm, norm kind, activation, gated, H, H_kv, D, RoPE layout (0: none),
            then (bits, group size) of the seven linears. floats: the two norms' eps and the
            attention scale.
        rotary: the layer's RoPE module, or ``None``.
        watched: the tensors the step reads, as they were when the plan was made: an in-place
            change of them is seen by the step, a replacement is not (see :meth:`is_current`).
        modules: the modules the step stands in for (it is taken only while none has hooks);
            ``hooked``: those of them with attnlab hook sites (``activation_hook``).
        dropout_free: every dropout of the layer has p = 0 (else only eval mode takes the step).
    """

    tensors: list[Tensor | None]
    config: list[int]
    floats: list[float]
    rotary: RotaryEmbedding | None
    watched: tuple[Watched, ...]
    modules: tuple[nn.Module, ...]
    hooked: tuple[nn.Module, ...]
    dropout_free: bool

    def is_current(self) -> bool:
        """True while no tensor the step reads has been replaced since the plan was made."""
        return _unchanged(self.watched)


def layer_plan(layer: nn.Module, qkv: Any) -> LayerPlan | None:
    """The plan of ``layer`` given its joined q/k/v ``qkv`` (a ``QuantizedStack``: the step reads
    its sources, the layer's own q/k/v, not the joined copy), or ``None`` when the layer is not
    one the fused step covers (see the module doc)."""
    if not isinstance(layer, DecoderLayer) or layer.cross_attn is not None:
        return None
    mha, ffn = layer.self_attn, layer.ffn
    n1, n2 = (
        cast("LayerNorm | RMSNorm", layer.self_attn_norm),
        cast("LayerNorm | RMSNorm", layer.ffn_norm),
    )
    if (
        not wk.available()
        or "forward" in layer.__dict__  # already replaced (e.g. activation checkpointing)
        or not isinstance(mha, MultiHeadAttention)
        or mha.q_norm is not None  # QK-norm: the C++ step has none (the Python step runs)
        or mha.value_lambdas is not None
        or not (mha.rotary is None or type(mha.rotary) is RotaryEmbedding)
        or not isinstance(ffn, FeedForward)
        or type(n1) not in NORM_KINDS
        or type(n1) is not type(n2)
    ):
        return None
    q, k, v = (_kernel_layer(m) for m in qkv.sources)
    out, up, down = (
        _kernel_layer(mha.out_proj),
        _kernel_layer(ffn.up_proj),
        _kernel_layer(ffn.down_proj),
    )
    gate = _kernel_layer(ffn.gate_proj) if ffn.gate_proj is not None else None
    if q is None or k is None or v is None or out is None or up is None or down is None:
        return None
    if ffn.gate_proj is not None and gate is None:
        return None
    act = GATED.get(ffn.activation, ffn.activation)
    if act not in ACTIVATION_CODES:
        return None
    tensors: list[Tensor | None] = [n1.weight, getattr(n1, "bias", None)]
    tensors += [n2.weight, getattr(n2, "bias", None)]
    config = [
        int(layer.pre_norm),
        NORM_KINDS[type(n1)],
        ACTIVATION_CODES[act],
        int(ffn.gate_proj is not None),
        mha.n_heads,
        mha.n_kv_heads,
        mha.d_head,
        0 if mha.rotary is None else ROTARY_LAYOUTS[mha.rotary.layout],
    ]
    for lin in (q, k, v, out, up, gate, down):
        entries, codes = _linear_entries(lin)
        tensors += entries
        config += codes
    linears = [q, k, v, out, up, down] + ([gate] if gate is not None else [])
    modules = [layer, n1, mha, n2, ffn, *linears, layer.dropout, ffn.dropout]
    dropouts = (layer.dropout.p, ffn.dropout.p, mha.dropout)
    return LayerPlan(
        tensors=tensors,
        config=config,
        floats=[float(n1.eps), float(n2.eps), mha.d_head**-0.5],
        rotary=cast("RotaryEmbedding | None", mha.rotary),
        watched=_watch([n1, n2, *linears]),
        modules=tuple(modules[1:]),  # the layer's own hooks run around its forward anyway
        hooked=(layer, mha, ffn),
        dropout_free=all(p == 0 for p in dropouts),
    )


def _no_hooks(plan: LayerPlan) -> bool:
    """True when neither a global nor any forward hook of the modules the fused step stands in
    for is registered, nor an attnlab hook site is set (the step would skip them)."""
    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return False
    return not (
        any(m._forward_hooks or m._forward_pre_hooks for m in plan.modules)
        or any(m.activation_hook is not None for m in plan.hooked)
    )


class RotaryMemo:
    """cos and sin of one decoding step's positions, made once for all the layers that share a
    RoPE module (the positions tensor is the same object for every layer of a step)."""

    def __init__(self) -> None:
        self.key: tuple[RotaryEmbedding, Tensor] | None = None
        self.value: tuple[Tensor, Tensor] = (torch.empty(0), torch.empty(0))

    def cos_sin(self, rotary: RotaryEmbedding, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``RotaryEmbedding.rotate``'s cos and sin for ``positions``, float32: ``(T, D/2)``, or
        ``(B, 1, T, D/2)`` for per-sequence positions."""
        if self.key is None or self.key[0] is not rotary or self.key[1] is not positions:
            ang = rotary.angles(positions)  # (T, D/2) or (B, T, D/2), float64
            if ang.dim() == 3:
                ang = ang.unsqueeze(1)  # (B, 1, T, D/2): broadcast over heads
            self.key, self.value = (rotary, positions), (ang.cos().float(), ang.sin().float())
        return self.value


def _takes_step(layer: DecoderLayer, plan: LayerPlan, x: Tensor, cache: LayerKVCache) -> bool:
    """Whether the fused step covers ``layer``'s next step on ``x`` (B, 1, E) with ``cache``
    and no mask or cross-attention memory (the callers check those): one new token per
    sequence, autograd off, a plain float32 CPU input, a cache with room, no active dropout, no
    hooks, and the tensors the plan was made from still in place."""
    return (
        x.dim() == 3
        and x.shape[1] == 1
        and not torch.is_grad_enabled()
        and cache.window is None
        and cache.k is not None
        and cache.v is not None
        and cache.length < cache.k.shape[2]
        and cache.k.shape[0] == x.shape[0]
        and x.dtype == torch.float32
        and x.is_cpu
        and x.is_contiguous()
        and (plan.dropout_free or not layer.training)
        and _no_hooks(plan)
        and plan.is_current()
    )


def _rope(
    plan: LayerPlan, memo: RotaryMemo, positions: Tensor | None, x: Tensor, cache: LayerKVCache
) -> tuple[Tensor | None, Tensor | None]:
    """The (cos, sin) the step's RoPE takes for ``positions`` (default: after the cache), or
    ``(None, None)`` for a layer without RoPE."""
    if plan.rotary is None:
        return None, None
    if positions is None:
        positions = positions_for(1, cache, x.device)
    check_positions(positions, x, 1)
    return memo.cos_sin(plan.rotary, positions)


def layer_step(
    plan: LayerPlan, memo: RotaryMemo, x: Tensor, positions: Tensor | None, cache: LayerKVCache
) -> Tensor:
    """The C++ step of a layer whose :func:`takes_step` holds: x ``(B, 1, E)`` -> ``(B, 1, E)``;
    the cache gains one position. ``memo``: the model's RoPE cos and sin of this step."""
    cos, sin = _rope(plan, memo, positions, x, cache)
    y = wk.layer_step(
        x, plan.tensors, plan.config, plan.floats, cast(Tensor, cache.k), cast(Tensor, cache.v),
        cache.length, cos, sin,
    )  # fmt: skip
    cache.length += 1
    return y


def takes_step(layer: nn.Module, plan: LayerPlan, x: Tensor, cache: LayerKVCache) -> bool:
    """Whether :func:`layer_step` covers ``layer``'s next step on ``x`` with ``cache`` (the
    caller has checked that no mask applies)."""
    return _takes_step(cast(DecoderLayer, layer), plan, x, cache)


_ACTIVATION_HOOK = operator.attrgetter("activation_hook")
# positions decode_step adds itself (a table row) or that add nothing to the embedding
_PLAIN_POSITIONS = (LearnedPositionalEmbedding, RotaryEmbedding, NoPositionalEncoding)


class _Registrations:
    """How many parameters, buffers and submodules have been assigned anywhere (torch's global
    registration hooks: ``module.weight = ...`` and the like) while at least one
    :func:`watch_registrations` block is open. A stack whose count is unchanged since it last
    looked has had none of its tensors replaced, so its step need not look at each of them."""

    count: ClassVar[int] = 0
    users: ClassVar[int] = 0
    handles: ClassVar[list[Any]] = []

    @classmethod
    def bump(cls, *args: Any) -> None:
        cls.count += 1


@contextmanager
def watch_registrations() -> Iterator[None]:
    """Count registrations (see :class:`_Registrations`) for the duration of the block."""
    if _Registrations.users == 0:
        bump = _Registrations.bump
        _Registrations.handles = [
            torch_module.register_module_parameter_registration_hook(bump),
            torch_module.register_module_buffer_registration_hook(bump),
            torch_module.register_module_module_registration_hook(bump),
        ]
    _Registrations.users += 1
    try:
        yield
    finally:
        _Registrations.users -= 1
        if _Registrations.users == 0:
            for handle in _Registrations.handles:
                handle.remove()
            _Registrations.handles = []
            _Registrations.count += 1  # unwatched from here on: nothing counted is certain


class _StackGuard:
    """What every layer's fused step of a stack depends on besides its input and cache (see
    :func:`_takes_step`), gathered once into flat tuples so that a decoding step checks it all
    in a few C-level passes instead of a Python loop over the layers' tensors and modules; and
    the stack's description for ``stack_step``, made once.

    Why: a token's per-layer checks (hooks of ten modules, some forty tensors still in place)
    took 0.24-0.40 ms of a 7-8 ms int4 GPT-2 step on issue 27's 2-core Xeon (2026-12-06), the
    interpreter's code and data cold after each step's 70 MB of weights. The tensors are
    looked at again only when something was registered somewhere since (:class:`_Registrations`).
    """

    def __init__(
        self, layers: Sequence[nn.Module], plans: Sequence[LayerPlan], final_norm: nn.Module | None
    ) -> None:
        self.layers = tuple(layers)
        self.plans = tuple(plans)
        modules = [
            m for layer, plan in zip(layers, plans, strict=True) for m in (layer, *plan.modules)
        ]
        # the final norm, which only decode_step runs: a hook on it, or another kind of norm,
        # leaves the step to the engine's layer-by-layer path (and the stack to stack_step)
        self.final_norm = final_norm
        self.final_ok = final_norm is None or type(final_norm) in NORM_KINDS
        self.final_hooks: tuple[Any, ...] = ()
        self.hook_dicts = tuple(
            d for m in modules for d in (m._forward_hooks, m._forward_pre_hooks)
        )
        self.hooked = tuple(m for plan in plans for m in plan.hooked)
        watched = [w for plan in plans for w in plan.watched]
        self.train_only = tuple(
            layer for layer, plan in zip(layers, plans, strict=True) if not plan.dropout_free
        )
        self.registrations = _Registrations.count if _Registrations.users else -1
        # one call for the whole stack where its layers share one RoPE module (or have none)
        self.stack: Any = None
        if len({id(plan.rotary) for plan in plans}) == 1:
            self.stack = wk.decode_stack(
                [t for plan in plans for t in plan.tensors],
                [c for plan in plans for c in plan.config],
                [f for plan in plans for f in plan.floats],
            )
            if final_norm is not None and self.final_ok:
                norm = cast("LayerNorm | RMSNorm", final_norm)
                self.stack.set_final_norm(
                    norm.weight, getattr(norm, "bias", None), NORM_KINDS[type(norm)], norm.eps
                )
                self.final_hooks = (norm._forward_hooks, norm._forward_pre_hooks)
                watched += _watch([norm])
        self.stores = tuple(w[0] for w in watched)
        self.names = tuple(w[1] for w in watched)
        self.tensors = tuple(w[2] for w in watched)

    def holds(self) -> bool:
        """The step-independent part of :func:`_takes_step` for every layer at once: autograd
        off, no hooks, no active dropout, every tensor the plans read still in place."""
        if (
            torch.is_grad_enabled()
            or torch_module._global_forward_hooks
            or torch_module._global_forward_pre_hooks
            or any(self.hook_dicts)
            or not all(hook is None for hook in map(_ACTIVATION_HOOK, self.hooked))
            or any(layer.training for layer in self.train_only)
        ):
            return False
        if self.registrations >= 0 and self.registrations == _Registrations.count:
            return True
        if not all(map(operator.is_, map(dict.get, self.stores, self.names), self.tensors)):
            return False
        self.registrations = _Registrations.count if _Registrations.users else -1
        return True


def _cache_takes(cache: LayerKVCache, batch: int) -> bool:
    """The cache part of :func:`_takes_step`: plain (unwindowed), allocated, with room for one
    more position, of the input's batch."""
    k = cache.k
    return (
        cache.window is None
        and k is not None
        and cache.v is not None
        and cache.length < k.shape[2]
        and k.shape[0] == batch
    )


def _buffers(caches: Sequence[LayerKVCache]) -> tuple[list[Tensor], list[Tensor]]:
    """The caches' key and value buffers (allocated: :func:`_cache_takes` checked them)."""
    return [cast(Tensor, c.k) for c in caches], [cast(Tensor, c.v) for c in caches]


class CppStack:
    """A decoder's whole stack, and its whole one-token step, as one C++ call each.

    Made by the engine when every layer of a :class:`~attnlab.models.family.DecoderStack` has a
    :class:`LayerPlan`. :meth:`caches_for` says whether a step is one the stack covers (every
    layer would take its fused step: the same checks as :func:`takes_step`, on a
    :class:`_StackGuard`); :meth:`run` is ``stack_step`` (the layers back to back) and
    :meth:`decode_step` the whole step from token ids to the final norm, when the embedding is a
    plain table lookup (learned, rotary or no positions, no embedding norm, no active dropout, no
    hooks) and the final norm a LayerNorm or RMSNorm (or none).

    Why: a token's Python between two layer calls (the module call, the layer's checks) ran
    about 75 us on issue 27's 2-core Xeon, five times its cost in isolation, because each layer
    streams megabytes of weights through the caches and the interpreter's own code and data
    must come back after it. (Ad-hoc scripts, 2026-12-06, GPT-2 small with int4 weights and
    head: a bare loop of the twelve calls took 5.7 ms where the modules' path took 7.8 ms; the
    embedding and final norm around them took 0.3 ms.)
    """

    def __init__(self, stack: DecoderStack, plans: Sequence[LayerPlan], memo: RotaryMemo) -> None:
        self.stack = stack
        self.memo = memo
        self.guard = _StackGuard(list(stack.layers), plans, stack.final_norm)

    def caches_for(self, cache: KVCache, batch: int) -> list[LayerKVCache] | None:
        """The layers' caches in ``cache`` when every layer takes its fused step for ``batch``
        rows (the caller has checked its input), else ``None``."""
        g = self.guard
        if not g.holds():
            return None
        caches = [c for c, _ in map(cache.layer, range(len(g.layers)))]
        if not all(_cache_takes(c, batch) for c in caches):
            return None
        return caches

    def run(self, x: Tensor, positions: Tensor | None, caches: list[LayerKVCache]) -> Tensor | None:
        """Every layer on ``x`` ``(B, 1, E)`` in one call (``None``: a RoPE stack whose layers'
        caches differ in length, which the one call cannot take)."""
        g = self.guard
        lengths = [c.length for c in caches]
        if g.stack is None or not (g.plans[0].rotary is None or min(lengths) == max(lengths)):
            return None
        cos, sin = _rope(g.plans[0], self.memo, positions, x, caches[0])
        ks, vs = _buffers(caches)
        x = wk.stack_step(x, g.stack, ks, vs, lengths, cos, sin)
        for c in caches:
            c.length += 1
        return x

    def _embedding(self, ids: Tensor) -> tuple[Tensor, float, Tensor | None] | None:
        """(token table, scale, learned position table or None) when the embedding of one new
        token per row is a plain lookup the C++ step makes, else ``None``."""
        s = self.stack
        tok, pos = s.token_embedding, s.positions
        if not (
            tok is not None
            and ids.dim() == 2
            and ids.shape[1] == 1
            and ids.dtype == torch.int64
            and ids.is_cpu
            and type(tok) is TokenEmbedding
            and type(pos) in _PLAIN_POSITIONS
            and pos.activation_hook is None
            and not any(m._forward_hooks or m._forward_pre_hooks for m in s.embed_modules)
            and not any(
                isinstance(m, nn.Dropout) and m.training and m.p > 0 for m in s.embed_modules
            )
        ):
            return None
        table = tok.weight
        if not (table.dtype == torch.float32 and table.is_cpu and table.is_contiguous()):
            return None
        if type(pos) is not LearnedPositionalEmbedding:
            return table, tok.scale, None
        pe = cast(LearnedPositionalEmbedding, pos).weight
        if not (pe.dtype == torch.float32 and pe.is_cpu and pe.is_contiguous()):
            return None
        return table, tok.scale, pe

    def decode_step(self, ids: Tensor, cache: KVCache) -> Tensor | None:
        """The whole step from ids ``(B, 1)`` (positions after the cache, no mask) to the final
        norm's output ``(B, 1, E)`` in one call, or ``None`` when it does not apply."""
        embedding = self._embedding(ids)
        if embedding is None:
            return None
        offset = cache.seq_len
        limit = self.stack.max_positions
        if embedding[2] is not None and limit is not None and offset >= limit:
            return None  # past the learned table: the modules raise their error
        caches = self.caches_for(cache, ids.shape[0])
        g = self.guard
        if caches is None or g.stack is None or not g.final_ok or any(g.final_hooks):
            return None
        lengths = [c.length for c in caches]
        rotary = g.plans[0].rotary
        cos = sin = None
        if rotary is not None:
            if min(lengths) != max(lengths):
                return None
            cos, sin = self.memo.cos_sin(rotary, positions_for(1, caches[0], ids.device))
        table, scale, pe = embedding
        ks, vs = _buffers(caches)
        x = wk.decode_step(ids, table, scale, pe, offset, g.stack, ks, vs, lengths, cos, sin)
        for c in caches:
            c.length += 1
        return x


_REMOVED = {
    "fused_forward": "the fused engine runs a layer's step itself (layer_step, takes_step)",
    "fused_stack": "the fused engine's CppStack runs the stack from outside the model",
    "FusedStack": "the fused engine's CppStack runs the stack from outside the model",
}


def __getattr__(name: str) -> Any:
    """Deprecated: ``active_plan`` (always ``None`` now: no plan is installed on a layer); the
    removed names that patched a live model say what replaced them."""
    if name == "active_plan":
        warnings.warn(
            "attnlab.transforms.decode_layer.active_plan is deprecated: no plan is installed on "
            "a layer any more; the fused engine's steps hold them (FusedDecoder.steps[i].plan)",
            DeprecationWarning,
            stacklevel=2,
        )
        return lambda layer: None
    if name in _REMOVED:
        raise AttributeError(
            f"attnlab.transforms.decode_layer.{name} was removed with the patching of live "
            f"models (issue 48): {_REMOVED[name]}; see attnlab.transforms.decode_engine"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CppStack",
    "LayerPlan",
    "RotaryMemo",
    "layer_plan",
    "layer_step",
    "takes_step",
    "watch_registrations",
]
