"""The memory estimates by precision and activation checkpointing, and the training memory check
that uses them: bytes per parameter of each precision, the checkpointed stack's closed form, and
a run refused plainly that fits with checkpointing."""

from __future__ import annotations

import dataclasses

import pytest

import attnlab.analysis.memory_check as mc
from attnlab.analysis.memory import activation_bytes, training_memory
from attnlab.analysis.params import count_params
from attnlab.cli.train import _check_memory
from attnlab.models import GPTConfig
from attnlab.models.costs import stack_activations
from attnlab.training.config import TrainConfig

# the Shakespeare shape (nanoGPT's shakespeare-char GPT) at context 2048
SHAKESPEARE = GPTConfig(vocab_size=65, d_model=384, n_heads=6, n_layers=6, d_ff=1536,
                        max_seq_len=2048, dropout=0.0, eos_id=None)  # fmt: skip


@pytest.mark.parametrize(
    ("precision", "per_param"), [("fp32", 16), ("bf16-mixed", 18), ("fp16-mixed", 18), ("bf16", 8)]
)
def test_bytes_per_parameter_of_each_precision(precision: str, per_param: int) -> None:
    m = training_memory(SHAKESPEARE, 256, batch=1, precision=precision)
    n = count_params(SHAKESPEARE)
    assert m.weights + m.gradients + m.optimizer == per_param * n
    fp32 = training_memory(SHAKESPEARE, 256, batch=1, precision="fp32").activations
    assert (m.activations < fp32) == (precision != "fp32")
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        training_memory(SHAKESPEARE, precision="fp8")


@pytest.mark.parametrize("every", [1, 2, 4, 6, 7])
def test_a_checkpointed_stack_keeps_block_inputs_and_one_recomputed_block(every: int) -> None:
    B, T, n, E = 2, 128, SHAKESPEARE.n_layers, SHAKESPEARE.d_model
    block = stack_activations(SHAKESPEARE, B=B, T=T, n_layers=1, masked=True)
    checkpointed = len(range(0, n, every))
    act, fp32, scores = stack_activations(
        SHAKESPEARE, B=B, T=T, n_layers=n, masked=True, every=every
    )
    plain_blocks = n - checkpointed + 1
    assert act == plain_blocks * block[0] + checkpointed * B * T * E
    assert (fp32, scores) == (plain_blocks * block[1], plain_blocks * block[2])
    totals = [activation_bytes(SHAKESPEARE, T, batch=B, checkpoint_every=k)["total"]
              for k in (0, 2, 1)]  # fmt: skip
    assert totals[0] > totals[1] > totals[2]
    with pytest.raises(ValueError, match="checkpoint_every must be >= 0"):
        activation_bytes(SHAKESPEARE, T, checkpoint_every=-1)


def test_checkpointing_fits_a_run_the_memory_check_refuses_plainly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Shakespeare shape, context 2048, batch 8: 16.0 GiB plainly (the math path's scores),
    3.0 GiB with every block checkpointed; with 8 GiB available only the latter runs."""
    train = TrainConfig(batch_size=8, steps=10, device="cpu")
    plain = mc.estimate_training(SHAKESPEARE, batch=8)
    ckpt = mc.estimate_training(SHAKESPEARE, batch=8, activation_checkpointing=1)
    assert plain is not None and ckpt is not None
    assert ckpt.total < 0.25 * plain.total
    assert "checkpointing every block" in ckpt.what
    monkeypatch.setattr(mc, "available_memory", lambda: (8 * 2**30, "a test's figure"))
    with pytest.raises(mc.MemoryLimitError, match="float32, Adam, batch 8 x 2048 tokens"):
        _check_memory(SHAKESPEARE, train, 8)
    _check_memory(SHAKESPEARE, dataclasses.replace(train, activation_checkpointing=1), 8)
    mixed = dataclasses.replace(train, precision="bf16-mixed")
    assert mc.estimate_training(SHAKESPEARE, batch=8, precision="bf16-mixed").total < plain.total  # type: ignore[union-attr]
    with pytest.raises(mc.MemoryLimitError, match="bf16-mixed"):
        _check_memory(SHAKESPEARE, mixed, 8)
