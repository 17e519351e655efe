"""Task metrics as pure functions (torchmetrics ``functional`` style)."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from sklearn import metrics as skm

from vflink.types import Task

__all__ = ["METRICS", "accuracy", "auc", "evaluate", "higher_is_better", "primary_metric", "r2",
           "rmse"]

FloatArray = npt.NDArray[np.floating]


def accuracy(y_true: npt.ArrayLike, scores: npt.ArrayLike) -> float:
    """Accuracy; ``scores`` are P(class 1) ``(n,)`` (binary) or class scores ``(n, c)``."""
    s = np.asarray(scores)
    pred = s.argmax(axis=1) if s.ndim == 2 else (s >= 0.5).astype(np.int64)
    return float(np.mean(pred == np.asarray(y_true)))


def auc(y_true: npt.ArrayLike, scores: npt.ArrayLike) -> float:
    """ROC AUC (one-vs-rest macro average for multi-class); NaN when only one class is present."""
    y = np.asarray(y_true)
    s = np.asarray(scores)
    if np.unique(y).size < 2:
        return math.nan
    if s.ndim == 2:
        n_classes = s.shape[1]
        if np.unique(y).size != n_classes:
            return math.nan
        return float(skm.roc_auc_score(y, s, multi_class="ovr", average="macro"))
    return float(skm.roc_auc_score(y, s))


def rmse(y_true: npt.ArrayLike, y_pred: npt.ArrayLike) -> float:
    d = np.asarray(y_true, dtype=np.float64) - np.asarray(y_pred, dtype=np.float64)
    return float(np.sqrt(np.mean(d * d)))


def r2(y_true: npt.ArrayLike, y_pred: npt.ArrayLike) -> float:
    return float(skm.r2_score(np.asarray(y_true, dtype=np.float64),
                              np.asarray(y_pred, dtype=np.float64)))


METRICS = {"accuracy": accuracy, "auc": auc, "rmse": rmse, "r2": r2}


def evaluate(task: Task, y_true: npt.ArrayLike, scores: npt.ArrayLike) -> dict[str, float]:
    """All metrics that apply to ``task``: accuracy and AUC, or RMSE and R²."""
    if task.is_classification:
        return {"accuracy": accuracy(y_true, scores), "auc": auc(y_true, scores)}
    return {"rmse": rmse(y_true, scores), "r2": r2(y_true, scores)}


def primary_metric(task: Task) -> str:
    """The metric used for early stopping and headline tables (FedSim §6 reports these)."""
    return "accuracy" if task.is_classification else "rmse"


def higher_is_better(metric: str) -> bool:
    return metric != "rmse"
