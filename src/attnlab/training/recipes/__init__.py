"""Training recipes: data + objective (+ evaluation callbacks) + defaults that learn real data.

Every recipe runs on the one :class:`~attnlab.training.Trainer` and writes the same run
directory (:mod:`attnlab.training.rundir`):

- ``reverse`` (:mod:`~attnlab.training.recipes.reverse`): the first end-to-end run;
- ``shakespeare-char``, ``shakespeare-mlm`` (:mod:`~attnlab.training.recipes.text`);
- ``shakespeare-bert`` (:mod:`~attnlab.training.recipes.sentence_pairs`): MLM + next-sentence
  prediction on line pairs;
- ``digits`` (:mod:`~attnlab.training.recipes.images`);
- ``cifar10`` (:mod:`~attnlab.training.recipes.cifar10`): ResNet, ViT or CCT on CIFAR-10;
- ``recall`` (:mod:`~attnlab.training.recipes.recall`): long-range recall for any family;
- ``translate`` (:mod:`~attnlab.training.recipes.translation`): Multi30k, the paper's task;
- ``shakespeare-reward``, ``shakespeare-dpo`` (:mod:`~attnlab.training.recipes.preference`):
  a reward model and DPO on preference pairs judged on a trained LM's samples.

:func:`prepare` makes one concrete (with ``--key=value`` overrides), :func:`load_run` rebuilds a
trained run; a new task is a new module here registering a :class:`Recipe` in :data:`RECIPES`.
"""

from attnlab.training.recipes import (
    cifar10,
    images,
    preference,
    recall,
    reverse,
    sentence_pairs,
    text,
    translation,
)
from attnlab.training.recipes.base import (
    RECIPES,
    Data,
    Prepared,
    Recipe,
    get_recipe,
    load_run,
    prepare,
    save_run_files,
)
from attnlab.training.recipes.runner import train_recipe

__all__ = [
    "RECIPES",
    "Data",
    "Prepared",
    "Recipe",
    "cifar10",
    "get_recipe",
    "images",
    "load_run",
    "preference",
    "prepare",
    "recall",
    "reverse",
    "save_run_files",
    "sentence_pairs",
    "text",
    "train_recipe",
    "translation",
]
