"""Training: synthetic tasks, learning-rate schedules (§5.3), label smoothing (§5.4), a minimal
loop with exact-match evaluation, and atomic safetensors checkpoints."""

from attnlab.training.checkpoint import load_checkpoint, load_config, save_checkpoint
from attnlab.training.loop import TrainConfig, TrainResult, evaluate_exact_match, train
from attnlab.training.losses import label_smoothed_cross_entropy
from attnlab.training.schedules import (
    SCHEDULES,
    constant,
    lambda_lr,
    make_schedule,
    noam,
    warmup_cosine,
)
from attnlab.training.tasks import ReverseTask, Seq2SeqBatch

__all__ = [
    "SCHEDULES",
    "ReverseTask",
    "Seq2SeqBatch",
    "TrainConfig",
    "TrainResult",
    "constant",
    "evaluate_exact_match",
    "label_smoothed_cross_entropy",
    "lambda_lr",
    "load_checkpoint",
    "load_config",
    "make_schedule",
    "noam",
    "save_checkpoint",
    "train",
    "warmup_cosine",
]
