"""The label-inference suite on planted gradients: label-revealing rows → AUC ≈ 1, pure noise →
≈ 0.5; multi-class by accuracy; passive model completion on planted bottom outputs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vflink.attacks import AttackView, get_attack
from vflink.attacks.label_clustering import minority_scores
from vflink.attacks.label_leakage import matched_accuracy
from vflink.attacks.limits import dp_auc_ceiling
from vflink.errors import ConfigError
from vflink.privacy.ledger import Ledger
from vflink.runner.attack import with_label_verdict

CLUSTERING = ("label-kmeans", "label-spectral", "label-fcm")


def planted(n: int = 1200, batches: int = 10, *, revealing: bool = True, classes: int = 2,
            seed: int = 0) -> tuple[AttackView, dict[str, np.ndarray]]:
    """g_i = (p_i − y_i)·J_b (a shared Jacobian per batch, Li et al. §3) or pure noise;
    multi-class: (softmax − e_y)·W_b, rows of one class around one point."""
    rng = np.random.default_rng(seed)
    batch = np.repeat(np.arange(batches), n // batches)
    if classes == 2:
        y = (rng.random(n) < 0.15).astype(np.int64)
        jac = rng.normal(size=(batches, 8))[batch]
        p = rng.uniform(0.02, 0.2, size=n)
        g = (p - y)[:, None] * jac + 0.02 * rng.normal(size=(n, 8))
    else:
        y = rng.integers(0, classes, size=n)
        w = rng.normal(size=(batches, classes, 8))
        onehot = np.eye(classes)[y]
        g = np.einsum("nc,ncd->nd", 1.0 / classes - onehot, w[batch]) \
            + 0.02 * rng.normal(size=(n, 8))
    if not revealing:
        g = rng.normal(size=g.shape)
    ids = rng.permutation(n)
    view = AttackView(party="bank", role="secondary", ids=ids, gradients=g,
                      extra={"batch": batch})
    order = np.argsort(ids)
    return view, {"labels__rows": ids[order], "labels__values": y[order]}


@pytest.mark.parametrize("name", CLUSTERING)
def test_clustering_recovers_planted_labels_and_not_noise(name: str) -> None:
    view, truth = planted()
    assert get_attack(name).evaluate(view, truth).metrics["auc"] > 0.97
    noise, truth = planted(revealing=False)
    assert abs(get_attack(name).evaluate(noise, truth).metrics["auc"] - 0.5) < 0.06


@pytest.mark.parametrize("name", CLUSTERING)
def test_multiclass_is_read_by_accuracy_against_the_majority(name: str) -> None:
    view, truth = planted(900, 6, classes=3)
    result = get_attack(name).evaluate(view, truth)
    assert result.metrics["accuracy"] > 0.95 and result.metrics["majority"] < 0.45
    noise, truth = planted(900, 6, classes=3, revealing=False)
    # the oracle mapping of random groups still beats the majority a little: not by much
    assert get_attack(name).evaluate(noise, truth).metrics["accuracy"] < 0.5


def test_norm_attack_refuses_multiclass() -> None:
    view, truth = planted(300, 3, classes=3)
    with pytest.raises(ConfigError, match="binary labels"):
        get_attack("label-norm").evaluate(view, truth)


def test_minority_scores_and_matched_accuracy() -> None:
    dist = np.array([[0.0, 3.0], [1.0, 2.0], [3.0, 0.0]])
    assignment = np.array([0, 0, 1])  # group 1 is the smaller
    assert minority_scores(dist, assignment).tolist() == [-3.0, -1.0, 3.0]
    y = np.array([0, 0, 1, 1, 2, 2])
    swapped = np.array([2, 2, 0, 0, 1, 1])  # a renaming of the groups: all correct
    assert matched_accuracy(y, swapped, np.zeros(6)) == 1.0
    assert matched_accuracy(y, np.array([0, 1, 0, 1, 0, 1]), np.zeros(6)) == pytest.approx(
        2 / 6)


def test_model_completion_from_a_few_known_labels() -> None:
    rng = np.random.default_rng(0)
    n = 2000
    y = (rng.random(n) < 0.3).astype(np.int64)
    bottom = np.c_[y + 0.3 * rng.normal(size=n), rng.normal(size=(n, 3))]  # trained: separates
    raw = rng.normal(size=(n, 5))  # the features alone: nothing
    rows = np.arange(n)
    view = AttackView(party="bank", role="secondary", features=bottom,
                      extra={"feature_rows": rows, "raw_features": raw})
    truth = {"labels__rows": rows, "labels__values": y}
    result = get_attack("label-completion", known=40).evaluate(view, truth)
    assert result.metrics["auc"] > 0.95
    assert abs(result.metrics["auc_features_only"] - 0.5) < 0.06
    assert result.metrics["known"] == 40 and result.metrics["rows"] == n - 40
    shuffled = dataclasses.replace(view, features=rng.normal(size=bottom.shape))
    assert abs(get_attack("label-completion").evaluate(shuffled, truth).metrics["auc"]
               - 0.5) < 0.06
    with pytest.raises(ConfigError, match="known"):
        get_attack("label-completion", known=1)
    with pytest.raises(ConfigError, match="record = true"):
        get_attack("label-completion").evaluate(
            AttackView(party="bank", role="secondary"), truth)


def test_the_verdict_names_the_protection_and_whether_it_holds() -> None:
    view, truth = planted()
    leaky = get_attack("label-norm").evaluate(view, truth)
    off = with_label_verdict(leaky, Ledger())
    assert "no label protection" in off.explanation and "does not defeat" in off.explanation
    assert off.details["protection"] == {
        "mode": "off", "defeated": False, "within": 0.1, "leak": pytest.approx(
            max(leaky.metrics["auc"], 1 - leaky.metrics["auc"])), "leak_stderr": None,
        "limit": None, "limit_words": "no protection: nothing is promised",
        "within_limit": False}
    ledger = Ledger()
    ledger.add_protection(kind="label-dp", party="primary", applies_to="backward", params={},
                          guarantee={"epsilon": 4.0, "delta": 1e-5}, explanation="")
    noise, truth = planted(revealing=False)
    held = with_label_verdict(get_attack("label-norm").evaluate(noise, truth), ledger)
    assert "labels = dp (ε = 4" in held.explanation and "defeats this attack" in held.explanation
    assert held.details["protection"]["defeated"] is True
    # the stated limit: what (ε, δ) allows any test of one record's label
    assert held.details["protection"]["limit"] == pytest.approx(dp_auc_ceiling(4.0, 1e-5))
    assert held.details["protection"]["within_limit"] is True
    assert "Stated limit: AUC ≤ 0.982" in held.explanation
    # an AUC far below 0.5 is a leak too (the scores run the other way)
    inverted = dataclasses.replace(leaky, metrics={**leaky.metrics, "auc": 0.2})
    flipped = with_label_verdict(inverted, ledger).details["protection"]
    assert flipped["defeated"] is False and flipped["leak"] == pytest.approx(0.8)
    assert flipped["within_limit"] is True  # 0.8 is within what ε = 4 allows
    beyond = dataclasses.replace(leaky, metrics={**leaky.metrics, "auc": 0.995})
    judged = with_label_verdict(beyond, ledger)
    assert judged.details["protection"]["within_limit"] is False
    assert "goes BEYOND it" in judged.explanation
    # over few records the same AUC is within the limit's sampling error, over many beyond it
    few = with_label_verdict(beyond, ledger, records=60)
    assert few.details["protection"]["within_limit"] is True
    assert few.details["protection"]["leak_stderr"] > 0.0065
    # a population attack (model completion) is reported, never judged against a label
    # guarantee: it reads the task from the features, which label DP does not hide
    population = with_label_verdict(beyond, ledger, population=True)
    assert population.details["protection"]["within_limit"] is None
    assert population.details["protection"]["limit"] is None
    assert "not judged" in population.explanation
    assert get_attack("label-completion").population is True
    assert not getattr(get_attack("label-norm"), "population", False)
    assert with_label_verdict(beyond, ledger, records=20_000).details["protection"][
        "within_limit"] is False
