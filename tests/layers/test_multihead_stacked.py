"""The training step's stacked q/k/v product (MultiHeadAttention._stacked_in_weights): the same
outputs and gradients as three linear calls, and the three modules still called wherever
something observes or replaces them."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn

from attnlab.layers import MultiHeadAttention


def _loss_and_grads(mha: MultiHeadAttention, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    x = x.clone().requires_grad_(True)
    out, _ = mha(x, is_causal=True)
    loss = (out * torch.linspace(-1, 1, out.shape[-1])).sum()
    loss.backward()
    grads = {name: p.grad.clone() for name, p in mha.named_parameters() if p.grad is not None}
    grads["x"] = x.grad.clone()  # type: ignore[union-attr]
    return out.detach(), grads


def _unstacked(mha: MultiHeadAttention) -> MultiHeadAttention:
    """A copy that calls its three projections as modules (a no-op forward pre-hook on each)."""
    twin = copy.deepcopy(mha)
    for m in (twin.q_proj, twin.k_proj, twin.v_proj):
        m.register_forward_pre_hook(lambda module, args: None)
    return twin


@pytest.mark.parametrize(
    ("n_kv_heads", "bias"), [(4, True), (2, True), (1, False), (4, False)], ids=str
)
def test_stacked_product_matches_three_linears(n_kv_heads: int, bias: bool) -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads, bias=bias)
    twin = _unstacked(mha)
    rows = 32 + 2 * 8 * n_kv_heads
    with torch.no_grad():
        assert mha._stacked_in_weights(rows) is None  # nothing recorded: three modules
    assert mha._stacked_in_weights(rows - 1) is None  # the copy would outgrow the input
    stacked = mha._stacked_in_weights(rows)
    assert stacked is not None and stacked[0].shape == (rows, 32)
    assert (stacked[1] is None) is not bias
    assert twin._stacked_in_weights(rows) is None
    x = torch.randn(4, 24, 32)  # 96 tokens: stacked
    out, grads = _loss_and_grads(mha, x)
    ref_out, ref_grads = _loss_and_grads(twin, x)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys()
    assert {"q_proj.weight", "k_proj.weight", "v_proj.weight"} <= grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-5)


def test_value_embeddings_and_qk_norm_go_through_the_stacked_product() -> None:
    torch.manual_seed(1)
    mha = MultiHeadAttention(
        32, 4, value_embed=True, q_norm=nn.RMSNorm(8), k_norm=nn.RMSNorm(8), bias=False
    )
    twin = _unstacked(mha)
    x, ve = torch.randn(4, 24, 32), torch.randn(4, 24, 32)
    assert mha._stacked_in_weights(96) is not None
    out = mha(x, is_causal=True, value_embed=ve)[0]
    ref = twin(x, is_causal=True, value_embed=ve)[0]
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_observed_or_replaced_projections_are_called_as_modules() -> None:
    """A hook on a projection still fires in a training step, and a projection of another type
    (as LoRA or quantization make) is called, not stacked."""
    mha = MultiHeadAttention(16, 2)
    seen: list[tuple[int, ...]] = []
    handle = mha.k_proj.register_forward_hook(lambda m, args, out: seen.append(tuple(out.shape)))
    mha(torch.randn(2, 24, 16), is_causal=True)[0].sum().backward()
    assert seen == [(2, 24, 16)]
    handle.remove()
    assert mha._stacked_in_weights(48) is not None

    class Scaled(nn.Linear):
        def forward(self, x: Tensor) -> Tensor:
            return 2 * super().forward(x)

    scaled = Scaled(16, 16)
    scaled.load_state_dict(mha.v_proj.state_dict())
    plain_out = mha(torch.ones(1, 48, 16), is_causal=True)[0]
    mha.v_proj = scaled
    assert mha._stacked_in_weights(48) is None
    assert not torch.allclose(mha(torch.ones(1, 48, 16), is_causal=True)[0], plain_out)

    patched = MultiHeadAttention(16, 2)
    patched.q_proj.forward = lambda x: torch.zeros(*x.shape[:-1], 16)  # type: ignore[method-assign]
    assert patched._stacked_in_weights(48) is None
    handle = nn.modules.module.register_module_forward_hook(lambda m, args, out: None)
    try:
        assert MultiHeadAttention(16, 2)._stacked_in_weights(48) is None
    finally:
        handle.remove()


def test_mixed_biases_fall_back_to_three_linears() -> None:
    mha = MultiHeadAttention(16, 2)
    mha.k_proj = nn.Linear(16, 16, bias=False)
    assert mha._stacked_in_weights(48) is None
    out = mha(torch.randn(1, 48, 16), is_causal=True)[0]
    assert out.shape == (1, 48, 16)
