"""``benchmarks/gpu_check.py`` (issue 26) runs where there is no GPU: CUDA rows are listed as
skipped with the reason, and ``--smoke`` trains tiny CPU rows whose losses it checks against
fp32's; both write the results files and exit 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def run(*args: str, out: Path) -> dict:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "gpu_check.md").is_file()
    return json.loads((out / "gpu_check.json").read_text())


def test_smoke_rows_train_on_the_cpu_and_match_fp32(tmp_path: Path) -> None:
    result = run("--smoke", "--recipes", "reverse", "--precisions", "fp32,fp16-mixed",
                 "--variants", "eager,checkpointing,compile", "--steps", "3",
                 out=tmp_path)  # fmt: skip
    rows = {(r["precision"], r["variant"]): r for r in result["rows"]}
    assert len(rows) == 6
    for (precision, variant), row in rows.items():
        if variant == "compile":
            assert row["skipped"].startswith("--smoke: no compile")
            continue
        assert row["check"] == "ok" and len(row["losses"]) == 3
        assert row["setup"]["precision"] == precision
    # checkpointing recomputes the same forward: the same losses as eager
    assert rows["fp32", "checkpointing"]["losses"] == pytest.approx(
        rows["fp32", "eager"]["losses"], abs=1e-6
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: rows would run")
def test_without_cuda_every_row_is_skipped_with_the_reason(tmp_path: Path) -> None:
    result = run("--recipes", "reverse,shakespeare-char", out=tmp_path)
    assert len(result["rows"]) == 2 * 4 * 4  # recipes x precisions x variants
    assert all(r["skipped"].startswith("no CUDA device") for r in result["rows"])
    assert "skipped: no CUDA device" in (tmp_path / "gpu_check.md").read_text()
