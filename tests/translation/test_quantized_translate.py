"""``attnlab translate --quantize`` and quantized translation directories (cli.quantize): the
flag, a directory written by ``attnlab quantize`` and quantizing in memory translate alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torch import nn

from attnlab.cli import main
from attnlab.training.recipes.translation import load_translator
from attnlab.transforms import Int8Linear, quantize
from attnlab.translation import load_pairs, translate

from .conftest import train

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def small_run(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("qrun") / "de-en"
    train(tiny_data, out, max_steps=4, eval_every=4, save_every=2, eval_bleu_sentences=0)
    return out


def test_quantize_flag_and_directory_translate_as_in_memory(
    small_run: Path, tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sources = [s for s, _ in load_pairs(tiny_data, "test_2016_flickr", "de", "en")][:6]
    t = load_translator(small_run)
    expected = translate(quantize(t.model, "int8"), t.tokenizer, sources, beam=1)
    evaluate = ["--eval", "test_2016_flickr", "--limit", "6", "--greedy", "--no-progress"]
    flag_out, flag_json = tmp_path / "flag.txt", tmp_path / "flag.json"
    assert main(["translate", str(small_run), *evaluate, "--quantize", "int8",
                 "--output", str(flag_out), "--json", str(flag_json)]) == 0  # fmt: skip
    assert flag_out.read_text().splitlines() == expected
    assert json.loads(flag_json.read_text())["weights"] == "int8 weights"
    assert "greedy, int8 weights" in capsys.readouterr().out
    q = tmp_path / "de-en-int8"
    # the export translate uses (averaged, else best, else last)
    assert main(["quantize", str(small_run), "--checkpoint", t.path.name, "--bits", "8",
                 "--out", str(q)]) == 0  # fmt: skip
    assert {"export.json", "tokenizer.json", "quantization.json"} <= {p.name for p in q.iterdir()}
    loaded = load_translator(q)  # the languages and data come along in export.json
    assert isinstance(loaded.model.lm_head, nn.Linear)  # the head stays float32 by default
    assert any(isinstance(m, Int8Linear) for m in loaded.model.modules())
    assert loaded.info["src"] == "de" and loaded.info["tgt"] == "en"
    dir_out = tmp_path / "dir.txt"
    assert main(["translate", str(q), *evaluate, "--output", str(dir_out)]) == 0
    assert dir_out.read_text().splitlines() == expected
    capsys.readouterr()
    assert main(["translate", str(q), *evaluate, "--quantize", "int4"]) == 2
    assert "already quantized (int8)" in capsys.readouterr().err
