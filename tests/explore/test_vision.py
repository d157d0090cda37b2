"""The explorer's ViT view (attnlab.explore.vision): the image reaches the model as training
prepared it, the attention is attnlab.inspect's, bad images get a 4xx with a message, and the
CLI finds the data set from the run directory."""

from __future__ import annotations

import base64
import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.explore import Explorer, ImageSpec, Limits, explore_html, make_server, unpack
from attnlab.explore.vision import VisionInput
from attnlab.inspect import run_with_cache
from attnlab.models import build_model

from .conftest import exit_code


def image(shape: list[int], fill: int | None = None) -> dict[str, Any]:
    n = shape[0] * shape[1] * shape[2]
    g = torch.Generator().manual_seed(0)
    raw = (
        bytes([fill] * n)
        if fill is not None
        else bytes(torch.randint(0, 256, (n,), generator=g).tolist())
    )
    return {"shape": shape, "data": base64.b64encode(raw).decode()}


def weights(e: Explorer, vi: VisionInput) -> torch.Tensor:
    with torch.no_grad():
        _, cache = run_with_cache(e.model, vi.input, names="layers.*.attn.weights")
    return torch.stack([cache[f"layers.{i}.attn.weights"][0] for i in range(e.config.n_layers)])


def test_a_digits_sample_is_the_recipes_test_image(vit_explorer: Explorer) -> None:
    from attnlab.data.images import ArrayImageDataset, load_digits

    images, labels = load_digits()
    data = ArrayImageDataset(images, labels, test_fraction=0.2, val_fraction=0.1, seed=1)
    x, y = data.split("test")
    vi = vit_explorer.read_image(sample=5)
    assert torch.equal(vi.input, x[5:6]) and vi.label == int(y[5]) and vi.sample == 5
    # the shown pixels are the data set's 0..16 scaled to 0..255; uploading them gives back the
    # sample to the rounding of that scale (1/2 of 16/255 in the data set's units)
    up = vit_explorer.read_image(image={"shape": [8, 8, 1], "data": base64.b64encode(
        vi.pixels.numpy().tobytes()).decode()})  # fmt: skip
    raw_err = ((up.input - vi.input) * data.std).abs().max()
    assert raw_err <= 0.5 * 16 / 255 + 1e-5
    info = vit_explorer.info()["vision"]
    assert info == {"size": 8, "channels": 1, "patch": 2, "grid": 4, "dataset": "digits",
                    "classes": tuple(str(i) for i in range(10)), "n_samples": len(x),
                    "pool": "cls"}  # fmt: skip


def test_cifar_samples_are_normalised_as_in_training() -> None:
    from attnlab.data.cifar10 import Cifar10

    try:
        data = Cifar10.load(n_val=1000, download=False)
    except FileNotFoundError:
        pytest.skip("CIFAR-10 is not on this machine (../shared/data/cifar10)")
    torch.manual_seed(0)
    e = Explorer(build_model("vit-cifar", dropout=0.0, n_layers=1), name="vit-cifar")
    images, labels = data.split("test")
    vi = e.read_image(sample=7)
    assert torch.equal(vi.input, data.normalize(images[7:8])) and vi.label == int(labels[7])
    assert torch.equal(vi.pixels, images[7].permute(1, 2, 0))
    sent = {"shape": [32, 32, 3], "data": base64.b64encode(vi.pixels.numpy().tobytes()).decode()}
    assert torch.allclose(e.read_image(image=sent).input, vi.input, atol=1e-5)


@pytest.mark.parametrize("which", ["vit_explorer", "vit_rgb_explorer"])
def test_analysis_is_inspects(which: str, request: pytest.FixtureRequest) -> None:
    e: Explorer = request.getfixturevalue(which)
    spec = e.images
    assert spec is not None
    shape = [spec.size, spec.size, spec.channels]
    vi = e.read_image(image=image(shape))
    a = e.analyze(ids=vi)
    w = weights(e, vi)
    assert torch.equal(unpack(a["attention"]), w)
    T = 1 + spec.grid**2
    assert [t["text"] for t in a["tokens"]][:2] == ["[CLS]", "0,0"] and len(a["tokens"]) == T
    assert torch.equal(unpack(a["image"]), vi.pixels.float())
    with torch.no_grad():
        probs = torch.softmax(e.model(vi.input)[0], -1)
    got = {p["class"]: p["prob"] for p in a["prediction"]}
    assert got == pytest.approx({k: float(v) for k, v in enumerate(probs)}, abs=1e-7)
    assert a["prediction"][0]["class"] == int(probs.argmax())
    n = e.neuron(vi, 1, 2, 0, 3)
    assert n["weight"] == pytest.approx(float(w[1, 2, 0, 3]), abs=1e-7)
    assert n["dot"] * n["scale"] == pytest.approx(n["score"], abs=1e-5)  # no bias in a ViT
    qk = e.qk(vi)
    assert unpack(qk["self"]["scores"]).shape == (e.config.n_layers, 4, T, T)
    assert a["cost"]["flops"]["seq_len"] == T


def test_generic_images_are_scaled_to_plus_minus_one(vit_rgb_explorer: Explorer) -> None:
    vi = vit_rgb_explorer.read_image(image=image([16, 16, 3], fill=255))
    assert torch.equal(vi.input, torch.ones(1, 3, 16, 16))
    assert vit_rgb_explorer.info()["vision"]["n_samples"] == 0
    with pytest.raises(ValueError, match="no sample images"):
        vit_rgb_explorer.read_image(sample=0)


def test_bad_images_are_refused_with_what_was_expected(vit_explorer: Explorer) -> None:
    e = vit_explorer
    cases: list[tuple[dict[str, Any], str]] = [
        ({}, "exactly one of 'image' and 'sample'"),
        ({"image": image([8, 8, 1]), "sample": 1}, "exactly one"),
        ({"image": image([9, 8, 1])}, r"the image is 9x8x1; this model reads 8x8x1"),
        ({"image": image([8, 8, 3])}, r"8x8x3; this model reads 8x8x1"),
        ({"image": {"shape": [8, 8], "data": ""}}, "height, width, channels"),
        ({"image": {"shape": [8, 8, True], "data": ""}}, "image channels must be an integer"),
        ({"image": {"shape": [8, 8, 1], "data": "!!!!"}}, "not valid base64"),
        ({"image": {"shape": [8, 8, 1], "data": "AAAA"}}, "holds 3 bytes; 64 expected"),
        ({"image": {"shape": [8, 8, 1], "data": "A" * 10_000}}, "base64 characters"),
        ({"image": {"shape": [8, 8, 1], "data": 7}}, "base64 string"),
        ({"image": "pixels"}, "an object with shape and data"),
        ({"sample": 10**6}, r"sample must be an integer in \[0, 359\)"),
        ({"sample": -1}, "sample must be an integer"),
        ({"sample": "3"}, "sample must be an integer"),
    ]
    for body, message in cases:
        with pytest.raises((ValueError, TypeError), match=message):
            e.read_image(body.get("image"), body.get("sample"))
    with pytest.raises(ValueError, match="a ViT reads an image"):
        e.analyze("some text")
    with pytest.raises(ValueError, match="images are for image models"):
        Explorer(build_model("gpt-char-baby", n_layers=1, vocab_size=300)).read_image(sample=0)
    big = build_model("vit-digits", image_size=32, patch_size=2)  # 257 tokens
    with pytest.raises(ValueError, match=r"reads 257 tokens .* --max-tokens 257"):
        Explorer(big)
    assert Explorer(big, limits=Limits(max_tokens=257)).max_tokens == 257
    with pytest.raises(ValueError, match="digits images are 8x8x1; this model reads 32x32x1"):
        ImageSpec(32, 1, 2, "digits")


@pytest.fixture(scope="module")
def server(vit_explorer: Explorer) -> Iterator[tuple[str, int]]:
    srv = make_server(vit_explorer, "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield "127.0.0.1", int(srv.server_address[1])
    srv.shutdown()
    srv.server_close()


def post(addr: tuple[str, int], path: str, body: Any) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(*addr, timeout=30)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    out = resp.status, json.loads(resp.read())
    conn.close()
    return out


def test_server_answers_images_and_refuses_bad_ones(
    server: tuple[str, int], vit_explorer: Explorer
) -> None:
    status, a = post(server, "/api/analyze", {"sample": 3})
    assert status == 200 and a["sample"] == 3
    assert torch.equal(
        unpack(a["attention"]), weights(vit_explorer, vit_explorer.read_image(sample=3))
    )
    status, n = post(
        server, "/api/neuron", {"sample": 3, "layer": 0, "head": 1, "query": 0, "key": 2}
    )
    assert status == 200 and n == vit_explorer.neuron(vit_explorer.read_image(sample=3), 0, 1, 0, 2)
    status, a = post(server, "/api/analyze", {"image": image([8, 8, 1])})
    assert status == 200 and a["sample"] is None and a["label"] is None
    for path, body, message in [
        ("/api/analyze", {"image": image([16, 16, 1])}, "the image is 16x16x1"),
        ("/api/analyze", {"text": "hello"}, "a ViT reads an image"),
        ("/api/analyze", {"sample": 9999}, "sample must be an integer"),
        ("/api/neuron", {"sample": 0, "layer": 9, "head": 0, "query": 0, "key": 0}, "layer must"),
        ("/api/next", {"sample": 0}, "for language models, not vit"),
        ("/api/step", {"sample": 0}, "for language models, not vit"),
        ("/api/lens", {"sample": 0}, "for language models, not vit"),
        ("/api/translate", {"sample": 0}, "encoder-decoder models, not vit"),
    ]:
        status, err = post(server, path, body)
        assert status == 400 and message in err["error"], (path, err)
    status, err = post(server, "/api/analyze", b"{" + b" " * (2 * 65536) + b"}")
    assert status == 413


def test_static_export_of_a_vit(vit_explorer: Explorer) -> None:
    html = explore_html(vit_explorer, sample=4)
    assert 'id="explore-data"' in html and '"sample":4' in html
    with pytest.raises(ValueError, match="give image or sample, not text"):
        explore_html(vit_explorer, "text")
    with pytest.raises(ValueError, match="exactly one"):
        explore_html(vit_explorer)


def test_cli_reads_the_runs_recipe_and_an_image_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from PIL import Image

    from attnlab.cli.explore import image_spec, load
    from attnlab.training.rundir import RunDir

    run = tmp_path / "digits-run"
    torch.manual_seed(0)
    RunDir(run).save_checkpoint(build_model("vit-digits", dropout=0.0), {"step": 1}, keep=1)
    record = {"format": "attnlab-run", "version": 1, "recipe": "digits", "train": {},
              "model": {}, "options": {"split_seed": 3, "val_fraction": 0.2}}  # fmt: skip
    (run / "run.json").write_text(json.dumps(record), encoding="utf-8")
    model, _ = load(str(run), None)
    spec = image_spec(model, str(run))
    assert spec.dataset == "digits" and spec.options == {"split_seed": 3, "val_fraction": 0.2}
    out = tmp_path / "vit.html"
    assert exit_code(["explore", str(run), "--sample", "2", "--html", str(out)]) == 0
    assert '"sample":2' in out.read_text(encoding="utf-8")
    png = tmp_path / "photo.png"
    Image.new("RGB", (30, 20), (200, 10, 10)).save(png)
    assert exit_code(["explore", str(run), "--image", str(png), "--html", str(out)]) == 0
    capsys.readouterr()
    for argv, message in [
        (["explore", str(run), "--text", "hi", "--html", str(out)], "reads an image, not text"),
        (["explore", str(run), "--html", str(out)], "--html needs --sample N or --image FILE"),
        (["explore", str(run), "--image", str(tmp_path / "none.png"), "--html", str(out)],
         "cannot read --image"),
        (["explore", "gpt-char-baby", "--sample", "1", "--html", str(out)], "are for image models"),
    ]:  # fmt: skip
        assert exit_code(argv) == 2, argv
        assert message in capsys.readouterr().err
