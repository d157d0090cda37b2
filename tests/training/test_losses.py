"""Label-smoothed cross-entropy (§5.4) against torch's ``cross_entropy(label_smoothing=...)``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.training.losses import label_smoothed_cross_entropy

PAD = 0


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, 7, 11, generator=g) * 3  # (B, T, V)
    targets = torch.randint(1, 11, (4, 7), generator=g)
    targets[0, 4:] = PAD  # right padding
    targets[2, 1:] = PAD
    return logits, targets


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3, 1.0])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_matches_torch(epsilon: float, reduction: str) -> None:
    logits, targets = _inputs()
    ours = label_smoothed_cross_entropy(
        logits,
        targets,
        epsilon=epsilon,
        ignore_index=PAD,
        reduction=reduction,  # type: ignore[arg-type]
    )
    ref = F.cross_entropy(
        logits.flatten(0, 1),
        targets.flatten(),
        label_smoothing=epsilon,
        ignore_index=PAD,
        reduction=reduction,
    )
    torch.testing.assert_close(ours.flatten(), ref.flatten(), atol=1e-6, rtol=1e-6)


def test_gradients_match_torch() -> None:
    logits, targets = _inputs(1)
    a = logits.clone().requires_grad_()
    b = logits.clone().requires_grad_()
    label_smoothed_cross_entropy(a, targets, epsilon=0.1, ignore_index=PAD).backward()
    F.cross_entropy(
        b.flatten(0, 1), targets.flatten(), label_smoothing=0.1, ignore_index=PAD
    ).backward()
    assert a.grad is not None and b.grad is not None
    torch.testing.assert_close(a.grad, b.grad, atol=1e-7, rtol=1e-5)
    assert a.grad[0, 4:].abs().max() == 0  # pads get no gradient


def test_epsilon_zero_is_plain_cross_entropy() -> None:
    logits, targets = _inputs(2)
    ours = label_smoothed_cross_entropy(logits, targets, epsilon=0.0, ignore_index=PAD)
    plain = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=PAD)
    torch.testing.assert_close(ours, plain, atol=1e-6, rtol=1e-6)


def test_no_ignore_index() -> None:
    logits, targets = _inputs(3)
    ours = label_smoothed_cross_entropy(logits, targets, epsilon=0.1, ignore_index=None)
    ref = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), label_smoothing=0.1)
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-6)


def test_smoothing_lowers_confidence_not_argmax() -> None:
    # The loss-minimising distribution under smoothing puts 1 - eps + eps/V on the label.
    V, eps = 5, 0.1
    best = torch.log(torch.full((V,), eps / V) + torch.eye(V)[2] * (1 - eps))
    worse = best.clone()
    worse[2] += 1.0  # more confident than the smoothed target
    target = torch.tensor([2])
    loss_best = label_smoothed_cross_entropy(best[None], target, epsilon=eps)
    loss_worse = label_smoothed_cross_entropy(worse[None], target, epsilon=eps)
    assert loss_best < loss_worse


def test_errors() -> None:
    logits, targets = _inputs()
    with pytest.raises(ValueError, match="epsilon"):
        label_smoothed_cross_entropy(logits, targets, epsilon=-0.1)
    with pytest.raises(ValueError, match="without the last"):
        label_smoothed_cross_entropy(logits, targets[:, :3])
    with pytest.raises(ValueError, match="reduction"):
        label_smoothed_cross_entropy(logits, targets, reduction="avg")  # type: ignore[arg-type]
