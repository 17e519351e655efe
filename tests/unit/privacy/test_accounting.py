"""Noise calibration (Lemma 3.3, analytic Gaussian) and the run-level PLD accountant."""

from __future__ import annotations

import math

import pytest
from dp_accounting import gaussian_mechanism
from scipy.stats import norm

from vflink.privacy.accounting import (
    calibrate,
    composed_epsilon,
    delta_prime,
    lemma_3_3_sigma,
    max_releases_within,
    rescale_p2,
)


@pytest.mark.parametrize(("epsilon", "delta"), [(0.1, 1e-5), (0.5, 1e-2), (0.99, 1e-3)])
def test_lemma_3_3_below_one(epsilon: float, delta: float) -> None:
    cal = calibrate(epsilon, delta)
    c = math.sqrt(2 * math.log(1.25 / delta))  # the lemma's bound, hand-computed
    assert cal.method == "lemma-3.3"
    assert cal.sigma > c / epsilon and cal.sigma == pytest.approx(c / epsilon, rel=1e-12)
    assert lemma_3_3_sigma(epsilon, delta) == cal.sigma


@pytest.mark.parametrize(("epsilon", "delta"), [(1.0, 1e-2), (2.0, 1e-2), (8.0, 1e-5)])
def test_analytic_gaussian_from_one(epsilon: float, delta: float) -> None:
    cal = calibrate(epsilon, delta)
    assert cal.method == "analytic-gaussian"
    # Balle & Wang Thm 8 oracle: δ(ε) = Φ(1/2σ − εσ) − e^ε Φ(−1/2σ − εσ) equals the target
    s = cal.sigma
    achieved = (norm.cdf(0.5 / s - epsilon * s)
                - math.exp(epsilon) * norm.cdf(-0.5 / s - epsilon * s))
    assert achieved == pytest.approx(delta, rel=1e-6)
    # and it is tighter than the classical formula would be
    assert s < math.sqrt(2 * math.log(1.25 / delta)) / epsilon


@pytest.mark.parametrize("m", [1, 2, 7, 40])
def test_pld_composition_matches_the_gaussian_oracle(m: int) -> None:
    sigma = calibrate(2.0, 1e-2).sigma
    # m Gaussian releases of multiplier σ compose exactly into one of multiplier σ/√m
    exact = gaussian_mechanism.get_epsilon_gaussian(sigma / math.sqrt(m), 1e-2)
    assert composed_epsilon(sigma, m, 1e-2) == pytest.approx(exact, rel=1e-4, abs=1e-6)
    assert composed_epsilon(sigma, m, 1e-2) >= exact - 1e-9  # pessimistic discretisation


def test_composed_epsilon_grows_and_starts_at_the_per_release_figure() -> None:
    sigma = calibrate(2.0, 1e-2).sigma
    values = [composed_epsilon(sigma, m, 1e-2) for m in range(0, 6)]
    assert values[0] == 0.0
    assert values[1] == pytest.approx(2.0, rel=1e-4)
    assert all(b > a for a, b in zip(values, values[1:]))


@pytest.mark.parametrize("budget", [2.5, 10.0, 50.0])
def test_max_releases_is_the_budget_boundary(budget: float) -> None:
    sigma = calibrate(2.0, 1e-2).sigma
    m = max_releases_within(sigma, 1e-2, budget)
    assert composed_epsilon(sigma, m, 1e-2) <= budget < composed_epsilon(sigma, m + 1, 1e-2)


def test_theorem_3_6_delta_prime() -> None:
    p2 = rescale_p2(3.0)
    assert p2 == pytest.approx(0.99865, abs=1e-5)  # §3.2: "p2 ≈ 0.9987"
    assert delta_prime(1e-2, 1.0, p2) == pytest.approx(1e-2 / p2)
