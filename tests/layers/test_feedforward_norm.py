"""FFN eq. (2) and its GLU variants, the activation registry, LayerNorm and RMSNorm."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.layers import (
    ACTIVATIONS,
    NORMS,
    BatchNorm,
    FeedForward,
    LayerNorm,
    RMSNorm,
    activation_names,
    build_norm,
)


def test_ffn_is_eq_2() -> None:
    """FFN(x) = max(0, x W1 + b1) W2 + b2."""
    ffn = FeedForward(8, 32)
    x = torch.randn(2, 5, 8)
    W1, b1 = ffn.up_proj.weight, ffn.up_proj.bias
    W2, b2 = ffn.down_proj.weight, ffn.down_proj.bias
    expected = torch.clamp(x @ W1.T + b1, min=0) @ W2.T + b2
    torch.testing.assert_close(ffn(x), expected)
    assert ffn.gate_proj is None


@pytest.mark.parametrize(
    ("name", "act"),
    [("swiglu", F.silu), ("geglu", F.gelu), ("reglu", F.relu)],
)
def test_glu_variants(name: str, act: object) -> None:
    ffn = FeedForward(8, 16, activation=name, bias=False)
    assert ffn.gate_proj is not None and ffn.up_proj.bias is None
    x = torch.randn(3, 8)
    h = act(x @ ffn.gate_proj.weight.T) * (x @ ffn.up_proj.weight.T)  # type: ignore[operator]
    torch.testing.assert_close(ffn(x), h @ ffn.down_proj.weight.T)


def test_activation_registry() -> None:
    x = torch.linspace(-3, 3, 13)
    torch.testing.assert_close(ACTIVATIONS.get("relu")(x), x.clamp_min(0))
    # exact GELU: x Φ(x)
    exact = torch.tensor([v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x.tolist()])
    torch.testing.assert_close(ACTIVATIONS.get("gelu")(x), exact)
    tanh = torch.tensor(
        [
            0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))
            for v in x.tolist()
        ]
    )
    torch.testing.assert_close(ACTIVATIONS.get("gelu_tanh")(x), tanh)
    torch.testing.assert_close(ACTIVATIONS.get("silu")(x), x * torch.sigmoid(x))
    torch.testing.assert_close(ACTIVATIONS.get("relu2")(x), torch.clamp(x, min=0) ** 2)  # Primer
    assert activation_names() == sorted(
        ["relu", "gelu", "gelu_tanh", "silu", "relu2", "swiglu", "geglu", "reglu"]
    )


def test_ffn_hidden_dropout_only_in_training() -> None:
    ffn = FeedForward(8, 64, dropout=0.5)
    x = torch.randn(4, 8)
    ffn.eval()
    torch.testing.assert_close(ffn(x), ffn(x))
    ffn.train()
    assert not torch.allclose(ffn(x), ffn.eval()(x))


def test_ffn_bad_arguments() -> None:
    with pytest.raises(
        ValueError, match=r"unknown activation 'tanh'; valid: geglu, gelu, gelu_tanh, reglu, relu"
    ):
        FeedForward(8, 16, activation="tanh")
    with pytest.raises(ValueError, match="must be positive"):
        FeedForward(8, 0)


def test_layernorm_matches_torch() -> None:
    ours = LayerNorm(6, eps=1e-5)
    ref = nn.LayerNorm(6, eps=1e-5)
    with torch.no_grad():
        ours.weight.normal_()
        ours.bias.normal_()  # type: ignore[union-attr]
        ref.weight.copy_(ours.weight)
        ref.bias.copy_(ours.bias)  # type: ignore[arg-type]
    x = torch.randn(3, 4, 6) * 5 + 2
    torch.testing.assert_close(ours(x), ref(x))
    assert LayerNorm(6, bias=False).bias is None


def test_rmsnorm_formula_and_dtype() -> None:
    norm = RMSNorm(6, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(3, 6) * 4
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    torch.testing.assert_close(norm(x), expected)
    xh = (x * 1000).half()  # x² overflows fp16; RMSNorm computes in float32
    out = norm(xh)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=1e-2)
    with pytest.raises(ValueError, match="RMSNorm has no bias"):
        RMSNorm(6, bias=True)


def test_norm_registry() -> None:
    assert set(NORMS.keys()) == {"layernorm", "rmsnorm", "batchnorm"}
    assert isinstance(build_norm("rmsnorm", 4, bias=True), RMSNorm)
    ln = build_norm("layernorm", 4, eps=1e-3, bias=False)
    assert isinstance(ln, LayerNorm) and ln.bias is None and ln.eps == 1e-3
    bn = build_norm("batchnorm", 4, eps=1e-3, bias=False)
    assert isinstance(bn, BatchNorm) and bn.bias is None and bn.eps == 1e-3
    with pytest.raises(ValueError, match=r"unknown norm 'groupnorm'; valid: "):
        build_norm("groupnorm", 4)


def test_batchnorm_is_batchnorm1d_over_the_tokens() -> None:
    """BatchNorm of (B, T, E) = nn.BatchNorm1d on the (B·T, E) tokens: the batch statistics in
    training (running averages updated the same way), the running ones in eval mode."""
    ours, ref = BatchNorm(6), nn.BatchNorm1d(6)
    with torch.no_grad():
        ours.weight.normal_()
        ours.bias.normal_()  # type: ignore[union-attr]
        ref.weight.copy_(ours.weight)
        ref.bias.copy_(ours.bias)  # type: ignore[arg-type]
    for _ in range(3):
        x = torch.randn(4, 5, 6) * 3 + 1
        torch.testing.assert_close(ours(x), ref(x.reshape(-1, 6)).reshape(4, 5, 6))
    torch.testing.assert_close(ours.running_mean, ref.running_mean)
    torch.testing.assert_close(ours.running_var, ref.running_var)
    ours.eval(), ref.eval()
    x = torch.randn(2, 3, 6)
    torch.testing.assert_close(ours(x), ref(x.reshape(-1, 6)).reshape(2, 3, 6))
    # in training, a sequence's output depends on the rest of the batch; in eval it does not
    ours.train()
    alone, batched = ours(x[:1]), ours(torch.cat([x[:1], 10 * x[1:]]))[:1]
    assert not torch.allclose(alone, batched)
    ours.eval()
    torch.testing.assert_close(ours(x[:1]), ours(torch.cat([x[:1], 10 * x[1:]]))[:1])
    with pytest.raises(ValueError, match=r"BatchNorm\(6\) needs inputs"):
        ours(torch.randn(2, 5))


def test_a_gpt_trains_and_counts_with_batchnorm() -> None:
    from attnlab.analysis import count_params
    from attnlab.models import build_model
    from attnlab.models.gpt import GPTConfig

    cfg = GPTConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_seq_len=8,
                    norm="batchnorm", dropout=0.0, eos_id=None)  # fmt: skip
    model = build_model(cfg)
    assert count_params(cfg) == sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, 11, (3, 8))
    _, loss = model(ids, targets=ids)
    assert loss is not None and torch.isfinite(loss)
    loss.backward()
    model.eval()
    assert torch.isfinite(model(ids)[0]).all()
