"""The most an attack may reach under a protection's stated guarantee: pure functions.

**(ε, δ)-DP bounds every test of one record's secret.** A mechanism is (ε, δ)-DP exactly when,
for every test telling two neighbouring datasets apart (here: one record's label 0 or 1, every
other record fixed), its false-positive rate α and true-positive rate β satisfy

    β ≤ e^ε·α + δ     and     1 − α ≤ e^ε·(1 − β) + δ,

the privacy region of Kairouz, Oh & Viswanath (ICML 2015, Theorem 2.1), or the trade-off
function f_{ε,δ} of Dong, Roth & Su (*Gaussian Differential Privacy*, JRSS B 2022, §2.1). So
every ROC curve lies under

    β(α) = min(1, e^ε·α + δ, 1 − e^{−ε}·(1 − δ − α)),

whose two sloped pieces meet at α* = (1 − δ)/(1 + e^ε) and which reaches 1 at α = 1 − δ. Its
area is the largest AUC any attack can have (:func:`dp_auc_ceiling`):

    AUC_max(ε, δ) = e^ε·α*²/2 + δ·α* + w − e^{−ε}·w²/2 + δ,     w = 1 − δ − α*,

which is e^ε/(1 + e^ε) at δ = 0 (0.982 at ε = 4, 0.731 at ε = 1). An AUC over many records is
the area under the mean of their ROC points; each point obeys the two linear constraints, so
their mean does too, and the ceiling bounds a pooled or a per-batch AUC alike. It bounds the
test either way round (a flipped score is another test), so an attack's AUC is compared by
max(AUC, 1 − AUC).

**Gaussian releases are tighter.** A record released m_k times with Gaussian noise σ_k (in
units of the sensitivity) is μ-GDP with μ = √(Σ m_k/σ_k²) (Dong et al., Corollary 3.3), whose
trade-off curve is the binormal ROC with separation μ; its area is Φ(μ/√2)
(:func:`gdp_auc_ceiling`). The run's ledger states (ε, δ), so that is the stated limit; the
Gaussian figure says how close to the mechanism's own optimum an attack came.

These are the privacy layer's reading of its own guarantees (the label ledger states them in
words: :func:`explain_ceiling`); :mod:`vflink.attacks.limits` judges attacks against them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from scipy.stats import norm

__all__ = ["dp_auc_ceiling", "explain_ceiling", "gdp_auc_ceiling", "gdp_mu", "leak"]


def dp_auc_ceiling(epsilon: float, delta: float = 0.0) -> float:
    """The largest AUC of any test of one record's secret under (ε, δ)-DP (module docstring)."""
    eps, d = float(epsilon), float(delta)
    if not (eps >= 0 and 0 <= d):
        raise ValueError(f"need ε ≥ 0 and δ ≥ 0, got ε = {epsilon!r}, δ = {delta!r}")
    if d >= 1 or math.isinf(eps):
        return 1.0
    a_star = (1.0 - d) / (1.0 + math.exp(eps))
    w = 1.0 - d - a_star
    area = (math.exp(eps) * a_star ** 2 / 2.0 + d * a_star      # β = e^ε·α + δ on [0, α*]
            + w - math.exp(-eps) * w ** 2 / 2.0                  # 1 − e^{−ε}(1 − δ − α) to 1 − δ
            + d)                                                 # β = 1 on [1 − δ, 1]
    return min(1.0, area)


def gdp_mu(releases: Iterable[tuple[float, int]]) -> float:
    """μ of a record released ``count`` times with Gaussian noise ``sigma`` (times the
    sensitivity) per ``(sigma, count)``: √(Σ count/σ²) (Dong et al., Corollary 3.3)."""
    total = 0.0
    for sigma, count in releases:
        if count <= 0:
            continue
        if not sigma > 0:
            return math.inf
        total += int(count) / float(sigma) ** 2
    return math.sqrt(total)


def gdp_auc_ceiling(mu: float) -> float:
    """The largest AUC of any test under μ-GDP: the binormal ROC's area Φ(μ/√2)."""
    if math.isinf(mu):
        return 1.0
    return float(norm.cdf(float(mu) / math.sqrt(2.0)))


def leak(auc: float) -> float:
    """How far an AUC reads the secret, either way round: max(AUC, 1 − AUC)."""
    return max(float(auc), 1.0 - float(auc)) if math.isfinite(auc) else math.nan


def explain_ceiling(epsilon: float, delta: float, mu: float | None = None) -> str:
    """What (ε, δ) — and, for Gaussian releases, μ — let an attacker read of one record's
    label, in words, for the ledger."""
    text = (f"no test of one record's label, however strong and knowing every other label, "
            f"has an AUC above {dp_auc_ceiling(epsilon, delta):.3f} (what ε = {epsilon:.3g}, "
            f"δ = {delta:g} allow)")
    if mu is not None and math.isfinite(mu):
        text += (f"; for these Gaussian releases (μ = {mu:.3g}) the optimal test reaches "
                 f"{gdp_auc_ceiling(mu):.3f}")
    return text
