"""The synthetic recall tasks as a trainer objective: one scored position, the query.

:class:`RecallObjective` is a :class:`~attnlab.training.objectives.Objective` over a
:class:`~attnlab.data.recall.RecallTask` (the task, its vocabulary and its sample generator live
in :mod:`attnlab.data.recall`): the trainer trains any causal LM on it (``model(x) -> (logits,
_)``), and its validation accuracy is the task's accuracy (:func:`recall_accuracy`). Every batch
is drawn from the generator it is given (the data position).

Shapes: B batch, T sequence length, V vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from attnlab.data import recall as _recall
from attnlab.data.common import Split
from attnlab.data.recall import IGNORE
from attnlab.training._moved import Moved, moved
from attnlab.training.losses import label_smoothed_cross_entropy
from attnlab.training.objectives import LossTerms, SampledObjective

# names that moved to attnlab.data.recall (issue 48): the old path warns for one release
_MOVED: Moved = {"QUERY": _recall, "RecallTask": _recall}


def __getattr__(name: str) -> Any:
    return moved(__name__, name, _MOVED)


class RecallObjective(SampledObjective):
    """The trainer's view of a :class:`~attnlab.data.recall.RecallTask` (one scored position).

    Training and validation batches are fresh draws of the task (it has no fixed data set): the
    training stream's generator is its data position, the validation batches come from their own
    fixed seed.
    """

    def __init__(self, task: _recall.RecallTask) -> None:
        self.task = task

    def sample(self, split: Split, batch_size: int, generator: torch.Generator) -> Any:
        return self.task.sample(batch_size, generator)

    def count(self, batch: Any) -> int:
        return int((batch[1] != IGNORE).sum())

    def n_tokens(self, batch: Any) -> int:
        return int(batch[0].numel())

    def loss(self, model: nn.Module, batch: Any, *, label_smoothing: float) -> LossTerms:
        x, y = batch
        logits = model(x)[0][:, -1].float()  # (B, V): only the query position is scored
        target = y[:, -1]
        loss_sum = label_smoothed_cross_entropy(
            logits, target, epsilon=label_smoothing, ignore_index=IGNORE, reduction="sum"
        )
        correct = int((logits.detach().argmax(-1) == target).sum())
        return LossTerms(loss_sum, int(target.numel()), correct)


@torch.no_grad()
def recall_accuracy(
    model: nn.Module,
    task: _recall.RecallTask,
    *,
    n: int = 1024,
    batch_size: int = 256,
    seed: int = 0,
) -> float:
    """The fraction of ``n`` fresh sequences (seeded) that ``model`` answers right (eval mode)."""
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    objective, correct, seen = RecallObjective(task), 0, 0
    while seen < n:
        batch = task.sample(min(batch_size, n - seen), generator)
        correct += objective.loss(model, batch, label_smoothing=0.0).correct
        seen += batch[0].shape[0]
    model.train(was_training)
    return correct / seen


__all__ = ["RecallObjective", "recall_accuracy"]
