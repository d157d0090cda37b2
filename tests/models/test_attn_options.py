"""``attn_options``: a model config carries its attention backends' options (a window, a block,
buckets); they reach every layer, survive save/load and the command line, and a model whose
attention is restricted or approximated is never exported as a full-attention checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.cli.overrides import coerce, describe
from attnlab.config import field_hints
from attnlab.interop import UnsupportedCheckpointError, save_hf
from attnlab.layers import ATTENTION_BACKENDS, FULL_ATTENTION_BACKENDS, get_attention_backend
from attnlab.models.common import layer_backend
from attnlab.models.gpt import GPTConfig
from attnlab.models.transformer import TransformerConfig

SMALL = dict(vocab_size=40, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_seq_len=48,
             dropout=0.0, eos_id=None)  # fmt: skip


def _gpt(**kw: object) -> GPTConfig:
    return GPTConfig(**{**SMALL, **kw})  # type: ignore[arg-type]


def test_options_reach_every_layer_that_uses_the_backend() -> None:
    cfg = _gpt(attn_backend="bigbird", attn_layer_backends=("bigbird", "lsh"),
               attn_options={"bigbird": {"block": 8, "random_blocks": 1},
                             "lsh": {"n_buckets": 4, "chunk_size": 8}})  # fmt: skip
    model = attnlab.build_model(cfg)
    first, second = (layer.self_attn.backend for layer in model.layers)  # type: ignore[attr-defined]
    assert repr(first) == repr(get_attention_backend("bigbird", block=8, random_blocks=1))
    assert (second.n_buckets, second.chunk_size) == (4, 8)
    assert layer_backend(cfg, 0).block == 8  # type: ignore[attr-defined]
    # the default instance is untouched
    assert ATTENTION_BACKENDS.get("bigbird").block == 64  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("name", "options"),
    [("sparse_strided", {"block": 8}), ("sparse_fixed", {"block": 8, "summary": 2}),
     ("bigbird", {"block": 8, "global_blocks": 1, "random_blocks": 1, "seed": 3})],
)  # fmt: skip
def test_a_model_with_options_equals_the_math_path_under_the_dense_pattern(
    name: str, options: dict[str, int]
) -> None:
    """The options change the function (the pattern with block 8, not the default 64's, which
    covers all 40 positions) and the model computes exactly that pattern."""
    torch.manual_seed(0)
    sparse = attnlab.build_model(_gpt(attn_backend=name, attn_options={name: options})).eval()
    backend = get_attention_backend(name, **options)
    pattern = backend.dense_mask(40, 40, is_causal=True)  # type: ignore[attr-defined]
    assert not pattern.tril().all()  # the pattern leaves keys out
    dense = attnlab.build_model(_gpt(attn_backend="math")).eval()
    dense.load_state_dict(sparse.state_dict())
    ids = torch.randint(0, 40, (2, 40))
    with torch.no_grad():
        got = sparse(ids)[0]
        want = dense(ids, mask=None)[0]  # full causal attention: another function
        assert not torch.allclose(got, want, atol=1e-4)
        for layer in dense.layers:  # type: ignore[attr-defined]
            layer.self_attn.backend = lambda q, k, v, *, mask=None, is_causal=False, **kw: (
                get_attention_backend("math")(q, k, v, mask=pattern, **kw)
            )
        torch.testing.assert_close(got, dense(ids)[0], atol=1e-5, rtol=1e-5)


def test_sliding_window_options_equal_attn_window() -> None:
    torch.manual_seed(1)
    a = attnlab.build_model(_gpt(attn_backend="sliding_window", attn_window=5)).eval()
    b = attnlab.build_model(
        _gpt(attn_backend="sliding_window", attn_options={"sliding_window": {"window": 5}})
    ).eval()
    b.load_state_dict(a.state_dict())
    ids = torch.randint(0, 40, (2, 30))
    with torch.no_grad():
        assert torch.equal(a(ids)[0], b(ids)[0])
    # the KV cache keeps only the window either way
    assert [a.layers[i].self_attn.backend.window for i in range(2)] == [5, 5]  # type: ignore[attr-defined]
    assert [b.layers[i].self_attn.backend.window for i in range(2)] == [5, 5]  # type: ignore[attr-defined]


def test_options_survive_save_and_load(tmp_path: Path) -> None:
    cfg = _gpt(attn_backend="lsh", attn_options={"lsh": {"n_buckets": 4, "chunk_size": 8}})
    model = attnlab.build_model(cfg)
    model.save_pretrained(tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert saved["attn_options"] == {"lsh": {"n_buckets": 4, "chunk_size": 8}}
    loaded = attnlab.from_pretrained(tmp_path / "m")
    assert loaded.config == cfg
    assert loaded.layers[0].self_attn.backend.chunk_size == 8  # type: ignore[attr-defined]


def test_the_config_keeps_its_own_copy() -> None:
    options = {"bigbird": {"block": 8}}
    cfg = _gpt(attn_backend="bigbird", attn_options=options)
    options["bigbird"]["block"] = 0  # the caller's mapping changes; the config does not
    assert cfg.attn_options == {"bigbird": {"block": 8}}


@pytest.mark.parametrize(
    ("kw", "error", "message"),
    [
        ({"attn_backend": "bigbird", "attn_options": {"bigbird": {"blok": 8}}}, ValueError,
         r"attn_options\['bigbird'\]: unknown option\(s\) \['blok'\]; 'bigbird' takes \['block'"),
        ({"attn_backend": "bigbird", "attn_options": {"bigbird": {"block": 0}}}, ValueError,
         r"attn_options\['bigbird'\]: block must be a positive integer, got 0"),
        ({"attn_backend": "bigbird", "attn_options": {"lsh": {"n_buckets": 4}}}, ValueError,
         r"options for 'lsh', but the model uses \['bigbird'\]"),
        ({"attn_options": {"sdpa": {}}}, ValueError, r"attn_options key='sdpa' is not valid"),
        ({"attn_backend": "bigbird", "attn_options": {"bigbird": 8}}, TypeError,
         r"attn_options\['bigbird'\] must be a mapping"),
        ({"attn_options": [1]}, TypeError, r"attn_options must be a mapping"),
        ({"attn_backend": "sliding_window", "attn_window": 4,
          "attn_options": {"sliding_window": {"window": 8}}}, ValueError,
         "both set the window"),
    ],
)  # fmt: skip
def test_bad_options_are_refused_by_name(kw: dict[str, object], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        _gpt(**kw)


def test_the_command_line_takes_a_json_object() -> None:
    hint = field_hints(GPTConfig)["attn_options"]
    assert coerce('{"bigbird": {"block": 16}}', hint) == {"bigbird": {"block": 16}}
    assert coerce("none", hint) is None
    assert describe(hint) == "json|none"
    with pytest.raises(ValueError, match="expected a JSON object"):
        coerce("[1, 2]", hint)
    with pytest.raises(ValueError, match="expected a JSON object"):
        coerce("{block: 16}", hint)


def test_an_encoder_decoder_takes_them_too() -> None:
    cfg = TransformerConfig(vocab_size=40, d_model=16, n_heads=2, n_layers=1,
                            n_decoder_layers=1, d_ff=32, attn_backend="sparse_fixed",
                            attn_options={"sparse_fixed": {"block": 4}})  # fmt: skip
    model = attnlab.build_model(cfg)
    for stack in (model.encoder, model.decoder):  # type: ignore[union-attr]
        assert stack.layers[0].self_attn.backend.block == 4  # type: ignore[union-attr,index]


@pytest.mark.parametrize(
    "name", sorted(set(ATTENTION_BACKENDS.keys()) - set(FULL_ATTENTION_BACKENDS))
)
def test_hf_export_refuses_a_restricted_or_approximate_backend(name: str, tmp_path: Path) -> None:
    model = attnlab.build_model(_gpt(attn_backend=name))
    with pytest.raises(UnsupportedCheckpointError, match=f"attention backend '{name}'"):
        save_hf(model, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()  # nothing half-written


def test_hf_export_names_a_per_layer_backend(tmp_path: Path) -> None:
    model = attnlab.build_model(_gpt(attn_layer_backends=("sdpa", "sliding_window")))
    with pytest.raises(UnsupportedCheckpointError, match="attention backend 'sliding_window'"):
        save_hf(model, tmp_path / "hf")


@pytest.mark.parametrize("name", FULL_ATTENTION_BACKENDS)
def test_hf_export_keeps_full_attention_backends(name: str, tmp_path: Path) -> None:
    save_hf(attnlab.build_model(_gpt(attn_backend=name)), tmp_path / "hf")
    assert (tmp_path / "hf" / "config.json").is_file()


def test_attnlab_train_takes_attn_options(tmp_path: Path) -> None:
    """``attnlab train recall --attn-backend bigbird --attn-options '<JSON>'`` trains a model
    whose layers have those options, saved in the run's checkpoint."""
    from attnlab.cli.overrides import parse_overrides
    from attnlab.cli.train import recipe_types
    from attnlab.training.recipes import get_recipe, train_recipe

    recipe = get_recipe("recall")
    tokens = ["--attn-backend", "bigbird", "--attn-options", '{"bigbird": {"block": 8}}']
    overrides = parse_overrides(tokens, recipe_types(recipe))
    assert overrides == {"attn_backend": "bigbird", "attn_options": {"bigbird": {"block": 8}}}
    prepared, _ = train_recipe("recall", tmp_path / "run", {
        **overrides, "distance": 8, "steps": 2, "batch_size": 2, "eval_every": 0,
        "eval_batches": 1, "warmup": 1, "progress": False})  # fmt: skip
    assert prepared.model.layers[0].self_attn.backend.block == 8  # type: ignore[union-attr,index]
    saved = next((tmp_path / "run" / "checkpoints").glob("step_*")) / "config.json"
    assert json.loads(saved.read_text())["attn_options"] == {"bigbird": {"block": 8}}
