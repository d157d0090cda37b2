"""DecodeWeight and the forward using it: copies equal the plain layers, never go stale."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.transforms import decode_weights as linear_module
from attnlab.transforms.decode_weights import DecodeWeight, _copy_forward, reordering_available

Linear = nn.Linear


def _linears(*outs: int, d_in: int = 6, bias: bool = True) -> list[nn.Linear]:
    torch.manual_seed(0)
    return [Linear(d_in, o, bias=bias) for o in outs]


def _use(lin: nn.Linear, copy: DecodeWeight) -> None:
    """What decode_layout does to a linear for one call."""
    lin.__dict__["forward"] = _copy_forward(lin, copy)


@pytest.mark.parametrize("bias", [True, False])
def test_stacked_copy_equals_the_separate_layers(
    bias: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    lins = _linears(4, 2, 2, bias=bias)  # q, k, v of a GQA layer: different widths
    small = DecodeWeight.stack(lins, rows=3)
    assert not small.reordered and small.weight.stride() == (1, 8)  # input-major (6, 8) buffer
    monkeypatch.setattr(linear_module, "ONEDNN_MIN_NUMEL", 0)  # as if the weights were large
    d = DecodeWeight.stack(lins, rows=3)
    assert d.weight.shape == (8, 6) and d.reordered  # oneDNN's layout
    with torch.inference_mode():
        torch.testing.assert_close(small(torch.ones(2, 6)), d(torch.ones(2, 6)))
    for shape in [(3, 1, 6), (2, 5, 6), (7, 6)]:  # any number of rows, not only the hint
        x = torch.randn(*shape)
        expected = torch.cat([lin(x) for lin in lins], dim=-1)
        with torch.inference_mode():
            torch.testing.assert_close(d(x), expected)
    x = torch.randn(2, 5, 6)[:, -1]  # not contiguous (the LM head's last-position slice)
    with torch.inference_mode():
        torch.testing.assert_close(d(x), torch.cat([lin(x) for lin in lins], dim=-1))


def test_linear_uses_a_current_copy_and_ignores_a_stale_one() -> None:
    lin = _linears(9)[0]
    x = torch.randn(2, 6)
    other = DecodeWeight.stack([Linear(6, 9)])  # another layer's numbers...
    object.__setattr__(other, "sources", (lin,))  # ...marked as lin's copy
    object.__setattr__(other, "stamps", other.stamps[:0])
    assert not other.is_current()
    _use(lin, other)
    with torch.no_grad():
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias))
    copy = DecodeWeight.stack([lin])
    _use(lin, copy)
    with torch.no_grad():
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias))
        lin.weight.add_(1.0)  # an optimizer step: the copy is stale now
        assert not copy.is_current()
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias))


def test_a_replaced_parameter_makes_the_copy_stale() -> None:
    lin = _linears(9)[0]
    copy = DecodeWeight.stack([lin])
    _use(lin, copy)
    lin.weight = nn.Parameter(torch.zeros_like(lin.weight))
    assert not copy.is_current()
    assert torch.equal(lin(torch.ones(1, 6)), lin.bias.detach()[None])


def test_stack_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one"):
        DecodeWeight.stack([])
    with pytest.raises(ValueError, match="in_features"):
        DecodeWeight.stack([Linear(3, 2), Linear(4, 2)])
    with pytest.raises(ValueError, match="bias"):
        DecodeWeight.stack([Linear(3, 2), Linear(3, 2, bias=False)])


def test_the_copy_is_used_only_without_autograd() -> None:
    """With autograd on, the parameter is used (the oneDNN product has no gradient)."""
    lin = _linears(7)[0]
    _use(lin, DecodeWeight.stack([lin]))
    calls: list[int] = []
    original = DecodeWeight.__call__
    try:
        DecodeWeight.__call__ = lambda self, x: calls.append(1) or original(self, x)  # type: ignore[method-assign,func-returns-value]
        lin(torch.randn(2, 6)).sum().backward()
        assert lin.weight.grad is not None and not calls
        with torch.no_grad():
            lin(torch.randn(2, 6))
        assert calls == [1]
    finally:
        DecodeWeight.__call__ = original  # type: ignore[method-assign]


def test_stack_refuses_weights_it_cannot_reorder() -> None:
    lin = Linear(4, 3).double()
    assert not reordering_available(lin.weight)
    with pytest.raises(ValueError, match="fp32 CPU weights"):
        DecodeWeight.stack([lin])
