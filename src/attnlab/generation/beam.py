"""Beam search with a length penalty (§6.1: "beam search with a beam size of 4 and length
penalty α = 0.6", after Wu et al. 2016, GNMT).

Each prompt keeps ``K = num_beams`` running hypotheses. At every step all ``K·V`` one-token
extensions are scored by their summed log-probability, and the best ``(1 + n_eos)·K`` candidates
are examined in order: a candidate ending in EOS (or reaching ``max_new_tokens``) that ranks in
the top ``K`` becomes a *finished* hypothesis, scored ``log P(Y) / lp(|Y|)``; the best ``K``
candidates not ending in EOS continue. The ``K`` best finished hypotheses are kept. A prompt is
done once it has ``K`` finished hypotheses and no running one can still beat the worst of them:
a running hypothesis with log-probability ``s <= 0`` can at best end as ``s / lp(L)`` for the
longest ``L`` still possible (for an increasing ``lp``), a bound that is exact, not a heuristic.

Length penalties (:data:`LENGTH_NORMS`), with ``|Y|`` the generated tokens including EOS:

- ``"gnmt"`` (default): ``lp(Y) = ((5 + |Y|) / 6) ** α`` (Wu et al. 2016, eq. 14);
- ``"power"``: ``lp(Y) = |Y| ** α``, what Hugging Face's ``length_penalty`` means.

α = 0 gives plain log-probability under both; then (and whenever no hypothesis finishes early)
``num_beams=1`` equals greedy decoding. GNMT's coverage penalty (β) is not implemented (β = 0).

Shapes: B prompts, K beams, V vocabulary, N max new tokens, R returned sequences per prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.generation.config import LENGTH_NORM_NAMES, GenerationConfig, resolve_config
from attnlab.generation.engines import DecodeSession, resolve_engine, runner_for
from attnlab.generation.memory import check_call_memory
from attnlab.generation.processors import (
    LogitsProcessor,
    LogitsProcessorList,
    check_finite_logits,
)
from attnlab.generation.prompts import PromptInput
from attnlab.generation.request import (
    eval_mode,
    open_session,
    prepare_request,
    repeat_index,
)
from attnlab.registry import Registry

LengthNorm = Callable[[Tensor, float], Tensor]  # (lengths, alpha) -> lp, both float


def gnmt_length_penalty(length: Tensor, alpha: float) -> Tensor:
    """GNMT's ``lp(Y) = ((5 + |Y|) / 6) ** α``; ``lp = 1`` for one token."""
    return ((5.0 + length) / 6.0) ** alpha


def power_length_penalty(length: Tensor, alpha: float) -> Tensor:
    """Hugging Face's ``lp(Y) = |Y| ** α``."""
    return length**alpha


LENGTH_NORMS: Registry[LengthNorm] = Registry("length penalty")
LENGTH_NORMS.add("gnmt", gnmt_length_penalty)
LENGTH_NORMS.add("power", power_length_penalty)
if set(LENGTH_NORMS) != set(LENGTH_NORM_NAMES):  # GenerationConfig validates against these
    raise RuntimeError("LENGTH_NORM_NAMES and LENGTH_NORMS disagree")


@dataclass(frozen=True)
class BeamSearchOutput:
    """The best ``R`` hypotheses of each prompt, best first (rows ``b·R .. b·R + R - 1``).

    Attributes:
        sequences: ``(B·R, L)`` new tokens, padded with ``pad_id`` after each hypothesis.
        scores: ``(B·R,)`` ``log_probs / lp(lengths)``, non-increasing within each prompt.
        log_probs: ``(B·R,)`` summed log-probabilities of the tokens (after ``processors``).
        lengths: ``(B·R,)`` tokens per hypothesis, EOS included.
    """

    sequences: Tensor
    scores: Tensor
    log_probs: Tensor
    lengths: Tensor


def beam_search(
    model: nn.Module,
    input_ids: PromptInput,
    config: GenerationConfig | None = None,
    *,
    attention_mask: Tensor | None = None,
    processors: Iterable[LogitsProcessor] = (),
    decode_session: DecodeSession | None = None,
    **options: Any,
) -> BeamSearchOutput:
    """Beam search for a GPT, a recurrent LM or an encoder-decoder model (see the module doc).

    Takes the :class:`~attnlab.generation.GenerationConfig` of
    :func:`~attnlab.generation.generate` (``num_beams`` K, default 4 here; ``length_penalty``
    α; ``length_norm``; ``num_return_sequences`` R with ``1 <= R <= K``); ``processors`` are
    applied to the log-probabilities ``(B·K, V)`` before scoring; the decode engine
    (``engine``, :mod:`attnlab.generation.engines`) runs the ``B·K`` rows, on a held
    ``decode_session`` if given.

    Raises:
        ValueError: for R outside ``[1, K]``, sampling options, and the input errors of
            :func:`~attnlab.generation.generate`; ``MemoryLimitError`` before allocating, when
            the search's estimate (its ``(B·K, V)`` step tensors and ``(B, K, N)`` candidates
            included) exceeds the memory available (``memory_check=False`` skips it).
    """
    if config is None and "num_beams" not in options:
        options = {"num_beams": 4, **options}
    cfg = resolve_config(config, options)
    if cfg.do_sample:
        raise ValueError("beam search is deterministic: do_sample=True needs num_beams=1")
    lp_fn = LENGTH_NORMS.get(cfg.length_norm)
    request = prepare_request(model, input_ids, cfg, attention_mask=attention_mask)
    num_beams, alpha = cfg.num_beams, cfg.length_penalty
    chain = LogitsProcessorList(processors)
    rows = request.prompts.batch_size * num_beams
    choice = resolve_engine(
        request.model, cfg.engine, rows=rows, max_new_tokens=request.max_new_tokens,
        use_cache=cfg.use_cache, held=decode_session is not None,
    )  # fmt: skip
    check_call_memory(request, cfg, choice=choice, held=decode_session is not None)
    with (
        eval_mode(request.model),
        runner_for(request.model, choice, rows, decode_session) as runner,
        torch.inference_mode(),
    ):
        session = open_session(request, use_cache=cfg.use_cache, runner=runner)
        search = _BeamState(
            batch=request.prompts.batch_size,
            beams=num_beams,
            max_new_tokens=request.max_new_tokens,
            eos=request.eos,
            pad_id=request.pad_id,
            penalty=lambda n: lp_fn(n, alpha),
        )
        logits = session.prefill()  # (B, V)
        expand = repeat_index(search.B, num_beams, logits.device)
        session.select(expand)
        logits = logits.index_select(0, expand)  # (B·K, V)
        for t in range(request.max_new_tokens):
            check_finite_logits(logits, t)
            log_probs = chain(torch.log_softmax(logits.float(), dim=-1))  # (B·K, V)
            origin, tokens = search.advance(log_probs, t)
            if search.all_done or t + 1 == request.max_new_tokens:
                break
            session.select(origin, same_source=True)
            logits = session.step(tokens)
        return search.result(cfg.num_return_sequences)


class _BeamState:
    """Running and finished hypotheses of every prompt, as ``(B, K, ...)`` tensors."""

    def __init__(
        self,
        *,
        batch: int,
        beams: int,
        max_new_tokens: int,
        eos: Tensor,
        pad_id: int,
        penalty: Callable[[Tensor], Tensor],
    ) -> None:
        self.B, self.K, self.N = batch, beams, max_new_tokens
        self.eos, self.penalty = eos, penalty
        device = eos.device
        ninf = float("-inf")
        # Running: only beam 0 is alive at the start (all beams hold the same prefix).
        self.run_logp = torch.full((batch, beams), ninf, device=device)  # (B, K)
        self.run_logp[:, 0] = 0.0
        self.run_seq = torch.full((batch, beams, max_new_tokens), pad_id, device=device)
        self.run_seq = self.run_seq.long()  # (B, K, N)
        # Finished: the K best, sorted by score.
        self.fin_score = torch.full((batch, beams), ninf, device=device)  # (B, K)
        self.fin_logp = torch.full((batch, beams), ninf, device=device)  # (B, K)
        self.fin_len = torch.zeros(batch, beams, dtype=torch.long, device=device)  # (B, K)
        self.fin_seq = self.run_seq.clone()  # (B, K, N)
        self.done = torch.zeros(batch, dtype=torch.bool, device=device)  # (B,)
        self.n_cand = (1 + max(1, eos.numel())) * beams

    @property
    def all_done(self) -> bool:
        return bool(self.done.all())

    def _lp(self, length: int) -> float:
        return float(self.penalty(torch.tensor(float(length))))

    def advance(self, log_probs: Tensor, t: int) -> tuple[Tensor, Tensor]:
        """Score step ``t``'s extensions; return the flat origin rows ``(B·K,)`` of the new
        running beams and their new tokens ``(B·K,)``."""
        B, K = self.B, self.K
        V = log_probs.shape[-1]
        total = (log_probs.view(B, K, V) + self.run_logp[:, :, None]).view(B, K * V)
        n_cand = min(self.n_cand, K * V)
        cand_logp, flat = torch.topk(total, n_cand, dim=-1)  # (B, C) best first
        beam, token = flat // V, flat % V  # (B, C) each
        cand_seq = self.run_seq.gather(1, beam[:, :, None].expand(B, n_cand, self.N)).clone()
        cand_seq[:, :, t] = token  # (B, C, N)
        ends = (
            torch.isin(token, self.eos)
            if self.eos.numel()
            else torch.zeros_like(token, dtype=torch.bool)
        )
        last = t + 1 == self.N
        # Finished candidates: EOS (or the length limit) within the top K, prompt not done.
        finishing = (ends | last) & (torch.arange(n_cand, device=flat.device) < K)
        finishing &= ~self.done[:, None]
        cand_score = cand_logp / self._lp(t + 1)
        self._merge_finished(cand_score, cand_logp, cand_seq, finishing, t + 1)
        # Running: the best K candidates that did not end.
        alive_logp = cand_logp.masked_fill(ends, float("-inf"))
        keep_logp, keep = torch.topk(alive_logp, K, dim=-1)  # (B, K)
        self.run_logp = keep_logp
        self.run_seq = cand_seq.gather(1, keep[:, :, None].expand(B, K, self.N))
        if not last:
            self._update_done(t + 1)
        origin = beam.gather(1, keep) + torch.arange(B, device=flat.device)[:, None] * K
        return origin.view(-1), token.gather(1, keep).view(-1)

    def _merge_finished(
        self, score: Tensor, logp: Tensor, seq: Tensor, finishing: Tensor, length: int
    ) -> None:
        ninf = float("-inf")
        all_score = torch.cat([self.fin_score, score.masked_fill(~finishing, ninf)], dim=1)
        new_len = torch.full_like(logp, length, dtype=torch.long)
        best_score, best = torch.topk(all_score, self.K, dim=-1)  # (B, K), sorted
        self.fin_score = best_score
        self.fin_logp = torch.cat([self.fin_logp, logp], dim=1).gather(1, best)
        self.fin_len = torch.cat([self.fin_len, new_len], dim=1).gather(1, best)
        all_seq = torch.cat([self.fin_seq, seq], dim=1)  # (B, K + C, N)
        self.fin_seq = all_seq.gather(1, best[:, :, None].expand(self.B, self.K, self.N))

    def _update_done(self, length: int) -> None:
        """Done: K finished and the best running log-prob cannot end above the worst of them."""
        best_run = self.run_logp[:, 0]  # (B,) <= 0
        bound = torch.maximum(best_run / self._lp(length + 1), best_run / self._lp(self.N))
        full = self.fin_score[:, -1] > float("-inf")
        self.done |= full & ~(bound > self.fin_score[:, -1])

    def result(self, R: int) -> BeamSearchOutput:
        lengths = self.fin_len[:, :R].reshape(-1)  # (B·R,)
        width = max(int(lengths.max()), 1) if lengths.numel() else 1
        return BeamSearchOutput(
            sequences=self.fin_seq[:, :R, :width].reshape(-1, width),
            scores=self.fin_score[:, :R].reshape(-1),
            log_probs=self.fin_logp[:, :R].reshape(-1),
            lengths=lengths,
        )


__all__ = [
    "LENGTH_NORMS",
    "BeamSearchOutput",
    "LengthNorm",
    "beam_search",
    "gnmt_length_penalty",
    "power_length_penalty",
]
