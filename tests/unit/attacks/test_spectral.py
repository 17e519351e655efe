"""The spectral attack (FLORIST App. C) against oracles: Gaussian mixtures whose attack AUC is
known from the mixture alone (exact for the two-cluster reading, by a large Monte Carlo with
the true mean and direction for the outlier reading), at synthetic fractions ε = 0.1, 0.5, 0.9."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest

from vflink.attacks import ATTACKS, AttackView, get_attack
from vflink.attacks.spectral import aligned_projections, spectral_scores
from vflink.errors import ConfigError
from vflink.metrics.functional import auc

D, N_BATCHES, BATCH = 4, 40, 200


def test_registered_under_the_contract() -> None:
    assert "spectral" in ATTACKS
    attack = get_attack("spectral", target="embeddings")
    assert attack.name == "spectral" and "extra" in attack.needs
    with pytest.raises(ConfigError, match="statistic"):
        get_attack("spectral", statistic="median")


def test_scores_are_projections_on_the_top_singular_vector() -> None:
    x = np.array([[1.0, 0.0], [-1.0, 0.0], [3.0, 0.0], [-3.0, 0.0]])
    assert spectral_scores(x) == pytest.approx([1.0, 1.0, 3.0, 3.0])


def mixture(eps: float, shift: float, seed: int, real_scale: float = 1.0
            ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_], list[npt.NDArray[np.int64]]]:
    """Batches of real rows N(0, diag(real_scale², 1, ...)) and a fraction ε of synthetic rows
    N(shift·e1, I); every batch holds exactly round(ε·BATCH) synthetic rows."""
    rng = np.random.default_rng(seed)
    n_fake = round(eps * BATCH)
    xs, fakes = [], []
    for _ in range(N_BATCHES):
        real = rng.normal(size=(BATCH - n_fake, D))
        real[:, 0] *= real_scale
        fake = rng.normal(size=(n_fake, D))
        fake[:, 0] += shift
        order = rng.permutation(BATCH)
        xs.append(np.concatenate([real, fake])[order])
        fakes.append(np.r_[np.zeros(BATCH - n_fake, bool), np.ones(n_fake, bool)][order])
    batches = [np.arange(i * BATCH, (i + 1) * BATCH) for i in range(N_BATCHES)]
    return np.concatenate(xs), np.concatenate(fakes), batches


def evaluate(x: npt.NDArray[np.float64], fake: npt.NDArray[np.bool_],
             batches: list[npt.NDArray[np.int64]]) -> tuple[dict[str, float], dict[str, object]]:
    result = get_attack("spectral", target="gradients").evaluate(
        AttackView(party="p", role="secondary", gradients=x, extra={"batches": batches}),
        {"synthetic": fake})
    return result.metrics, result.details


def outlier_oracle(eps: float, shift: float) -> float:
    """AUC of |x1 − μ_F| with the true mixture mean μ_F = ε·shift and v = e1 (Monte Carlo)."""
    rng = np.random.default_rng(12345)
    mu = eps * shift
    real = np.abs(rng.normal(size=400_000) - mu)
    fake = np.abs(rng.normal(size=400_000) + shift - mu)
    a = auc(np.r_[np.zeros(len(real)), np.ones(len(fake))], np.r_[real, fake])
    return max(a, 1.0 - a)


@pytest.mark.parametrize("eps", [0.1, 0.5, 0.9])
def test_separated_clusters_match_the_oracle_at_every_fraction(eps: float) -> None:
    shift = 3.0  # far apart (Lemma 1: ‖μ_D − μ_W‖² large against the spread)
    x, fake, batches = mixture(eps, shift, seed=int(eps * 10))
    metrics, details = evaluate(x, fake, batches)
    # two Gaussians of unit variance `shift` apart on v: AUC = Φ(shift/√2), for every ε
    two_cluster = 0.5 * (1.0 + math.erf(shift / 2.0))
    assert metrics["auc_two_cluster"] == pytest.approx(two_cluster, abs=0.02)
    assert metrics["auc_outlier"] == pytest.approx(outlier_oracle(eps, shift), abs=0.03)
    assert metrics["auc"] == max(metrics["auc_two_cluster"], metrics["auc_outlier"])
    if eps == 0.5:
        # the symmetric score cannot tell two equal clusters apart (why App. C's |.| alone
        # measures ~0.5 at α = 0.5 however far apart the clusters are)
        assert metrics["auc_outlier"] < 0.6 and details["best"] == "two-cluster"
    if eps == 0.9:
        # the real rows are the minority, hence the outliers: the oriented score is inverted
        oriented = details["oriented_auc"]
        assert isinstance(oriented, dict) and oriented["outlier"] < 0.5


@pytest.mark.parametrize("eps", [0.1, 0.5, 0.9])
def test_identical_distributions_stay_at_chance(eps: float) -> None:
    x, fake, batches = mixture(eps, 0.0, seed=7 + int(eps * 10))
    metrics, _ = evaluate(x, fake, batches)
    # naming the groups once per run (not per batch) keeps chance at 0.5
    assert metrics["auc"] == pytest.approx(0.5, abs=0.04)
    assert metrics["auc_outlier"] == pytest.approx(0.5, abs=0.04)
    assert metrics["auc_two_cluster"] == pytest.approx(0.5, abs=0.04)


def test_synthetic_rows_closer_to_the_centre_are_found_too() -> None:
    # fea-random's case: real rows spread along one direction, synthetic ones with the same
    # mean and less spread there; the outlier score ranks them lowest (inverted)
    x, fake, batches = mixture(0.5, 0.0, seed=3, real_scale=3.0)
    metrics, details = evaluate(x, fake, batches)
    oriented = details["oriented_auc"]
    assert isinstance(oriented, dict) and oriented["outlier"] < 0.25
    assert metrics["auc"] == metrics["auc_outlier"] > 0.75


def test_one_orientation_for_the_whole_run() -> None:
    x, fake, batches = mixture(0.5, 3.0, seed=5)
    proj = aligned_projections(x, batches)
    per_batch = [auc(fake[b], proj[b]) for b in batches]
    # the synthetic cluster stays on one side of the batch mean in every batch
    assert all(a > 0.9 for a in per_batch) or all(a < 0.1 for a in per_batch)
