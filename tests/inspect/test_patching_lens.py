"""Activation patching, the logit lens and direct logit attribution (and their pictures)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from attnlab.inspect import (
    activation_patching,
    direct_logit_attribution,
    logit_difference,
    logit_lens,
    run_with_cache,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("backend", ["math", "sdpa", "chunked"])
def test_patching_clean_into_clean_changes_nothing(backend: str, make: Any, example: Any) -> None:
    """Every activation, every position: the metric stays the clean one, bitwise (a replaced
    score/weight tensor with the same values keeps the backend's output)."""
    model = make["gpt"](backend)
    (x,) = example(model, B=1, T=6)
    result = activation_patching(model, x, x, None, logit_difference(3, 4), per="position")
    measured = result.metric[torch.isfinite(result.metric)]
    assert measured.numel() > 100 and torch.all(measured == result.clean)
    assert result.clean == result.corrupted


def test_patching_restores_and_localises(make: Any, example: Any) -> None:
    model = make["gpt"](n_layers=2)
    (clean,) = example(model, B=1, T=6, seed=1)
    corrupted = clean.clone()
    corrupted[0, 2] = (clean[0, 2] + 7) % model.config.vocab_size  # one token changed
    metric = logit_difference(3, 4)
    result = activation_patching(model, clean, corrupted, "layers.*.resid_pre", metric)
    assert result.names == ("layers.0.resid_pre", "layers.1.resid_pre")
    assert result.metric.shape == (2, 6) and result.dims == ("name", "position")
    norm = result.normalized()
    # the whole difference enters at position 2: patching it there restores the clean metric
    assert norm[0, 2].item() == pytest.approx(1.0, abs=1e-5)
    assert torch.all(norm[0, :2].abs() < 1e-6)  # earlier positions carry nothing
    everything = activation_patching(
        model, clean, corrupted, "layers.0.resid_pre", metric, per="all"
    )
    assert everything.metric.shape == (1, 1)
    assert everything.metric[0, 0].item() == pytest.approx(result.clean, abs=1e-6)
    heads = activation_patching(model, clean, corrupted, "layers.*.attn.z", metric, per="head")
    assert heads.metric.shape == (2, 4) and heads.column_labels() == ["h0", "h1", "h2", "h3"]


def test_patching_errors(make: Any, example: Any) -> None:
    model = make["gpt"]()
    (x,) = example(model, B=1, T=6)
    metric = logit_difference(3, 4)
    with pytest.raises(ValueError, match="different shapes"):
        activation_patching(model, x, x[:, :4], "layers.0.resid_pre", metric)
    with pytest.raises(ValueError, match=r"per='head': layers.0.resid_pre has no head axis"):
        activation_patching(model, x, x, "layers.0.resid_pre", metric, per="head")
    with pytest.raises(ValueError, match="per must be"):
        activation_patching(model, x, x, "logits", metric, per="token")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not finite"):
        activation_patching(model, x, x, "logits", lambda out: float("nan"))


def test_plot_patching_draws_the_effect(make: Any, example: Any, tmp_path: Any) -> None:
    pytest.importorskip("matplotlib")
    from attnlab.viz import plot_patching

    model = make["gpt"]()
    (clean,) = example(model, B=1, T=5, seed=1)
    corrupted = clean.flip(1)
    result = activation_patching(
        model, clean, corrupted, "layers.*.resid_pre", logit_difference(3, 4)
    )
    fig = plot_patching(result, path=tmp_path / "p.png")
    image = fig.axes[0].images[0].get_array()
    assert torch.allclose(torch.as_tensor(image.data), result.effect.float())
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["0", "1"]
    assert (tmp_path / "p.png").stat().st_size > 0


@pytest.mark.parametrize("family", ["gpt", "llama", "transformer", "bert"])
def test_lens_after_the_last_layer_is_the_logits(family: str, make: Any, example: Any) -> None:
    model = make[family]()
    x = example(model)
    out = model(*x)
    logits = out.logits if family == "bert" else out[0]
    lens = logit_lens(model, *x)
    L = model.config.n_layers
    assert lens.logits.shape == (L + 1, *logits.shape)
    assert lens.labels == ("embed", *(f"layer {i}" for i in range(L)))
    assert torch.equal(lens.logits[-1], logits)
    last = logit_lens(model, *x, positions=-1)
    torch.testing.assert_close(last.logits[:, :, 0], lens.logits[:, :, -1], atol=1e-6, rtol=0)
    top = last.top(3)
    assert len(top) == L + 1 and all(len(row) == 3 for row in top)
    assert top[-1][0][0] == int(logits[0, -1].argmax())


def test_lens_errors(make: Any, example: Any) -> None:
    vit = make["vit"]()
    with pytest.raises(TypeError, match="needs a language model"):
        logit_lens(vit, *example(vit))
    bert = make["bert"](mlm_head=False)
    with pytest.raises(ValueError, match="no MLM head"):
        logit_lens(bert, *example(bert))
    gpt = make["gpt"]()
    with pytest.raises(ValueError, match="out of range"):
        logit_lens(gpt, *example(gpt, T=5), positions=[7])


@pytest.mark.parametrize("family", ["gpt", "llama", "transformer_pre"])
def test_direct_logit_attribution_sums_to_the_logit_difference(
    family: str, make: Any, example: Any
) -> None:
    """LayerNorm (GPT), RMSNorm without biases (Llama), and a pre-norm encoder-decoder with
    cross-attention and an output bias: the terms sum to the model's logit difference."""
    if family == "transformer_pre":
        model = make["transformer"](norm_position="pre", output_bias=True, tie_output=False)
    else:
        model = make[family]()
    x = example(model)
    dla = direct_logit_attribution(model, *x, target=3, other=4)
    assert dla.contributions.shape == (len(dla.labels), 2)
    assert dla.error().abs().max() <= 1e-5 * max(1.0, float(dla.total.abs().max()))
    logits = model(*x)[0][:, -1]
    torch.testing.assert_close(dla.total.float(), logits[:, 3] - logits[:, 4])
    assert dla.heads().shape == (model.config.n_layers, model.config.n_heads, 2)
    assert "embed" in dla.labels and "L0.H0" in dla.labels and "L1.ffn" in dla.labels
    if family == "gpt":  # one head's term by hand: z_h W_O,h, centred, / sigma, * gamma, . d
        _, cache = run_with_cache(model, *x, names=["layers.0.attn.z", "layers.1.resid_post"])
        D = model.config.d_head
        z = cache["layers.0.attn.z"][:, -1, 0].double()  # (B, D)
        term = z @ model.layers[0].self_attn.out_proj.weight[:, :D].double().T  # (B, E)
        final = cache["layers.1.resid_post"][:, -1].double()  # (B, E)
        sigma = (final.var(-1, unbiased=False, keepdim=True) + model.final_norm.eps).sqrt()
        W = model.lm_head.weight.double()
        gamma = model.final_norm.weight.double()
        want = ((term - term.mean(-1, keepdim=True)) / sigma * gamma) @ (W[3] - W[4])  # (B,)
        torch.testing.assert_close(dla.contributions[dla.labels.index("L0.H0")], want)
    if family == "transformer_pre":
        assert {"L0.X0", "L0.cross_bias", "head_bias", "norm_bias"} <= set(dla.labels)


def test_direct_logit_attribution_refuses_post_norm_and_training(make: Any, example: Any) -> None:
    post = make["transformer"]()  # the paper's post-norm layers
    with pytest.raises(ValueError, match="needs a pre-norm stack"):
        direct_logit_attribution(post, *example(post), target=3)
    gpt = make["gpt"]().train()
    with pytest.raises(ValueError, match="eval mode"):
        direct_logit_attribution(gpt, *example(gpt), target=3)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        direct_logit_attribution(gpt.eval(), *example(gpt), target=10**6)


def test_plot_logit_lens(make: Any, example: Any, tmp_path: Any) -> None:
    pytest.importorskip("matplotlib")
    from attnlab.viz import plot_logit_lens

    model = make["gpt"]()
    (x,) = example(model, B=1, T=4)
    lens = logit_lens(model, x)
    fig = plot_logit_lens(lens, tokens=list("abcd"), path=tmp_path / "lens.png")
    data = torch.as_tensor(fig.axes[0].images[0].get_array().data)
    probs = lens.probs()[:, 0]
    final = probs[-1].argmax(-1)
    assert torch.allclose(data, probs[:, torch.arange(4), final])
    assert torch.allclose(data[-1], probs[-1].max(-1).values)  # last row: the prediction itself
