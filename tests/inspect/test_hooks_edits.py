"""run_with_hooks and the ready-made edits: replacements, removal on error, ablations, steering."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import Tensor

from attnlab.inspect import (
    ablate_heads,
    ablate_layers,
    ablate_neurons,
    add_hooks,
    capture,
    hooked,
    is_hooked,
    run_with_cache,
    run_with_hooks,
    steer,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _logits(out: Any) -> Tensor:
    return out[0] if isinstance(out, tuple) else out


def test_a_hook_reads_replaces_and_is_removed(make: Any, example: Any) -> None:
    model = make["gpt"]()
    x = example(model)
    plain = _logits(model(*x))
    seen: list[tuple[str, tuple[int, ...]]] = []
    out = run_with_hooks(
        model, *x, hooks={"layers.*.attn.weights": lambda t, n: seen.append((n, tuple(t.shape)))}
    )
    assert torch.equal(_logits(out), plain)  # read-only hooks change nothing
    assert seen == [
        ("layers.0.attn.weights", (2, 4, 9, 9)),
        ("layers.1.attn.weights", (2, 4, 9, 9)),
    ]
    doubled = run_with_hooks(model, *x, hooks={"layers.1.resid_post": lambda t, n: 2 * t})
    want = model.lm_head(model.final_norm(2 * run_with_cache(model, *x)[1]["layers.1.resid_post"]))
    torch.testing.assert_close(_logits(doubled), want, atol=1e-6, rtol=0)
    assert not is_hooked(model)
    assert torch.equal(_logits(model(*x)), plain)


def test_hooks_are_removed_when_the_forward_or_a_hook_raises(make: Any, example: Any) -> None:
    model = make["gpt"]()
    x = example(model)

    def boom(t: Tensor, name: str) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_with_hooks(model, *x, hooks={"layers.0.attn.q": boom})
    assert not is_hooked(model)
    with pytest.raises(ValueError, match=r"hook on 'layers.0.attn.out' returned \(2, 9\)"):
        run_with_hooks(model, *x, hooks={"layers.0.attn.out": lambda t, n: t[..., 0]})
    with pytest.raises(ValueError, match=r"returned .* torch.float64"):
        run_with_hooks(model, *x, hooks={"layers.0.attn.out": lambda t, n: t.double()})
    with pytest.raises(ZeroDivisionError), hooked(model, {"logits": lambda t, n: None}):
        1 / 0  # noqa: B018
    assert not is_hooked(model)
    with pytest.raises(TypeError, match="not callable"):
        add_hooks(model, {"logits": 3})  # type: ignore[dict-item]
    assert not is_hooked(model)


def test_nested_contexts_compose_in_order(make: Any, example: Any) -> None:
    model = make["gpt"]()
    x = example(model)
    with hooked(model, {"layers.0.ffn.out": lambda t, n: t * 0}), capture(model, "*ffn.out") as c:
        model(*x)
        with hooked(model, {"layers.1.ffn.out": lambda t, n: t + 1}):
            model(*x)
    assert torch.all(c.steps("layers.0.ffn.out")[0] == 0)  # the cache sees the edited value
    assert torch.equal(c.steps("layers.1.ffn.out")[0] + 0, c.steps("layers.1.ffn.out")[0])
    assert not is_hooked(model)


@pytest.mark.parametrize("family", ["gpt", "llama", "bert", "vit"])
def test_zero_ablating_a_head_equals_zeroing_its_slice_of_w_o(
    family: str, make: Any, example: Any
) -> None:
    model = make[family]()
    x = example(model)
    layer, head = 1, 2
    ablated = run_with_hooks(model, *x, hooks=ablate_heads(model, [(layer, head)]))
    edited = copy.deepcopy(model)
    D = edited.config.d_head
    with torch.no_grad():
        edited.layers[layer].self_attn.out_proj.weight[:, head * D : (head + 1) * D] = 0
    want = edited(*x)
    a, b = _logits(ablated), _logits(want)
    assert torch.equal(a, b)
    assert not torch.equal(a, _logits(model(*x)))  # the head mattered


def test_cross_attention_head_ablation(make: Any, example: Any) -> None:
    model = make["transformer"]()
    x = example(model)
    hooks = ablate_heads(model, [(0, 1)], stack="decoder", attention="cross_attn")
    assert list(hooks) == ["decoder.layers.0.cross_attn.z"]
    edited = copy.deepcopy(model)
    D = edited.config.d_head
    with torch.no_grad():
        edited.decoder.layers[0].cross_attn.out_proj.weight[:, D : 2 * D] = 0
    assert torch.equal(_logits(run_with_hooks(model, *x, hooks=hooks)), _logits(edited(*x)))


def test_mean_ablation_and_neurons_and_layers(make: Any, example: Any) -> None:
    model = make["gpt"]()
    x = example(model)
    _, ref = run_with_cache(model, *x, names=["layers.0.attn.z", "layers.1.ffn.hidden"])
    hooks = ablate_heads(model, [(0, 3)], mode="mean", reference=ref)
    with capture(model, "layers.0.attn.z") as c, hooked(model, hooks):
        model(*x)
    z = run_with_cache(model, *x, names="layers.0.attn.z")[1]["layers.0.attn.z"]
    mean = ref["layers.0.attn.z"][:, :, 3].mean(dim=(0, 1))  # (D,)
    assert torch.allclose(z[:, :, 3], c["layers.0.attn.z"][:, :, 3])  # the cache came first
    with capture(model, "layers.0.attn.out") as after, hooked(model, hooks):
        model(*x)
    edited_z = z.clone()
    edited_z[:, :, 3] = mean
    attn = model.layers[0].self_attn
    want = attn.out_proj(edited_z.flatten(2))
    torch.testing.assert_close(after["layers.0.attn.out"], want, atol=1e-6, rtol=0)
    # an FFN neuron: the same as zeroing its column of W_down
    edited = copy.deepcopy(model)
    with torch.no_grad():
        edited.layers[1].ffn.down_proj.weight[:, 7] = 0
    got = run_with_hooks(model, *x, hooks=ablate_neurons(model, [(1, 7)]))
    assert torch.equal(_logits(got), _logits(edited(*x)))
    # a whole attention sublayer: the same as zeroing its output projection
    with torch.no_grad():
        edited = copy.deepcopy(model)
        edited.layers[0].self_attn.out_proj.weight.zero_()
        edited.layers[0].self_attn.out_proj.bias.zero_()
    got = run_with_hooks(model, *x, hooks=ablate_layers(model, [0], part="attn"))
    assert torch.equal(_logits(got), _logits(edited(*x)))
    assert set(ablate_layers(model, [1])) == {"layers.1.attn.out", "layers.1.ffn.out"}


def test_edit_errors(make: Any) -> None:
    model = make["gpt"]()
    with pytest.raises(ValueError, match=r"heads \[4\] of layers.0.attn.z are out of range"):
        ablate_heads(model, [(0, 4)])
    with pytest.raises(ValueError, match=r"no hook point matches 'layers.5.attn.z'"):
        ablate_heads(model, [(5, 0)])
    with pytest.raises(ValueError, match=r"needs reference="):
        ablate_heads(model, [(0, 0)], mode="mean")
    with pytest.raises(ValueError, match="mode must be"):
        ablate_neurons(model, [(0, 0)], mode="half")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"neurons \[64\]"):
        ablate_neurons(model, [(0, 64)])
    with pytest.raises(ValueError, match=r"vector must be \(32,\)"):
        steer(model, 0, torch.zeros(3))
    with pytest.raises(ValueError, match="at must be one of"):
        steer(model, 0, torch.zeros(32), at="attn.out")


def test_zero_steering_changes_nothing_and_a_vector_does(make: Any, example: Any) -> None:
    model = make["gpt"]()
    x = example(model)
    plain = _logits(model(*x))
    for at in ("resid_pre", "resid_mid", "resid_post"):
        same = run_with_hooks(model, *x, hooks=steer(model, 1, torch.zeros(32), at=at))
        assert torch.equal(_logits(same), plain)
    v = torch.randn(32)
    moved = _logits(run_with_hooks(model, *x, hooks=steer(model, 1, v, positions=[-1])))
    assert torch.equal(moved[:, :-1], plain[:, :-1])  # causal: only the steered position moves
    assert not torch.equal(moved[:, -1], plain[:, -1])
    _, c = run_with_cache(model, *x, names="layers.1.resid_pre")
    with hooked(model, steer(model, 1, v, scale=2.0)), capture(model, "layers.1.resid_pre") as s:
        model(*x)
    # the cache was attached after the steering hook: it sees the steered stream
    torch.testing.assert_close(s["layers.1.resid_pre"], c["layers.1.resid_pre"] + 2 * v)
