"""Preference pairs judged by a measurable property of text, from a model's own samples.

A property is a function ``text -> bool`` (:data:`PROPERTIES`: ``no-e``, the completion has no
letter e, a lipogram; ``question``, it has a question mark). :func:`build_pairs` samples
``samples_per_prompt`` completions of each prompt from a language model, judges them, and pairs
the first one with the property (chosen) against the first one without (rejected):
:class:`PreferencePairs`, deterministic given the generator's seed. The losses that learn from
them are :mod:`attnlab.training.preference`'s.

Shapes: N pairs (or prompts), P prompt tokens, C completion tokens, R samples per prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.generation.generate import generate
from attnlab.registry import Registry

PROPERTIES: Registry[Callable[[str], bool]] = Registry("preference property")
PROPERTIES.add("no-e", lambda text: "e" not in text.lower())  # a lipogram
PROPERTIES.add("question", lambda text: "?" in text)


def property_rate(texts: Sequence[str], judge: str | Callable[[str], bool]) -> float:
    """The fraction of ``texts`` that have the property ``judge`` (a name in
    :data:`PROPERTIES` or a function)."""
    fn = PROPERTIES.get(judge) if isinstance(judge, str) else judge
    return sum(bool(fn(t)) for t in texts) / max(len(texts), 1)


@dataclass
class PreferencePairs:
    """Pairs ``(prompt, chosen, rejected)`` of fixed lengths.

    Attributes:
        prompts: ``(N, P)`` token ids. chosen, rejected: ``(N, C)`` completions.
    """

    prompts: Tensor
    chosen: Tensor
    rejected: Tensor

    def __post_init__(self) -> None:
        n = self.prompts.shape[0]
        if self.chosen.shape != self.rejected.shape or self.chosen.shape[0] != n:
            raise ValueError(
                f"pairs need (N, P) prompts and (N, C) chosen/rejected, got "
                f"{tuple(self.prompts.shape)}, {tuple(self.chosen.shape)}, "
                f"{tuple(self.rejected.shape)}"
            )

    def __len__(self) -> int:
        return int(self.prompts.shape[0])

    @property
    def completion_mask(self) -> Tensor:
        """``(P + C,)``: True on the completion's tokens."""
        p, c = self.prompts.shape[1], self.chosen.shape[1]
        return torch.cat([torch.zeros(p, dtype=torch.bool), torch.ones(c, dtype=torch.bool)])

    def to(self, device: torch.device | str) -> PreferencePairs:
        """The pairs on ``device``."""
        return PreferencePairs(self.prompts.to(device), self.chosen.to(device),
                               self.rejected.to(device))  # fmt: skip

    def select(self, index: Tensor | slice) -> PreferencePairs:
        """The pairs at ``index``."""
        return PreferencePairs(self.prompts[index], self.chosen[index], self.rejected[index])

    def sequences(self) -> tuple[Tensor, Tensor]:
        """``(prompt + chosen, prompt + rejected)``, each ``(N, P + C)``."""
        return (torch.cat([self.prompts, self.chosen], 1),
                torch.cat([self.prompts, self.rejected], 1))  # fmt: skip


@torch.no_grad()
def sample_completions(
    model: nn.Module,
    prompts: Tensor,
    *,
    length: int,
    samples_per_prompt: int = 1,
    generator: torch.Generator | None = None,
    temperature: float = 1.0,
) -> Tensor:
    """``samples_per_prompt`` sampled completions of exactly ``length`` tokens per prompt (no
    early stop). prompts ``(N, P)`` -> ``(N·R, C)``, rows ``n·R .. n·R + R - 1`` of prompt n."""
    was_training = model.training
    model.eval()
    out = generate(
        model, prompts, max_new_tokens=length, do_sample=True, temperature=temperature,
        num_return_sequences=samples_per_prompt, eos_id=(), generator=generator,
    )  # fmt: skip
    model.train(was_training)
    return out


def build_pairs(
    model: nn.Module,
    prompts: Tensor,
    decode: Callable[[list[int]], str],
    judge: str | Callable[[str], bool],
    *,
    length: int,
    samples_per_prompt: int = 8,
    generator: torch.Generator | None = None,
) -> tuple[PreferencePairs, dict[str, Any]]:
    """Preference pairs from ``model``'s own samples: for each prompt, ``samples_per_prompt``
    completions are judged and the first with the property is chosen over the first without
    (prompts whose samples all agree give no pair).

    Returns:
        ``(pairs, info)``, info: ``samples``, ``rate`` (the property's rate in them),
        ``prompts``, ``pairs``.

    Raises:
        ValueError: when no prompt gave a pair.
    """
    fn = PROPERTIES.get(judge) if isinstance(judge, str) else judge
    r = samples_per_prompt
    samples = sample_completions(model, prompts, length=length, samples_per_prompt=r,
                                 generator=generator)  # (N·R, C)  # fmt: skip
    labels = torch.tensor([bool(fn(decode(s.tolist()))) for s in samples]).view(-1, r)  # (N, R)
    keep, chosen, rejected = [], [], []
    for n in range(prompts.shape[0]):
        good, bad = labels[n].nonzero().flatten(), (~labels[n]).nonzero().flatten()
        if len(good) and len(bad):
            keep.append(n)
            chosen.append(samples[n * r + int(good[0])])
            rejected.append(samples[n * r + int(bad[0])])
    info = {"samples": int(labels.numel()), "rate": float(labels.float().mean()),
            "prompts": int(prompts.shape[0]), "pairs": len(keep)}  # fmt: skip
    if not keep:
        raise ValueError(
            f"no preference pair: the property's rate in {labels.numel()} samples was "
            f"{info['rate']:.3f}; sample more per prompt or choose another property"
        )
    pairs = PreferencePairs(prompts[keep], torch.stack(chosen), torch.stack(rejected))
    return pairs, info


__all__ = [
    "PROPERTIES",
    "PreferencePairs",
    "build_pairs",
    "property_rate",
    "sample_completions",
]
