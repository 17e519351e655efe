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

**The distance's resolution.** The proof's rounding step (App. A.2, Eq. 10–13) succeeds when
the attacker's estimate lands within half a distance step of the true distance; for Hamming
distances between Bloom filters that step is one bit. Where the distance is on another scale —
the weighted mean of per-field Dice distances of a multi-field link lies in [0, 1] and one bit
of one field's filter moves it by about w_f / (W·(|a_f| + |b_f|)) — the same proof with the
step ``r`` in place of 1 gives τ = erf(r·√(σ² + 1) / (2√2·σ·σ0)): Theorem 2 on the scale where
its attack works, i.e. with σ0 measured in bits (σ0 / r). Every function below takes this
``resolution`` r (default 1: Hamming distances, the paper's case).

**The private default.** FedSim §6.4 (Figure 6) finds no evident accuracy loss down to
τ = 10⁻⁴–10⁻³ on its datasets, whose Bloom filters spread widely (house: σ0 ≈ 21,000 bits,
τ_min ≈ 1.3 × 10⁻⁵). Our filters spread over tens of bits (σ0 ≈ 40–90 on the sklearn, GPS and
titles tasks), so τ_min ≈ 0.004–0.01 and 10⁻³ cannot be reached at all; :data:`DEFAULT_TAU`
is chosen by measurement on those tasks instead (docs/how-to/linkage.md, "Similarity noise
by default"); data whose distances spread too little to reach it get
:data:`DEFAULT_FALLBACK_SIGMA` instead.

Worked example in the paper (house, App. A.3): μ0 = −46237.78, σ0 = 21178.86, n = 141,050,
δ = 1e−5, σ = 4 gives ε ≈ 2.96 × 10⁹ and τ ≈ 1.94 × 10⁻⁵ (the main text prints σ = 0.4, a
typo: σ = 0.4 gives τ ≈ 5.07 × 10⁻⁵, the 0.0051 % of the paper's earlier version).
"""

from __future__ import annotations

import math
from statistics import NormalDist

from vflink.errors import LinkageError

__all__ = [
    "DEFAULT_FALLBACK_SIGMA",
    "DEFAULT_TAU",
    "describe_protection",
    "tau_in_words",
    "dp_epsilon",
    "dp_sensitivity",
    "sigma_for_tau",
    "tau_for_sigma",
    "tau_min",
    "theorem1_delta_limit",
]

#: The greedy-attack bound applied when similarities are released privately and neither τ nor
#: σ is given (measured: docs/how-to/linkage.md, "Similarity noise by default").
DEFAULT_TAU = 0.05
#: The noise of the private default where the data cannot reach :data:`DEFAULT_TAU` (their
#: distances spread over a few bits only, τ_min ≥ DEFAULT_TAU): τ then ends within a factor
#: √(1 + 1/σ²) ≈ 2.2 of its floor τ_min.
DEFAULT_FALLBACK_SIGMA = 0.5


# erf and its inverse on scalars from the standard library (math.erf, statistics' normal
# quantile refined by Newton's method on math.erf / math.erfc): importing scipy.special for
# two scalar functions cost a link a fifth of a second.
erf = math.erf


def erfinv(y: float) -> float:
    """The inverse of :func:`math.erf` on [−1, 1] (±inf at ±1): the normal quantile as a
    start, then Newton's method on erf (on erfc above 1/2, where 1 − y is exact), to the
    last bits math.erf can tell apart."""
    y = float(y)
    if math.isnan(y) or abs(y) > 1.0:
        return math.nan
    if abs(y) == 1.0:
        return math.copysign(math.inf, y)
    if y < 0.0:
        return -erfinv(-y)
    if y == 0.0:
        return 0.0
    tail = 1.0 - y  # exact for y ≥ 1/2 (Sterbenz)
    x = (-NormalDist().inv_cdf(tail / 2.0) if y > 0.5 else NormalDist().inv_cdf((1.0 + y) / 2.0)
         ) / math.sqrt(2.0)
    if y <= 0.5:
        x = y * math.sqrt(math.pi) / 2.0 if x == 0.0 else x
    for _ in range(4):
        slope = 2.0 / math.sqrt(math.pi) * math.exp(-x * x)
        # f(x) = erfc(x) − (1 − y) or erf(x) − y; f' = ∓slope
        step = ((math.erfc(x) - tail) if y > 0.5 else (y - math.erf(x))) / slope
        x += step
        if abs(step) <= 4e-16 * abs(x):
            break
    return x


def _check_sigma0(sigma0: float, resolution: float = 1.0) -> None:
    if not (math.isfinite(sigma0) and sigma0 >= 0.0):
        raise LinkageError(f"σ0 must be a finite number ≥ 0, got {sigma0!r}")
    if not (math.isfinite(resolution) and resolution > 0.0):
        raise LinkageError(f"the distance resolution must be a finite number > 0, got "
                           f"{resolution!r}")


def tau_for_sigma(sigma: float, sigma0: float, *, resolution: float = 1.0) -> float:
    """τ = erf(r·√(σ²+1) / (2√2·σ·σ0)) (FedSim Theorem 2, distance step r); 1 when σ = 0 or
    σ0 = 0."""
    _check_sigma0(sigma0, resolution)
    if not (math.isfinite(sigma) and sigma >= 0.0):
        raise LinkageError(f"σ must be a finite number ≥ 0, got {sigma!r}")
    if sigma == 0.0 or sigma0 == 0.0:
        return 1.0
    return float(erf(resolution * math.sqrt(sigma * sigma + 1.0)
                     / (2.0 * math.sqrt(2.0) * sigma * sigma0)))


def tau_min(sigma0: float, *, resolution: float = 1.0) -> float:
    """The smallest achievable τ, the limit of Theorem 2 as σ → ∞: erf(r / (2√2·σ0))."""
    _check_sigma0(sigma0, resolution)
    if sigma0 == 0.0:
        return 1.0
    return float(erf(resolution / (2.0 * math.sqrt(2.0) * sigma0)))


def _round_up(x: float) -> float:
    """``x`` rounded up to 2 significant digits (a τ a user can type that is still above x)."""
    if x <= 0.0:
        return x
    e = math.floor(math.log10(x)) - 1
    return math.ceil(x / 10.0**e) * 10.0**e


def sigma_for_tau(tau: float, sigma0: float, *, resolution: float = 1.0) -> float:
    """Invert Theorem 2: the noise scale σ whose greedy-attack bound equals ``tau``.

    With x = erf⁻¹(τ) and σ0' = σ0 / r (σ0 in distance steps): √(σ²+1)/(2√2·σ·σ0') = x ⇔
    1 + 1/σ² = 8σ0'²x² ⇔ σ = 1/√(8σ0'²x² − 1). τ = 1 needs no noise (σ = 0). Raises
    :class:`LinkageError` when τ ≤ τ_min (unreachable for any σ), naming the smallest τ that
    can be asked for and the ``sigma`` alternative.
    """
    if not (isinstance(tau, (int, float)) and math.isfinite(tau) and 0.0 < tau <= 1.0):
        raise LinkageError(f"`tau` must be a number in (0, 1], got {tau!r}")
    floor = tau_min(sigma0, resolution=resolution)
    if tau >= 1.0:
        return 0.0
    if tau <= floor:
        # A τ just above the floor needs σ → ∞; suggest one that σ = 10 reaches (within 0.5 %
        # of the floor), rounded up to something a user can type.
        feasible = min(1.0, _round_up(tau_for_sigma(10.0, sigma0, resolution=resolution)))
        scale = "" if resolution == 1.0 else f" and distance step r = {resolution:.3g}"
        raise LinkageError(
            f"`tau` = {tau:.6g} is unreachable: with σ0 = {sigma0:.6g}{scale} the smallest "
            f"achievable greedy-attack success rate is τ_min = erf(r/(2√2·σ0)) = {floor:.6g} "
            f"(FedSim Theorem 2, σ → ∞); choose tau ≥ {feasible:.2g} (the smallest feasible, "
            f"rounded up), or give `sigma` instead of `tau` (e.g. sigma = 1 gives τ = "
            f"{tau_for_sigma(1.0, sigma0, resolution=resolution):.3g})"
        )
    x = float(erfinv(tau))
    s0 = sigma0 / resolution
    return 1.0 / math.sqrt(8.0 * s0 * s0 * x * x - 1.0)


def tau_in_words(tau: float) -> str:
    """What a greedy-attack bound τ means, in words (FedSim Theorem 2)."""
    what = (f"τ = {tau:.3g} bounds the chance that a peer who receives the similarities "
            f"recovers a compared record's encoding (its Bloom filter, or a model link's "
            f"comparison levels) by FedSim's greedy attack")
    if tau >= 0.5:
        return (f"{what}; near 1 it is almost no protection: the attack then succeeds about "
                f"as often as without any noise")
    if tau > DEFAULT_TAU:
        return f"{what}; it is weaker than the private default τ = {DEFAULT_TAU:g}"
    return what


def describe_protection(sigma: float | None, tau: float | None, epsilon: float | None = None,
                        delta: float | None = None) -> str:
    """The similarities' protection in one line, for every summary and the ledger."""
    if sigma is None or tau is None or not sigma > 0.0 or tau >= 1.0:
        return "similarities: none (τ = 1): no noise, a greedy attacker recovers distances"
    eps = "ε = ∞" if epsilon is None or math.isinf(epsilon) else f"ε = {epsilon:.3g}"
    at = f" at δ = {delta:g}" if delta is not None else ""
    return (f"similarities: Gaussian noise σ = {sigma:.4g}, greedy-attack bound τ = {tau:.4g} "
            f"(FedSim Theorem 2), {eps}{at} (Theorem 1)")


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
