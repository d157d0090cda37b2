"""The explorer's server on port 0 in a thread: the page, the API, bad requests, traversal
attempts and a burst of concurrent requests."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from attnlab.explore import Explorer, make_server
from attnlab.explore.lm import Sampling, lens_view, next_token, step
from attnlab.explore.panels import positional_view

from .conftest import TEXT


@pytest.fixture(scope="module")
def server(gpt_explorer: Explorer) -> Iterator[tuple[str, int]]:
    srv = make_server(gpt_explorer, "127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield "127.0.0.1", int(srv.server_address[1])
    srv.shutdown()
    srv.server_close()


def request(
    addr: tuple[str, int], method: str, path: str, body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    conn = http.client.HTTPConnection(*addr, timeout=30)
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    conn.request(method, path, body=data, headers=headers or {})
    resp = conn.getresponse()
    out = resp.status, dict(resp.getheaders()), resp.read()
    conn.close()
    return out


def post(addr: tuple[str, int], path: str, body: Any) -> tuple[int, Any]:
    status, _, raw = request(addr, "POST", path, body, {"Content-Type": "application/json"})
    return status, json.loads(raw)


def raw_request(addr: tuple[str, int], data: bytes) -> bytes:
    with socket.create_connection(addr, timeout=30) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_page_assets_and_info(server: tuple[str, int], gpt_explorer: Explorer) -> None:
    status, headers, body = request(server, "GET", "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert b'<script src="/static/explore.js">' in body
    for name, kind in (("explore.js", "text/javascript"), ("explore.css", "text/css")):
        status, headers, _ = request(server, "GET", f"/static/{name}")
        assert status == 200 and headers["Content-Type"].startswith(kind)
    status, _, body = request(server, "GET", "/api/info")
    assert status == 200 and json.loads(body) == gpt_explorer.info()


def test_api_answers_equal_the_data_layer(server: tuple[str, int], gpt_explorer: Explorer) -> None:
    e = gpt_explorer
    status, a = post(server, "/api/analyze", {"text": TEXT})
    assert status == 200 and a == json.loads(json.dumps(e.analyze(TEXT)))
    ids = a["ids"]
    status, n = post(
        server, "/api/neuron", {"ids": ids, "layer": 1, "head": 2, "query": 6, "key": 3}
    )
    assert status == 200 and n == json.loads(json.dumps(e.neuron(ids, 1, 2, 6, 3)))
    body = {"ids": ids, "temperature": 0.6, "top_k": 5, "n": 8}
    status, nx = post(server, "/api/next", body)
    assert status == 200 and nx == next_token(e, ids, Sampling(0.6, top_k=5), n=8)
    status, st = post(server, "/api/step", {**body, "sample": True, "seed": 3})
    assert status == 200
    again = step(e, ids, Sampling(0.6, 5), sample=True, seed=3, n=8)  # now from the KV cache
    assert again["cache"] == {"reused": len(ids), "computed": 0}
    assert {**st, "cache": again["cache"]} == json.loads(json.dumps(again))
    status, lens = post(server, "/api/lens", {"text": TEXT, "position": 4, "top": 2})
    assert status == 200 and lens == lens_view(e, ids, position=4, top=2)
    status, pos = post(server, "/api/positional", {"kind": "alibi", "length": 9})
    want = positional_view("alibi", d_model=32, length=9, n_heads=4, model=e.model)
    assert status == 200 and pos == want
    status, masks = post(server, "/api/masks", {"kinds": ["causal"], "seq_len": 3})
    assert status == 200 and masks == {"causal": [[1, 0, 0], [1, 1, 0], [1, 1, 1]]}


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/api/analyze", b'{"text": "abc"', 400, "not valid JSON"),
        ("/api/analyze", b"\xff\xfe", 400, "not valid JSON"),
        ("/api/analyze", b"[1, 2]", 400, "must be a JSON object, got list"),
        ("/api/analyze", b"[" * 30000 + b"]" * 30000, 400, "nested too deeply"),
        ("/api/next", b'{"text": "ab", "temperature": NaN}', 400, "temperature must be a finite"),
        ("/api/neuron", b'{"text": "ab", "layer": ' + b"9" * 5000 + b"}", 400, "digits"),
        ("/api/analyze", b"{}", 400, "exactly one of 'text' and 'ids'"),
        ("/api/analyze", {"text": "a" * 49}, 400, "the input has 49 tokens; at most 48"),
        ("/api/analyze", {"text": "ABC"}, 400, "not in the vocabulary"),
        ("/api/analyze", {"ids": [1, "2"]}, 400, "ids[1] must be an integer"),
        ("/api/analyze", {"text": ["a"]}, 400, "'text' must be a string"),
        ("/api/neuron", {"text": "abc", "layer": 9, "head": 0, "query": 0, "key": 0}, 400,
         "layer must be an integer in [0, 2), got 9"),
        ("/api/neuron", {"text": "abc"}, 400, "layer must be an integer in [0, 2), got None"),
        ("/api/next", {"text": "abc", "temperature": "hot"}, 400, "temperature must be"),
        ("/api/next", {"text": "abc", "n": 10**6}, 400, "n must be an integer in [1, 101)"),
        ("/api/step", {"text": "abc", "sample": "yes"}, 400, "sample must be true or false"),
        ("/api/lens", {"text": "abc", "position": 7}, 400, "position must be an integer"),
        ("/api/positional", {"kind": "xpos"}, 400, "unknown positional kind 'xpos'"),
        ("/api/masks", {"seq_len": 0}, 400, "seq_len must be an integer in [1, 257)"),
        ("/api/nothing", {}, 404, "no such API"),
    ],
)  # fmt: skip
def test_bad_requests_get_a_4xx_and_a_message(
    server: tuple[str, int], path: str, body: Any, status: int, message: str
) -> None:
    got, data = post(server, path, body)
    assert got == status and message in data["error"], data


def test_size_length_and_method_bounds(server: tuple[str, int], gpt_explorer: Explorer) -> None:
    limit = gpt_explorer.limits.max_body_bytes
    status, data = post(server, "/api/analyze", {"text": "a" * (limit + 10)})
    assert status == 413 and f"at most {limit}" in data["error"]
    # a huge claimed length is refused before anything is read
    reply = raw_request(server, b"POST /api/analyze HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: "
                        b"999999999999\r\nConnection: close\r\n\r\n")  # fmt: skip
    assert reply.startswith(b"HTTP/1.1 413")
    reply = raw_request(
        server, b"POST /api/analyze HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    assert reply.startswith(b"HTTP/1.1 411") and b"Content-Length" in reply
    reply = raw_request(server, b"POST /api/analyze HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: "
                        b"abc\r\nConnection: close\r\n\r\n")  # fmt: skip
    assert reply.startswith(b"HTTP/1.1 400")
    for method in ("PUT", "DELETE", "PATCH"):
        status, _, body = request(server, method, "/api/analyze", b"{}")
        assert status == 405 and b"not allowed" in body
    status, _, _ = request(server, "GET", "/api/analyze")
    assert status == 404


@pytest.mark.parametrize(
    "path",
    [
        "/static/../server.py", "/static/../../../../etc/passwd", "/static/%2e%2e/server.py",
        "/static/..%2fserver.py", "/static/%2e%2e%2f%2e%2e%2fcli%2fexplore.py", "/../etc/passwd",
        "/static//etc/passwd", "/static/%2fetc%2fpasswd", "/static/", "/static/.",
        "/static/explore.js%00.html", "/static/EXPLORE.JS", "/server.py", "/data.py",
        "/static/static/index.html", "//etc/passwd", "/static/..\\server.py", "/etc/passwd",
    ],
)  # fmt: skip
def test_no_file_outside_the_static_folder(server: tuple[str, int], path: str) -> None:
    reply = raw_request(
        server, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
    )
    assert reply.split(b"\r\n", 1)[0] in (b"HTTP/1.1 404 Not Found", b"HTTP/1.1 400 Bad Request")
    assert b"root:" not in reply and b"import" not in reply


@pytest.mark.parametrize("host", ["evil.example", "evil.example:80", "127.0.0.1.evil.example"])
def test_other_host_names_are_refused(server: tuple[str, int], host: str) -> None:
    for method, path, body in (("GET", "/", b""), ("POST", "/api/analyze", b'{"text": "ab"}')):
        head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n"
        reply = raw_request(server, head.encode() + b"Connection: close\r\n\r\n" + body)
        assert reply.startswith(b"HTTP/1.1 403") and b"is not this server's" in reply
    assert request(server, "GET", "/api/info", headers={"Host": f"localhost:{server[1]}"})[0] == 200


def test_a_failing_model_is_a_500_and_the_server_goes_on(
    server: tuple[str, int], gpt_explorer: Explorer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the model broke")

    monkeypatch.setattr(gpt_explorer, "analyze", broken)
    status, data = post(server, "/api/analyze", {"text": "abc"})
    assert status == 500 and "the model broke" in data["error"]
    monkeypatch.undo()
    assert post(server, "/api/analyze", {"text": "abc"})[0] == 200


def test_a_stalled_client_does_not_block_the_others(server: tuple[str, int]) -> None:
    with socket.create_connection(server, timeout=30) as stalled:
        stalled.sendall(
            b"POST /api/analyze HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{"
        )
        t0 = time.perf_counter()
        assert post(server, "/api/analyze", {"text": "abc"})[0] == 200
        assert time.perf_counter() - t0 < 10


def test_a_burst_of_32_concurrent_requests(server: tuple[str, int], gpt_explorer: Explorer) -> None:
    texts = [TEXT[: 5 + i] for i in range(8)]
    jobs: list[tuple[str, dict[str, Any]]] = []
    for i in range(32):
        text = texts[i % 8]
        ids = gpt_explorer.encode(text)
        jobs.append([
            ("/api/analyze", {"text": text}),
            ("/api/next", {"ids": ids, "temperature": 0.5 + i / 32}),
            ("/api/neuron", {"ids": ids, "layer": i % 2, "head": i % 4, "query": len(ids) - 1,
                             "key": i % len(ids)}),
            ("/api/info", {}),
        ][i % 4])  # fmt: skip
    expected = [post(server, p, b)[1] if p != "/api/info" else gpt_explorer.info() for p, b in jobs]

    def one(job: tuple[str, dict[str, Any]]) -> tuple[int, Any]:
        path, body = job
        if path == "/api/info":
            status, _, raw = request(server, "GET", path)
            return status, json.loads(raw)
        return post(server, path, body)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(one, jobs))
    elapsed = time.perf_counter() - t0
    assert [s for s, _ in results] == [200] * 32
    assert [r for _, r in results] == expected  # each answer is its own input's
    assert elapsed < 30, f"32 concurrent requests took {elapsed:.1f} s"
    assert request(server, "GET", "/api/info")[0] == 200
