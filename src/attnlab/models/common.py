"""What every model config shares: validation of the common fields and the per-layer arguments.

Each model file owns its config dataclass; the fields they have in common (``d_model, n_heads,
n_kv_heads, n_layers, d_ff, dropout, attn_dropout, norm, norm_eps, norm_position, activation,
attn_backend, attn_window, attn_layer_backends, bias``...) are validated here once, and
:func:`layer_kwargs` turns them into the keyword arguments of ``EncoderLayer``/``DecoderLayer``
(including the attention backend of each layer, with its window).
"""

from __future__ import annotations

from typing import Any

from attnlab.config import check_choice, check_positive, check_probability
from attnlab.layers.attention_backends import (
    ATTENTION_BACKEND_FACTORIES,
    ATTENTION_BACKENDS,
    AttentionBackend,
    get_attention_backend,
)
from attnlab.layers.feedforward import activation_names
from attnlab.layers.norm import NORMS
from attnlab.layers.positional import POSITIONAL_ENCODINGS

_OPTIONAL_POSITIVE = ("max_seq_len", "rope_base", "init_std", "vocab_size")

# Field types, checked first: a config from JSON may carry "64" or 2.5 where an int belongs.
_INT_FIELDS = (
    "vocab_size", "tgt_vocab_size", "type_vocab_size", "d_model", "n_heads", "n_kv_heads",
    "n_layers", "n_decoder_layers", "d_ff", "max_seq_len", "attn_window", "image_size",
    "patch_size", "in_channels", "n_classes", "ignore_index", "pad_id", "bos_id", "eos_id",
    "cls_id", "sep_id", "mask_id",
)  # fmt: skip
_FLOAT_FIELDS = ("dropout", "attn_dropout", "norm_eps", "rope_base", "rope_factor", "init_std")
_BOOL_FIELDS = (
    "bias", "tie_output", "final_norm", "embed_norm", "pooler", "mlm_head", "scale_embeddings",
    "share_embeddings", "output_bias",
)  # fmt: skip


def check_field_types(c: Any) -> None:
    """Raise ``TypeError`` for a field of the wrong type (``None`` is skipped).

    Integers must be ``int`` (not ``bool``, not ``2.0``), floats ``int`` or ``float``, flags
    ``bool`` (a JSON ``"false"`` string would otherwise be true).
    """
    for names, ok, what in (
        (_INT_FIELDS, lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
        (
            _FLOAT_FIELDS,
            lambda v: isinstance(v, int | float) and not isinstance(v, bool),
            "a number",
        ),
        (_BOOL_FIELDS, lambda v: isinstance(v, bool), "true or false"),
    ):
        for name in names:
            value = getattr(c, name, None)
            if value is not None and not ok(value):
                raise TypeError(f"{name} must be {what}, got {value!r}")


def validate_stack_config(c: Any) -> None:
    """Validate the fields shared by model configs (those a config lacks are skipped).

    Raises:
        TypeError: for a field of the wrong type (see :func:`check_field_types`).
        ValueError: naming the bad value and, for closed choices, the valid ones.
    """
    check_field_types(c)
    check_positive(
        d_model=c.d_model,
        n_heads=c.n_heads,
        n_kv_heads=c.n_kv_heads,
        n_layers=c.n_layers,
        d_ff=c.d_ff,
        norm_eps=c.norm_eps,
        **{name: getattr(c, name) for name in _OPTIONAL_POSITIVE if hasattr(c, name)},
    )
    if c.d_model % c.n_heads != 0:
        raise ValueError(f"n_heads={c.n_heads} does not divide d_model={c.d_model}")
    if c.n_kv_heads is not None and c.n_heads % c.n_kv_heads != 0:
        raise ValueError(f"n_heads={c.n_heads} is not a multiple of n_kv_heads={c.n_kv_heads}")
    check_probability(dropout=c.dropout, attn_dropout=c.attn_dropout)
    check_choice("norm", c.norm, NORMS.keys())
    check_choice("norm_position", c.norm_position, ["pre", "post"])
    check_choice("activation", c.activation, activation_names())
    if hasattr(c, "pos_encoding"):
        check_choice("pos_encoding", c.pos_encoding, POSITIONAL_ENCODINGS.keys())
        if c.pos_encoding == "rope" and (c.d_model // c.n_heads) % 2:
            raise ValueError(f"rope needs an even head dim, got d_head={c.d_model // c.n_heads}")
    if hasattr(c, "rope_scaling"):
        check_choice("rope_scaling", c.rope_scaling, ["none", "linear", "ntk", "dynamic"])
    if getattr(c, "rope_factor", 1.0) < 1.0:
        raise ValueError(f"rope_factor must be >= 1, got {c.rope_factor}")
    _validate_backends(c)


def _validate_backends(c: Any) -> None:
    check_choice("attn_backend", c.attn_backend, ATTENTION_BACKENDS.keys())
    per_layer = c.attn_layer_backends
    if per_layer is not None:
        if len(per_layer) != c.n_layers:
            raise ValueError(
                f"attn_layer_backends has {len(per_layer)} entries; expected one per layer "
                f"(n_layers={c.n_layers})"
            )
        for name in per_layer:
            check_choice("attn_layer_backends entry", name, ATTENTION_BACKENDS.keys())
    names = set(per_layer or ()) | {c.attn_backend}
    if c.attn_window is not None:
        if c.attn_window < 1:
            raise ValueError(f"attn_window must be a positive integer, got {c.attn_window}")
        if "sliding_window" not in names:
            raise ValueError(
                f"attn_window={c.attn_window} needs the 'sliding_window' backend, "
                f"but the model uses {sorted(names)}"
            )


def layer_backend(c: Any, layer: int) -> AttentionBackend:
    """The attention backend of layer ``layer`` (per-layer override, with the window option)."""
    name = c.attn_backend if c.attn_layer_backends is None else c.attn_layer_backends[layer]
    if name in ATTENTION_BACKEND_FACTORIES and name == "sliding_window" and c.attn_window:
        return get_attention_backend(name, window=c.attn_window)
    return get_attention_backend(name)


def layer_window(c: Any, layer: int) -> int | None:
    """The causal window a KV cache of layer ``layer`` may keep, or ``None`` to keep everything.

    Only a sliding-window layer without global tokens can drop old keys (global tokens are
    attended by every later query).
    """
    backend = layer_backend(c, layer)
    window = getattr(backend, "window", None)
    if window is None or len(getattr(backend, "global_tokens", ())):
        return None
    return int(window)


def layer_kwargs(c: Any, layer: int) -> dict[str, Any]:
    """Keyword arguments of ``EncoderLayer``/``DecoderLayer`` for layer ``layer`` of ``c``."""
    return dict(
        n_kv_heads=c.n_kv_heads,
        dropout=c.dropout,
        attn_dropout=c.attn_dropout,
        activation=c.activation,
        norm=c.norm,
        norm_eps=c.norm_eps,
        norm_position=c.norm_position,
        bias=c.bias,
        backend=layer_backend(c, layer),
    )


def freeze_tuple(config: Any, name: str) -> None:
    """Store a list-valued field (e.g. from JSON) as a tuple on a frozen dataclass."""
    value = getattr(config, name)
    if isinstance(value, list):
        object.__setattr__(config, name, tuple(value))
