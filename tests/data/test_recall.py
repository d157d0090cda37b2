"""The synthetic recall tasks' generator: the answer is exactly the token d positions before the
query, distractors are present, sampling is reproducible, bad tasks are refused (the objective
that trains on them: tests/training/test_recall.py)."""

from __future__ import annotations

import pytest
import torch

from attnlab.data.recall import QUERY, RecallTask


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
