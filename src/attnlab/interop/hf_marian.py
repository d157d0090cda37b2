"""Hugging Face Marian (``MarianMTModel``, ``MarianModel``) <-> the paper's encoder-decoder,
:class:`attnlab.models.EncoderDecoderTransformer`.

Marian is the paper's model: post-norm layers, sinusoidal positions, embeddings scaled by
sqrt(d_model) (``scale_embedding``), shared source/target embeddings tied to the output
projection, plus a bias on the logits (``final_logits_bias`` -> attnlab's ``output_bias``).
Decoding starts from ``decoder_start_token_id`` (attnlab's ``bos_id``, the pad token in real
Marian models).

One real difference: Marian's sinusoids are *not interleaved*. It puts sin(pos·w_i) at dimension
``i`` and cos(pos·w_i) at ``E/2 + i``; the paper (and attnlab) put them at ``2i`` and ``2i + 1``.
Instead of a second positional encoding, the key map permutes the model dimension: attnlab's
feature ``2i`` is Marian's feature ``i`` and ``2i + 1`` is ``E/2 + i``. Every tensor that reads
from or writes to the residual stream (embeddings, the input side of q/k/v/up projections and of
the output projection, the output side of out/down projections, LayerNorm weights and biases) is
permuted along that dimension. LayerNorm and attention are equivariant under such a permutation,
so logits are identical; hidden states (encoder memory, decoder states) are Marian's permuted by
:func:`feature_order`.

Not supported (an error says so): different encoder/decoder widths or head counts, layer norms
before the layers (``normalize_before``), embedding layer norms (``layernorm_embedding``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import torch
from torch import Tensor

from attnlab.interop.family import (
    HFConfig,
    HFFamily,
    UnsupportedCheckpointError,
    hf_activation,
    require,
)
from attnlab.interop.keymap import Entry, KeyMap, per_layer, unsqueezed
from attnlab.models.transformer import EncoderDecoderTransformer, TransformerConfig

NAME = "Marian"


def feature_order(d_model: int) -> Tensor:
    """``order[k]`` = the Marian feature held by attnlab feature ``k``: ``2i -> i``,
    ``2i + 1 -> E/2 + i``. Marian hidden states ``h`` are attnlab's ``h[..., order]``."""
    half = torch.arange(d_model // 2)
    return torch.stack((half, half + d_model // 2), dim=1).flatten()  # (E,)


def _permuted(ours: str, theirs: str, axes: tuple[int, ...], d_model: int) -> Entry:
    """A tensor whose ``axes`` run over the model dimension, permuted between the layouts."""
    order = feature_order(d_model)
    inverse = torch.argsort(order)

    def move(t: Tensor, index: Tensor) -> Tensor:
        for ax in axes:
            t = t.index_select(ax, index.to(t.device))
        return t

    def to_ours(ts: Sequence[Tensor]) -> list[Tensor]:
        return [move(ts[0], order)]

    def to_theirs(ts: Sequence[Tensor]) -> list[Tensor]:
        return [move(ts[0], inverse)]

    return Entry((ours,), (theirs,), to_ours, to_theirs)


def _attention(ours: str, theirs: str, E: int) -> list[Entry]:
    rows = []
    for p in ("q_proj", "k_proj", "v_proj"):
        rows.append(_permuted(f"{ours}.{p}.weight", f"{theirs}.{p}.weight", (1,), E))
        rows.append(_permuted(f"{ours}.{p}.bias", f"{theirs}.{p}.bias", (), E))
    rows.append(_permuted(f"{ours}.out_proj.weight", f"{theirs}.out_proj.weight", (0,), E))
    rows.append(_permuted(f"{ours}.out_proj.bias", f"{theirs}.out_proj.bias", (0,), E))
    return rows


def _norm(ours: str, theirs: str, E: int) -> list[Entry]:
    return [_permuted(f"{ours}.{n}", f"{theirs}.{n}", (0,), E) for n in ("weight", "bias")]


def _ffn(ours: str, theirs: str, E: int) -> list[Entry]:
    return [
        _permuted(f"{ours}.up_proj.weight", f"{theirs}.fc1.weight", (1,), E),
        _permuted(f"{ours}.up_proj.bias", f"{theirs}.fc1.bias", (), E),
        _permuted(f"{ours}.down_proj.weight", f"{theirs}.fc2.weight", (0,), E),
        _permuted(f"{ours}.down_proj.bias", f"{theirs}.fc2.bias", (0,), E),
    ]


def keymap(c: TransformerConfig) -> KeyMap:
    """The Marian key map for ``c`` (keys without the ``model.`` prefix)."""
    E = c.d_model
    enc, dec = "encoder.layers.{i}", "decoder.layers.{i}"
    encoder_layer = [
        *_attention(f"{enc}.self_attn", f"{enc}.self_attn", E),
        *_norm(f"{enc}.self_attn_norm", f"{enc}.self_attn_layer_norm", E),
        *_ffn(f"{enc}.ffn", enc, E),
        *_norm(f"{enc}.ffn_norm", f"{enc}.final_layer_norm", E),
    ]
    decoder_layer = [
        *_attention(f"{dec}.self_attn", f"{dec}.self_attn", E),
        *_norm(f"{dec}.self_attn_norm", f"{dec}.self_attn_layer_norm", E),
        *_attention(f"{dec}.cross_attn", f"{dec}.encoder_attn", E),
        *_norm(f"{dec}.cross_attn_norm", f"{dec}.encoder_attn_layer_norm", E),
        *_ffn(f"{dec}.ffn", dec, E),
        *_norm(f"{dec}.ffn_norm", f"{dec}.final_layer_norm", E),
    ]
    duplicates: dict[str, str] = {}
    if c.share_embeddings:
        entries = [_permuted("src_embed.weight", "shared.weight", (1,), E)]
        duplicates["encoder.embed_tokens.weight"] = "shared.weight"
        duplicates["decoder.embed_tokens.weight"] = "shared.weight"
        target = "shared.weight"
    else:
        entries = [
            _permuted("src_embed.weight", "encoder.embed_tokens.weight", (1,), E),
            _permuted("tgt_embed.weight", "decoder.embed_tokens.weight", (1,), E),
        ]
        target = "decoder.embed_tokens.weight"
    entries += per_layer(c.n_layers, encoder_layer)
    entries += per_layer(c.num_decoder_layers, decoder_layer)
    if c.tie_output:
        duplicates["lm_head.weight"] = target
    else:
        entries.append(_permuted("lm_head.weight", "lm_head.weight", (1,), E))
    if c.output_bias:
        entries.append(unsqueezed("lm_head.bias", "final_logits_bias"))  # (1, V) there
    # The sinusoid tables are buffers that older transformers versions saved.
    ignore = (r"(encoder|decoder)\.embed_positions\.weight",)
    return KeyMap(entries, ignore=ignore, duplicates=duplicates)


def config_from_hf(h: HFConfig, keys: Collection[str]) -> TransformerConfig:
    """An attnlab :class:`TransformerConfig` for a Hugging Face Marian config."""
    h.expect("normalize_before", {False, None})
    h.expect("normalize_embedding", {False, None})
    h.expect("add_final_layer_norm", {False, None})
    h.expect("layernorm_embedding", {False, None})
    d_model = h.get("d_model")
    for enc, dec in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        require(h.get(enc) == h.get(dec), NAME, f"{enc}={h.get(enc)} != {dec}={h.get(dec)}")
    require(d_model % 2 == 0, NAME, f"odd d_model={d_model}")
    shared = h.get("share_encoder_decoder_embeddings", default=True)
    vocab = h.get("vocab_size")
    tgt_vocab = vocab if shared else h.get("decoder_vocab_size", default=vocab)
    n_layers, n_dec = h.get("encoder_layers"), h.get("decoder_layers")
    pad = h.token_id("pad_token_id", min(vocab, tgt_vocab))
    start = h.token_id("decoder_start_token_id", tgt_vocab)
    eos = h.token_id("eos_token_id", tgt_vocab)
    if start is None or eos is None:
        raise UnsupportedCheckpointError(
            f"{NAME} decoder_start_token_id and eos_token_id must be ids in the vocabulary"
        )
    return TransformerConfig(
        vocab_size=vocab,
        tgt_vocab_size=None if shared else tgt_vocab,
        d_model=d_model,
        n_heads=h.get("encoder_attention_heads"),
        n_layers=n_layers,
        n_decoder_layers=None if n_dec == n_layers else n_dec,
        d_ff=h.get("encoder_ffn_dim"),
        dropout=h.get("dropout", default=0.1),
        attn_dropout=h.get("attention_dropout", default=0.0),
        max_seq_len=h.get("max_position_embeddings", default=512),
        norm_eps=1e-5,  # torch.nn.LayerNorm's default, which Marian uses
        norm_position="post",
        activation=h.activation("activation_function", default="gelu"),
        pos_encoding="sinusoidal",
        scale_embeddings=h.get("scale_embedding", default=False),
        share_embeddings=shared,
        tie_output=h.get("tie_word_embeddings", default=True),
        output_bias="final_logits_bias" in keys,
        pad_id=pad,
        bos_id=start,
        eos_id=eos,
    )


def config_to_hf(c: TransformerConfig) -> dict[str, Any]:
    """The ``config.json`` of the Hugging Face Marian that ``c`` is.

    Raises:
        UnsupportedCheckpointError: for options Marian does not have.
    """
    require(c.pos_encoding == "sinusoidal", NAME, f"pos_encoding {c.pos_encoding!r}")
    require(c.norm == "layernorm" and c.norm_position == "post", NAME, "post-norm LayerNorm only")
    require(not c.use_final_norm, NAME, "a final norm after the stacks")
    require(c.norm_eps == 1e-5, NAME, f"norm_eps={c.norm_eps} (Marian's LayerNorm uses 1e-5)")
    require(c.n_kv_heads in (None, c.n_heads), NAME, "grouped-query attention")
    require(c.bias, NAME, "bias=False")
    require(c.d_model % 2 == 0, NAME, f"odd d_model={c.d_model}")
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": c.vocab_size,
        "decoder_vocab_size": c.target_vocab_size,
        "d_model": c.d_model,
        "encoder_layers": c.n_layers,
        "decoder_layers": c.num_decoder_layers,
        "encoder_attention_heads": c.n_heads,
        "decoder_attention_heads": c.n_heads,
        "encoder_ffn_dim": c.d_ff,
        "decoder_ffn_dim": c.d_ff,
        "activation_function": hf_activation(c.activation, NAME),
        "dropout": c.dropout,
        "attention_dropout": c.dropout if c.attn_dropout is None else c.attn_dropout,
        "activation_dropout": 0.0,
        "max_position_embeddings": c.max_seq_len,
        "scale_embedding": c.scale_embeddings,
        "share_encoder_decoder_embeddings": c.share_embeddings,
        "tie_word_embeddings": c.tie_output,
        "pad_token_id": c.pad_id,
        "decoder_start_token_id": c.bos_id,
        "eos_token_id": c.eos_id,
        "forced_eos_token_id": None,
        "is_encoder_decoder": True,
    }


FAMILY = HFFamily(
    name=NAME,
    model_types=("marian",),
    prefix="model",
    head_keys=("lm_head.", "final_logits_bias"),
    base_architecture="MarianModel",
    model_class=EncoderDecoderTransformer,
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    keymap=keymap,
)
