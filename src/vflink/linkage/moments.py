"""Exact, order-free sums for FedSim Eq. 1's μ0 and σ0, equal whole or in chunks.

Eq. 1 normalises the similarities by the mean and standard deviation of all n × K distances.
A floating-point sum depends on the order of its terms: numpy's pairwise sum over the whole
array and a running sum over chunks differ in the last bits, and so would every similarity.
Here each float64 is split exactly into an integer multiple of 2⁻¹¹²⁷ and the integers are
summed exactly (Python ints), so the sum of any partition of the terms, in any order, is the
same number; the mean is then that exact sum divided by the count, rounded once (Python's
int / int is correctly rounded). The in-memory linkage and the streamed one (chunk by chunk,
on any engine) therefore get bit-identical μ0 and σ0.

Cost: a few integer passes and two ``bincount`` over the terms' bits.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

__all__ = ["ExactSum", "exact_moments"]

_DIGIT = 27  # bits per digit: a bin's float64 sum of < 2^26 digits of < 2^27 stays exact
_MAX_TERMS = 1 << 25
_MASK = (1 << _DIGIT) - 1
_UNIT = 1127  # sums are kept in units of 2^-1127 (the smallest subnormal over 2^53)


class ExactSum:
    """An exact running sum of float64 values and their count (finite values only)."""

    __slots__ = ("count", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0  # the sum in units of 2^-1127 (Python int, exact)

    def add(self, values: npt.ArrayLike) -> None:
        x = np.asarray(values, dtype=np.float64).reshape(-1)
        for start in range(0, x.size, _MAX_TERMS):
            self._add(x[start:start + _MAX_TERMS])
        self.count += int(x.size)

    def _add(self, x: npt.NDArray[np.float64]) -> None:
        if x.size == 0:
            return
        if np.signbit(x).any():  # (distances and squares never are)
            self._add(x[~np.signbit(x)])
            neg = ExactSum()
            neg._add(-x[np.signbit(x)])
            self.total -= neg.total
            return
        # IEEE 754: x = mant · 2^(max(e, 1) − 1075) with the biased exponent e and the 52-bit
        # fraction plus the implicit bit for normal numbers; in units of 2^-1127 that is
        # mant · 2^(max(e, 1) − 1075 + 1127) = mant · 2^(max(e, 1) + 52).
        bits = x.view(np.int64)
        e = bits >> 52
        mant = (bits & ((1 << 52) - 1)) | ((e > 0).astype(np.int64) << 52)
        bins = np.maximum(e, 1)
        base = int(bins.min())
        bins -= base
        total = 0
        for d in range(2):  # 2 × 27 bits ≥ 53
            digits = ((mant >> (d * _DIGIT)) & _MASK).astype(np.float64)
            sums = np.bincount(bins, weights=digits)
            for b in np.flatnonzero(sums):
                total += int(sums[b]) << (base + int(b) + 52 + d * _DIGIT)
        self.total += total

    def mean(self) -> float:
        """The exact sum over the count, rounded once (0.0 with no values)."""
        if self.count == 0:
            return 0.0
        return self.total / (self.count << _UNIT)


def exact_moments(values: npt.ArrayLike) -> tuple[float, float]:
    """(mean, population standard deviation) of ``values``, each rounded once from an exact
    sum: the same bits however the values are split into chunks (see the module docstring).
    The deviation is Σ(x − mean)² with each square rounded as numpy rounds it."""
    x = np.asarray(values, dtype=np.float64)
    first = ExactSum()
    first.add(x)
    mean = first.mean()
    second = ExactSum()
    dev = x - mean
    dev *= dev
    second.add(dev)
    return mean, math.sqrt(second.mean())
