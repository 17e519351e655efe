"""Selection metric, log-loss and the decision threshold, against brute force and scikit-learn."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn import metrics as skm

from vflink.metrics.functional import (
    choose_threshold,
    decision_metrics,
    higher_is_better,
    log_loss,
    selection_metric,
)
from vflink.types import Task


def test_selection_watches_auc_on_a_binary_task_by_default() -> None:
    assert selection_metric(Task.BINARY) == "auc"
    assert selection_metric(Task.MULTICLASS) == "accuracy"
    assert selection_metric(Task.REGRESSION) == "rmse"
    assert selection_metric(Task.BINARY, "log-loss") == "log_loss"
    assert selection_metric(Task.BINARY, "accuracy") == "accuracy"
    assert selection_metric(Task.REGRESSION, "r2") == "r2"
    with pytest.raises(ValueError, match="regression task"):
        selection_metric(Task.REGRESSION, "auc")
    with pytest.raises(ValueError, match="binary task"):
        selection_metric(Task.BINARY, "rmse")
    assert not higher_is_better("log_loss") and not higher_is_better("rmse")
    assert higher_is_better("auc")


def test_log_loss_is_scikit_learns() -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    p = rng.random(200)
    assert log_loss(y, p) == pytest.approx(skm.log_loss(y, p))
    yc = rng.integers(0, 3, 200)
    pc = rng.dirichlet(np.ones(3), 200)
    assert log_loss(yc, pc) == pytest.approx(skm.log_loss(yc, pc, labels=[0, 1, 2]))
    assert math.isnan(log_loss([], []))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 8)), min_size=2, max_size=25))
def test_the_threshold_is_the_best_one_by_brute_force(pairs: list[tuple[int, int]]) -> None:
    y = np.array([a for a, _ in pairs])
    s = np.array([b / 8 for _, b in pairs])  # ties on purpose
    for criterion, key in (("f1", "f1"), ("balanced-accuracy", "balanced_accuracy")):
        t = choose_threshold(y, s, criterion)
        if y.min() == y.max():
            assert t == 0.5
            continue
        best = max(np.nan_to_num(decision_metrics(y, s, c)[key], nan=-1.0)
                   for c in np.unique(s))
        assert decision_metrics(y, s, t)[key] == pytest.approx(best)
        assert t in set(s.tolist())


def test_decision_figures_are_scikit_learns() -> None:
    rng = np.random.default_rng(1)
    y = (rng.random(300) < 0.1).astype(int)
    s = np.clip(0.3 * y + rng.random(300) * 0.7, 0, 1)
    t = 0.4
    pred = (s >= t).astype(int)
    d = decision_metrics(y, s, t)
    assert d["precision"] == pytest.approx(skm.precision_score(y, pred))
    assert d["recall"] == pytest.approx(skm.recall_score(y, pred))
    assert d["f1"] == pytest.approx(skm.f1_score(y, pred))
    assert d["balanced_accuracy"] == pytest.approx(skm.balanced_accuracy_score(y, pred))
    assert d["accuracy"] == pytest.approx(skm.accuracy_score(y, pred))
    assert d["predicted_positive"] == pytest.approx(pred.mean())
    # a rare label and a model that scores every record low: 0.5 predicts no positive, the
    # chosen threshold does
    low = 0.05 + 0.1 * y + 0.01 * rng.random(300)
    assert decision_metrics(y, low, 0.5)["predicted_positive"] == 0.0
    chosen = choose_threshold(y, low, "f1")
    assert decision_metrics(y, low, chosen)["f1"] == pytest.approx(1.0)
    assert choose_threshold(y, low, 0.3) == 0.3
    with pytest.raises(ValueError, match="criterion"):
        choose_threshold(y, low, "youden")
