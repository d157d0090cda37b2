"""``attnlab explore MODEL``: the interactive explorer page, served locally, or one static file.

MODEL is a preset (built with random weights, seed 0, UTF-8 bytes as tokens), a model directory
(attnlab's or Hugging Face's layout) or a run directory, with its ``tokenizer.json`` (resolved as
``attnlab inspect`` does). The server listens on the loopback interface unless ``--host`` says
otherwise; the model is fixed here, the page cannot choose another. ``--text ... --html FILE``
writes a self-contained page (data embedded, no server) instead.
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


def run_explore(args: argparse.Namespace) -> int:
    """Serve the explorer, or write its static page."""
    from attnlab.explore import Explorer, Limits, explore_html, make_server

    if not 0 <= args.port <= 65535:
        fail(f"--port must be in [0, 65535], got {args.port}")
    if args.max_tokens < 1:
        fail(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if args.html is not None and args.text is None:
        fail("--html needs --text: the input the page shows")
    check_writable(args.html, what="--html")
    model, tokenizer = load(args.model, args.tokenizer)
    explorer = Explorer(
        model, tokenizer, name=args.model, limits=Limits(max_tokens=args.max_tokens),
        default_text=args.text or "",
    )  # fmt: skip
    if args.html is not None:
        from attnlab.io import atomic_write_text

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
