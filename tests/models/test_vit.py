"""ViT: parity with Hugging Face, patchification, permutation equivariance, errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from attnlab import ViT, ViTConfig, build_model
from attnlab.layers.patch_embedding import PatchEmbedding, patchify, unpatchify
from attnlab.models.vit import PRESETS

TINY = ViTConfig(
    image_size=8,
    patch_size=2,
    in_channels=3,
    n_classes=5,
    d_model=32,
    n_heads=4,
    n_layers=2,
    d_ff=64,
)


def tiny(**overrides: object) -> ViT:
    torch.manual_seed(0)
    return ViT(dataclasses.replace(TINY, **overrides)).eval()


def images(B: int = 2, C: int = 3, size: int = 8, seed: int = 1) -> torch.Tensor:
    return torch.randn(B, C, size, size, generator=torch.Generator().manual_seed(seed))


# Max abs difference allowed against Hugging Face (float32, eval). Measured ~5e-6 or less with the
# large init below; the margin absorbs other CPUs' summation orders.
ATOL = 5e-5

# -- Hugging Face parity ---------------------------------------------------------------------


def copy_vit(hf: nn.Module, model: ViT) -> None:
    sd = hf.state_dict()
    with torch.no_grad():
        model.cls_token.copy_(sd["vit.embeddings.cls_token"])
        model.pos_encoding.weight.copy_(sd["vit.embeddings.position_embeddings"][0])
        model.patch_embed.proj.weight.copy_(sd["vit.embeddings.patch_embeddings.projection.weight"])
        model.patch_embed.proj.bias.copy_(sd["vit.embeddings.patch_embeddings.projection.bias"])
        for i, layer in enumerate(model.layers):
            a, f = layer.self_attn, layer.ffn
            if "vit.layers.0.attention.q_proj.weight" in sd:  # transformers >= 5
                p = f"vit.layers.{i}."
                names = [
                    "attention.q_proj",
                    "attention.k_proj",
                    "attention.v_proj",
                    "attention.o_proj",
                    "mlp.fc1",
                    "mlp.fc2",
                ]
            else:  # transformers 4
                p = f"vit.encoder.layer.{i}."
                names = [
                    "attention.attention.query",
                    "attention.attention.key",
                    "attention.attention.value",
                    "attention.output.dense",
                    "intermediate.dense",
                    "output.dense",
                ]
            mods = [a.q_proj, a.k_proj, a.v_proj, a.out_proj, f.up_proj, f.down_proj]
            pairs: list[tuple[nn.Module, str]] = [
                *zip(mods, names, strict=True),
                (layer.self_attn_norm, "layernorm_before"),
                (layer.ffn_norm, "layernorm_after"),
            ]
            for mod, name in pairs:
                mod.weight.copy_(sd[p + name + ".weight"])
                mod.bias.copy_(sd[p + name + ".bias"])
        model.final_norm.weight.copy_(sd["vit.layernorm.weight"])
        model.final_norm.bias.copy_(sd["vit.layernorm.bias"])
        model.head.weight.copy_(sd["classifier.weight"])
        model.head.bias.copy_(sd["classifier.bias"])


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_parity_with_hugging_face(backend: str) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf_cfg = transformers.ViTConfig(
        image_size=16,
        patch_size=4,
        num_channels=3,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        num_labels=7,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.2,  # large weights make the comparison sensitive
    )
    hf = transformers.ViTForImageClassification(hf_cfg).eval()
    model = ViT(
        ViTConfig(
            image_size=16,
            patch_size=4,
            in_channels=3,
            n_classes=7,
            d_model=64,
            n_heads=4,
            n_layers=2,
            d_ff=128,
            attn_backend=backend,
        )
    ).eval()
    copy_vit(hf, model)
    x = images(3, size=16)
    with torch.no_grad():
        ref = hf(pixel_values=x, output_hidden_states=True)
        logits = model(x)
        feats = model.features(x)
    assert (logits - ref.logits).abs().max().item() < ATOL
    # HF's last hidden state is before the final layernorm
    assert (feats - hf.vit.layernorm(ref.hidden_states[-1])).abs().max().item() < ATOL


# -- patches ---------------------------------------------------------------------------------


def test_output_shape() -> None:
    model = tiny()
    with torch.no_grad():
        assert model(images(4)).shape == (4, 5)
        assert model.features(images(4)).shape == (4, 1 + 16, 32)


def test_patchify_round_trip() -> None:
    x = images(2, C=3, size=12)
    patches = patchify(x, 4)
    assert patches.shape == (2, 9, 3 * 4 * 4)
    # patch 1 is the top row, second column
    torch.testing.assert_close(patches[0, 1], x[0, :, 0:4, 4:8].flatten())
    torch.testing.assert_close(unpatchify(patches, 4, 12, 12), x, rtol=0, atol=0)
    rect = torch.randn(1, 2, 8, 12)
    torch.testing.assert_close(unpatchify(patchify(rect, 4), 4, 8, 12), rect, rtol=0, atol=0)


def test_conv_patch_embedding_equals_unfold_plus_linear() -> None:
    torch.manual_seed(0)
    embed = PatchEmbedding(8, 2, 3, 16)
    x = images(2)
    w = embed.proj.weight.flatten(1)  # (E, C·p·p)
    ref = patchify(x, 2) @ w.T + embed.proj.bias
    torch.testing.assert_close(embed(x), ref, rtol=1e-5, atol=1e-6)


def test_permutation_equivariance_without_position_embeddings() -> None:
    """Without positions, shuffling the patches shuffles the patch outputs and leaves the
    [CLS] output (and so the logits) unchanged; with positions it does not."""
    x = images(2)
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    shuffled = unpatchify(patchify(x, 2)[:, perm], 2, 8, 8)
    model = tiny(pos_encoding="none")
    with torch.no_grad():
        a, b = model.features(x), model.features(shuffled)
    torch.testing.assert_close(b[:, 1:], a[:, 1:][:, perm], rtol=0, atol=1e-5)
    torch.testing.assert_close(b[:, 0], a[:, 0], rtol=0, atol=1e-5)
    with torch.no_grad():
        positioned = tiny()
        assert (positioned(x) - positioned(shuffled)).abs().max() > 1e-4


def test_mean_pooling() -> None:
    model = tiny(pool="mean")
    with torch.no_grad():
        h = model.features(images())
        torch.testing.assert_close(model(images()), model.head(h[:, 1:].mean(1)))


def test_build_model_by_name() -> None:
    model = build_model("vit-digits")
    assert isinstance(model, ViT)
    with torch.no_grad():
        assert model.eval()(torch.randn(2, 1, 8, 8)).shape == (2, 10)


# -- bad input -------------------------------------------------------------------------------


def test_bad_images() -> None:
    model = tiny()
    with pytest.raises(ValueError, match="expected images with 3 channels, got 1"):
        model(images(C=1))
    with pytest.raises(ValueError, match=r"expected 8x8 images .* got 12x12"):
        model(images(size=12))
    with pytest.raises(ValueError, match="image size 7x7 is not a multiple of the patch size 2"):
        model(images(size=7))
    with pytest.raises(ValueError, match=r"images must be \(B, C, H, W\)"):
        model(images()[0])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"image_size": 10, "patch_size": 4}, "image_size=10 is not a multiple of patch_size=4"),
        ({"pos_encoding": "rope"}, "pos_encoding='rope' is not valid"),
        ({"pool": "max"}, "pool='max' is not valid"),
        ({"in_channels": 0}, "in_channels must be positive"),
    ],
)
def test_config_validation(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TINY, **overrides)


def test_preset_shapes() -> None:
    assert PRESETS["vit-b16"].n_patches == 196
    assert PRESETS["vit-h14"].n_patches == 256
    assert PRESETS["vit-digits"].max_seq_len == 17
