"""FedSim §5: Theorem 2 (τ ↔ σ) and Theorem 1 (ε), including the paper's house example."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import erf

from vflink.errors import LinkageError
from vflink.linkage import (
    dp_epsilon,
    dp_sensitivity,
    sigma_for_tau,
    tau_for_sigma,
    tau_min,
    theorem1_delta_limit,
)

HOUSE_MU0, HOUSE_SIGMA0, HOUSE_N = -46237.78, 21178.86, 141_050


def test_tau_formula_is_theorem2() -> None:
    sigma, sigma0 = 0.7, 3.0
    expected = erf(math.sqrt(sigma**2 + 1) / (2 * math.sqrt(2) * sigma * sigma0))
    assert tau_for_sigma(sigma, sigma0) == pytest.approx(expected, rel=1e-12)


def test_house_example_from_the_paper() -> None:
    # FedSim App. A.3 / §5.2: house, δ = 1e-5, σ = 4 → ε = 2.96e9, τ = 1.94e-5, and
    # 19,479 training records of S → 0.378 expected disclosed filters.
    tau = tau_for_sigma(4.0, HOUSE_SIGMA0)
    assert tau == pytest.approx(1.94e-5, rel=5e-3)
    assert 19479 * tau == pytest.approx(0.378, abs=5e-4)
    eps = dp_epsilon(4.0, HOUSE_N, HOUSE_MU0, HOUSE_SIGMA0)
    assert eps == pytest.approx(2.96e9, rel=5e-3)
    assert 1e-5 < theorem1_delta_limit(eps)
    # The earlier version's σ = 0.4 gives τ = 0.0051 % (the final main text's "0.4" is a typo).
    assert tau_for_sigma(0.4, HOUSE_SIGMA0) == pytest.approx(5.1e-5, rel=1e-2)


def test_sensitivity_formula() -> None:
    assert dp_sensitivity(10, 0.5, 2.0) == pytest.approx(10 * max(abs(1.5 / 2), abs(-0.5 / 2)))
    assert dp_epsilon(0.0, 10, 0.5, 2.0) == math.inf


@settings(max_examples=200, deadline=None)
@given(sigma0=st.floats(0.05, 1e5), sigma=st.floats(1e-3, 1e3))
def test_sigma_tau_round_trip(sigma0: float, sigma: float) -> None:
    tau = tau_for_sigma(sigma, sigma0)
    if not tau_min(sigma0) < tau < 1.0:
        return  # numerically on the floor or at 1: nothing to invert
    back = sigma_for_tau(tau, sigma0)
    assert tau_for_sigma(back, sigma0) == pytest.approx(tau, rel=1e-6, abs=1e-12)


def test_sigma_for_tau_examples() -> None:
    assert sigma_for_tau(1.0, 5.0) == 0.0
    s = sigma_for_tau(0.1, 20.0)
    assert tau_for_sigma(s, 20.0) == pytest.approx(0.1, rel=1e-9)
    assert sigma_for_tau(0.05, 20.0) > s  # a smaller τ needs more noise


def test_unreachable_tau_states_the_minimum() -> None:
    floor = tau_min(2.0)
    assert floor == pytest.approx(erf(1 / (2 * math.sqrt(2) * 2.0)))
    with pytest.raises(LinkageError, match=f"{floor:.6g}"):
        sigma_for_tau(floor * 0.5, 2.0)
    with pytest.raises(LinkageError, match="tau"):
        sigma_for_tau(0.0, 2.0)
    with pytest.raises(LinkageError, match="τ_min = erf"):
        sigma_for_tau(0.5, 0.0)  # σ0 = 0: the floor is 1
