"""Fashion-MNIST cut into left and right halves (VFL-AFE §4.1's image setting).

VFL-AFE cuts MNIST and CIFAR-10 images into halves held by different parties ("to simulate
multi-views"); we do the same with Fashion-MNIST (Xiao et al. 2017, MIT licence), with an exact
shared key ``id`` and pixels scaled to [0, 1]. ``layout = "label-only"`` is the paper's
setting (§4.1: "the active party and 2 passive parties"; the active party only aggregates):
the primary ``labels`` holds the label (10 classes), the secondaries ``left`` and ``right`` the
left and right 28×14 pixels. ``layout = "halves"``: the primary ``left`` holds the left half
and the label, the secondary ``right`` the right half.

The images are not shipped with vflink (31 MB) and never downloaded: they come from Debian's
``dataset-fashion-mnist`` package (``apt-get install dataset-fashion-mnist``), which installs the
IDX files under ``/usr/share/datasets/fashion-mnist``; ``root`` (or ``$VFLINK_FASHION_MNIST``)
points elsewhere.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from vflink._checks import check_choice, raise_if
from vflink.data.schema import PartySchema
from vflink.datasets._base import (
    VFLDataset,
    check_max_rows,
    check_seed,
    register_dataset,
    seed_streams,
    table,
    truth_index,
)
from vflink.datasets.synthetic import record_ids
from vflink.errors import DataError
from vflink.types import Task

__all__ = ["DEFAULT_ROOT", "FashionMnistOptions", "load_fashion_mnist", "read_idx",
           "read_images"]

DEFAULT_ROOT = Path("/usr/share/datasets/fashion-mnist")
PACKAGE = "dataset-fashion-mnist"
KEY, LABEL = "id", "label"
SIDE, WIDTH = 28, 14
CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Ankle boot")
_FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
          "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}
# IDX type codes (http://yann.lecun.com/exdb/mnist/, "THE IDX FILE FORMAT")
_IDX_TYPES: dict[int, np.dtype[Any]] = {
    0x08: np.dtype(np.uint8), 0x09: np.dtype(np.int8), 0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def read_idx(path: Path) -> npt.NDArray[np.generic]:
    """Parse an IDX file (optionally gzip-compressed) into an array of its declared shape."""
    path = Path(path)
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise DataError(f"{path}: not found. Fashion-MNIST comes from the Debian package "
                        f"{PACKAGE!r} (apt-get install {PACKAGE}), or set the dataset option "
                        "`root` / $VFLINK_FASHION_MNIST to a folder with its IDX files") from None
    except OSError as exc:
        raise DataError(f"{path}: unreadable IDX file ({exc})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise DataError(f"{path}: not an IDX file (bad magic number)")
    dtype, ndim = _IDX_TYPES[raw[2]], raw[3]
    header = 4 + 4 * ndim
    dims = tuple(int(d) for d in np.frombuffer(raw[4:header], dtype=">u4"))
    count = int(np.prod(dims)) if dims else 0
    if len(raw) != header + count * dtype.itemsize:
        raise DataError(f"{path}: IDX file has {len(raw) - header} data bytes, its header "
                        f"declares {count * dtype.itemsize}")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)


def read_images(root: Path, subset: str) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """Images (n, 28, 28) uint8 and labels (n,) of ``subset`` ("train", "test" or "all")."""
    parts = ("train", "test") if subset == "all" else (subset,)
    images, labels = [], []
    for part in parts:
        image_file, label_file = _FILES[part]
        x = read_idx(root / image_file)
        y = read_idx(root / label_file)
        if x.ndim != 3 or x.shape[1:] != (SIDE, SIDE) or y.shape != (x.shape[0],):
            raise DataError(f"{root}: {part} images {x.shape} and labels {y.shape} are not "
                            "Fashion-MNIST's (n, 28, 28) and (n,)")
        images.append(np.asarray(x, dtype=np.uint8))
        labels.append(np.asarray(y, dtype=np.int64))
    return np.concatenate(images), np.concatenate(labels)


def pixel_columns(side: str) -> tuple[str, ...]:
    """Column names of one half: ``l_r00c00`` ... (row, column within the half)."""
    return tuple(f"{side}_r{r:02d}c{c:02d}" for r in range(SIDE) for c in range(WIDTH))


@dataclass(frozen=True, kw_only=True)
class FashionMnistOptions:
    """Options of "fashion-mnist".

    Attributes:
        layout: "label-only" (labels | left | right) or "halves" (left + labels | right).
        subset: "train" (60,000 images), "test" (10,000) or "all" (70,000).
        max_rows: keep a random subset of this many images (``None``: all of ``subset``).
        root: folder with the IDX files (default ``$VFLINK_FASHION_MNIST`` or
            ``/usr/share/datasets/fashion-mnist``).
        seed: seeds the subset, the record ids and the secondary's row order.
    """

    layout: str = "label-only"
    subset: str = "train"
    max_rows: int | None = None
    root: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_choice(problems, "layout", self.layout, ("label-only", "halves"))
        check_choice(problems, "subset", self.subset, ("train", "test", "all"))
        check_max_rows(problems, self.max_rows)
        if self.root is not None and not isinstance(self.root, str):
            problems.append(f"`root` must be a folder path, got {self.root!r}")
        check_seed(problems, self.seed)
        raise_if(problems, "FashionMnistOptions")


def load_fashion_mnist(options: FashionMnistOptions) -> VFLDataset:
    """Build "fashion-mnist" (see the module docstring)."""
    name = "fashion-mnist"
    root = Path(options.root or os.environ.get("VFLINK_FASHION_MNIST") or DEFAULT_ROOT)
    images, labels = read_images(root, options.subset)
    subset_rng, entity_rng, shuffle_rng = seed_streams(options.seed, 3)
    if options.max_rows is not None and options.max_rows < len(images):
        keep = np.sort(subset_rng.choice(len(images), size=options.max_rows, replace=False))
        images, labels = images[keep], labels[keep]
    n = len(images)
    pixels = images.astype(np.float32) / 255.0
    ids = record_ids(n, entity_rng)
    left = pd.DataFrame(pixels[:, :, :WIDTH].reshape(n, -1), columns=list(pixel_columns("l")))
    right = pd.DataFrame(pixels[:, :, WIDTH:].reshape(n, -1), columns=list(pixel_columns("r")))
    left.insert(0, KEY, ids)
    right.insert(0, KEY, ids)
    all_rows = np.arange(n, dtype=np.int64)
    halves = {"left": (left, pixel_columns("l")), "right": (right, pixel_columns("r"))}
    if options.layout == "halves":
        left[LABEL] = labels
        primary = table(PartySchema(name="left", role="primary", key=(KEY,), label=LABEL,
                                    task=Task.MULTICLASS, numeric=pixel_columns("l")), left, name)
        del halves["left"]
    else:
        frame = pd.DataFrame({KEY: ids, LABEL: labels})
        primary = table(PartySchema(name="labels", role="primary", key=(KEY,), label=LABEL,
                                    task=Task.MULTICLASS), frame, name)
    secondaries, truth = [], []
    for party, (frame, columns) in halves.items():
        order = shuffle_rng.permutation(n)  # each secondary lists the images in its own order
        schema = PartySchema(name=party, role="secondary", key=(KEY,), numeric=columns)
        secondaries.append(table(schema, frame.iloc[order], name))
        truth.append(truth_index(all_rows, order.astype(np.int64)))
    description = (f"Fashion-MNIST ({options.subset}, {n} images; Xiao et al. 2017, MIT) cut "
                   f"into 28x14 halves as in VFL-AFE §4.1, layout {options.layout!r}: label "
                   f"(10 classes) at {primary.name!r}, pixels at "
                   f"{', '.join(t.name for t in secondaries)}; exact key 'id'.")
    return VFLDataset(name=name, primary=primary, secondaries=tuple(secondaries),
                      description=description, true_secondary_index=tuple(truth))


register_dataset("fashion-mnist", FashionMnistOptions, load_fashion_mnist,
                 "Fashion-MNIST halves (10 classes): left + label vs right pixels "
                 "(Debian package dataset-fashion-mnist)")
