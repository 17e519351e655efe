"""Δ of Definition 1 on a hand-built linkage, and the Figure 4 PNG."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vflink.errors import ConfigError
from vflink.linkage import (
    SoftLinkage,
    baseline_matches,
    improvement_estimate,
    improvement_per_record,
    link,
    plot_similarity_curve,
    scale_similarities,
)


def _linkage(distances: np.ndarray, similarities: np.ndarray) -> SoftLinkage:
    n, k = distances.shape
    idx = np.tile(np.arange(k), (n, 1))
    return SoftLinkage(indices=idx, distances=distances, similarities=similarities, mu0=0.0,
                       sigma0=1.0, sigma=0.0, tau=1.0, epsilon=np.inf, delta=1e-5,
                       epsilon_valid=False, metric="euclidean", mode="soft", n_secondary=k)


def test_delta_hand_built() -> None:
    # two records, K = 4; similarities already scale to these values per row
    sims = np.array([[1.0, 0.5, 0.25, 0.0],
                     [2.0, 2.0, 1.0, 0.0]])
    dists = np.array([[0.0, 1.0, 2.0, 3.0],
                      [0.0, 0.0, 1.0, 2.0]])
    lk = _linkage(dists, sims)
    scaled = scale_similarities(sims)
    np.testing.assert_allclose(scaled, [[1.0, 0.5, 0.25, 0.0], [1.0, 1.0, 0.5, 0.0]])
    # Top1Sim: row 0 → (1-1) + .5 + .25 + 0 = .75; row 1 → (1-1) + 1 + .5 + 0 = 1.5
    assert improvement_estimate(lk, "top1sim") == pytest.approx((0.75 + 1.5) / 2)
    # AvgSim with 2 matches: row 0 → 0 + .5 + .25 + 0 = .75; row 1 → 0 + 0 + .5 = .5
    assert improvement_estimate(lk, "avgsim", avgsim_k=2) == pytest.approx((0.75 + 0.5) / 2)
    # AvgSim over all K: Σ(1 - s) = 2.25 and 1.5
    assert improvement_estimate(lk, "avgsim") == pytest.approx((2.25 + 1.5) / 2)
    # Exact: matches are distance 0 → row 0 same as Top1Sim; row 1 has two exact matches
    assert improvement_estimate(lk, "exact") == pytest.approx((0.75 + 0.5) / 2)
    per = improvement_per_record(scaled, baseline_matches(lk, "top1sim"))
    np.testing.assert_allclose(per, [0.75, 1.5])
    with pytest.raises(ConfigError):
        improvement_estimate(lk, "avgsim", avgsim_k=9)


def test_global_scaling_and_constant_rows() -> None:
    sims = np.array([[3.0, 3.0], [1.0, np.nan]])
    np.testing.assert_allclose(scale_similarities(sims), [[0.0, 0.0], [0.0, 0.0]])
    np.testing.assert_allclose(scale_similarities(sims, scale="global"), [[1, 1], [0, 0]])


def test_plot_writes_png(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    lk = link(rng.normal(size=(50, 2)), rng.normal(size=(40, 2)), metric="euclidean", top_k=10,
              sigma=0.1, rng=0)
    out = plot_similarity_curve(lk, tmp_path / "fig4.png", baseline="avgsim", avgsim_k=3)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
