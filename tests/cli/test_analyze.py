"""``analyze`` and the ``attnlab analyze`` command: table, JSON, config files, sweep, bad input."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from attnlab import PRESETS, build_model
from attnlab.analysis.report import analyze
from attnlab.analysis.text import format_report
from attnlab.cli import main
from attnlab.cli.analyze import add_parser as add_analyze_subparser
from attnlab.cli.analyze import load_config


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["analyze", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_gpt3_175b_from_the_config_alone(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import attnlab.models

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("analyze must not build the model")

    monkeypatch.setattr(attnlab.models, "build_model", no_build)
    rc, out, _ = _run(capsys, "gpt3-175b", "--seq-len", "2048")
    assert rc == 0
    assert "174,604,259,328" in out
    assert "attention block: n = 24,576 (2·d_model)" in out
    assert "layer with FFN:  n = 73,728 (6·d_model)" in out


def test_analyze_a_meta_model() -> None:
    model = build_model("gpt2-small", device="meta")
    a = analyze(model, seq_len=128, name="gpt2-small")
    assert a.params_measured == a.params.total == 124_439_808
    assert "built model (measured)" in format_report(a)


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "transformer-tiny", "--seq-len", "20", "--src-len", "30", "--json")
    assert rc == 0
    data = json.loads(out)
    assert data["inputs"] == {"batch": 1, "seq_len": 20, "src_len": 30, "tokens": 20}
    assert data["params"]["total"] == sum(data["params"]["components"].values())
    assert data["flops"]["training"] == data["flops"]["forward"] + data["flops"]["backward"]
    comps = data["flops"]["components"]
    assert sum(v["forward"] for v in comps.values()) == data["flops"]["forward"]
    assert data["kv_cache"]["full_context"] > 0
    assert data["crossover"]["block"] == 2 * 64


def test_config_file_and_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "small.json"
    path.write_text(json.dumps({"preset": "gpt-char-baby", "n_layers": 2}))
    label, config = load_config(str(path))
    assert label == "small" and config.n_layers == 2
    ckpt = tmp_path / "ckpt.json"
    ckpt.write_text(json.dumps({"config": {"model_type": "vit", "image_size": 32}}))
    assert load_config(str(ckpt))[1].image_size == 32
    rc, out, _ = _run(capsys, str(path), "--sweep-seq-len", "--batch", "2")
    assert rc == 0 and "FLOP shares by sequence length" in out
    rc, out, _ = _run(capsys, str(path), "--sweep-seq-len", "--json")
    rows = json.loads(out)["sweep"]
    assert [r["seq_len"] for r in rows][:2] == [64, 128]


def test_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "shares.png"
    rc, _, err = _run(capsys, "gpt2-small", "--plot", str(png))
    assert rc == 0 and png.stat().st_size > 1000 and "wrote" in err


def test_measure_and_mfu(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(
        capsys, "gpt-char-baby", "--seq-len", "16", "--measure", "--peak-tflops", "1", "--json"
    )
    assert rc == 0
    data = json.loads(out)
    assert data["measured"]["matches_analytic"]
    assert data["mfu"]["peak_source"] == "given" and 0 < data["mfu"]["mfu"] < 1
    rc, out, _ = _run(capsys, "gpt2-small", "--step-time", "0.5", "--peak-tflops", "100")
    assert rc == 0 and "MFU:" in out


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["no-such-model"], "neither a preset nor a config file"),
        (["gpt2-small", "--seq-len", "0"], "--seq-len must be a positive integer"),
        (["gpt2-small", "--seq-len", "-3"], "--seq-len must be a positive integer"),
        (["gpt2-small", "--batch", "0"], "batch must be a positive integer"),
        (["bert-base", "--src-len", "4"], "src_len applies to encoder-decoder"),
        (["gpt2-small", "--window", "0"], "window must be a positive integer"),
        (["gpt2-small", "--step-time", "0"], "--step-time must be positive"),
        (["llama2-7b", "--measure"], "runs the model on the CPU"),
    ],
)
def test_bad_input(argv: list[str], match: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(capsys, *argv)
    assert rc == 2 and out == "" and match in err


def test_bad_config_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    for text, match in (
        ("{not json", "bad.json is not valid JSON"),
        ("[1, 2]", "must hold a JSON object"),
        ('{"model_type": "t5"}', "unknown model type 't5'"),
        ('{"model_type": "gpt", "d_modle": 8}', "unknown GPTConfig keys"),
        ('{"model_type": "gpt", "d_model": "x"}', "bad config"),
        ('{"model_type": "gpt", "n_layers": 0}', "n_layers must be positive"),
    ):
        bad.write_text(text)
        with pytest.raises(ValueError, match=match):
            load_config(str(bad))


def test_subparser_wiring() -> None:
    parser = argparse.ArgumentParser(prog="attnlab")
    add_analyze_subparser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["analyze", "vit-digits", "--json"])
    assert callable(args.func) and args.target == "vit-digits" and args.json
    assert set(PRESETS) >= {"vit-digits"}


def test_meta_flag_counts_the_built_model(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "gpt-char-baby", "--meta", "--json")
    params = json.loads(out)["params"]
    assert rc == 0 and params["measured"] == params["total"] == 834_304
