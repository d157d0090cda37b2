"""DecodeWeight and the fused engine's use of it: copies equal the plain layers, never go stale."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab import GPT, GPTConfig
from attnlab.transforms import decode_weights as linear_module
from attnlab.transforms.decode_engine import FusedDecoder, _apply
from attnlab.transforms.decode_weights import DecodeWeight, reordering_available

Linear = nn.Linear


def _linears(*outs: int, d_in: int = 6, bias: bool = True) -> list[nn.Linear]:
    torch.manual_seed(0)
    return [Linear(d_in, o, bias=bias) for o in outs]


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
    with torch.no_grad():  # the engine's projection: the layer itself, not the stale copy
        torch.testing.assert_close(_apply(lin, other, x), F.linear(x, lin.weight, lin.bias))
    copy = DecodeWeight.stack([lin])
    with torch.no_grad():
        torch.testing.assert_close(_apply(lin, copy, x), F.linear(x, lin.weight, lin.bias))
        lin.weight.add_(1.0)  # an optimizer step: the copy is stale now
        assert not copy.is_current()
        torch.testing.assert_close(_apply(lin, copy, x), F.linear(x, lin.weight, lin.bias))


def test_a_replaced_parameter_makes_the_copy_stale() -> None:
    lin = _linears(9)[0]
    copy = DecodeWeight.stack([lin])
    lin.weight = nn.Parameter(torch.zeros_like(lin.weight))
    assert not copy.is_current()
    with torch.no_grad():
        assert torch.equal(_apply(lin, copy, torch.ones(1, 6)), lin.bias.detach()[None])


def test_stack_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one"):
        DecodeWeight.stack([])
    with pytest.raises(ValueError, match="in_features"):
        DecodeWeight.stack([Linear(3, 2), Linear(4, 2)])
    with pytest.raises(ValueError, match="bias"):
        DecodeWeight.stack([Linear(3, 2), Linear(3, 2, bias=False)])


def test_the_copy_is_used_only_without_autograd(monkeypatch: pytest.MonkeyPatch) -> None:
    """With autograd on, the engine runs the parameter (the oneDNN product has no gradient)."""
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(vocab_size=50, d_model=16, n_heads=2, n_layers=1, d_ff=32, eos_id=None)
    ).eval()
    calls: list[int] = []
    original = DecodeWeight.__call__
    monkeypatch.setattr(
        DecodeWeight, "__call__", lambda self, x: calls.append(1) or original(self, x)
    )
    with FusedDecoder(model, rows=1) as engine:
        assert engine.head is not None  # wide: 16 -> 50
        engine.lm_head(torch.randn(2, 16)).sum().backward()
        assert model.lm_head.weight.grad is not None and not calls
        with torch.no_grad():
            engine.lm_head(torch.randn(2, 16))
        assert calls == [1]


def test_stack_refuses_weights_it_cannot_reorder() -> None:
    lin = Linear(4, 3).double()
    assert not reordering_available(lin.weight)
    with pytest.raises(ValueError, match="fp32 CPU weights"):
        DecodeWeight.stack([lin])
