"""``attnlab explore MODEL``: the interactive explorer page, served locally, or one static file.

MODEL is a preset (built with random weights, seed 0, UTF-8 bytes as tokens), a model directory
(attnlab's or Hugging Face's layout) or a run directory, with its ``tokenizer.json`` (resolved as
``attnlab inspect`` does). The server listens on the loopback interface unless ``--host`` says
otherwise; the model is fixed here, the page cannot choose another. ``--text ... --html FILE``
writes a self-contained page (data embedded, no server) instead. A ViT reads an image instead
of text: ``--sample N`` (an image of the test split of the data set it was trained on, found from
the run directory's recipe or the image shape) or ``--image FILE``.
"""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

from attnlab.cli.common import check_writable, fail, guarded

# a preset is built with random weights: refuse those that would take minutes and gigabytes
MAX_PRESET_PARAMS = 400_000_000
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_parser(commands: Any) -> None:
    """The ``explore`` command."""
    p = commands.add_parser(
        "explore",
        help="the interactive explorer page (local server), or one static HTML file",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument("model", help="preset, model directory or run directory")
    p.add_argument("--tokenizer", help="a tokenizer.json to use instead of the model's")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: any free one)")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser")
    p.add_argument(
        "--max-tokens", type=int, default=128, help="most tokens per input (default 128)"
    )
    p.add_argument("--text", help="the page's first input (needed by --html)")
    p.add_argument("--target", help="encoder-decoder: the decoder input after BOS (--html)")
    p.add_argument("--html", help="write a self-contained page for --text here and exit")
    p.add_argument(
        "--sample", type=int, help="ViT: the test image of its data set the page starts with"
    )
    p.add_argument("--image", help="ViT: an image file (PNG, JPEG; needs Pillow) for --html")
    p.set_defaults(func=guarded("attnlab explore", run_explore))


def load(model: str, tokenizer: str | None) -> tuple[Any, Any]:
    """The model and tokenizer of a preset or a model/run directory."""
    from attnlab.models import PRESETS

    if model in PRESETS:
        import torch

        from attnlab.analysis import count_params
        from attnlab.models import build_model

        n = count_params(PRESETS[model])
        if n > MAX_PRESET_PARAMS:
            fail(
                f"preset {model!r} has {n:,} parameters; random weights are built only up to "
                f"{MAX_PRESET_PARAMS:,} (give a model directory instead)"
            )
        torch.manual_seed(0)
        built = build_model(model, dropout=0.0)
        tok = None
        if tokenizer is not None:
            from attnlab.tokenizers import load_tokenizer

            tok = load_tokenizer(tokenizer)
        return built, tok
    from attnlab.cli.generate import resolve
    from attnlab.pretrained import from_pretrained

    directory, tok = resolve(model, tokenizer)
    return from_pretrained(directory), tok


def image_spec(model: Any, path: str) -> Any:
    """A ViT's :class:`~attnlab.explore.vision.ImageSpec`: the recipe of the run directory
    ``path`` is in (``run.json`` at ``path`` or up to two folders above), else its image shape."""
    from pathlib import Path

    from attnlab.explore.vision import ImageSpec
    from attnlab.training.rundir import RunDir

    recipe, options = None, None
    here = Path(path)
    for p in (here, *list(here.parents)[:2]):
        run = RunDir(p)
        if p.is_dir() and run.holds_run():
            try:
                record = run.read_record()
            except (OSError, ValueError):
                break
            recipe, options = record.get("recipe"), record.get("options") or {}
            break
    return ImageSpec.for_config(model.config, recipe, options)


def read_image_file(path: str, size: int, channels: int) -> dict[str, Any]:
    """An image file, centre-cropped to a square and scaled to ``size``, as the explorer's
    ``{"shape": [H, W, C], "data": base64}`` (grey for one channel)."""
    import base64

    try:
        from PIL import Image
    except ImportError:
        fail("--image needs Pillow (pip install pillow; matplotlib brings it)")
    try:
        with Image.open(path) as im:
            im = im.convert("L" if channels == 1 else "RGB")
            side = min(im.size)
            left, top = (im.width - side) // 2, (im.height - side) // 2
            im = im.crop((left, top, left + side, top + side)).resize((size, size))
            raw = im.tobytes()
    except (OSError, ValueError) as e:
        fail(f"cannot read --image {path}: {e}")
    return {"shape": [size, size, channels], "data": base64.b64encode(raw).decode()}


def run_explore(args: argparse.Namespace) -> int:
    """Serve the explorer, or write its static page."""
    from attnlab.explore import Explorer, Limits, explore_html, make_server

    if not 0 <= args.port <= 65535:
        fail(f"--port must be in [0, 65535], got {args.port}")
    if args.max_tokens < 1:
        fail(f"--max-tokens must be >= 1, got {args.max_tokens}")
    check_writable(args.html, what="--html")
    model, tokenizer = load(args.model, args.tokenizer)
    from attnlab.explore.data import explorer_family

    family = explorer_family(model)  # a model the explorer shows, else a one-line error
    vit = not family.kind.reads_text  # an image classifier
    name = type(model).__name__
    if vit and (args.text is not None or args.target is not None):
        fail(f"a {name} reads an image, not text: give --sample N or --image FILE")
    if not vit and (args.sample is not None or args.image is not None):
        fail(f"--sample and --image are for image models; {args.model} reads text (--text)")
    if args.sample is not None and args.image is not None:
        fail("give one of --sample and --image")
    if args.html is not None and not vit and args.text is None:
        fail("--html needs --text: the input the page shows")
    if args.html is not None and vit and args.sample is None and args.image is None:
        fail("--html needs --sample N or --image FILE: the image the page shows")
    try:
        explorer = Explorer(
            model, tokenizer, name=args.model, limits=Limits(max_tokens=args.max_tokens),
            default_text=args.text or "",
            images=image_spec(model, args.model) if vit else None,
        )  # fmt: skip
    except ValueError as e:
        fail(str(e))
    image = None
    if vit and args.image is not None:
        spec = explorer.images
        image = read_image_file(args.image, spec.size, spec.channels)  # type: ignore[union-attr]
    if vit:
        explorer.default_input = {"sample": args.sample} if args.sample is not None else image
    if args.html is not None:
        from attnlab.io import atomic_write_text

        if vit:
            page = explore_html(explorer, image=image, sample=args.sample)
        else:
            page = explore_html(explorer, args.text, target=args.target)
        path = atomic_write_text(args.html, page)
        print(f"wrote {path}")
        return 0
    server = make_server(explorer, args.host, args.port)
    host, port = str(server.server_address[0]), int(server.server_address[1])
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/"
    if args.host not in LOOPBACK:
        print(f"attnlab explore: warning: listening on {args.host}: reachable from other machines",
              file=sys.stderr)  # fmt: skip
    print(f"attnlab explore: {args.model} at {url} (Ctrl-C stops)", flush=True)
    if not args.no_browser:
        import webbrowser

        threading.Timer(0.5, webbrowser.open, args=(url,)).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("attnlab explore: stopped")
    finally:
        server.server_close()
    return 0


__all__ = ["add_parser", "load", "run_explore"]
