"""Hugging Face BERT (``BertModel``, ``BertForMaskedLM``, ``BertForPreTraining``,
``BertForNextSentencePrediction``) <-> :class:`attnlab.models.BERT`.

Same architecture, other names: the post-norm encoder layer's ``attention.self.{query,key,
value}``, ``attention.output.{dense,LayerNorm}``, ``intermediate.dense`` and
``output.{dense,LayerNorm}`` are attnlab's ``self_attn.{q,k,v,out}_proj``, ``self_attn_norm``,
``ffn.{up,down}_proj`` and ``ffn_norm``; the first BERT checkpoints' LayerNorm ``gamma``/``beta``
names are accepted as aliases. Heads are read off the checkpoint's keys: ``pooler.*`` gives the
pooler, ``cls.predictions.*`` the masked-LM head (its decoder tied to the word embeddings unless
``tie_word_embeddings`` is false), ``cls.seq_relationship.*`` the next-sentence head (attnlab's
``nsp``); a checkpoint without one of them (MiniLM, ``BertModel``) loads without that head.

Not supported (an error says so): relative position embeddings, decoder/cross-attention
configurations.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from attnlab.interop.family import HFConfig, HFFamily, hf_activation, require
from attnlab.interop.keymap import Entry, KeyMap, params, per_layer, same
from attnlab.models.bert import BERT, BERTConfig

NAME = "BERT"


def _norm(ours: str, theirs: str) -> list[Entry]:
    """A LayerNorm; the first BERT checkpoints (TensorFlow ports) named it gamma/beta."""
    return [
        same(f"{ours}.weight", f"{theirs}.weight", f"{theirs}.gamma"),
        same(f"{ours}.bias", f"{theirs}.bias", f"{theirs}.beta"),
    ]


_LAYER = [
    *params("layers.{i}.self_attn.q_proj", "encoder.layer.{i}.attention.self.query"),
    *params("layers.{i}.self_attn.k_proj", "encoder.layer.{i}.attention.self.key"),
    *params("layers.{i}.self_attn.v_proj", "encoder.layer.{i}.attention.self.value"),
    *params("layers.{i}.self_attn.out_proj", "encoder.layer.{i}.attention.output.dense"),
    *_norm("layers.{i}.self_attn_norm", "encoder.layer.{i}.attention.output.LayerNorm"),
    *params("layers.{i}.ffn.up_proj", "encoder.layer.{i}.intermediate.dense"),
    *params("layers.{i}.ffn.down_proj", "encoder.layer.{i}.output.dense"),
    *_norm("layers.{i}.ffn_norm", "encoder.layer.{i}.output.LayerNorm"),
]


def keymap(c: BERTConfig) -> KeyMap:
    """The BERT key map for ``c`` (keys without the ``bert.`` prefix)."""
    entries: list[Entry] = [
        same("tok_embed.weight", "embeddings.word_embeddings.weight"),
        same("segment_embed.weight", "embeddings.token_type_embeddings.weight"),
        same("pos_encoding.weight", "embeddings.position_embeddings.weight"),
        *_norm("embed_norm", "embeddings.LayerNorm"),
        *per_layer(c.n_layers, _LAYER),
    ]
    if c.pooler:
        entries += params("pooler", "pooler.dense")
    duplicates = {}
    if c.mlm_head:
        entries += [
            *params("mlm.dense", "cls.predictions.transform.dense"),
            *_norm("mlm.norm", "cls.predictions.transform.LayerNorm"),
            same("mlm.bias", "cls.predictions.bias", "cls.predictions.decoder.bias"),
        ]
        duplicates["cls.predictions.decoder.bias"] = "cls.predictions.bias"
        if c.tie_output:
            duplicates["cls.predictions.decoder.weight"] = "embeddings.word_embeddings.weight"
        else:
            entries.append(same("mlm.decoder.weight", "cls.predictions.decoder.weight"))
    if c.nsp_head:
        entries += params("nsp", "cls.seq_relationship")
    return KeyMap(entries, ignore=(r"embeddings\.position_ids",), duplicates=duplicates)


def config_from_hf(h: HFConfig, keys: Collection[str]) -> BERTConfig:
    """An attnlab :class:`BERTConfig` for a Hugging Face BERT config and checkpoint keys."""
    h.expect("position_embedding_type", {"absolute", None})
    h.expect("is_decoder", {False, None})
    h.expect("add_cross_attention", {False, None})
    vocab = h.get("vocab_size")
    defaults = BERTConfig()

    def special(token: str, default: int) -> int:
        tok = h.tokens.get(token)
        if tok is not None and 0 <= tok < vocab:
            return tok
        return default if default < vocab else 0

    return BERTConfig(
        vocab_size=vocab,
        type_vocab_size=h.get("type_vocab_size", default=2),
        d_model=h.get("hidden_size"),
        n_heads=h.get("num_attention_heads"),
        n_layers=h.get("num_hidden_layers"),
        d_ff=h.get("intermediate_size"),
        dropout=h.get("hidden_dropout_prob", default=0.1),
        attn_dropout=h.get("attention_probs_dropout_prob", default=0.1),
        max_seq_len=h.get("max_position_embeddings"),
        norm_eps=h.get("layer_norm_eps", default=1e-12),
        activation=h.activation("hidden_act", default="gelu"),
        pooler="pooler.dense.weight" in keys,
        mlm_head=any(k.startswith("cls.predictions.") for k in keys),
        nsp_head="cls.seq_relationship.weight" in keys and "pooler.dense.weight" in keys,
        tie_output=h.get("tie_word_embeddings", default=True),
        init_std=h.get("initializer_range", default=0.02),
        pad_id=h.token_id("pad_token_id", vocab),
        cls_id=special("[CLS]", defaults.cls_id),
        sep_id=special("[SEP]", defaults.sep_id),
        mask_id=special("[MASK]", defaults.mask_id),
    )


def config_to_hf(c: BERTConfig) -> dict[str, Any]:
    """The ``config.json`` of the Hugging Face BERT that ``c`` is.

    Raises:
        UnsupportedCheckpointError: for options BERT does not have (pre-norm, RoPE, GQA, ...).
    """
    require(c.norm == "layernorm" and c.norm_position == "post", NAME, "post-norm LayerNorm only")
    require(c.pos_encoding == "learned", NAME, f"pos_encoding {c.pos_encoding!r} (learned only)")
    require(c.n_kv_heads in (None, c.n_heads), NAME, "grouped-query attention")
    require(c.bias, NAME, "bias=False")
    return {
        "architectures": [_architecture(c)],
        "model_type": "bert",
        "vocab_size": c.vocab_size,
        "type_vocab_size": c.type_vocab_size,
        "hidden_size": c.d_model,
        "num_attention_heads": c.n_heads,
        "num_hidden_layers": c.n_layers,
        "intermediate_size": c.d_ff,
        "hidden_act": hf_activation(c.activation, NAME),
        "hidden_dropout_prob": c.dropout,
        "attention_probs_dropout_prob": c.dropout if c.attn_dropout is None else c.attn_dropout,
        "max_position_embeddings": c.max_seq_len,
        "layer_norm_eps": c.norm_eps,
        "initializer_range": c.init_std,
        "pad_token_id": c.pad_id,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": c.tie_output,
    }


def _architecture(c: BERTConfig) -> str:
    """The Hugging Face class with exactly ``c``'s heads."""
    if c.nsp_head:
        return "BertForPreTraining" if c.mlm_head else "BertForNextSentencePrediction"
    return "BertForMaskedLM" if c.mlm_head else "BertModel"


FAMILY = HFFamily(
    name=NAME,
    model_types=("bert",),
    prefix="bert",
    head_keys=("cls.",),
    base_architecture="BertModel",
    model_class=BERT,
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    keymap=keymap,
)
