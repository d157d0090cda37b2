"""float32_attention: attention in float32 inside a bfloat16-autocast model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab import build_model
from attnlab.layers.attention_backends import get_attention_backend, math_attention
from attnlab.layers.multihead import MultiHeadAttention
from attnlab.transforms.precision import Float32Attention, float32_attention

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _qkv() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 3, 5, 8, generator=g) for _ in range(3)]


@pytest.mark.parametrize("name", ["sdpa", "math"])
def test_under_autocast_it_computes_in_float32_and_returns_the_query_dtype(name: str) -> None:
    backend = get_attention_backend(name)
    q, k, v = _qkv()
    reference = backend(q, k, v, is_causal=True)
    wrapped = Float32Attention(backend)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = wrapped(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True)
        seen: list[torch.dtype] = []
        spy = Float32Attention(lambda q, k, v, **kw: seen.append(q.dtype) or backend(q, k, v))
        spy(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert out.dtype == torch.bfloat16 and seen == [torch.float32]
    # only the inputs' rounding to bfloat16 separates it from the float32 reference
    torch.testing.assert_close(out.float(), reference, atol=0.05, rtol=0.05)
    # outside autocast, on float32 inputs: exactly the backend
    assert torch.equal(wrapped(q, k, v, is_causal=True), reference)


def test_transform_wraps_every_attention_once_and_keeps_what_the_backend_can_do() -> None:
    model = build_model("vit-cifar", n_layers=2)
    x = torch.randn(2, 3, 32, 32)
    before = model(x)
    float32_attention(float32_attention(model))
    backends = [layer.self_attn.backend for layer in model.layers]
    assert all(isinstance(b, Float32Attention) for b in backends)
    assert not isinstance(backends[0].backend, Float32Attention)  # not wrapped twice
    assert torch.equal(model(x), before)  # float32 model: nothing changes
    linear = Float32Attention(get_attention_backend("linear"))
    assert linear.softmax is False  # attributes read through (need_weights checks them)


def test_a_bf16_autocast_vit_trains_with_float32_attention() -> None:
    torch.manual_seed(0)
    model = float32_attention(build_model("vit-cifar", n_layers=1))
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
    assert logits.dtype == torch.bfloat16
    torch.nn.functional.cross_entropy(logits.float(), y).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_skip_leaves_the_named_backends_as_they_are() -> None:
    model = nn.Sequential(MultiHeadAttention(16, 2, backend="math"), MultiHeadAttention(16, 2))
    float32_attention(model, skip=(math_attention,))
    assert model[0].backend is math_attention
    assert isinstance(model[1].backend, Float32Attention)
