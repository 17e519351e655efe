"""Privacy of soft-linkage similarities: FedSim §5 (Theorem 1, Theorem 2), as pure functions.

Notation (FedSim §4.1, §5): μ0 and σ0 are the mean and standard deviation of the negative
distances used in Eq. 1, σ is the scale of the Gaussian noise of Eq. 2, n is the number of
primary records (the size of k^P is n × β).

**Theorem 2 (greedy attack).** An attacker who knows μ0, σ0 and follows the greedy attack
(MAP estimate of ρ from s with prior N(0, 1), scale back, guess uniformly) recovers the secondary
Bloom filter with probability at most

    τ = erf( √(σ² + 1) / (2√2 · σ · σ0) ).

τ decreases in σ towards τ_min = erf(1 / (2√2 · σ0)) as σ → ∞, so a target τ ≤ τ_min cannot be
reached by any noise: σ0 (the spread of the distances) sets the floor (FedSim §5.2, text after
Theorem 2). The proof (App. A.2, Eq. 10) rounds the predicted distance to the nearest integer,
so the bound is stated for integer distances (Hamming between Bloom filters); for continuous
metrics it is reported with the same formula but only has its nominal meaning when distances
are integers.

**Theorem 1 (differential privacy).** If the similarity release 𝒢 is (ε, δ)-DP with
0 < δ < 1/2 − e^{−3ε}/√(2πε), then σ ≥ Δ_𝒢/√(2ε) with
Δ_𝒢 = n · max{|(1 + μ0)/σ0|, |(−1 + μ0)/σ0|}. Read the other way round (App. A.1, after
Theorem 4), a given σ cannot give any ε smaller than ε = Δ_𝒢² / (2σ²): this is the ε we report.
It is a *lower bound* on the privacy loss — the best (ε, δ) that the noise could possibly
certify — and it only holds when δ satisfies the theorem's condition for that ε.

Worked example in the paper (house, App. A.3): μ0 = −46237.78, σ0 = 21178.86, n = 141,050,
δ = 1e−5, σ = 4 gives ε ≈ 2.96 × 10⁹ and τ ≈ 1.94 × 10⁻⁵ (the main text prints σ = 0.4, a
typo: σ = 0.4 gives τ ≈ 5.07 × 10⁻⁵, the 0.0051 % of the paper's earlier version).
"""

from __future__ import annotations

import math

from scipy.special import erf, erfinv

from vflink.errors import LinkageError

__all__ = [
    "dp_epsilon",
    "dp_sensitivity",
    "sigma_for_tau",
    "tau_for_sigma",
    "tau_min",
    "theorem1_delta_limit",
]


def _check_sigma0(sigma0: float) -> None:
    if not (math.isfinite(sigma0) and sigma0 >= 0.0):
        raise LinkageError(f"σ0 must be a finite number ≥ 0, got {sigma0!r}")


def tau_for_sigma(sigma: float, sigma0: float) -> float:
    """τ = erf(√(σ²+1) / (2√2·σ·σ0)) (FedSim Theorem 2); 1 when σ = 0 or σ0 = 0."""
    _check_sigma0(sigma0)
    if not (math.isfinite(sigma) and sigma >= 0.0):
        raise LinkageError(f"σ must be a finite number ≥ 0, got {sigma!r}")
    if sigma == 0.0 or sigma0 == 0.0:
        return 1.0
    return float(erf(math.sqrt(sigma * sigma + 1.0) / (2.0 * math.sqrt(2.0) * sigma * sigma0)))


def tau_min(sigma0: float) -> float:
    """The smallest achievable τ, the limit of Theorem 2 as σ → ∞: erf(1 / (2√2·σ0))."""
    _check_sigma0(sigma0)
    if sigma0 == 0.0:
        return 1.0
    return float(erf(1.0 / (2.0 * math.sqrt(2.0) * sigma0)))


def sigma_for_tau(tau: float, sigma0: float) -> float:
    """Invert Theorem 2: the noise scale σ whose greedy-attack bound equals ``tau``.

    With x = erf⁻¹(τ): √(σ²+1)/(2√2·σ·σ0) = x ⇔ 1 + 1/σ² = 8σ0²x² ⇔ σ = 1/√(8σ0²x² − 1).
    τ = 1 needs no noise (σ = 0). Raises :class:`LinkageError` when τ ≤ τ_min (unreachable for
    any σ), stating τ_min.
    """
    if not (isinstance(tau, (int, float)) and math.isfinite(tau) and 0.0 < tau <= 1.0):
        raise LinkageError(f"`tau` must be a number in (0, 1], got {tau!r}")
    floor = tau_min(sigma0)
    if tau >= 1.0:
        return 0.0
    if tau <= floor:
        raise LinkageError(
            f"`tau` = {tau:.6g} is unreachable: with σ0 = {sigma0:.6g} the smallest achievable "
            f"greedy-attack success rate is τ_min = erf(1/(2√2·σ0)) = {floor:.6g} "
            "(FedSim Theorem 2, σ → ∞); choose tau > τ_min"
        )
    x = float(erfinv(tau))
    return 1.0 / math.sqrt(8.0 * sigma0 * sigma0 * x * x - 1.0)


def dp_sensitivity(n: int, mu0: float, sigma0: float) -> float:
    """Δ_𝒢 = n · max{|(1+μ0)/σ0|, |(−1+μ0)/σ0|} (FedSim Theorem 1 / App. A.1 Eq. 4)."""
    if sigma0 <= 0.0:
        return math.inf
    return n * max(abs((1.0 + mu0) / sigma0), abs((-1.0 + mu0) / sigma0))


def dp_epsilon(sigma: float, n: int, mu0: float, sigma0: float) -> float:
    """The smallest ε Theorem 1 allows for noise σ: ε = Δ_𝒢² / (2σ²) (∞ when σ = 0)."""
    if sigma <= 0.0:
        return math.inf
    sens = dp_sensitivity(n, mu0, sigma0)
    return sens * sens / (2.0 * sigma * sigma)


def theorem1_delta_limit(epsilon: float) -> float:
    """1/2 − e^{−3ε}/√(2πε): Theorem 1 holds for δ strictly below this value."""
    if not epsilon > 0.0:
        return -math.inf
    if math.isinf(epsilon):
        return 0.5
    return 0.5 - math.exp(-3.0 * epsilon) / math.sqrt(2.0 * math.pi * epsilon)
