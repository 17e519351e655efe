"""Label encoding for the primary party's task, and the matching loss and output transform."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pandas as pd
import torch
from torch.nn import functional as F

from vflink.errors import DataError
from vflink.types import Task

__all__ = ["LabelCodec"]


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
