"""Mamba language model (Gu & Dao 2023): embeddings, N residual Mamba blocks, RMSNorm, tied head.

The architecture of the reference ``mamba_ssm`` ``MambaLMHeadModel`` and of Hugging Face's
``MambaForCausalLM`` (their key layout: :mod:`attnlab.interop.hf_mamba`): a token embedding, N
blocks ``x + Mixer(RMSNorm(x))`` (:class:`~attnlab.layers.ssm.MambaBlock`), a final RMSNorm and
an LM head tied to the embedding. No positions: the recurrence orders the tokens, so there is no
context limit either (``max_seq_len`` does not exist here).

Decoding: :meth:`MambaLM.new_state` makes a :class:`~attnlab.layers.ssm.MambaState` (constant
size, per row); ``forward(ids, state=state)`` consumes ``ids`` after what the state has seen and
updates it in place, so a prompt runs in one parallel call and each new token costs one step.

Shapes: B batch, T tokens, E d_model, V vocabulary.

Deviations: none in the computation; init as the reference (``out_proj`` scaled by
1/sqrt(n_layers), embeddings N(0, init_std)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal, cast

import torch
from torch import Tensor, nn

from attnlab.config import Config, check_positive
from attnlab.layers.embedding import TokenEmbedding, tie_weights
from attnlab.layers.norm import RMSNorm
from attnlab.layers.ssm import MambaBlock, MambaMixer, MambaState
from attnlab.models.base import GenerationMixin, PretrainedModel
from attnlab.models.common import check_size, check_token_ids, token_inputs, token_loss
from attnlab.models.costs import (
    FP32,
    INDEX_BYTES,
    Costs,
    MatmulTerm,
    ParamBreakdown,
    linear_params,
    norm_params,
)
from attnlab.models.family import Family, Kind, register_family


@dataclass(frozen=True, kw_only=True)
class MambaConfig(Config):
    """Hyper-parameters of a Mamba LM (defaults: mamba-130m's block shapes, vocab 50280).

    Field types are checked by :class:`~attnlab.config.Config`; :meth:`validate` checks ranges.
    """

    model_type: ClassVar[str] = "mamba"

    vocab_size: int = 50280
    d_model: int = 768
    n_layers: int = 24
    d_state: int = 16  # N
    d_conv: int = 4  # K, the causal convolution's kernel
    expand: int = 2  # d_inner = expand · d_model
    dt_rank: int | Literal["auto"] = "auto"  # "auto": ceil(d_model / 16)
    norm_eps: float = 1e-5
    bias: bool = False  # in_proj / out_proj biases (HF use_bias)
    conv_bias: bool = True  # HF use_conv_bias
    tie_output: bool = True
    residual_in_fp32: bool = True
    scan: Literal["parallel", "sequential"] = "parallel"  # the training scan
    init_std: float = 0.02  # embeddings
    dt_min: float = 1e-3  # initial step sizes, log-uniform in [dt_min, dt_max]
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4
    ignore_index: int = -100
    pad_id: int | None = None
    bos_id: int | None = None
    eos_id: int | None = None

    def validate(self) -> None:
        """Sizes, the step-size range and the special ids.

        Raises:
            ValueError: naming the bad value.
        """
        super().validate()
        check_positive(
            vocab_size=self.vocab_size, d_model=self.d_model, n_layers=self.n_layers,
            d_state=self.d_state, d_conv=self.d_conv, expand=self.expand, norm_eps=self.norm_eps,
            init_std=self.init_std, dt_min=self.dt_min, dt_max=self.dt_max,
            dt_init_floor=self.dt_init_floor,
        )  # fmt: skip
        if self.dt_rank != "auto" and self.dt_rank < 1:
            raise ValueError(f"dt_rank must be 'auto' or a positive integer, got {self.dt_rank!r}")
        if self.dt_min > self.dt_max:
            raise ValueError(f"dt_min={self.dt_min} is larger than dt_max={self.dt_max}")
        check_token_ids(self, ("pad_id", "bos_id", "eos_id"), self.vocab_size)

    @property
    def d_inner(self) -> int:
        """E = expand · d_model, the channels inside the mixer."""
        return self.expand * self.d_model

    @property
    def dt_rank_value(self) -> int:
        """R: ``dt_rank``, or ceil(d_model / 16) for ``"auto"`` (the reference's rule)."""
        return math.ceil(self.d_model / 16) if self.dt_rank == "auto" else int(self.dt_rank)


def _block(c: MambaConfig) -> MambaBlock:
    mixer = MambaMixer(
        c.d_model, c.d_inner, c.d_state, c.d_conv, c.dt_rank_value, bias=c.bias,
        conv_bias=c.conv_bias, scan=c.scan, dt_min=c.dt_min, dt_max=c.dt_max,
        dt_init_floor=c.dt_init_floor,
    )  # fmt: skip
    return MambaBlock(mixer, c.d_model, eps=c.norm_eps, residual_in_fp32=c.residual_in_fp32)


class MambaLM(GenerationMixin, PretrainedModel):
    """Mamba language model: ``forward(ids, targets=, state=) -> (logits, loss)``."""

    def __init__(self, config: MambaConfig) -> None:
        super().__init__()
        c = self.config = config
        self.tok_embed = TokenEmbedding(c.vocab_size, c.d_model, scale=False)
        self.layers = nn.ModuleList(_block(c) for _ in range(c.n_layers))
        self.final_norm = RMSNorm(c.d_model, eps=c.norm_eps)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.reset_parameters()
        if c.tie_output:
            tie_weights(self.lm_head, self.tok_embed)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The reference init: zero linear biases (not Δ's), embeddings N(0, init_std), each
        ``out_proj`` weight divided by sqrt(n_layers) (one residual branch per layer)."""
        for mixer in self.mixers():
            for lin in (mixer.in_proj, mixer.out_proj):
                if lin.bias is not None:
                    nn.init.zeros_(lin.bias)
            nn.init.kaiming_uniform_(mixer.out_proj.weight, a=math.sqrt(5))
            mixer.out_proj.weight /= math.sqrt(self.config.n_layers)
        nn.init.normal_(self.tok_embed.weight, std=self.config.init_std)

    def new_state(self, batch: int, *, device: torch.device | str | None = None) -> MambaState:
        """An empty decoding state for ``batch`` sequences (zeros; constant size)."""
        dev = torch.device(device) if device is not None else self.tok_embed.weight.device
        return MambaState([mixer.new_state(batch, device=dev) for mixer in self.mixers()])

    def mixers(self) -> list[MambaMixer]:
        """Every layer's :class:`~attnlab.layers.ssm.MambaMixer`, in order."""
        return [cast(MambaBlock, layer).mixer for layer in self.layers]

    def hidden_states(self, ids: Tensor, *, state: MambaState | None = None) -> Tensor:
        """The final (normalised) hidden states ``(B, T, E)``; arguments as :meth:`forward`."""
        if ids.dim() != 2:
            raise ValueError(f"ids must be (B, T) token ids, got shape {tuple(ids.shape)}")
        if state is not None and state.batch_size != ids.shape[0]:
            raise ValueError(f"state holds {state.batch_size} rows, ids has {ids.shape[0]}")
        x = self.tok_embed(ids)  # (B, T, E)
        for i, layer in enumerate(self.layers):
            x = layer(x, state.layer(i) if state is not None else None)
        return self.final_norm(x.to(self.final_norm.weight.dtype))

    def forward(
        self, ids: Tensor, *, targets: Tensor | None = None, state: MambaState | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """Next-token logits (and the loss).

        Args:
            ids: token ids ``(B, T)``; with a ``state``, the tokens after those it has seen.
            targets: ``(B, T)`` the next token at each position; ``config.ignore_index`` skipped.
            state: a :class:`~attnlab.layers.ssm.MambaState` from :meth:`new_state`, updated
                in place.

        Returns:
            ``(logits (B, T, V), mean token cross-entropy or None)``.

        Raises:
            ValueError: for ids outside the vocabulary, a state of another batch size, or
                targets of another shape, dtype or outside the vocabulary.
        """
        h = self.hidden_states(ids, state=state)
        head_weight = getattr(self.lm_head, "weight", None)  # a quantized head has none
        if isinstance(head_weight, Tensor):
            h = h.to(head_weight.dtype)
        logits = self.lm_head(h)  # (B, T, V)
        loss = None
        if targets is not None:
            loss = token_loss(logits, targets, ids, ignore_index=self.config.ignore_index)
        return logits, loss


PRESETS: dict[str, MambaConfig] = {
    # state-spaces/mamba-130m (Hugging Face: state-spaces/mamba-130m-hf): 24 layers, d 768,
    # vocab 50280 (GPT-NeoX's 50277 padded to a multiple of 8), id 0 = <|endoftext|>.
    "mamba-130m": MambaConfig(pad_id=0, bos_id=0, eos_id=0),
    # Character-level Mamba at the baby GPT's size (gpt-char-baby: 834k with vocab 256; 804k at
    # the recipe's vocab 65): width 128 like the GPT; a Mamba block has ~6·E² weights against a
    # Transformer layer's 12·E², so 7 blocks (849k at vocab 256, 825k at vocab 65).
    "mamba-char-baby": MambaConfig(vocab_size=256, d_model=128, n_layers=7),
    # A tiny model for tests and examples.
    "mamba-tiny": MambaConfig(vocab_size=256, d_model=32, n_layers=2, d_state=8),
}


# -- the family's declaration (attnlab.models.family) -----------------------------------------
# The closed forms below are documented with their derivations in attnlab.analysis.recurrent
# (parameters, FLOPs, decoding state) and attnlab.analysis.recurrent_memory (activations).


def mamba_layer_params(c: MambaConfig) -> dict[str, int]:
    """Parameters of one Mamba block, per part of the mixer (and its norm)."""
    E, D, N, R = c.d_inner, c.d_model, c.d_state, c.dt_rank_value
    return {
        "in_proj": linear_params(D, 2 * E, c.bias),
        "conv1d": E * c.d_conv + (E if c.conv_bias else 0),
        "x_proj": linear_params(E, R + 2 * N, bias=False),
        "dt_proj": linear_params(R, E),
        "ssm": E * N + E,  # A_log and D
        "out_proj": linear_params(E, D, c.bias),
        "norm": norm_params(D, "rmsnorm"),
    }


def _params(c: MambaConfig) -> ParamBreakdown:
    L = c.n_layers
    comp = {"embedding.token": c.vocab_size * c.d_model}
    for part, n in mamba_layer_params(c).items():
        comp["layers.norms" if part == "norm" else f"layers.mixer.{part}"] = L * n
    comp["final_norm"] = norm_params(c.d_model, "rmsnorm")
    comp["lm_head"] = 0 if c.tie_output else c.vocab_size * c.d_model
    tied = {"lm_head": "embedding.token"} if c.tie_output else {}
    return ParamBreakdown(comp, {"layers": L}, tied)


def _flops(c: MambaConfig, B: int, n: int, src: int | None) -> tuple[list[MatmulTerm], int]:
    t, L, E, D, N, R = B * n, c.n_layers, c.d_inner, c.d_model, c.d_state, c.dt_rank_value
    terms = [
        MatmulTerm("layers.mixer.in_proj", t, D, 2 * E, L),
        MatmulTerm("layers.mixer.conv1d", t, c.d_conv, E, L),  # depthwise: K taps per channel
        MatmulTerm("layers.mixer.x_proj", t, E, R + 2 * N, L),
        MatmulTerm("layers.mixer.dt_proj", t, R, E, L),
        MatmulTerm("layers.mixer.readout", t, N, E, L),  # y = C · h, per channel
        MatmulTerm("layers.mixer.out_proj", t, E, D, L),
        MatmulTerm("lm_head", t, D, c.vocab_size),
    ]
    return terms, 0  # no softmax; the scan's elementwise work: scan_elementwise_flops


def _doubling_flops(T: int) -> int:
    """Elementwise operations of recursive doubling over T steps, per state entry."""
    if T == 1:
        return 0
    n = T // 2
    return 3 * n + _doubling_flops(n) + 2 * ((T + 1) // 2)  # pair up, recurse, fix evens


def scan_elementwise_flops(
    config: MambaConfig, seq_len: int, *, batch: int = 1, scan: str = "parallel"
) -> int:
    """The selective scan's elementwise FLOPs over a forward pass (what ``FlopCounterMode``
    does not count): discretisation ``3EN + E``, the recurrence (``2EN`` per token sequentially;
    recursive doubling's exact count for ``"parallel"``), and the D skip ``2E``, per token and
    layer; exp counts as one.

    Raises:
        ValueError: for a non-positive length or batch, or an unknown scan.
    """
    T, B = check_size("seq_len", seq_len), check_size("batch", batch)
    if scan not in ("parallel", "sequential"):
        raise ValueError(f"scan={scan!r} is not valid; choose one of ['parallel', 'sequential']")
    E, N = config.d_inner, config.d_state
    recurrence = 2 * T if scan == "sequential" else _doubling_flops(T)
    per_layer = T * (3 * E * N + E + 2 * E) + recurrence * E * N
    return B * config.n_layers * per_layer


def mamba_activation_bytes(c: MambaConfig, *, batch: int, seq_len: int, a: int) -> dict[str, int]:
    """Bytes autograd keeps for one training step on ``batch`` sequences of ``seq_len`` tokens,
    ``a`` bytes per element (:mod:`attnlab.analysis.recurrent_memory` derives it).

    Returns:
        ``layers``, ``outside_layers``, ``attention_scores`` (0), ``scan_states`` (the
        ``(B, T, E, N)`` tensors, part of ``layers``) and ``total``.
    """
    B, T, D, E, N = batch, seq_len, c.d_model, c.d_inner, c.d_state
    t = B * T
    norm = 3 * t * D + t
    # x_proj reads x through a copy, except for one sequence or one token: (B, T, E) transposed
    # from (B, E, T) then flattens to a (transposed) matrix that the product reads as it is
    copies = t * E if B > 1 and T > 1 else 0
    mixer = 9 * t * E + copies + B * E * (T + c.d_conv - 1) + t * (c.dt_rank_value + 2 * N)
    states = (2 if c.scan == "parallel" else 3) * t * E * N
    fp32 = t * E + 2 * E * N + states
    layers = c.n_layers * ((norm + mixer) * a + fp32 * FP32)
    outside = 2 * t * INDEX_BYTES + norm * a + t * c.vocab_size * FP32
    return {"layers": layers, "outside_layers": outside, "attention_scores": 0,
            "scan_states": c.n_layers * states * FP32, "total": layers + outside}  # fmt: skip


def _state_bytes(c: MambaConfig, batch: int, a: int) -> int:
    """conv ``(E, K - 1)`` in the dtype + SSM ``(E, N)`` in float32 per layer and sequence."""
    return batch * c.n_layers * (c.d_inner * (c.d_conv - 1) * a + c.d_inner * c.d_state * FP32)


COSTS = Costs(
    params=_params,
    flops=_flops,
    activations=lambda c, *, batch, seq_len, src_len, a, every: mamba_activation_bytes(
        c, batch=batch, seq_len=seq_len, a=a
    ),
    state_bytes=_state_bytes,
    decode_flops=lambda c, context: sum(t.flops for t in _flops(c, 1, 1, None)[0]),
    elementwise=lambda c, n, batch: {
        "selective_scan": scan_elementwise_flops(c, n, batch=batch, scan=c.scan)
    },
    # one layer's decay, input and states, float32 (B, P, E, N) each
    prefill_bytes=lambda c, batch, prompt: 3 * batch * prompt * c.d_inner * c.d_state * FP32,
    default_seq_len=lambda c: None,
    unmeasured="FlopCounterMode miscounts the depthwise convolution's backward",
)


FAMILY = register_family(
    Family(
        name="mamba",
        config=MambaConfig,
        model=MambaLM,
        kind=Kind.RECURRENT_LM,
        presets=PRESETS,
        description="Mamba: selective state-space language models",
        costs=COSTS,
        example_inputs=token_inputs,
    )
)
