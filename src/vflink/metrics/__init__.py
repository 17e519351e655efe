"""Metrics: task metrics (and, later, leakage metrics) as pure functions."""

from __future__ import annotations

from vflink.metrics.functional import (
    METRICS,
    accuracy,
    auc,
    evaluate,
    higher_is_better,
    primary_metric,
    r2,
    rmse,
)

__all__ = ["METRICS", "accuracy", "auc", "evaluate", "higher_is_better", "primary_metric", "r2",
           "rmse"]
