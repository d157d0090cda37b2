"""The explorer's local web server: one page, three static files and a JSON API.

Standard library only (:class:`http.server.ThreadingHTTPServer`): one thread per connection, the
model behind the explorer's lock (one forward pass at a time). The model is fixed when the
server is made; nothing a request says can name another model or a file.

Routes:

- ``GET /``: the page; ``GET /static/NAME``: one of the files of ``static/`` (an allow-list of
  the names present at start-up: any other path, ``..`` and encoded variants included, is 404);
- ``GET /api/info``: sizes, capabilities and bounds;
- ``POST /api/analyze`` ``{"text" | "ids"}``: tokens, attention, rollout, cost, predictions;
  a ViT's input is ``{"image": {"shape", "data"}}`` or ``{"sample": N}`` here and in ``neuron``
  (:mod:`attnlab.explore.vision`);
- ``POST /api/neuron`` ``{"ids", "layer", "head", "query", "key"}``;
- ``POST /api/next`` ``{"ids" | "text", "temperature", "top_k", "top_p", "min_p", "n"}``;
- ``POST /api/step``: as ``next`` plus ``"sample"`` (bool) and ``"seed"``: appends one token
  (a GPT's steps reuse the KV cache of the sequence the last step ended on);
- ``POST /api/lens`` ``{"ids" | "text", "position", "top"}``;
- ``POST /api/translate`` ``{"ids" | "text", "num_beams", "max_new_tokens"}``: greedy vs beam;
- every input of an encoder-decoder is its source, with ``"target"`` (text after BOS) or
  ``"target_ids"`` the decoder input and ``"stack"`` (encoder, decoder, cross) in ``neuron``;
- ``POST /api/positional`` ``{"kind", "d_model", "length", "n_heads"}``; ``POST /api/masks``
  ``{"kinds", "seq_len", "window", "length", "query_len"}`` (:mod:`attnlab.explore.panels`).

Bound to a loopback address, the server answers only requests whose ``Host`` names one (403
otherwise), so a web page elsewhere cannot reach it by DNS rebinding.

Errors are JSON ``{"error": message}``: 400 for bad input (malformed JSON, a bad value, too many
tokens), 404, 405, 411 (no ``Content-Length``), 413 (a body over the bound), 500 for a failure of
the model (logged; the server keeps serving).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from attnlab.explore.data import Explorer, check_int
from attnlab.explore.lm import Sampling, lens_view, next_token, step
from attnlab.explore.panels import mask_view, positional_view
from attnlab.explore.seq2seq import encode_target, translate

STATIC = Path(__file__).resolve().parent / "static"
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".png": "image/png"}  # fmt: skip
log = logging.getLogger("attnlab.explore")
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


class RequestError(Exception):
    """A request the server refuses with ``status`` and ``message``."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def _ids(explorer: Explorer, body: dict[str, Any]) -> Any:
    """The request's input: token ids (from ``"text"`` or ``"ids"``), or a ViT's image (from
    ``"image"`` or ``"sample"``)."""
    if explorer.vision:
        if body.get("text") is not None or body.get("ids") is not None:
            raise ValueError(
                f"a {type(explorer.model).__name__} reads an image: give 'image' or 'sample', "
                "not text or ids"
            )
        return explorer.read_image(body.get("image"), body.get("sample"))
    if body.get("image") is not None:  # ("sample" is a step's sampling switch there)
        raise ValueError(f"'image' is for image models, not {explorer.family}")
    return explorer.encode(body.get("text"), body.get("ids"))


def _target(explorer: Explorer, body: dict[str, Any]) -> list[int] | None:
    """An encoder-decoder's decoder input (``"target"`` text or ``"target_ids"``)."""
    text, ids = body.get("target"), body.get("target_ids")
    if not explorer.seq2seq:
        if text is not None or ids is not None:
            raise ValueError("'target' and 'target_ids' are for encoder-decoder models")
        return None
    return encode_target(explorer, text, ids)


def _analyze(explorer: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    if explorer.vision:
        return explorer.analyze(ids=_ids(explorer, body))
    return explorer.analyze(body.get("text"), body.get("ids"), target=_target(explorer, body))


def _language_model(explorer: Explorer, what: str) -> None:
    if not explorer.language_model:
        raise ValueError(f"{what} is for language models, not {explorer.family}")


def _neuron(explorer: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    where: list[Any] = [body.get(k) for k in ("layer", "head", "query", "key")]  # checked there
    stack = body.get("stack", explorer.stacks()[0])
    ids, target = _ids(explorer, body), _target(explorer, body)
    return explorer.neuron(ids, *where, stack=stack, target=target)


def _next(explorer: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    _language_model(explorer, "the next-token view")
    ids, target, sampling = (
        _ids(explorer, body),
        _target(explorer, body),
        Sampling.from_request(body),
    )
    return next_token(explorer, ids, sampling, body.get("n", 20), target=target)


def _step(explorer: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    _language_model(explorer, "a generation step")
    sample, seed = body.get("sample", False), body.get("seed", 0)
    if not isinstance(sample, bool):
        raise ValueError(f"sample must be true or false, got {sample!r}")
    check_int("seed", seed, 0, 2**63)
    ids, target, sampling = (
        _ids(explorer, body),
        _target(explorer, body),
        Sampling.from_request(body),
    )
    return step(
        explorer, ids, sampling, sample=sample, seed=seed, n=body.get("n", 20), target=target
    )


def _lens(explorer: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    if not explorer.language_model:
        raise ValueError(f"the logit lens view is for language models, not {explorer.family}")
    ids, target = _ids(explorer, body), _target(explorer, body)
    n = len(explorer.inputs(ids, target)[-1][0])  # positions of the (decoder) input
    position = check_int("position", body.get("position", n - 1), -n, n)
    return lens_view(explorer, ids, position=position, top=body.get("top", 5), target=target)


def _translate(explorer: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    if not explorer.seq2seq:
        raise ValueError(f"translation is for encoder-decoder models, not {explorer.family}")
    return translate(
        explorer, _ids(explorer, body), num_beams=body.get("num_beams", 4),
        max_new_tokens=body.get("max_new_tokens", 32),
    )  # fmt: skip


def _positional(explorer: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    c = explorer.config
    return positional_view(
        body.get("kind"), d_model=body.get("d_model", c.d_model), length=body.get("length", 64),
        n_heads=body.get("n_heads", c.n_heads), model=explorer.model,
    )  # fmt: skip


ROUTES: dict[str, Callable[[Explorer, dict[str, Any]], dict[str, Any]]] = {
    "/api/analyze": _analyze,
    "/api/neuron": _neuron,
    "/api/next": _next,
    "/api/step": _step,
    "/api/lens": _lens,
    "/api/positional": _positional,
    "/api/masks": lambda e, b: mask_view(b),
    "/api/translate": _translate,
}


class ExploreHandler(BaseHTTPRequestHandler):
    """Serves one :class:`Explorer` (set on the server as ``server.explorer``)."""

    server_version = "attnlab-explore"
    timeout = 15  # seconds a connection may stall mid-request
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    @property
    def explorer(self) -> Explorer:
        return self.server.explorer  # type: ignore[attr-defined]

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, data: Any) -> None:
        body = json.dumps(data, allow_nan=False, separators=(",", ":")).encode()
        self._send(status, body, "application/json")

    def _error(self, status: HTTPStatus, message: str) -> None:
        self._json(status, {"error": message, "status": int(status)})

    def _path(self) -> str:
        return unquote(urlsplit(self.path).path)

    def _host_ok(self) -> bool:
        """On loopback, only requests naming a loopback host (no DNS rebinding: a web page
        elsewhere cannot reach this server under its own name); 403 otherwise."""
        allowed: frozenset[str] | None = self.server.allowed_hosts  # type: ignore[attr-defined]
        if allowed is None:
            return True
        host = urlsplit(f"//{self.headers.get('Host', '')}").hostname or ""
        if host in allowed:
            return True
        self.close_connection = True
        self._error(HTTPStatus.FORBIDDEN, f"host {host!r} is not this server's (a loopback name)")
        return False

    def do_GET(self) -> None:
        if not self._host_ok():
            return
        path = self._path()
        if path in ("/", "/index.html"):
            path = "/static/index.html"
        if path == "/favicon.ico":  # browsers ask; there is none
            self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
            return
        if path == "/api/info":
            try:
                info = self.explorer.info()
            except Exception as e:  # never a dropped connection: say what failed
                log.exception("explore /api/info failed")
                self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(e).__name__}: {e}")
                return
            self._json(200, info)
            return
        allowed: dict[str, Path] = self.server.static_files  # type: ignore[attr-defined]
        name = path.removeprefix("/static/") if path.startswith("/static/") else None
        if name is None or name not in allowed:
            self._error(HTTPStatus.NOT_FOUND, f"no such page or file: {self.path[:200]}")
            return
        file = allowed[name]
        self._send(200, file.read_bytes(), TYPES.get(file.suffix, "application/octet-stream"))

    do_HEAD = do_GET  # noqa: N815

    def _body(self) -> dict[str, Any]:
        length = self.headers.get("Content-Length")
        if length is None:
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, "a POST needs a Content-Length")
        try:
            n = int(length)
        except ValueError:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"bad Content-Length {length!r}") from None
        limit = self.explorer.max_body_bytes
        if n < 0:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"bad Content-Length {length!r}")
        if n > limit:
            self.close_connection = True  # the body is not read
            raise RequestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"the request body has {n} bytes; at most {limit} are accepted",
            )
        raw = self.rfile.read(n)
        if len(raw) < n:
            self.close_connection = True
            raise RequestError(
                HTTPStatus.BAD_REQUEST, f"the body ended after {len(raw)} of {n} bytes"
            )
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"the body is not valid JSON: {e}") from None
        except RecursionError:  # [[[[...]]]] deeper than the parser goes
            raise RequestError(
                HTTPStatus.BAD_REQUEST, "the body's JSON is nested too deeply"
            ) from None
        if not isinstance(data, dict):
            raise RequestError(
                HTTPStatus.BAD_REQUEST,
                f"the body must be a JSON object, got {type(data).__name__}",
            )
        return data

    def do_POST(self) -> None:
        if not self._host_ok():
            return
        route = ROUTES.get(self._path())
        try:
            if route is None:
                self.close_connection = True
                raise RequestError(HTTPStatus.NOT_FOUND, f"no such API: {self.path[:200]}")
            result = route(self.explorer, self._body())
        except RequestError as e:
            self.close_connection = True  # the body may be unread: start afresh
            self._error(e.status, str(e))
            return
        except (ValueError, TypeError) as e:
            self._error(HTTPStatus.BAD_REQUEST, str(e))
            return
        except KeyError as e:  # a token the tokenizer does not know, ...
            self._error(HTTPStatus.BAD_REQUEST, f"unknown key {e.args[0] if e.args else e!r}")
            return
        except Exception as e:  # the model failed: say so, keep serving
            log.exception("explore request %s failed", self.path)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(e).__name__}: {e}")
            return
        self._json(200, result)

    def _not_allowed(self) -> None:
        self.close_connection = True
        self._error(HTTPStatus.METHOD_NOT_ALLOWED, f"method {self.command} is not allowed")

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed  # noqa: N815


class ExploreServer(ThreadingHTTPServer):
    """The threading server of one explorer; a connection that fails (a client gone
    mid-answer) is logged, not printed."""

    daemon_threads = True
    request_queue_size = 64  # a burst of connections waits in the backlog, none is refused
    explorer: Explorer
    static_files: dict[str, Path]
    allowed_hosts: frozenset[str] | None  # None: any Host header (a non-loopback --host)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s failed", client_address, exc_info=True)


def make_server(explorer: Explorer, host: str = "127.0.0.1", port: int = 8765) -> ExploreServer:
    """A server for ``explorer`` bound to ``host:port`` (port 0: any free port); call
    ``serve_forever()`` on it (``server.server_address`` has the port).

    Raises:
        OSError: when the address cannot be bound.
    """
    server = ExploreServer((host, port), ExploreHandler)
    server.explorer = explorer
    server.static_files = {p.name: p for p in STATIC.iterdir() if p.is_file()}
    server.allowed_hosts = LOOPBACK if host in LOOPBACK else None
    return server


__all__ = ["ROUTES", "STATIC", "ExploreHandler", "ExploreServer", "make_server"]
