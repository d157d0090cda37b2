"""Registries (unknown keys list the valid ones), presets, build_model and config round trips."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import attnlab
from attnlab.config import config_from_dict, config_to_dict
from attnlab.layers import (
    ACTIVATIONS,
    ATTENTION_BACKENDS,
    NORMS,
    POSITIONAL_ENCODINGS,
    MultiHeadAttention,
    get_attention_backend,
)
from attnlab.models import MODEL_TYPES, TransformerConfig, config_for, config_from_json_dict
from attnlab.registry import Registry


def test_registry_basics() -> None:
    reg: Registry[int] = Registry("widget")
    reg.add("b", 2)

    @reg.register("a")
    def _a() -> None: ...

    assert reg.keys() == ["a", "b"] and list(reg) == ["a", "b"]
    assert "a" in reg and "c" not in reg
    assert reg.get("b") == 2
    assert "widget" in repr(reg)
    with pytest.raises(ValueError, match="widget 'b' is already registered"):
        reg.add("b", 3)
    with pytest.raises(ValueError, match=r"unknown widget 'c'; valid: a, b"):
        reg.get("c")


@pytest.mark.parametrize(
    ("registry", "what", "some_valid"),
    [
        (ATTENTION_BACKENDS, "attention backend", ["math", "sdpa"]),
        (POSITIONAL_ENCODINGS, "positional encoding", ["alibi", "learned", "none", "rope"]),
        (ACTIVATIONS, "activation", ["gelu", "relu", "silu"]),
        (NORMS, "norm", ["layernorm", "rmsnorm"]),
        (MODEL_TYPES, "model type", ["transformer"]),
    ],
)
def test_unknown_key_lists_valid_keys(registry: Registry, what: str, some_valid: list[str]) -> None:
    with pytest.raises(ValueError, match=rf"unknown {what} 'no-such-thing'; valid: ") as err:
        registry.get("no-such-thing")
    listed = str(err.value).split("valid: ")[1].split(", ")
    assert set(some_valid) <= set(listed)
    assert listed == sorted(listed)


def test_custom_backend_callable() -> None:
    calls: list[tuple[int, ...]] = []

    def my_backend(q, k, v, *, mask=None, is_causal=False, dropout_p=0.0, scale=None):  # type: ignore[no-untyped-def]
        calls.append(tuple(q.shape))
        return ATTENTION_BACKENDS.get("math")(
            q, k, v, mask=mask, is_causal=is_causal, dropout_p=dropout_p, scale=scale
        )

    assert get_attention_backend(my_backend) is my_backend
    mha = MultiHeadAttention(8, 2, backend=my_backend)
    ref = MultiHeadAttention(8, 2, backend="math")
    ref.load_state_dict(mha.state_dict())
    x = torch.randn(1, 3, 8)
    torch.testing.assert_close(mha(x)[0], ref(x)[0])
    assert calls == [(1, 2, 3, 4)]
    assert "my_backend" in repr(mha)


# ---------------------------------------------------------------------------------------------
# Presets and build_model
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(attnlab.PRESETS))
def test_every_preset_builds_on_meta(name: str) -> None:
    model = attnlab.build_model(name, device="meta")
    params = list(model.parameters())
    assert params and all(p.device.type == "meta" for p in params)
    config = attnlab.PRESETS[name]
    assert attnlab.config_for(name) == config
    assert type(model).__name__ and getattr(model, "config", config) == config


TRANSFORMER_PRESETS = sorted(
    name for name, c in attnlab.PRESETS.items() if isinstance(c, TransformerConfig)
)


def test_transformer_presets_are_registered() -> None:
    assert {"transformer-base", "transformer-big", "transformer-tiny"} <= set(TRANSFORMER_PRESETS)


@pytest.mark.parametrize("name", TRANSFORMER_PRESETS)
def test_transformer_preset_shrunk_runs_forward_backward(name: str) -> None:
    """Each encoder-decoder preset's architecture at tiny sizes: forward and backward, no NaN.

    (GPT, BERT and ViT presets get the same check in their own model's tests.)
    """
    small = dict(vocab_size=32, d_model=16, n_heads=4, n_layers=1, d_ff=32, max_seq_len=16)
    model = attnlab.build_model(name, **small)
    model.train()  # the preset's dropout stays on
    src, tgt = torch.randint(3, 32, (2, 5)), torch.randint(3, 32, (2, 4))
    logits, loss = model(src, tgt, targets=torch.randint(3, 32, (2, 4)))
    assert logits.shape == (2, 4, 32) and torch.isfinite(logits).all()
    assert loss is not None and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_build_model_from_config_with_overrides() -> None:
    config = config_for("transformer-tiny", n_layers=1)
    assert config.n_layers == 1 and attnlab.PRESETS["transformer-tiny"].n_layers == 2
    model = attnlab.build_model(config, d_ff=64)
    assert isinstance(model, attnlab.EncoderDecoderTransformer)
    assert model.config.d_ff == 64 and len(model.encoder.layers) == 1


def test_unknown_preset_and_override() -> None:
    with pytest.raises(
        ValueError, match=r"unknown preset 'transformer-huge'; valid: .*transformer-base"
    ):
        attnlab.build_model("transformer-huge")
    with pytest.raises(ValueError, match=r"unknown preset 'gpt-5'; valid: "):
        config_for("gpt-5")
    with pytest.raises(
        ValueError, match=r"unknown config keys \['n_head'\] for 'transformer-tiny'"
    ):
        config_for("transformer-tiny", n_head=3)


# ---------------------------------------------------------------------------------------------
# Config (de)serialisation
# ---------------------------------------------------------------------------------------------


def test_config_round_trip() -> None:
    config = config_for("transformer-tiny", pos_encoding="rope", n_kv_heads=2)
    data = config_to_dict(config)
    assert data["model_type"] == "transformer"
    assert data["d_model"] == config.d_model
    assert config_from_json_dict(data) == config
    assert config_from_dict(TransformerConfig, data) == config
    assert config_from_dict(TransformerConfig, dataclasses.asdict(config)) == config


def test_config_from_dict_rejects_unknown_keys() -> None:
    data = config_to_dict(attnlab.PRESETS["transformer-tiny"])
    data["n_head"] = 4
    data["dmodel"] = 8
    with pytest.raises(
        ValueError, match=r"unknown TransformerConfig keys \['dmodel', 'n_head'\]; valid keys: "
    ):
        config_from_dict(TransformerConfig, data)


def test_config_from_dict_rejects_wrong_model_type() -> None:
    data = config_to_dict(attnlab.PRESETS["transformer-tiny"])
    data["model_type"] = "gpt"
    with pytest.raises(ValueError, match=r"config is for model_type 'gpt', not 'transformer'"):
        config_from_dict(TransformerConfig, data)
    with pytest.raises(ValueError, match=r"no 'model_type'; valid: .*transformer"):
        config_from_json_dict({"d_model": 8})
    with pytest.raises(ValueError, match=r"unknown model type 'lstm'; valid: "):
        config_from_json_dict({"model_type": "lstm"})


def test_config_validates_on_load() -> None:
    data = config_to_dict(attnlab.PRESETS["transformer-tiny"])
    data["n_heads"] = 5
    with pytest.raises(ValueError, match=r"n_heads=5 does not divide d_model=64"):
        config_from_json_dict(data)


def test_configs_are_frozen() -> None:
    config = attnlab.PRESETS["transformer-base"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 3  # type: ignore[misc]
    assert config.d_head == 64
