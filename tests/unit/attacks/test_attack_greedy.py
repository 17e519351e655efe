"""FedSim's greedy similarity attack (§5.2) against Theorem 2 and exact counts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vflink.attacks import AttackView, get_attack
from vflink.attacks.greedy import log_binomial, map_distances
from vflink.errors import ConfigError
from vflink.linkage.privacy import sigma_for_tau, tau_for_sigma
from vflink.linkage.soft import normalize_similarities


@given(st.integers(min_value=1, max_value=200), st.integers(min_value=-3, max_value=205))
def test_log_binomial_matches_math_comb(n: int, k: int) -> None:
    value = float(log_binomial(n, k))
    if 0 <= k <= n:
        assert value == pytest.approx(math.log(math.comb(n, k)), abs=1e-9)
    else:
        assert value == -math.inf


@pytest.mark.parametrize("tau", [0.9, 0.99, 0.999])
def test_distance_step_succeeds_at_rate_tau(tau: float) -> None:
    """Theorem 2's integral (App. A.2, Eq. 13) measured by simulation on integer distances."""
    rng = np.random.default_rng(0)
    d = rng.binomial(400, 0.1, size=200_000).astype(np.float64)
    rho, mu0, sigma0 = normalize_similarities(d)
    sigma = sigma_for_tau(tau, sigma0)
    s = rho + rng.normal(0.0, sigma, size=rho.shape)
    rate = float(np.mean(map_distances(s, mu0=mu0, sigma0=sigma0, sigma=sigma) == d))
    se = math.sqrt(tau * (1 - tau) / d.size)
    assert abs(rate - tau_for_sigma(sigma, sigma0)) < 5 * se + 2e-3


def _view(own: np.ndarray, sims: np.ndarray, idx: np.ndarray, mu0: float, sigma0: float,
          sigma: float) -> AttackView:
    return AttackView(party="primary", role="primary", similarities=sims, indices=idx,
                      extra={"mu0": mu0, "sigma0": sigma0, "sigma": sigma,
                             "own_filters": np.packbits(own, axis=1), "bits": own.shape[1]})


def test_full_attack_counts_candidates_exactly() -> None:
    """Two 16-bit targets: one at distance 0 from our filter (recovered for sure), one at
    distance 1 (one of C(16, 1) = 16 candidates)."""
    own = np.zeros((2, 16), dtype=np.uint8)
    own[1, :4] = 1
    theirs = own.copy()
    theirs[1, 9] = 1  # distance 1
    d = np.array([[0.0], [1.0]])
    mu0, sigma0 = -0.5, 0.5
    sims = (-d - mu0) / sigma0
    view = _view(own, sims, np.array([[0], [1]]), mu0, sigma0, 0.0)
    truth = {"distances": d, "filters__rows": np.array([0, 1]),
             "filters__values": np.packbits(theirs, axis=1)}
    result = get_attack("greedy-similarity", taus=(0.9,)).evaluate(view, truth)
    m = result.metrics
    assert m["distance_success"] == 1.0 and m["tau_bound"] == 1.0
    assert m["full_success"] == pytest.approx((1.0 + 1.0 / 16) / 2)
    assert m["enumerated_targets"] == 2.0
    assert m["full_success_enumerated"] in (0.5, 1.0)


def test_parameters_are_validated() -> None:
    with pytest.raises(ConfigError, match="taus"):
        get_attack("greedy-similarity", taus=(0.0,))
