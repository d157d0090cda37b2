"""The CIFAR-10 transformers: ViT's patch embedding equals the lesson's reshape-and-linear form,
ViT's analytic FLOPs equal FlopCounterMode's, and CCT (Hassani et al. 2021): tokenizer shapes,
sequence pooling, permutation invariance without positions, FLOPs, 64-image overfits."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab import build_model
from attnlab.analysis.flops import attention_terms, ffn_terms, forward_flops
from attnlab.analysis.measure import count_flops
from attnlab.analysis.params import count_params
from attnlab.layers.conv_tokenizer import ConvTokenizer, SequencePooling
from attnlab.layers.patch_embedding import PatchEmbedding
from attnlab.models.cct import CCT, PRESETS, CCTConfig
from attnlab.models.vit import PRESETS as VIT_PRESETS
from attnlab.models.vit import ViT
from attnlab.viz.capture import collect_attention

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dataclasses.replace(
    PRESETS["cct-cifar"], d_model=32, n_heads=2, n_layers=2, d_ff=64, conv_channels=16
)


def images(B: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(B, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


# -- ViT for CIFAR ----------------------------------------------------------------------------


def test_patch_embedding_is_reshape_then_linear() -> None:
    """The lesson's form: cut the image into P = (32/4)² patches, flatten each (C, p, p) patch,
    apply one Linear; the strided convolution with the same weights gives the same tokens."""
    c = VIT_PRESETS["vit-cifar"]
    embed = PatchEmbedding(c.image_size, c.patch_size, c.in_channels, c.d_model)
    x = images(3)
    B, C, p, g = 3, 3, c.patch_size, c.image_size // c.patch_size
    patches = x.reshape(B, C, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(B, g * g, C * p * p)
    linear = nn.Linear(C * p * p, c.d_model)
    with torch.no_grad():
        linear.weight.copy_(embed.proj.weight.reshape(c.d_model, C * p * p))
        linear.bias.copy_(embed.proj.bias)
    torch.testing.assert_close(embed(x), linear(patches), atol=1e-5, rtol=1e-5)
    assert embed(x).shape == (3, 64, c.d_model)


def test_vit_cifar_flops_per_image_match_flop_counter_mode() -> None:
    c = VIT_PRESETS["vit-cifar"]
    analytic = forward_flops(c)  # batch 1: one image, 64 patches + [CLS]
    assert analytic.seq_len == 65
    torch.manual_seed(0)
    measured = count_flops(ViT(c).eval(), (images(1),))  # math attention: QKᵀ, AV are bmm
    assert measured.forward == analytic.forward
    assert round(analytic.forward / 1e6) == 251  # MFLOPs per image


def test_vit_cifar_attention_from_cls_over_patches() -> None:
    c = dataclasses.replace(VIT_PRESETS["vit-cifar"], n_layers=2)
    maps = collect_attention(ViT(c), images(2))["self"]
    assert len(maps) == 2 and maps[-1].shape == (2, 3, 65, 65)
    cls_row = maps[-1][:, :, 0, 1:]  # (B, H, 64): [CLS] over the patches
    assert torch.all(cls_row.sum(-1) < 1) and cls_row.shape[-1] == 64


# -- CCT ----------------------------------------------------------------------------------------


def test_tokenizer_shapes_and_grid() -> None:
    tok = ConvTokenizer(3, 48, n_layers=2, hidden_channels=16)
    assert tok(images(2)).shape == (2, 64, 48) and tok.grid_size(32) == 8
    assert ConvTokenizer(3, 48, n_layers=1).grid_size(32) == 16
    assert PRESETS["cct7-3x1"].n_patches == 256 and PRESETS["cct-cifar"].n_patches == 64
    with pytest.raises(ValueError, match="odd"):
        ConvTokenizer(3, 48, kernel_size=4)


def test_sequence_pooling_is_the_softmax_weighted_mean() -> None:
    pool = SequencePooling(8)
    x = torch.randn(2, 5, 8)
    w = torch.softmax(x @ pool.score.weight.T + pool.score.bias, dim=1)  # (B, P, 1)
    torch.testing.assert_close(pool(x), (w * x).sum(1))
    torch.testing.assert_close(pool.weights(x).sum(-1), torch.ones(2))


def test_without_positions_cct_is_invariant_to_token_order() -> None:
    """Attention is permutation-equivariant and sequence pooling permutation-invariant, so with
    no position table the logits do not depend on the tokens' order."""
    torch.manual_seed(0)
    model = CCT(dataclasses.replace(TINY, pos_encoding="none", attn_dropout=0.0)).eval()
    tokens = model.tokenizer(images(2))  # (B, P, E)
    perm = torch.randperm(tokens.shape[1])

    def head(t: torch.Tensor) -> torch.Tensor:
        for layer in model.layers:
            t = layer(t)
        assert model.final_norm is not None
        return model.head(model.pool(model.final_norm(t)))

    torch.testing.assert_close(head(tokens), head(tokens[:, perm]), atol=1e-5, rtol=1e-5)


def test_cct_flops_per_image_counted_by_flop_counter_mode() -> None:
    c = PRESETS["cct-cifar"]
    E, P = c.d_model, c.n_patches
    convs = 2 * 32 * 32 * c.conv_channels * 3 * 9 + 2 * 16 * 16 * E * c.conv_channels * 9
    attn, _ = attention_terms(
        "a", batch=1, q_len=P, kv_len=P, d_model=E, n_heads=c.n_heads, count=c.n_layers
    )
    ffn = ffn_terms(
        "f", tokens=P, d_model=E, d_ff=c.d_ff, activation=c.activation, count=c.n_layers
    )
    pool_and_head = 2 * P * E + 2 * P * E + 2 * E * c.n_classes  # scores, weighted sum, head
    expected = convs + sum(t.flops for t in attn + ffn) + pool_and_head
    torch.manual_seed(0)
    measured = count_flops(CCT(c).eval(), (images(1),))
    assert measured.forward == expected


def test_preset_parameter_counts() -> None:
    """vit-cifar 1.81M, vit-cifar-small 0.81M, cct-cifar 0.88M, cct-cifar-small 0.62M, and the
    paper's CCT-7/3x1 at its Table 2 size."""
    for name, n in (
        ("vit-cifar", 1_806_538),
        ("vit-cifar-small", 811_146),
        ("cct-cifar", 880_203),
        ("cct-cifar-small", 615_243),
        ("cct7-3x1", 3_765_515),
    ):
        config = VIT_PRESETS.get(name) or PRESETS[name]
        assert count_params(build_model(name, device="meta")) == count_params(config) == n
    assert round(count_params(PRESETS["cct7-3x1"]) / 1e6, 2) == 3.77  # paper: 3.76M


@pytest.mark.parametrize("kind", ["vit", "cct"])
def test_overfits_one_batch_of_64_images(kind: str) -> None:
    small = {"d_model": 64, "n_heads": 2, "n_layers": 2, "d_ff": 128}
    if kind == "vit":
        model: nn.Module = build_model("vit-cifar", **small)
    else:
        model = build_model("cct-cifar", conv_channels=16, **small)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 3, 32, 32, generator=g), torch.randint(10, (64,), generator=g)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3 if kind == "vit" else 5e-3)
    model.train()
    for _ in range(60):
        logits = model(x)
        if (logits.argmax(-1) == y).all():
            break
        opt.zero_grad()
        F.cross_entropy(logits, y).backward()
        opt.step()
    model.eval()
    assert (model(x).argmax(-1) == y).float().mean() == 1.0


def test_cct_attention_and_pooling_weights() -> None:
    model = CCT(TINY)
    maps = collect_attention(model, images(2))["self"]
    assert len(maps) == 2 and maps[0].shape == (2, 2, 64, 64)
    w = model.pooling_weights(images(2))
    assert w.shape == (2, 64) and torch.allclose(w.sum(-1), torch.ones(2))


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="conv_kernel must be odd"):
        CCTConfig(conv_kernel=2)
    with pytest.raises(ValueError, match="leave no token"):
        CCTConfig(image_size=4, conv_layers=2, pool_padding=0)
    with pytest.raises(ValueError, match="pos_encoding='sine' is not valid"):
        CCTConfig(pos_encoding="sine")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not divide"):
        CCTConfig(d_model=100, n_heads=3)
    with pytest.raises(ValueError, match="expected 32x32 images"):
        CCT(TINY)(torch.randn(1, 3, 16, 16))
