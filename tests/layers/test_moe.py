"""MoE layer: grouped dispatch == a naive per-token loop, 1 expert == the dense FFN, the capacity
drops exactly what the rule says, gradcheck (router included), losses and bias balancing."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.func import functional_call

from attnlab.layers.feedforward import FeedForward
from attnlab.layers.moe import MoEFeedForward, load_balancing_loss, router_z_loss
from attnlab.layers.moe_stats import collect_moe_stats, update_balance_biases

pytestmark = pytest.mark.usefixtures("one_thread")

D, F = 12, 20


def randomise(m: nn.Module, std: float = 0.5, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)


def naive(moe: MoEFeedForward, x: Tensor, keep: set[tuple[int, int]] | None = None) -> Tensor:
    """Token by token, slot by slot, written from the definitions (``keep``: the (token, slot)
    assignments that survive a capacity; default all)."""
    h = x.reshape(-1, x.shape[-1])
    rows = []
    for t in range(h.shape[0]):
        xt = h[t : t + 1]
        logits = moe.router(xt)[0].float()
        scores = logits if moe.routing == "topk_softmax" else torch.softmax(logits, -1)
        select = scores if moe.balance_bias is None else scores + moe.balance_bias
        ranked = sorted(range(moe.n_experts), key=lambda e: -float(select[e].detach()))[: moe.top_k]
        chosen = torch.stack([scores[e] for e in ranked])
        if moe.routing == "topk_softmax":
            w = torch.exp(chosen - chosen.max()) / torch.exp(chosen - chosen.max()).sum()
        else:
            w = chosen / chosen.sum() if moe.norm_topk_prob else chosen
        y = torch.zeros_like(xt)
        for slot, e in enumerate(ranked):
            if keep is None or (t, slot) in keep:
                y = y + w[slot] * moe.experts[e](xt)
        if moe.shared_expert is not None:
            s = moe.shared_expert(xt)
            if moe.shared_expert_gate is not None:
                s = torch.sigmoid(moe.shared_expert_gate(xt)) * s
            y = y + s
        rows.append(y)
    return torch.cat(rows).view(x.shape)


CASES: list[dict[str, Any]] = [
    dict(n_experts=4, top_k=2),  # Mixtral
    dict(n_experts=5, top_k=1, routing="softmax_topk", norm_topk_prob=False, activation="relu"),
    dict(n_experts=6, top_k=3, routing="softmax_topk", norm_topk_prob=True, activation="gelu"),
    dict(n_experts=4, top_k=2, routing="softmax_topk", norm_topk_prob=False,
         n_shared_experts=1, shared_expert_d_ff=8, shared_expert_gate=True),  # Qwen2-MoE
    dict(n_experts=8, top_k=2, n_shared_experts=2, bias=True),  # DeepSeek-MoE style
    dict(n_experts=4, top_k=2, bias_balancing=True),
]  # fmt: skip


def grads(m: nn.Module, x: Tensor) -> dict[str, Tensor]:
    out = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    assert x.grad is not None
    out["input"] = x.grad.clone()
    m.zero_grad()
    x.grad = None
    return out


@pytest.mark.parametrize("kw", CASES)
def test_grouped_dispatch_equals_per_token_loop(kw: dict[str, Any]) -> None:
    moe = MoEFeedForward(D, F, **kw)
    randomise(moe)
    if moe.balance_bias is not None:
        moe.balance_bias.copy_(torch.randn(moe.n_experts))  # changes the selection only
    x = torch.randn(3, 7, D, requires_grad=True)
    target = torch.randn(3, 7, D)
    y = moe(x)
    (y * target).sum().backward()
    fast = grads(moe, x)
    ref = naive(moe, x)
    (ref * target).sum().backward()
    slow = grads(moe, x)
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    assert fast.keys() == slow.keys()
    for name in fast:
        torch.testing.assert_close(fast[name], slow[name], atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("routing", ["topk_softmax", "softmax_topk"])
@pytest.mark.parametrize("activation", ["relu", "swiglu"])
def test_one_expert_top1_is_the_dense_ffn(routing: str, activation: str) -> None:
    dense = FeedForward(D, F, activation=activation, bias=True)
    moe = MoEFeedForward(D, F, 1, 1, activation=activation, bias=True, routing=routing)
    moe.experts[0].load_state_dict(dense.state_dict())
    x = torch.randn(2, 5, D)
    assert torch.equal(moe(x), dense(x))


def test_every_parameter_gets_a_gradient() -> None:
    """Unused experts still run (on no rows): zero gradients, so DDP needs no unused-parameter
    search."""
    moe = MoEFeedForward(D, F, 8, 1)
    moe(torch.randn(1, 2, D)).sum().backward()
    used = 0
    for e in moe.experts:
        assert all(p.grad is not None for p in e.parameters())
        used += int(any(p.grad.abs().sum() > 0 for p in e.parameters()))  # type: ignore[union-attr]
    assert used <= 2


def capacity_rule(idx: Tensor, n_experts: int, cap: int) -> set[tuple[int, int]]:
    """The documented rule, independently: per expert, first choices before second choices,
    earlier tokens first within a slot; keep the first ``cap``."""
    N, k = idx.shape
    keep = set()
    for e in range(n_experts):
        queue = [(t, s) for s in range(k) for t in range(N) if int(idx[t, s]) == e]
        keep.update(queue[:cap])
    return keep


def test_capacity_gives_first_choices_priority() -> None:
    """Tokens 0-3 prefer expert 1 then 0, tokens 4-7 expert 0 then 1; capacity 4 per expert keeps
    every first choice and drops every second choice (token order alone would not)."""
    moe = MoEFeedForward(2, 3, 4, 2, capacity_factor=1.0)  # C = ceil(8·2/4) = 4
    randomise(moe.experts)
    with torch.no_grad():
        moe.router.weight.copy_(torch.tensor([[-2.0, 0.0], [2.0, 0.0], [0.0, -5.0], [0.0, -5.0]]))
    x = torch.tensor([[1.0, 1.0]] * 4 + [[-1.0, 1.0]] * 4)  # (8, 2)
    y = moe(x)
    s = moe.last_stats
    assert s is not None and moe.capacity(8) == 4
    assert s.tokens_per_expert.tolist() == [8, 8, 0, 0]
    assert s.kept_per_expert.tolist() == [4, 4, 0, 0]
    assert int(s.dropped) == 8 and s.dropped_fraction == 0.5 and int(s.tokens_fully_dropped) == 0
    first = {(t, 0) for t in range(8)}
    torch.testing.assert_close(y, naive(moe, x, keep=first))


@pytest.mark.parametrize("factor", [0.5, 1.0, 1.25])
@pytest.mark.parametrize("k", [1, 2])
def test_capacity_drops_exactly_the_rule(factor: float, k: int) -> None:
    moe = MoEFeedForward(D, F, 4, k, capacity_factor=factor, n_shared_experts=1)
    randomise(moe)
    with torch.no_grad():
        moe.router.weight[0, 0] = 4.0  # overload expert 0 so that something is dropped
    x = torch.randn(2, 9, D)
    x[..., 0] = 1.0
    y = moe(x)
    _, idx = moe.route(moe.router(x.reshape(-1, D)))
    cap = math.ceil(factor * 18 * k / 4)
    keep = capacity_rule(idx, 4, cap)
    s = moe.last_stats
    assert s is not None
    assert int(s.dropped) == 18 * k - len(keep) > 0
    kept_tokens = {t for t, _ in keep}
    assert int(s.tokens_fully_dropped) == 18 - len(kept_tokens)
    torch.testing.assert_close(y, naive(moe, x, keep=keep), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kw", [dict(), dict(routing="softmax_topk", capacity_factor=0.7)])
def test_gradcheck_float64_router_included(kw: dict[str, Any]) -> None:
    moe = MoEFeedForward(4, 5, 3, 2, n_shared_experts=1, shared_expert_gate=True, **kw).double()
    randomise(moe, std=0.7, seed=3)
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    w = moe.router.weight.detach().clone().requires_grad_(True)

    def f(x: Tensor, w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        y = functional_call(moe, {"router.weight": w}, (x,))
        s = moe.last_stats
        assert s is not None
        return y, s.aux_loss, s.z_loss

    assert torch.autograd.gradcheck(f, (x, w), eps=1e-6, atol=1e-6)
    y, aux, _ = f(x, w)
    (g,) = torch.autograd.grad(y.sum() + aux, w)
    assert g.abs().sum() > 0  # the router learns from the outputs and the balancing loss


def test_auxiliary_losses_closed_forms() -> None:
    logits = torch.randn(10, 4)
    probs = logits.softmax(-1)
    counts = torch.tensor([6, 6, 4, 4])  # top-2 of 10 tokens: 20 assignments
    expected = 4 * sum(counts[i] / 10 * probs[:, i].mean() for i in range(4))
    torch.testing.assert_close(load_balancing_loss(logits, counts), expected)
    assert float(load_balancing_loss(torch.zeros(8, 4), torch.tensor([4, 4, 4, 4]))) == 2.0  # k
    lse = torch.log(torch.exp(logits).sum(-1))
    torch.testing.assert_close(router_z_loss(logits), (lse**2).mean())
    assert load_balancing_loss(logits.half(), counts).dtype == torch.float32


def test_stats_and_collect_sum_over_layers() -> None:
    model = nn.Sequential(
        MoEFeedForward(D, F, 4, 2, aux_loss_weight=0.1, z_loss_weight=0.01),
        MoEFeedForward(D, F, 3, 1, aux_loss_weight=0.2),
    )
    x = torch.randn(2, 6, D)
    model(x)
    layers = [model[0].last_stats, model[1].last_stats]
    total = collect_moe_stats(model)
    assert all(s is not None for s in layers)
    expected = sum(s.loss for s in layers if s is not None)
    torch.testing.assert_close(total.loss, expected)
    torch.testing.assert_close(total.loss, sum(
        w * s.aux_loss + z * s.z_loss
        for s, w, z in zip(layers, (0.1, 0.2), (0.01, 0.0), strict=True) if s is not None
    ))  # fmt: skip
    assert [int(c.sum()) for c in total.tokens_per_expert.values()] == [24, 12]
    assert total.loss.requires_grad and set(total.log_dict()) >= {"moe_aux_loss", "moe_z_loss"}
    assert float(collect_moe_stats(nn.Linear(2, 2)).loss) == 0.0


def test_bias_balancing_selects_with_the_bias_and_weights_without_it() -> None:
    moe = MoEFeedForward(D, F, 4, 1, routing="softmax_topk", norm_topk_prob=False,
                         bias_balancing=True)  # fmt: skip
    assert moe.balance_bias is not None and "balance_bias" in moe.state_dict()
    moe.balance_bias.copy_(torch.tensor([0.0, 0.0, 0.0, 10.0]))
    x = torch.randn(16, D)
    weights, idx = moe.route(moe.router(x))
    assert (idx == 3).all()
    torch.testing.assert_close(weights[:, 0], moe.router(x).softmax(-1)[:, 3])
    moe.balance_bias.zero_()
    moe(x)
    s = moe.last_stats
    assert s is not None
    load = s.tokens_per_expert.float()
    update_balance_biases(nn.Sequential(moe), 0.01)
    torch.testing.assert_close(moe.balance_bias, 0.01 * torch.sign(load.mean() - load))
    moe.update_balance_bias(0.5, torch.tensor([1, 1, 1, 5]))  # overloaded expert 3 goes down
    assert float(moe.balance_bias[3]) < float(moe.balance_bias[0])


def test_router_logits_on_request() -> None:
    moe = MoEFeedForward(D, F, 4, 2)
    x = torch.randn(2, 3, D)
    moe(x)
    assert moe.last_stats is not None and moe.last_stats.router_logits is None
    moe.keep_router_logits = True
    moe(x)
    assert moe.last_stats is not None and moe.last_stats.router_logits is not None
    torch.testing.assert_close(moe.last_stats.router_logits, moe.router(x.reshape(6, D)))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(n_experts=2, top_k=3), "top_k"),
        (dict(n_experts=0, top_k=1), "n_experts"),
        (dict(n_experts=2, routing="expert_choice"), "routing"),
        (dict(n_experts=2, capacity_factor=0.0), "capacity_factor"),
        (dict(n_experts=2, capacity_factor=float("inf")), "capacity_factor"),
        (dict(n_experts=2, aux_loss_weight=float("nan")), "aux_loss_weight"),
        (dict(n_experts=2, shared_expert_gate=True), "shared_expert_gate"),
    ],
)
def test_bad_arguments(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MoEFeedForward(D, F, **kw)
