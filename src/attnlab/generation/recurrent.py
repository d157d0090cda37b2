"""Decoding a recurrent model (Mamba, LSTM/GRU) through the same :class:`Session` interface as
the KV cache: a constant-size state instead of a growing cache.

A model decodes this way when its family's kind is ``RECURRENT_LM`` (:func:`is_recurrent`;
:mod:`attnlab.models.family`): it has a ``new_state(batch)`` method and its
``forward(ids, state=state)`` continues the sequence the state has seen, updating the state in
place; the state has ``reorder(index)`` (beam search,
several samples per prompt) and a class method ``cat(states)`` that stacks rows.

- *prefill*: the prompt runs in one parallel call (the parallel scan, or cuDNN/oneDNN's whole
  sequence) from a zero state and leaves the final state;
- *step*: one token per row with that state: O(1) time and memory per token, whatever the
  context (no ``max_seq_len`` applies: these models have none).

Left-padded batches are exact: rows are grouped by prompt length and each group is prefilled on
its real tokens only (one call per distinct length), so every row's state starts from zeros at
its first real token, exactly as if it were decoded alone; the group states are then stacked
back into the batch's row order. Padding never enters a recurrence.

With ``use_cache=False`` each step reruns every row's whole sequence from a zero state (the
reference that stateful decoding must equal).

Shapes: B rows, P prompt width, N max new tokens, V vocabulary.
"""

from __future__ import annotations

from typing import Any, Protocol, cast, runtime_checkable

import torch
from torch import Tensor, nn

from attnlab.generation.prompts import Prompts
from attnlab.models.family import Kind, find_family


class RecurrentState(Protocol):
    """What sessions need from a model's decoding state (its class also has ``cat(states)``)."""

    def reorder(self, index: Tensor) -> None: ...


@runtime_checkable
class RecurrentLM(Protocol):
    """A language model that decodes with a constant-size state (structural: any module with a
    ``config`` and a ``new_state`` method)."""

    config: Any

    def new_state(self, batch: int) -> Any: ...


def is_recurrent(model: object) -> bool:
    """Whether ``model`` decodes with a recurrent state: its family's kind is
    ``RECURRENT_LM``."""
    family = find_family(model) if isinstance(model, nn.Module) else None
    return family is not None and family.kind is Kind.RECURRENT_LM


class RecurrentSession:
    """Prefill + one-token steps of a recurrent LM over a left-padded prompt batch.

    Args:
        model: the model (in eval mode; the caller handles modes and grad).
        prompts: left-padded prompts (:func:`~attnlab.generation.prompts.pack_prompts`).
        max_new_tokens: N (the token buffer holds ``P + N`` columns; the state is fixed-size).
        use_cache: ``False`` reruns each row's whole sequence at every step.
    """

    def __init__(
        self, model: nn.Module, prompts: Prompts, max_new_tokens: int, use_cache: bool
    ) -> None:
        self.model = model
        B, P = prompts.ids.shape
        self.use_cache = use_cache
        self.width = P
        self.length = P  # columns filled so far
        self.starts = P - prompts.lengths  # (B,) first real column of each row
        self.ids = torch.zeros(B, P + max_new_tokens, dtype=torch.long, device=prompts.ids.device)
        self.ids[:, :P] = prompts.ids
        self.state: Any = None

    def _run_rows(self, end: int, keep_state: bool) -> Tensor:
        """Run every row from its first real column to ``end`` from a zero state, one call per
        distinct start; return the last logits ``(B, V)`` (and keep the stacked state)."""
        starts = self.starts.tolist()
        groups: dict[int, list[int]] = {}
        for row, start in enumerate(starts):
            groups.setdefault(start, []).append(row)
        order: list[int] = []
        logits_parts: list[Tensor] = []
        states: list[Any] = []
        for start, rows in sorted(groups.items()):
            index = torch.tensor(rows, device=self.ids.device)
            state = cast(RecurrentLM, self.model).new_state(len(rows)) if keep_state else None
            logits, _ = self.model(self.ids[index, start:end], state=state)  # (b, T, V)
            logits_parts.append(logits[:, -1])
            states.append(state)
            order += rows
        inverse = torch.empty(len(order), dtype=torch.long, device=self.ids.device)
        inverse[torch.tensor(order, device=self.ids.device)] = torch.arange(
            len(order), device=self.ids.device
        )
        if keep_state:
            self.state = states[0] if len(states) == 1 else type(states[0]).cat(states)
            if len(states) > 1:
                self.state.reorder(inverse)
        return torch.cat(logits_parts).index_select(0, inverse)  # (B, V)

    def prefill(self) -> Tensor:
        return self._run_rows(self.width, keep_state=self.use_cache)

    def step(self, tokens: Tensor) -> Tensor:
        self.ids[:, self.length] = tokens
        self.length += 1
        if not self.use_cache:
            return self._run_rows(self.length, keep_state=False)
        logits, _ = self.model(tokens[:, None], state=self.state)  # (B, 1, V)
        return logits[:, -1]

    def select(self, index: Tensor, *, same_source: bool = False) -> None:
        self.ids = self.ids.index_select(0, index)
        self.starts = self.starts.index_select(0, index)
        if self.state is not None:
            self.state.reorder(index)


__all__ = ["RecurrentLM", "RecurrentSession", "RecurrentState", "is_recurrent"]
