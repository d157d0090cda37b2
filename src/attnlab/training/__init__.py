"""Training: synthetic tasks, learning-rate schedules (§5.3), label smoothing (§5.4), a minimal
loop with exact-match evaluation, and atomic safetensors checkpoints; and the full trainer
(:class:`Trainer` with :class:`TrainConfig`: optimizer groups, accumulation, clipping,
evaluation, early stopping, resumable checkpoints, metrics), data and tokenizers, and the recipes
behind ``attnlab train <recipe>``. The foundation's minimal loop (:func:`train`, configured by
:class:`LoopConfig`) drives ``attnlab train reverse``.
"""

from attnlab.pretrained import load_attnlab, load_config, save_pretrained
from attnlab.training.config import TrainConfig
from attnlab.training.data import ArrayImageDataset, TokenStream, load_digits, load_text
from attnlab.training.loop import LoopConfig, TrainResult, evaluate_exact_match, train
from attnlab.training.losses import label_smoothed_cross_entropy
from attnlab.training.metrics import MetricsLogger
from attnlab.training.objectives import (
    CausalLMObjective,
    ClassificationObjective,
    MaskedLMObjective,
    Objective,
)
from attnlab.training.optim import build_optimizer, build_scheduler, parameter_groups
from attnlab.training.recipes import RECIPES, load_run, prepare
from attnlab.training.schedules import (
    SCHEDULES,
    constant,
    lambda_lr,
    make_schedule,
    noam,
    warmup_cosine,
)
from attnlab.training.state import (
    latest_checkpoint,
    load_training_state,
    save_training_checkpoint,
)
from attnlab.training.tasks import ReverseTask, Seq2SeqBatch
from attnlab.training.tokenizers import BPETokenizer, CharTokenizer, load_tokenizer
from attnlab.training.trainer import FitResult, Trainer, clip_gradients

__all__ = [
    "RECIPES",
    "SCHEDULES",
    "ArrayImageDataset",
    "BPETokenizer",
    "CausalLMObjective",
    "CharTokenizer",
    "ClassificationObjective",
    "FitResult",
    "LoopConfig",
    "MaskedLMObjective",
    "MetricsLogger",
    "Objective",
    "ReverseTask",
    "Seq2SeqBatch",
    "TokenStream",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "build_optimizer",
    "build_scheduler",
    "clip_gradients",
    "constant",
    "evaluate_exact_match",
    "label_smoothed_cross_entropy",
    "lambda_lr",
    "latest_checkpoint",
    "load_attnlab",
    "load_config",
    "load_digits",
    "load_run",
    "load_text",
    "load_tokenizer",
    "load_training_state",
    "make_schedule",
    "noam",
    "parameter_groups",
    "prepare",
    "save_pretrained",
    "save_training_checkpoint",
    "train",
    "warmup_cosine",
]
