"""Fashion-MNIST halves: IDX parsing against hand-written files, layouts, missing package."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from vflink.datasets import load_dataset
from vflink.datasets.fashion_mnist import DEFAULT_ROOT, read_idx
from vflink.errors import DataError


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


@pytest.fixture
def fake_root(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(30, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=30).astype(np.uint8)
    for part, n in (("train", 20), ("t10k", 10)):
        sl = slice(0, 20) if part == "train" else slice(20, 30)
        _write_idx(tmp_path / f"{part}-images-idx3-ubyte.gz", images[sl])
        _write_idx(tmp_path / f"{part}-labels-idx1-ubyte.gz", labels[sl])
        assert len(images[sl]) == n
    return tmp_path, images, labels


def test_read_idx_parses_the_header_and_checks_the_size(tmp_path: Path) -> None:
    a = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    _write_idx(tmp_path / "a.gz", a)
    np.testing.assert_array_equal(read_idx(tmp_path / "a.gz"), a)
    (tmp_path / "bad").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x05abc")
    with pytest.raises(DataError, match="declares 5"):
        read_idx(tmp_path / "bad")
    (tmp_path / "magic").write_bytes(b"PK\x03\x04")
    with pytest.raises(DataError, match="magic"):
        read_idx(tmp_path / "magic")


@pytest.mark.parametrize("layout", ["label-only", "halves"])
def test_halves_rebuild_the_images(fake_root: tuple[Path, np.ndarray, np.ndarray],
                                   layout: str) -> None:
    root, images, labels = fake_root
    ds = load_dataset("fashion-mnist", root=str(root), subset="all", layout=layout, seed=1)
    names = [t.name for t in ds.secondaries]
    assert names == (["left", "right"] if layout == "label-only" else ["right"])
    assert ds.primary.schema.task.value == "multiclass" and len(ds.primary) == 30
    parts = {t.name: t for t in ds.parties}
    for j, sec in enumerate(ds.secondaries):
        truth = ds.true_secondary_index[j]  # type: ignore[index]
        assert (sec.frame["id"].to_numpy()[truth] == ds.primary.frame["id"].to_numpy()).all()
    # primary row i is image i: stitch the halves back together through the ground truth
    left = parts["left"]
    left_rows = (ds.true_secondary_index[0] if layout == "label-only"  # type: ignore[index]
                 else np.arange(30))
    right_rows = ds.true_secondary_index[-1]  # type: ignore[index]
    cols_l = list(left.schema.numeric)
    cols_r = list(parts["right"].schema.numeric)
    stitched = np.concatenate(
        [left.frame[cols_l].to_numpy()[left_rows].reshape(30, 28, 14),
         parts["right"].frame[cols_r].to_numpy()[right_rows].reshape(30, 28, 14)], axis=2)
    np.testing.assert_allclose(stitched, images / 255.0, atol=1e-6)
    np.testing.assert_array_equal(ds.primary.frame["label"].to_numpy(), labels)


def test_subset_and_max_rows(fake_root: tuple[Path, np.ndarray, np.ndarray]) -> None:
    root, _, _ = fake_root
    assert len(load_dataset("fashion-mnist", root=str(root)).primary) == 20
    assert len(load_dataset("fashion-mnist", root=str(root), subset="test").primary) == 10
    assert len(load_dataset("fashion-mnist", root=str(root), max_rows=12).primary) == 12


def test_a_missing_package_names_it(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        load_dataset("fashion-mnist", root=str(tmp_path / "nowhere"))


@pytest.mark.skipif(not (DEFAULT_ROOT / "t10k-images-idx3-ubyte.gz").exists(),
                    reason="Debian package dataset-fashion-mnist is not installed")
def test_the_installed_package_loads() -> None:
    ds = load_dataset("fashion-mnist", subset="test", max_rows=500)
    assert len(ds.primary) == 500 and len(ds.secondaries[0].schema.numeric) == 28 * 14
    assert set(ds.primary.frame["label"]) <= set(range(10))
