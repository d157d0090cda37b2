"""The optimizer factory picks torch's fused Adam(W) kernel where it applies."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.training.config import TrainConfig
from attnlab.training.optim import build_optimizer


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_fused_on_plain_cpu_parameters_and_same_update_as_the_for_loop(name: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4))
    config = TrainConfig(optimizer=name, lr=1e-2, weight_decay=0.1)
    optimizer = build_optimizer(model, config)
    assert optimizer.defaults["fused"] is True
    twin = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4))
    twin.load_state_dict(model.state_dict())
    cls = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
    loop_groups = []
    names = {id(p): n for n, p in model.named_parameters()}
    twin_params = dict(twin.named_parameters())
    for group in optimizer.param_groups:
        loop_groups.append(
            {
                "params": [twin_params[names[id(p)]] for p in group["params"]],
                "weight_decay": group["weight_decay"],
            }
        )
    loop = cls(loop_groups, lr=1e-2, betas=config.betas, eps=config.adam_eps, foreach=False)
    x = torch.randn(32, 8)
    for _ in range(5):
        for m, opt in ((model, optimizer), (twin, loop)):
            opt.zero_grad()
            m(x).square().mean().backward()
            opt.step()
    for (n, a), b in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=n)


def test_sgd_is_not_fused() -> None:
    optimizer = build_optimizer(nn.Linear(2, 2), TrainConfig(optimizer="sgd", lr=0.1))
    assert isinstance(optimizer, torch.optim.SGD)
