"""``compile=True``: a ``torch.compile``d model trains to eager's losses (1e-5) for the first
steps and after a resume; the compile time is reported apart from the step times, and the
checkpoints are those of an eager run (parameter names unchanged).

Inductor compiles C++ kernels on the CPU: these two tests took 69 s on 2 shared cores with a
cold Inductor cache (29 s with a warm one), so they are marked slow (``pytest -m slow``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnlab.training.trainer import Trainer
from attnlab.transforms.compile import is_compiled, uncompiled

from .test_hardware import gpt_setup

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]


def test_compiled_training_gives_eager_losses_and_reports_compile_time(tmp_path: Path) -> None:
    eager = Trainer(*gpt_setup(steps=4)).fit().losses
    model, objective, config = gpt_setup(steps=4, compile=True)
    trainer = Trainer(model, objective, config, run_dir=tmp_path / "run")
    result = trainer.fit()
    assert is_compiled(trainer.model) and uncompiled(trainer.model) is model
    assert trainer.module is model
    torch.testing.assert_close(result.losses, eager, atol=1e-5, rtol=0)
    assert result.compile_s is not None and result.compile_s > 0
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert train[0]["compile_s"] == round(result.compile_s, 3)
    assert all("compile_s" not in r for r in train[1:])
    keys = json.loads((tmp_path / "run" / "checkpoints" / "step_00000004" / "trainer_state.json")
                      .read_text())["state"]["optimizer"]["state"]  # fmt: skip
    assert all("_orig_mod" not in k for k in keys)


def test_a_compiled_run_resumes_to_the_eager_run(tmp_path: Path) -> None:
    eager = Trainer(*gpt_setup(steps=6)).fit().losses
    first = Trainer(*gpt_setup(steps=6, compile=True), run_dir=tmp_path / "run")
    head = first.fit(until=3).losses
    again = Trainer(*gpt_setup(steps=6, compile=True), run_dir=tmp_path / "run")
    tail = again.fit(resume=True).losses
    torch.testing.assert_close(head + tail, eager, atol=1e-5, rtol=0)
