"""The update loop of the translation recipe: steps, periodic validation, snapshots, averaging.

:class:`TrainLoop` runs on a JSON-ready ``state`` dict (step, epoch, batch within the epoch,
tokens seen, training seconds, best score), which the snapshots store, so a resumed loop continues
exactly where the snapshot left off (see :mod:`attnlab.translation.train` for the recipe and
:mod:`attnlab.translation.checkpoints` for the files).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from attnlab.models.transformer import EncoderDecoderTransformer
from attnlab.training.losses import label_smoothed_cross_entropy
from attnlab.training.metrics import MetricsLogger
from attnlab.training.schedules import noam
from attnlab.translation.checkpoints import (
    average_checkpoints,
    export_model,
    save_snapshot,
    snapshot_dirs,
)
from attnlab.translation.config import TranslateConfig
from attnlab.translation.data import EncodedPairs, collate, token_batches
from attnlab.translation.evaluate import score_bleu, translate
from attnlab.translation.tokenizer import TranslationTokenizer


@torch.no_grad()
def validate(
    model: EncoderDecoderTransformer,
    tokenizer: TranslationTokenizer,
    data: EncodedPairs,
    bleu_pairs: list[tuple[str, str]],
    *,
    max_tokens: int,
) -> dict[str, float]:
    """Validation loss (plain cross-entropy per target token), perplexity and greedy BLEU."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for index in token_batches(data.src_lengths, data.tgt_lengths, max_tokens=max_tokens):
        b = collate(data, index, pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id)
        logits, _ = model(b.src, b.tgt_in, src_mask=b.src_mask)  # (B, T, V)
        loss = label_smoothed_cross_entropy(
            logits, b.tgt_out, epsilon=0.0, ignore_index=tokenizer.pad_id, reduction="sum"
        )
        total += float(loss)
        count += int((b.tgt_out != tokenizer.pad_id).sum())
    model.train(was_training)
    out = {"val_loss": total / max(count, 1), "val_ppl": math.exp(min(total / max(count, 1), 50))}
    if bleu_pairs:
        hyps = translate(model, tokenizer, [s for s, _ in bleu_pairs], beam=1)
        out["val_bleu"] = score_bleu(hyps, [t for _, t in bleu_pairs]).bleu
    return out


class TrainLoop:
    """The update loop, its periodic evaluation and checkpointing (state in a JSON-ready dict)."""

    def __init__(
        self,
        config: TranslateConfig,
        model: EncoderDecoderTransformer,
        optimizer: torch.optim.Optimizer,
        tokenizer: TranslationTokenizer,
        train_data: EncodedPairs,
        val_data: EncodedPairs,
        bleu_pairs: list[tuple[str, str]],
        metrics: MetricsLogger,
        out: Path,
    ) -> None:
        self.c, self.model, self.optimizer, self.tok = config, model, optimizer, tokenizer
        self.train_data, self.val_data, self.bleu_pairs = train_data, val_data, bleu_pairs
        self.metrics, self.out = metrics, out
        self.last_scores: tuple[int, dict[str, float]] | None = None
        if not len(train_data):
            raise ValueError("no training pairs left (all longer than max_len?)")

    def _budget_hit(self, state: dict[str, Any]) -> str | None:
        c = self.c
        if c.max_steps is not None and state["step"] >= c.max_steps:
            return "steps"
        if c.max_minutes is not None and state["seconds"] >= 60 * c.max_minutes:
            return "minutes"
        if c.max_epochs is not None and state["epoch"] >= c.max_epochs:
            return "epochs"
        return None

    def _update(self, index: list[int], step: int) -> tuple[float, float, int, int]:
        c, tok = self.c, self.tok
        b = collate(self.train_data, index, pad_id=tok.pad_id, bos_id=tok.bos_id)
        lr = noam(step, d_model=c.d_model, warmup=c.warmup, factor=c.lr_factor)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        logits, _ = self.model(b.src, b.tgt_in, src_mask=b.src_mask)  # (B, T, V)
        loss = label_smoothed_cross_entropy(
            logits, b.tgt_out, epsilon=c.label_smoothing, ignore_index=tok.pad_id
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        params = self.model.parameters()
        if c.clip_grad_norm is not None:
            norm = float(torch.nn.utils.clip_grad_norm_(params, c.clip_grad_norm))
        else:
            norm = float(
                torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
            )
        self.optimizer.step()
        n_tgt = int((b.tgt_out != tok.pad_id).sum())
        return float(loss.detach()), norm, n_tgt, b.n_src_tokens

    def run(self, state: dict[str, Any], info: dict[str, Any]) -> str:
        c = self.c
        self.model.train()
        start, last_save = time.monotonic(), time.monotonic()
        base_seconds = state["seconds"]
        bar = tqdm(total=c.max_steps, initial=state["step"], disable=not c.progress, unit="step")
        stopped = self._budget_hit(state)
        try:
            while stopped is None:
                batches = token_batches(
                    self.train_data.src_lengths,
                    self.train_data.tgt_lengths,
                    max_tokens=c.max_tokens,
                    seed=c.seed,
                    epoch=state["epoch"],
                )
                while state["batch"] < len(batches) and stopped is None:
                    step = state["step"] + 1
                    loss, norm, n_tgt, n_src = self._update(batches[state["batch"]], step)
                    state["step"], state["batch"] = step, state["batch"] + 1
                    state["tokens"] += n_tgt
                    state["src_tokens"] += n_src
                    state["seconds"] = base_seconds + time.monotonic() - start
                    bar.update(1)
                    if not math.isfinite(loss):
                        raise FloatingPointError(f"training loss is {loss} at step {step}")
                    if step % c.log_every == 0 or step == 1:
                        lr = self.optimizer.param_groups[0]["lr"]
                        rec = {
                            "step": step,
                            "split": "train",
                            "epoch": round(state["epoch"] + state["batch"] / len(batches), 4),
                            "loss": loss,
                            "lr": lr,
                            "grad_norm": norm,
                            "tokens": state["tokens"],
                            "seconds": round(state["seconds"], 2),
                        }
                        self.metrics.log(rec)
                        bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", refresh=False)
                    if state["batch"] == len(batches):
                        state["epoch"], state["batch"] = state["epoch"] + 1, 0
                    stopped = self._budget_hit(state)
                    if step % c.eval_every == 0 or stopped is not None:
                        self._evaluate(state, info)
                        state["seconds"] = base_seconds + time.monotonic() - start
                    timed = c.save_every_minutes is not None and (
                        time.monotonic() - last_save >= 60 * c.save_every_minutes
                    )
                    if step % c.save_every == 0 or timed or stopped is not None:
                        self._save(state, info)
                        last_save = time.monotonic()
        finally:
            bar.close()
        return stopped

    def _evaluate(self, state: dict[str, Any], info: dict[str, Any]) -> None:
        c = self.c
        scores = validate(
            self.model, self.tok, self.val_data, self.bleu_pairs, max_tokens=c.max_tokens
        )
        seconds = round(state["seconds"], 2)
        self.metrics.log({"step": state["step"], "split": "val", "seconds": seconds, **scores})
        self.last_scores = (state["step"], scores)
        key = "val_bleu" if c.best_metric == "bleu" and "val_bleu" in scores else "val_loss"
        value = scores[key] if key == "val_bleu" else -scores[key]
        if state["best_value"] is None or value > state["best_value"]:
            state.update(best_step=state["step"], best_value=value, best_metrics=scores)
            export_model(
                self.out / "best",
                self.model,
                self.tok,
                {**info, "step": state["step"], "kind": "best", **scores},
            )

    def _save(self, state: dict[str, Any], info: dict[str, Any]) -> None:
        save_snapshot(self.out, self.model, self.optimizer, state, keep=self.c.average_last)
        export_model(
            self.out / "last", self.model, self.tok, {**info, "step": state["step"], "kind": "last"}
        )

    def finish(self, state: dict[str, Any], info: dict[str, Any]) -> dict[str, dict[str, float]]:
        """Validate ``last``; write and validate ``averaged`` (last ``average_last`` snapshots)."""
        c = self.c
        if self.last_scores is not None and self.last_scores[0] == state["step"]:
            scores = self.last_scores[1]
        else:
            scores = validate(
                self.model, self.tok, self.val_data, self.bleu_pairs, max_tokens=c.max_tokens
            )
        dirs = snapshot_dirs(self.out)[-c.average_last :]
        averaged = EncoderDecoderTransformer(self.model.config)
        average_checkpoints(averaged, dirs)
        avg_scores = validate(
            averaged, self.tok, self.val_data, self.bleu_pairs, max_tokens=c.max_tokens
        )
        steps = [int(d.name.removeprefix("step_")) for d in dirs]
        export_model(
            self.out / "averaged",
            averaged,
            self.tok,
            {
                **info,
                "step": state["step"],
                "kind": "averaged",
                "averaged_steps": steps,
                **avg_scores,
            },
        )
        self.metrics.log(
            {
                "step": state["step"],
                "split": "final",
                "model": "averaged",
                "averaged_steps": steps,
                **{f"avg_{k}": v for k, v in avg_scores.items()},
            }
        )
        return {"last": scores, "averaged": avg_scores}


__all__ = ["TrainLoop", "validate"]
