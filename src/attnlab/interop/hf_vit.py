"""Hugging Face ViT (``ViTModel``, ``ViTForImageClassification``) <-> :class:`attnlab.models.ViT`.

Checkpoints on disk use the layout of transformers 4 (``encoder.layer.N.attention.attention.
query``, ``intermediate.dense``, ...), which transformers 5 still writes; transformers 5's
in-memory names (``layers.N.attention.q_proj``, ``mlp.fc1``, ...) are accepted as aliases. The
position table is stored as ``(1, 1 + P, E)`` and the [CLS] token as ``(1, 1, E)``.

Heads are read off the checkpoint's keys: ``classifier.*`` gives the classification head
(``n_classes`` from its shape), ``pooler.dense.*`` ``ViTModel``'s tanh pooler; with neither, the
model returns the [CLS] features.

Not supported (an error says so): ``qkv_bias=False``, non-tanh poolers, a pooler width other than
``hidden_size``, ``ViTForMaskedImageModeling``'s decoder.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from attnlab.interop.family import HFConfig, HFFamily, hf_activation, require
from attnlab.interop.keymap import Entry, KeyMap, params, per_layer, same, unsqueezed
from attnlab.models.vit import ViT, ViTConfig

NAME = "ViT"

_LAYER_NAMES = [
    # (attnlab module, on-disk name, transformers 5 in-memory name)
    ("self_attn.q_proj", "attention.attention.query", "attention.q_proj"),
    ("self_attn.k_proj", "attention.attention.key", "attention.k_proj"),
    ("self_attn.v_proj", "attention.attention.value", "attention.v_proj"),
    ("self_attn.out_proj", "attention.output.dense", "attention.o_proj"),
    ("ffn.up_proj", "intermediate.dense", "mlp.fc1"),
    ("ffn.down_proj", "output.dense", "mlp.fc2"),
    ("self_attn_norm", "layernorm_before", "layernorm_before"),
    ("ffn_norm", "layernorm_after", "layernorm_after"),
]
_LAYER = [
    e
    for ours, disk, memory in _LAYER_NAMES
    for e in params(
        f"layers.{{i}}.{ours}", f"encoder.layer.{{i}}.{disk}", alias=f"layers.{{i}}.{memory}"
    )
]


def keymap(c: ViTConfig) -> KeyMap:
    """The ViT key map for ``c`` (keys without the ``vit.`` prefix)."""
    entries: list[Entry] = [
        same("cls_token", "embeddings.cls_token"),
        unsqueezed("pos_encoding.weight", "embeddings.position_embeddings"),
        *params("patch_embed.proj", "embeddings.patch_embeddings.projection"),
        *per_layer(c.n_layers, _LAYER),
        *params("final_norm", "layernorm"),
    ]
    if c.pooler:
        entries += params("pooler", "pooler.dense")
    if c.n_classes:
        entries += params("head", "classifier")
    return KeyMap(entries)


def config_from_hf(h: HFConfig, keys: Collection[str]) -> ViTConfig:
    """An attnlab :class:`ViTConfig` for a Hugging Face ViT config and checkpoint keys."""
    h.expect("qkv_bias", {True, None})
    pooler = "pooler.dense.weight" in keys
    d_model = h.get("hidden_size")
    if pooler:
        h.expect("pooler_act", {"tanh", None})
        h.expect("pooler_output_size", {d_model, None})
    n_classes = 0
    if "classifier.weight" in keys:
        n_classes = len(h.get("id2label", default={})) or h.get("num_labels", default=2)
    return ViTConfig(
        image_size=h.get("image_size"),
        patch_size=h.get("patch_size"),
        in_channels=h.get("num_channels", default=3),
        n_classes=n_classes,
        d_model=d_model,
        n_heads=h.get("num_attention_heads"),
        n_layers=h.get("num_hidden_layers"),
        d_ff=h.get("intermediate_size"),
        dropout=h.get("hidden_dropout_prob", default=0.0),
        attn_dropout=h.get("attention_probs_dropout_prob", default=0.0),
        norm_eps=h.get("layer_norm_eps", default=1e-12),
        activation=h.activation("hidden_act", default="gelu"),
        pooler=pooler,
        init_std=h.get("initializer_range", default=0.02),
    )


def config_to_hf(c: ViTConfig) -> dict[str, Any]:
    """The ``config.json`` of the Hugging Face ViT that ``c`` is.

    Raises:
        UnsupportedCheckpointError: for options ViT does not have.
    """
    require(c.pos_encoding == "learned", NAME, f"pos_encoding {c.pos_encoding!r} (learned only)")
    require(c.norm == "layernorm" and c.norm_position == "pre", NAME, "pre-norm LayerNorm only")
    require(c.pool == "cls", NAME, "pool='mean' (the [CLS] token only)")
    require(not (c.pooler and c.n_classes), NAME, "a pooler before the classification head")
    require(c.n_kv_heads in (None, c.n_heads), NAME, "grouped-query attention")
    require(c.bias, NAME, "bias=False")
    out: dict[str, Any] = {
        "architectures": ["ViTForImageClassification" if c.n_classes else "ViTModel"],
        "model_type": "vit",
        "image_size": c.image_size,
        "patch_size": c.patch_size,
        "num_channels": c.in_channels,
        "hidden_size": c.d_model,
        "num_attention_heads": c.n_heads,
        "num_hidden_layers": c.n_layers,
        "intermediate_size": c.d_ff,
        "hidden_act": hf_activation(c.activation, NAME),
        "hidden_dropout_prob": c.dropout,
        "attention_probs_dropout_prob": c.dropout if c.attn_dropout is None else c.attn_dropout,
        "layer_norm_eps": c.norm_eps,
        "initializer_range": c.init_std,
        "qkv_bias": True,
    }
    if c.n_classes:
        out["id2label"] = {str(i): f"LABEL_{i}" for i in range(c.n_classes)}
        out["label2id"] = {f"LABEL_{i}": i for i in range(c.n_classes)}
    if c.pooler:
        out["pooler_act"] = "tanh"
        out["pooler_output_size"] = c.d_model
    return out


FAMILY = HFFamily(
    name=NAME,
    model_types=("vit",),
    prefix="vit",
    head_keys=("classifier.",),
    base_architecture="ViTModel",
    model_class=ViT,
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    keymap=keymap,
)
