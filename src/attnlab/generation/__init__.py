"""Generation: decoding loops on top of the models.

- :func:`generate` / :func:`stream`: prefill + one-token steps with the KV cache; greedy or
  sampling (temperature, top-k, top-p, min-p as composable logits processors, a seeded
  ``torch.Generator``), EOS ids, batched prompts of different lengths (left padding);
- :func:`beam_search`: §6.1's beam search with GNMT's length penalty, batched, with
  ``num_return_sequences``;
- speculative decoding (``draft_model=``, :func:`speculative_generate`): a small draft proposes
  ``k`` tokens, the target verifies them in one forward, both KV caches roll back; greedy
  tokens are the target's, sampling keeps the target's distribution (the rejection rule);
- :class:`GenerationConfig`: every option of a call, validated once (also passed as keyword
  arguments); the ``context`` policy for sequences longer than the model's context.
"""

from attnlab.generation.beam import (
    LENGTH_NORMS,
    BeamSearchOutput,
    beam_search,
    gnmt_length_penalty,
    power_length_penalty,
)
from attnlab.generation.config import ContextLengthError, GenerationConfig
from attnlab.generation.generate import StepOutput, generate, stream
from attnlab.generation.processors import (
    LOGITS_PROCESSORS,
    LogitsProcessor,
    LogitsProcessorList,
    MinP,
    Temperature,
    TopK,
    TopP,
    build_processors,
)
from attnlab.generation.prompts import Prompts, pack_prompts
from attnlab.generation.speculative import (
    SpeculativeOutput,
    SpeculativeStats,
    SpeculativeStream,
    speculative_generate,
    speculative_stream,
)

__all__ = [
    "LENGTH_NORMS",
    "LOGITS_PROCESSORS",
    "BeamSearchOutput",
    "ContextLengthError",
    "GenerationConfig",
    "LogitsProcessor",
    "LogitsProcessorList",
    "MinP",
    "Prompts",
    "SpeculativeOutput",
    "SpeculativeStats",
    "SpeculativeStream",
    "StepOutput",
    "Temperature",
    "TopK",
    "TopP",
    "beam_search",
    "build_processors",
    "generate",
    "gnmt_length_penalty",
    "pack_prompts",
    "power_length_penalty",
    "speculative_generate",
    "speculative_stream",
    "stream",
]
