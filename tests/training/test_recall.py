"""The synthetic recall tasks as a trainer objective: it trains any causal LM through Trainer
(the tasks' generator: tests/data/test_recall.py)."""

from __future__ import annotations

import torch

import attnlab
from attnlab.data.recall import RecallTask
from attnlab.training import TrainConfig, Trainer
from attnlab.training.recall import RecallObjective, recall_accuracy


def test_objective_trains_any_lm() -> None:
    task = RecallTask(kind="copy", distance=3, length=8)
    config = TrainConfig(steps=2, batch_size=8, schedule="constant", lr=1e-3, progress=False,
                         optimizer="adamw", label_smoothing=0.0, eval_batches=2)  # fmt: skip
    for name in ("mamba-tiny", "lstm-tiny"):
        torch.manual_seed(0)
        model = attnlab.build_model(name, vocab_size=task.vocab_size)
        result = Trainer(model, RecallObjective(task), config).fit()
        assert result.step == 2 and len(result.losses) == 2
        assert 0.0 <= recall_accuracy(model, task, n=64) <= 1.0
