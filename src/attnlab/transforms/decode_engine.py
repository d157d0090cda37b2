"""The fused CPU decode engine: a causal LM's decoding steps, run from outside the model.

:class:`FusedDecoder` stands in for a model's ``hidden_states`` and ``lm_head`` while it decodes
(``attnlab.generation`` picks it: ``GenerationConfig(engine="fused"|"auto")``). It reads the
parts the model's family declares (:class:`~attnlab.models.family.DecoderStack`: the embedding,
the decoder layers, the final norm, the head) and runs them itself, so it never replaces a method
on the live model, never changes a module, and keeps nothing after :meth:`FusedDecoder.close`
(the generation call, or the ``with`` block of a session the caller holds, closes it):

- float32 weights on the CPU: the projections that run once per token get decode-time copies
  (:mod:`attnlab.transforms.decode_weights`: oneDNN-reordered or input-major, where they pay for
  the number of rows decoded), q/k/v stacked into one product; the engine owns the copies;
- int8/int4 weights on attnlab's kernels: a self-attention's q/k/v joined into one quantized
  product (:class:`~attnlab.transforms.decode_weights.QuantizedStack`), one query's attention
  on attnlab's decode-attention kernel, and where every part of a layer is covered, the layer's
  one-token step in one C++ call (:mod:`attnlab.transforms.decode_layer`); where every layer is,
  the whole stack, or the whole step from token ids to the final norm, in one call.

What a step computes is the modules' computation, in their order: :meth:`_LayerStep.python_step`
follows :class:`~attnlab.layers.blocks.DecoderLayer` and
:class:`~attnlab.layers.multihead.MultiHeadAttention` (pre- or post-norm, QK-norm, RoPE, GQA,
any attention backend, a plain or gated FFN; another FFN module runs as it is), the C++ step
does too (it has no QK-norm: a layer with it takes the Python step). A stack whose declaration
says it is ``eager_only`` (value embeddings, an x0 skip) is refused (:func:`supports`).
So the tokens are the modules' (greedy, bit for bit with the same projections; the copies' kernels
round differently, within 1e-5 of the logits). A step the engine does not cover runs the layer's
own module: a layer with hooks (forward hooks, attnlab's hook sites), active dropout, an
instance-level ``forward`` (activation checkpointing), cross-attention, a sliding-window cache, a
copy whose source weights changed since it was made, autograd on; and once a module it reads
has been replaced in the model (a layer or projection swapped, ``quantize`` in place), the engine
closes and the model's own ``hidden_states`` and ``lm_head`` run from then on. A change to what a
decoder layer computes must be made here and in ``decode_layer.cpp`` too
(``docs/architecture.md``); the engine tests (tests/transforms/test_decode_engine.py) fail until
it is.

Shapes: B rows, T new tokens, S keys, E d_model, H heads, H_kv kv heads, D head dim, V vocab.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.nn.modules import module as torch_module

import attnlab.kernels as wk
from attnlab.layers.attention_backends import sdpa_attention
from attnlab.layers.blocks import DecoderLayer
from attnlab.layers.feedforward import FeedForward
from attnlab.layers.kv_cache import KVCache, LayerKVCache
from attnlab.layers.masks import as_attention_mask, combine_masks
from attnlab.layers.multihead import MultiHeadAttention
from attnlab.models.family import DecoderStack, decoder_stack
from attnlab.transforms.decode_layer import (
    CppStack,
    LayerPlan,
    RotaryMemo,
    _Registrations,
    layer_plan,
    layer_step,
    takes_step,
    watch_registrations,
)
from attnlab.transforms.decode_weights import (
    DecodeWeight,
    QuantizedStack,
    copy_pays,
    reordering_available,
)
from attnlab.transforms.quant_modules import QuantizedLinear, stackable

Projection = DecodeWeight | QuantizedStack


def _copy(linears: Sequence[nn.Module], rows: int, stacked: bool) -> DecodeWeight | None:
    """A float32 decode copy of ``linears`` when they are plain fp32 CPU linears and it pays."""
    plain = [m for m in linears if type(m) is nn.Linear]
    if len(plain) != len(linears) or not all(reordering_available(m.weight) for m in plain):
        return None
    if not copy_pays(plain, rows, stacked):
        return None
    return DecodeWeight.stack(plain, rows)


def _apply(module: nn.Module, copy: DecodeWeight | None, x: Tensor) -> Tensor:
    """``module(x)``, through its copy while the copy is current."""
    if copy is not None and copy.is_current():
        return copy(x)
    return cast(Tensor, module(x))


class _LayerStep:
    """One decoder layer's step, run by the engine (see the module doc)."""

    def __init__(self, layer: nn.Module, rows: int, memo: RotaryMemo) -> None:
        self.layer = layer
        self.memo = memo
        self.covered = (
            isinstance(layer, DecoderLayer)
            and layer.cross_attn is None
            and isinstance(layer.self_attn, MultiHeadAttention)
            and layer.self_attn.value_lambdas is None  # value embeddings: the model's forward
        )
        self.qkv: Projection | None = None
        self.out: DecodeWeight | None = None
        self.ffn: dict[str, DecodeWeight | None] = {}
        self.plan: LayerPlan | None = None
        self.kernel_attention = False
        if not self.covered:
            return
        d = cast(DecoderLayer, layer)
        mha = cast(MultiHeadAttention, d.self_attn)
        qkv: list[nn.Module] = [mha.q_proj, mha.k_proj, mha.v_proj]
        quantized = [p for p in qkv if isinstance(p, QuantizedLinear)]
        if len(quantized) == 3 and stackable(quantized):
            self.qkv = QuantizedStack.stack(quantized)
            self.kernel_attention = mha.backend is sdpa_attention and wk.available()
            self.plan = layer_plan(layer, self.qkv) if self.kernel_attention else None
        else:
            self.qkv = _copy(qkv, rows, stacked=True)
        self.out = _copy([mha.out_proj], rows, stacked=False)
        if isinstance(d.ffn, FeedForward):
            for name in ("up_proj", "gate_proj", "down_proj"):
                proj = getattr(d.ffn, name)
                self.ffn[name] = None if proj is None else _copy([proj], rows, stacked=False)
        self.modules = tuple(layer.modules())
        self.hook_dicts = tuple(
            d for m in self.modules for d in (m._forward_hooks, m._forward_pre_hooks)
        )
        self.sited = tuple(m for m in self.modules if hasattr(m, "activation_hook"))
        self.dropouts = tuple(m for m in self.modules if isinstance(m, nn.Dropout))

    def copies(self) -> list[Projection]:
        """The copies this step owns."""
        found = [self.qkv, self.out, *self.ffn.values()]
        return [c for c in found if c is not None]

    def plain(self) -> bool:
        """Whether the engine may run this layer's step itself: covered, no hooks anywhere on
        it (nor global ones), no instance-level ``forward``, no active dropout, autograd off."""
        if not self.covered or torch.is_grad_enabled():
            return False
        if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
            return False
        if any(self.hook_dicts) or any(m.activation_hook is not None for m in self.sited):
            return False
        if any("forward" in m.__dict__ for m in self.modules):
            return False
        mha = cast(MultiHeadAttention, cast(DecoderLayer, self.layer).self_attn)
        if mha.training and mha.dropout > 0:
            return False
        return not any(m.training and m.p > 0 for m in self.dropouts)

    def __call__(
        self, x: Tensor, mask: Tensor | None, positions: Tensor, cache: LayerKVCache
    ) -> Tensor:
        """The layer on ``x`` ``(B, T, E)`` -> ``(B, T, E)``, extending ``cache``."""
        if not self.plain() or cache.window is not None:
            return cast(
                Tensor,
                self.layer(x, mask=mask, is_causal=True, positions=positions, cache=cache),
            )
        plan = self.plan
        if plan is not None and mask is None and takes_step(self.layer, plan, x, cache):
            return layer_step(plan, self.memo, x, positions, cache)
        return self.python_step(x, mask, positions, cache)

    def python_step(
        self, x: Tensor, mask: Tensor | None, positions: Tensor, cache: LayerKVCache
    ) -> Tensor:
        """:meth:`DecoderLayer.forward` (self-attention only, no hooks, dropout off), on the
        engine's projections: x ``(B, T, E)`` -> ``(B, T, E)``."""
        layer = cast(DecoderLayer, self.layer)
        mha = cast(MultiHeadAttention, layer.self_attn)
        B, T, _ = x.shape
        H, H_kv, D = mha.n_heads, mha.n_kv_heads, mha.d_head
        h = layer.self_attn_norm(x) if layer.pre_norm else x
        qkv = self.qkv
        if qkv is not None and qkv.is_current():
            q, k, v = qkv(h).split((H * D, H_kv * D, H_kv * D), dim=-1)
        else:
            q, k, v = mha.q_proj(h), mha.k_proj(h), mha.v_proj(h)
        q = mha.norm_q(q.view(B, T, H, D).transpose(1, 2))  # (B, H, T, D), QK-norm if any
        k = mha.norm_k(k.view(B, T, H_kv, D).transpose(1, 2))  # (B, H_kv, T, D)
        v = v.view(B, T, H_kv, D).transpose(1, 2)  # (B, H_kv, T, D)
        if mha.rotary is not None:
            q = mha.rotary.rotate(q, positions)
            k = mha.rotary.rotate(k, positions)
        k, v = cache.update(k, v)  # (B, H_kv, S, D)
        if self.kernel_attention and mask is None and T == 1 and _kernel_operands(q, k, v):
            a = wk.decode_attention(q, k, v)  # (B, H, 1, D)
        else:
            a = mha.backend(q, k, v, mask=mask, is_causal=True, dropout_p=0.0)  # (B, H, T, D)
        a = a.transpose(1, 2).reshape(B, T, H * D)  # (B, T, H·D)
        x = x + _apply(mha.out_proj, self.out, a)
        if not layer.pre_norm:
            x = layer.self_attn_norm(x)
        f = self.feed_forward(layer.ffn_norm(x) if layer.pre_norm else x)
        x = x + f
        return x if layer.pre_norm else cast(Tensor, layer.ffn_norm(x))

    def feed_forward(self, x: Tensor) -> Tensor:
        """:meth:`FeedForward.forward` on the engine's copies (another FFN: its module)."""
        ffn = cast(DecoderLayer, self.layer).ffn
        if not isinstance(ffn, FeedForward):
            return cast(Tensor, ffn(x))
        if ffn.gate_proj is not None:
            g = ffn.act(_apply(ffn.gate_proj, self.ffn["gate_proj"], x))  # (B, T, F)
            hidden = g * _apply(ffn.up_proj, self.ffn["up_proj"], x)  # (B, T, F)
        else:
            hidden = ffn.act(_apply(ffn.up_proj, self.ffn["up_proj"], x))  # (B, T, F)
        return _apply(ffn.down_proj, self.ffn["down_proj"], hidden)


def _kernel_operands(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether attnlab's decode-attention kernel takes these operands (float32 on the CPU,
    unit stride in the last dimension)."""
    return (
        q.dtype == k.dtype == v.dtype == torch.float32
        and q.device.type == k.device.type == v.device.type == "cpu"
        and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
    )


class FusedDecoder:
    """The fused engine for one causal LM: ``hidden_states`` and ``lm_head`` as the model's,
    on decode-time copies and C++ steps (see the module doc). Use it as a context manager (or
    call :meth:`close`): the copies live until then.

    Args:
        model: a model whose family declares a :class:`~attnlab.models.family.DecoderStack`.
        rows: how many rows are decoded together (decides which copies pay).

    Raises:
        ValueError: for a model without a decoder stack.
    """

    def __init__(self, model: Any, rows: int) -> None:
        stack = decoder_stack(model)
        if stack is None:
            raise ValueError(
                f"the fused engine runs decoder stacks; {type(model).__name__} declares none"
            )
        if stack.eager_only is not None:
            raise ValueError(f"the fused engine cannot run this model: {stack.eager_only}")
        self.model = model
        self.stack: DecoderStack = stack
        self.memo = RotaryMemo()
        self.steps = [_LayerStep(layer, rows, self.memo) for layer in stack.layers]
        self.head = _copy([stack.head], rows, stacked=False)
        plans = [s.plan for s in self.steps]
        self.cpp: CppStack | None = None
        if plans and all(p is not None for p in plans):
            self.cpp = CppStack(stack, cast("list[LayerPlan]", plans), self.memo)
        self._watch = watch_registrations()
        self._watch.__enter__()
        self.closed = False
        # the modules it was made from, and the registrations counted when they last matched
        self._parts = self._model_parts()
        self._registrations = _Registrations.count

    # -- what the session calls -------------------------------------------------------------

    def hidden_states(
        self,
        ids: Tensor,
        *,
        mask: Tensor | None = None,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """As the model's ``hidden_states`` (the final norm's output ``(B, T, E)``): on the
        engine where it covers the call (a cache without sliding windows, autograd off), else
        the model's own."""
        out = None
        if (
            not self.closed
            and self._current()
            and cache is not None
            and not torch.is_grad_enabled()
        ):
            out = self._run(ids, mask, positions, cache)
        if out is None:
            out = self.model.hidden_states(ids, mask=mask, positions=positions, cache=cache)
        return cast(Tensor, out)

    def lm_head(self, h: Tensor) -> Tensor:
        """The model's head on ``h`` ``(B, ..., E)`` -> ``(B, ..., V)`` (on its copy while that
        is current and the head has no hooks, nor are global ones registered)."""
        if self.closed or not self._current() or torch.is_grad_enabled():
            return cast(Tensor, self.model.lm_head(h))
        head = self.stack.head
        plain = not (
            head._forward_hooks
            or head._forward_pre_hooks
            or "forward" in head.__dict__
            or torch_module._global_forward_hooks
            or torch_module._global_forward_pre_hooks
        )
        return _apply(head, self.head, h) if plain else cast(Tensor, head(h))

    def _model_parts(self) -> tuple[nn.Module | None, ...]:
        """Every module of the model that the engine reads, in order."""
        s = decoder_stack(self.model)
        if s is None:
            return ()
        layers = tuple(m for layer in s.layers for m in layer.modules())
        return (s.token_embedding, s.positions, *s.embed_modules, *layers, s.final_norm, s.head)

    def _current(self) -> bool:
        """Whether the model still holds the modules the engine was made from. A module
        replaced in it (``model.lm_head = ...``, a layer or projection swapped) closes the
        engine: its steps, plans and copies read the old modules, so the model's own
        ``hidden_states`` and ``lm_head`` run from then on. Looked at again only after something
        was registered somewhere (:func:`~attnlab.transforms.decode_layer.watch_registrations`)."""
        if _Registrations.count == self._registrations:
            return True
        if self._model_parts() != self._parts:
            self.close()
            return False
        self._registrations = _Registrations.count
        return True

    def _run(
        self, ids: Tensor, mask: Tensor | None, positions: Tensor | None, cache: KVCache
    ) -> Tensor | None:
        """The engine's ``hidden_states``, or ``None`` where the model's own must run (a call
        it does not cover, or one whose errors the model's own code raises)."""
        s = self.stack
        if ids.dim() != 2 or len(self.steps) != len(cache.self_attn):
            return None
        B, T = ids.shape
        caches = [c for c, _ in map(cache.layer, range(len(self.steps)))]
        if any(c.window is not None for c in caches):
            return None
        offset = cache.seq_len
        if s.max_positions is not None and offset + T > s.max_positions:
            return None
        if mask is not None and mask.shape != (B, offset + T):
            return None
        if self.cpp is not None and mask is None and positions is None and T == 1:
            y = self.cpp.decode_step(ids, cache)
            if y is not None:
                return y
        index = torch.arange(offset, offset + T, device=ids.device)  # (T,)
        pos = index if positions is None else positions  # (T,) | (B, T)
        x = s.embed(ids, pos)  # (B, T, E)
        k_index = torch.arange(offset + T, device=ids.device)  # (S,)
        attn_mask = combine_masks(
            as_attention_mask(mask) if mask is not None else None,
            s.positions.score_bias(index, k_index),  # (H, T, S) or None
        )
        done = False
        if self.cpp is not None and attn_mask is None and T == 1 and _plain_input(x):
            stack_caches = self.cpp.caches_for(cache, B)
            if stack_caches is not None:
                y = self.cpp.run(x, positions, stack_caches)
                if y is not None:
                    x, done = y, True
        if not done:
            for step, layer_cache in zip(self.steps, caches, strict=True):
                x = step(x, attn_mask, pos, layer_cache)
        return cast(Tensor, s.final_norm(x)) if s.final_norm is not None else x

    # -- ownership ----------------------------------------------------------------------------

    def copies(self) -> list[Projection]:
        """Every copy the engine holds."""
        found: list[Projection] = [c for step in self.steps for c in step.copies()]
        return found + ([self.head] if self.head is not None else [])

    def copy_bytes(self) -> int:
        """Bytes of the float32 copies it holds (the joined quantized q/k/v not included)."""
        total = 0
        for c in self.copies():
            if isinstance(c, DecodeWeight):
                total += c.weight.numel() * c.weight.element_size()  # oneDNN's too
                if c.bias is not None:
                    total += c.bias.numel() * c.bias.element_size()
        return total

    def close(self) -> None:
        """Free every copy and the C++ stack (the model is untouched), and give the memory
        back to the operating system (:func:`give_back_memory`); idempotent."""
        if self.closed:
            return
        self.closed = True
        held = self.copy_bytes()
        for step in self.steps:
            step.qkv = step.out = step.plan = None
            step.ffn = {}
        self.head = None
        self.cpp = None
        self._watch.__exit__(None, None, None)
        if held >= GIVE_BACK_BYTES:
            give_back_memory()

    def __enter__(self) -> FusedDecoder:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            self.close()


GIVE_BACK_BYTES = 16 << 20  # copies this large are worth handing back to the OS at close


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or ``None`` (another C library, another system)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


def give_back_memory() -> bool:
    """Return the C heap's free memory to the operating system (glibc's ``malloc_trim``).

    Why: freeing the copies returns their memory to the C allocator, which keeps most of it
    for later allocations; the process's resident memory then stays as high as while decoding
    (measured on gpt2-medium, float32: +0.37 GB resident after a call whose 1.4 GB of copies
    were all freed; +0.01 GB once trimmed). Trimming makes a call leave memory as it found it.

    Returns:
        Whether it could ask (glibc on Linux).
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def _plain_input(x: Tensor) -> bool:
    """A float32 contiguous CPU input of one token per row (what the C++ stack takes)."""
    return (
        x.dim() == 3
        and x.shape[1] == 1
        and x.dtype == torch.float32
        and x.is_cpu
        and x.is_contiguous()
    )


def supports(model: nn.Module) -> str | None:
    """``None`` when the fused engine can run ``model``, else why not (for messages)."""
    stack = decoder_stack(model)
    if stack is None:
        return f"{type(model).__name__} declares no decoder stack (the engine runs causal LMs)"
    if stack.eager_only is not None:
        return stack.eager_only
    params = [p for layer in stack.layers for p in layer.parameters()]
    if any(p.device.type != "cpu" for p in params):
        return "the model is not on the CPU"
    return None


def gains(model: nn.Module, rows: int) -> bool:
    """Whether the fused engine would do anything for ``model`` decoding ``rows`` rows: a copy
    that pays, a joined quantized q/k/v, or attnlab's kernels."""
    if supports(model) is not None:
        return False
    stack = cast(DecoderStack, decoder_stack(model))
    for layer in stack.layers:
        if not isinstance(layer, DecoderLayer) or layer.cross_attn is not None:
            continue
        mha = layer.self_attn
        qkv: list[nn.Module] = [mha.q_proj, mha.k_proj, mha.v_proj]
        if all(isinstance(p, QuantizedLinear) for p in qkv):
            return True
        candidates: list[list[nn.Module]] = [qkv, *([m] for m in layer.modules() if m not in qkv)]
        if any(_copy_would_pay(group, rows) for group in candidates):
            return True
    return _copy_would_pay([stack.head], rows)


def _copy_would_pay(linears: Sequence[nn.Module], rows: int) -> bool:
    """Whether :func:`_copy` would make a copy of ``linears`` (without making it)."""
    plain = [m for m in linears if type(m) is nn.Linear]
    if not plain or len(plain) != len(linears):
        return False
    if not all(reordering_available(m.weight) for m in plain):
        return False
    return copy_pays(plain, rows, stacked=len(plain) == 3)


__all__ = ["GIVE_BACK_BYTES", "FusedDecoder", "gains", "give_back_memory", "supports"]
