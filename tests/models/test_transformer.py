"""The encoder-decoder Transformer: parity with ``nn.Transformer``, causality, padding invariance,
permutation equivariance, presets and parameter count, config validation."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import attnlab
from attnlab.layers import padding_mask_from_lengths
from attnlab.models import Decoder, Encoder, EncoderDecoderTransformer, TransformerConfig

POS = ["sinusoidal", "learned", "rope", "alibi", "none"]
V = 23  # tiny vocabulary; 0 is the pad id, ids drawn from [3, V)


def tiny(**overrides: object) -> TransformerConfig:
    kw: dict[str, object] = dict(
        vocab_size=V, d_model=16, n_heads=4, n_layers=2, d_ff=32, dropout=0.0, max_seq_len=32
    )
    kw.update(overrides)
    return TransformerConfig(**kw)  # type: ignore[arg-type]


def ids(*shape: int) -> torch.Tensor:
    return torch.randint(3, V, shape)


# ---------------------------------------------------------------------------------------------
# Parity with nn.Transformer
# ---------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_stacks_match_torch_transformer(
    copy_encoder_layer: Callable[[nn.Module, nn.TransformerEncoderLayer], None],
    copy_decoder_layer: Callable[[nn.Module, nn.TransformerDecoderLayer], None],
    activation: str,
    norm_first: bool,
    backend: str,
) -> None:
    E, H, F_DIM, N = 16, 4, 32, 2
    ref = nn.Transformer(
        E,
        H,
        num_encoder_layers=N,
        num_decoder_layers=N,
        dim_feedforward=F_DIM,
        dropout=0.0,
        activation=activation,
        batch_first=True,
        norm_first=norm_first,
    ).eval()
    with torch.no_grad():  # non-trivial norms and biases so the copy is really tested
        for m in ref.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.normal_(1.0, 0.2)
                m.bias.normal_(0.0, 0.2)
    config = tiny(
        d_model=E,
        n_heads=H,
        d_ff=F_DIM,
        n_layers=N,
        activation=activation,
        norm_position="pre" if norm_first else "post",
        final_norm=True,  # nn.Transformer always normalises both stacks' outputs
        attn_backend=backend,
    )
    encoder, decoder = Encoder(config).eval(), Decoder(config).eval()
    with torch.no_grad():
        for ours, theirs in zip(encoder.layers, ref.encoder.layers, strict=True):
            copy_encoder_layer(ours, theirs)
        for ours, theirs in zip(decoder.layers, ref.decoder.layers, strict=True):
            copy_decoder_layer(ours, theirs)
        for ours, theirs in (
            (encoder.final_norm, ref.encoder.norm),
            (decoder.final_norm, ref.decoder.norm),
        ):
            assert ours is not None
            ours.weight.copy_(theirs.weight)
            ours.bias.copy_(theirs.bias)

    B, S, T = 3, 6, 5
    src, tgt = torch.randn(B, S, E), torch.randn(B, T, E)
    src_keep = padding_mask_from_lengths(torch.tensor([6, 4, 2]), S)  # (B, 1, 1, S)
    ref_out = ref(
        src,
        tgt,
        tgt_mask=nn.Transformer.generate_square_subsequent_mask(T),
        src_key_padding_mask=~src_keep[:, 0, 0],  # torch: True = ignore
        memory_key_padding_mask=~src_keep[:, 0, 0],
        tgt_is_causal=True,
    )
    memory = encoder(src, mask=src_keep)
    out = decoder(tgt, memory, memory_mask=src_keep)
    assert (out - ref_out).abs().max() <= 1e-5
    ref_memory = ref.encoder(src, src_key_padding_mask=~src_keep[:, 0, 0])
    real = src_keep[:, 0, 0]
    assert (memory[real] - ref_memory[real]).abs().max() <= 1e-5


# ---------------------------------------------------------------------------------------------
# Invariants
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("pos", POS)
def test_decoder_is_causal(pos: str, backend: str) -> None:
    """Changing any target token after position i leaves the logits at positions <= i unchanged."""
    model = EncoderDecoderTransformer(tiny(pos_encoding=pos, attn_backend=backend)).eval()
    src, tgt = ids(2, 5), ids(2, 6)
    logits, _ = model(src, tgt)
    for i in range(tgt.shape[1] - 1):
        changed = tgt.clone()
        changed[:, i + 1 :] = ids(2, tgt.shape[1] - i - 1)
        changed[:, i + 1] = (tgt[:, i + 1] - 3 + 1) % (V - 3) + 3  # the next token surely differs
        new, _ = model(src, changed)
        assert (new[:, : i + 1] - logits[:, : i + 1]).abs().max() <= 1e-6, f"position {i}"
        assert (new[:, i + 1] - logits[:, i + 1]).abs().max() > 1e-4  # the change does matter


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("pos", POS)
def test_padding_invariance(pos: str, backend: str) -> None:
    """Appending masked pad tokens leaves the encoder outputs at real positions (and the
    decoder's logits) unchanged."""
    model = EncoderDecoderTransformer(tiny(pos_encoding=pos, attn_backend=backend)).eval()
    src, tgt = ids(2, 5), ids(2, 4)
    padded = torch.cat([src, torch.zeros(2, 3, dtype=torch.long)], dim=1)  # pad_id = 0
    memory = model.encode(src)
    memory_padded = model.encode(padded)
    assert torch.isfinite(memory_padded).all()
    assert (memory_padded[:, :5] - memory).abs().max() <= 1e-5
    logits, _ = model(src, tgt)
    logits_padded, _ = model(padded, tgt)
    assert (logits_padded - logits).abs().max() <= 1e-5
    # Ragged batch: each row equals that sequence encoded on its own.
    batch = padded.clone()
    batch[0, 5:] = ids(3)  # row 0 is 8 real tokens, row 1 is 5 real + 3 pads
    alone = model.encode(src[1:])
    assert (model.encode(batch)[1, :5] - alone[0]).abs().max() <= 1e-5


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("pos", ["sinusoidal", "alibi"])
def test_all_padding_source_gives_no_nan(pos: str, backend: str) -> None:
    """A source that is all padding: every encoder query row is fully masked (zeros, no NaN)."""
    model = EncoderDecoderTransformer(tiny(pos_encoding=pos, attn_backend=backend))
    src = torch.zeros(2, 4, dtype=torch.long)
    src[0] = ids(4)
    tgt = ids(2, 3)
    logits, loss = model(src, tgt, targets=ids(2, 3))
    assert torch.isfinite(logits).all() and loss is not None and torch.isfinite(loss)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("pos", ["sinusoidal", "alibi"])
def test_all_padding_source_backends_agree(pos: str) -> None:
    """Fully masked rows are zeros on both backends, whether the mask stays boolean or becomes
    additive (ALiBi folds padding into a float mask at finfo.min)."""
    math_model = EncoderDecoderTransformer(tiny(pos_encoding=pos, attn_backend="math")).eval()
    sdpa_model = EncoderDecoderTransformer(tiny(pos_encoding=pos, attn_backend="sdpa")).eval()
    sdpa_model.load_state_dict(math_model.state_dict())
    src = torch.zeros(2, 4, dtype=torch.long)
    src[0, :2] = ids(2)
    tgt = ids(2, 3)
    torch.testing.assert_close(math_model.encode(src), sdpa_model.encode(src), atol=1e-5, rtol=0)
    torch.testing.assert_close(math_model(src, tgt)[0], sdpa_model(src, tgt)[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_encoder_permutation_equivariance_without_positions(backend: str) -> None:
    model = EncoderDecoderTransformer(tiny(pos_encoding="none", attn_backend=backend)).eval()
    src = ids(2, 7)
    perm = torch.randperm(7)
    memory = model.encode(src)
    torch.testing.assert_close(model.encode(src[:, perm]), memory[:, perm], atol=1e-5, rtol=0)
    # With positions the encoder is not equivariant (so the test above can fail).
    with_pos = EncoderDecoderTransformer(tiny(pos_encoding="sinusoidal")).eval()
    assert not torch.allclose(
        with_pos.encode(src[:, perm]), with_pos.encode(src)[:, perm], atol=1e-3
    )


# ---------------------------------------------------------------------------------------------
# Model surface
# ---------------------------------------------------------------------------------------------


def test_forward_loss_ignores_padding_and_ties_weights() -> None:
    model = EncoderDecoderTransformer(tiny())
    assert model.lm_head.weight is model.src_embed.weight is model.tgt_embed.weight
    src, tgt, targets = ids(2, 5), ids(2, 4), ids(2, 4)
    logits, loss = model(src, tgt, targets=targets)
    assert logits.shape == (2, 4, V) and loss is not None
    expected = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    torch.testing.assert_close(loss, expected)
    padded_targets = targets.clone()
    padded_targets[1, 2:] = 0
    _, loss_pad = model(src, tgt, targets=padded_targets)
    keep = padded_targets.flatten() != 0
    expected = nn.functional.cross_entropy(logits.flatten(0, 1)[keep], targets.flatten()[keep])
    torch.testing.assert_close(loss_pad, expected)


def test_separate_vocabularies() -> None:
    model = EncoderDecoderTransformer(tiny(tgt_vocab_size=11, share_embeddings=False))
    assert model.src_embed is not model.tgt_embed
    assert model.lm_head.weight is model.tgt_embed.weight
    logits, _ = model(ids(1, 4), torch.randint(3, 11, (1, 3)))
    assert logits.shape == (1, 3, 11)
    untied = EncoderDecoderTransformer(tiny(tie_output=False))
    assert untied.lm_head.weight is not untied.tgt_embed.weight


def test_tiny_preset_trains_a_step() -> None:
    model = attnlab.build_model("transformer-tiny")
    model.train()
    src, tgt = torch.randint(3, 64, (2, 6)), torch.randint(3, 64, (2, 5))
    _, loss = model(src, tgt, targets=torch.randint(3, 64, (2, 5)))
    assert loss is not None and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads if g is not None)


def _hand_count(c: TransformerConfig) -> int:
    """Shared + tied embedding, then per layer: attention 4E² + 4E, FFN 2EF + F + E, norms 2E."""
    E, F_DIM = c.d_model, c.d_ff
    attn = 4 * E * E + 4 * E
    ffn = 2 * E * F_DIM + F_DIM + E
    norm = 2 * E
    encoder_layer = attn + ffn + 2 * norm
    decoder_layer = 2 * attn + ffn + 3 * norm
    return c.vocab_size * E + c.n_layers * encoder_layer + c.n_layers * decoder_layer


def test_transformer_base_parameter_count() -> None:
    model = attnlab.build_model("transformer-base", device="meta")
    n = sum(p.numel() for p in model.parameters())
    assert next(model.parameters()).device.type == "meta"
    expected = (
        37000 * 512
        + 6 * ((4 * 512**2 + 4 * 512) + (2 * 512 * 2048 + 2048 + 512) + 2 * (2 * 512))
        + 6 * (2 * (4 * 512**2 + 4 * 512) + (2 * 512 * 2048 + 2048 + 512) + 3 * (2 * 512))
    )
    assert expected == 63_082_496  # ~63M; the paper reports 65M (Table 3)
    assert n == expected == _hand_count(model.config)  # type: ignore[arg-type]
    big = attnlab.build_model("transformer-big", device="meta")
    assert sum(p.numel() for p in big.parameters()) == _hand_count(big.config)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"d_model": 30, "n_heads": 4}, r"n_heads=4 does not divide d_model=30"),
        ({"n_heads": 4, "n_kv_heads": 3}, r"n_heads=4 is not a multiple of n_kv_heads=3"),
        ({"pos_encoding": "xpos"}, r"pos_encoding='xpos' is not valid; choose one of .*'alibi'"),
        ({"attn_backend": "flash"}, r"attn_backend='flash' is not valid; .*'math', 'sdpa'"),
        ({"activation": "tanh"}, r"activation='tanh' is not valid; .*'swiglu'"),
        (
            {"norm": "groupnorm"},
            r"norm='groupnorm' is not valid; .*'layernorm', 'rmsnorm', 'batchnorm'",
        ),
        ({"norm_position": "mid"}, r"norm_position='mid' is not valid"),
        ({"dropout": 1.0}, r"dropout must be in \[0, 1\), got 1.0"),
        ({"d_model": 0}, r"d_model must be positive, got 0"),
        ({"pad_id": 23}, r"pad_id=23 is outside the vocabulary"),
        ({"tgt_vocab_size": 11}, r"share_embeddings needs one vocabulary"),
    ],
)
def test_config_validation(overrides: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        tiny(**overrides)


def test_bad_model_inputs() -> None:
    model = EncoderDecoderTransformer(tiny(pos_encoding="learned", max_seq_len=8)).eval()
    with pytest.raises(ValueError, match=r"token id 23 is outside the vocabulary \[0, 23\)"):
        model(torch.tensor([[3, 23]]), ids(1, 2))
    with pytest.raises(ValueError, match=r"token id -1 is outside the vocabulary"):
        model(ids(1, 2), torch.tensor([[-1, 4]]))
    with pytest.raises(ValueError, match=r"src must be \(B, S\) token ids, got shape \(4,\)"):
        model.encode(ids(4))
    memory = model.encode(ids(1, 3))
    with pytest.raises(ValueError, match=r"tgt must be \(B, T\) token ids"):
        model.decode(ids(1, 2, 2), memory)
    with pytest.raises(ValueError, match=r"sequence of 9 tokens exceeds max_seq_len=8"):
        model.encode(ids(1, 9))
