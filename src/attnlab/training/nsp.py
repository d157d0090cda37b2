"""BERT's pre-training objective: masked LM + next-sentence prediction on sentence pairs.

Devlin et al. §3.1 train both tasks at once: every example is a pair ``[CLS] A [SEP] B [SEP]``
(:class:`attnlab.data.pairs.SentencePairs`: B follows A half of the time), its tokens corrupted
by the 80/10/10 rule (:func:`attnlab.models.bert.mask_tokens`, specials never selected), and the
loss is the mean MLM cross-entropy plus the mean NSP cross-entropy of the classifier on the
pooled ``[CLS]`` (Hugging Face's ``BertForPreTraining`` total loss).

In the trainer's terms (:class:`~attnlab.training.objectives.LossTerms`) the MLM part is the
summed loss over the masked tokens (so ``val_loss`` and ``val_accuracy`` stay the masked LM's,
comparable with ``shakespeare-mlm``) and the NSP mean rides as the auxiliary loss, which the
trainer adds to the training loss only (with one micro-batch: exactly MLM mean + NSP mean).
:class:`NSPMetrics` reports the validation NSP accuracy and loss beside them.

Shapes: B batch, T pair length, V vocabulary.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from attnlab.data.common import Split
from attnlab.data.pairs import PairBatch, SentencePairs
from attnlab.models.bert import mask_tokens, nsp_loss
from attnlab.training.losses import label_smoothed_cross_entropy
from attnlab.training.moe import model_aux_loss
from attnlab.training.objectives import LossTerms, SampledObjective
from attnlab.training.trainer import Callback, Trainer


class PretrainingBatch(NamedTuple):
    """A masked batch of sentence pairs.

    Attributes:
        inputs: ``(B, T)`` corrupted ids. token_type_ids: ``(B, T)`` segments (0 A, 1 B).
        targets: ``(B, T)`` original ids at the selected positions, ``ignore_index`` elsewhere.
        nsp_labels: ``(B,)`` 0 = IsNext, 1 = NotNext.
    """

    inputs: Tensor
    token_type_ids: Tensor
    targets: Tensor
    nsp_labels: Tensor


def pretraining_logits(model: nn.Module, batch: PretrainingBatch) -> tuple[Tensor, Tensor]:
    """``(MLM logits (B, T, V), NSP logits (B, 2))`` of ``model`` on ``batch``.

    Raises:
        ValueError: for a model without both heads.
    """
    out = model(batch.inputs, token_type_ids=batch.token_type_ids)
    if getattr(out, "logits", None) is None or getattr(out, "nsp_logits", None) is None:
        raise ValueError(
            "MLM + NSP needs a BERT with both heads: build it with mlm_head=True, pooler=True "
            "and nsp_head=True"
        )
    return out.logits, out.nsp_logits


class MLMNSPObjective(SampledObjective):
    """Masked LM + next-sentence prediction on random sentence pairs (see the module).

    Args:
        pairs: the sentence pairs. vocab_size, mask_id: of the model. special_ids: never
            selected for masking ([PAD], [CLS], [SEP], [MASK]). mask_prob: selection rate.
        ignore_index: the MLM target of unselected positions.
    """

    def __init__(
        self,
        pairs: SentencePairs,
        *,
        vocab_size: int,
        mask_id: int,
        special_ids: tuple[int, ...] = (),
        mask_prob: float = 0.15,
        ignore_index: int = -100,
    ) -> None:
        self.pairs = pairs
        self.vocab_size, self.mask_id, self.special_ids = vocab_size, mask_id, special_ids
        self.mask_prob, self.ignore_index = mask_prob, ignore_index

    def mask(self, batch: PairBatch, generator: torch.Generator) -> PretrainingBatch:
        """``batch`` with its tokens corrupted by the 80/10/10 rule (drawn from ``generator``)."""
        inputs, targets = mask_tokens(
            batch.ids,
            vocab_size=self.vocab_size,
            mask_id=self.mask_id,
            special_ids=self.special_ids,
            mask_prob=self.mask_prob,
            ignore_index=self.ignore_index,
            generator=generator,
        )
        return PretrainingBatch(inputs, batch.token_type_ids, targets, batch.nsp_labels)

    def sample(self, split: Split, batch_size: int, generator: torch.Generator) -> Any:
        return self.mask(self.pairs.sample(split, batch_size, generator), generator)

    def count(self, batch: Any) -> int:
        return int((batch.targets != self.ignore_index).sum())

    def n_tokens(self, batch: Any) -> int:
        return int(batch.inputs.numel())

    def loss(self, model: nn.Module, batch: Any, *, label_smoothing: float) -> LossTerms:
        logits, nsp_logits = pretraining_logits(model, batch)
        loss_sum = label_smoothed_cross_entropy(
            logits.float(), batch.targets, epsilon=label_smoothing,
            ignore_index=self.ignore_index, reduction="sum",
        )  # fmt: skip
        keep = batch.targets != self.ignore_index
        correct = int(((logits.detach().argmax(-1) == batch.targets) & keep).sum())
        aux = nsp_loss(nsp_logits, batch.nsp_labels)  # a mean over the pairs
        model_aux = model_aux_loss(model)
        if model_aux is not None:
            aux = aux + model_aux
        return LossTerms(loss_sum, int(keep.sum()), correct, aux)


class NSPMetrics(Callback):
    """Validation next-sentence accuracy and loss (``val_nsp_accuracy``, ``val_nsp_loss``) on
    the trainer's validation batches; chance accuracy is 0.5."""

    names = ("nsp_accuracy", "nsp_loss")

    @torch.no_grad()
    def metrics(
        self, trainer: Trainer, model: nn.Module, base: dict[str, float]
    ) -> dict[str, float]:
        correct, total, loss_sum = 0, 0, 0.0
        device = next(model.parameters()).device
        for batch in trainer.val_batches():
            batch = PretrainingBatch(*(t.to(device) for t in batch))
            _, nsp_logits = pretraining_logits(model, batch)
            n = int(batch.nsp_labels.numel())
            correct += int((nsp_logits.argmax(-1) == batch.nsp_labels).sum())
            loss_sum += float(nsp_loss(nsp_logits, batch.nsp_labels)) * n
            total += n
        return {"nsp_accuracy": correct / max(total, 1), "nsp_loss": loss_sum / max(total, 1)}


__all__ = ["MLMNSPObjective", "NSPMetrics", "PretrainingBatch", "pretraining_logits"]
