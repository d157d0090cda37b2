"""Fixtures of the checkpoint interop tests: transformers (or skip) and the shared helpers.

The parity tests build small random-weight Hugging Face models (``initializer_range=0.2``, so
that an error in any tensor shows in the outputs), save them with ``save_pretrained``, load them
with :func:`attnlab.from_pretrained` and compare float32 eval-mode outputs. Helpers come as the
``tools`` fixture (the suite imports test files with ``--import-mode=importlib``, so test modules
cannot import a sibling helper module).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from attnlab import GPT


class Tools:
    """Helpers shared by the interop tests."""

    # Max abs difference allowed against transformers (float32, eval): the 1e-5.
    # Measured: 0 (BERT, ViT, MiniLM: the same kernels in the same order), ~2e-6 (GPT-2, BLOOM),
    # ~5e-6 (Marian); Llama (~8e-6) gets 2e-5, see test_hf_decoders.py.
    ATOL = 1e-5

    @staticmethod
    def ids(B: int, T: int, V: int, seed: int = 1, low: int = 1) -> Tensor:
        g = torch.Generator().manual_seed(seed)
        return torch.randint(low, V, (B, T), generator=g)

    @staticmethod
    def max_diff(a: Tensor, b: Tensor) -> float:
        assert a.shape == b.shape, (a.shape, b.shape)
        return (a - b).abs().max().item()

    @staticmethod
    def save(hf: Any, directory: Path) -> Path:
        """``hf.save_pretrained(directory)`` in eval mode; returns the directory."""
        hf.eval().save_pretrained(directory)
        return directory

    @staticmethod
    @torch.no_grad()
    def randomise(model: nn.Module, std: float = 0.2, seed: int = 0) -> None:
        """Large random values in every parameter (norm weights around 1), so a misplaced
        tensor shows in the outputs; attnlab's default init is too small for that."""
        g = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * std
            p.copy_(1.0 + noise if "norm" in name and name.endswith("weight") else noise)

    @staticmethod
    def assert_same_state(a: nn.Module, b: nn.Module) -> None:
        """Bitwise-equal state dicts, same names."""
        sa, sb = a.state_dict(), b.state_dict()
        assert list(sa) == list(sb)
        for name in sa:
            assert sa[name].dtype == sb[name].dtype and torch.equal(sa[name], sb[name]), name

    @staticmethod
    @torch.no_grad()
    def greedy_gpt(model: GPT, ids: Tensor, n_new: int) -> Tensor:
        """``n_new`` arg-max tokens after ``ids`` ``(B, T)``, with the KV cache."""
        cache = model.new_cache(ids.shape[1] + n_new)
        logits, _ = model(ids, cache=cache)
        out = []
        for _ in range(n_new):
            nxt = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
            out.append(nxt)
            logits, _ = model(nxt, cache=cache)
        return torch.cat(out, dim=1)  # (B, n_new)

    @staticmethod
    @torch.no_grad()
    def greedy_hf(hf: Any, ids: Tensor, n_new: int) -> Tensor:
        """transformers' greedy decoding of exactly ``n_new`` tokens (no stop at EOS)."""
        hf.generation_config.eos_token_id = None
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n_new,
            do_sample=False,
            num_beams=1,
            pad_token_id=0,
        )
        return out[:, ids.shape[1] :]


@pytest.fixture
def tools() -> type[Tools]:
    return Tools


@pytest.fixture
def transformers() -> ModuleType:
    """transformers, or skip (CI installs it with the [dev] / [hf] extras)."""
    module = pytest.importorskip("transformers")
    module.logging.set_verbosity_error()
    return module
