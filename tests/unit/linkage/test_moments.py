"""Eq. 1's moments (vflink.linkage.moments): the exact sum of any finite float64 values, in any
order and any split into chunks, against a brute-force oracle in exact rational arithmetic
(``fractions.Fraction``); the mean and deviation each rounded once from it; the two-thread
path equal to the serial one; and the similarities of Eq. 1 normalised by them."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from vflink.linkage import moments
from vflink.linkage.moments import ExactSum, exact_moments, squares_total
from vflink.linkage.soft import normalize_similarities

FINITE = st.floats(allow_nan=False, allow_infinity=False, width=64)
#: distances as links have them: non-negative, over a few binades, ties and zeros included
DISTANCES = st.one_of(st.floats(0.0, 1e6), st.sampled_from([0.0, 0.5, 1.0, 2.0**-30]))


def exact_sum(values: np.ndarray) -> Fraction:
    return sum((Fraction(float(v)) for v in values.ravel()), Fraction(0))


def oracle_moments(values: np.ndarray) -> tuple[float, float]:
    """Brute force: the mean rounded once from the exact sum; the deviation from the exact
    sum of the squares as numpy rounds each of them."""
    x = values.astype(np.float64).ravel()
    mean = float(exact_sum(x) / x.size)
    dev = x - mean
    dev *= dev
    return mean, math.sqrt(float(exact_sum(dev) / x.size))


@settings(max_examples=200, deadline=None)
@given(arrays(np.float64, st.integers(0, 300), elements=FINITE))
def test_exact_sum_is_the_rational_sum_of_any_finite_values(values: np.ndarray) -> None:
    acc = ExactSum()
    acc.add(values)
    assert Fraction(acc.total, 2**1127) == exact_sum(values)
    assert acc.count == values.size


@settings(max_examples=100, deadline=None)
@given(arrays(np.float64, st.integers(1, 400), elements=FINITE), st.integers(1, 12),
       st.integers(0, 2**32 - 1))
def test_any_split_in_any_order_gives_the_same_bits(values: np.ndarray, parts: int,
                                                    seed: int) -> None:
    whole = ExactSum()
    whole.add(values)
    order = np.random.default_rng(seed).permutation(values.size)
    split = ExactSum()
    for part in np.array_split(values[order], parts):
        split.add(part)
    assert (split.total, split.count) == (whole.total, whole.count)
    assert split.mean() == whole.mean() == float(exact_sum(values) / values.size)


@settings(max_examples=150, deadline=None)
@given(arrays(np.float64, st.integers(1, 300), elements=DISTANCES))
def test_moments_equal_the_brute_force_oracle(values: np.ndarray) -> None:
    mean, std = exact_moments(values)
    assert (mean, std) == oracle_moments(values)
    # and numpy's own (rounded) moments, to rounding
    assert mean == pytest.approx(values.mean(), rel=1e-12, abs=1e-300)
    assert std == pytest.approx(values.std(), rel=1e-9, abs=1e-12 * max(1.0, mean))


def test_ranges_far_apart_subnormals_and_signs() -> None:
    cases = [np.array([1e300, 1e-300, -1e300, 5e-324]), np.array([2.0**60 + 2, 3.0, -0.0]),
             np.array([1e-310, -3e-320, 1.5]), np.array([0.0, 0.0]),
             np.array([2.0**-1074] * 5 + [2.0**1023])]
    for values in cases:
        acc = ExactSum()
        acc.add(values)
        assert Fraction(acc.total, 2**1127) == exact_sum(values)


def test_non_finite_values_are_refused() -> None:
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(ValueError, match="finite"):
            ExactSum().add(np.array([1.0, bad]))


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_threads_give_the_serial_bits(monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    rng = np.random.default_rng(7)
    d = np.abs(rng.normal(0.05, 0.02, 3 * moments._BLOCK + 12_345))  # several blocks a thread
    d[::1000] = 0.0
    monkeypatch.setattr(moments, "pass_threads", lambda size: threads)
    threaded = exact_moments(d)
    monkeypatch.setattr(moments, "pass_threads", lambda size: 1)
    assert exact_moments(d) == threaded  # each path exact (the oracle tests above)


def test_a_streamed_second_pass_equals_the_whole() -> None:
    rng = np.random.default_rng(3)
    d = rng.gamma(2.0, 3.0, size=5000)
    mean, std = exact_moments(d)
    total = ExactSum()
    for part in np.array_split(d, 7):
        chunk = squares_total(part, mean)
        total.total += chunk.total
        total.count += chunk.count
    assert math.sqrt(total.mean()) == std


def test_eq1_similarities_use_the_exact_moments_with_missing_links_too() -> None:
    rng = np.random.default_rng(5)
    d = rng.random((50, 4)) * 10
    d[3, 2] = np.nan  # a missing link: left out of μ0 and σ0
    rho, mu0, sigma0 = normalize_similarities(d)
    mean, std = oracle_moments(d[np.isfinite(d)])
    assert (mu0, sigma0) == (-mean, std)
    assert np.isnan(rho[3, 2])
    want = -d
    want -= mu0
    want /= sigma0
    np.testing.assert_array_equal(rho, want)  # Eq. 1, bit for bit as a streamed chunk makes it
    assert float(np.nanmean(rho)) == pytest.approx(0.0, abs=1e-12)
