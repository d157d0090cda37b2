"""Decoder-only language models: GPT-2/GPT-3 and the Llama family (lesson §9).

One stack serves both: token embedding, a positional encoding (learned, RoPE, ALiBi, sinusoidal or
none), optionally a norm on the embeddings (BLOOM's ``embed_norm``), N decoder layers *without*
cross-attention (causal self-attention + FFN), a final norm and an LM head, tied to the token
embedding by default. ``GPTConfig`` chooses the parts; the Llama presets are the same module with
RoPE, RMSNorm, SwiGLU, no biases and an untied head.

Shapes: B batch, T new tokens, S keys (cached + new), E d_model, V vocabulary, H heads.
Masks: ``mask`` is a per-token key mask ``(B, S)``, True/1 = real token (Hugging Face's
``attention_mask``); inside, attention masks are bool True = may attend, broadcastable to
(B, H, T, S), and ALiBi biases are folded in as an additive mask.

Later techniques (issue 51, from the modded-nanogpt speedrun, Keller Jordan et al. 2024, and the
papers it drew on), each a field that is off by default (the presets do not change):

- ``qk_norm`` (on every stack, :class:`~attnlab.models.common.StackConfig`): RMSNorm over the
  head dimension of q and k, before RoPE (Dehghani et al. 2023; Wortsman et al. 2023).
- ``activation="relu2"``: Primer's squared ReLU (So et al. 2021), an activation like the others.
- ``logit_softcap``: the head's logits become ``cap·tanh(logits/cap)`` (Gemma 2); the head is a
  :class:`~attnlab.layers.softcap.SoftCappedLinear`, so ``model.lm_head(h)`` is capped for
  every caller, and its parameter is still ``lm_head.weight`` (tying, checkpoints).
- ``zero_init_proj``: every residual-branch output projection (``out_proj``, ``down_proj``)
  starts at zero, so each layer starts as the identity (as ReZero, Bachlechner et al. 2020, and
  the speedrun).
- ``value_embeddings = N``: N extra token-embedding tables of the values' width (H_kv·D). Table
  ``j`` serves layer ``j`` and layer ``n_layers - N + j`` (the speedrun's layout: the first N
  and the last N layers share the tables, in order; so ``2·N <= n_layers``). Those layers mix the
  row of each token into its attention values, ``v = a·v + b·ve(token)``, with two learned
  scalars per layer (``self_attn.value_lambdas``, initially 0.5 and 0.5), before the KV cache.
- ``x0_skip``: every layer's input becomes ``a_i·x + b_i·x0``, where ``x`` is the previous
  layer's output and ``x0`` the first layer's input (the embedding, after ``embed_norm`` when
  that is on: the speedrun normalises it); ``x0_lambdas`` holds the ``(a_i, b_i)`` of each
  layer, initially ``(1, 0)``, so the model starts as without the skip.

Deviations from the speedrun: QK-norm's RMSNorm has a learned weight (Qwen3's form; 1 at init),
and layers without a value embedding keep their values unscaled (the speedrun scales them by
their ``a``). Deviations from the references otherwise: none in the architecture; see
``reset_parameters`` for init.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal, cast

import torch
from torch import Tensor, nn

from attnlab.config import check_positive
from attnlab.layers.embedding import TokenEmbedding, tie_weights
from attnlab.layers.kv_cache import KVCache
from attnlab.layers.masks import as_attention_mask, combine_masks
from attnlab.layers.norm import build_norm
from attnlab.layers.positional import (
    RotaryEmbedding,
    build_positional_encoding,
)
from attnlab.layers.softcap import SoftCappedLinear
from attnlab.models.base import GenerationMixin, PretrainedModel
from attnlab.models.common import (
    StackConfig,
    check_token_ids,
    decoder_layer,
    final_norm,
    layer_window,
    token_inputs,
    token_loss,
)
from attnlab.models.costs import (
    FP32,
    INDEX_BYTES,
    Costs,
    KVShape,
    MatmulTerm,
    ParamBreakdown,
    activation_result,
    attention_terms,
    ffn_stack_terms,
    norm_elems,
    norm_params,
    stack_activations,
    stack_params,
    stack_terms,
)
from attnlab.models.family import (
    DecoderStack,
    ExplorerSpec,
    Family,
    HookLayout,
    HookStack,
    Kind,
    Readout,
    register_family,
)


@dataclass(frozen=True, kw_only=True)
class GPTConfig(StackConfig):
    """Hyper-parameters of a decoder-only LM (defaults: GPT-2 small, 124M)."""

    model_type: ClassVar[str] = "gpt"

    vocab_size: int = 50257
    d_model: int = 768
    n_heads: int = 12
    n_layers: int = 12
    d_ff: int = 3072
    max_seq_len: int = 1024  # the learned position table / trained context
    norm_position: Literal["pre", "post"] = "pre"
    embed_norm: bool = False  # a norm on the summed embeddings (BLOOM)
    activation: str = "gelu_tanh"  # GPT-2's "gelu_new"
    pos_encoding: str = "learned"
    rope_base: float = 10000.0
    rope_scaling: Literal["none", "linear", "ntk", "dynamic"] = "none"
    rope_factor: float = 1.0
    tie_output: bool = True  # LM head shares the token embedding
    init_std: float = 0.02
    ignore_index: int = -100  # target id skipped by the loss
    pad_id: int | None = None
    bos_id: int | None = None
    eos_id: int | None = 50256
    # -- the speedrun's techniques (module doc); every one off by default ----------------------
    logit_softcap: float | None = None  # logits = cap·tanh(logits/cap) in the head (Gemma 2)
    zero_init_proj: bool = False  # out_proj and down_proj weights start at zero
    value_embeddings: int = 0  # N tables; table j feeds layers j and n_layers - N + j
    x0_skip: bool = False  # layer i's input is a_i·x + b_i·x0 (x0: the embedding output)

    def validate(self) -> None:
        super().validate()
        check_token_ids(self, ("pad_id", "bos_id", "eos_id"), self.vocab_size)
        check_positive(logit_softcap=self.logit_softcap)
        if self.logit_softcap is not None and not math.isfinite(self.logit_softcap):
            raise ValueError(f"logit_softcap must be a finite number, got {self.logit_softcap}")
        if not 0 <= 2 * self.value_embeddings <= self.n_layers:
            raise ValueError(
                f"value_embeddings={self.value_embeddings} must be in [0, n_layers / 2 = "
                f"{self.n_layers // 2}]: table j serves layers j and n_layers - N + j"
            )

    @property
    def value_embedding_layers(self) -> dict[int, int]:
        """``{layer: table}`` of the layers that mix in a value embedding (module doc)."""
        n, L = self.value_embeddings, self.n_layers
        return {**{j: j for j in range(n)}, **{L - n + j: j for j in range(n)}}


class GPT(GenerationMixin, PretrainedModel):
    """Decoder-only Transformer LM: ``forward(ids) -> (logits, loss)``.

    For generation, create a cache with :meth:`new_cache` and call ``forward`` with it: the first
    call (the prompt) fills it, later calls pass only the new tokens.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        c = self.config = config
        self.tok_embed = TokenEmbedding(c.vocab_size, c.d_model, scale=False)
        self.pos_encoding = build_positional_encoding(
            c.pos_encoding,
            d_model=c.d_model,
            n_heads=c.n_heads,
            max_seq_len=c.max_seq_len,
            rope_base=c.rope_base,
            rope_scaling=c.rope_scaling,
            rope_factor=c.rope_factor,
        )
        rotary = self.pos_encoding if isinstance(self.pos_encoding, RotaryEmbedding) else None
        self.embed_norm = (
            build_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias) if c.embed_norm else None
        )
        self.dropout = nn.Dropout(c.dropout)
        value_layers = c.value_embedding_layers
        self.layers = nn.ModuleList(
            decoder_layer(c, i, rotary, cross_attention=False, value_embed=i in value_layers)
            for i in range(c.n_layers)
        )
        self.final_norm = final_norm(c)
        self.lm_head = (
            nn.Linear(c.d_model, c.vocab_size, bias=False)
            if c.logit_softcap is None
            else SoftCappedLinear(c.d_model, c.vocab_size, softcap=c.logit_softcap)
        )
        kv_width = (c.n_kv_heads or c.n_heads) * c.d_head
        self.value_embeds = (
            nn.ModuleList(
                TokenEmbedding(c.vocab_size, kv_width, scale=False)
                for _ in range(c.value_embeddings)
            )
            if c.value_embeddings
            else None
        )
        self.x0_lambdas: nn.Parameter | None = None
        if c.x0_skip:  # (n_layers, 2): (a_i, b_i); scalars, so no weight decay and no Muon
            self.x0_lambdas = nn.Parameter(torch.empty(c.n_layers, 2))
            self.x0_lambdas._no_weight_decay = True  # type: ignore[attr-defined]
        self.reset_parameters()
        if c.tie_output:
            tie_weights(self.lm_head, self.tok_embed)

    def reset_parameters(self) -> None:
        """GPT-2 init: N(0, init_std) for linears and embeddings, zero biases, and the residual
        projections (``out_proj``, ``down_proj``) scaled by 1/sqrt(2·n_layers), or zero with
        ``zero_init_proj`` (drawn first, so every other tensor is the same as without it).
        Value-embedding tables: N(0, init_std); the mixing scalars: value ``(0.5, 0.5)``,
        x0 skip ``(1, 0)``."""
        c = self.config
        std = c.init_std
        resid_std = std / math.sqrt(2 * c.n_layers)
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear):
                residual = name.rsplit(".", 1)[-1] in ("out_proj", "down_proj")
                nn.init.normal_(m.weight, std=resid_std if residual else std)
                if residual and c.zero_init_proj:
                    nn.init.zeros_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            value_lambdas = getattr(m, "value_lambdas", None)
            if isinstance(value_lambdas, nn.Parameter):
                with torch.no_grad():
                    value_lambdas.fill_(0.5)
        nn.init.normal_(self.tok_embed.weight, std=std)
        for table in self.value_embeds or ():
            nn.init.normal_(cast(TokenEmbedding, table).weight, std=std)
        if self.x0_lambdas is not None:
            with torch.no_grad():
                self.x0_lambdas.copy_(torch.tensor([1.0, 0.0]).expand(c.n_layers, 2))

    def _positions(self, T: int, offset: int, device: torch.device) -> Tensor:
        if offset + T > self.config.max_seq_len and self.config.pos_encoding == "learned":
            raise ValueError(
                f"sequence of {offset + T} tokens exceeds max_seq_len={self.config.max_seq_len} "
                "(the learned position table)"
            )
        return torch.arange(offset, offset + T, device=device)  # (T,)

    def embed(self, ids: Tensor, positions: Tensor) -> Tensor:
        """The first layer's input: token embeddings with the position term (and BLOOM's
        embedding norm), then dropout. ids ``(B, T)``, positions ``(T,)`` or ``(B, T)`` ->
        ``(B, T, E)``."""
        x = self.pos_encoding.embed(self.tok_embed(ids), positions)  # (B, T, E)
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        return self.dropout(x)

    def hidden_states(
        self,
        ids: Tensor,
        *,
        mask: Tensor | None = None,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """The final (normalised) hidden states ``(B, T, E)``; arguments as :meth:`forward`."""
        if ids.dim() != 2:
            raise ValueError(f"ids must be (B, T) token ids, got shape {tuple(ids.shape)}")
        B, T = ids.shape
        offset = cache.seq_len if cache is not None else 0
        if mask is not None and mask.shape != (B, offset + T):
            raise ValueError(
                f"mask must be (B, cached + T) = ({B}, {offset + T}), got {tuple(mask.shape)}"
            )
        index = self._positions(T, offset, ids.device)  # (T,)
        pos = index if positions is None else positions  # (T,) | (B, T)
        x = x0 = self.embed(ids, pos)  # (B, T, E)
        values = self.value_embeddings(ids)  # {layer: (B, T, H_kv·D)}
        # ALiBi depends on distances only, so token indices serve (also for shifted positions).
        # A sliding-window cache returns only its window of keys: masks follow its key positions.
        masks: dict[int, Tensor | None] = {}
        for i, layer in enumerate(self.layers):
            layer_cache = cache.layer(i)[0] if cache is not None else None
            start = layer_cache.key_start if layer_cache is not None else 0
            if start not in masks:
                k_index = (  # (S,)
                    layer_cache.key_positions(T, x.device)
                    if layer_cache is not None
                    else torch.arange(T, device=x.device)
                )
                masks[start] = combine_masks(
                    as_attention_mask(mask[:, start:]) if mask is not None else None,
                    self.pos_encoding.score_bias(index, k_index),  # (H, T, S) or None
                )
            if self.x0_lambdas is not None:  # the x0 skip: a_i·x + b_i·x0
                x = self.x0_lambdas[i, 0] * x + self.x0_lambdas[i, 1] * x0
            x = layer(x, mask=masks[start], is_causal=True, positions=pos, cache=layer_cache,
                      value_embed=values.get(i))  # fmt: skip
        return self.final_norm(x) if self.final_norm is not None else x

    def value_embeddings(self, ids: Tensor) -> dict[int, Tensor]:
        """``{layer: (B, T, H_kv·D)}``: each value-embedding layer's rows for ``ids`` ``(B, T)``
        (empty without value embeddings; a table serving two layers is looked up once)."""
        if self.value_embeds is None:
            return {}
        rows = [table(ids) for table in self.value_embeds]  # (B, T, H_kv·D) each
        return {i: rows[j] for i, j in self.config.value_embedding_layers.items()}

    def forward(
        self,
        ids: Tensor,
        *,
        targets: Tensor | None = None,
        mask: Tensor | None = None,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Next-token logits (and the loss).

        Args:
            ids: token ids ``(B, T)``; with a ``cache``, only the tokens not yet cached.
            targets: ``(B, T)`` the token to predict at each position (``ids`` shifted left by
                one); ``config.ignore_index`` entries are skipped.
            mask: ``(B, S)`` key mask over cached + new tokens, True/1 = real token (padding).
            positions: ``(T,)`` or ``(B, T)`` absolute positions of the new tokens (e.g. shifted
                for left-padded prompts); default continues after the cache.
            cache: a :class:`KVCache` from :meth:`new_cache`, extended in place.

        Returns:
            ``(logits (B, T, V), loss or None)``; the loss is the mean token cross-entropy.

        Raises:
            ValueError: for ids outside the vocabulary, sequences longer than the learned
                position table, or a mask of the wrong shape.
        """
        h = self.hidden_states(ids, mask=mask, positions=positions, cache=cache)
        logits = self.lm_head(h)  # (B, T, V)
        loss = None
        if targets is not None:
            loss = token_loss(logits, targets, ids, ignore_index=self.config.ignore_index)
        return logits, loss

    def new_cache(self, max_len: int | None = None, *, rollback: int = 0) -> KVCache:
        """An empty :class:`KVCache` for up to ``max_len`` tokens (default ``max_seq_len``);
        sliding-window layers keep only their window (and ``rollback`` keys more, so the cache
        can be truncated by that many positions: speculative decoding)."""
        c = self.config
        windows = [layer_window(c, i) for i in range(c.n_layers)]
        return KVCache(c.n_layers, max_len or c.max_seq_len, windows=windows, rollback=rollback)


def _gpt2(d_model: int, n_layers: int, n_heads: int, max_seq_len: int = 1024) -> GPTConfig:
    return GPTConfig(
        d_model=d_model,
        n_layers=n_layers,
        n_heads=n_heads,
        d_ff=4 * d_model,
        max_seq_len=max_seq_len,
    )


PRESETS: dict[str, GPTConfig] = {
    # GPT-2 (Radford et al. 2019), the four released sizes; vocab 50257, context 1024.
    "gpt2-small": _gpt2(768, 12, 12),
    "gpt2-medium": _gpt2(1024, 24, 16),
    "gpt2-large": _gpt2(1280, 36, 20),
    "gpt2-xl": _gpt2(1600, 48, 25),
    # GPT-3 175B (Brown et al. 2020, Table 2.1) in GPT-2's dense architecture (no sparse layers).
    "gpt3-175b": _gpt2(12288, 96, 96, max_seq_len=2048),
    # Llama 2 7B (Touvron et al. 2023): RoPE, RMSNorm, SwiGLU, no biases, untied head.
    "llama2-7b": GPTConfig(
        vocab_size=32000,
        d_model=4096,
        n_heads=32,
        n_layers=32,
        d_ff=11008,
        dropout=0.0,
        max_seq_len=4096,
        norm="rmsnorm",
        norm_eps=1e-5,
        activation="swiglu",
        pos_encoding="rope",
        bias=False,
        tie_output=False,
        pad_id=None,
        bos_id=1,
        eos_id=2,
    ),
    # Mixtral 8x7B (Jiang et al. 2024; HF mistralai/Mixtral-8x7B-v0.1 config.json): a Llama-
    # style GQA decoder whose every FFN is 8 SwiGLU experts, top-2 (46.7B total, 12.9B active).
    "mixtral-8x7b": GPTConfig(
        vocab_size=32000,
        d_model=4096,
        n_heads=32,
        n_kv_heads=8,
        n_layers=32,
        d_ff=14336,
        dropout=0.0,
        max_seq_len=32768,
        norm="rmsnorm",
        norm_eps=1e-5,
        activation="swiglu",
        pos_encoding="rope",
        rope_base=1e6,
        bias=False,
        tie_output=False,
        bos_id=1,
        eos_id=2,
        n_experts=8,
        top_k=2,
        aux_loss_weight=0.02,  # router_aux_loss_coef of its config.json
    ),
    # A tiny Mixtral-shaped MoE for tests and CPU examples: 4 experts, top-2, GQA.
    "gpt-moe-tiny": GPTConfig(
        vocab_size=256,
        d_model=64,
        n_heads=4,
        n_kv_heads=2,
        n_layers=2,
        d_ff=128,
        dropout=0.0,
        max_seq_len=64,
        norm="rmsnorm",
        activation="swiglu",
        pos_encoding="rope",
        bias=False,
        tie_output=False,
        eos_id=None,
        n_experts=4,
        top_k=2,
    ),
    # A character-level model for CPU examples (Karpathy's "baby GPT" shape).
    "gpt-char-baby": GPTConfig(
        vocab_size=256,
        d_model=128,
        n_heads=4,
        n_layers=4,
        d_ff=512,
        dropout=0.1,
        max_seq_len=64,
        eos_id=None,
    ),
}


# -- the family's declaration (attnlab.models.family) -----------------------------------------


def _params(c: GPTConfig) -> ParamBreakdown:
    comp = {"embedding.token": c.vocab_size * c.d_model}
    if c.value_embeddings:  # the tables, and two mixing scalars per layer that reads them
        kv_width = (c.n_kv_heads or c.n_heads) * c.d_head
        comp["embedding.value"] = c.value_embeddings * c.vocab_size * kv_width
        comp["layers.value_lambdas"] = 2 * len(c.value_embedding_layers)
    if c.x0_skip:
        comp["x0_lambdas"] = 2 * c.n_layers
    if c.pos_encoding == "learned":
        comp["embedding.position"] = c.max_seq_len * c.d_model
    if c.embed_norm:  # BLOOM's norm on the embeddings
        comp["embedding.norm"] = norm_params(c.d_model, c.norm, c.bias)
    comp.update(stack_params("layers", c, c.n_layers))
    if c.use_final_norm:
        comp["final_norm"] = norm_params(c.d_model, c.norm, c.bias)
    comp["lm_head"] = 0 if c.tie_output else c.vocab_size * c.d_model
    tied = {"lm_head": "embedding.token"} if c.tie_output else {}
    return ParamBreakdown(comp, {"layers": c.n_layers}, tied)


def _flops(c: GPTConfig, B: int, n: int, src: int | None) -> tuple[list[MatmulTerm], int]:
    terms, softmax = stack_terms("layers", c, batch=B, n=n, n_layers=c.n_layers)
    terms.append(MatmulTerm("lm_head", B * n, c.d_model, c.vocab_size))
    return terms, softmax


def _activations(
    c: GPTConfig, *, batch: int, seq_len: int, src_len: int | None, a: int, every: int
) -> dict[str, int]:
    B, T, t = batch, seq_len, batch * seq_len
    act, fp32, scores = stack_activations(c, B=B, T=T, n_layers=c.n_layers, masked=True,
                                          every=every)  # fmt: skip
    outside = 2 * t * INDEX_BYTES  # ids, targets
    if c.embed_norm:
        outside += (t * c.d_model + norm_elems(c, t)) * a
    final = (t * c.d_model + norm_elems(c, t)) if c.use_final_norm else 0
    outside += (final + t * c.d_model) * a + t * c.vocab_size * FP32  # head in, log-softmax
    return activation_result(act, fp32, scores, outside, a)


def _decode_flops(c: GPTConfig, context: int) -> int:
    """Matmul FLOPs of one token after ``context`` cached ones: its projections and FFN, and
    attention over ``context + 1`` keys."""
    attn, _ = attention_terms(
        "layers.self_attn", batch=1, q_len=1, kv_len=context + 1, d_model=c.d_model,
        n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, count=c.n_layers, kv_input_len=1,
    )  # fmt: skip
    ffn = ffn_stack_terms("layers.ffn", c, tokens=1, n_layers=c.n_layers)
    head = MatmulTerm("lm_head", 1, c.d_model, c.vocab_size)
    return sum(t.flops for t in [*attn, *ffn, head])


COSTS = Costs(
    params=_params,
    flops=_flops,
    activations=_activations,
    kv_cache=lambda c: KVShape(c.n_layers, (c.n_kv_heads or c.n_heads) * c.d_head),
    decode_flops=_decode_flops,
)


def _hook_layout(model: GPT) -> HookLayout:
    stack = HookStack(
        "", (("embed.token", model.tok_embed),), model.pos_encoding, model.layers, model.final_norm
    )
    # a soft-capped head is no linear map (direct logit attribution refuses it)
    readout = Readout("", model.layers, model.final_norm, model.lm_head,
                      linear=model.config.logit_softcap is None)  # fmt: skip
    return HookLayout((stack,), head=model.lm_head, readout=readout)


def _decoder_stack(model: GPT) -> DecoderStack:
    c = model.config
    modules: list[nn.Module] = [model.tok_embed, model.pos_encoding, model.dropout]
    if model.embed_norm is not None:
        modules.append(model.embed_norm)
    return DecoderStack(
        embed=model.embed,
        token_embedding=model.tok_embed if model.embed_norm is None else None,
        positions=model.pos_encoding,
        embed_modules=tuple(modules),
        layers=model.layers,
        final_norm=model.final_norm,
        head=model.lm_head,
        max_positions=c.max_seq_len if c.pos_encoding == "learned" else None,
        eager_only=_eager_only(c),
    )


def _eager_only(c: GPTConfig) -> str | None:
    """Why a decode engine cannot run the layers from outside: per-layer inputs the stack's
    parts do not describe (value embeddings, the x0 skip); ``None`` when it can."""
    options = [f"value_embeddings={c.value_embeddings}"] if c.value_embeddings else []
    options += ["x0_skip=True"] if c.x0_skip else []
    if not options:
        return None
    return f"{' and '.join(options)} feed every layer inputs that only the model's forward computes"


FAMILY = register_family(
    Family(
        name="gpt",
        config=GPTConfig,
        model=GPT,
        kind=Kind.CAUSAL_LM,
        presets=PRESETS,
        description="decoder-only language models: GPT-2/GPT-3, Llama, Mixtral-style MoE",
        hooks=_hook_layout,
        costs=COSTS,
        decode_stack=_decoder_stack,
        example_inputs=token_inputs,
        explorer=ExplorerSpec(),
    )
)
