from __future__ import annotations

import math

import numpy as np
import pytest

from vflink.metrics import accuracy, auc, evaluate, r2, rmse
from vflink.types import Task


def test_accuracy_binary_and_multiclass() -> None:
    assert accuracy([0, 1, 1, 0], [0.2, 0.7, 0.4, 0.5]) == 0.5
    assert accuracy([2, 0], [[0.1, 0.2, 0.7], [0.5, 0.4, 0.1]]) == 1.0


def test_auc_against_pairwise_definition() -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    s = rng.random(200) + 0.3 * y
    pos, neg = s[y == 1], s[y == 0]
    oracle = np.mean((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :]))
    assert auc(y, s) == pytest.approx(oracle)
    assert math.isnan(auc([1, 1], [0.2, 0.3]))


def test_rmse_and_r2_formulas() -> None:
    y = np.array([1.0, 2.0, 3.0, 4.0])
    p = np.array([1.5, 2.0, 2.5, 4.0])
    assert rmse(y, p) == pytest.approx(math.sqrt((0.25 + 0 + 0.25 + 0) / 4))
    assert r2(y, p) == pytest.approx(1 - 0.5 / 5.0)


def test_evaluate_picks_metrics_by_task() -> None:
    assert set(evaluate(Task.BINARY, [0, 1], [0.1, 0.9])) == {"accuracy", "auc"}
    assert set(evaluate(Task.REGRESSION, [0.0, 1.0], [0.1, 0.9])) == {"rmse", "r2"}
