"""Token embedding (§3.4): sqrt(d_model) scaling, padding index, vocabulary checks, tying."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnlab.layers import TokenEmbedding, tie_weights


def test_scaled_lookup() -> None:
    emb = TokenEmbedding(10, 16)
    ids = torch.tensor([[1, 4, 9]])
    torch.testing.assert_close(emb(ids), emb.weight[ids] * math.sqrt(16))
    plain = TokenEmbedding(10, 16, scale=False)
    torch.testing.assert_close(plain(ids), plain.weight[ids])


def test_padding_idx_is_zero_and_gets_no_gradient() -> None:
    emb = TokenEmbedding(10, 4, padding_idx=0)
    assert (emb.weight[0] == 0).all()
    emb(torch.tensor([[0, 3]])).sum().backward()
    assert emb.weight.grad is not None
    assert (emb.weight.grad[0] == 0).all() and (emb.weight.grad[3] != 0).all()


@pytest.mark.parametrize(("bad", "shown"), [(10, "10"), (-1, "-1"), (123, "123")])
def test_ids_outside_vocabulary(bad: int, shown: str) -> None:
    emb = TokenEmbedding(10, 4)
    with pytest.raises(ValueError, match=rf"token id {shown} is outside the vocabulary \[0, 10\)"):
        emb(torch.tensor([[1, bad, 2]]))


def test_non_integer_ids() -> None:
    emb = TokenEmbedding(10, 4)
    with pytest.raises(ValueError, match="integer tensor"):
        emb(torch.tensor([[1.0, 2.0]]))
    with pytest.raises(ValueError, match="integer tensor"):
        emb(torch.tensor([[True]]))


def test_tie_weights() -> None:
    emb = TokenEmbedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    tie_weights(head, emb)
    assert head.weight is emb.weight
    with pytest.raises(ValueError, match=r"cannot tie output weight \(11, 4\)"):
        tie_weights(nn.Linear(4, 11, bias=False), emb)
