"""Batch-size and sequence-length warmup (issue 51): the closed form of the ramp, the shapes the
trainer computes on, refusals where an objective cannot cut its batches, and bitwise resume of a
run with Muon, WSD, both warmups and every speedrun architecture option on."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.data.text import TokenStream
from attnlab.models import GPT, GPTConfig
from attnlab.training.config import TrainConfig
from attnlab.training.objectives import CausalLMObjective, Seq2SeqObjective
from attnlab.training.schedules import warmup_size
from attnlab.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# -- the closed form -----------------------------------------------------------------------------


def test_warmup_size_is_the_rounded_linear_ramp() -> None:
    sizes = [warmup_size(s, start=16, full=128, steps=10, multiple=8) for s in range(12)]
    # 16 + 112·s/10 rounded down to a multiple of 8, then 128 from step 10 on
    expected = [16 + 112 * s // 10 // 8 * 8 if s else 16 for s in range(10)] + [128, 128]
    assert sizes == [max(16, e) for e in expected]
    assert sizes[0] == 16 and sizes[-1] == 128
    assert all(a <= b for a, b in itertools.pairwise(sizes))  # never shrinks
    assert all(x % 8 == 0 for x in sizes)
    assert [warmup_size(s, start=1, full=5, steps=4) for s in range(6)] == [1, 2, 3, 4, 5, 5]
    assert warmup_size(0, start=3, full=9, steps=0) == 9  # off
    # a start that is not a multiple of `multiple` is kept (clipped to [start, full])
    assert warmup_size(0, start=12, full=64, steps=8, multiple=8) == 12


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"start": 0, "full": 4, "steps": 2}, "need 1 <= start <= full"),
        ({"start": 5, "full": 4, "steps": 2}, "need 1 <= start <= full"),
        ({"start": 1, "full": 4, "steps": -1}, "steps must be >= 0"),
        ({"start": 1, "full": 4, "steps": 2, "multiple": 0}, "multiple must be >= 1"),
    ],
)
def test_warmup_size_rejects_bad_values(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        warmup_size(0, **kwargs)


# -- the trainer -------------------------------------------------------------------------------


class Recording(CausalLMObjective):
    """A causal LM objective that records the shape of every training batch it computes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.shapes: list[tuple[int, ...]] = []

    def loss(self, model: Any, batch: Any, *, label_smoothing: float) -> Any:
        if model.training:
            self.shapes.append(tuple(batch[0].shape))
        return super().loss(model, batch, label_smoothing=label_smoothing)


def _stream() -> TokenStream:
    return TokenStream(torch.randint(11, (3000,), generator=torch.Generator().manual_seed(1)))


def test_the_trainer_computes_on_the_warmup_shapes() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                          max_seq_len=32, dropout=0.0, eos_id=None))  # fmt: skip
    objective = Recording(_stream(), block_size=32)
    config = TrainConfig(steps=8, batch_size=6, grad_accum=2, schedule="constant", warmup=0,
                         lr=1e-3, batch_warmup=4, batch_warmup_start=2, seq_warmup=6,
                         seq_warmup_start=8, seq_warmup_multiple=8, progress=False)  # fmt: skip
    result = Trainer(model, objective, config).fit()
    rows = [warmup_size(s, start=2, full=6, steps=4) for s in range(8)]
    lengths = [warmup_size(s, start=8, full=32, steps=6, multiple=8) for s in range(8)]
    assert rows == [2, 3, 4, 5, 6, 6, 6, 6] and lengths == [8, 8, 16, 16, 24, 24, 32, 32]
    # two micro-batches per step, both cut alike
    assert objective.shapes == [(r, n) for r, n in zip(rows, lengths, strict=True) for _ in "ab"]
    assert len(result.losses) == 8 and all(torch.isfinite(torch.tensor(result.losses)))


def test_without_warmups_nothing_is_cut() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                          max_seq_len=16, dropout=0.0, eos_id=None))  # fmt: skip
    objective = Recording(_stream(), block_size=16)
    config = TrainConfig(steps=3, batch_size=4, schedule="constant", warmup=0, lr=1e-3,
                         progress=False)  # fmt: skip
    Trainer(model, objective, config).fit()
    assert objective.shapes == [(4, 16)] * 3


def test_warmups_are_refused_where_batches_cannot_be_cut() -> None:
    model = GPT(GPTConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                          max_seq_len=16, dropout=0.0, eos_id=None))  # fmt: skip
    seq2seq = Seq2SeqObjective(lambda b, s: None, [], pad_id=0)  # type: ignore[arg-type]
    config = TrainConfig(steps=3, schedule="constant", warmup=0, lr=1e-3, seq_warmup=2)
    with pytest.raises(ValueError, match="seq_warmup cannot apply to Seq2SeqObjective"):
        Trainer(model, seq2seq, config)
    with pytest.raises(ValueError, match="batch_warmup_start=8 is larger than batch_size=4"):
        TrainConfig(batch_size=4, batch_warmup=2, batch_warmup_start=8)
    with pytest.raises(ValueError, match="seq_warmup must be >= 0, got -1"):
        TrainConfig(seq_warmup=-1)


# -- exact resume with everything on -----------------------------------------------------------

EVERY_OPTION = GPTConfig(
    vocab_size=11, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_seq_len=16, dropout=0.1,
    eos_id=None, pos_encoding="rope", norm="rmsnorm", activation="relu2", qk_norm=True,
    logit_softcap=30.0, zero_init_proj=True, tie_output=False, value_embeddings=1, x0_skip=True,
)  # fmt: skip
EVERYTHING = TrainConfig(
    steps=8, batch_size=4, grad_accum=2, optimizer="muon", muon_lr=0.02, lr=1e-2,
    betas=(0.9, 0.95), schedule="wsd", warmup=2, decay_fraction=0.25, weight_decay=0.1,
    batch_warmup=4, batch_warmup_start=2, seq_warmup=5, seq_warmup_start=4,
    seq_warmup_multiple=4, eval_every=3, progress=False, log_every=1,
)  # fmt: skip


def _trainer(run_dir: Path) -> Trainer:
    torch.manual_seed(0)
    objective = CausalLMObjective(_stream(), block_size=16)
    return Trainer(GPT(EVERY_OPTION), objective, EVERYTHING, run_dir=run_dir)


def test_resume_with_every_option_and_both_warmups_is_bitwise(tmp_path: Path) -> None:
    full = _trainer(tmp_path / "full")
    full_result = full.fit()
    first = _trainer(tmp_path / "split").fit(until=3)  # stopped inside both warmups
    torch.manual_seed(123)  # a fresh process's RNG: resume must restore the saved one
    resumed = _trainer(tmp_path / "split")
    second = resumed.fit(resume=True)
    assert second.step == 8
    assert first.losses + second.losses == full_result.losses
    states = zip(full.model.state_dict().items(), resumed.model.state_dict().items(), strict=True)
    for (name, a), (_, b) in states:
        assert torch.equal(a, b), name
    # the options were live: the zero-initialised projections moved, the x0 mix is trained
    assert float(full.model.layers[0].self_attn.out_proj.weight.detach().abs().sum()) > 0
