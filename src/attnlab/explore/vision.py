"""The explorer's ViT view: an image in; its patches as tokens, the attention of any query (the
[CLS] token first) over the patch grid, attention rollout's row and the class prediction out.

An image reaches the model in one of two ways:

- ``{"sample": N}``: image ``N`` of the test split of the data set the model was trained on
  (scikit-learn's 8x8 digits or CIFAR-10's official test set), prepared exactly as training
  prepared it (the digits recipe's train-split statistics; CIFAR-10's channel mean and std);
- ``{"image": {"shape": [H, W, C], "data": base64}}``: uint8 pixels (row-major ``H x W x C``, an
  upload the page has cropped and scaled to the model's size), scaled to ``[0, 1]`` (digits: to
  the data set's ``0..16``) and normalised the same way.

:class:`ImageSpec` says which data set a model's images come from: the run directory's recipe
(``digits``, ``cifar10``), else the shape (8x8x1: digits, 32x32x3: CIFAR-10), else none (pixels
scaled to ``[0, 1]`` and normalised with mean = std = 0.5, the usual ViT preprocessing; no
samples, uploads only).

The overlay is the same ``layers.L.attn.weights`` hook point the head view draws: row ``q`` of
head ``h`` restricted to the patch keys, on the ``(H/P, W/P)`` grid. A mean-pooled ViT (the digits
recipe's) classifies the mean of the patch outputs rather than [CLS]: ``info()["pool"]`` says
which, and the page offers the mean over patch queries too.

Shapes: L layers, H heads, T = 1 + P tokens ([CLS] first), P = (size / patch)^2 patches.
"""

from __future__ import annotations

import base64
import binascii
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from attnlab.explore.common import ExplorerState, check_int, pack
from attnlab.explore.cost import cost_panel
from attnlab.models.family import ImageShape, family_of
from attnlab.viz.capture import attention_rollout

DIGITS_CLASSES = tuple(str(i) for i in range(10))


def _image_shape(config: Any) -> ImageShape:
    """An image classifier's input shape, as its family declares it for the explorer."""
    family = family_of(config, what="the explorer's image view")
    spec = family.explorer
    if spec is None or spec.images is None:
        raise TypeError(f"{type(config).__name__}: its family declares no image view")
    return spec.images(config)


DATASETS = ("digits", "cifar10")


@dataclass(frozen=True)
class VisionInput:
    """One image as the model reads it.

    Attributes:
        pixels: ``(H, W, C)`` uint8, what the page shows.
        input: ``(1, C, H, W)`` float32, what the model reads.
        label: the data set's class of a sample, else ``None``.
        sample: the sample's index in the test split, else ``None``.
    """

    pixels: Tensor
    input: Tensor
    label: int | None = None
    sample: int | None = None


@dataclass
class ImageSpec:
    """How a ViT's images are prepared, and where its sample images come from.

    Args:
        size, channels, patch: the model's image size (square), channels and patch size.
        dataset: ``"digits"``, ``"cifar10"`` or ``None`` (uploads only).
        options: the digits recipe's split options (``test_fraction``, ``val_fraction``,
            ``split_seed``) when they differ from the recipe's defaults.
        data_path: a directory holding CIFAR-10's ``train.npz``/``test.npz`` (default: the
            data folders of :func:`attnlab.data.cifar10.load_cifar10`).

    Raises:
        ValueError: for an unknown data set, or one whose images do not fit the model.
    """

    size: int
    channels: int
    patch: int
    dataset: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    data_path: str | None = None

    def __post_init__(self) -> None:
        shapes = {"digits": (8, 1), "cifar10": (32, 3)}
        if self.dataset is not None:
            if self.dataset not in shapes:
                raise ValueError(f"unknown image data set {self.dataset!r}; valid: {DATASETS}")
            if shapes[self.dataset] != (self.size, self.channels):
                s, c = shapes[self.dataset]
                raise ValueError(
                    f"{self.dataset} images are {s}x{s}x{c}; this model reads "
                    f"{self.size}x{self.size}x{self.channels}"
                )
        self._lock = threading.Lock()
        self._data: Any = None

    @classmethod
    def for_config(
        cls, config: Any, recipe: str | None = None, options: dict[str, Any] | None = None
    ) -> ImageSpec:
        """The spec of a ViT config, from the recipe that trained it when known (a run
        directory's ``run.json``), else from its image shape."""
        shape = _image_shape(config)
        size, channels = shape.size, shape.channels
        dataset = recipe if recipe in DATASETS else None
        if recipe is None:
            dataset = {(8, 1): "digits", (32, 3): "cifar10"}.get((size, channels))
        keep = ("test_fraction", "val_fraction", "split_seed")
        opts = {k: v for k, v in (options or {}).items() if k in keep}
        return cls(size, channels, shape.patch, dataset, opts)

    @property
    def grid(self) -> int:
        """Patches per side."""
        return self.size // self.patch

    @property
    def classes(self) -> tuple[str, ...] | None:
        """The class names of the data set, else ``None`` (the page shows class ids)."""
        if self.dataset == "digits":
            return DIGITS_CLASSES
        if self.dataset == "cifar10":
            from attnlab.data.cifar10 import CLASSES

            return tuple(CLASSES)
        return None

    # -- the data set's test split -----------------------------------------------------------

    def _load(self) -> Any:
        with self._lock:
            if self._data is None:
                if self.dataset == "digits":
                    from attnlab.data.images import ArrayImageDataset, load_digits

                    images, labels = load_digits()
                    o = {"test_fraction": 0.2, "val_fraction": 0.1, "split_seed": 1, **self.options}
                    self._data = ArrayImageDataset(
                        images, labels, test_fraction=o["test_fraction"],
                        val_fraction=o["val_fraction"], seed=o["split_seed"],
                    )  # fmt: skip
                elif self.dataset == "cifar10":
                    from attnlab.data.cifar10 import Cifar10

                    try:
                        self._data = Cifar10.load(self.data_path, n_val=1000, download=False)
                    except FileNotFoundError as e:
                        raise ValueError(
                            f"no CIFAR-10 images on this machine ({e}): upload an image instead"
                        ) from None
                else:
                    raise ValueError(
                        "this model's images come from no known data set: upload an image"
                    )
            return self._data

    def n_samples(self) -> int:
        """Images in the test split (0 without a data set; loads the data set once)."""
        if self.dataset is None:
            return 0
        try:
            return len(self._load().split("test")[1])
        except ValueError:  # the data set is not on this machine: uploads only
            return 0

    def sample(self, index: int) -> VisionInput:
        """Test image ``index``, prepared as training prepared it.

        Raises:
            ValueError: without a data set, or for an index out of range.
        """
        data = self._load()
        images, labels = data.split("test")
        check_int("sample", index, 0, len(images))
        label = int(labels[index])
        if self.dataset == "cifar10":
            raw = images[index]  # (C, H, W) uint8
            return VisionInput(raw.permute(1, 2, 0).contiguous(), data.normalize(raw[None]),
                               label, index)  # fmt: skip
        x = images[index : index + 1].float()  # (1, 1, 8, 8), normalised
        raw = x * data.std + data.mean  # the data set's 0..16
        pixels = (raw[0].permute(1, 2, 0) * 255 / 16).round().clamp(0, 255).to(torch.uint8)
        return VisionInput(pixels, x, label, index)

    # -- an uploaded image -------------------------------------------------------------------

    def to_input(self, pixels: Tensor) -> Tensor:
        """uint8 pixels ``(H, W, C)`` -> the model's input ``(1, C, H, W)`` float32."""
        x = pixels.permute(2, 0, 1)[None].to(torch.float32) / 255  # (1, C, H, W) in [0, 1]
        if self.dataset == "digits":
            data = self._load()
            return (x * 16 - data.mean) / data.std
        if self.dataset == "cifar10":
            from attnlab.data.cifar10 import MEAN, STD

            mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
            return (x - mean) / std
        return (x - 0.5) / 0.5

    def read(self, image: Any) -> VisionInput:
        """An uploaded image ``{"shape": [H, W, C], "data": base64 of H*W*C uint8}``.

        Raises:
            ValueError, TypeError: for a malformed image, or one that is not the model's size
                (naming the size it has and the size expected).
        """
        if not isinstance(image, dict):
            raise TypeError(f"'image' must be an object with shape and data, got {image!r:.80}")
        shape, data = image.get("shape"), image.get("data")
        want = [self.size, self.size, self.channels]
        if not isinstance(shape, list) or len(shape) != 3:
            raise ValueError(f"image shape must be [height, width, channels], got {shape!r:.80}")
        for name, v in zip(("height", "width", "channels"), shape, strict=True):
            check_int(f"image {name}", v, 1, 4097)
        if shape != want:
            raise ValueError(
                f"the image is {shape[0]}x{shape[1]}x{shape[2]}; this model reads "
                f"{want[0]}x{want[1]}x{want[2]} (height x width x channels)"
            )
        if not isinstance(data, str):
            raise TypeError(f"image data must be a base64 string, got {type(data).__name__}")
        n = want[0] * want[1] * want[2]
        if len(data) > 4 * (n // 3 + 1) + 4:  # refuse before decoding
            raise ValueError(f"image data has {len(data)} base64 characters; {n} pixels expected")
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("image data is not valid base64") from None
        if len(raw) != n:
            raise ValueError(f"image data holds {len(raw)} bytes; {n} expected ({want})")
        pixels = torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape(want)
        return VisionInput(pixels, self.to_input(pixels))

    def body_bytes(self) -> int:
        """The largest request body an image needs (base64 pixels and the JSON around them)."""
        return 4 * (self.size * self.size * self.channels // 3 + 1) + 4096


def read_image(spec: ImageSpec, image: Any = None, sample: Any = None) -> VisionInput:
    """Exactly one of an uploaded ``image`` and a test-split ``sample`` index.

    Raises:
        ValueError, TypeError: for neither or both, or a bad one of them.
    """
    if (image is None) == (sample is None):
        raise ValueError("give exactly one of 'image' and 'sample'")
    if sample is not None:
        if spec.dataset is None:
            raise ValueError("this model has no sample images (no known data set): upload one")
        return spec.sample(check_int("sample", sample, 0, 2**31))
    return spec.read(image)


def patch_tokens(spec: ImageSpec) -> list[dict[str, Any]]:
    """The tokens of an image: ``[CLS]`` and one per patch, named ``row,col``."""
    g = spec.grid
    return [{"id": 0, "text": "[CLS]"}] + [
        {"id": 1 + i, "text": f"{i // g},{i % g}"} for i in range(g * g)
    ]


def analyze_image(explorer: ExplorerState, spec: ImageSpec, vi: VisionInput) -> dict[str, Any]:
    """Tokens, attention ``(L, H, T, T)``, rollout ``(L, T, T)``, the image, the prediction and
    the cost panel for one image.

    Returns:
        the keys of :meth:`~attnlab.explore.data.Explorer.analyze` plus ``"image"`` (packed
        ``(H, W, C)`` pixel values 0-255), ``"grid"`` (patches per side), ``"label"``,
        ``"sample"`` and ``"prediction"`` (``[{"class", "name", "prob", "logit"}]``, most
        probable first).
    """
    c = explorer.config
    with explorer.lock:
        _, cache = explorer._run(vi, ["layers.*.attn.weights", "logits"])  # type: ignore[arg-type]
        L = c.n_layers
        w = torch.stack([cache[f"layers.{i}.attn.weights"][0] for i in range(L)]).float()
        rollout = torch.stack([attention_rollout(list(w[: i + 1])) for i in range(L)])
        logits = cache["logits"][0].float()  # (K,)
    probs = torch.softmax(logits, dim=-1)
    names = spec.classes
    order = probs.argsort(descending=True, stable=True).tolist()
    T = w.shape[-1]
    return {
        "ids": list(range(T)),
        "tokens": patch_tokens(spec),
        "attention": pack(w),
        "rollout": pack(rollout),
        "cost": cost_panel(c, T),
        "image": pack(vi.pixels.float()),
        "grid": spec.grid,
        "label": vi.label,
        "sample": vi.sample,
        "prediction": [
            {"class": k, "name": names[k] if names and k < len(names) else str(k),
             "prob": float(probs[k]), "logit": float(logits[k])}
            for k in order
        ],
    }  # fmt: skip


__all__ = ["DATASETS", "ImageSpec", "VisionInput", "analyze_image", "patch_tokens", "read_image"]
