"""Shared fixtures: every test in a working directory of its own (and a guard against writing into
the checkout), deterministic seeding, one torch thread on request (and a share of the cores per
pytest-xdist worker), and weight copying from ``torch.nn`` reference modules.

Hermetic tests: each test runs with a fresh empty directory as its working directory, so a
command it runs (``attnlab train ...`` writes ``runs/NAME`` relative to it) never meets what a
README command or another test left behind, and never leaves anything in the checkout. After
each test the checkout's top level is compared with what it was before, and at the end of the
session the untracked files of ``git status`` with those at its start: a test that wrote into the
checkout fails, naming what it wrote.

The copiers map PyTorch's module names onto ours so parity tests can run the same weights through
both implementations:

- ``nn.MultiheadAttention``: ``in_proj_weight``/``in_proj_bias`` (q, k, v stacked) + ``out_proj``
  -> ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``.
- ``nn.TransformerEncoderLayer``: ``self_attn``, ``linear1``/``linear2``, ``norm1``/``norm2`` ->
  ``self_attn``, ``ffn.up_proj``/``ffn.down_proj``, ``self_attn_norm``/``ffn_norm``.
- ``nn.TransformerDecoderLayer``: additionally ``multihead_attn`` and ``norm2``/``norm3`` ->
  ``cross_attn`` and ``cross_attn_norm``/``ffn_norm``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

# the tests' shared helpers (testkit.py) import by name; pytest's importlib mode adds no path
sys.path.insert(0, str(Path(__file__).resolve().parent))

CHECKOUT = Path(__file__).resolve().parents[1]


def _top_level() -> set[str]:
    return set(os.listdir(CHECKOUT))


def _git_status() -> set[str] | None:
    """``git status --porcelain`` lines of the checkout, or ``None`` outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all"], cwd=CHECKOUT,
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return set(out.stdout.splitlines())


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_STATUS] = _git_status()


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n N``), each worker takes its share of the machine's cores for
    torch's threads, and so do the commands it starts (``OMP_NUM_THREADS``, unless set), so N
    workers do not oversubscribe the cores."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        share = thread_share(workers, usable_cpus())
        torch.set_num_threads(share)
        os.environ.setdefault("OMP_NUM_THREADS", str(share))


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, which a container or ``taskset``
    narrows), else the machine's count."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def thread_share(workers: int, cpus: int) -> int:
    """torch threads per pytest-xdist worker: the usable CPUs split evenly, at least one."""
    return max(1, cpus // workers)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.config.stash.get(_STATUS, None)
    after = _git_status() if before is not None else None
    if before is None or after is None:
        return
    # new untracked files only: tracked files a person edits while the tests run are theirs
    new = sorted(line for line in after - before if line.startswith("??"))
    if not new:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"the tests changed the checkout (git status): {new}", red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


_STATUS = pytest.StashKey[set[str] | None]()


@pytest.fixture(autouse=True)
def _own_directory(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> Iterator[None]:
    """Run the test in an empty working directory of its own (unless a module's fixture has
    already moved it from where pytest started to a scratch directory of that module, outside
    the checkout); fail it if it wrote into the checkout's top level (``runs/``, a stray file)."""
    before = _top_level()
    started = Path(request.config.invocation_params.dir).resolve()
    cwd = Path.cwd().resolve()
    if cwd == started or CHECKOUT in (cwd, *cwd.parents):
        monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    new = _top_level() - before
    if new:
        pytest.fail(
            f"{request.node.nodeid} wrote {sorted(new)} into the checkout {CHECKOUT}; a test "
            "works in its own directory (its working directory is a fresh one)"
        )


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Run a test on one torch thread: tiny models run fastest that way, and a busy shared
    machine cannot stall them. Modules opt in with ``pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _copy_linear(dst: nn.Module, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    dst.weight.copy_(weight)
    if bias is None:
        assert dst.bias is None
    else:
        dst.bias.copy_(bias)


def _copy_norm(dst: nn.Module, src: nn.LayerNorm) -> None:
    dst.weight.copy_(src.weight)
    if src.bias is not None:
        dst.bias.copy_(src.bias)


@torch.no_grad()
def copy_mha_weights(ours: nn.Module, theirs: nn.MultiheadAttention) -> None:
    """Copy an ``nn.MultiheadAttention`` (shared embed dim) into our ``MultiHeadAttention``."""
    wq, wk, wv = theirs.in_proj_weight.chunk(3, dim=0)
    if theirs.in_proj_bias is not None:
        bq, bk, bv = theirs.in_proj_bias.chunk(3, dim=0)
    else:
        bq = bk = bv = None
    _copy_linear(ours.q_proj, wq, bq)
    _copy_linear(ours.k_proj, wk, bk)
    _copy_linear(ours.v_proj, wv, bv)
    _copy_linear(ours.out_proj, theirs.out_proj.weight, theirs.out_proj.bias)


@torch.no_grad()
def _copy_ffn(ours: nn.Module, theirs: nn.Module) -> None:
    _copy_linear(ours.ffn.up_proj, theirs.linear1.weight, theirs.linear1.bias)
    _copy_linear(ours.ffn.down_proj, theirs.linear2.weight, theirs.linear2.bias)


@torch.no_grad()
def copy_encoder_layer_weights(ours: nn.Module, theirs: nn.TransformerEncoderLayer) -> None:
    """Copy an ``nn.TransformerEncoderLayer`` into our ``EncoderLayer``."""
    copy_mha_weights(ours.self_attn, theirs.self_attn)
    _copy_ffn(ours, theirs)
    _copy_norm(ours.self_attn_norm, theirs.norm1)
    _copy_norm(ours.ffn_norm, theirs.norm2)


@torch.no_grad()
def copy_decoder_layer_weights(ours: nn.Module, theirs: nn.TransformerDecoderLayer) -> None:
    """Copy an ``nn.TransformerDecoderLayer`` into our ``DecoderLayer``."""
    copy_mha_weights(ours.self_attn, theirs.self_attn)
    copy_mha_weights(ours.cross_attn, theirs.multihead_attn)
    _copy_ffn(ours, theirs)
    _copy_norm(ours.self_attn_norm, theirs.norm1)
    _copy_norm(ours.cross_attn_norm, theirs.norm2)
    _copy_norm(ours.ffn_norm, theirs.norm3)


@pytest.fixture
def copy_mha() -> Callable[[nn.Module, nn.MultiheadAttention], None]:
    return copy_mha_weights


@pytest.fixture
def copy_encoder_layer() -> Callable[[nn.Module, nn.TransformerEncoderLayer], None]:
    return copy_encoder_layer_weights


@pytest.fixture
def copy_decoder_layer() -> Callable[[nn.Module, nn.TransformerDecoderLayer], None]:
    return copy_decoder_layer_weights
