"""ViT <-> Hugging Face: ``ViTForImageClassification`` and ``ViTModel`` (with its pooler)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

import attnlab
from attnlab import ViT, ViTConfig
from attnlab.interop import save_hf


def hf_config(transformers: ModuleType, **kw: Any) -> Any:
    return transformers.ViTConfig(
        image_size=16,
        patch_size=4,
        num_channels=3,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=128,
        initializer_range=0.2,  # large weights make the comparison sensitive
        **kw,
    )


def images(B: int = 3) -> torch.Tensor:
    return torch.randn(B, 3, 16, 16, generator=torch.Generator().manual_seed(2))


def test_classifier_parity(transformers: ModuleType, tools: Any, tmp_path: Path) -> None:
    hf = transformers.ViTForImageClassification(hf_config(transformers, num_labels=7))
    model = attnlab.from_pretrained(tools.save(hf, tmp_path))
    assert isinstance(model, ViT) and model.config.n_classes == 7 and model.pooler is None
    x = images()
    with torch.no_grad():
        ref = hf(pixel_values=x, output_hidden_states=True)
        assert tools.max_diff(model(x), ref.logits) <= tools.ATOL
        # transformers' last hidden state is before the final layernorm
        ref_features = hf.vit.layernorm(ref.hidden_states[-1])
        assert tools.max_diff(model.features(x), ref_features) <= tools.ATOL


def test_base_model_with_pooler(transformers: ModuleType, tools: Any, tmp_path: Path) -> None:
    hf = transformers.ViTModel(hf_config(transformers))
    model = attnlab.from_pretrained(tools.save(hf, tmp_path))
    assert isinstance(model, ViT) and model.head is None and model.pooler is not None
    x = images()
    with torch.no_grad():
        ref = hf(pixel_values=x)
        assert tools.max_diff(model.features(x), ref.last_hidden_state) <= tools.ATOL
        assert tools.max_diff(model(x), ref.pooler_output) <= tools.ATOL


def test_in_memory_names_of_transformers_5(
    transformers: ModuleType, tools: Any, tmp_path: Path
) -> None:
    """transformers 5 renamed ViT's modules in memory (``layers.N.attention.q_proj``,
    ``mlp.fc1``) but writes the old names to disk; a file of the new names loads too."""
    hf = transformers.ViTForImageClassification(hf_config(transformers, num_labels=5)).eval()
    state = hf.state_dict()
    if not any(".q_proj." in k for k in state):
        pytest.skip("this transformers version keeps the old ViT names in memory")
    hf.config.save_pretrained(tmp_path)
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "model.safetensors")
    model = attnlab.from_pretrained(tmp_path)
    x = images()
    with torch.no_grad():
        assert tools.max_diff(model(x), hf(pixel_values=x).logits) <= tools.ATOL


@pytest.mark.parametrize("n_classes", [7, 0])
def test_round_trip_through_transformers(
    transformers: ModuleType, tools: Any, tmp_path: Path, n_classes: int
) -> None:
    cfg = ViTConfig(
        image_size=16,
        patch_size=4,
        n_classes=n_classes,
        pooler=n_classes == 0,
        d_model=64,
        n_heads=4,
        n_layers=2,
        d_ff=128,
    )
    model = ViT(cfg).eval()
    tools.randomise(model)
    save_hf(model, tmp_path)
    x = images()
    with torch.no_grad():
        if n_classes:
            hf = transformers.AutoModelForImageClassification.from_pretrained(tmp_path).eval()
            assert tools.max_diff(model(x), hf(pixel_values=x).logits) <= tools.ATOL
        else:
            hf = transformers.AutoModel.from_pretrained(tmp_path).eval()
            ref = hf(pixel_values=x)
            assert tools.max_diff(model(x), ref.pooler_output) <= tools.ATOL
            assert tools.max_diff(model.features(x), ref.last_hidden_state) <= tools.ATOL
    tools.assert_same_state(model, attnlab.from_pretrained(tmp_path))


def test_mean_pooling_has_no_equivalent(tmp_path: Path) -> None:
    model = ViT(
        ViTConfig(
            image_size=8,
            patch_size=4,
            d_model=32,
            n_heads=2,
            n_layers=1,
            d_ff=64,
            n_classes=3,
            pool="mean",
        )
    )
    with pytest.raises(ValueError, match="pool='mean'"):
        save_hf(model, tmp_path)
