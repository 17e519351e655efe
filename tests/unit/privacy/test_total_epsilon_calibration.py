"""`calibrate_total` against independent figures: the closed form of the Gaussian mechanism's
composition (μ-GDP, μ² = Σ m/σ²) and dp_accounting's RDP accountant (an upper bound)."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant

from tests.integration.test_total_epsilon import gaussian_epsilon
from vflink.errors import ConfigError
from vflink.privacy.accounting import calibrate_total, planned_releases
from vflink.privacy.budget import ReleaseBudget, ReleaseSetting
from vflink.privacy.config import PrivacyConfig


@pytest.mark.parametrize(("eps", "m"), [(0.5, 21), (4.0, 11), (8.0, 41), (16.0, 5)])
def test_sigma_puts_the_worst_record_at_the_target(eps: float, m: int) -> None:
    delta = 1e-5
    sigma = calibrate_total(eps, delta, np.array([m, m - 1, 1, 0]))
    closed = gaussian_epsilon(math.sqrt(m) / sigma, delta)
    assert closed <= eps + 1e-9
    assert closed == pytest.approx(eps, rel=2e-3)  # exact up to PLD's pessimism
    rdp = RdpAccountant()
    rdp.compose(dp_accounting.GaussianDpEvent(sigma), m)
    assert rdp.get_epsilon(delta) >= closed - 1e-9  # RDP's conversion is looser, never tighter


def test_earlier_releases_are_part_of_the_total() -> None:
    budget = ReleaseBudget(3, party="bank")
    budget.record(ReleaseSetting(sigma=3.0), np.array([0]))
    budget.record(ReleaseSetting(sigma=3.0), np.array([0]))
    planned = np.array([5, 5, 0])
    fresh = calibrate_total(4.0, 1e-5, planned)
    with_past = calibrate_total(4.0, 1e-5, planned, budget.gaussian_loss(), budget.releases_of)
    assert with_past > fresh
    mu = math.sqrt(2 / 3.0 ** 2 + 5 / with_past ** 2)
    assert gaussian_epsilon(mu, 1e-5) <= 4.0 + 1e-9
    assert gaussian_epsilon(mu, 1e-5) == pytest.approx(4.0, rel=2e-3)
    with pytest.raises(ValueError, match="already"):
        calibrate_total(0.1, 1e-5, planned, budget.gaussian_loss(), budget.releases_of)


def test_planned_releases_bound_the_worst_split_of_links() -> None:
    links = np.array([0, 1, 1, 2, 3])
    train = np.array([False, True, False, True, False])
    m = planned_releases(links, train, epochs=10, train_batches=50, chunks=(1, 1, 1), extra=2)
    # no link: never released; one training link: 10 epochs + final pass (+2 reserved);
    # one other link: validation every epoch + final (+2)
    assert list(m) == [0, 13, 13, 34, 14]


def test_total_epsilon_and_epsilon_are_exclusive() -> None:
    with pytest.raises(ConfigError, match="not both"):
        PrivacyConfig(embeddings="vanilla", total_epsilon=4.0, epsilon=2.0)
    with pytest.raises(ConfigError, match="budget"):
        PrivacyConfig(embeddings="vanilla", total_epsilon=4.0, budget=5.0)
    assert PrivacyConfig(embeddings="vanilla").release_epsilon == 2.0
