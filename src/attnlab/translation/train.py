"""The translation recipe behind ``attnlab train translate``: §5's training at a CPU size.

:func:`train_translation` trains the BPE tokenizer (or reuses the run's), encodes the data, builds
the encoder-decoder with shared, tied embeddings (§3.4) and runs:

- Adam(β1, β2, ε) = (0.9, 0.98, 1e-9) with eq. (3)'s learning rate (§5.3) times ``lr_factor``,
  set before every update (no scheduler object: the rate is a pure function of the step);
- label-smoothed cross-entropy (§5.4, ε_ls = 0.1) averaged over the batch's target tokens;
  residual/embedding/attention dropout (§5.4) in the model; gradient-norm clipping;
- token-based batches (:func:`~attnlab.translation.data.token_batches`), reshuffled per epoch;
- every ``eval_every`` steps: validation loss (plain cross-entropy per target token, all
  validation pairs) and greedy BLEU on the first ``eval_bleu_sentences`` pairs; ``best/`` is
  rewritten when ``best_metric`` improves;
- every ``save_every`` steps (and ``save_every_minutes``): a resumable snapshot and ``last/``;
- at the end: ``last/``, and ``averaged/`` = the mean of the last ``average_last`` snapshots
  (§6.1), evaluated like the others.

Budgets: the run stops at the first of ``max_steps``, ``max_minutes`` (wall time of the training
loop, periodic validation included, summed over resumed sessions) and ``max_epochs``. A resumed
run (``resume=True``) continues bitwise as the uninterrupted run would (CPU): the weights,
Adam's moments, torch's RNG (dropout) and the data position (epoch, batch) are restored.

Metrics go to ``OUT/metrics.jsonl`` (``split`` "train" or "val"); see
:mod:`attnlab.translation.checkpoints` for the other files.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnlab.config import config_to_dict
from attnlab.io import atomic_write_json, read_json
from attnlab.models.transformer import EncoderDecoderTransformer
from attnlab.training.metrics import MetricsLogger
from attnlab.translation.checkpoints import (
    latest_snapshot,
    load_snapshot,
    snapshot_dirs,
)
from attnlab.translation.config import TranslateConfig
from attnlab.translation.data import (
    available,
    encode_pairs,
    load_pairs,
    resolve_data_dir,
)
from attnlab.translation.loop import TrainLoop
from attnlab.translation.tokenizer import TranslationTokenizer

logger = logging.getLogger(__name__)

RUN_NAME = "run.json"


@dataclass
class TranslationRun:
    """What :func:`train_translation` did.

    Attributes:
        out: the run directory. step: updates done in total. seconds: training wall time in
        total. tokens: target tokens seen (src_tokens: source tokens). stopped_by: "steps",
        "minutes" or "epochs". final: validation metrics of last and averaged models.
    """

    out: Path
    step: int
    epoch: int
    seconds: float
    tokens: int
    src_tokens: int
    n_params: int
    stopped_by: str
    best: dict[str, Any]
    final: dict[str, dict[str, float]]


def _check_languages(directory: Path, config: TranslateConfig) -> None:
    langs = available(directory).get("train", [])
    for lang in (config.src, config.tgt):
        if lang not in langs:
            raise ValueError(
                f"unknown language {lang!r}: {directory} has training data for "
                f"{', '.join(langs) or 'no language'}"
            )


def _prepare_out(out: Path, config: TranslateConfig, resume: bool) -> None:
    run_file = out / RUN_NAME
    if resume:
        if not run_file.is_file():
            raise FileNotFoundError(f"--resume: {out} holds no {RUN_NAME} (not a run directory)")
        saved = TranslateConfig.from_dict(read_json(run_file)["config"])
        changed = config.trajectory_changes(saved)
        if changed:
            raise ValueError(f"--resume with other settings than the run's: {', '.join(changed)}")
    elif run_file.is_file():
        raise FileExistsError(f"{out} already holds a run: pass --resume, or another --out")


def train_translation(
    config: TranslateConfig,
    data_dir: str | os.PathLike[str] | None,
    out: str | os.PathLike[str],
    *,
    resume: bool = False,
    extra: dict[str, Any] | None = None,
) -> TranslationRun:
    """Train (or resume) a translation run; see the module docstring.

    Args:
        config: the recipe. data_dir: Multi30k-style directory (``None``: ``$ATTNLAB_DATA``).
        out: the run directory. resume: continue from its newest snapshot.
        extra: JSON-ready facts about this session (e.g. the command line), appended to
            ``run.json``'s ``sessions`` list.

    Raises:
        FileNotFoundError: for a missing data directory or split; ``--resume`` without a run.
        FileExistsError: for an existing run without ``resume``.
        ValueError: for an unknown language or a resume with other settings.
    """
    directory = resolve_data_dir(data_dir)
    _check_languages(directory, config)
    out = Path(out)
    _prepare_out(out, config, resume)
    c = config
    train_pairs = load_pairs(directory, "train", c.src, c.tgt, limit=c.train_limit)
    val_pairs = load_pairs(directory, "val", c.src, c.tgt)
    if resume:
        tokenizer = TranslationTokenizer.load(out)
    else:
        texts = [s for pair in train_pairs for s in pair]
        tokenizer = TranslationTokenizer.train(
            texts, vocab_size=c.vocab_size, min_frequency=c.min_frequency
        )
        tokenizer.save(out)
    train_data = encode_pairs(tokenizer, train_pairs, max_len=c.max_len, what="train")
    val_data = encode_pairs(tokenizer, val_pairs, max_len=c.max_len, what="val")
    bleu_pairs = [val_pairs[i] for i in val_data.index[: c.eval_bleu_sentences]]

    torch.manual_seed(c.seed)
    model_config = c.model_config(tokenizer.vocab_size)
    model = EncoderDecoderTransformer(model_config)
    n_params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.Adam(
        model.parameters(), lr=0.0, betas=(c.adam_beta1, c.adam_beta2), eps=c.adam_eps
    )
    state: dict[str, Any] = {
        "step": 0,
        "epoch": 0,
        "batch": 0,
        "tokens": 0,
        "src_tokens": 0,
        "seconds": 0.0,
        "best_step": None,
        "best_value": None,
        "best_metrics": {},
    }
    snapshot = latest_snapshot(out) if resume else None
    if resume and snapshot is None:
        raise FileNotFoundError(
            f"--resume: {out} has no complete checkpoint yet; start again with another --out "
            "(or delete the directory)"
        )
    if snapshot is not None:
        state = load_snapshot(snapshot, model, optimizer)
        for stale in snapshot_dirs(out):  # left by a session killed after this snapshot
            if stale.name > snapshot.name:
                shutil.rmtree(stale, ignore_errors=True)
    session = {"start_step": state["step"], **(extra or {})}
    previous = read_json(out / RUN_NAME).get("sessions", []) if resume else []
    run_info = {
        "config": c.to_dict(),
        "model": config_to_dict(model_config) | {"n_params": n_params},
        "data": str(directory),
        "src": c.src,
        "tgt": c.tgt,
        "train_pairs": len(train_data),
        "train_dropped": train_data.dropped,
        "val_pairs": len(val_data),
        "val_dropped": val_data.dropped,
        "sessions": [*previous, session],
    }
    atomic_write_json(out / RUN_NAME, run_info)
    metrics = MetricsLogger(out, resume_step=state["step"] if resume else None)
    info = {"src": c.src, "tgt": c.tgt, "data": str(directory)}
    loop = TrainLoop(c, model, optimizer, tokenizer, train_data, val_data, bleu_pairs, metrics, out)
    try:
        stopped_by = loop.run(state, info)
        final = loop.finish(state, info)
    finally:
        metrics.close()
    return TranslationRun(
        out=out,
        step=state["step"],
        epoch=state["epoch"],
        seconds=state["seconds"],
        tokens=state["tokens"],
        src_tokens=state["src_tokens"],
        n_params=n_params,
        stopped_by=stopped_by,
        best={k: state[k] for k in ("best_step", "best_value", "best_metrics")},
        final=final,
    )


def load_run_info(out: str | os.PathLike[str]) -> dict[str, Any]:
    """``run.json`` of a run directory."""
    data: dict[str, Any] = read_json(Path(out) / RUN_NAME)
    return data


__all__ = ["RUN_NAME", "TranslationRun", "load_run_info", "train_translation"]
