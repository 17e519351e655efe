"""Threads of a large numpy pass (vflink._threads) and the elementwise passes that use them."""

from __future__ import annotations

import numpy as np
import pytest

from vflink import _threads
from vflink.linkage import soft


def test_a_pass_takes_one_thread_per_core_within_its_bounds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_threads, "cores", lambda: 16)
    assert _threads.pass_threads(_threads.PASS_MIN - 1) == 1
    assert _threads.pass_threads(_threads.PASS_MIN) == 2  # each at least half the minimum
    assert _threads.pass_threads(100 * _threads.PASS_MIN) == _threads.MAX_PASS_THREADS
    monkeypatch.setattr(_threads, "cores", lambda: 1)
    assert _threads.pass_threads(100 * _threads.PASS_MIN) == 1


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
def test_eq1_in_pieces_gives_the_whole_passes_bits(monkeypatch: pytest.MonkeyPatch,
                                                   threads: int) -> None:
    rng = np.random.default_rng(2)
    d = rng.gamma(2.0, 0.01, (1001, 13))
    mu0, sigma0 = -0.02, 0.013
    want = (-d - mu0) / sigma0
    monkeypatch.setattr(soft, "pass_threads", lambda size: threads)
    got = np.empty_like(d)
    soft._in_parts(lambda a, out: soft._rho(a, mu0, sigma0, out), d, got)
    np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64"])
def test_extremes_in_pieces_equal_numpys(monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    """The minimum and maximum of a large array taken in pieces are numpy's; a NaN in any
    piece is both (as numpy's min and max give it), and a view that is not contiguous is
    taken whole."""
    monkeypatch.setattr(_threads, "cores", lambda: 3)
    rng = np.random.default_rng(4)
    values = (rng.normal(0, 1e3, 3 * _threads.PASS_MIN)).astype(dtype)
    assert _threads.pass_threads(values.size) == 3
    lo, hi = _threads.extremes(values)
    assert lo == values.min() and hi == values.max()
    assert _threads.extremes(values[::3]) == (values[::3].min(), values[::3].max())
    if dtype != "int64":
        values[-1] = np.nan
        lo, hi = _threads.extremes(values)
        assert np.isnan(lo) and np.isnan(hi)
