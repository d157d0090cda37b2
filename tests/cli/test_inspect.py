"""``attnlab inspect``: cached activations to safetensors (with their names), the lens table,
the hook list, and bad input (exit 2 with one line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from attnlab.cli import main
from attnlab.inspect import logit_lens, run_with_cache
from attnlab.models import build_model
from attnlab.pretrained import save_pretrained
from attnlab.tokenizers import CharTokenizer

TEXT = "to be or not"


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    tok = CharTokenizer(sorted(set("abcdefghijklmnopqrstuvwxyz ")))
    model = build_model(
        "gpt-char-baby", vocab_size=tok.vocab_size, d_model=32, n_heads=4, n_layers=2, d_ff=64,
        dropout=0.0,
    )  # fmt: skip
    directory = tmp_path / "model"
    save_pretrained(model, directory)
    tok.save(directory / "tokenizer.json")
    return directory


def test_out_writes_the_named_activations(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cache.safetensors"
    code = main(
        ["inspect", str(model_dir), "--text", TEXT, "--names", "layers.*.attn.weights",
         "--names", "logits", "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    assert "wrote" in capsys.readouterr().out
    from attnlab.pretrained import from_pretrained

    model = from_pretrained(model_dir).eval()
    tok = CharTokenizer(sorted(set("abcdefghijklmnopqrstuvwxyz ")))
    x = torch.tensor([tok.encode(TEXT)])  # (1, T)
    _, cache = run_with_cache(model, x, names="layers.1.attn.weights")
    with safe_open(str(out), "pt") as f:
        assert sorted(f.keys()) == ["layers.0.attn.weights", "layers.1.attn.weights", "logits"]
        assert json.loads(f.metadata()["tokens"]) == list(TEXT)
        w = f.get_tensor("layers.1.attn.weights")
        assert w.shape == (1, 4, len(TEXT), len(TEXT))
        assert torch.equal(w, cache["layers.1.attn.weights"])


def test_dtype_and_list(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "half.safetensors"
    assert (
        main(["inspect", str(model_dir), "--ids", "1,2,3", "--dtype", "float16", "--out", str(out)])
        == 0
    )
    with safe_open(str(out), "pt") as f:
        assert f.get_tensor("layers.0.resid_pre").dtype == torch.float16
        keys = set(f.keys())
        assert {"layers.0.resid_post", "layers.1.resid_pre"} <= keys  # one entry each
    capsys.readouterr()
    assert main(["inspect", str(model_dir), "--ids", "1,2,3", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(
        line.startswith("layers.1.attn.weights") and "(1, 4, 3, 3)" in line for line in lines
    )


def test_lens_table(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(model_dir), "--text", TEXT, "--lens", "--top", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    header = [i for i, line in enumerate(out) if line.startswith("logit lens at position")]
    assert header and out[header[0]].startswith(
        f"logit lens at position {len(TEXT) - 1} of {len(TEXT)}"
    )
    rows = out[header[0] + 1 :]
    assert [r.split()[0] for r in rows] == ["embed", "layer", "layer"]
    from attnlab.pretrained import from_pretrained

    model = from_pretrained(model_dir).eval()
    tok = CharTokenizer(sorted(set("abcdefghijklmnopqrstuvwxyz ")))
    best, p = logit_lens(model, torch.tensor([tok.encode(TEXT)]), positions=-1).top(1)[-1][0]
    assert rows[-1].strip().split("  ")[1] == f"{tok.decode([best])!r} {p:.3f}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--text", TEXT], "say what to do"),
        (["--lens"], "pass exactly one of --text and --ids"),
        (["--ids", "1,x", "--lens"], "--ids must be comma-separated integers"),
        (
            ["--text", TEXT, "--names", "layers.7.*", "--out", "c.safetensors"],
            "no hook point matches",
        ),
        (["--text", "XYZ!", "--lens"], "character"),
        (["--text", TEXT, "--lens", "--top", "0"], "--top must be >= 1"),
        (["--text", TEXT, "--target", "to", "--lens"], "--target is for encoder-decoder"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    model_dir: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert main(["inspect", str(model_dir), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("attnlab inspect: error:") and message in err[0]
