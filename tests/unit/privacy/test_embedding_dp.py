"""The stateful wrapper: budget stops before a release, the ledger entry, state, agreement."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vflink.errors import ConfigError, PrivacyBudgetExceeded
from vflink.privacy.accounting import composed_epsilon
from vflink.privacy.config import PrivacyConfig
from vflink.privacy.embedding_dp import EmbeddingDP, agree_settings
from vflink.privacy.ledger import Ledger


def _dp(**kw: object) -> EmbeddingDP:
    config = PrivacyConfig(**{"embeddings": "vanilla", "epsilon": 2.0, **kw})  # type: ignore[arg-type]
    return EmbeddingDP(config, party="bank", n_rows=10, seed=1)


def test_budget_stops_before_the_release_that_would_pass_it() -> None:
    dp = _dp(budget=3.5)  # ε(1) = 2, ε(2) ≈ 3.19, ε(3) ≈ 4.1
    rows = np.array([0, 3, 5])
    x = torch.randn(3, 4)
    dp.release(x, rows)
    dp.release(x, rows)
    before = dp.counts.copy()
    with pytest.raises(PrivacyBudgetExceeded, match=r"budget ε = 3\.5.*privacy\.budget"):
        dp.release(x, rows)
    np.testing.assert_array_equal(dp.counts, before)  # nothing was released
    dp.release(torch.randn(2, 4), np.array([1, 2]))  # other records still have budget
    assert composed_epsilon(dp.sigma, dp.max_releases, 1e-2) <= 3.5


def test_report_is_a_ledger_entry_with_growing_totals() -> None:
    dp = _dp()
    totals = []
    for _ in range(3):
        dp.release(torch.randn(10, 4), np.arange(10))
        totals.append(dp.report()["guarantee"]["epsilon_total"])
    assert totals[0] == pytest.approx(2.0, rel=1e-4) and totals[0] < totals[1] < totals[2]
    entry = dp.report()
    ledger = Ledger()
    ledger.add_protection(**entry)  # the shape Ledger.add_protection expects
    g = entry["guarantee"]
    assert entry["params"]["calibration"] == "analytic-gaussian"
    assert entry["params"]["noise_std"] == pytest.approx(2 * dp.sigma * 1.0)
    assert g["epsilon_per_release"] == 2.0 and g["max_releases"] == 3
    assert g["delta_prime"] == g["delta"] == g["delta_total"] == 1e-2  # no rescaling
    assert "ε = " in entry["explanation"]


def test_rescale_reports_delta_prime_and_a_union_bound() -> None:
    dp = _dp(embeddings="rescale")
    dp.release(torch.randn(10, 4), np.arange(10))
    g = dp.report()["guarantee"]
    assert g["delta_prime"] == pytest.approx(1e-2 / g["p2"])
    assert g["delta_total"] == pytest.approx(1e-2 + (1 - g["p2"]))


def test_state_round_trip_never_forgets_releases() -> None:
    dp = _dp()
    dp.release(torch.randn(10, 4), np.arange(10))
    state = dp.state_dict()
    other = _dp()
    other.release(torch.randn(10, 4), np.arange(10))
    other.release(torch.randn(10, 4), np.arange(10))
    other.load_state_dict(state)
    assert other.max_releases == 2  # the larger count wins
    fresh = _dp()
    fresh.load_state_dict(state)
    a = fresh.release(torch.zeros(2, 4), np.array([0, 1]))[1]
    b = dp.release(torch.zeros(2, 4), np.array([0, 1]))[1]
    torch.testing.assert_close(a, b)  # the noise stream continues where it stopped


def test_local_loss_terms_follow_the_mode() -> None:
    z = torch.randn(16, 4, requires_grad=True)
    grad = torch.cat([torch.ones(8, 4), -torch.ones(8, 4)]) + 0.01 * torch.randn(16, 4)
    assert _dp().local_loss(z, grad) is None
    assert _dp(embeddings="rescale").local_loss(z, grad) is not None
    adjust = _dp(embeddings="adjust", fcm_clusters=2).local_loss(z, grad)
    assert adjust is not None and float(adjust.detach()) < 0
    with pytest.raises(ConfigError, match="number of clusters"):
        _dp(embeddings="adjust").local_loss(z, grad)


def test_a_secondary_keeps_its_own_settings() -> None:
    own = PrivacyConfig(embeddings="afe", epsilon=1.0)
    assert agree_settings(own, own.public_settings(), "bank") is own
    weaker = {**own.public_settings(), "embeddings": "off"}
    with pytest.raises(ConfigError, match="embeddings: run 'off', party 'afe'"):
        agree_settings(own, weaker, "bank")
    adopted = agree_settings(None, own.public_settings(), "bank")
    assert adopted == PrivacyConfig(embeddings="afe", epsilon=1.0)
    with pytest.raises(ConfigError, match="unknown privacy setting"):
        agree_settings(None, {"embeddings": "afe", "seed": 3}, "bank")
