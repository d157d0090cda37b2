"""The translation recipe's settings: :class:`TranslateConfig` (model size, §5 training choices,
budgets, evaluation and checkpointing), validated on construction and stored as JSON in the run.

Defaults: a CPU-sized model (d_model 256, 3 encoder + 3 decoder layers, 4 heads, d_ff 1024,
dropout 0.1, post-norm as in the paper) on a joint 8k BPE vocabulary with shared and tied
embeddings (§3.4); Adam(β1 0.9, β2 0.98, ε 1e-9) with eq. (3)'s warmup schedule (§5.3) times
``lr_factor`` (0.3 with 400 warmup steps: a peak rate of 9.4e-4); label smoothing 0.1 (§5.4);
gradient-norm clipping at 1.0; batches of at most 2,048 padded tokens (~125 pairs); the last 5
snapshots (250 steps apart) averaged (§6.1).

Deviations from the paper: the model and the batches are far smaller (a CPU), and so is the
warmup (400 steps, not 4,000: a 90-minute CPU run makes a few thousand updates); ``lr_factor``
scales eq. (3) (the paper: 1); gradients are clipped (the paper mentions no clipping).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from attnlab.config import check_choice, check_positive, check_probability
from attnlab.models.transformer import TransformerConfig

# Fields that may change when a run is resumed (budgets and bookkeeping, not the trajectory).
RESUMABLE_CHANGES = (
    "max_steps",
    "max_minutes",
    "max_epochs",
    "eval_every",
    "eval_bleu_sentences",
    "save_every",
    "save_every_minutes",
    "average_last",
    "log_every",
    "progress",
)


@dataclass(frozen=True, kw_only=True)
class TranslateConfig:
    """Everything ``attnlab train translate`` needs besides the data and output directories."""

    src: str = "de"
    tgt: str = "en"
    # tokenizer
    vocab_size: int = 8000
    min_frequency: int = 2
    # model (§3, Table 3 at a CPU size)
    d_model: int = 256
    n_layers: int = 3
    n_heads: int = 4
    d_ff: int = 1024
    dropout: float = 0.1
    norm_position: Literal["pre", "post"] = "post"
    max_len: int = 128  # the model's max_seq_len; longer training pairs are dropped (counted)
    # optimisation (§5.3, §5.4)
    max_tokens: int = 2048  # padded tokens per batch: n_pairs * max(source, target length)
    lr_factor: float = 0.3
    warmup: int = 400
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-9
    label_smoothing: float = 0.1
    clip_grad_norm: float | None = 1.0
    seed: int = 0
    train_limit: int | None = None  # use only the first N training pairs
    # budgets: training stops at the first one reached (at least one is required)
    max_steps: int | None = None
    max_minutes: float | None = None
    max_epochs: int | None = None
    # evaluation, checkpoints, logging
    eval_every: int = 250
    eval_bleu_sentences: int = 200  # greedy BLEU on the first N validation pairs (0: off)
    best_metric: Literal["bleu", "loss"] = "bleu"
    save_every: int = 250
    save_every_minutes: float | None = None  # also save when this much time has passed
    average_last: int = 5
    log_every: int = 25
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("src", "tgt"):
            value = getattr(self, name)
            if not (isinstance(value, str) and value.isalpha()):
                raise ValueError(f"{name} must be a language code such as 'de', got {value!r}")
        if self.src == self.tgt:
            raise ValueError(f"source and target language are both {self.src!r}")
        check_positive(
            vocab_size=self.vocab_size,
            min_frequency=self.min_frequency,
            d_model=self.d_model,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            d_ff=self.d_ff,
            max_tokens=self.max_tokens,
            lr_factor=self.lr_factor,
            warmup=self.warmup,
            adam_eps=self.adam_eps,
            clip_grad_norm=self.clip_grad_norm,
            train_limit=self.train_limit,
            max_steps=self.max_steps,
            max_minutes=self.max_minutes,
            max_epochs=self.max_epochs,
            eval_every=self.eval_every,
            save_every=self.save_every,
            save_every_minutes=self.save_every_minutes,
            average_last=self.average_last,
            log_every=self.log_every,
        )
        check_probability(
            dropout=self.dropout, adam_beta1=self.adam_beta1, adam_beta2=self.adam_beta2
        )
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.max_len < 2:
            raise ValueError(f"max_len must be >= 2, got {self.max_len}")
        if self.seed < 0 or self.eval_bleu_sentences < 0:
            raise ValueError(
                f"seed and eval_bleu_sentences must be >= 0, got {self.seed}, "
                f"{self.eval_bleu_sentences}"
            )
        check_choice("best_metric", self.best_metric, ("bleu", "loss"))
        check_choice("norm_position", self.norm_position, ("pre", "post"))
        if self.max_steps is None and self.max_minutes is None and self.max_epochs is None:
            raise ValueError("give a training budget: max_steps, max_minutes or max_epochs")

    def model_config(self, vocab_size: int) -> TransformerConfig:
        """The encoder-decoder config for a tokenizer of ``vocab_size`` ids (ids 0-3 special)."""
        return TransformerConfig(
            vocab_size=vocab_size,
            d_model=self.d_model,
            n_heads=self.n_heads,
            n_layers=self.n_layers,
            d_ff=self.d_ff,
            dropout=self.dropout,
            max_seq_len=self.max_len,
            norm_position=self.norm_position,
            share_embeddings=True,
            tie_output=True,
            pad_id=0,
            bos_id=1,
            eos_id=2,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TranslateConfig:
        """Rebuild from :meth:`to_dict` output.

        Raises:
            ValueError: naming unknown keys.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown TranslateConfig keys {unknown}; valid: {sorted(names)}")
        return cls(**data)

    def trajectory_changes(self, other: TranslateConfig) -> list[str]:
        """Fields that differ from ``other`` and would change the training trajectory."""
        a, b = self.to_dict(), other.to_dict()
        return sorted(k for k in a if k not in RESUMABLE_CHANGES and a[k] != b[k])


__all__ = ["RESUMABLE_CHANGES", "TranslateConfig"]
