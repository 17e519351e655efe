"""The one-run canary audit's statistics: Clopper–Pearson against its defining tails, the ε
lower bound against randomized response (below the truth at the stated confidence, and
powerful enough to see it)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import beta, binom

from vflink.attacks.audit import (
    audit_guesses,
    clopper_pearson,
    logit,
    one_run_epsilon_lower,
    one_run_p_value,
)


@pytest.mark.parametrize(("k", "n"), [(0, 10), (3, 10), (10, 10), (63, 70), (500, 1000)])
def test_clopper_pearson_is_the_exact_binomial_interval(k: int, n: int) -> None:
    lo, hi = clopper_pearson(k, n, 0.95)
    if k > 0:  # P[Bin(n, lo) ≥ k] = 2.5 %
        assert binom.sf(k - 1, n, lo) == pytest.approx(0.025, abs=1e-9)
    else:
        assert lo == 0.0
    if k < n:  # P[Bin(n, hi) ≤ k] = 2.5 %
        assert binom.cdf(k, n, hi) == pytest.approx(0.025, abs=1e-9)
    else:
        assert hi == 1.0
    assert lo <= k / n <= hi
    with pytest.raises(ValueError):
        clopper_pearson(3, 2)


def test_the_pure_bound_is_the_logit_of_the_one_sided_clopper_pearson_bound() -> None:
    for r, v in ((70, 63), (354, 212), (1000, 1000), (200, 150)):
        lower = float(beta.ppf(0.05, v, r - v + 1))  # one-sided at 95 %
        assert one_run_epsilon_lower(1000, r, v, 0.0, 0.95) == pytest.approx(
            max(logit(lower), 0.0), abs=1e-6)
    # 1,000 canaries all guessed right: ε ≥ 5.8 at 95 % (q^1000 = 0.05)
    assert one_run_epsilon_lower(1000, 1000, 1000) == pytest.approx(
        logit(0.05 ** (1 / 1000)), abs=1e-6)
    assert one_run_epsilon_lower(1000, 100, 50) == 0.0  # chance proves nothing


def test_delta_only_weakens_the_bound_and_the_p_value_grows_with_epsilon() -> None:
    values = [one_run_p_value(1000, 200, 150, e, 1e-5) for e in np.linspace(0, 3, 20)]
    assert all(b >= a for a, b in zip(values, values[1:], strict=False))
    assert one_run_p_value(1000, 200, 150, 1.0, 1e-3) > one_run_p_value(1000, 200, 150, 1.0, 0)
    assert (one_run_epsilon_lower(1000, 200, 150, 1e-3)
            <= one_run_epsilon_lower(1000, 200, 150, 0.0))
    with pytest.raises(ValueError):
        one_run_p_value(10, 20, 5, 1.0, 0.0)


def _randomized_response(eps: float, m: int, rng: np.random.Generator
                         ) -> tuple[np.ndarray, np.ndarray]:
    """m canaries' bits and the scores of an attacker who sees each bit through ε-RR with a
    confidence it can rank by (a continuous score whose sign is the response)."""
    bits = rng.integers(0, 2, size=m)
    keep = rng.random(m) < math.exp(eps) / (1 + math.exp(eps))
    response = np.where(keep, bits, 1 - bits)
    return bits, (2 * response - 1) * rng.random(m)


def test_the_bound_stays_below_the_truth_and_finds_it() -> None:
    rng = np.random.default_rng(7)
    eps = 1.0
    over = over_cut = 0
    for _ in range(60):
        bits, scores = _randomized_response(eps, 600, rng)
        fig = audit_guesses(scores, bits, confidence=0.95)
        over += fig.epsilon_lower > eps
        assert fig.guesses in fig.tried and 0 <= fig.correct <= fig.guesses
        over_cut += audit_guesses(scores, bits, threshold=0.0).epsilon_lower > eps
        assert fig.accuracy_interval[0] <= fig.accuracy <= fig.accuracy_interval[1]
    assert over <= 6 and over_cut <= 6  # at most the 5 % the confidence allows (and slack)
    bits, scores = _randomized_response(3.0, 2000, rng)
    assert audit_guesses(scores, bits).epsilon_lower > 2.0  # the audit has power
    # an attacker who reads every bit: the bound is the count's, far above a claim of 4
    fig = audit_guesses(bits + 0.01 * rng.random(2000), bits)
    assert fig.correct == fig.guesses and fig.epsilon_lower > 5.0
    with pytest.raises(ValueError):
        audit_guesses([1.0], [1])
