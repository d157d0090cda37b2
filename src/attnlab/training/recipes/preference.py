"""Recipes learning from preferences on a trained language model (RLHF in miniature).

- ``shakespeare-reward``: a reward model (the base model's body and a scalar head,
  :class:`~attnlab.training.preference.RewardModel`) learns preference pairs with the
  Bradley-Terry loss; ``val_accuracy`` is the fraction of validation pairs it ranks right.
- ``shakespeare-dpo``: the policy, initialised from the base model, learns preference pairs
  with DPO (``beta``) against a frozen copy of the base model; ``val_accuracy`` is the implicit
  reward accuracy, and each evaluation samples the policy on the validation prompts for
  ``val_rate`` (the property's rate), ``val_kl`` (KL to the reference per token, on those
  samples) and ``val_margin`` (the mean implicit reward margin on the validation pairs).

Both start from a run of a text language model (``--base RUN_DIR``, e.g. a ``shakespeare-char``
run): its model samples ``samples_per_prompt`` completions of ``completion_len`` characters for
``prompts`` random windows of ``prompt_len`` characters of the training text; a measurable
``property`` of each completion (``no-e``: it has no letter e; ``question``: it has a question
mark) picks a chosen and a rejected one per prompt (:func:`attnlab.training.preference.build_pairs`,
seeded by ``pair_seed``); the last ``val_pairs`` pairs are the validation set. The model is the
base run's (its fields cannot be overridden); the run directory holds the weights (the policy,
or the reward model) and the base run's tokenizer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnlab.config import Config, check_positive
from attnlab.models.gpt import GPTConfig
from attnlab.pretrained import load_weights
from attnlab.tokenizers import Tokenizer
from attnlab.training.config import TrainConfig
from attnlab.training.objectives import Objective
from attnlab.training.preference import (
    PROPERTIES,
    DPOObjective,
    PreferencePairs,
    RewardModel,
    RewardObjective,
    build_pairs,
    frozen_copy,
    property_rate,
    sample_completions,
    sampled_kl,
)
from attnlab.training.recipes.base import RECIPES, Data, Recipe, load_run
from attnlab.training.recipes.text import arch_config
from attnlab.training.rundir import latest_checkpoint
from attnlab.training.trainer import Callback, Trainer


@dataclass(frozen=True, kw_only=True)
class PreferenceOptions(Config):
    """Where the pairs come from (see the module docstring)."""

    base: str | None = None  # the run directory of the base language model (required)
    property: str = "no-e"  # what a chosen completion has: no-e, question
    prompt_len: int = 32
    completion_len: int = 24
    prompts: int = 1024
    samples_per_prompt: int = 8
    val_pairs: int = 64
    pair_seed: int = 0

    def validate(self) -> None:
        super().validate()
        PROPERTIES.get(self.property)  # names the valid ones
        check_positive(prompt_len=self.prompt_len, completion_len=self.completion_len,
                       prompts=self.prompts, val_pairs=self.val_pairs)  # fmt: skip
        if self.samples_per_prompt < 2:
            raise ValueError(f"samples_per_prompt must be >= 2, got {self.samples_per_prompt}")


@dataclass(frozen=True, kw_only=True)
class DPOOptions(PreferenceOptions):
    """:class:`PreferenceOptions` and DPO's β."""

    beta: float = 0.1

    def validate(self) -> None:
        super().validate()
        check_positive(beta=self.beta)


def _base_dir(options: PreferenceOptions) -> str:
    if not options.base:
        raise ValueError(
            "this recipe needs --base RUN_DIR: the run directory of a trained language model "
            "(e.g. attnlab train shakespeare-char --out runs/base)"
        )
    return options.base


def _pair_data(options: Any, tokenizer: Tokenizer | None, train: TrainConfig) -> Data:
    """Sample the base model and judge its completions into train/val pairs."""
    base = load_run(_base_dir(options))
    stream, tok = base.data.value, base.tokenizer
    if tok is None or not callable(getattr(stream, "blocks", None)):
        raise ValueError(
            f"{options.base} is a {base.recipe.name!r} run: the base must be a text language "
            "model with a tokenizer (e.g. shakespeare-char)"
        )
    context = getattr(base.model_config, "max_seq_len", None)
    if context is not None and options.prompt_len + options.completion_len > context:
        raise ValueError(
            f"prompt_len + completion_len = {options.prompt_len + options.completion_len} "
            f"exceeds the base model's max_seq_len={context}"
        )
    generator = torch.Generator().manual_seed(options.pair_seed)
    prompts = stream.blocks("train", options.prompts, options.prompt_len, generator)  # (N, P)
    pairs, info = build_pairs(
        base.model, prompts, tok.decode, options.property, length=options.completion_len,
        samples_per_prompt=options.samples_per_prompt, generator=generator,
    )  # fmt: skip
    if len(pairs) <= options.val_pairs:
        raise ValueError(
            f"{len(pairs)} pairs are too few for val_pairs={options.val_pairs} (the property's "
            f"rate was {info['rate']:.3f}): raise prompts or samples_per_prompt"
        )
    n_train = len(pairs) - options.val_pairs
    value = {
        "train": pairs.select(slice(0, n_train)), "val": pairs.select(slice(n_train, None)),
        "base": base.model, "base_config": base.model_config, "decode": tok.decode,
    }  # fmt: skip
    record = {"base": str(options.base), "base_checkpoint": str(base.checkpoint),
              "base_rate": info["rate"], "samples": info["samples"], "pairs": info["pairs"],
              "train_pairs": n_train}  # fmt: skip
    return Data(value, tok, record)


def _model_config(options: Any, data: Data | None) -> Any:
    if data is not None:
        return data.value["base_config"]
    return arch_config("classic", 65)  # the fields shown in the help (all derived)


def _base_weights(options: Any, model: nn.Module) -> nn.Module:
    checkpoint = latest_checkpoint(_base_dir(options))
    if checkpoint is None:
        raise FileNotFoundError(f"no checkpoint in the base run {options.base}")
    load_weights(model, checkpoint)
    return model


def _reward_model(options: Any, model: nn.Module) -> nn.Module:
    return RewardModel(_base_weights(options, model))


class PolicyEvaluation(Callback):
    """At each evaluation: the policy's samples on the validation prompts, their property rate,
    the KL to the reference on them, and the implicit reward margin on the validation pairs."""

    names = ("rate", "kl", "margin")

    def __init__(self, options: DPOOptions, data: Data, objective: DPOObjective) -> None:
        self.options, self.data, self.objective = options, data, objective

    def metrics(
        self, trainer: Trainer, model: nn.Module, base: dict[str, float]
    ) -> dict[str, float]:
        val: PreferencePairs = self.data.value["val"]
        device = next(model.parameters()).device
        prompts = val.prompts.to(device)
        generator = torch.Generator(device=device).manual_seed(self.options.pair_seed + 1)
        samples = sample_completions(model, prompts, length=self.options.completion_len,
                                     generator=generator)  # (N, C)  # fmt: skip
        texts = [self.data.value["decode"](s.tolist()) for s in samples.cpu()]
        ids = torch.cat([prompts, samples], 1)  # (N, P+C)
        kl = sampled_kl(model, self.objective.reference, ids, val.completion_mask.to(device))
        with torch.no_grad():
            margin = self.objective.stats(model, val.select(slice(0, None))).margin
        return {"rate": property_rate(texts, self.options.property), "kl": kl, "margin": margin}


def _dpo_objective(options: Any, config: Any, data: Data, train: TrainConfig) -> Objective:
    reference = frozen_copy(data.value["base"])
    return DPOObjective(data.value["train"], data.value["val"], reference, beta=options.beta)


def _reward_objective(options: Any, config: Any, data: Data, train: TrainConfig) -> Objective:
    return RewardObjective(data.value["train"], data.value["val"])


def _dpo_callbacks(options: Any, config: Any, data: Data) -> list[Callback]:
    reference = frozen_copy(data.value["base"])
    objective = DPOObjective(data.value["train"], data.value["val"], reference, beta=options.beta)
    return [PolicyEvaluation(options, data, objective)]


PAIR_TRAIN = TrainConfig(
    steps=60, batch_size=16, optimizer="adamw", lr=1e-4, betas=(0.9, 0.99), adam_eps=1e-8,
    weight_decay=0.0, schedule="cosine", warmup=10, min_lr_ratio=0.1, label_smoothing=0.0,
    clip_grad_norm=1.0, eval_every=15, eval_batches=4, checkpoint_every=0, log_every=10,
)  # fmt: skip
_FIXED_MODEL = tuple(f.name for f in dataclasses.fields(GPTConfig))  # the base run's model


def _seq_len(options: Any, config: Any) -> int:
    return int(options.prompt_len + options.completion_len)


SHAKESPEARE_REWARD = Recipe(
    "shakespeare-reward",
    "a reward model (Bradley-Terry) on preference pairs judged on a base LM's samples "
    "(--base RUN_DIR, --property no-e)",
    PreferenceOptions(), dataclasses.replace(PAIR_TRAIN, steps=100, lr=3e-4, eval_every=50),
    _model_config, _pair_data,
    _reward_objective, derived=_FIXED_MODEL, memory_batch=lambda o, t: 2 * t.batch_size,
    memory_seq_len=_seq_len, model_transform=_reward_model,
)  # fmt: skip
SHAKESPEARE_DPO = Recipe(
    "shakespeare-dpo",
    "DPO of a base LM (--base RUN_DIR) towards a measurable property of its samples "
    "(--property no-e), against a frozen reference",
    DPOOptions(), PAIR_TRAIN, _model_config, _pair_data, _dpo_objective,
    callbacks=_dpo_callbacks, derived=_FIXED_MODEL, memory_batch=lambda o, t: 4 * t.batch_size,
    memory_seq_len=_seq_len, model_transform=_base_weights,
)  # fmt: skip
for _recipe in (SHAKESPEARE_REWARD, SHAKESPEARE_DPO):
    RECIPES.add(_recipe.name, _recipe)


__all__ = [
    "SHAKESPEARE_DPO",
    "SHAKESPEARE_REWARD",
    "DPOOptions",
    "PolicyEvaluation",
    "PreferenceOptions",
]
