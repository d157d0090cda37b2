"""Linear and DecodeWeight: the input-major copies equal the plain layers and never go stale."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.layers.linear import DecodeWeight, Linear, blocked_linear


def _linears(*outs: int, d_in: int = 6, bias: bool = True) -> list[Linear]:
    torch.manual_seed(0)
    return [Linear(d_in, o, bias=bias) for o in outs]


def test_linear_is_nn_linear_with_the_same_state_dict() -> None:
    lin = _linears(5)[0]
    assert isinstance(lin, nn.Linear)
    assert list(lin.state_dict()) == ["weight", "bias"]
    x = torch.randn(2, 3, 6)
    torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias))


@pytest.mark.parametrize("bias", [True, False])
def test_stacked_copy_equals_the_separate_layers(bias: bool) -> None:
    lins = _linears(4, 2, 2, bias=bias)  # q, k, v of a GQA layer: different widths
    d = DecodeWeight.stack(lins)
    assert d.weight.shape == (8, 6) and d.weight.stride() == (1, 8)  # input-major (6, 8) buffer
    x = torch.randn(3, 1, 6)
    expected = torch.cat([lin(x) for lin in lins], dim=-1)
    torch.testing.assert_close(F.linear(x, d.weight, d.bias), expected)
    assert all(lin.weight.data_ptr() != d.weight.data_ptr() for lin in lins)  # a copy


def test_linear_uses_a_current_copy_and_ignores_a_stale_one() -> None:
    lin = _linears(9)[0]
    x = torch.randn(2, 6)
    lin.decode_weight = DecodeWeight.stack([lin])
    with torch.no_grad():
        lin.decode_weight.weight.mul_(2.0)  # mark the copy: used while current
    torch.testing.assert_close(lin(x), F.linear(x, 2 * lin.weight, lin.bias))
    with torch.no_grad():
        lin.weight.add_(1.0)  # an optimizer step: the copy is stale now
    assert not lin.decode_weight.is_current()
    torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias))


def test_a_replaced_parameter_makes_the_copy_stale() -> None:
    lin = _linears(9)[0]
    lin.decode_weight = DecodeWeight.stack([lin])
    lin.weight = nn.Parameter(torch.zeros_like(lin.weight))
    assert not lin.decode_weight.is_current()
    assert torch.equal(lin(torch.ones(1, 6)), lin.bias.detach()[None])


def test_stack_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one"):
        DecodeWeight.stack([])
    with pytest.raises(ValueError, match="in_features"):
        DecodeWeight.stack([Linear(3, 2), Linear(4, 2)])
    with pytest.raises(ValueError, match="bias"):
        DecodeWeight.stack([Linear(3, 2), Linear(3, 2, bias=False)])


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("block", [1, 4, 7, 100])
def test_blocked_linear_equals_linear(bias: bool, block: int) -> None:
    lin = _linears(7, bias=bias)[0]  # 7 outputs: blocks of 4 leave a remainder
    x = torch.randn(2, 3, 6)
    with torch.no_grad():
        got = blocked_linear(x, lin.weight, lin.bias, block)
        torch.testing.assert_close(got, F.linear(x, lin.weight, lin.bias))
        lin.decode_block_rows = block
        torch.testing.assert_close(lin(x), got)
    with pytest.raises(ValueError, match="block_rows"):
        blocked_linear(x, lin.weight, lin.bias, 0)


def test_blocked_linear_keeps_autograd() -> None:
    """With autograd on, the blocked product (not differentiable) is not used."""
    lin = _linears(7)[0]
    lin.decode_block_rows = 2
    lin(torch.randn(2, 6)).sum().backward()
    assert lin.weight.grad is not None
