"""Recipe ``recall``: the synthetic long-range tasks, the same for every family.

``attnlab train recall --arch mamba --distance 64`` trains one of ``shakespeare-char``'s
architectures (``classic``, ``modern``: the baby GPTs; ``mamba``, ``lstm``, ``gru``: the families
before and after attention, at the same parameter count) on a task of
:mod:`attnlab.data.recall`, selective copy (``--kind copy``) or associative recall (``--kind
associative``), whose answer is the token ``distance`` positions back. Its validation accuracy is
the task's (chance: ``1/n_symbols``). The GPTs' context is the task's length; the vocabulary is
the task's (65 by default, as Tiny Shakespeare's characters). Training: AdamW 1e-3, cosine with
100 warmup steps (a tenth of the steps in a run of at most 100), batch 16, 1000 steps.

Every batch is a fresh draw of the task from the training stream's generator (its position in a
checkpoint), so a resumed run continues exactly; validation draws its batches from a fixed seed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from attnlab.config import Config, check_positive
from attnlab.data.recall import RecallTask
from attnlab.tokenizers import Tokenizer
from attnlab.training.config import TrainConfig
from attnlab.training.objectives import Objective
from attnlab.training.recall import RecallObjective
from attnlab.training.recipes.base import RECIPES, Data, Recipe
from attnlab.training.recipes.text import RECURRENT_ARCHS, arch_config


@dataclass(frozen=True, kw_only=True)
class RecallOptions(Config):
    """The task (:class:`~attnlab.data.recall.RecallTask`'s fields) and the architecture."""

    kind: Literal["copy", "associative"] = "copy"
    distance: int = 16
    n_symbols: int = 16
    n_pairs: int = 4  # associative only
    length: int | None = None  # None: distance + 2·n_pairs + 2
    vocab_size: int = 65
    arch: Literal["classic", "modern", "mamba", "lstm", "gru"] = "classic"

    def validate(self) -> None:
        super().validate()
        check_positive(distance=self.distance, n_symbols=self.n_symbols, n_pairs=self.n_pairs,
                       length=self.length, vocab_size=self.vocab_size)  # fmt: skip
        self.task()  # the task's own rules (alphabet sizes, length)

    def task(self) -> RecallTask:
        """The :class:`~attnlab.data.recall.RecallTask` these options describe.

        Raises:
            ValueError: for options the task refuses (see :class:`RecallTask`).
        """
        return RecallTask(kind=self.kind, distance=self.distance, vocab_size=self.vocab_size,
                          n_symbols=self.n_symbols, n_pairs=self.n_pairs,
                          length=self.length)  # fmt: skip


def _model_config(options: RecallOptions, data: Data | None) -> Any:
    config = arch_config(options.arch, options.vocab_size)
    if options.arch in RECURRENT_ARCHS:
        return config
    return dataclasses.replace(config, max_seq_len=options.task().seq_len)


def _data(options: RecallOptions, tokenizer: Tokenizer | None, train: TrainConfig) -> Data:
    task = options.task()
    info = {"task": f"{task.kind} at distance {task.distance}", "length": task.seq_len,
            "chance": 1 / task.n_symbols}  # fmt: skip
    return Data(task, None, info)


def _objective(options: Any, config: Any, data: Data, train: TrainConfig) -> Objective:
    return RecallObjective(data.value)


RECALL_TRAIN = TrainConfig(
    steps=1000, batch_size=16, optimizer="adamw", lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1,
    schedule="cosine", warmup=100, min_lr_ratio=0.1, label_smoothing=0.0, clip_grad_norm=1.0,
    eval_every=250, eval_batches=8, checkpoint_every=500, best_metric="val_accuracy",
)  # fmt: skip

RECALL = Recipe(
    "recall",
    "long-range recall (selective copy, associative recall at distance d) for any family",
    RecallOptions(), RECALL_TRAIN, _model_config, _data, _objective,
    run_name=lambda o: f"recall-{o.kind}-d{o.distance}-{o.arch}",
    derived=("vocab_size", "max_seq_len", "cell"),
    variants=(RecallOptions(arch="mamba"), RecallOptions(arch="lstm")),  # gru: lstm's fields
    memory_seq_len=lambda o, m: o.task().seq_len,
)  # fmt: skip
RECIPES.add(RECALL.name, RECALL)

__all__ = ["RECALL_TRAIN", "RecallOptions"]
