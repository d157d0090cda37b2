"""Ctrl-C and SIGTERM: a run stops at the next step boundary with a checkpoint there, says how to
continue, and the resume ends bitwise equal to the uninterrupted run.

Subprocess runs (``attnlab train shakespeare-char``, a 1-layer GPT on a 6 kB text, dropout on,
a checkpoint every 4 steps, 3 kept, the best model exported, the last 2 averaged) are forked from
the fork server of ``tests/hardening/kill_worker.py`` (torch already imported), as in
``test_kill_resume.py``:

- *a signal at a random moment*: SIGINT (or SIGTERM) sent once the run has logged a random step,
  a random fraction of a step later (a training step, an evaluation, a checkpoint write, wherever
  it lands). The run exits 130 and prints the ``--resume`` command on stderr; its newest
  checkpoint is at or past the step logged when the signal was sent, and ``metrics.jsonl`` holds
  nothing past it (the uninterrupted run's records up to it). Running the printed command ends
  with the uninterrupted run's weights (bitwise), its metrics, its ``best/`` and ``averaged/``
  models and its checkpoint directories (the interrupt's extra checkpoint is gone);
- *a second SIGINT during the save*: the run is held still (SIGSTOP) at a file operation of its
  best-model export at step 5, sent SIGINT and continued, then held again at the first file
  operation of the checkpoint the interrupt writes at step 5, sent SIGINT again and continued:
  it exits 130 within a second, the half-written checkpoint is removed, ``latest`` still names
  step 4 (complete, loadable), and the printed command resumes to the uninterrupted run.

In process, :meth:`Trainer.fit` does the same for a library caller: it raises
:class:`TrainingInterrupted` (a ``KeyboardInterrupt``) after saving at the step boundary, puts
the previous signal handlers back, leaves a caller's own SIGINT handler alone, and a second
signal raises ``KeyboardInterrupt`` at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from attnlab.cli import main
from attnlab.data.text import TokenStream
from attnlab.models import GPT, GPTConfig
from attnlab.pretrained import load_attnlab
from attnlab.training.config import TrainConfig
from attnlab.training.metrics import TIMING_KEYS
from attnlab.training.objectives import CausalLMObjective
from attnlab.training.rundir import latest_checkpoint
from attnlab.training.state import load_training_state, read_training_state
from attnlab.training.trainer import Callback, Trainer, TrainingInterrupted
from testkit import ForkServer

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="forks runs, SIGSTOPs them and reads /proc (Linux)"
)
SEED = 20260521
STEPS = 40
ARGS = [f"--steps={STEPS}", "--warmup=2", "--checkpoint-every=4", "--keep-checkpoints=3",
        "--average-last=2", "--save-best", "--log-every=1", "--eval-every=5",
        "--eval-batches=1", "--d-model=16", "--n-heads=2", "--n-layers=1", "--d-ff=32",
        "--max-seq-len=16", "--batch-size=4", "--dropout=0.1", "--no-progress"]  # fmt: skip
VOLATILE = TIMING_KEYS  # wall-clock figures differ between runs
TIMEOUT = 120.0  # seconds a run may take (well under 2 s on a quiet machine)


def _text() -> str:
    """A small deterministic corpus (about 6 kB)."""
    rng = random.Random(0)
    words = ["the", "king", "queen", "of", "and", "to", "a", "my", "lord", "thou", "art", "hath"]
    lines = (" ".join(rng.choice(words) for _ in range(10)).capitalize() + "." for _ in range(120))
    return "\n".join(lines) + "\n"


class Worker(ForkServer):
    """The fork server's client (``tests/testkit.py``): start a run, then wait for its end."""

    def __init__(self) -> None:
        super().__init__(TIMEOUT)

    def finish(self, pid: int, log: Path) -> tuple[int | None, str]:
        """``(exit status or None when killed by a signal, output)`` of the run ``pid``."""
        status = int(self.wait(pid, log.read_text)["status"])
        return (os.WEXITSTATUS(status) if os.WIFEXITED(status) else None), log.read_text()

    def run(self, request: dict[str, Any]) -> tuple[int | None, str]:
        return self.finish(self.start(request), Path(request["log"]))


@dataclass
class Setup:
    worker: Worker
    tmp: Path
    data: Path
    reference: Path
    events: list[str]  # the file operations of the uninterrupted run


def request(s: Setup, run_dir: Path, log: Path, argv: list[str] | None = None,
            **kw: Any) -> dict[str, Any]:  # fmt: skip
    argv = argv or ["train", "shakespeare-char", f"--data={s.data}", *ARGS, "--out", str(run_dir)]
    return {"argv": argv, "log": str(log), "root": str(run_dir), **kw}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("interrupt")
    data = tmp / "corpus.txt"
    data.write_text(_text(), encoding="utf-8")
    worker = Worker()
    try:
        s = Setup(worker, tmp, data, tmp / "reference", [])
        events = tmp / "events.json"
        code, log = worker.run(request(s, s.reference, tmp / "ref.log", events=str(events)))
        assert code == 0, log
        s.events = json.loads(events.read_text())
        yield s
    finally:
        worker.close()


def records(run_dir: Path) -> list[dict[str, Any]]:
    """``metrics.jsonl`` without its wall-clock figures (a torn last line left out)."""
    path = run_dir / "metrics.jsonl"
    out = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # being written
            continue
        out.append({k: v for k, v in record.items() if k not in VOLATILE})
    return out


def logged_step(run_dir: Path) -> int:
    return max((int(r["step"]) for r in records(run_dir)), default=0)


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_attnlab(directory).state_dict()


def checkpoint_names(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))


def continue_command(log: str) -> list[str]:
    """The argv of the command the run printed for its resume (after ``attnlab``)."""
    lines = [x for x in log.splitlines() if x.strip().startswith("continue with: ")]
    assert len(lines) == 1, f"no resume command printed:\n{log}"
    words = shlex.split(lines[0].strip().removeprefix("continue with: "))
    assert words[0] == "attnlab", lines
    return words[1:]


def assert_equals_reference(s: Setup, run_dir: Path, what: str) -> None:
    """The run's final weights (bitwise), metrics, checkpoint directories, ``best/`` and
    ``averaged/`` models are the uninterrupted run's; no temporary file is left."""
    final = latest_checkpoint(run_dir)
    assert final is not None and final.name == f"step_{STEPS:08d}", (what, final)
    for sub in (final.relative_to(run_dir), Path("best"), Path("averaged")):
        a, b = weights(run_dir / sub), weights(s.reference / sub)
        for key, value in a.items():
            assert torch.equal(value, b[key]), f"{what}: {sub}/{key} differs"
    assert records(run_dir) == records(s.reference), what
    assert checkpoint_names(run_dir) == checkpoint_names(s.reference), what
    assert sorted(run_dir.rglob("*.tmp")) == [], what


def wait_stopped(pid: int) -> None:
    """Wait until ``pid`` has stopped itself (``SIGSTOP``: state T)."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        if state in ("T", "t"):
            return
        assert state not in ("Z", "X"), f"the run {pid} ended instead of stopping"
        time.sleep(0.002)
    raise AssertionError(f"the run {pid} did not stop within {TIMEOUT:.0f} s")


N_TRIALS = 5


@pytest.mark.parametrize("trial", range(N_TRIALS))
def test_a_signal_stops_the_run_at_a_step_boundary_and_the_resume_is_exact(
    setup: Setup, trial: int
) -> None:
    rng = random.Random(SEED + trial)
    sig = signal.SIGTERM if trial == 3 else signal.SIGINT
    target = rng.randint(1, STEPS - 6)
    run_dir = setup.tmp / f"trial{trial}"
    log = setup.tmp / f"trial{trial}.log"
    history = []
    for _ in range(4):  # a run that finished before the signal is tried again, earlier
        pid = setup.worker.start(request(setup, run_dir, log))
        deadline = time.monotonic() + TIMEOUT
        while logged_step(run_dir) < target and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(rng.uniform(0.0, 0.02))  # a step takes some 10-30 ms
        seen = logged_step(run_dir)
        with contextlib.suppress(ProcessLookupError):  # already ended
            os.kill(pid, sig)
        code, out = setup.worker.finish(pid, log)
        history.append(f"{sig.name} after step {target} + {seen - target}: exit {code}")
        if code != 0:
            break
        target //= 2
        shutil.rmtree(run_dir)
    assert code == 130, f"{history}:\n{out}"
    latest = latest_checkpoint(run_dir)
    assert latest is not None, out
    step = int(load_training_state(latest, load_attnlab(latest))["step"])  # loads whole
    history.append(f"checkpoint at step {step}")
    assert f"interrupted ({sig.name}) after step {step}; checkpoint {latest}" in out, out
    assert step >= max(seen, 1), f"{history}: the checkpoint is older than the signal"
    off_schedule = step % 4 != 0 and step != STEPS
    assert read_training_state(latest).get("interrupted", False) == off_schedule, history
    # nothing past the checkpoint: the uninterrupted run's records up to it
    assert logged_step(run_dir) == step, history
    assert records(run_dir) == [r for r in records(setup.reference) if r["step"] <= step]
    argv = continue_command(out)
    assert argv == ["train", "shakespeare-char", "--out", str(run_dir), "--resume"], argv
    code, out = setup.worker.run(request(setup, run_dir, setup.tmp / f"t{trial}r.log", argv))
    assert code == 0, f"{history}: the resume:\n{out}"
    assert_equals_reference(setup, run_dir, "; ".join(history))
    print(f"trial {trial}: {'; '.join(history)}")


def test_a_second_sigint_during_the_save_aborts_at_once_and_the_last_checkpoint_stays(
    setup: Setup,
) -> None:
    in_best = [e.split(" ", 1)[1].split("/")[0] == "best" for e in setup.events]
    first = in_best.index(True)  # the first operation of the best-model export at step 5
    end = first
    while end + 1 < len(in_best) and in_best[end + 1]:
        end += 1
    # held at the export's first operation, then at the first operation after the export: in
    # the interrupted run, the first of the checkpoint the interrupt writes at step 5
    stops = [first + 1, end + 2]
    run_dir = setup.tmp / "twice"
    log = setup.tmp / "twice.log"
    pid = setup.worker.start(request(setup, run_dir, log, stop_at=stops))
    try:
        wait_stopped(pid)
        os.kill(pid, signal.SIGINT)
        os.kill(pid, signal.SIGCONT)
        saving = run_dir / "checkpoints" / "step_00000005"
        deadline = time.monotonic() + TIMEOUT
        while not saving.is_dir() and time.monotonic() < deadline:  # (still "T" at first)
            time.sleep(0.001)
        wait_stopped(pid)
        assert saving.is_dir() and not (saving / "model.safetensors").exists(), (
            "not held at the start of the interrupt's checkpoint"
        )
        assert latest_checkpoint(run_dir) == run_dir / "checkpoints" / "step_00000004"
        started = time.monotonic()
        os.kill(pid, signal.SIGINT)
        os.kill(pid, signal.SIGCONT)
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        setup.worker.finish(pid, log)
        raise
    code, out = setup.worker.finish(pid, log)
    seconds = time.monotonic() - started
    assert code == 130, out
    assert seconds < 1.0, f"the second SIGINT took {seconds:.2f} s to end the run"
    print(f"second SIGINT: the run ended {seconds * 1000:.0f} ms later")
    assert not saving.exists(), "the half-written checkpoint was left"
    latest = latest_checkpoint(run_dir)
    assert latest is not None and latest.name == "step_00000004", latest
    assert int(load_training_state(latest, load_attnlab(latest))["step"]) == 4
    assert "nothing more was saved" in out and f"continues from {latest}" in out, out
    argv = continue_command(out)
    code, out = setup.worker.run(request(setup, run_dir, setup.tmp / "twice-r.log", argv))
    assert code == 0, out
    assert_equals_reference(setup, run_dir, "second SIGINT")


# -- Trainer.fit in process --------------------------------------------------------------------

TINY = GPTConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=8,
                 dropout=0.1, eos_id=None)  # fmt: skip
CONFIG = TrainConfig(steps=8, batch_size=4, warmup=2, lr=1e-2, eval_every=1, eval_batches=1,
                     checkpoint_every=2, keep_checkpoints=2, progress=False,
                     log_every=1)  # fmt: skip


class SignalAt(Callback):
    """Sends this process ``signals`` while evaluating step ``step`` (inside the step)."""

    names = ()

    def __init__(self, step: int, *signals: signal.Signals) -> None:
        self.step, self.signals = step, signals

    def metrics(
        self, trainer: Trainer, model: nn.Module, base: dict[str, float]
    ) -> dict[str, float]:
        if trainer.step == self.step:
            for sig in self.signals:
                os.kill(os.getpid(), sig)
        return {}


def _trainer(run_dir: Path | None, *callbacks: Callback) -> Trainer:
    torch.manual_seed(0)
    stream = TokenStream(torch.randint(11, (2000,), generator=torch.Generator().manual_seed(1)))
    objective = CausalLMObjective(stream, block_size=8)
    return Trainer(GPT(TINY), objective, CONFIG, run_dir=run_dir, callbacks=callbacks)


@pytest.fixture
def default_handlers() -> Iterator[None]:
    """Python's default SIGINT/SIGTERM handlers (whatever the test runner inherited)."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for s, handler in before.items():
        signal.signal(s, handler)


@pytest.mark.usefixtures("default_handlers", "one_thread")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_fit_saves_at_the_step_boundary_then_raises(tmp_path: Path, sig: signal.Signals) -> None:
    full = _trainer(tmp_path / "full")
    losses = full.fit().losses
    with pytest.raises(TrainingInterrupted) as caught:
        _trainer(tmp_path / "cut", SignalAt(3, sig)).fit()
    e = caught.value
    assert isinstance(e, KeyboardInterrupt) and e.signal_name == sig.name
    assert e.step == 3 and e.checkpoint == tmp_path / "cut" / "checkpoints" / "step_00000003"
    assert latest_checkpoint(tmp_path / "cut") == e.checkpoint and e.result.stopped_by is None
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert logged_step(tmp_path / "cut") == 3
    resumed = _trainer(tmp_path / "cut")
    assert e.result.losses + resumed.fit(resume=True).losses == losses  # bitwise
    for (name, a), b in zip(full.model.state_dict().items(),
                            resumed.model.state_dict().values(), strict=True):  # fmt: skip
        assert torch.equal(a, b), name
    assert checkpoint_names(tmp_path / "cut") == checkpoint_names(tmp_path / "full")
    assert records(tmp_path / "cut") == records(tmp_path / "full")


@pytest.mark.usefixtures("default_handlers", "one_thread")
def test_fit_without_a_run_directory_stops_at_the_boundary(tmp_path: Path) -> None:
    with pytest.raises(TrainingInterrupted) as caught:
        _trainer(None, SignalAt(5, signal.SIGINT)).fit()
    assert caught.value.step == 5 and caught.value.checkpoint is None
    assert len(caught.value.result.losses) == 5


@pytest.mark.usefixtures("default_handlers", "one_thread")
def test_a_second_signal_raises_at_once_without_saving(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt) as caught:
        _trainer(tmp_path, SignalAt(3, signal.SIGINT, signal.SIGINT)).fit()
    assert not isinstance(caught.value, TrainingInterrupted)
    assert checkpoint_names(tmp_path) == ["step_00000002"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.usefixtures("default_handlers", "one_thread")
def test_a_callers_own_sigint_handler_is_left_alone(tmp_path: Path) -> None:
    seen: list[int] = []

    def mine(signum: int, frame: object) -> None:
        seen.append(signum)

    signal.signal(signal.SIGINT, mine)
    result = _trainer(tmp_path, SignalAt(3, signal.SIGINT)).fit()
    assert result.step == 8 and result.stopped_by == "steps" and seen == [signal.SIGINT]
    assert signal.getsignal(signal.SIGINT) is mine


@pytest.mark.usefixtures("default_handlers", "one_thread")
def test_the_command_prints_how_to_continue_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``attnlab train`` itself (in process): exit 130, and the interrupt and the ``--resume``
    command on stderr, not stdout; that command then finishes the run."""
    data = tmp_path / "corpus.txt"
    data.write_text(_text(), encoding="utf-8")
    run_dir = tmp_path / "run"
    step = Trainer.train_step

    def signalled(self: Trainer) -> tuple[float, int, float]:
        if self.step == 6:  # inside step 7
            os.kill(os.getpid(), signal.SIGINT)
        return step(self)

    monkeypatch.setattr(Trainer, "train_step", signalled)
    code = main(["train", "shakespeare-char", f"--data={data}", *ARGS, "--out", str(run_dir)])
    captured = capsys.readouterr()
    assert code == 130, captured.err
    checkpoint = run_dir / "checkpoints" / "step_00000007"
    expected = (f"attnlab train shakespeare-char: interrupted (SIGINT) after step 7; checkpoint "
                f"{checkpoint}\n  continue with: attnlab train shakespeare-char --out {run_dir} "
                "--resume\n")  # fmt: skip
    assert captured.err.endswith(expected), captured.err
    assert "continue with" not in captured.out and latest_checkpoint(run_dir) == checkpoint
    monkeypatch.undo()
    assert main(continue_command(captured.err)) == 0
    assert checkpoint_names(run_dir) == ["step_00000032", "step_00000036", "step_00000040"]
