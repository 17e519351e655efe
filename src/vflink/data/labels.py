"""Label encoding for the primary party's task, and the matching loss and output transform."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import torch
from torch.nn import functional as F

from vflink.errors import DataError
from vflink.types import Task

__all__ = ["LABEL_CODEC_VERSION", "LabelCodec"]

#: Version of :meth:`LabelCodec.to_json`'s format.
LABEL_CODEC_VERSION = 1
_FORMAT = "vflink-label-codec"


class LabelCodec:
    """Maps labels to training targets and model outputs back to scores.

    Classification labels become class indices (classes from all labels, sorted). Regression
    labels are standardised with the mean and standard deviation of the *training* rows, and
    predictions are mapped back to label units.
    """

    def __init__(self, task: Task) -> None:
        self.task = task
        self.classes: list[object] = []
        self.mean = 0.0
        self.std = 1.0

    def fit(self, labels: pd.Series, train_rows: npt.NDArray[np.int64]) -> LabelCodec:
        if self.task.is_classification:
            self.classes = sorted(pd.unique(labels).tolist(), key=lambda v: (str(type(v)), v))
            if self.task is Task.BINARY and len(self.classes) != 2:
                raise DataError(f"binary task needs 2 classes, got {len(self.classes)}")
        else:
            y = labels.to_numpy(dtype=np.float64)[train_rows]
            self.mean = float(y.mean())
            std = float(y.std())
            self.std = std if std > 0 else 1.0
        return self

    def to_json(self) -> dict[str, Any]:
        """The fitted codec as a versioned JSON-able dict (see :meth:`from_json`)."""
        classes = [c.item() if isinstance(c, np.generic) else c for c in self.classes]
        bad = [c for c in classes if not isinstance(c, (str, int, float, bool))]
        if bad:
            raise DataError(f"label classes must be text, numbers or booleans, got {bad[:3]}")
        return {"format": _FORMAT, "version": LABEL_CODEC_VERSION, "task": self.task.value,
                "classes": classes, "mean": self.mean, "std": self.std}

    @classmethod
    def from_json(cls, data: Any, *, source: str = "state file") -> LabelCodec:
        """Rebuild a codec from :meth:`to_json`'s output; a clear :class:`DataError` for
        another format version or a malformed dict."""
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise DataError(f"{source}: no fitted label codec")
        if data.get("version") != LABEL_CODEC_VERSION:
            raise DataError(f"{source}: label codec saved in format version "
                            f"{data.get('version')!r}; this vflink reads {LABEL_CODEC_VERSION}")
        try:
            codec = cls(Task.parse(data["task"]))
            codec.classes = list(data["classes"])
            codec.mean, codec.std = float(data["mean"]), float(data["std"])
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{source}: malformed label codec ({exc})") from None
        return codec

    @property
    def out_dim(self) -> int:
        return len(self.classes) if self.task is Task.MULTICLASS else 1

    def encode(self, labels: pd.Series) -> torch.Tensor:
        if self.task.is_classification:
            lookup = {c: i for i, c in enumerate(self.classes)}
            idx = np.array([lookup[v] for v in labels.tolist()], dtype=np.int64)
            if self.task is Task.BINARY:
                return torch.from_numpy(idx.astype(np.float32))
            return torch.from_numpy(idx)
        y = (labels.to_numpy(dtype=np.float64) - self.mean) / self.std
        return torch.from_numpy(y.astype(np.float32))

    def targets(self, labels: pd.Series) -> npt.NDArray[np.generic]:
        """Targets in metric units: class indices, or raw regression values."""
        if self.task.is_classification:
            return self.encode(labels).numpy().astype(np.int64)
        return labels.to_numpy(dtype=np.float64)

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.task is Task.BINARY:
            return F.binary_cross_entropy_with_logits(logits.squeeze(-1), target)
        if self.task is Task.MULTICLASS:
            return F.cross_entropy(logits, target)
        return F.mse_loss(logits.squeeze(-1), target)

    def scores(self, logits: torch.Tensor) -> npt.NDArray[np.float64]:
        """P(class 1) (binary), class probabilities (multi-class) or predictions (regression)."""
        with torch.no_grad():
            if self.task is Task.BINARY:
                out = torch.sigmoid(logits.squeeze(-1))
            elif self.task is Task.MULTICLASS:
                out = torch.softmax(logits, dim=-1)
            else:
                out = logits.squeeze(-1) * self.std + self.mean
        return out.double().numpy()
