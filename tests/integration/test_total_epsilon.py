"""Budget first: `[privacy] total_epsilon = E, delta = D` ends a run with a ledger
whose worst-case record is at ε ≤ E, recomputed here independently of the library's
accountant (the closed form of the Gaussian mechanism's composition), and a run that asks for
more releases than its plan stops before the release that would pass E."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from tests.integration.test_privacy import write_run
from vflink.cli.main import main
from vflink.errors import PrivacyBudgetExceeded
from vflink.privacy.config import PrivacyConfig
from vflink.privacy.embedding_dp import EmbeddingDP


def gaussian_epsilon(mu: float, delta: float) -> float:
    """ε at δ of a μ-GDP mechanism (Dong, Roth & Su 2019, Cor. 2.13): the m-fold composition
    of Gaussians of multiplier σ is μ-GDP with μ² = Σ m/σ² (sensitivity 1 over σ)."""

    def gap(eps: float) -> float:
        return (norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
                - delta)

    if gap(0.0) <= 0:
        return 0.0
    return float(brentq(gap, 0.0, 500.0, xtol=1e-10))


def ledger_entry(out: Path) -> dict:
    ledger = json.loads((out / "privacy.json").read_text())
    (entry,) = [p for p in ledger["protections"] if p["kind"] == "embedding-dp"]
    return entry


@pytest.mark.parametrize("mode", ["vanilla", "afe"])
def test_a_run_at_total_epsilon_4_ends_at_most_at_4(tmp_path: Path, mode: str) -> None:
    config = write_run(tmp_path, epochs=3, mode=mode)
    text = config.read_text().replace("epsilon = 2.0\ndelta = 1e-2",
                                      "total_epsilon = 4\ndelta = 1e-5")
    config.write_text(text)
    out = tmp_path / "run"
    assert main(["train", "--config", str(config), "--out", str(out)]) == 0
    entry = ledger_entry(out)
    g, p = entry["guarantee"], entry["params"]
    assert p["total_epsilon"] == 4 and p["calibration"] == "total-epsilon (PLD)"
    # independently: μ² = m/σ² for the most-released record (one noise setting)
    m, sigma = g["max_releases"], p["sigma"]
    assert m == g["planned"]["max_releases"] == 3 + 1  # epochs + the final evaluation
    eps = gaussian_epsilon(math.sqrt(m) / sigma, g["delta"])
    assert eps <= 4.0 + 1e-6
    assert eps == pytest.approx(4.0, abs=2e-3)  # calibrated to the target, not far below
    assert g["epsilon_total"] == pytest.approx(eps, abs=2e-3)
    assert g["spent"]["epsilon"] <= 4.0 and g["planned"]["epsilon"] <= 4.0
    # the run's δ is the target: with rescaling half goes to Eq. 5's failure union bound
    assert g["delta_total"] <= 1e-5 * (1 + 1e-9)
    if mode == "afe":
        assert g["delta"] == pytest.approx(5e-6)
        assert p["rescale_sigmas"] > 3.0
    # the noise the secondary added is the calibrated one: std 2σt
    assert p["noise_std"] == pytest.approx(2 * sigma * p["t"])


def test_more_releases_than_planned_stop_before_the_release(tmp_path: Path) -> None:
    dp = EmbeddingDP(PrivacyConfig(embeddings="vanilla", total_epsilon=2.0, delta=1e-5),
                     party="bank", n_rows=4, seed=0)
    dp.note_links(np.array([1, 1, 1, 0]))
    dp.note_train_rows(np.array([0, 1]))
    dp.set_plan({"epochs": 2, "train_batches": 5, "train_chunks": 1, "validation_chunks": 1,
                 "test_chunks": 1})
    import torch

    rows = np.array([0, 1, 2])
    for _ in range(3):  # records 0 and 1: 2 epochs + final evaluation; record 2: 2 + 1
        dp.release(torch.ones(3, 2), rows)
    assert dp.budget.max_epsilon(dp.delta) <= 2.0
    counts_before = dp.budget.totals.copy()
    with pytest.raises(PrivacyBudgetExceeded, match="total_epsilon"):
        dp.release(torch.ones(1, 2), np.array([0]))
    assert np.array_equal(dp.budget.totals, counts_before)  # nothing counted, nothing sent
    dp.release(torch.ones(1, 2), np.array([3]))  # a record with budget left is still served


def test_without_a_plan_nothing_is_released() -> None:
    import torch

    dp = EmbeddingDP(PrivacyConfig(embeddings="vanilla", total_epsilon=2.0, delta=1e-5),
                     party="bank", n_rows=2, seed=0)
    with pytest.raises(PrivacyBudgetExceeded, match="release plan"):
        dp.release(torch.ones(2, 2), np.array([0, 1]))


def test_release_once_answers_repeats_from_its_single_release() -> None:
    import torch

    dp = EmbeddingDP(PrivacyConfig(embeddings="release-once", total_epsilon=1.0, delta=1e-5),
                     party="bank", n_rows=3, seed=0)
    dp.note_links(np.array([1, 1, 1]))
    dp.set_plan({"epochs": 20, "train_batches": 9, "train_chunks": 1, "validation_chunks": 1,
                 "test_chunks": 1})
    _, first = dp.release(torch.randn(3, 4), np.array([0, 1, 2]))
    for _ in range(5):  # the model may change: what crosses is the one release per record
        _, again = dp.release(torch.randn(2, 4), np.array([2, 0]))
        assert torch.equal(again, first[[2, 0]])
    assert list(dp.budget.totals) == [1, 1, 1]
    # one Gaussian release per record at (1, 1e-5): σ is the analytic Gaussian mechanism's
    assert gaussian_epsilon(1 / dp.sigma, 1e-5) == pytest.approx(1.0, abs=2e-3)


def test_normalized_releases_sit_on_the_sphere_before_noise() -> None:
    import torch

    dp = EmbeddingDP(PrivacyConfig(embeddings="normalized", epsilon=2.0, clip=0.5),
                     party="bank", n_rows=3, seed=0)
    z, _ = dp.release(torch.tensor([[0.01, 0.0], [3.0, 4.0], [0.0, -0.2]]), np.arange(3))
    assert torch.allclose(torch.linalg.vector_norm(z, dim=1), torch.full((3,), 0.5))
