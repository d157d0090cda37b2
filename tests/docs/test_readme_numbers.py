"""What README.md states is true: each figure it quotes from ``benchmarks/results/`` equals the
file's, the reverse task's ids are the task's, ``--json`` works as it says, the install lines
agree with ``constraints.txt``, and it stays a five-minute read."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from attnlab.cli import build_parser
from attnlab.data.reverse import ReverseTask
from attnlab.training.recipes.reverse import ReverseOptions

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
RESULTS = ROOT / "benchmarks" / "results"

# (the README's words, the figure in them, the results file, a pattern whose group is the file's
# value). The figure must equal the file's value rounded to the figure's decimals.
CLAIMS = [
    ("val loss 1.897", "1.897", "train_recipes.md",
     r"^\| shakespeare-char \| [\d,]+ \| 2000 \| ([\d.]+) \|"),
    ("1.897 in 83 s", "83", "train_recipes.md",
     r"^\| shakespeare-char \| [\d,]+ \| 2000 \| [\d.]+ \| [\d.]+% \| - \| ([\d.]+) \|"),
    ("nanoGPT's code: 1.886", "1.886", "train_recipes_notes.md",
     r"^\| nanoGPT's own code[^|]*\| [^|]*\| ([\d.]+) \|"),
    ("1.886 in 133 s", "133", "train_recipes_notes.md",
     r"^\| nanoGPT's own code[^|]*\| [^|]*\| [\d.]+ \| - \| (\d+) \|"),
    ("39.25 BLEU lowercased", "39.25", "translate_multi30k_90min.md",
     r"^\| main \| averaged \| beam 4 \(alpha 0\.6\) \| ([\d.]+) \|"),
    ("39.02 cased", "39.02", "translate_multi30k_90min.md",
     r"^\| main \| averaged \| beam 4 \(alpha 0\.6\) \| [\d.]+ \| ([\d.]+) \|"),
    ("RNN 16.88", "16.88", "translate_rnn_compare.md",
     r"^\| rnn \| none \|.*\| ([\d.]+) \|\s*$"),
    ("RNN + attention 33.09", "33.09", "translate_rnn_compare.md",
     r"^\| rnn-attention \| bahdanau \|.*\| ([\d.]+) \|\s*$"),
    ("Transformer 35.32", "35.32", "translate_rnn_compare.md",
     r"^\| transformer \| multi-head \|.*\| ([\d.]+) \|\s*$"),
    ("ResNet-20 87.72%", "87.72", "cifar10_exercise7.md",
     r"^\| resnet \| resnet20 .*\| ([\d.]+)% \|\s*$"),
    ("CCT 83.08%", "83.08", "cifar10_exercise7.md",
     r"^\| cct \| cct-cifar-small .*\| ([\d.]+)% \|\s*$"),
    ("ViT 70.22%", "70.22", "cifar10_exercise7.md",
     r"^\| vit \| vit-cifar-small .*\| ([\d.]+)% \|\s*$"),
    ("36.2 ms", "36.2", "train_step.md", r"^\| attnlab \| [\d.]+M \| ([\d.]+) \("),  # baby: first
    ("transformers 44.1 ms", "44.1", "train_step.md",
     r"^\| transformers sdpa \| [\d.]+M \| ([\d.]+) \("),
    ("44.1 tokens/s", "44.1", "generation.md", r"^\| gpt2-small \| 1 \| ([\d.]+) \(256 new\)"),
    ("transformers 27.2", "27.2", "generation.md",
     r"^\| gpt2-small \| 1 \| [^|]+\| [^|]+\| ([\d.]+) \(256 new\)"),
    ("`--preset speedrun` val loss 1.4963", "1.4963", "time_to_loss.md",
     r"^\| 2026-12-06 \| speedrun \| 5 \| 3 \| \d+ \| ([\d.]+) ±"),
    ("`--arch modern` 1.5516", "1.5516", "time_to_loss.md",
     r"^\| 2026-12-06 \| modern \| 5 \| 3 \| \d+ \| ([\d.]+) ±"),
    ("(p = 0.0167)", "0.0167", "time_to_loss.md",
     r"^\| 2026-12-06 \| speedrun \| 5 \| 3 \|.*\| ([\d.]+) \|\s*$"),
    ("val loss 1.70 in", "1.70", "time_to_loss.md", r"\| training s to (1\.7) \|"),
    ("in 0.38x of modern's", "0.38", "time_to_loss.md",
     r"^\| 2026-12-07d \| speedrun \| 5 \| 3 \| \d+ \| [\d.]+ ± [\d.]+ \(3/3\), ([\d.]+)x \|"),
    ("Mamba 1.581", "1.581", "families_shakespeare.md",
     r"^\| mamba \| [\d,]+ \| 2000 \| ([\d.]+) \|"),
    ("LSTM 2.120", "2.120", "families_shakespeare.md",
     r"^\| lstm \| [\d,]+ \| 2000 \| ([\d.]+) \|"),
]  # fmt: skip

# the README's path, timed (benchmarks/results/readme_path.md): outside its Results section
PATH_TIMES = [
    ("1,500 steps,\n62 s", "62", "readme_path.md", r"^\| main job \|.*\| (\d+) s \|$"),
    ("the set-up above: 35 s", "35", "readme_path.md", r"^\| set-up \|.*\| (\d+) s \|$"),
    ("1184 s (about 20 minutes)", "1184", "readme_path.md",
     r"^\| test command \|.*\| (\d+) s \|$"),
    ("733 tests, 13 s", "13", "readme_path.md", r"^\| quick subset \|.*\| (\d+) s \|$"),
    ("120 steps, 8 s", "8", "readme_path.md", r"^\| quick check \|.*\| (\d+) s \|$"),
]  # fmt: skip


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


@pytest.mark.parametrize("claim", CLAIMS + PATH_TIMES, ids=lambda c: c[0])
def test_each_quoted_figure_equals_its_results_file(claim: tuple[str, str, str, str]) -> None:
    words, figure, file, pattern = claim
    assert words in README.read_text(encoding="utf-8"), f"README.md no longer says {words!r}"
    assert figure in words
    found = re.search(pattern, (RESULTS / file).read_text(encoding="utf-8"), re.M)
    assert found, f"{file}: no line matches {pattern!r}"
    value = float(found.group(1).replace(",", ""))
    decimals = len(figure.partition(".")[2])
    assert f"{value:.{decimals}f}" == figure, f"README says {figure}, {file} says {found.group(1)}"


def test_every_figure_of_the_results_table_is_checked() -> None:
    """A figure added to the README's Results section needs a row in CLAIMS."""
    section = _section(README.read_text(encoding="utf-8"), "Results")
    text = re.sub(r"\[[^\]]*\]\([^)]*\)", "", section)  # links name files, not figures
    text = re.sub(r"attnlab \d+\.\d+", "", text)  # nor are versions
    figures = re.findall(r"(?<![\w.,])\d+\.\d+(?![\w.])", text)
    assert len(figures) >= 10
    checked = {c[1] for c in CLAIMS}
    assert not [f for f in figures if f not in checked], "figures without a CLAIMS row"
    assert all(c[0] in section for c in CLAIMS)


def test_the_baby_gpt_loss_is_quoted_as_one_number() -> None:
    text = README.read_text(encoding="utf-8")
    assert "1.897" in text
    for other in ("1.885", "1.894", "1.8970", "1.8846"):  # other runs or estimates: docs/results.md
        assert other not in text


def test_the_readme_is_a_five_minute_read() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) < 200


def test_the_reverse_ids_the_readme_gives_are_the_tasks() -> None:
    text = README.read_text(encoding="utf-8")
    said = re.search(
        r"(\d+)-(\d+) content ids \((\d+)-(\d+); 0, 1\s+and 2 are pad, BOS and EOS\)", text
    )
    assert said, "README.md no longer states the reverse task's ids"
    options = ReverseOptions()
    task = ReverseTask(vocab_size=options.vocab, min_len=options.min_len, max_len=options.max_len)
    assert (task.pad_id, task.bos_id, task.eos_id) == (0, 1, 2)
    lo, hi, first, last = map(int, said.groups())
    assert (lo, hi) == (options.min_len, options.max_len)
    assert (first, last) == (task.first_token, options.vocab - 1)
    example = re.search(r"attnlab generate runs/reverse --ids ([\d,]+)", text)
    assert example
    ids = [int(i) for i in example.group(1).split(",")]
    assert all(first <= i <= last for i in ids) and lo <= len(ids) <= hi
    assert "reversal and EOS (`2`)" in text


def _json_flags() -> tuple[set[str], set[str]]:
    """(commands whose ``--json`` is a switch, commands whose ``--json`` takes a file)."""
    switch, takes_file = set(), set()

    def visit(p: argparse.ArgumentParser, path: str) -> None:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    visit(sub, f"{path} {name}".strip())
            elif "--json" in action.option_strings:
                (switch if action.nargs == 0 else takes_file).add(path)

    visit(build_parser(), "")
    return {c.split()[0] for c in switch}, takes_file


@pytest.mark.parametrize("doc", [README, ROOT / "docs" / "cli.md"], ids=lambda p: p.name)
def test_json_works_as_the_docs_say(doc: Path) -> None:
    text = " ".join(doc.read_text(encoding="utf-8").split())
    prints = re.search(r"`--json` prints the summary as JSON \(([^)]*)\)", text)
    assert prints, f"{doc.name} no longer says what --json does"
    switch, takes_file = _json_flags()
    assert set(re.findall(r"`([\w-]+)`", prints.group(1))) == switch
    writes = re.findall(r"`([\w -]+?)(?: --eval SPLIT)? --json FILE`", text)
    assert {w.strip() for w in writes} == {
        c if c != "translate" else "translate" for c in takes_file
    }


def _fenced_lines(path: Path) -> list[str]:
    lines, inside = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            inside = not inside
        elif inside:
            lines.append(line)
    return lines


def test_install_commands_use_the_constraints_and_say_how_to_choose_a_build() -> None:
    docs = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "docs" / "course" / "README.md"]
    for doc in docs:
        for line in _fenced_lines(doc):
            if re.search(r"pip install -e\b", line):
                assert "-c constraints.txt" in line, f"{doc.relative_to(ROOT)}: {line.strip()}"
    pin = re.search(r"^torch==([\w.+]+)$", (ROOT / "constraints.txt").read_text(), re.M)
    assert pin, "constraints.txt pins torch's version"
    text = README.read_text(encoding="utf-8")
    cpu = f"pip install torch=={pin.group(1)} --index-url https://download.pytorch.org/whl/cpu"
    assert cpu in text and cpu in (ROOT / "constraints.txt").read_text()
