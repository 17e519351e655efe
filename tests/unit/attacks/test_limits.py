"""The most AUC an (ε, δ) or a Gaussian guarantee allows: the closed form against numerical
integration of the ROC region, and against mechanisms that reach it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event, pld
from scipy.integrate import quad
from scipy.stats import norm
from sklearn.metrics import roc_auc_score

from vflink.attacks.limits import dp_auc_ceiling, gdp_auc_ceiling, gdp_mu, leak


def _roc_ceiling(alpha: float, eps: float, delta: float) -> float:
    """The (ε, δ) privacy region's upper edge (Kairouz et al. 2015, Thm 2.1)."""
    return min(1.0, math.exp(eps) * alpha + delta,
               1.0 - math.exp(-eps) * (1.0 - delta - alpha))


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.5, 1.0, 2.0, 4.0, 8.0])
@pytest.mark.parametrize("delta", [0.0, 1e-5, 1e-3, 0.05, 0.3])
def test_closed_form_equals_the_area_of_the_privacy_region(eps: float, delta: float) -> None:
    a_star = (1 - delta) / (1 + math.exp(eps))  # the kinks, for the integrator
    area, _ = quad(_roc_ceiling, 0.0, 1.0, args=(eps, delta), points=[a_star, 1 - delta],
                   epsabs=1e-12, epsrel=1e-12, limit=200)
    assert dp_auc_ceiling(eps, delta) == pytest.approx(area, abs=1e-9)


def test_pure_dp_is_the_logistic_and_the_edges() -> None:
    for eps in (0.5, 1.0, 4.0):
        assert dp_auc_ceiling(eps) == pytest.approx(math.exp(eps) / (1 + math.exp(eps)))
    assert dp_auc_ceiling(0.0) == 0.5
    assert dp_auc_ceiling(4.0) == pytest.approx(0.98201, abs=1e-5)
    assert dp_auc_ceiling(1.0, 1.0) == 1.0 and dp_auc_ceiling(math.inf) == 1.0
    values = [dp_auc_ceiling(e, 1e-5) for e in np.linspace(0, 6, 30)]
    assert all(b > a for a, b in zip(values, values[1:], strict=False))
    with pytest.raises(ValueError):
        dp_auc_ceiling(-1.0)


def test_randomized_response_reaches_the_ceiling() -> None:
    """ε-randomized response on one bit: the optimal test's ROC is the region's edge."""
    eps = 1.5
    keep = math.exp(eps) / (1 + math.exp(eps))
    # output 1 with probability keep when the bit is 1, 1 − keep when 0: the ROC of the test
    # "say 1 on output 1" is (1 − keep, keep); its AUC with the corners is the area
    fpr, tpr = 1 - keep, keep
    area = 0.5 * fpr * tpr + (1 - fpr) * tpr + 0.5 * (1 - fpr) * (1 - tpr)
    assert area == pytest.approx(dp_auc_ceiling(eps))


def test_gaussian_ceiling_is_the_binormal_auc_and_within_the_dp_one() -> None:
    rng = np.random.default_rng(0)
    mu = gdp_mu([(2.0, 3), (4.0, 4)])
    assert mu == pytest.approx(math.sqrt(3 / 4 + 4 / 16))
    x0, x1 = rng.normal(size=200_000), rng.normal(mu, 1.0, size=200_000)
    sampled = roc_auc_score(np.r_[np.zeros(len(x0)), np.ones(len(x1))], np.r_[x0, x1])
    assert gdp_auc_ceiling(mu) == pytest.approx(sampled, abs=3e-3)
    assert gdp_auc_ceiling(mu) == pytest.approx(norm.cdf(mu / math.sqrt(2)))
    # the same releases as (ε, δ) by the PLD accountant: a looser ceiling, never tighter
    acc = pld.PLDAccountant()
    acc.compose(dp_event.GaussianDpEvent(2.0), 3)
    acc.compose(dp_event.GaussianDpEvent(4.0), 4)
    eps = acc.get_epsilon(1e-5)
    assert gdp_auc_ceiling(mu) <= dp_auc_ceiling(eps, 1e-5)
    assert gdp_mu([(0.0, 1)]) == math.inf and gdp_auc_ceiling(math.inf) == 1.0
    assert gdp_mu([(1.0, 0)]) == 0.0


def test_leak_reads_either_way() -> None:
    assert leak(0.2) == pytest.approx(0.8) and leak(0.7) == pytest.approx(0.7)
    assert math.isnan(leak(math.nan))
