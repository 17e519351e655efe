"""Label leakage scores (Li et al., ICLR 2022) against hand-built gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vflink.attacks import AttackView, get_attack
from vflink.attacks.label_leakage import direction_scores, explain_auc, norm_scores
from vflink.errors import ConfigError
from vflink.metrics.attacks import grouped_auc
from vflink.metrics.functional import auc


def sigmoid_gradients(n: int, batches: int, seed: int = 0
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """g_i = (p_i − y_i)·J with a shared Jacobian J per batch and small p (a skewed task)."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.1).astype(np.int64)
    batch = np.repeat(np.arange(batches), n // batches)
    p = rng.uniform(0.02, 0.2, size=n)
    jac = rng.normal(size=(batches, 8))[batch] + 0.05 * rng.normal(size=(n, 8))
    return (p - y)[:, None] * jac, y, batch


def test_norm_and_direction_scores_separate_the_classes() -> None:
    g, y, batch = sigmoid_gradients(2000, 10)
    assert grouped_auc(y, norm_scores(g), batch)[0] == pytest.approx(1.0)
    assert grouped_auc(y, direction_scores(g, batch), batch)[0] == pytest.approx(1.0)


@given(st.integers(min_value=2, max_value=30), st.integers(min_value=0, max_value=10_000))
def test_grouped_auc_is_the_size_weighted_mean_of_per_group_aucs(n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=3 * n)
    s = rng.normal(size=3 * n)
    g = np.repeat([0, 1, 2], n)
    expected, weight = 0.0, 0
    for k in range(3):
        a = auc(y[g == k], s[g == k])
        if not math.isnan(a):
            expected += a * n
            weight += n
    value, used = grouped_auc(y, s, g)
    if weight:
        assert value == pytest.approx(expected / weight)
        assert used == weight // n
    else:
        assert math.isnan(value)


def test_attack_scores_against_truth_by_row_id() -> None:
    g, y, batch = sigmoid_gradients(400, 4, seed=1)
    ids = np.arange(400)[::-1].copy()  # secondary rows, in any order
    view = AttackView(party="bank", role="secondary", ids=ids, gradients=g,
                      extra={"batch": batch})
    order = np.argsort(ids)
    truth = {"labels__rows": ids[order], "labels__values": y[order]}
    result = get_attack("label-norm").evaluate(view, truth)
    assert result.metrics["auc"] == pytest.approx(1.0)
    assert result.metrics["rows"] == 400
    assert "practically visible" in result.explanation
    with pytest.raises(ConfigError, match="labels"):
        get_attack("label-norm").evaluate(view, {})


def test_missing_gradients_name_the_fix() -> None:
    with pytest.raises(ConfigError, match="record = true"):
        get_attack("label-direction").infer(AttackView(party="bank", role="secondary"))


def test_explanations_are_plain_sentences() -> None:
    assert "no measurable leak" in explain_auc(0.5, "X", "labels")
    # 0.39 is as far from chance as 0.61, and said so
    low, high = explain_auc(0.39, "X", "labels"), explain_auc(0.61, "X", "labels")
    assert "guessing" not in low and "a small leak" in low and "a small leak" in high
    assert "inverted" in low and "0.61" in low and "inverted" not in high
    assert "no AUC" in explain_auc(float("nan"), "X", "labels")
