"""Mixture-of-experts through the trainer: the objective's aux loss reaches the gradient (weighted
per micro-batch) but not val_loss, the logged load / dropped fraction equal what the layers
routed, the aux-loss-free bias update follows the step's counts, and a resumed MoE run is
bitwise the uninterrupted one (recipe path: shakespeare-char with MoE keys)."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.data.text import TokenStream
from attnlab.layers.moe import MoEFeedForward
from attnlab.layers.moe_stats import collect_moe_stats
from attnlab.models import GPT, GPTConfig
from attnlab.training.config import TrainConfig
from attnlab.training.metrics import TIMING_KEYS
from attnlab.training.objectives import CausalLMObjective
from attnlab.training.recipes import prepare
from attnlab.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_data = pytest.mark.skipif(
    not (DATA / "tinyshakespeare.txt").is_file(), reason="shared data missing"
)

MOE = GPTConfig(vocab_size=13, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_seq_len=8,
                dropout=0.0, eos_id=None, n_experts=4, top_k=2, moe_d_ff=24,
                aux_loss_weight=0.1, z_loss_weight=0.01)  # fmt: skip


def _objective() -> CausalLMObjective:
    stream = TokenStream(torch.randint(13, (3000,), generator=torch.Generator().manual_seed(1)))
    return CausalLMObjective(stream, block_size=8)


def _trainer(config: GPTConfig, train: TrainConfig, run_dir: Path | None = None) -> Trainer:
    torch.manual_seed(0)
    return Trainer(GPT(config), _objective(), train, run_dir=run_dir)


def test_aux_loss_is_trained_on_weighted_per_micro_batch_and_not_validated() -> None:
    train = TrainConfig(steps=1, batch_size=3, grad_accum=2, optimizer="sgd", lr=0.1,
                        schedule="constant", warmup=0, label_smoothing=0.0, progress=False,
                        eval_batches=1)  # fmt: skip
    trainer = _trainer(MOE, train)
    reference = copy.deepcopy(trainer.module)
    objective = _objective()
    stream = objective.train_stream(train.batch_size, train.seed)
    micro = [stream.next_batch() for _ in range(2)]
    total = sum(objective.count(b) for b in micro)
    loss_sum, aux_terms = 0.0, []
    for x, y in micro:  # written out: Σ CE / total + Σ_i aux_i · count_i / total
        logits, _ = reference(x)
        ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")
        aux = collect_moe_stats(reference).loss
        aux_terms.append(float(aux.detach()) * y.numel() / total)
        (ce / total + aux * (y.numel() / total)).backward()
        loss_sum += float(ce.detach()) / total
    loss, _, _ = trainer.train_step()
    assert loss == pytest.approx(loss_sum, rel=1e-6)  # the logged loss is the task's
    assert trainer.last_aux_loss == pytest.approx(sum(aux_terms), rel=1e-6)
    assert sum(aux_terms) > 0
    for (name, p), q in zip(trainer.module.named_parameters(), reference.parameters(),
                            strict=True):  # fmt: skip
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-5, msg=name)
    # val_loss is the cross-entropy alone
    (x, y), = trainer.val_batches()[:1]  # fmt: skip
    with torch.no_grad():
        logits, _ = trainer.module.eval()(x)
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
    assert trainer.evaluate(1)["val_loss"] == pytest.approx(float(ce), rel=1e-6)


def _lines(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_logged_load_and_dropped_fraction_are_what_the_layers_routed(tmp_path: Path) -> None:
    config = dataclasses.replace(MOE, capacity_factor=0.75)
    train = TrainConfig(steps=3, batch_size=2, optimizer="adamw", lr=1e-2, schedule="constant",
                        warmup=0, progress=False, log_every=1, eval_batches=1)  # fmt: skip
    trainer = _trainer(config, train, tmp_path)
    seen: list[dict[str, list[int]]] = []
    original = trainer.train_step

    def spy() -> Any:
        out = original()
        stats = collect_moe_stats(trainer.module)  # one micro-batch: its stats are the step's
        seen.append({n: c.tolist() for n, c in stats.tokens_per_expert.items()})
        return out

    trainer.train_step = spy  # type: ignore[method-assign]
    trainer.fit()
    train_lines = [r for r in _lines(tmp_path) if r["split"] == "train"]
    assert [r["step"] for r in train_lines] == [1, 2, 3]
    n_tokens = train.batch_size * config.max_seq_len
    cap = math.ceil(0.75 * n_tokens * config.top_k / config.n_experts)
    for record, counts in zip(train_lines, seen, strict=True):
        assert record["moe_load"] == counts
        assert all(sum(c) == n_tokens * config.top_k for c in counts.values())
        dropped = sum(max(0, v - cap) for c in counts.values() for v in c)
        expected = dropped / (len(counts) * n_tokens * config.top_k)
        assert record["moe_dropped_fraction"] == pytest.approx(expected)
        ratio = max(max(c) / (sum(c) / len(c)) for c in counts.values())
        assert record["moe_max_load_ratio"] == pytest.approx(ratio)
        assert record["moe_balance_loss"] > 0 and record["moe_z_loss"] > 0
        assert record["aux_loss"] > 0
    assert any(r["moe_dropped_fraction"] > 0 for r in train_lines)  # the capacity bit


def test_dense_runs_log_no_moe_fields(tmp_path: Path) -> None:
    dense = dataclasses.replace(MOE, n_experts=0)
    train = TrainConfig(steps=1, batch_size=2, progress=False, eval_batches=1, warmup=0,
                        schedule="constant", lr=1e-3)  # fmt: skip
    _trainer(dense, train, tmp_path).fit()
    assert not any(k.startswith(("moe_", "aux")) for r in _lines(tmp_path) for k in r)


def test_bias_balancing_follows_the_step_counts_summed_over_micro_batches() -> None:
    config = dataclasses.replace(MOE, router_bias_balancing=True, router_bias_rate=0.05)
    train = TrainConfig(steps=1, batch_size=2, grad_accum=2, optimizer="adamw", lr=1e-3,
                        schedule="constant", warmup=0, progress=False)  # fmt: skip
    trainer = _trainer(config, train)
    layers = [m for m in trainer.module.modules() if isinstance(m, MoEFeedForward)]
    assert all(m.balance_bias is not None and not m.balance_bias.any() for m in layers)
    trainer.train_step()
    fields = trainer.moe.fields(trainer.dist)  # type: ignore[union-attr]
    for name, layer in zip(fields["moe_load"], layers, strict=True):
        load = torch.tensor(fields["moe_load"][name], dtype=torch.float32)
        assert load.sum() == 2 * train.batch_size * config.max_seq_len * config.top_k
        expected = 0.05 * torch.sign(load.mean() - load)
        assert torch.equal(layer.balance_bias, expected), name


@needs_data
def test_resume_of_an_moe_recipe_run_is_exact(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("ATTNLAB_DATA", str(DATA))
    overrides = dict(steps=6, warmup=1, eval_every=3, eval_batches=1, d_model=16, n_heads=2,
                     n_layers=2, d_ff=32, max_seq_len=16, batch_size=2, grad_accum=2,
                     progress=False, log_every=1, checkpoint_every=3, n_experts=4, top_k=2,
                     moe_every=(1,), capacity_factor=1.0, z_loss_weight=0.001,
                     router_bias_balancing=True, dropout=0.1)  # fmt: skip

    def run(path: Path, *, until: int | None = None, resume: bool = False) -> tuple[Any, Any]:
        p = prepare("shakespeare-char", overrides)
        trainer = Trainer(p.model, p.objective, p.train, run_dir=path, d_model=16)
        return trainer, trainer.fit(until=until, resume=resume)

    full, full_result = run(tmp_path / "full")
    _, first = run(tmp_path / "split", until=3)
    assert first.step == 3
    torch.manual_seed(123)  # a fresh process has other RNG state: resume must restore it
    split, second = run(tmp_path / "split", resume=True)
    assert second.step == 6
    assert first.losses + second.losses == full_result.losses  # bitwise
    for (name, a), b in zip(full.module.state_dict().items(), split.module.state_dict().values(),
                            strict=True):  # fmt: skip
        assert torch.equal(a, b), name
    biases = [v for n, v in full.module.state_dict().items() if n.endswith("balance_bias")]
    assert len(biases) == 1 and biases[0].abs().sum() > 0  # layer 1 only; it moved

    def comparable(run: Path) -> list[dict[str, Any]]:
        skip = TIMING_KEYS
        return [{k: v for k, v in r.items() if k not in skip} for r in _lines(run)]

    full_lines, split_lines = comparable(tmp_path / "full"), comparable(tmp_path / "split")
    assert split_lines == full_lines
    assert sum("moe_load" in r for r in full_lines) == 6
