"""Greedy decoding of the encoder-decoder with ``generate``: the KV-cached loop equals full
recomputation; EOS handling; model mode."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from attnlab.generation import generate
from attnlab.models import EncoderDecoderTransformer, TransformerConfig

BOS, EOS, PAD = 1, 2, 0


def _model(pos_encoding: str = "sinusoidal", **overrides: object) -> EncoderDecoderTransformer:
    torch.manual_seed(0)
    config = TransformerConfig(
        vocab_size=20,
        d_model=32,
        n_heads=4,
        n_layers=2,
        d_ff=64,
        dropout=0.1,
        max_seq_len=32,
        pos_encoding=pos_encoding,
        **overrides,  # type: ignore[arg-type]
    )
    return EncoderDecoderTransformer(config)


def _src() -> Tensor:
    src = torch.randint(3, 20, (5, 9), generator=torch.Generator().manual_seed(1))
    src[1, 6:] = PAD  # right padding
    src[3, 2:] = PAD
    return src


def _greedy_without_cache(model: EncoderDecoderTransformer, src: Tensor, max_len: int) -> Tensor:
    """Reference: re-run the decoder on the whole prefix at every step."""
    model.eval()
    with torch.no_grad():
        src_mask = src != PAD
        memory = model.encode(src, src_mask=src_mask)
        ys = torch.full((src.shape[0], 1), BOS)
        for _ in range(max_len):
            logits = model.decode(ys, memory, src_mask=src_mask)  # (B, T, V)
            ys = torch.cat([ys, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    out = ys[:, 1:]
    after_eos = (out == EOS).long().cumsum(1) - (out == EOS).long() > 0  # strictly after 1st EOS
    out = out.masked_fill(after_eos, PAD)
    if (out == EOS).any(1).all():  # the cached loop stops once every row is done
        out = out[:, : int((out == EOS).float().argmax(1).max()) + 1]
    return out


@pytest.mark.parametrize("pos_encoding", ["sinusoidal", "learned", "rope", "alibi"])
@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_cached_equals_full_recompute(pos_encoding: str, norm_position: str) -> None:
    model = _model(pos_encoding, norm_position=norm_position)
    src = _src()
    ours = generate(model, src, max_new_tokens=12)
    ref = _greedy_without_cache(model, src, 12)
    assert ours.shape == (5, 12)
    assert torch.equal(ours, ref)


def test_cached_equals_full_recompute_with_eos() -> None:
    # Make EOS likely so that rows finish at different steps.
    model = _model(tie_output=False)
    with torch.no_grad():
        model.lm_head.weight[EOS] *= 4
    src = _src()
    ours = generate(model, src, max_new_tokens=20)
    ref = _greedy_without_cache(model, src, 20)
    assert (ours == EOS).any(), "test needs some EOS"
    assert torch.equal(ours, ref)


class _Scripted(EncoderDecoderTransformer):
    """A model whose decoder emits a fixed token script per row (to test the loop itself)."""

    def __init__(self, script: list[list[int]]) -> None:
        super().__init__(TransformerConfig(vocab_size=10, d_model=8, n_heads=2, n_layers=1, d_ff=8))
        self.script = torch.tensor(script)
        self.calls = 0

    def decode(self, tgt: Tensor, memory: Tensor, **kwargs: object) -> Tensor:
        ids = self.script[:, self.calls]
        self.calls += 1
        return torch.nn.functional.one_hot(ids, 10).float().unsqueeze(1)  # (B, 1, V)


def test_stops_when_every_row_has_eos_and_pads_after_it() -> None:
    model = _Scripted([[5, EOS, 7, 7, 7, 7], [5, 6, 7, EOS, 9, 9], [EOS, 3, 3, 3, 3, 3]])
    out = generate(model, torch.full((3, 4), 5), max_new_tokens=6)
    assert out.tolist() == [[5, EOS, PAD, PAD], [5, 6, 7, EOS], [EOS, PAD, PAD, PAD]]
    assert model.calls == 4  # stopped early


def test_max_len_without_eos() -> None:
    model = _Scripted([[5, 6, 7, 8]])
    assert generate(model, torch.full((1, 2), 5), max_new_tokens=3).tolist() == [[5, 6, 7]]


def test_restores_training_mode_and_is_deterministic() -> None:
    model = _model()  # dropout 0.1: a train-mode decode would be random
    model.train()
    src = _src()
    a = generate(model, src, max_new_tokens=8)
    assert model.training
    b = generate(model, src, max_new_tokens=8)
    assert torch.equal(a, b)
    model.eval()
    generate(model, src, max_new_tokens=2)
    assert not model.training


def test_errors() -> None:
    model = _model()
    with pytest.raises(ValueError, match="max_new_tokens must be positive, got 0"):
        generate(model, _src(), max_new_tokens=0)
    with pytest.raises(ValueError, match=r"must be \(B, T\) or \(T,\)"):
        generate(model, _src()[None], max_new_tokens=3)
    one = _src()[:1]  # a 1-D source is one sequence
    assert torch.equal(
        generate(model, one[0], max_new_tokens=3), generate(model, one, max_new_tokens=3)
    )
