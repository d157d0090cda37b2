"""Tiny models of every family for the inspect tests (float32, eval, no dropout)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from attnlab.models import build_model


def _window(backend: str, kw: dict[str, Any]) -> dict[str, Any]:
    """A window of 4 keys for the sliding-window backend, so that its pattern matters."""
    return {"attn_window": 4, **kw} if backend == "sliding_window" else kw


def _gpt(backend: str = "sdpa", **kw: Any) -> nn.Module:
    kw = _window(backend, kw)
    kw = {"d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64, "max_seq_len": 32, **kw}
    return build_model("gpt-char-baby", dropout=0.0, attn_backend=backend, **kw).eval()


def _llama(backend: str = "sdpa", **kw: Any) -> nn.Module:
    return _gpt(
        backend, n_kv_heads=2, norm="rmsnorm", activation="swiglu", pos_encoding="rope",
        bias=False, tie_output=False, **kw,
    )  # fmt: skip


def _bert(backend: str = "sdpa", **kw: Any) -> nn.Module:
    kw = _window(backend, kw)
    kw = {"d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64, "vocab_size": 120, **kw}
    return build_model("bert-tiny", dropout=0.0, attn_backend=backend, **kw).eval()


def _vit(backend: str = "sdpa", **kw: Any) -> nn.Module:
    kw = _window(backend, kw)
    kw = {"d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64, **kw}
    return build_model("vit-digits", dropout=0.0, attn_backend=backend, **kw).eval()


def _cct(backend: str = "sdpa", **kw: Any) -> nn.Module:
    kw = _window(backend, kw)
    kw = {"d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64, "conv_channels": 16, **kw}
    return build_model("cct-cifar", dropout=0.0, attn_backend=backend, **kw).eval()


def _transformer(backend: str = "sdpa", **kw: Any) -> nn.Module:
    kw = _window(backend, kw)
    kw = {"d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64, **kw}
    return build_model("transformer-tiny", dropout=0.0, attn_backend=backend, **kw).eval()


def inputs(model: nn.Module, B: int = 2, T: int = 9, seed: int = 0) -> tuple[Any, ...]:
    """Positional inputs of ``model``'s forward (ids; src, tgt; images)."""
    g = torch.Generator().manual_seed(seed)
    name = type(model).__name__
    if name == "ViT":
        return (torch.randn(B, 1, 8, 8, generator=g),)
    if name == "CCT":
        return (torch.randn(B, 3, 32, 32, generator=g),)
    if name == "EncoderDecoderTransformer":
        src = torch.randint(3, 64, (B, T), generator=g)
        src[1, -2:] = 0  # padding: masked source keys
        return src, torch.randint(3, 64, (B, T - 3), generator=g)
    V = model.config.vocab_size
    return (torch.randint(5, V, (B, T), generator=g),)


FAMILIES: dict[str, Callable[..., nn.Module]] = {
    "gpt": _gpt,
    "llama": _llama,
    "bert": _bert,
    "vit": _vit,
    "cct": _cct,
    "transformer": _transformer,
}


@pytest.fixture
def make() -> dict[str, Callable[..., nn.Module]]:
    """family name -> builder(backend="sdpa", **config overrides) (seeded by the autouse
    fixture, so two builds with the same arguments have the same weights)."""
    return FAMILIES


@pytest.fixture
def example() -> Callable[..., tuple[Any, ...]]:
    return inputs
