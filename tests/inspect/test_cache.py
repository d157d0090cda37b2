"""run_with_cache: the plain forward bitwise, every point named, exact weights, bounded memory."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from attnlab.inspect import capture, hook_names, hook_points, is_hooked, run_with_cache
from attnlab.layers.attention import repeat_kv
from attnlab.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

BACKENDS = ("math", "sdpa", "chunked", "sliding_window", "linear")  # conftest's models take them
FAMILIES = ("gpt", "llama", "bert", "vit", "cct", "transformer")


def _outputs(out: Any) -> list[torch.Tensor]:
    items = out if isinstance(out, tuple) else (out,)
    return [t for t in items if isinstance(t, torch.Tensor)]


def _assert_clean(model: nn.Module) -> None:
    """Nothing of inspect is left on the model: no attribute, forward hook or wrapper."""
    assert not is_hooked(model)
    for m in model.modules():
        assert "activation_hook" not in m.__dict__
        assert not m._forward_hooks and not m._forward_pre_hooks
    assert "encode" not in model.__dict__ and "decode" not in model.__dict__


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_no_hooks_bitwise_equal_for_every_family_and_backend(
    family: str, backend: str, make: Any, example: Any
) -> None:
    model = make[family](backend)
    x = example(model)
    with torch.no_grad():
        plain = _outputs(model(*x))
        out, cache = run_with_cache(model, *x)  # every point cached, weights recomputed
    got = _outputs(out)
    assert len(got) == len(plain)
    for a, b in zip(got, plain, strict=True):
        assert torch.equal(a, b)
    names = hook_names(model)
    assert list(cache) == names  # every listed point fired once, in the listed order
    assert all(len(cache.steps(n)) == 1 for n in names)
    has_weights = any(n.endswith(".weights") for n in names)
    assert has_weights == (backend != "linear")  # linear attention forms no softmax weights
    _assert_clean(model)


@pytest.mark.parametrize("backend", ["math", "sdpa", "chunked", "sliding_window"])
@pytest.mark.parametrize("family", ["gpt", "llama", "transformer"])
def test_cached_weights_reproduce_the_backend_output(
    family: str, backend: str, make: Any, example: Any
) -> None:
    """weights @ v is the per-head output the backend computed (z), layer by layer, for self-
    and cross-attention; weights are a distribution over the keys the backend may attend."""
    model = make[family](backend)
    with torch.no_grad():
        _, cache = run_with_cache(model, *example(model), names=["*.weights", "*.v", "*.z"])
    for point in hook_points(model):
        if not point.name.endswith(".weights"):
            continue
        base = point.name.removesuffix(".weights")
        w, v, z = cache[point.name], cache[f"{base}.v"], cache[f"{base}.z"]
        v = repeat_kv(v, w.shape[1] // v.shape[1])  # (B, H, S, D)
        torch.testing.assert_close((w @ v).transpose(1, 2), z, atol=1e-6, rtol=0)
        rows = w.sum(-1)
        assert torch.all((rows - 1).abs() < 1e-5) or base.endswith("cross_attn")


def test_sliding_window_weights_follow_the_window(make: Any, example: Any) -> None:
    model = make["gpt"]("sliding_window")
    with torch.no_grad():
        _, cache = run_with_cache(model, *example(model, T=12), names="layers.0.attn.weights")
    w = cache["layers.0.attn.weights"]  # (B, H, T, T), window of 4 keys
    i, j = torch.arange(12)[:, None], torch.arange(12)[None, :]
    assert torch.all(w[..., (j > i) | (j <= i - 4)] == 0)


def test_per_head_outputs_times_w_o_sum_to_the_attention_output(make: Any, example: Any) -> None:
    model = make["llama"]()
    with torch.no_grad():
        _, cache = run_with_cache(model, *example(model), names=["*.attn.z", "*.attn.out"])
    for i, layer in enumerate(model.layers):
        attn = layer.self_attn
        z = cache[f"layers.{i}.attn.z"]  # (B, T, H, D)
        W = attn.out_proj.weight.view(attn.d_model, attn.n_heads, attn.d_head)  # (E, H, D)
        per_head = torch.einsum("bthd,ehd->hbte", z, W)  # (H, B, T, E)
        out = per_head.sum(0) + (attn.out_proj.bias if attn.out_proj.bias is not None else 0)
        err = (out - cache[f"layers.{i}.attn.out"]).abs().max()
        assert err <= 1e-6, err  # measured ~1e-7: the same products summed in another order


def test_names_select_exact_glob_predicate_and_only_those_layers_work(
    make: Any, example: Any
) -> None:
    model = make["gpt"](n_layers=3)
    x = example(model)
    _, a = run_with_cache(model, *x, names="layers.1.attn.q")
    assert list(a) == ["layers.1.attn.q"]
    _, b = run_with_cache(model, *x, names=["layers.*.resid_post", "logits"])
    assert list(b) == [
        "layers.0.resid_post",
        "layers.1.resid_post",
        "layers.2.resid_post",
        "logits",
    ]
    _, c = run_with_cache(model, *x, names=lambda n: n.startswith("layers.2.ffn"))
    assert list(c) == ["layers.2.ffn.hidden", "layers.2.ffn.out"]
    with capture(model, "layers.1.*"):  # only layer 1's modules are touched while caching it
        hooked = {n for n, m in model.named_modules() if "activation_hook" in m.__dict__}
        assert hooked == {"layers.1", "layers.1.self_attn", "layers.1.ffn"}
    with pytest.raises(ValueError, match=r"no hook point matches 'layers\.9\.\*'"):
        run_with_cache(model, *x, names="layers.9.*")
    with pytest.raises(ValueError, match="valid names include"):
        run_with_cache(model, *x, names="layers.0.attn.query")
    with pytest.raises(TypeError, match="names must be"):
        run_with_cache(model, *x, names=[3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="Linear belongs to no attnlab model family"):
        run_with_cache(nn.Linear(2, 2), torch.randn(1, 2))
    _assert_clean(model)


def test_device_dtype_and_detach(make: Any, example: Any) -> None:
    model = make["gpt"]()
    x = example(model)
    _, half = run_with_cache(model, *x, names="layers.0.*", device="cpu", dtype=torch.float16)
    _, full = run_with_cache(model, *x, names="layers.0.*")
    for name in full:
        assert half[name].dtype == torch.float16 and full[name].dtype == torch.float32
        keep = full[name] > -6e4  # masked scores (finfo(float32).min) are -inf in float16
        torch.testing.assert_close(half[name][keep].float(), full[name][keep], atol=2e-3, rtol=2e-3)
    assert torch.all(
        half["layers.0.attn.scores"][full["layers.0.attn.scores"] < -6e4] == -torch.inf
    )
    assert not full["layers.0.attn.q"].requires_grad  # detached although grad mode was on
    _, kept = run_with_cache(model, *x, names="layers.0.attn.q", detach=False)
    assert kept["layers.0.attn.q"].requires_grad


def test_errors_in_the_forward_remove_everything(make: Any) -> None:
    model = make["gpt"]()
    with pytest.raises(ValueError, match="token id"):
        run_with_cache(model, torch.tensor([[1, 10**6]]))
    _assert_clean(model)


def test_cache_api(make: Any, example: Any) -> None:
    model = make["gpt"]()
    _, cache = run_with_cache(model, *example(model), names="layers.*.resid_post")
    assert cache.stack("layers.*.resid_post").shape == (2, 2, 9, 32)  # (L, B, T, E)
    with pytest.raises(KeyError, match=r"not in the cache; cached: layers\.0\.resid_post"):
        cache["logits"]
    flat = cache.tensors()
    assert set(flat) == set(cache) and all(t.is_contiguous() for t in flat.values())
    assert cache.nbytes() == 2 * 2 * 9 * 32 * 4


def _layer_bytes(B: int, T: int, E: int, H: int, F: int) -> int:
    """fp32 bytes of one GPT layer's cached points: 8 (B, T, E) tensors (resid_pre, q, k, v,
    z, attn.out, resid_mid, ffn.out; resid_post is the next layer's resid_pre, counted once
    per layer in a stack), 2 (B, H, T, T) (scores, weights) and the (B, T, F) FFN hidden."""
    return 4 * (8 * B * T * E + 2 * B * H * T * T + B * T * F) + 4 * B * T * E


def test_memory_one_layer_of_gpt2_medium_shapes_at_1024() -> None:
    """A measured proxy: gpt2-medium's layer shapes (E=1024, H=16, F=4096) at context 1024 in a
    two-layer model with a small vocabulary (the whole of gpt2-medium does not fit this test's
    budget). The cache of ``layers.1.*`` holds exactly layer 1's tensors (its storages, measured:
    180 MiB), and no module outside layer 1 did any extra work (none was hooked), so in the
    24-layer model it is the same 180 MiB, not 24 layers' worth."""
    model = build_model(
        "gpt2-medium", n_layers=2, vocab_size=64, eos_id=None, dropout=0.0
    ).eval()  # fmt: skip
    ids = torch.randint(0, 64, (1, 1024))
    seen: set[str] = set()
    with torch.no_grad(), capture(model, "layers.1.*") as one:
        seen = {n for n, m in model.named_modules() if "activation_hook" in m.__dict__}
        model(ids)
    assert seen == {"layers.1", "layers.1.self_attn", "layers.1.ffn"}
    assert one.nbytes() == _layer_bytes(1, 1024, 1024, 16, 4096) == 180 * 2**20


def test_memory_of_the_real_gpt2_medium_on_the_meta_device() -> None:
    """Shape accounting (no allocation): the whole 24-layer gpt2-medium at context 1024 on the
    meta device; caching ``layers.5.*`` keeps one layer's 180 MiB, ``layers.*`` 24 times that
    (per name: a layer's ``resid_post`` is the next one's ``resid_pre``, stored once in a real
    run, see the test above)."""
    model = build_model("gpt2-medium", device="meta").eval()
    ids = torch.zeros(1, 1024, dtype=torch.long, device="meta")
    with torch.no_grad():
        _, one = run_with_cache(model, ids, names="layers.5.*")
        _, every = run_with_cache(model, ids, names="layers.*")
    layer = _layer_bytes(1, 1024, 1024, 16, 4096)
    assert list(one) == [n for n in hook_names(model) if n.startswith("layers.5.")]
    assert one.nbytes() == layer == 180 * 2**20
    assert every.nbytes() == 24 * layer  # 4.2 GiB for the whole stack


def test_whole_model_cache_is_n_layers_times_one(make: Any, example: Any) -> None:
    model = make["gpt"](n_layers=3)
    x = example(model, B=1, T=16)
    _, one = run_with_cache(model, *x, names="layers.1.*")
    _, every = run_with_cache(model, *x, names="layers.*")
    layer = _layer_bytes(1, 16, 32, 4, 64)
    assert one.nbytes() == layer
    assert every.nbytes() == 3 * layer - 2 * 16 * 32 * 4  # resid_post L == resid_pre L + 1


@pytest.mark.parametrize("family", FAMILIES)
def test_hook_names_table_shapes(family: str, make: Any, example: Any) -> None:
    """Each point's axes name as many dims as its tensor has."""
    model = make[family]()
    _, cache = run_with_cache(model, *example(model))
    for point in hook_points(model):
        assert cache[point.name].dim() == len(point.axes), point.name
