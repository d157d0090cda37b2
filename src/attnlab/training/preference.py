"""Learning from preferences: a Bradley-Terry reward model and DPO (RLHF in miniature).

RLHF (Christiano et al. 2017; Ouyang et al. 2022) has three stages: supervised fine-tuning
(SFT) gives a policy :math:`\\pi_{ref}`; a reward model :math:`r(x, y)` is fitted to pairs
"completion :math:`y_w` is preferred to :math:`y_l` for prompt :math:`x`" under the
Bradley-Terry model :math:`P(y_w \\succ y_l) = \\sigma(r(x, y_w) - r(x, y_l))`
(:func:`bradley_terry_loss`, :class:`RewardModel`); then the policy maximises
:math:`E[r] - \\beta\\,KL(\\pi \\| \\pi_{ref})` (PPO in InstructGPT, which samples as it learns).

DPO (Rafailov et al. 2023, eq. 7) solves the KL-anchored objective in closed form,
:math:`r(x, y) = \\beta \\log \\frac{\\pi(y|x)}{\\pi_{ref}(y|x)} + \\beta \\log Z(x)`, and puts
that implicit reward into the Bradley-Terry likelihood (:math:`Z` cancels in the difference):

.. math::
    L = -\\log\\sigma\\big(\\beta[(\\log\\pi(y_w|x) - \\log\\pi_{ref}(y_w|x))
        - (\\log\\pi(y_l|x) - \\log\\pi_{ref}(y_l|x))]\\big)

so the policy learns from a fixed set of pairs, with no sampling loop (:func:`dpo_loss`).
Sequence log-probabilities sum over the completion's tokens only (the prompt is masked out:
:func:`sequence_logprob`); the reference is a frozen copy (:func:`frozen_copy`);
:func:`sampled_kl` estimates :math:`KL(\\pi \\| \\pi_{ref})` per token on the policy's samples.

Pairs come from a measurable property of text (:data:`PROPERTIES`, e.g. ``no-e``: the
completion has no letter e) judged on the base model's own samples (:func:`build_pairs`, in
:mod:`attnlab.training.preference_pairs`, re-exported here), so the property's rate is the
reward a reader can see move. :class:`RewardObjective` and
:class:`DPOObjective` are the trainer's objectives on those pairs (the recipes
``shakespeare-reward`` and ``shakespeare-dpo``, :mod:`attnlab.training.recipes.preference`).

Deviations from the papers: the preference labels come from a rule, not from people; the
policy is initialised from a language model trained on the text itself (no SFT stage).

Shapes: B pairs (or sequences), T tokens, P prompt tokens, C completion tokens, V vocabulary,
E d_model.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.data.common import Split
from attnlab.training.objectives import LossTerms, SampledObjective
from attnlab.training.preference_pairs import (
    PROPERTIES,
    PreferencePairs,
    build_pairs,
    property_rate,
    sample_completions,
)

# -- the losses ----------------------------------------------------------------------------------


def bradley_terry_loss(chosen_reward: Tensor, rejected_reward: Tensor) -> Tensor:
    """The Bradley-Terry negative log-likelihood ``-log σ(r_w - r_l)`` of each pair.

    Shapes:
        ``(B,)`` rewards of the chosen and rejected completions -> ``(B,)`` losses.

    Raises:
        ValueError: for rewards of different shapes.
    """
    if chosen_reward.shape != rejected_reward.shape:
        raise ValueError(
            f"chosen and rejected rewards must have one shape, got {tuple(chosen_reward.shape)} "
            f"and {tuple(rejected_reward.shape)}"
        )
    return -F.logsigmoid(chosen_reward - rejected_reward)


@dataclass
class DPOStats:
    """What :func:`dpo_loss` computes for a batch of pairs.

    Attributes:
        losses: ``(B,)`` per-pair DPO losses (``loss`` is their mean).
        chosen_reward, rejected_reward: ``(B,)`` implicit rewards
            ``β (log π(y|x) - log π_ref(y|x))``, detached.
    """

    losses: Tensor
    chosen_reward: Tensor
    rejected_reward: Tensor

    @property
    def loss(self) -> Tensor:
        """The mean loss (a scalar with a gradient)."""
        return self.losses.mean()

    @property
    def margin(self) -> float:
        """Mean implicit reward margin ``r_w - r_l``."""
        return float((self.chosen_reward - self.rejected_reward).mean())

    @property
    def accuracy(self) -> float:
        """Fraction of pairs whose implicit reward ranks the chosen completion first."""
        return float((self.chosen_reward > self.rejected_reward).float().mean())


def dpo_loss(
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    reference_chosen: Tensor,
    reference_rejected: Tensor,
    *,
    beta: float = 0.1,
) -> DPOStats:
    """DPO's loss ``-log σ(β[(log π(y_w) - log π_ref(y_w)) - (log π(y_l) - log π_ref(y_l))])``.

    Args:
        policy_chosen, policy_rejected: sequence log-probabilities of the completions under the
            policy (:func:`sequence_logprob`), with a gradient.
        reference_chosen, reference_rejected: the same under the frozen reference.
        beta: the KL coefficient β (> 0; larger keeps the policy closer to the reference).

    Shapes:
        each ``(B,)``.

    Raises:
        ValueError: for ``beta <= 0`` or inputs of different shapes.
    """
    if not beta > 0:
        raise ValueError(f"beta must be positive, got {beta}")
    shapes = {tuple(t.shape) for t in (policy_chosen, policy_rejected, reference_chosen,
                                       reference_rejected)}  # fmt: skip
    if len(shapes) != 1:
        raise ValueError(f"the four log-probabilities must have one shape, got {sorted(shapes)}")
    chosen = beta * (policy_chosen - reference_chosen.detach())  # (B,)
    rejected = beta * (policy_rejected - reference_rejected.detach())  # (B,)
    return DPOStats(-F.logsigmoid(chosen - rejected), chosen.detach(), rejected.detach())


# -- log-probabilities, the reference, KL -------------------------------------------------------


def token_logprobs(model: nn.Module, ids: Tensor) -> Tensor:
    """``log p(ids[:, t] | ids[:, :t])`` for ``t >= 1`` under a language model.

    ``model(ids)`` must return ``(logits (B, T, V), ...)`` (a causal or recurrent LM).

    Shapes:
        ids ``(B, T)`` -> ``(B, T - 1)``.
    """
    if ids.dim() != 2 or ids.shape[1] < 2:
        raise ValueError(f"ids must be (B, T) with T >= 2, got shape {tuple(ids.shape)}")
    logits = model(ids)[0]  # (B, T, V)
    logp = logits[:, :-1].float().log_softmax(-1)  # (B, T-1, V)
    return logp.gather(-1, ids[:, 1:, None]).squeeze(-1)  # (B, T-1)


def sequence_logprob(model: nn.Module, ids: Tensor, completion_mask: Tensor) -> Tensor:
    """``log π(y | x)``: the log-probabilities of the completion tokens summed, the prompt's left
    out (its tokens are the condition, not what is scored).

    Args:
        ids: prompt + completion ``(B, T)``.
        completion_mask: ``(B, T)`` or ``(T,)``, True for the completion's tokens; the first
            token cannot be scored (nothing predicts it), so it must be False.

    Shapes:
        -> ``(B,)``.

    Raises:
        ValueError: for a mask of another length, or one scoring the first token.
    """
    mask = _completion_mask(completion_mask, ids)  # (B, T)
    return (token_logprobs(model, ids) * mask[:, 1:]).sum(-1)  # (B,)


def _completion_mask(completion_mask: Tensor, ids: Tensor) -> Tensor:
    """``completion_mask`` as ``(B, T)`` beside ids ``(B, T)``, checked."""
    if completion_mask.shape not in (ids.shape, ids.shape[1:]):
        raise ValueError(
            f"completion_mask must be (B, T) = {tuple(ids.shape)} or (T,), got "
            f"{tuple(completion_mask.shape)}"
        )
    mask = completion_mask.expand_as(ids)  # (B, T)
    if bool(mask[:, 0].any()):
        raise ValueError("completion_mask marks the first token, which nothing predicts")
    return mask


def frozen_copy(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` in eval mode with no parameter requiring a gradient (DPO's
    reference ``π_ref``: it must not move while the policy learns)."""
    reference = copy.deepcopy(model)
    reference.eval()
    reference.requires_grad_(False)
    return reference


@torch.no_grad()
def sampled_kl(
    policy: nn.Module, reference: nn.Module, ids: Tensor, completion_mask: Tensor
) -> float:
    """``KL(π ‖ π_ref)`` per completion token, estimated on samples of the policy: the mean of
    ``log π(y_t | ·) - log π_ref(y_t | ·)`` over the completion tokens of ``ids`` (which the
    policy sampled; on other samples this is not a KL).

    Shapes:
        ids ``(B, T)``, completion_mask ``(B, T)`` or ``(T,)``.
    """
    mask = _completion_mask(completion_mask, ids)[:, 1:].float()  # (B, T-1)
    diff = token_logprobs(policy, ids) - token_logprobs(reference, ids)  # (B, T-1)
    return float((diff * mask).sum() / mask.sum().clamp_min(1.0))


# -- the reward model ----------------------------------------------------------------------------


class RewardModel(nn.Module):
    """A scalar reward ``r(x, y)``: a language model's body and a linear head on the hidden state
    of the last token (InstructGPT's reward model: the SFT model with its LM head replaced).

    Args:
        body: a causal LM with ``hidden_states(ids) -> (B, T, E)`` (any family of that kind).
        d_model: E (default: ``body.config.d_model``).

    Raises:
        TypeError: for a body without ``hidden_states``.
    """

    def __init__(self, body: nn.Module, d_model: int | None = None) -> None:
        super().__init__()
        if not callable(getattr(body, "hidden_states", None)):
            raise TypeError(
                f"a reward model's body needs hidden_states(ids) -> (B, T, E) (a causal LM); "
                f"{type(body).__name__} has none"
            )
        # the body's config: a run directory's checkpoints carry it (config.json); such a
        # checkpoint loads into RewardModel(build_model(config)), not into the family's model
        self.config = getattr(body, "config", None)
        size = d_model if d_model is not None else getattr(self.config, "d_model", None)
        if size is None:
            raise TypeError(f"pass d_model: {type(body).__name__} has no config.d_model")
        self.body: Any = body  # (a causal LM of any family: read through hidden_states)
        self.reward_head = nn.Linear(int(size), 1)
        nn.init.zeros_(self.reward_head.weight)  # every completion starts at reward 0
        nn.init.zeros_(self.reward_head.bias)

    def forward(self, ids: Tensor) -> Tensor:
        """The reward of each sequence (read at its last token). ids ``(B, T)`` -> ``(B,)``."""
        h = self.body.hidden_states(ids)  # (B, T, E)
        return self.reward_head(h[:, -1]).squeeze(-1)  # (B,)


# -- the trainer's objectives --------------------------------------------------------------------


class _PairObjective(SampledObjective):
    """Random batches of pairs from ``train``; the validation batches are all of ``val`` in
    order. A batch is a :class:`PreferencePairs` (moved to the model's device by the loss; not
    sharded across processes); ``correct`` counts pairs ranked right."""

    def __init__(self, train: PreferencePairs, val: PreferencePairs) -> None:
        if len(train) == 0 or len(val) == 0:
            raise ValueError(f"need training and validation pairs, got {len(train)}, {len(val)}")
        self.pairs = {"train": train, "val": val}

    def sample(self, split: Split, batch_size: int, generator: torch.Generator) -> Any:
        pairs = self.pairs[split]
        return pairs.select(torch.randint(len(pairs), (batch_size,), generator=generator))

    def val_batches(self, batch_size: int, n_batches: int, seed: int) -> list[Any]:
        val = self.pairs["val"]
        return [val.select(slice(i, i + batch_size)) for i in range(0, len(val), batch_size)]

    def count(self, batch: Any) -> int:
        return len(batch)

    def n_tokens(self, batch: Any) -> int:
        return 2 * int(batch.prompts.numel() + batch.chosen.numel())


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


class RewardObjective(_PairObjective):
    """Bradley-Terry on pairs: the reward model learns ``r(chosen) > r(rejected)``."""

    def loss(self, model: nn.Module, batch: Any, *, label_smoothing: float) -> LossTerms:
        chosen, rejected = batch.to(_device(model)).sequences()
        rewards = model(torch.cat([chosen, rejected]))  # (2B,)
        r_w, r_l = rewards.float().chunk(2)
        correct = int((r_w > r_l).sum())
        return LossTerms(bradley_terry_loss(r_w, r_l).sum(), len(batch), correct)


class DPOObjective(_PairObjective):
    """DPO on pairs against a frozen ``reference`` (see :func:`dpo_loss`); ``correct`` counts
    pairs whose implicit reward ranks the chosen completion first."""

    def __init__(
        self,
        train: PreferencePairs,
        val: PreferencePairs,
        reference: nn.Module,
        *,
        beta: float = 0.1,
    ) -> None:
        super().__init__(train, val)
        if any(p.requires_grad for p in reference.parameters()):
            raise ValueError("the reference must be frozen: pass frozen_copy(model)")
        if not beta > 0:
            raise ValueError(f"beta must be positive, got {beta}")
        self.reference, self.beta = reference, beta

    def stats(self, model: nn.Module, batch: PreferencePairs) -> DPOStats:
        """The DPO statistics of ``model`` on ``batch``."""
        chosen, rejected = batch.to(_device(model)).sequences()
        ids = torch.cat([chosen, rejected])  # (2B, P+C)
        mask = batch.completion_mask.to(ids.device)
        pi_w, pi_l = sequence_logprob(model, ids, mask).chunk(2)
        self.reference.to(ids.device)
        with torch.no_grad():
            ref_w, ref_l = sequence_logprob(self.reference, ids, mask).chunk(2)
        return dpo_loss(pi_w, pi_l, ref_w, ref_l, beta=self.beta)

    def loss(self, model: nn.Module, batch: Any, *, label_smoothing: float) -> LossTerms:
        s = self.stats(model, batch)
        correct = int((s.chosen_reward > s.rejected_reward).sum())
        return LossTerms(s.losses.sum(), len(batch), correct)


__all__ = [
    "PROPERTIES",
    "DPOObjective",
    "DPOStats",
    "PreferencePairs",
    "RewardModel",
    "RewardObjective",
    "bradley_terry_loss",
    "build_pairs",
    "dpo_loss",
    "frozen_copy",
    "property_rate",
    "sample_completions",
    "sampled_kl",
    "sequence_logprob",
    "token_logprobs",
]
