"""Memory bombs (issue 19, class 2): a ``config.json`` claiming a huge model beside a small
weights file, attnlab's format or Hugging Face's, is refused in under 5 s with under 500 MB of
peak RSS, before a model is built — in a fresh interpreter, timing only the load call.

Each case edits one size of a tiny saved model: a million layers, a 2**20-wide hidden size, a
2**30-entry position table, a 2**31-token vocabulary. The generate command's memory check
estimates the model the config describes, not its files' size.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab import GPTConfig, build_model
from attnlab.analysis import memory_check as mc
from attnlab.cli import main
from attnlab.interop import save_hf
from attnlab.interop.hf import hf_model_config
from attnlab.pretrained import save_pretrained

TINY = GPTConfig(vocab_size=50, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=8,
                 eos_id=None)  # fmt: skip
# field names: attnlab's config.json / Hugging Face GPT-2's / Llama's
BOMBS = {
    "layers": ({"n_layers": 10**6}, {"n_layer": 10**6}, {"num_hidden_layers": 10**6}),
    "hidden": ({"d_model": 2**20, "d_ff": 2**22}, {"n_embd": 2**20}, {"hidden_size": 2**20}),
    "positions": ({"max_seq_len": 2**30}, {"n_positions": 2**30}, None),
    "vocab": ({"vocab_size": 2**31}, {"vocab_size": 2**31}, {"vocab_size": 2**31}),
}
CHILD = """
import json, resource, sys, time
import attnlab
for directory in sys.argv[1:]:
    start = time.perf_counter()
    try:
        attnlab.from_pretrained(directory)
    except ValueError as e:
        outcome = f"refused: {e}"
    else:
        outcome = "loaded"
    seconds = time.perf_counter() - start
    print(json.dumps({"dir": directory, "outcome": outcome, "seconds": seconds}))
# VmHWM: this process image's peak (ru_maxrss would carry the forking parent's peak over exec)
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")]
peak = int(hwm[0].split()[1]) if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"peak_rss_mb": peak / 1024}))
"""


def _saved(kind: str, tmp_path: Path) -> Path:
    torch.manual_seed(0)
    directory = tmp_path / kind
    if kind == "attnlab":
        save_pretrained(build_model(TINY), directory)
    elif kind == "gpt2":
        save_hf(build_model(TINY), directory)
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32,
                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                             max_position_embeddings=8)  # fmt: skip
        LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def test_a_config_claiming_a_huge_model_is_refused_fast_and_small(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    cases = []
    for kind in ("attnlab", "gpt2", "llama"):
        for bomb, edits in sorted(BOMBS.items()):
            edit = edits[("attnlab", "gpt2", "llama").index(kind)]
            if edit is None:  # Llama has no position table
                continue
            directory = _saved(kind, tmp_path / bomb)
            data = json.loads((directory / "config.json").read_text())
            target = data.get("config", data)
            target.update(edit)
            target.pop("head_dim", None)  # Llama's is derived from hidden_size
            (directory / "config.json").write_text(json.dumps(data))
            cases.append(str(directory))
    done = subprocess.run([sys.executable, "-c", CHILD, *cases], capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    *results, peak = [json.loads(line) for line in done.stdout.splitlines() if line]
    assert len(results) == len(cases) == 11
    for r in results:
        assert r["outcome"].startswith("refused:") and "parameters" in r["outcome"], r
        assert r["seconds"] < 5, r
    assert peak["peak_rss_mb"] < 500, peak


def test_the_memory_check_counts_the_config_not_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = _saved("gpt2", tmp_path)
    data = json.loads((directory / "config.json").read_text())
    data["n_layer"] = 10**4  # 10,000 layers of a 4.6 KB checkpoint: about 31 M parameters
    (directory / "config.json").write_text(json.dumps(data))
    config = hf_model_config(directory)
    assert config is not None and config.n_layers == 10**4
    monkeypatch.setattr(mc, "available_memory", lambda: (64 * 2**20, "test"))  # 64 MiB
    assert main(["generate", str(directory), "--ids", "1,2", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "GPTConfig" in err and "more than the 64.00 MiB" in err, err
