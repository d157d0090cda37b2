"""CIFAR-10: the shared arrays (shapes, balance, checksum, statistics), the stratified split, path
resolution, and the download path on a small fake archive (checksums, the restricted unpickler)."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import struct
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import attnlab.io as attnlab_io
from attnlab.data.cifar10 import (
    JPEG_COPY,
    MEAN,
    ORIGINAL,
    STD,
    Cifar10,
    Cifar10Arrays,
    candidate_dirs,
    find_cifar10,
    load_cifar10,
    stratified_split,
    verify_cifar10,
)
from attnlab.data.cifar10_download import download_cifar10, read_batch

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

SHARED = (
    Path(os.environ.get("ATTNLAB_DATA") or Path(__file__).resolve().parents[3] / "shared" / "data")
    / "cifar10"
)
needs_data = pytest.mark.skipif(
    not (SHARED / "train.npz").is_file(), reason=f"CIFAR-10 is not at {SHARED}"
)


@pytest.fixture(scope="module")
def arrays() -> Cifar10Arrays:
    if not (SHARED / "train.npz").is_file():
        pytest.skip(f"CIFAR-10 is not at {SHARED}")
    return load_cifar10(SHARED, download=False)


@needs_data
def test_shared_arrays_shapes_dtypes_balance_and_source(arrays: Cifar10Arrays) -> None:
    assert arrays.train_images.shape == (50000, 32, 32, 3)
    assert arrays.test_images.shape == (10000, 32, 32, 3)
    assert arrays.train_images.dtype == arrays.test_images.dtype == np.uint8
    assert arrays.train_labels.dtype == np.uint8
    assert np.bincount(arrays.train_labels).tolist() == [5000] * 10
    assert np.bincount(arrays.test_labels).tolist() == [1000] * 10
    assert arrays.source == JPEG_COPY == "CIFAR-10 (JPEG copy)"
    assert verify_cifar10(SHARED) == JPEG_COPY


@needs_data
def test_channel_statistics_match_the_published_constants(arrays: Cifar10Arrays) -> None:
    images = arrays.train_images[::5]  # 1,000 per class (the arrays are sorted by class)
    values = np.arange(256) / 255.0
    for c in range(3):  # exact moments from each channel's histogram
        hist = np.bincount(images[..., c].ravel(), minlength=256) / images[..., c].size
        mean = (hist * values).sum()
        std = np.sqrt((hist * values**2).sum() - mean**2)
        assert abs(mean - MEAN[c]) < 3e-3, (c, mean)
        assert abs(std - STD[c]) < 4e-3, (c, std)  # JPEG smooths: slightly smaller


@needs_data
def test_split_is_stratified_seeded_and_normalised(arrays: Cifar10Arrays) -> None:
    data = Cifar10(arrays, n_val=5000, seed=0)
    (xt, yt), (xv, yv), (xs, ys) = (data.split(s) for s in ("train", "val", "test"))
    assert xt.shape == (45000, 3, 32, 32) and xt.dtype == torch.uint8 and yt.dtype == torch.int64
    assert torch.bincount(yv).tolist() == [500] * 10
    assert torch.bincount(yt).tolist() == [4500] * 10
    assert xs.shape == (10000, 3, 32, 32) and xv.shape == (5000, 3, 32, 32) and len(ys) == 10000
    # NCHW is the NHWC array permuted: image 0 of test, pixel (row 3, col 5)
    assert xs[0, :, 3, 5].tolist() == arrays.test_images[0, 3, 5].tolist()
    x = data.normalize(xt[::20])  # every class (the arrays are sorted by class)
    assert x.dtype == torch.float32
    torch.testing.assert_close(x.mean(dim=(0, 2, 3)), torch.zeros(3), atol=0.05, rtol=0)
    torch.testing.assert_close(x.std(dim=(0, 2, 3)), torch.ones(3), atol=0.05, rtol=0)


def test_stratified_split_indices() -> None:
    labels = torch.arange(10).repeat_interleave(20)[torch.randperm(200)]
    train, val = stratified_split(labels, 50, seed=3)
    assert torch.bincount(labels[val]).tolist() == [5] * 10
    assert sorted(torch.cat([train, val]).tolist()) == list(range(200))
    again, _ = stratified_split(labels, 50, seed=3)
    other, _ = stratified_split(labels, 50, seed=4)
    assert torch.equal(train, again) and not torch.equal(train, other)
    with pytest.raises(ValueError, match="multiple of 10"):
        stratified_split(labels, 55, seed=0)
    with pytest.raises(ValueError, match="no training images"):
        stratified_split(labels, 200, seed=0)


def test_resolution_order_and_missing_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attnlab_io, "_checkout_data", lambda: tmp_path / "checkout")
    monkeypatch.setenv("ATTNLAB_DATA", str(tmp_path / "env"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert candidate_dirs() == [
        tmp_path / "env" / "cifar10",
        tmp_path / "checkout" / "cifar10",
        tmp_path / "home" / ".cache" / "attnlab" / "cifar10",
    ]
    assert candidate_dirs(tmp_path / "x") == [tmp_path / "x"]
    assert find_cifar10() is None
    with pytest.raises(FileNotFoundError, match="ATTNLAB_DATA"):
        load_cifar10(download=False)
    with pytest.raises(FileNotFoundError):
        load_cifar10(tmp_path / "x")  # an explicit path is never downloaded into


# -- the download path, on a fake archive in the official layout --------------------------------


class _Py2Pickler(pickle._Pickler):  # type: ignore[name-defined, misc]
    """Writes bytes as Python 2 strings and numpy's _reconstruct under its numpy-1 module name,
    as the official batches have them."""

    dispatch = pickle._Pickler.dispatch.copy()  # type: ignore[attr-defined]

    def save_bytes(self, obj: bytes) -> None:
        n = len(obj)
        if n < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([n]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", n) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_bytes

    def save_global(self, obj: Any, name: str | None = None) -> None:
        if getattr(obj, "__name__", "") == "_reconstruct":
            self.write(pickle.GLOBAL + b"numpy.core.multiarray\n_reconstruct\n")
            self.memoize(obj)
        else:
            super().save_global(obj, name)


def _py2_pickle(obj: Any) -> bytes:
    out = io.BytesIO()
    _Py2Pickler(out, protocol=2).dump(obj)
    return out.getvalue()


def _fake_archive(path: Path, n: int = 6) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    data = {}
    with tarfile.open(path, "w:gz") as tar:
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]:
            rows = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
            labels = [int(v) for v in rng.integers(0, 10, n)]
            data[name] = rows
            payload = _py2_pickle({b"batch_label": b"fake", b"labels": labels, b"data": rows})
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return data


def test_download_converts_a_checked_archive(tmp_path: Path) -> None:
    archive = tmp_path / "fake.tar.gz"
    rows = _fake_archive(archive)
    payload = archive.read_bytes()
    sha, md5 = hashlib.sha256(payload).hexdigest(), hashlib.md5(payload).hexdigest()
    with pytest.raises(ValueError, match="sha256"):
        download_cifar10(tmp_path / "bad", url=archive.as_uri(), sha256="0" * 64, md5=md5)
    assert not any((tmp_path / "bad").iterdir())  # the partial download was removed
    out = download_cifar10(tmp_path / "dl", url=archive.as_uri(), sha256=sha, md5=md5)
    loaded = load_cifar10(out)
    assert loaded.source == ORIGINAL and not (out / "cifar-10-python.tar.gz").exists()
    assert loaded.train_images.shape == (30, 32, 32, 3) and loaded.test_images.shape[0] == 6
    # row layout: 1024 red, 1024 green, 1024 blue values, each row-major
    first = rows["data_batch_1"][0]
    assert loaded.train_images[0, 2, 7].tolist() == [first[2 * 32 + 7 + 1024 * c] for c in range(3)]
    (out / "test.npz").write_bytes((out / "train.npz").read_bytes())
    with pytest.raises(ValueError, match="matches none"):
        load_cifar10(out)


def test_restricted_unpickler_refuses_other_globals(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> Any:
            return (open, (str(marker), "w"))

    with pytest.raises(pickle.UnpicklingError, match=r"global io\.open"):
        read_batch(pickle.dumps({b"data": Evil(), b"labels": []}, protocol=4))
    assert not marker.exists()
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        read_batch(pickle.dumps(np.float64(1.0)))  # numpy scalars need another global
    with pytest.raises(pickle.UnpicklingError, match=r"_codecs\.encode"):
        read_batch(pickle.dumps({b"data": b"x"}, protocol=2))  # Python 3's bytes at protocol 2
    with pytest.raises(ValueError, match="uint8"):
        read_batch(_py2_pickle({b"data": np.zeros((2, 3072), np.int16), b"labels": [0, 1]}))
    with pytest.raises(ValueError, match="one integer"):
        read_batch(_py2_pickle({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}))
