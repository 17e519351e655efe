"""Task metrics as pure functions (torchmetrics ``functional`` style)."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from sklearn import metrics as skm

from vflink.types import Task

__all__ = ["METRICS", "SELECTION", "THRESHOLDS", "accuracy", "auc", "choose_threshold",
           "decision_metrics", "evaluate", "higher_is_better", "log_loss", "primary_metric", "r2",
           "rmse", "selection_metric"]

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


def log_loss(y_true: npt.ArrayLike, scores: npt.ArrayLike) -> float:
    """Mean cross-entropy of the scores (P(class 1) ``(n,)``, or class scores ``(n, c)``
    normalised per row), probabilities clipped to [1e-15, 1 − 1e-15]."""
    y = np.asarray(y_true, dtype=np.int64)
    s = np.asarray(scores, dtype=np.float64)
    if len(y) == 0:
        return math.nan
    eps = 1e-15
    if s.ndim == 2:
        p = np.clip(s / np.maximum(s.sum(axis=1, keepdims=True), eps), eps, 1 - eps)
        return float(-np.mean(np.log(p[np.arange(len(y)), y])))
    p = np.clip(s, eps, 1 - eps)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def rmse(y_true: npt.ArrayLike, y_pred: npt.ArrayLike) -> float:
    d = np.asarray(y_true, dtype=np.float64) - np.asarray(y_pred, dtype=np.float64)
    return float(np.sqrt(np.mean(d * d)))


def r2(y_true: npt.ArrayLike, y_pred: npt.ArrayLike) -> float:
    return float(skm.r2_score(np.asarray(y_true, dtype=np.float64),
                              np.asarray(y_pred, dtype=np.float64)))


METRICS = {"accuracy": accuracy, "auc": auc, "log_loss": log_loss, "rmse": rmse, "r2": r2}

#: ``training.select``: what model selection and early stopping watch on validation
SELECTION = ("auto", "accuracy", "auc", "log-loss", "rmse", "r2")
#: ``training.threshold`` criteria (or a fixed probability)
THRESHOLDS = ("f1", "balanced-accuracy")


def evaluate(task: Task, y_true: npt.ArrayLike, scores: npt.ArrayLike) -> dict[str, float]:
    """All metrics that apply to ``task``: accuracy and AUC, or RMSE and R²."""
    if task.is_classification:
        return {"accuracy": accuracy(y_true, scores), "auc": auc(y_true, scores)}
    return {"rmse": rmse(y_true, scores), "r2": r2(y_true, scores)}


def primary_metric(task: Task) -> str:
    """The headline metric of tables and summaries (FedSim §6 reports these)."""
    return "accuracy" if task.is_classification else "rmse"


def selection_metric(task: Task, select: str = "auto") -> str:
    """The validation metric model selection and early stopping watch (a key of
    :func:`evaluate`'s dict, ``log_loss`` included on request). ``"auto"``: AUC for a binary
    task, where accuracy rewards predicting the majority class (on an 8 % positive task the
    first epoch, which predicts no positive, scores 92 % and is kept); accuracy for
    multi-class; RMSE for regression. Raises ``ValueError`` for a metric the task lacks."""
    if select == "auto":
        return {Task.BINARY: "auc", Task.MULTICLASS: "accuracy"}.get(task, "rmse")
    metric = select.replace("-", "_")
    classification = metric in ("accuracy", "auc", "log_loss")
    if metric not in METRICS or classification != task.is_classification:
        raise ValueError(f"`training.select = \"{select}\"` does not apply to a "
                         f"{task.value} task: use "
                         + ("\"auto\", \"accuracy\", \"auc\" or \"log-loss\""
                            if task.is_classification else "\"auto\", \"rmse\" or \"r2\""))
    return metric


def higher_is_better(metric: str) -> bool:
    return metric not in ("rmse", "log_loss")


def decision_metrics(y_true: npt.ArrayLike, scores: npt.ArrayLike, threshold: float
                     ) -> dict[str, float]:
    """A binary classifier's figures when it predicts positive for P(class 1) ≥ ``threshold``:
    accuracy, balanced accuracy, precision, recall, F1 and the share predicted positive."""
    y = np.asarray(y_true, dtype=np.int64)
    pred = np.asarray(scores, dtype=np.float64) >= threshold
    pos = y == 1
    tp, fp = int((pred & pos).sum()), int((pred & ~pos).sum())
    fn, tn = int((~pred & pos).sum()), int((~pred & ~pos).sum())
    recall = tp / (tp + fn) if tp + fn else math.nan
    specificity = tn / (tn + fp) if tn + fp else math.nan
    precision = tp / (tp + fp) if tp + fp else math.nan
    return {"accuracy": (tp + tn) / len(y) if len(y) else math.nan,
            "balanced_accuracy": (recall + specificity) / 2,
            "precision": precision, "recall": recall,
            "f1": 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else math.nan,
            "predicted_positive": float(pred.mean()) if len(y) else math.nan}


def choose_threshold(y_true: npt.ArrayLike, scores: npt.ArrayLike,
                     criterion: str | float = "f1") -> float:
    """The probability threshold that maximises ``criterion`` (``"f1"`` or
    ``"balanced-accuracy"``, i.e. Youden's J) on these labels and scores, among the scores
    themselves (predict positive at or above it); a number is returned as it is. 0.5 when
    the labels hold one class only (nothing to choose from)."""
    if not isinstance(criterion, str):
        return float(criterion)
    if criterion not in THRESHOLDS:
        raise ValueError(f"threshold criterion must be one of {', '.join(THRESHOLDS)} or a "
                         f"probability, got {criterion!r}")
    y = np.asarray(y_true, dtype=np.int64)
    s = np.asarray(scores, dtype=np.float64)
    n_pos = int((y == 1).sum())
    n_neg = len(y) - n_pos
    if n_pos == 0 or n_neg == 0:
        return 0.5
    order = np.argsort(-s, kind="stable")
    s_sorted, y_sorted = s[order], y[order]
    tp = np.cumsum(y_sorted == 1)
    fp = np.cumsum(y_sorted == 0)
    last = np.r_[s_sorted[1:] != s_sorted[:-1], True]  # the last of each run of ties
    tp, fp, cut = tp[last], fp[last], s_sorted[last]
    if criterion == "f1":
        value = 2 * tp / (2 * tp + fp + (n_pos - tp))
    else:
        value = tp / n_pos - fp / n_neg
    return float(cut[int(np.argmax(value))])
