"""Training (floor 4): the one trainer and everything it runs on.

- :class:`Trainer` with :class:`TrainConfig`: accumulation, clipping, schedules (§5.3), label
  smoothing (§5.4), evaluation with callbacks, early stopping, the best model, §6.1 checkpoint
  averaging, budgets in steps, minutes and epochs, bitwise-resumable checkpoints with fallback,
  DDP/FSDP2 under torchrun (:mod:`~attnlab.training.distributed`);
- the run directory (:mod:`~attnlab.training.rundir`), trainer state
  (:mod:`~attnlab.training.state`) and metrics (:mod:`~attnlab.training.metrics`): one layout
  and one schema for every recipe;
- objectives and resumable data streams (:mod:`~attnlab.training.objectives`) over the data
  sets of :mod:`attnlab.data` (text, images, CIFAR-10, the synthetic tasks);
- the recipes behind ``attnlab train <recipe>`` (:mod:`~attnlab.training.recipes`).

``ArrayImageDataset``, ``TokenStream``, ``ReverseTask``, ``load_digits`` and ``load_text`` moved
to :mod:`attnlab.data`, ``find_data_file`` is :mod:`attnlab.io`'s (issue 48): they still resolve
here for one release, with a ``DeprecationWarning`` naming the new path.
"""

from typing import Any

import attnlab.io as _io
from attnlab.data import images as _images
from attnlab.data import reverse as _reverse
from attnlab.data import text as _text
from attnlab.training._moved import Moved, moved
from attnlab.training.checkpointing import average_checkpoints
from attnlab.training.config import TrainConfig
from attnlab.training.losses import label_smoothed_cross_entropy
from attnlab.training.metrics import MetricsLogger, read_metrics
from attnlab.training.objectives import (
    CausalLMObjective,
    ClassificationObjective,
    EpochStream,
    MaskedLMObjective,
    Objective,
    SampledStream,
    Seq2SeqBatch,
    Seq2SeqObjective,
)
from attnlab.training.optim import build_optimizer, build_scheduler, parameter_groups
from attnlab.training.recipes import RECIPES, load_run, prepare
from attnlab.training.rundir import RunDir, RunDirError, latest_checkpoint
from attnlab.training.schedules import (
    SCHEDULES,
    constant,
    lambda_lr,
    make_schedule,
    noam,
    warmup_cosine,
)
from attnlab.training.state import load_training_state, read_training_state
from attnlab.training.trainer import (
    Callback,
    FitResult,
    NonFiniteLossError,
    Trainer,
    TrainingInterrupted,
    clip_gradients,
)

# names that moved to attnlab.data (issue 48): the old path warns for one release
_MOVED: Moved = {
    "ArrayImageDataset": _images,
    "ReverseTask": _reverse,
    "TokenStream": _text,
    "find_data_file": _io,
    "load_digits": _images,
    "load_text": _text,
}


def __getattr__(name: str) -> Any:
    return moved(__name__, name, _MOVED)


__all__ = [
    "RECIPES",
    "SCHEDULES",
    "Callback",
    "CausalLMObjective",
    "ClassificationObjective",
    "EpochStream",
    "FitResult",
    "MaskedLMObjective",
    "MetricsLogger",
    "NonFiniteLossError",
    "Objective",
    "RunDir",
    "RunDirError",
    "SampledStream",
    "Seq2SeqBatch",
    "Seq2SeqObjective",
    "TrainConfig",
    "Trainer",
    "TrainingInterrupted",
    "average_checkpoints",
    "build_optimizer",
    "build_scheduler",
    "clip_gradients",
    "constant",
    "label_smoothed_cross_entropy",
    "lambda_lr",
    "latest_checkpoint",
    "load_run",
    "load_training_state",
    "make_schedule",
    "noam",
    "parameter_groups",
    "prepare",
    "read_metrics",
    "read_training_state",
    "warmup_cosine",
]
