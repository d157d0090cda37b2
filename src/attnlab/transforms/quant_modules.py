"""Quantized stand-ins for ``nn.Linear``: int8 and int4 weights, float activations (inference).

:class:`Int8Linear` and :class:`Int4Linear` hold a linear layer's weight in one of the formats of
:mod:`attnlab.transforms.quant_formats` and compute ``y = x W^T + b`` with a CPU kernel
(``kernel``): attnlab's own for float32 activations (:mod:`attnlab.kernels`),
PyTorch's packed ones for bfloat16 activations (or float32 where attnlab's cannot be built); or
with the readable reference path, ``F.linear(x, dequantize(), b)`` in float32, when the kernel is
missing, does not take the shape, the input is off the CPU, or a gradient with respect to the
input is wanted. They are deliberately *not* ``nn.Linear``
subclasses: code that special-cases ``nn.Linear`` (initialisation, the decode-time weight copies
of :mod:`attnlab.transforms.decode_weights`) leaves them alone.

State dict (what is saved): ``qweight`` (int8 ``(N, K)``, or int4 codes in the canonical nibble
layout ``(N, ceil(K/2))`` uint8), ``scales`` (``(N,)`` or ``(N, G)`` float32), int4 ``zeros``
``(N, G)`` float32, and ``bias`` ``(N,)`` float32 if any. attnlab's kernels read exactly these.
PyTorch's kernels need operands of their own (int4's CPU-specific packing, scales in the
activation dtype): non-persistent buffers, made at construction and again after every
``load_state_dict``.

Shapes: x ``(..., K)`` -> ``(..., N)``.
"""

from __future__ import annotations

from typing import Any, Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import attnlab.kernels as wk
import attnlab.transforms.quant_formats as qf

ActivationDtype = Literal["bfloat16", "float32"]
ACTIVATION_DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float32": torch.float32}
REFERENCE = "reference (dequantize + F.linear)"


def default_activation_dtype() -> ActivationDtype:
    """``"float32"`` where attnlab's own kernels are available (exact and, at decoding sizes,
    faster than PyTorch's bfloat16 path; :mod:`attnlab.kernels`), else
    ``"bfloat16"`` (PyTorch's kernels vectorise only bfloat16 rows)."""
    return "float32" if wk.available() else "bfloat16"


def activation_dtype_name(value: str | torch.dtype | None) -> ActivationDtype:
    """``"bfloat16"``/``"float32"`` from a name or a ``torch.dtype``; ``None``: the default
    (:func:`default_activation_dtype`).

    Raises:
        ValueError: for anything else, naming the valid values.
    """
    if value is None:
        return default_activation_dtype()
    for name, dtype in ACTIVATION_DTYPES.items():
        if value in (name, dtype):
            return name  # type: ignore[return-value]
    raise ValueError(
        f"activation_dtype={value!r} is not valid; choose one of {list(ACTIVATION_DTYPES)}"
    )


class QuantizedLinear(nn.Module):
    """Common part of :class:`Int8Linear` and :class:`Int4Linear` (use those)."""

    bits: int = 0
    qweight: Tensor
    scales: Tensor
    bias: Tensor | None

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool,
        activation_dtype: str | torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.activation_dtype: ActivationDtype = activation_dtype_name(activation_dtype)
        self.kernel = REFERENCE
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)

    # -- to be provided by the formats ----------------------------------------------------
    def dequantize(self) -> Tensor:
        """The float32 weight ``(N, K)`` the codes stand for."""
        raise NotImplementedError

    def dequantize_rows(self, index: Tensor) -> Tensor:
        """Rows ``index`` (``(R,)`` ints) of :meth:`dequantize`, ``(R, K)``, without the rest."""
        raise NotImplementedError

    def _kernel_mm(self, x: Tensor) -> Tensor:
        """``x (M, K)`` contiguous in the activation dtype -> ``(M, N)`` by the kernel."""
        raise NotImplementedError

    def prepare_kernel(self) -> None:
        """(Re)make the kernel operands from the stored codes and scales."""
        raise NotImplementedError

    def kernel_ready(self) -> bool:
        """Whether the kernel operands have been made (see :meth:`prepare_kernel`)."""
        return True

    # -- shared -------------------------------------------------------------------------------
    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self.prepare_kernel()

    def uses_kernel(self, x: Tensor) -> bool:
        """Whether ``forward(x)`` runs the packed kernel (else the reference path)."""
        return (
            self.kernel != REFERENCE
            and self.kernel_ready()
            and x.device.type == "cpu"
            and self.qweight.device.type == "cpu"
            and not (torch.is_grad_enabled() and x.requires_grad)
        )

    def forward(self, x: Tensor) -> Tensor:
        """x ``(..., K)`` float -> ``(..., N)`` of x's dtype.

        Raises:
            ValueError: if the last dimension of ``x`` is not ``in_features``.
        """
        kernel = self.kernel
        if (
            (kernel == wk.KERNEL_INT8 or kernel == wk.KERNEL_INT4)
            and x.dtype == torch.float32
            and x.is_cpu
            and self.qweight.is_cpu
            and x.shape[-1] == self.in_features
            and not (x.requires_grad and torch.is_grad_enabled())
        ):  # the decoding path, kept short: it runs ~70 times per GPT-2 token
            rows = x.reshape(-1, self.in_features)  # (M, K)
            if not rows.is_contiguous():
                rows = rows.contiguous()
            return self._kernel_linear(rows).view(*x.shape[:-1], self.out_features)
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"expected input (..., {self.in_features}), got shape {tuple(x.shape)}"
            )
        if not self.uses_kernel(x):
            return F.linear(x, self.dequantize().to(x.dtype), self._bias_as(x))
        dtype = ACTIVATION_DTYPES[self.activation_dtype]
        rows = x.reshape(-1, self.in_features).to(dtype).contiguous()  # (M, K)
        if self.kernel in (wk.KERNEL_INT8, wk.KERNEL_INT4):
            out = self._kernel_linear(rows).to(x.dtype)  # (M, N), bias added by the kernel
        else:
            out = self._kernel_mm(rows).to(x.dtype)  # (M, N)
            bias = self._bias_as(x)
            if bias is not None:
                out.add_(bias)
        return out.reshape(*x.shape[:-1], self.out_features)  # (..., N)

    def _kernel_linear(self, x: Tensor) -> Tensor:
        """``x (M, K)`` float32 contiguous -> ``(M, N)`` with the bias, by attnlab's kernel."""
        raise NotImplementedError

    def _bias_as(self, x: Tensor) -> Tensor | None:
        return None if self.bias is None else self.bias.to(x.dtype)

    def stored_tensors(self) -> list[Tensor]:
        """The tensors of the state dict (codes, scales, zeros, bias)."""
        skip = self._non_persistent_buffers_set
        return [b for n, b in self._buffers.items() if b is not None and n not in skip]

    def read_tensors(self) -> list[Tensor]:
        """The tensors one call streams on the CPU: the kernel operands and the bias, or the
        stored tensors for the reference path."""
        return self.stored_tensors()

    def kernel_copy_bytes(self) -> int:
        """Bytes of the kernel operands :meth:`prepare_kernel` makes beside the stored tensors
        (computed from the sizes, so it holds on ``meta`` and before the codes arrive)."""
        raise NotImplementedError

    def weight_bytes(self, *, stored: bool = True) -> int:
        """Bytes of :meth:`stored_tensors` (``stored``) or of :meth:`read_tensors`."""
        tensors = self.stored_tensors() if stored else self.read_tensors()
        return sum(t.numel() * t.element_size() for t in tensors)

    def extra_repr(self) -> str:
        group = getattr(self, "group_size", None)
        grouping = f"group_size={group}" if group else "per-channel scales"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, bits={self.bits}, {grouping}, "
            f"activation_dtype={self.activation_dtype}, kernel={self.kernel}"
        )


def _check_linear(linear: nn.Module) -> nn.Linear:
    if not isinstance(linear, nn.Linear):
        raise ValueError(f"expected a torch.nn.Linear to quantize, got {type(linear).__name__}")
    if linear.weight.device.type == "meta":
        raise ValueError("cannot quantize a linear on the meta device (its weights are not set)")
    return linear


class Int8Linear(QuantizedLinear):
    """int8 weight, symmetric per output channel.

    Kernels: float32 activations use attnlab's own (:mod:`attnlab.kernels`,
    exact float32 rows) where it is available, else ``aten._weight_int8pack_mm``'s scalar float32
    path; bfloat16 activations use ``aten._weight_int8pack_mm`` (``in_features`` a multiple of
    16; otherwise the reference path).

    Args:
        in_features: K. out_features: N. bias: whether there is a bias.
        activation_dtype: ``"float32"`` (exact activations) or ``"bfloat16"`` (input rows rounded
            to bfloat16 for PyTorch's vectorised kernel); ``None``: float32 where attnlab's
            kernels are available, else bfloat16.
    """

    bits = 8
    kernel_scales: Tensor

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool,
        activation_dtype: str | torch.dtype | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, activation_dtype=activation_dtype)
        self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.ones(out_features))
        self.register_buffer("kernel_scales", torch.ones(0), persistent=False)
        dtype = ACTIVATION_DTYPES[self.activation_dtype]
        supported = qf.int8_kernel_supports(in_features, dtype)
        self.kernel = "aten._weight_int8pack_mm" if supported else REFERENCE
        if dtype == torch.float32 and wk.int8_supports(in_features):
            self.kernel = wk.KERNEL_INT8
        self.prepare_kernel()

    @classmethod
    def from_linear(
        cls, linear: nn.Module, *, activation_dtype: str | torch.dtype | None = None
    ) -> Int8Linear:
        """Quantize ``linear`` (an ``nn.Linear``; its weight is read, not changed).

        Raises:
            ValueError: if ``linear`` is not an ``nn.Linear`` or is on the meta device.
        """
        lin = _check_linear(linear)
        out = cls(
            lin.in_features,
            lin.out_features,
            bias=lin.bias is not None,
            activation_dtype=activation_dtype,
        )
        q, scale = qf.quantize_int8(lin.weight)
        out.set_codes(q, scale, None if lin.bias is None else lin.bias.detach())
        return out

    def set_codes(self, q: Tensor, scale: Tensor, bias: Tensor | None) -> None:
        """Install codes ``(N, K)`` int8, scales ``(N,)`` and the bias, then the kernel operands."""
        self.qweight = q.to(torch.int8).contiguous()
        self.scales = scale.to(torch.float32).contiguous()
        if bias is not None:
            self.bias = bias.to(torch.float32).clone()
        self.prepare_kernel()

    def prepare_kernel(self) -> None:
        self.kernel_scales = self.scales.to(ACTIVATION_DTYPES[self.activation_dtype])

    def kernel_copy_bytes(self) -> int:
        """The scales in the activation dtype ``(N,)`` (float32: the stored ones, no copy)."""
        if self.activation_dtype == "float32":
            return 0
        return self.out_features * ACTIVATION_DTYPES[self.activation_dtype].itemsize

    def dequantize(self) -> Tensor:
        return qf.dequantize_int8(self.qweight, self.scales)

    def dequantize_rows(self, index: Tensor) -> Tensor:
        return qf.dequantize_int8(self.qweight[index], self.scales[index])

    def _kernel_mm(self, x: Tensor) -> Tensor:
        return qf.int8_kernel_mm(x, self.qweight, self.kernel_scales)

    def _kernel_linear(self, x: Tensor) -> Tensor:
        return torch.ops.attnlab_woq.int8_linear(x, self.qweight, self.scales, self.bias, 0)

    def read_tensors(self) -> list[Tensor]:
        if self.kernel == REFERENCE:
            return self.stored_tensors()
        bias = [] if self.bias is None else [self.bias]
        scales = self.scales if self.kernel == wk.KERNEL_INT8 else self.kernel_scales
        return [self.qweight, scales, *bias]


class Int4Linear(QuantizedLinear):
    """int4 weight, asymmetric per group of ``group_size`` inputs.

    Kernels: float32 activations use attnlab's own (:mod:`attnlab.kernels`; group
    sizes that are multiples of 16; it reads the stored nibbles, no second copy) where it is
    available; otherwise, and for bfloat16 activations, ``aten._weight_int4pack_mm_for_cpu`` for
    group sizes 32, 64, 128 and 256 (a private packed copy of the codes); others: the reference.

    Args:
        in_features: K. out_features: N. bias: whether there is a bias.
        group_size: inputs per scale/zero; must divide K.
        activation_dtype: as :class:`Int8Linear`.

    Raises:
        ValueError: if ``group_size`` does not divide ``in_features``.
    """

    bits = 4
    zeros: Tensor
    packed: Tensor
    kernel_scale_and_zero: Tensor

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool,
        group_size: int = 128,
        activation_dtype: str | torch.dtype | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, activation_dtype=activation_dtype)
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size={group_size!r} must be a positive integer")
        if in_features % group_size:
            raise ValueError(f"group_size={group_size} does not divide in_features={in_features}")
        self.group_size = group_size
        G, half = in_features // group_size, (in_features + 1) // 2
        self.register_buffer("qweight", torch.full((out_features, half), 0x88, dtype=torch.uint8))
        self.register_buffer("scales", torch.ones(out_features, G))
        self.register_buffer("zeros", torch.zeros(out_features, G))
        self.register_buffer("packed", torch.zeros(0, dtype=torch.uint8), persistent=False)
        self.register_buffer("kernel_scale_and_zero", torch.zeros(0), persistent=False)
        supported = qf.int4_kernel_supports(group_size, in_features)
        self.kernel = "aten._weight_int4pack_mm_for_cpu" if supported else REFERENCE
        dtype = ACTIVATION_DTYPES[self.activation_dtype]
        if dtype == torch.float32 and wk.int4_supports(group_size, in_features):
            self.kernel = wk.KERNEL_INT4
        # packed when codes arrive (set_codes, load_state_dict): until then the reference path

    @classmethod
    def from_linear(
        cls,
        linear: nn.Module,
        *,
        group_size: int = 128,
        activation_dtype: str | torch.dtype | None = None,
    ) -> Int4Linear:
        """Quantize ``linear`` (an ``nn.Linear``; its weight is read, not changed).

        Raises:
            ValueError: if ``linear`` is not an ``nn.Linear``, is on the meta device, or
                ``group_size`` does not divide its ``in_features``.
        """
        lin = _check_linear(linear)
        out = cls(
            lin.in_features,
            lin.out_features,
            bias=lin.bias is not None,
            group_size=group_size,
            activation_dtype=activation_dtype,
        )
        q, scale, zero = qf.quantize_int4(lin.weight, group_size)
        out.set_codes(q, scale, zero, None if lin.bias is None else lin.bias.detach())
        return out

    def set_codes(self, q: Tensor, scale: Tensor, zero: Tensor, bias: Tensor | None) -> None:
        """Install codes ``(N, K)`` in [0, 15], scales and zeros ``(N, G)`` and the bias."""
        self.qweight = qf.pack_nibbles(q).contiguous()
        self.scales = scale.to(torch.float32).contiguous()
        self.zeros = zero.to(torch.float32).contiguous()
        if bias is not None:
            self.bias = bias.to(torch.float32).clone()
        self.prepare_kernel(q)

    def kernel_ready(self) -> bool:
        return self.kernel == wk.KERNEL_INT4 or self.packed.numel() > 0

    def kernel_copy_bytes(self) -> int:
        """The packed codes ``(N_pad, K/2)`` uint8 and ``scale_and_zero`` ``(G, N_pad, 2)`` in
        the activation dtype (none for the reference path)."""
        if self.kernel in (REFERENCE, wk.KERNEL_INT4):
            return 0
        n_pad, groups = qf.padded_rows(self.out_features), self.in_features // self.group_size
        itemsize = ACTIVATION_DTYPES[self.activation_dtype].itemsize
        return n_pad * self.in_features // 2 + groups * n_pad * 2 * itemsize

    def codes(self) -> Tensor:
        """The int4 codes ``(N, K)`` uint8 in [0, 15]."""
        return qf.unpack_nibbles(self.qweight, self.in_features)

    def prepare_kernel(self, codes: Tensor | None = None) -> None:
        """(Re)make the kernel operands (``codes``: :meth:`codes`, when the caller has them)."""
        if self.kernel in (REFERENCE, wk.KERNEL_INT4) or self.qweight.device.type != "cpu":
            return
        dtype = ACTIVATION_DTYPES[self.activation_dtype]
        self.packed, self.kernel_scale_and_zero = qf.int4_kernel_pack(
            self.codes() if codes is None else codes, self.scales, self.zeros, dtype
        )

    def dequantize(self) -> Tensor:
        return qf.dequantize_int4(self.codes(), self.scales, self.zeros)

    def dequantize_rows(self, index: Tensor) -> Tensor:
        codes = qf.unpack_nibbles(self.qweight[index], self.in_features)  # (R, K)
        return qf.dequantize_int4(codes, self.scales[index], self.zeros[index])

    def _kernel_mm(self, x: Tensor) -> Tensor:
        return qf.int4_kernel_mm(
            x, self.packed, self.group_size, self.kernel_scale_and_zero, self.out_features
        )

    def _kernel_linear(self, x: Tensor) -> Tensor:
        return wk.int4_linear(x, self.qweight, self.scales, self.zeros, self.group_size, self.bias)

    def read_tensors(self) -> list[Tensor]:
        if self.kernel in (REFERENCE, wk.KERNEL_INT4):
            return self.stored_tensors()
        bias = [] if self.bias is None else [self.bias]
        return [self.packed, self.kernel_scale_and_zero, *bias]


def _stack_key(layer: QuantizedLinear) -> tuple[object, ...]:
    return (
        type(layer),
        layer.in_features,
        layer.activation_dtype,
        layer.kernel,
        getattr(layer, "group_size", None),
        layer.bias is None,
        layer.qweight.device,
    )


def stackable(layers: list[QuantizedLinear]) -> bool:
    """Whether :func:`stack_quantized` can join ``layers``: one format (same class, group size,
    activation dtype), same ``in_features``, all with a bias or none, on the CPU, and run by
    attnlab's own kernel (which reads the stored codes, so joining them is a plain concatenation).
    """
    if not layers or not all(isinstance(layer, QuantizedLinear) for layer in layers):
        return False
    first = layers[0]
    return (
        first.kernel in (wk.KERNEL_INT8, wk.KERNEL_INT4)
        and first.qweight.device.type == "cpu"
        and all(_stack_key(layer) == _stack_key(first) for layer in layers)
    )


def stack_quantized(layers: list[QuantizedLinear]) -> QuantizedLinear:
    """One quantized layer computing ``layers`` side by side: outputs ``(..., sum N)`` in order.

    The codes, scales (and int4 zeros) and biases are concatenated along the outputs (a copy of
    ``layers``' bytes); every output row is computed exactly as by its own layer (the kernels work
    row by row), so splitting the result gives each layer's output bit for bit. Used to project a
    decoder's q/k/v in one call (the fused decode engine, :mod:`attnlab.transforms.decode_engine`).

    Raises:
        ValueError: if :func:`stackable` is false for ``layers``.
    """
    if not stackable(layers):
        raise ValueError(
            "stack_quantized needs quantized layers of one format (class, group size, activation "
            "dtype, bias or not) and in_features, run by attnlab's CPU kernel; got "
            + ", ".join(f"{type(layer).__name__}({layer.extra_repr()})" for layer in layers)
        )
    first = layers[0]
    n = sum(layer.out_features for layer in layers)
    has_bias = first.bias is not None
    out: QuantizedLinear
    with torch.no_grad():
        if isinstance(first, Int4Linear):
            int4 = Int4Linear(
                first.in_features,
                n,
                bias=has_bias,
                group_size=first.group_size,
                activation_dtype=first.activation_dtype,
            )
            int4.zeros = torch.cat([cast(Int4Linear, layer).zeros for layer in layers])
            out = int4
        else:
            out = Int8Linear(
                first.in_features, n, bias=has_bias, activation_dtype=first.activation_dtype
            )
        out.qweight = torch.cat([layer.qweight for layer in layers])
        out.scales = torch.cat([layer.scales for layer in layers])
        if has_bias:
            out.bias = torch.cat([layer.bias for layer in layers if layer.bias is not None])
        out.prepare_kernel()
    return out


__all__ = [
    "ACTIVATION_DTYPES",
    "REFERENCE",
    "Int4Linear",
    "Int8Linear",
    "QuantizedLinear",
    "activation_dtype_name",
    "default_activation_dtype",
    "stack_quantized",
    "stackable",
]
