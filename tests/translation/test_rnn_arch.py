"""``attnlab train translate --arch rnn-attention | rnn``: the recurrent encoder-decoder on the
translation recipe's data, batches and evaluation (a synthetic word-for-word corpus, no data
set needed), and the arch/attention choices refused with clear errors."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from attnlab.models import RNNSeq2Seq
from attnlab.pretrained import from_pretrained
from testkit import run_cli

pytestmark = pytest.mark.usefixtures("one_thread")  # small ops: threads only contend

WORDS = {"der": "the", "hund": "dog", "rote": "red", "ball": "ball", "ein": "a", "mann": "man",
         "sieht": "sees", "und": "and", "katze": "cat", "kleine": "small"}  # fmt: skip


def corpus(directory: Path, n_train: int = 60, n_val: int = 6) -> Path:
    """Plain-text ``train``/``val`` ``.de``/``.en`` files of a word-for-word "translation"."""
    rng = random.Random(0)
    directory.mkdir()
    for split, n in (("train", n_train), ("val", n_val)):
        de = [" ".join(rng.choice(list(WORDS)) for _ in range(rng.randint(3, 6))) for _ in range(n)]
        en = [" ".join(WORDS[w] for w in line.split()) for line in de]
        (directory / f"{split}.de").write_text("\n".join(de) + "\n", encoding="utf-8")
        (directory / f"{split}.en").write_text("\n".join(en) + "\n", encoding="utf-8")
    return directory


BASE = ["--vocab-size", "300", "--max-len", "24", "--max-tokens", "256", "--steps", "2",
        "--eval-every", "2", "--checkpoint-every", "2", "--average-last", "1",
        "--eval-bleu-sentences", "2", "--warmup", "1", "--max-minutes", "none", "--log-every",
        "1", "--no-progress"]  # fmt: skip
TINY = [*BASE, "--d-model", "16", "--d-hidden", "16"]


@pytest.mark.parametrize(("arch", "extra", "attention"), [
    ("rnn-attention", [], "bahdanau"),
    ("rnn-attention", ["--attention", "luong", "--cell", "lstm"], "luong"),
    ("rnn", [], "none"),
])  # fmt: skip
def test_train_translate_with_a_recurrent_arch(
    tmp_path: Path, arch: str, extra: list[str], attention: str
) -> None:
    data = corpus(tmp_path / "data")
    out = tmp_path / "run"
    argv = ["train", "translate", "--arch", arch, *extra, "--data", str(data), "--out", str(out)]
    code, _, err = run_cli([*argv, *TINY])
    assert code == 0, err
    run = json.loads((out / "run.json").read_text())
    assert run["model"]["model_type"] == "rnn_seq2seq"
    assert run["model"]["attention"] == attention and run["options"]["arch"] == arch
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "train"] == [1, 2]
    assert any("bleu" in r for r in records if r["split"] == "val")  # the same evaluation
    model = from_pretrained(out / "last")
    assert isinstance(model, RNNSeq2Seq) and model.config.attention == attention


@pytest.mark.parametrize(("args", "words"), [
    (["--arch", "lstm"], "'lstm'"),
    (["--attention", "luong"], "applies to --arch='rnn-attention', not --arch='transformer'"),
    (["--arch", "rnn", "--attention", "bahdanau"], "not --arch='rnn'"),
    (["--arch", "rnn-attention", "--n-heads", "4"], "--n-heads is not an option of RNNSeq2Seq"),
])  # fmt: skip
def test_bad_arch_choices_are_refused(tmp_path: Path, args: list[str], words: str) -> None:
    data = corpus(tmp_path / "data")
    code, _, err = run_cli(["train", "translate", *args, "--data", str(data),
                            "--out", str(tmp_path / "run"), *BASE])  # fmt: skip
    assert code == 2 and words in err, err
    assert not (tmp_path / "run" / "run.json").exists()
