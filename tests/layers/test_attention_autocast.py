"""The math attention path under CPU bfloat16 autocast (issue 25: it raised at the mask fill).

Autocast runs the score matmul in bfloat16 whatever the inputs' dtype, so the fill value of the
masked scores must be the scores' own ``finfo.min``: float32's does not fit in bfloat16.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.layers.attention import scaled_dot_product_attention
from attnlab.layers.multihead import MultiHeadAttention


def _qkv(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 2, 6, 8, generator=g) for _ in range(3))  # type: ignore[return-value]


@pytest.mark.parametrize("masking", ["causal", "bool", "additive", "none"])
def test_math_path_runs_under_bf16_autocast_and_matches_float32(masking: str) -> None:
    q, k, v = _qkv()
    keep = torch.rand(2, 1, 6, 6, generator=torch.Generator().manual_seed(1)) > 0.3
    keep[..., 0] = True  # every query sees at least one key
    kwargs: dict[str, object] = {
        "causal": {"is_causal": True},
        "bool": {"mask": keep},
        "additive": {"mask": torch.zeros(2, 1, 6, 6).masked_fill(~keep, float("-inf"))},
        "none": {},
    }[masking]
    reference = scaled_dot_product_attention(q, k, v, **kwargs)  # type: ignore[arg-type]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = scaled_dot_product_attention(q, k, v, **kwargs)  # type: ignore[arg-type]
    assert out.dtype == torch.bfloat16  # the matmuls did run in bfloat16
    torch.testing.assert_close(out.float(), reference, atol=4e-2, rtol=4e-2)


def test_bf16_autocast_keeps_masked_keys_at_zero_and_empty_rows_at_zero() -> None:
    q, k, v = _qkv(2)
    keep = torch.ones(6, 6, dtype=torch.bool)
    keep[:, 3] = False  # key 3 is masked for every query
    keep[4] = False  # query 4 may attend to nothing
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, weights = scaled_dot_product_attention(q, k, v, mask=keep, return_weights=True)
    assert torch.all(weights[..., 3] == 0)
    assert torch.all(weights[:, :, 4] == 0) and torch.all(out[:, :, 4] == 0)
    assert torch.isfinite(out.float()).all()


def test_math_backend_trains_under_bf16_autocast() -> None:
    """Forward and backward of a MultiHeadAttention on the math backend: finite gradients."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2, backend="math")
    x = torch.randn(2, 5, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = attn(x, is_causal=True)
    out.float().square().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in attn.parameters())


def test_under_autocast_the_products_are_bf16_and_the_scores_and_softmax_float32() -> None:
    """The hook sees float32 scores and weights; the output is the matmul's bfloat16."""
    q, k, v = _qkv(3)
    seen: dict[str, torch.dtype] = {}

    def hook(name: str, t: torch.Tensor) -> torch.Tensor:
        seen[name] = t.dtype
        return t

    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = scaled_dot_product_attention(q, k, v, hook=hook)
    assert seen == {"scores": torch.float32, "weights": torch.float32}
    assert out.dtype == torch.bfloat16
    # the scores are the bfloat16 product's: equal to a float32 softmax of bf16 q kᵀ
    scores = (q.bfloat16() @ k.bfloat16().transpose(-2, -1)).float() * (1.0 / math.sqrt(8))
    expected = torch.softmax(scores, dim=-1).bfloat16() @ v.bfloat16()
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
