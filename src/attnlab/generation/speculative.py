"""Speculative decoding: a small draft model proposes, the target verifies ``k + 1`` positions in
one forward pass.

Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative Decoding") and Chen et
al. 2023 ("Accelerating Large Language Model Decoding with Speculative Sampling"). Decoding one
token costs the target a pass over all its weights, however few tokens it is fed; so a cheap
draft guesses ``k`` tokens one by one (with its own KV cache), the target scores the last token
and the ``k`` guesses in one forward (with its KV cache), the verification rule
(:mod:`attnlab.generation.acceptance`) keeps ``n`` guesses and adds one token of the target's,
and both caches are truncated to what was kept (:meth:`~attnlab.layers.KVCache.truncate`). A
round yields ``n + 1`` tokens for one target forward and ``k`` draft forwards.

- Greedy: the tokens are the target's own greedy tokens (the target's arg-max decides every
  one), up to float rounding: the verification forward computes the same logits over ``k + 1``
  rows at once, which may round differently in the last bits, so two logits tied to within
  rounding could be ordered differently than one-token steps order them.
- Sampling: the rejection rule keeps the target's distribution exactly, with temperature, top-k,
  top-p and min-p applied identically to both models' logits.

Batches: rows are decoded together, so every row keeps the same number of tokens per round: the
fewest any unfinished row accepted (each row emits its own kept tokens and, at that position,
its accepted proposal or its own correction). That stays exact for greedy and sampling alike
(each emitted token is still the verification rule's output at its position, and the decision
to stop a round is made from what came before it), but a batch accepts less per round than its
rows would alone.

Context: the target must fit ``k + 1`` new positions in its context to verify them; past
``max_seq_len`` (``context="slide"``) it decodes the remaining tokens without the draft exactly
as :func:`~attnlab.generation.generate` does (a sliding window, recomputed per token). A draft
with a shorter context restarts its cache on the last ``max_seq_len // 2`` tokens when it runs
out of room (any draft distribution keeps the output exact; the draft only needs to be good).

Shapes: B rows, P prompt length, N max new tokens, k draft tokens, V vocabulary.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from attnlab.generation.acceptance import greedy_acceptance, rejection_acceptance
from attnlab.generation.config import GenerationConfig, resolve_config
from attnlab.generation.engines import EngineChoice, resolve_engine, runner_for
from attnlab.generation.memory import check_speculative_memory
from attnlab.generation.processors import (
    LogitsProcessor,
    build_processors,
    check_finite_logits,
    select_tokens,
)
from attnlab.generation.prompts import PromptInput, Prompts
from attnlab.generation.request import (
    GenerationRequest,
    StepOutput,
    eval_mode,
    prepare_request,
    repeat_index,
)
from attnlab.generation.speculative_state import Columns, Decoder, SpeculativeStats
from attnlab.models.family import Kind, find_family

logger = logging.getLogger(__name__)

DEFAULT_DRAFT_TOKENS = 4


@dataclass(frozen=True)
class SpeculativeOutput:
    """What :func:`speculative_generate` returns.

    Attributes:
        sequences: ``(B·R, N)`` the new tokens, as :func:`~attnlab.generation.generate`.
        stats: the acceptance statistics of the call.
    """

    sequences: Tensor
    stats: SpeculativeStats


def check_draft(
    model: nn.Module, draft_model: nn.Module, num_draft_tokens: int, config: GenerationConfig
) -> None:
    """Refuse a target/draft pair or options that speculative decoding cannot serve.

    Raises:
        TypeError: for a target or draft that is not a causal LM (a family of kind
            ``CAUSAL_LM``, e.g. :class:`~attnlab.GPT`: it rolls back a KV cache).
        ValueError: for different vocabularies, ``num_draft_tokens`` not in ``[1, draft
            max_seq_len]``, beam search, ``use_cache=False``, or models on different devices.
    """
    for role, m in (("target", model), ("draft", draft_model)):
        family = find_family(m)
        if family is None or family.kind is not Kind.CAUSAL_LM:
            raise TypeError(
                f"speculative decoding needs a decoder-only (causal) LM such as a GPT as the "
                f"{role} model, got {type(m).__name__}"
            )
    tv, dv = cast(Any, model).config.vocab_size, cast(Any, draft_model).config.vocab_size
    if tv != dv:
        raise ValueError(
            f"the draft model's vocabulary ({dv} tokens) differs from the target's ({tv}): "
            "speculative decoding needs both models on the same tokenizer"
        )
    k = num_draft_tokens
    context = cast(Any, draft_model).config.max_seq_len
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= context:
        raise ValueError(
            f"num_draft_tokens must be an integer in [1, {context}] (the draft's max_seq_len), "
            f"got {k!r}"
        )
    if config.num_beams > 1:
        raise ValueError(
            f"speculative decoding (draft_model) does not combine with beam search "
            f"(num_beams={config.num_beams}): use num_beams=1"
        )
    if not config.use_cache:
        raise ValueError("speculative decoding rolls back KV caches: it needs use_cache=True")
    devices = {p.device for m in (model, draft_model) for p in m.parameters()}
    if len(devices) > 1:
        raise ValueError(f"the target and draft models must be on one device, got {devices}")


class SpeculativeStream(Iterator[StepOutput]):
    """The tokens of a speculative decoding call, one :class:`StepOutput` per token (they come
    in bursts: one per verification round). ``stats`` is updated as they come."""

    def __init__(self, steps: Iterator[StepOutput], stats: SpeculativeStats) -> None:
        self._steps = steps
        self.stats = stats

    def __next__(self) -> StepOutput:
        return next(self._steps)

    def close(self) -> None:
        """Stop early (restores the models' modes)."""
        close = getattr(self._steps, "close", None)
        if close is not None:
            close()


def speculative_stream(
    model: nn.Module,
    draft_model: nn.Module,
    input_ids: PromptInput,
    config: GenerationConfig | None = None,
    *,
    num_draft_tokens: int = DEFAULT_DRAFT_TOKENS,
    attention_mask: Tensor | None = None,
    processors: Iterable[LogitsProcessor] = (),
    generator: torch.Generator | None = None,
    **options: Any,
) -> SpeculativeStream:
    """Speculative greedy or sampled decoding, one :class:`StepOutput` per generated token.

    Arguments as :func:`speculative_generate`; they are checked at the call.

    Raises:
        TypeError, ValueError: as :func:`speculative_generate`.
    """
    cfg = resolve_config(config, options)
    check_draft(model, draft_model, num_draft_tokens, cfg)
    request = prepare_request(model, input_ids, cfg, attention_mask=attention_mask)
    check_speculative_memory(request, cfg, draft_model, num_draft_tokens)
    sample = cfg.sampling
    chain = build_processors(
        temperature=cfg.temperature if sample else 1.0,
        top_k=cfg.top_k if sample else None,
        top_p=cfg.top_p if sample else None,
        min_p=cfg.min_p if sample else None,
        extra=processors,
    )
    stats = SpeculativeStats(num_draft_tokens=num_draft_tokens)
    loop = _Loop(request, draft_model, chain, sample, generator, num_draft_tokens, stats)
    loop.engine = cfg.engine
    return SpeculativeStream(loop.run(cfg.num_return_sequences), stats)


def speculative_generate(
    model: nn.Module,
    draft_model: nn.Module,
    input_ids: PromptInput,
    config: GenerationConfig | None = None,
    *,
    num_draft_tokens: int = DEFAULT_DRAFT_TOKENS,
    attention_mask: Tensor | None = None,
    processors: Iterable[LogitsProcessor] = (),
    generator: torch.Generator | None = None,
    **options: Any,
) -> SpeculativeOutput:
    """Generate with ``draft_model`` proposing ``num_draft_tokens`` tokens per target forward.

    Args:
        model: the target :class:`~attnlab.GPT`, whose output this is.
        draft_model: a (smaller) GPT on the same vocabulary.
        input_ids: prompts, as :func:`~attnlab.generation.generate` takes them.
        config: a :class:`~attnlab.generation.GenerationConfig` (greedy or sampling; not beams).
        num_draft_tokens: ``k``, proposals per round, in ``[1, draft max_seq_len]``.
        attention_mask, processors, generator, options: as :func:`~attnlab.generation.generate`
            (processors apply to the draft's and the target's logits alike).

    Shapes:
        returns sequences ``(B·R, N)``, exactly as :func:`~attnlab.generation.generate`.

    Raises:
        TypeError: for a target or draft that is not a GPT, or an option of the wrong type.
        ValueError: for different vocabularies, a bad ``num_draft_tokens``, beam search,
            ``use_cache=False``, and everything :func:`~attnlab.generation.generate` refuses
            (a call whose memory estimate, both caches included, exceeds the memory available:
            ``MemoryLimitError``, skipped with ``memory_check=False``).
        NonFiniteLogitsError: when the draft's or the target's logits hold NaN or infinity (a
            draft with NaN weights, say), naming which model, the step and the sequence.
    """
    steps = speculative_stream(
        model, draft_model, input_ids, config, num_draft_tokens=num_draft_tokens,
        attention_mask=attention_mask, processors=processors, generator=generator, **options,
    )  # fmt: skip
    sequences = torch.stack([step.tokens for step in steps], dim=1)  # (B·R, N)
    logger.info("speculative decoding: %s", steps.stats.summary())
    return SpeculativeOutput(sequences=sequences, stats=steps.stats)


class _Loop:
    """One call's decoding loop: rounds of draft proposals and target verification."""

    def __init__(
        self,
        request: GenerationRequest,
        draft: nn.Module,
        chain: LogitsProcessor,
        sample: bool,
        generator: torch.Generator | None,
        k: int,
        stats: SpeculativeStats,
    ) -> None:
        self.request, self.draft, self.chain, self.sample = request, draft, chain, sample
        self.generator, self.k, self.stats = generator, k, stats
        self.engine = "auto"  # the request's decode engine (GenerationConfig.engine)
        self.prompt_width = 0  # P: column P is the first new token's (steps count from it)

    def run(self, num_return_sequences: int) -> Iterator[StepOutput]:
        """Yield every token; grad mode is switched off per round, not across ``yield``."""
        request, target = self.request, self.request.model  # check_draft saw to it
        prompts = _repeat(request.prompts, num_return_sequences)
        B, N = prompts.batch_size, request.max_new_tokens
        with ExitStack() as stack:
            stack.enter_context(eval_mode(target))
            runner = stack.enter_context(
                runner_for(target, self._engine(target, B * (self.k + 1), N), B * (self.k + 1))
            )
            draft_runner = runner
            if self.draft is not target:  # a draft may be the target itself (all accepted)
                stack.enter_context(eval_mode(self.draft))
                draft_runner = stack.enter_context(
                    runner_for(self.draft, self._engine(self.draft, B, N * self.k), B)
                )
            with torch.inference_mode():
                cols = Columns(prompts, N)
                self.prompt_width = cols.length
                verifier = Decoder(target, cols, rollback=self.k, runner=runner)
                drafter = Decoder(self.draft, cols, rollback=self.k, runner=draft_runner)
                finished = torch.zeros(B, dtype=torch.bool, device=prompts.ids.device)
            produced = 0
            while produced < N:
                with torch.inference_mode():
                    chunk, logits = self._round(cols, verifier, drafter, N - produced, finished)
                for j in range(chunk.shape[1]):
                    with torch.inference_mode():
                        tokens = chunk[:, j].masked_fill(finished, request.pad_id)  # (B,)
                        if request.eos.numel():
                            finished = finished | torch.isin(tokens, request.eos)
                    yield StepOutput(tokens=tokens, logits=logits[:, j], finished=finished)
                    produced += 1
                    if bool(finished.all()):
                        return

    def _engine(self, model: nn.Module, rows: int, new_tokens: int) -> EngineChoice:
        """The decode engine ``model`` runs on in this call (the request's choice)."""
        return resolve_engine(
            model, self.engine, rows=rows, max_new_tokens=new_tokens, use_cache=True
        )

    def _round(
        self, cols: Columns, verifier: Decoder, drafter: Decoder, remaining: int, finished: Tensor
    ) -> tuple[Tensor, Tensor]:
        """One round: ``(tokens (B, m + 1), the target's raw logits (B, m + 1, V))``; the
        columns grow by ``m + 1`` and both caches are truncated to match."""
        L = cols.length
        k = min(self.k, remaining - 1, verifier.context - L)
        if k < 0:  # past the target's context: a plain step on the sliding window
            logits = verifier.window_logits(L)  # (B, V)
            check_finite_logits(logits, L - self.prompt_width, model="the target model")
            tokens = select_tokens(self.chain(logits.float()), sample=self.sample,
                                   generator=self.generator)  # fmt: skip
            cols.ids[:, L] = tokens
            cols.length = L + 1
            self.stats.plain_steps += 1
            return tokens[:, None], logits[:, None]
        proposals, q = self._propose(cols, drafter, L, k)  # (B, k), (B, k, V)
        raw = verifier.feed(L + k)[:, -(k + 1) :]  # (B, k + 1, V): one target forward
        B, V = raw.shape[0], raw.shape[-1]
        if not bool(torch.isfinite(raw.sum(dtype=torch.float32))):  # one read, as a rule
            for j in range(k + 1):  # NaN scores would accept or reject arbitrary proposals
                check_finite_logits(raw[:, j], L - self.prompt_width + j, model="the target model")
        scores = self.chain(raw.float().reshape(B * (k + 1), V)).view(B, k + 1, V)
        if self.sample:
            target_probs = scores.softmax(dim=-1)  # (B, k + 1, V)
            n, nxt = rejection_acceptance(proposals, q, target_probs, generator=self.generator)
        else:
            n, nxt = greedy_acceptance(proposals, scores)
        n = n.masked_fill(finished, k)  # finished rows do not hold the others back
        m = int(n.min())
        last = nxt if m == k else torch.where(n > m, proposals[:, m], nxt)  # (B,)
        chunk = torch.cat((proposals[:, :m], last[:, None]), dim=1)  # (B, m + 1)
        cols.ids[:, L : L + m + 1] = chunk
        cols.length = L + m + 1
        verifier.rewind(L + m)  # the target holds columns .. L + m - 1; column L + m is next
        drafter.rewind(L + m)
        self.stats.record(k, m, active=int((~finished).sum()))
        return chunk, raw[:, : m + 1]

    def _propose(self, cols: Columns, drafter: Decoder, L: int, k: int) -> tuple[Tensor, Tensor]:
        """The draft's ``k`` proposals ``(B, k)`` for columns ``L .. L + k - 1`` (written into
        ``cols``) and the distributions they were drawn from ``(B, k, V)`` (``V = 0`` when
        greedy)."""
        B, V = cols.ids.shape[0], self.request.vocab_size
        proposals = torch.empty(B, k, dtype=torch.long, device=cols.ids.device)  # (B, k)
        probs = torch.empty(B, k, V if self.sample else 0, device=cols.ids.device)  # (B, k, V)
        if k and L + k - 1 - drafter.start > drafter.context:  # out of room: restart its cache
            keep = max(1, min(drafter.context // 2, drafter.context - k + 1))
            drafter.restart(L - keep)
        for j in range(k):
            logits = drafter.feed(L + j, last_only=True)[:, -1]  # (B, V)
            # a NaN draft would fail in torch.multinomial (or propose arbitrary tokens): say so
            check_finite_logits(logits, L - self.prompt_width + j, model="the draft model")
            scores = self.chain(logits.float())  # (B, V)
            if self.sample:
                probs[:, j] = scores.softmax(dim=-1)
                x = torch.multinomial(probs[:, j], 1, generator=self.generator).squeeze(-1)
            else:
                x = scores.argmax(dim=-1)
            proposals[:, j] = x
            cols.ids[:, L + j] = x
        self.stats.draft_forwards += k
        return proposals, probs


def _repeat(prompts: Prompts, n: int) -> Prompts:
    """Each prompt ``n`` times in a row (``num_return_sequences``)."""
    if n == 1:
        return prompts
    index = repeat_index(prompts.batch_size, n, prompts.ids.device)
    mask = None if prompts.mask is None else prompts.mask.index_select(0, index)
    return Prompts(prompts.ids.index_select(0, index), mask, prompts.lengths.index_select(0, index))


__all__ = [
    "DEFAULT_DRAFT_TOKENS",
    "SpeculativeOutput",
    "SpeculativeStats",
    "SpeculativeStream",
    "check_draft",
    "speculative_generate",
    "speculative_stream",
]
