"""An empirical privacy audit with many canaries in one run: pure functions.

Steinke, Nasr & Jagielski (*Privacy Auditing with One (1) Training Run*, NeurIPS 2023): m
canaries each carry an independent fair secret bit (here: a record's label, drawn at random
before training); after one training run the auditor guesses r of the bits (abstaining on the
rest) from what an attacker holds. If the mechanism is ε-DP for each canary, the number of
correct guesses V is stochastically dominated by Binomial(r, e^ε/(1 + e^ε)) (their main
theorem: each guess is a randomized response at ε, whatever the other canaries do); with
(ε, δ)-DP the tail gains a term of at most 2·m·δ·α, α = max_{i ≥ 1} P[v − i ≤ B < v]/i (their
(ε, δ) extension), so

    p(ε) = P[Binomial(r, q_ε) ≥ v] + 2·m·δ·α(ε),     q_ε = e^ε/(1 + e^ε),

is a p-value for "the mechanism is (ε, δ)-DP" having produced v correct guesses. The empirical
lower bound at confidence 1 − β is the largest ε this rejects (:func:`one_run_epsilon_lower`).
At δ = 0 it is the logit of the one-sided Clopper–Pearson lower bound on the guesses'
accuracy, and the two-sided Clopper–Pearson interval of the accuracy, read through the same
logit, is reported beside it (:func:`clopper_pearson`, from SciPy's beta quantiles). Trying
several numbers of guesses costs a Bonferroni correction (:func:`audit_guesses`).

What this measures: a lower bound on the ε of the release the attacker saw, with what the
attacker's scores can find. It is below the claim when the protection holds (and a weak
attacker leaves it near 0); above the claim it proves the claim false (at that confidence).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.stats import beta as beta_dist
from scipy.stats import binom

__all__ = ["GuessFigures", "audit_guesses", "clopper_pearson", "logit", "one_run_epsilon_lower",
           "one_run_p_value"]


def clopper_pearson(successes: int, trials: int, confidence: float = 0.95
                    ) -> tuple[float, float]:
    """The two-sided Clopper–Pearson interval of a binomial proportion (SciPy's beta
    quantiles: Beta(k, n − k + 1) and Beta(k + 1, n − k) at (1 ∓ confidence)/2)."""
    k, n = int(successes), int(trials)
    if not (0 <= k <= n) or n == 0:
        raise ValueError(f"need 0 ≤ successes ≤ trials and trials ≥ 1, got {k} of {n}")
    a = (1.0 - confidence) / 2.0
    lo = 0.0 if k == 0 else float(beta_dist.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta_dist.ppf(1.0 - a, k + 1, n - k))
    return lo, hi


def logit(p: float) -> float:
    """log(p/(1 − p)): the ε of randomized response with accuracy p (±inf at 1 and 0)."""
    if p <= 0.0:
        return -math.inf
    if p >= 1.0:
        return math.inf
    return math.log(p / (1.0 - p))


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P-value of ≥ ``v`` correct guesses out of ``r`` (of ``m`` canaries) under
    (ε, δ)-DP (module docstring)."""
    if not (0 <= v <= r <= m):
        raise ValueError(f"need 0 ≤ v ≤ r ≤ m, got v = {v}, r = {r}, m = {m}")
    q = 1.0 / (1.0 + math.exp(-float(epsilon)))
    tail = float(binom.sf(v - 1, r, q))
    if delta <= 0 or v == 0:
        return min(tail, 1.0)
    pmf = binom.pmf(np.arange(v - 1, -1, -1), r, q)  # P[B = v − i], i = 1 .. v
    alpha = float(np.max(np.cumsum(pmf) / np.arange(1, v + 1)))
    return min(tail + 2.0 * m * float(delta) * alpha, 1.0)


def one_run_epsilon_lower(m: int, r: int, v: int, delta: float = 0.0,
                          confidence: float = 0.95) -> float:
    """The largest ε that ``v`` correct guesses of ``r`` reject at ``confidence``: the
    empirical lower bound (0 when even ε = 0 is not rejected)."""
    level = 1.0 - confidence
    if r == 0 or one_run_p_value(m, r, v, 0.0, delta) >= level:
        return 0.0
    lo, hi = 0.0, 1.0
    while one_run_p_value(m, r, v, hi, delta) < level:
        lo, hi = hi, 2.0 * hi
        if hi > 1e3:
            return math.inf
    for _ in range(60):  # bisection: p(ε) grows with ε
        mid = 0.5 * (lo + hi)
        if one_run_p_value(m, r, v, mid, delta) < level:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class GuessFigures:
    """The audit at its best number of guesses: ``guesses`` (r) of ``canaries`` (m),
    ``correct`` (v), the ε lower bound at ``confidence`` (Bonferroni over ``tried`` numbers of
    guesses), the guesses' accuracy with its Clopper–Pearson interval, and both read as an ε
    of randomized response (the δ = 0 reading)."""

    canaries: int
    guesses: int
    correct: int
    epsilon_lower: float
    confidence: float
    tried: tuple[int, ...]
    accuracy: float
    accuracy_interval: tuple[float, float]
    epsilon_point: float
    epsilon_interval: tuple[float, float]


def audit_guesses(scores: npt.ArrayLike, bits: npt.ArrayLike, *, delta: float = 0.0,
                  confidence: float = 0.95, threshold: float | None = None,
                  fractions: Sequence[float] = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
                  ) -> GuessFigures:
    """Guess the canaries' bits from ``scores`` (high: bit 1) against ``threshold`` (default:
    the scores' median; the runner fits it on records whose labels the auditor knows): for
    each fraction f, the f·m canaries whose scores lie furthest from the threshold are guessed
    (1 above it, 0 below), the rest abstained on; the ε lower bound of each at the
    Bonferroni-corrected level, the best kept."""
    s = np.asarray(scores, dtype=np.float64)
    b = np.asarray(bits, dtype=np.int64)
    m = len(s)
    if m < 2 or len(b) != m:
        raise ValueError(f"need at least 2 canaries with one bit each, got {m} scores and "
                         f"{len(b)} bits")
    t = float(np.median(s)) if threshold is None else float(threshold)
    order = np.argsort(-np.abs(s - t), kind="stable")  # the most confident first
    right = (s >= t).astype(np.int64) == b
    rs = sorted({max(1, min(m, int(round(f * m)))) for f in fractions})
    per_test = 1.0 - (1.0 - confidence) / len(rs)
    best: tuple[float, int, int] | None = None
    for r in rs:
        correct = int(right[order[:r]].sum())
        eps = one_run_epsilon_lower(m, r, correct, delta, per_test)
        if best is None or eps > best[0] or (eps == best[0] and correct / r
                                             > best[2] / best[1]):
            best = (eps, r, correct)
    if best is None:  # pragma: no cover - rs is never empty
        raise ValueError("no guesses")
    eps, r, correct = best
    lo, hi = clopper_pearson(correct, r, confidence)
    return GuessFigures(canaries=m, guesses=r, correct=correct, epsilon_lower=eps,
                        confidence=confidence, tried=tuple(rs),
                        accuracy=correct / r, accuracy_interval=(lo, hi),
                        epsilon_point=logit(correct / r),
                        epsilon_interval=(logit(lo), logit(hi)))
