"""``attnlab explore``: the static export, serving (in-process), bad flags (exit 2, one line)."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from attnlab.explore.server import ExploreServer

from .conftest import TEXT, exit_code


def test_html_export(
    gpt_dir: Path, seq2seq_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "page.html"
    assert exit_code(["explore", str(gpt_dir), "--text", TEXT, "--html", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    html = out.read_text(encoding="utf-8")
    assert 'id="explore-data"' in html and "window.__explore" in html
    argv = ["explore", str(seq2seq_dir), "--text", TEXT, "--target", "le", "--html", str(out)]
    assert exit_code(argv) == 0
    assert '"target":"le"' in out.read_text(encoding="utf-8")


def test_serving_a_model_directory(
    gpt_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: dict[str, Any] = {}
    real = ExploreServer.serve_forever

    def serve_then_stop(self: ExploreServer, poll_interval: float = 0.5) -> None:
        thread = threading.Thread(target=real, args=(self,), daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{self.server_address[1]}/api/info"
        with urllib.request.urlopen(url, timeout=30) as r:
            seen.update(json.loads(r.read()))
        self.shutdown()
        raise KeyboardInterrupt

    monkeypatch.setattr(ExploreServer, "serve_forever", serve_then_stop)
    argv = ["explore", str(gpt_dir), "--port", "0", "--no-browser", "--max-tokens", "20",
            "--text", "the cat"]  # fmt: skip
    assert exit_code(argv) == 0
    out = capsys.readouterr().out
    assert "at http://127.0.0.1:" in out and "stopped" in out
    assert seen["max_tokens"] == 20 and seen["default_text"] == "the cat"
    assert seen["name"] == str(gpt_dir) and seen["n_layers"] == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["explore", "gpt-char-baby", "--port", "70000"], "--port must be in [0, 65535]"),
        (["explore", "gpt-char-baby", "--max-tokens", "0"], "--max-tokens must be >= 1"),
        (["explore", "gpt-char-baby", "--html", "x.html"], "--html needs --text"),
        (["explore", "gpt3-175b", "--no-browser"], "random weights are built only up to"),
        (["explore", "no/such/dir", "--no-browser"], "does not exist"),
        (["explore", "cct-cifar", "--no-browser"], "vit (ViT) models, got CCT"),
        (["explore", "gpt-char-baby", "--text", "ab", "--target", "c", "--html", "{tmp}/x.html"],
         "target is for encoder-decoder models"),
        (["explore", "gpt-char-baby", "--text", "a" * 300, "--html", "{tmp}/x.html"],
         "at most 64 are allowed (the model's context, max_seq_len=64)"),
    ],
)  # fmt: skip
def test_bad_input_exits_2_with_one_line(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert exit_code(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_port_in_use_is_a_clear_error(gpt_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert exit_code(["explore", str(gpt_dir), "--port", str(port), "--no-browser"]) == 2
    assert "address already in use" in capsys.readouterr().err.lower()
