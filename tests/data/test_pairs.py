"""Sentence pairs for next-sentence prediction: balanced labels, IsNext pairs really
consecutive, NotNext never the true next line, segment ids, the split, determinism."""

from __future__ import annotations

import pytest
import torch

from attnlab.data.pairs import IS_NEXT, NOT_NEXT, SentencePairs, truncate_pair

CLS, SEP, PAD = 1, 2, 0


def numbered_lines(n: int = 200) -> list[list[int]]:
    """Line k holds the ids of k's decimal digits (+ 10) and a length marker: all distinct."""
    return [[10 + int(c) for c in str(k)] + [30 + k % 7] for k in range(n)]


def make(lines: list[list[int]] | None = None, **kw: object) -> SentencePairs:
    args: dict[str, object] = {"cls_id": CLS, "sep_id": SEP, "pad_id": PAD, "max_len": 16}
    args.update(kw)
    return SentencePairs(numbered_lines() if lines is None else lines, **args)  # type: ignore[arg-type]


def test_labels_are_balanced_and_pairs_are_what_their_label_says() -> None:
    pairs = make()
    g = torch.Generator().manual_seed(0)
    first, second, labels = pairs.pair_indices("train", 4000, g)
    assert 0.45 < labels.float().mean().item() < 0.55  # ~50/50 (std 0.008)
    is_next = labels == IS_NEXT
    assert torch.equal(second[is_next], first[is_next] + 1)  # really consecutive
    nxt = first[~is_next] + 1
    assert (second[~is_next] != nxt).all()  # NotNext is never the true next line
    assert (pairs.content[second[~is_next]] != pairs.content[nxt]).all()


def test_not_next_excludes_a_line_that_reads_like_the_true_next_one() -> None:
    """Lines repeat (a speaker's name): a NotNext B never has the true next line's text."""
    lines = [[5], [6], [5], [7], [5], [6], [8], [5]] * 10
    pairs = make(lines, val_fraction=0.2)
    first, second, labels = pairs.pair_indices("train", 2000, torch.Generator().manual_seed(3))
    texts = torch.tensor([line[0] for line in lines])
    random_b = labels == NOT_NEXT
    assert (texts[second[random_b]] != texts[first[random_b] + 1]).all()
    assert random_b.any()


def test_layout_and_segment_ids() -> None:
    pairs = make()
    batch = pairs.sample("train", 64, torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(1)
    first, second, labels = pairs.pair_indices("train", 64, g)
    assert torch.equal(batch.nsp_labels, labels)
    for k in range(64):
        a, b = pairs.lines[int(first[k])].tolist(), pairs.lines[int(second[k])].tolist()
        row = [CLS, *a, SEP, *b, SEP]
        n = len(row)
        assert batch.ids[k, :n].tolist() == row
        assert (batch.ids[k, n:] == PAD).all()
        assert batch.token_type_ids[k, :n].tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1)
        assert (batch.token_type_ids[k, n:] == 0).all()  # padding: segment 0
    assert batch.ids.shape[1] == int((batch.ids != PAD).sum(1).max())  # padded to the longest


def test_train_pairs_never_touch_validation_lines() -> None:
    pairs = make(val_fraction=0.25)
    lo, hi = pairs.split_range("val")
    assert (lo, hi) == (150, 200)
    g = torch.Generator().manual_seed(2)
    first, second, _ = pairs.pair_indices("train", 5000, g)
    assert int(first.max()) < 150 and int(second.max()) < 150
    first, second, _ = pairs.pair_indices("val", 5000, g)
    assert int(first.min()) >= 150 and int(second.min()) >= 150 and int(second.max()) < 200


def test_the_seed_fixes_the_pairing_and_the_generator_state_resumes_it() -> None:
    pairs = make()
    a = pairs.sample("train", 8, torch.Generator().manual_seed(5))
    b = pairs.sample("train", 8, torch.Generator().manual_seed(5))
    c = pairs.sample("train", 8, torch.Generator().manual_seed(6))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a.ids, c.ids) or not torch.equal(a.nsp_labels, c.nsp_labels)
    g = torch.Generator().manual_seed(7)
    pairs.sample("train", 8, g)
    state = g.get_state()
    nxt = pairs.sample("train", 8, g)
    resumed = torch.Generator()
    resumed.set_state(state)
    again = pairs.sample("train", 8, resumed)
    assert all(torch.equal(x, y) for x, y in zip(nxt, again, strict=True))


def test_long_pairs_are_truncated_to_max_len() -> None:
    assert truncate_pair([1, 2, 3, 4, 5], [6, 7], 5) == ([1, 2, 3], [6, 7])
    assert truncate_pair([1, 2], [3, 4, 5, 6], 4) == ([1, 2], [3, 4])
    lines = [list(range(10, 40)), list(range(40, 45))] * 10
    pairs = make(lines, max_len=12)
    batch = pairs.sample("train", 16, torch.Generator().manual_seed(0))
    assert batch.ids.shape[1] <= 12
    assert ((batch.ids == SEP).sum(1) == 2).all()


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"max_len": 4}, "max_len must be at least 5"),
        ({"val_fraction": 1.0}, r"val_fraction must be in \(0, 1\)"),
        ({"lines": [[1], [], [2]]}, "line 1 is empty"),
        ({"lines": [[4]] * 50}, "fewer than 2 distinct"),
    ],
)
def test_bad_input(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make(**kw)  # type: ignore[arg-type]


def test_unknown_split() -> None:
    with pytest.raises(ValueError, match="split='test' is not valid"):
        make().sample("test", 2, torch.Generator())  # type: ignore[arg-type]
