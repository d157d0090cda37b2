"""Translation with beam search and greedy decoding, sacreBLEU scores, and the CLI."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.training.recipes.translation import load_translator
from attnlab.translation import load_pairs, score_bleu, translate


def test_beam_and_greedy_produce_text(tiny_run: Path) -> None:
    t = load_translator(tiny_run)
    assert t.path.name == "averaged" and t.info["kind"] == "averaged"
    sources = ["Ein Mann fährt Fahrrad.", "", "Zwei Hunde spielen im Schnee."]
    greedy = translate(t.model, t.tokenizer, sources, beam=1)
    beam = translate(t.model, t.tokenizer, sources, beam=4, alpha=0.6, batch_size=2)
    for out in (greedy, beam):
        assert len(out) == 3 and out[1] == ""
        assert all(isinstance(s, str) and s.strip() for s in (out[0], out[2]))
    assert load_translator(tiny_run, "last").path.name == "last"
    with pytest.raises(ValueError, match="more than the model's max_seq_len=128"):
        translate(t.model, t.tokenizer, [" ".join(["Fahrrad"] * 100)], beam=1)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_translator(tiny_run / "nope")


def test_bleu_on_known_strings() -> None:
    refs = ["The cat sat on the mat.", "A dog runs in the park."]
    perfect = score_bleu(refs, refs)
    assert perfect.bleu == pytest.approx(100.0) and perfect.bleu_lowercase == pytest.approx(100.0)
    lower = score_bleu([r.lower() for r in refs], refs)
    assert lower.bleu_lowercase == pytest.approx(100.0) and lower.bleu < 90.0
    assert "case:mixed" in lower.signature and "tok:13a" in lower.signature
    assert "case:lc" in lower.signature_lowercase
    # one 4-gram-free hypothesis: exactly sacreBLEU's value for these strings
    import sacrebleu

    hyps = ["the cat is on the mat .", "a dog runs in a park"]
    expected = sacrebleu.corpus_bleu(hyps, [refs]).score
    assert score_bleu(hyps, refs).bleu == pytest.approx(expected)
    assert 0.0 < expected < 100.0
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        score_bleu(hyps, refs[:1])


def test_cli_translate_and_eval(
    tiny_run: Path,
    tiny_data: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("Ein Mann fährt Fahrrad.\n\nEin Hund.\n"))
    assert main(["translate", str(tiny_run), "--greedy"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[1] == "" and lines[0]
    scores = tmp_path / "s.json"
    argv = [
        "translate",
        str(tiny_run),
        "--eval",
        "test_2016_flickr",
        "--beam",
        "2",
        "--json",
        str(scores),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "BLEU (cased)" in out and "BLEU (lowercased)" in out and "case:lc" in out
    record = json.loads(scores.read_text())
    assert record["n_sentences"] == 30 and record["beam"] == 2


def test_cli_train_and_errors(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "train",
        "translate",
        "--data",
        str(tiny_data),
        "--vocab-size",
        "300",
        "--d-model",
        "16",
        "--n-layers",
        "1",
        "--n-heads",
        "2",
        "--d-ff",
        "32",
        "--max-steps",
        "2",
        "--eval-bleu-sentences",
        "2",
        "--no-progress",
    ]
    assert main([*args, "--out", str(tmp_path / "run"), "--no-label-smoothing"]) == 0
    out = capsys.readouterr().out
    assert "trained to step 2" in out and "translate: training" in out and "averaged:" in out
    saved = json.loads((tmp_path / "run" / "run.json").read_text())
    assert saved["train"]["label_smoothing"] == 0.0 and saved["train"]["max_minutes"] == 90.0
    assert main([*args, "--out", str(tmp_path / "x"), "--src", "cs"]) == 2
    assert "unknown language 'cs'" in capsys.readouterr().err
    missing = [*args[:2], "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "y")]
    assert main(missing) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["translate", str(tmp_path / "nomodel")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_cross_attention_map(tiny_run: Path, tmp_path: Path) -> None:
    from attnlab.viz.translation import cross_attention, plot_cross_attention

    t = load_translator(tiny_run)
    att = cross_attention(t.model, t.tokenizer, "Ein Mann fährt Fahrrad.", "A man rides a bike.")
    L, H, T, S = att.weights.shape
    assert (L, H) == (1, 2)
    assert (len(att.target_labels), len(att.source_labels)) == (T, S)
    assert att.target_labels[-1] == att.source_labels[-1] == "</s>"
    assert "fährt" in "".join(att.source_labels)
    torch.testing.assert_close(att.weights.sum(-1), torch.ones(L, H, T))
    fig = plot_cross_attention(att, path=tmp_path / "x.png")
    assert (tmp_path / "x.png").stat().st_size > 1000 and fig.axes
    with pytest.raises(ValueError, match="layer 3 is out of range"):
        plot_cross_attention(att, layer=3)


def test_download_checks_sha256(tiny_data: Path, tmp_path: Path) -> None:
    from attnlab.translation import download_multi30k

    server = tmp_path / "server"  # a file:// "server" holding the tiny files
    server.mkdir()
    for split, lang in [("val", "de"), ("val", "en")]:
        data = (tiny_data / f"{split}.{lang}.gz").read_bytes()
        (server / f"val.{lang}.gz").write_bytes(data)
        (server / f"mini.{lang}.gz").write_bytes(data)
    url = server.as_uri() + "/"
    with pytest.raises(ValueError, match=r"val\.de\.gz: sha256 .* differs"):
        download_multi30k(tmp_path / "a", splits=["val"], base_url=url)
    out = download_multi30k(tmp_path / "b", splits=["mini"], base_url=url)
    assert len(load_pairs(out, "mini", "de", "en")) == 40
