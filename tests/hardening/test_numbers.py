"""Numbers the API takes (issue 49, class 5): each is checked where it enters, with a
``ValueError``/``TypeError`` naming it and what is valid, never a NaN result, a
``ZeroDivisionError``/``IndexError`` or torch's "Overflow when unpacking long".

- ``scale``: every attention backend refuses NaN, infinities, 0 and negative numbers (and a
  non-number), at the boundary they share (``check_qkv``).
- Head dims of 0: the backends given empty head dims, ``MultiHeadAttention(d_model=0)``.
- Seeds: ``attnlab generate --seed`` and ``attnlab train --seed`` take ``[0, 2**64 - 1]`` and
  say so; the trainer's seeds derived from the largest one (validation, held-out data) wrap.
- Token ids: a prompt id of ``2**63`` (Python API, ``generate --ids``, ``inspect --ids``) is
  refused naming the id and the vocabulary.
- Floats reaching math unchecked: norm ``eps``, BatchNorm's momentum, the sinusoid and RoPE
  bases, RoPE's scaling factor, a sinusoid table of width 0.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

import attnlab
import testkit
from attnlab import GPTConfig, build_model
from attnlab.generation import pack_prompts
from attnlab.layers import ATTENTION_BACKENDS, MultiHeadAttention
from attnlab.layers.norm import BatchNorm, LayerNorm, RMSNorm
from attnlab.layers.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    sinusoidal_table,
)
from attnlab.training import TrainConfig
from attnlab.training.recipes.images import DigitsOptions

TINY = GPTConfig(vocab_size=50, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=8,
                 eos_id=None)  # fmt: skip
BACKENDS = sorted(ATTENTION_BACKENDS.keys())


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``attnlab ARGV``'s exit status and stderr (``capsys`` kept for the callers' sake)."""
    status, _, err = testkit.run_cli(argv)
    return status, err


def one_error(err: str) -> str:
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    return lines[0]


# ------------------------------------------------------------------------------- attention


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", [math.nan, math.inf, -math.inf, 0.0, -0.5])
def test_every_backend_refuses_a_scale_that_is_not_finite_and_positive(
    backend: str, scale: float
) -> None:
    q = torch.randn(1, 2, 3, 4)
    fn = ATTENTION_BACKENDS.get(backend)
    with pytest.raises(ValueError, match=r"scale must be a finite positive number") as info:
        fn(q, q, q, scale=scale)
    assert repr(scale) in str(info.value)
    for bad in ("0.5", torch.tensor(0.5), True):
        with pytest.raises(TypeError, match="scale must be a finite positive number"):
            fn(q, q, q, scale=bad)  # type: ignore[arg-type]
    out = fn(q, q, q, scale=0.5)  # a finite positive scale (an int too) still works
    assert torch.isfinite(out).all() and torch.isfinite(fn(q, q, q, scale=1)).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_refuses_a_head_dim_of_zero(backend: str) -> None:
    empty = torch.randn(1, 2, 3, 0)
    with pytest.raises(ValueError, match=r"head dims must be positive, got D=0"):
        ATTENTION_BACKENDS.get(backend)(empty, empty, empty)  # 1/sqrt(0), amax over nothing


@pytest.mark.parametrize("d_model", [0, -4, 2.0, True])
def test_multihead_attention_refuses_a_width_that_is_no_positive_integer(d_model: Any) -> None:
    with pytest.raises(ValueError, match=rf"d_model must be a positive integer, got {d_model!r}"):
        MultiHeadAttention(d_model, 2)
    with pytest.raises(ValueError, match=r"n_kv_heads must be a positive integer, got 0"):
        MultiHeadAttention(16, 2, n_kv_heads=0)


# ----------------------------------------------------------------------------------- seeds


@pytest.mark.parametrize("seed", ["1e23", "100000000000000000000000", "18446744073709551616",
                                  "-1"])  # fmt: skip
def test_generate_seed_names_the_flag_and_the_range(
    seed: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    attnlab.save_pretrained(build_model(TINY), tmp_path / "m")
    argv = ["generate", str(tmp_path / "m"), "--ids", "1,2", "--do-sample", "--max-new-tokens",
            "2", "--seed", seed]  # fmt: skip
    status, err = run_cli(argv, capsys)
    line = one_error(err)
    assert status == 2 and "--seed" in line and "[0, 2**64 - 1]" in line, line
    assert "Overflow" not in err
    argv[-1] = str(2**64 - 1)  # the largest seed works
    assert run_cli(argv, capsys)[0] == 0


def test_train_seed_names_the_flag_and_the_largest_seed_trains(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny = ["train", "reverse", "--steps=2", "--warmup=1", "--eval-batches=1", "--eval-size=4",
            "--d-model=16", "--n-heads=2", "--n-layers=1", "--d-ff=32", "--batch-size=2",
            "--no-progress"]  # fmt: skip
    status, err = run_cli([*tiny, "--seed=100000000000000000000000", "--out",
                           str(tmp_path / "a")], capsys)  # fmt: skip
    line = one_error(err)
    assert status == 2 and "--seed must be an integer in [0, 2**64 - 1]" in line, line
    assert not (tmp_path / "a").exists()  # refused before the run directory is made
    # 2**64 - 1: the validation and held-out seeds derived from it wrap around
    status, err = run_cli([*tiny, f"--seed={2**64 - 1}", "--out", str(tmp_path / "b")], capsys)
    assert status == 0, err
    with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\*\*64 - 1\], got -1"):
        TrainConfig(steps=1, seed=-1)
    with pytest.raises(ValueError, match=r"split_seed must be an integer in \[0, 2\*\*64 - 1\]"):
        DigitsOptions(split_seed=2**64)
    from attnlab.config import check_seed

    check_seed(seed=0, other=2**64 - 1, unset=None)


# ------------------------------------------------------------------------------- token ids


def test_a_prompt_id_beyond_int64_names_the_id_and_the_vocabulary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = 2**63
    with pytest.raises(ValueError, match=rf"token id {big} is outside the vocabulary \[0, 50\)"):
        pack_prompts([[1, 2], [3, big]], pad_id=0, vocab_size=50)
    with pytest.raises(ValueError, match=rf"token id -{big + 1} is outside the vocabulary"):
        pack_prompts([[-big - 1]], pad_id=0, vocab_size=50)
    model = build_model(TINY)
    with pytest.raises(ValueError, match=rf"token id {big} is outside the vocabulary \[0, 50\)"):
        attnlab.generate(model, [[1, big]], max_new_tokens=2)
    attnlab.save_pretrained(model, tmp_path / "m")
    for command in (["generate", str(tmp_path / "m"), "--ids", f"1,{big}"],
                    ["inspect", str(tmp_path / "m"), "--ids", f"1,{big}", "--lens"]):  # fmt: skip
        status, err = run_cli(command, capsys)
        line = one_error(err)
        assert status == 2 and f"token id {big} is outside the vocabulary [0, 50)" in line, line


# ------------------------------------------------------------- floats reaching math unchecked


@pytest.mark.parametrize("eps", [math.nan, math.inf, -1e-5, 0.0])
def test_norms_refuse_an_eps_that_is_not_finite_and_positive(eps: float) -> None:
    for norm in (LayerNorm, RMSNorm, BatchNorm):
        with pytest.raises(ValueError, match=rf"{norm.__name__} eps must be a finite positive"):
            norm(8, eps=eps)
    with pytest.raises(ValueError, match="BatchNorm momentum must be a number in"):
        BatchNorm(8, momentum=math.nan)


@pytest.mark.parametrize("base", [math.nan, math.inf, 0.0, -10.0])
def test_positional_encodings_refuse_a_base_that_is_not_finite_and_positive(base: float) -> None:
    with pytest.raises(ValueError, match="the sinusoid base must be a finite positive number"):
        SinusoidalPositionalEncoding(8, base=base)
    with pytest.raises(ValueError, match="the sinusoid base must be a finite positive number"):
        sinusoidal_table(torch.arange(3), 8, base)
    with pytest.raises(ValueError, match="the RoPE base must be a finite positive number"):
        RotaryEmbedding(8, base=base)


def test_positional_encodings_refuse_empty_widths_and_a_nan_factor() -> None:
    with pytest.raises(ValueError, match="d_model must be a positive integer, got 0"):
        sinusoidal_table(torch.arange(3), 0)
    with pytest.raises(ValueError, match="RoPE's d_head must be a positive integer, got 0"):
        RotaryEmbedding(0)
    with pytest.raises(ValueError, match="max_seq_len must be a positive integer, got 0"):
        LearnedPositionalEmbedding(8, 0)
    with pytest.raises(ValueError, match="rope scaling factor must be >= 1, got nan"):
        RotaryEmbedding(8, scaling="linear", factor=math.nan)
