"""Muon (issue 51): the Newton-Schulz band, one step against the update's equations, the AdamW
groups against torch's AdamW, the parameter split, bitwise resume, and clear errors."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from attnlab.data.text import TokenStream
from attnlab.models import GPT, GPTConfig
from attnlab.training.config import TrainConfig
from attnlab.training.muon import (
    NS_BAND,
    NS_BAND_BF16,
    NS_COEFFICIENTS,
    NS_FLOOR,
    Muon,
    newton_schulz,
)
from attnlab.training.objectives import CausalLMObjective
from attnlab.training.optim import build_optimizer, muon_parameters
from attnlab.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _prescribed(
    shape: tuple[int, int], scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A float64 matrix ``g`` of ``shape`` whose singular values ``s`` are log-spaced, the
    smallest just above NS_FLOOR relative to the Frobenius norm (a fixed point: the norm depends
    a little on the smallest value), scaled to ``||g||_F = scale``; returns ``(g, U, s, V^T)``."""
    gen = torch.Generator().manual_seed(sum(shape))
    g = torch.randn(*shape, generator=gen, dtype=torch.float64)
    u, s, vh = torch.linalg.svd(g, full_matrices=False)
    k, low = s.numel(), NS_FLOOR
    for _ in range(20):
        s = torch.logspace(math.log10(low), 0, k, dtype=torch.float64)
        low = 1.01 * NS_FLOOR * float(s.norm())
    assert float(s.min() / s.norm()) >= NS_FLOOR
    return u @ torch.diag(s / s.norm() * scale) @ vh, u, s, vh


@pytest.mark.parametrize("shape", [(64, 256), (256, 64), (48, 48), (100, 37), (3, 200)])
def test_newton_schulz_brings_singular_values_into_the_band(shape: tuple[int, int]) -> None:
    g, u, s, vh = _prescribed(shape, 7.0)  # ||g||_F = 7: the iteration normalises first
    out = newton_schulz(g)
    assert out.shape == g.shape and out.dtype == g.dtype
    got = torch.linalg.svdvals(out)
    assert NS_BAND[0] <= float(got.min()) and float(got.max()) <= NS_BAND[1], got
    # the singular vectors are kept: U^T out V is diagonal (the iteration is a polynomial in g)
    inner = u.mT @ out @ vh.mT
    assert torch.allclose(inner, torch.diag(torch.diagonal(inner)), atol=1e-5)
    # and each value follows the scalar map a s + b s^3 + c s^5, five times
    a, b, c = NS_COEFFICIENTS
    x = s / s.norm()
    for _ in range(5):
        x = a * x + b * x**3 + c * x**5
    assert torch.allclose(torch.diagonal(inner).flip(0).sort().values, x.sort().values, atol=1e-4)


@pytest.mark.parametrize("shape", [(128, 128), (512, 128), (64, 256), (3, 200)])
def test_newton_schulz_in_bfloat16_keeps_the_wider_band(shape: tuple[int, int]) -> None:
    # the same iteration with bfloat16 products: singular values in NS_BAND_BF16, the output
    # in the input's dtype, and near the float32 iteration's (bfloat16 keeps 8 mantissa bits)
    made = [_prescribed(shape, scale) for scale in (1e-3, 1.0, 50.0)]
    g = torch.stack([m[0] for m in made]).float()
    out = newton_schulz(g, dtype=torch.bfloat16)
    assert out.shape == g.shape and out.dtype == torch.float32
    got = torch.linalg.svdvals(out.double())
    assert NS_BAND_BF16[0] <= float(got.min()) and float(got.max()) <= NS_BAND_BF16[1], got
    assert NS_BAND_BF16[0] < NS_BAND[0] and NS_BAND[1] < NS_BAND_BF16[1]  # wider than float32's
    # the singular vectors are g's: U^T out V is diagonal up to bfloat16's rounding (where each
    # value lands in the band differs from float32's: the small ones are grown from rounding)
    _, u, _, vh = made[1]
    inner = u.mT @ out[1].double() @ vh.mT
    off = inner - torch.diag(torch.diagonal(inner))
    assert float(off.norm() / inner.norm()) < 0.05
    assert not torch.equal(out, newton_schulz(g))  # it did run in bfloat16
    with pytest.raises(ValueError, match=r"float32 or torch\.bfloat16, got torch\.float16"):
        newton_schulz(g, dtype=torch.float16)


def test_muon_ns_dtype_bfloat16_step_equals_the_bf16_iteration() -> None:
    gen = torch.Generator().manual_seed(4)
    w0, grad = torch.randn(16, 48, generator=gen), torch.randn(16, 48, generator=gen)
    p = nn.Parameter(w0.clone())
    opt = Muon([p], lr=0.05, momentum=0.9, ns_dtype="bfloat16")
    p.grad = grad.clone()
    opt.step()
    update = grad.add(grad, alpha=0.9)[None]  # nesterov, first step: g + mu * g; stacked
    want = w0 - 0.05 * newton_schulz(update, dtype=torch.bfloat16)[0]
    torch.testing.assert_close(p.detach(), want, rtol=0, atol=1e-6)
    in_float32 = w0 - 0.05 * newton_schulz(update)[0]
    assert float((p.detach() - in_float32).abs().max()) > 1e-4
    assert opt.state_dict()["param_groups"][0]["ns_dtype"] == "bfloat16"
    with pytest.raises(ValueError, match=r"ns_dtype must be one of .*got 'float16'"):
        Muon([nn.Parameter(torch.zeros(2, 2))], ns_dtype="float16")
    with pytest.raises(ValueError, match=r"muon_ns_dtype='fp8' is not valid; choose one of"):
        TrainConfig(optimizer="muon", muon_ns_dtype="fp8")  # type: ignore[arg-type]


def test_newton_schulz_rejects_bad_input_and_keeps_zero() -> None:
    with pytest.raises(ValueError, match=r"a matrix \(..., m, n\), got shape \(4,\)"):
        newton_schulz(torch.zeros(4))
    with pytest.raises(ValueError, match="steps must be >= 0, got -1"):
        newton_schulz(torch.zeros(3, 4), -1)
    assert torch.equal(newton_schulz(torch.zeros(3, 4)), torch.zeros(3, 4))


def _reference_muon(w: torch.Tensor, grads: list[torch.Tensor], lr: float, mu: float,
                    wd: float) -> torch.Tensor:  # fmt: skip
    """The update's equations, written out independently of the optimizer's code."""
    a, b, c = NS_COEFFICIENTS
    w, buf = w.clone(), torch.zeros_like(w)
    for g in grads:
        buf = mu * buf + g
        u = g + mu * buf
        x = u.T if u.shape[0] > u.shape[1] else u
        x = x / (torch.linalg.matrix_norm(x) + 1e-7)
        for _ in range(5):
            x = a * x + b * (x @ x.T) @ x + c * (x @ x.T) @ (x @ x.T) @ x
        o = x.T if u.shape[0] > u.shape[1] else x
        w = w * (1 - lr * wd) - lr * max(1.0, w.shape[0] / w.shape[1]) ** 0.5 * o
    return w


@pytest.mark.parametrize("shape", [(6, 10), (10, 6)])
def test_muon_step_equals_the_equations(shape: tuple[int, int]) -> None:
    gen = torch.Generator().manual_seed(3)
    w0 = torch.randn(*shape, generator=gen)
    grads = [torch.randn(*shape, generator=gen) for _ in range(3)]
    p = nn.Parameter(w0.clone())
    opt = Muon([{"params": [p], "use_muon": True}], lr=0.05, momentum=0.9, weight_decay=0.1)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    want = _reference_muon(w0, grads, lr=0.05, mu=0.9, wd=0.1)
    assert torch.allclose(p.detach(), want, atol=1e-5), (p - want).abs().max()
    assert not torch.allclose(p.detach(), w0, atol=1e-2)  # it moved


def test_adamw_groups_equal_torch_adamw() -> None:
    gen = torch.Generator().manual_seed(4)
    w0 = torch.randn(5, 3, generator=gen)
    ours, theirs = nn.Parameter(w0.clone()), nn.Parameter(w0.clone())
    opt = Muon([{"params": [ours], "use_muon": False}], adam_lr=0.01, betas=(0.9, 0.95),
               eps=1e-8, weight_decay=0.1)  # fmt: skip
    ref = torch.optim.AdamW([theirs], lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for _ in range(4):
        g = torch.randn(5, 3, generator=gen)
        ours.grad, theirs.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
    assert torch.allclose(ours, theirs, atol=1e-6)


TINY = GPTConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_seq_len=8,
                 dropout=0.1, eos_id=None, tie_output=False)  # fmt: skip
CONFIG = TrainConfig(steps=8, batch_size=4, grad_accum=2, schedule="wsd", warmup=2, lr=1e-2,
                     optimizer="muon", muon_lr=0.02, weight_decay=0.1, clip_grad_norm=1.0,
                     eval_every=3, progress=False, log_every=1)  # fmt: skip


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest() -> None:
    torch.manual_seed(0)
    model = GPT(TINY)
    hidden = {id(p) for p in muon_parameters(model)}
    names = {n for n, p in model.named_parameters() if id(p) in hidden}
    assert names and all(p.ndim == 2 for n, p in model.named_parameters() if n in names)
    assert not any("embed" in n or "lm_head" in n or "norm" in n for n in names), names
    optimizer = build_optimizer(model, CONFIG)
    assert isinstance(optimizer, Muon)
    in_muon = {id(p) for g in optimizer.param_groups if g["use_muon"] for p in g["params"]}
    assert in_muon == hidden
    assert id(model.lm_head.weight) not in in_muon
    every = [p for g in optimizer.param_groups for p in g["params"]]
    assert len(every) == len({id(p) for p in every}) == len(list(model.parameters()))
    rates = {g["use_muon"]: g["lr"] for g in optimizer.param_groups}
    assert rates == {True: 0.02, False: 1e-2}
    assert {g["ns_steps"] for g in optimizer.param_groups if g["use_muon"]} == {5}


def test_muon_ns_steps_reaches_the_iteration() -> None:
    # muon_ns_steps=3: one update equals the equations with three Newton-Schulz iterations,
    # and differs from the default five
    torch.manual_seed(0)
    model = GPT(TINY)
    config = dataclasses.replace(CONFIG, muon_ns_steps=3, weight_decay=0.0)
    optimizer = build_optimizer(model, config)
    assert {g["ns_steps"] for g in optimizer.param_groups if g["use_muon"]} == {3}
    weight = muon_parameters(model)[0]
    before = weight.detach().clone()
    grad = torch.randn(weight.shape, generator=torch.Generator().manual_seed(2))
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    weight.grad = grad.clone()
    optimizer.step()
    m, n = weight.shape
    scale = math.sqrt(max(1.0, m / n))
    # nesterov: the update is g + mu * buf, with buf = g after the first step
    update = grad + 0.95 * grad
    expected = before - 0.02 * scale * newton_schulz(update, 3)
    torch.testing.assert_close(weight.detach(), expected, rtol=0, atol=1e-6)
    five = before - 0.02 * scale * newton_schulz(update, 5)
    assert (weight.detach() - five).abs().max() > 1e-4


def _trainer(run_dir: Path, config: TrainConfig = CONFIG) -> Trainer:
    torch.manual_seed(0)
    stream = TokenStream(torch.randint(11, (2000,), generator=torch.Generator().manual_seed(1)))
    return Trainer(GPT(TINY), CausalLMObjective(stream, block_size=8), config, run_dir=run_dir)


@pytest.mark.parametrize(
    "fields",
    [{}, {"muon_ns_dtype": "bfloat16", "muon_ns_steps": 3, "precision": "bf16-mixed"}],
    ids=["float32", "bfloat16"],
)
def test_resume_with_muon_is_bitwise(tmp_path: Path, fields: dict[str, object]) -> None:
    config = dataclasses.replace(CONFIG, **fields)  # type: ignore[arg-type]
    full = _trainer(tmp_path / "full", config)
    full_result = full.fit()
    first = _trainer(tmp_path / "split", config).fit(until=4)
    torch.manual_seed(123)  # a fresh process's RNG: resume must restore the saved one
    resumed = _trainer(tmp_path / "split", config)
    second = resumed.fit(resume=True)
    assert second.step == 8
    assert first.losses + second.losses == full_result.losses
    for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values(),
                    strict=True):  # fmt: skip
        assert torch.equal(a, b)
    buffers = [s["momentum_buffer"] for s in resumed.optimizer.state.values()
               if "momentum_buffer" in s]  # fmt: skip
    assert buffers and all(float(b.abs().sum()) > 0 for b in buffers)


def test_bad_muon_options_name_the_value() -> None:
    with pytest.raises(ValueError, match=r"shape \(4,\); Muon updates matrices"):
        Muon([{"params": [nn.Parameter(torch.zeros(4))], "use_muon": True}])
    with pytest.raises(ValueError, match="momentum must be in"):
        Muon([nn.Parameter(torch.zeros(2, 2))], momentum=1.0)
    with pytest.raises(ValueError, match="muon_momentum must be in"):
        TrainConfig(optimizer="muon", muon_momentum=-0.1)
    with pytest.raises(ValueError, match="muon_ns_steps must be >= 1, got 0"):
        TrainConfig(optimizer="muon", muon_ns_steps=0)
    with pytest.raises(ValueError, match="muon_lr must be"):
        TrainConfig(optimizer="muon", muon_lr=0.0)
    with pytest.raises(ValueError, match="FSDP shards them"):
        TrainConfig(optimizer="muon", fsdp=True)


def test_a_stack_is_orthogonalised_matrix_by_matrix() -> None:
    gen = torch.Generator().manual_seed(5)
    stack = torch.randn(3, 8, 20, generator=gen) * torch.tensor([0.1, 1.0, 30.0])[:, None, None]
    batched = newton_schulz(stack)
    for i in range(3):
        assert torch.allclose(batched[i], newton_schulz(stack[i]), atol=1e-6)
    tall = newton_schulz(stack.mT)
    assert torch.allclose(tall, batched.mT, atol=1e-6)
