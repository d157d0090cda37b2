"""The synthetic recall tasks: the answer is exactly the token d positions before the query,
distractors are present, sampling is reproducible, and the objective trains through Trainer."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab.training import TrainConfig, Trainer
from attnlab.training.recall import QUERY, RecallObjective, RecallTask, recall_accuracy


@pytest.mark.parametrize("kind", ["copy", "associative"])
@pytest.mark.parametrize("d", [1, 2, 5, 16, 33])
def test_answer_is_the_token_d_back(kind: str, d: int) -> None:
    task = RecallTask(kind=kind, distance=d)  # type: ignore[arg-type]
    x, y = task.sample(64, torch.Generator().manual_seed(d))
    T = task.seq_len
    assert x.shape == y.shape == (64, T)
    assert task.seq_len == d + 2 * task.n_pairs + 2
    assert (y[:, :-1] == -100).all()
    assert torch.equal(y[:, -1], x[:, T - 1 - d])  # the answer sits d positions back
    assert ((y[:, -1] >= 1) & (y[:, -1] <= task.n_symbols)).all()
    if kind == "copy":
        assert (x[:, -1] == QUERY).all()
        signals = (x >= 1) & (x <= task.n_symbols)
        assert (signals.sum(1) == 1).all()  # one signal, the rest noise
    else:
        keys = (x[:, :-1] > task.n_symbols) & (x[:, :-1] <= 2 * task.n_symbols)
        assert (keys.sum(1) == task.n_pairs).all()  # distinct keys, one of them queried
        assert (x[:, :-1] == x[:, -1:]).sum(1).eq(1).all()
        assert torch.equal(x[:, T - 2 - d], x[:, -1])  # the queried key precedes its value


def test_reproducible_and_checked() -> None:
    task = RecallTask(kind="associative", distance=9, n_pairs=3)
    a = task.sample(8, torch.Generator().manual_seed(3))
    b = task.sample(8, torch.Generator().manual_seed(3))
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    for kwargs, message in (
        ({"kind": "sort"}, "kind='sort' is not valid"),
        ({"distance": 0}, "distance >= 1"),
        ({"vocab_size": 30}, "too small"),
        ({"n_pairs": 17}, "exceeds"),
        ({"distance": 10, "length": 10}, "shorter than 11"),
    ):
        with pytest.raises(ValueError, match=message):
            RecallTask(**kwargs)  # type: ignore[arg-type]


def test_objective_trains_any_lm() -> None:
    task = RecallTask(kind="copy", distance=3, length=8)
    config = TrainConfig(steps=2, batch_size=8, schedule="constant", lr=1e-3, progress=False,
                         optimizer="adamw", label_smoothing=0.0, eval_batches=2)  # fmt: skip
    for name in ("mamba-tiny", "lstm-tiny"):
        torch.manual_seed(0)
        model = attnlab.build_model(name, vocab_size=task.vocab_size)
        result = Trainer(model, RecallObjective(task), config).fit()
        assert result.step == 2 and len(result.losses) == 2
        assert 0.0 <= recall_accuracy(model, task, n=64) <= 1.0
