"""Mask helpers: causal (bottom-right), padding, lifting, combining, additive form, validation."""

from __future__ import annotations

import pytest
import torch

from attnlab.layers import (
    as_attention_mask,
    causal_mask,
    combine_masks,
    padding_mask_from_ids,
    padding_mask_from_lengths,
    to_additive,
)
from attnlab.layers.masks import check_mask


def test_causal_square_is_lower_triangular() -> None:
    m = causal_mask(4)
    assert m.dtype == torch.bool and m.shape == (4, 4)
    assert torch.equal(m, torch.ones(4, 4, dtype=torch.bool).tril())


def test_causal_bottom_right_when_fewer_queries() -> None:
    # T=2 queries at the end of S=5 keys: query 0 is position 3, query 1 is position 4.
    expected = torch.tensor(
        [
            [1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(causal_mask(2, 5), expected)
    # One new token with a cache sees everything.
    assert causal_mask(1, 7).all()


def test_causal_more_queries_than_keys_has_empty_rows() -> None:
    expected = torch.tensor(
        [
            [0, 0],
            [0, 0],
            [0, 0],
            [1, 0],
            [1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(causal_mask(5, 2), expected)


def test_causal_rejects_negative_lengths() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        causal_mask(-1)


def test_padding_from_lengths() -> None:
    m = padding_mask_from_lengths(torch.tensor([3, 1, 0]), 4)
    assert m.shape == (3, 1, 1, 4)
    expected = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    assert torch.equal(m[:, 0, 0], expected)
    assert padding_mask_from_lengths(torch.tensor([2, 5])).shape == (2, 1, 1, 5)


@pytest.mark.parametrize(
    ("lengths", "max_len", "match"),
    [
        (torch.tensor([1.0, 2.0]), None, "1-D integer"),
        (torch.tensor([[1, 2]]), None, "1-D integer"),
        (torch.tensor([3, 5]), 4, r"lengths must lie in \[0, 4\]"),
        (torch.tensor([-1, 2]), 4, r"lengths must lie in"),
    ],
)
def test_padding_from_lengths_rejects_bad_input(
    lengths: torch.Tensor, max_len: int | None, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        padding_mask_from_lengths(lengths, max_len)


def test_padding_from_ids() -> None:
    ids = torch.tensor([[5, 6, 0, 0], [7, 0, 8, 0]])
    m = padding_mask_from_ids(ids, pad_id=0)
    assert m.shape == (2, 1, 1, 4)
    assert torch.equal(m[:, 0, 0], ids != 0)
    with pytest.raises(ValueError, match=r"ids must be \(B, S\)"):
        padding_mask_from_ids(ids[0], 0)


def test_as_attention_mask() -> None:
    hf = torch.tensor([[1, 1, 0], [1, 0, 0]])  # HF attention_mask convention: 1 = real token
    m = as_attention_mask(hf)
    assert m.dtype == torch.bool and m.shape == (2, 1, 1, 3)
    assert torch.equal(m[:, 0, 0], hf.bool())
    assert torch.equal(as_attention_mask(hf.bool()), m)
    with pytest.raises(ValueError, match=r"expected a \(B, S\) key mask"):
        as_attention_mask(m)


def test_to_additive_uses_finfo_min_not_inf() -> None:
    keep = torch.tensor([True, False, True])
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        add = to_additive(keep, dtype)
        assert add.dtype == dtype
        assert torch.isfinite(add).all()
        assert add.tolist() == [0.0, torch.finfo(dtype).min, 0.0]
    f = torch.tensor([0.5, -1.0])
    assert torch.equal(to_additive(f, torch.float64), f.double())


def test_combine_bool_masks_is_and() -> None:
    pad = padding_mask_from_lengths(torch.tensor([3, 2]), 3)  # (2, 1, 1, 3)
    causal = causal_mask(3)  # (3, 3)
    out = combine_masks(pad, None, causal)
    assert out is not None and out.dtype == torch.bool and out.shape == (2, 1, 3, 3)
    assert torch.equal(out, pad & causal)
    assert combine_masks(None, None) is None
    assert combine_masks(None, causal) is causal


def test_combine_with_float_is_additive_and_clamped() -> None:
    pad = padding_mask_from_lengths(torch.tensor([3, 1]), 3)  # (2, 1, 1, 3)
    bias = torch.tensor([[0.0, -1.0, -2.0]] * 3)  # (3, 3)
    neg_inf = torch.zeros(3, 3).masked_fill(~causal_mask(3), float("-inf"))
    out = combine_masks(pad, bias, neg_inf)
    assert out is not None and out.dtype == torch.float32 and out.shape == (2, 1, 3, 3)
    assert torch.isfinite(out).all()
    mn = torch.finfo(torch.float32).min
    allowed = pad & causal_mask(3)
    assert (out[~allowed.expand(2, 1, 3, 3)] == mn).all()
    torch.testing.assert_close(out[0, 0, 2], bias[2])
    # finfo.min + finfo.min is clamped, not -inf.
    twice = combine_masks(to_additive(pad, torch.float32), to_additive(pad, torch.float32))
    assert twice is not None and torch.isfinite(twice).all()


def test_check_mask() -> None:
    check_mask(torch.ones(2, 1, 1, 5, dtype=torch.bool), 2, 4, 3, 5)
    check_mask(torch.zeros(3, 5), 2, 4, 3, 5)
    check_mask(torch.zeros(5), 2, 4, 3, 5)
    with pytest.raises(TypeError, match=r"got dtype torch\.int32"):
        check_mask(torch.ones(3, 5, dtype=torch.int32), 2, 4, 3, 5)
    with pytest.raises(ValueError, match=r"shape \(2, 4\) does not broadcast"):
        check_mask(torch.ones(2, 4, dtype=torch.bool), 2, 4, 3, 5)
    with pytest.raises(ValueError, match="does not broadcast"):
        check_mask(torch.ones(2, 3, 1, 5, dtype=torch.bool), 2, 4, 3, 5)
