"""Blocked top-K search with skewed blocks split by comparison count: equal to a
brute-force search restricted to same-block pairs, whatever the cap and the block sizes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vflink.engine import ComputeConfig, LocalEngine
from vflink.errors import LinkageError
from vflink.linkage import METRICS, Neighbours
from vflink.linkage.blocked import plan_blocks, search_blocked


def oracle(metric: str, p: object, s: object, kp: list[object], ks: list[object]
           ) -> list[list[tuple[float, int]]]:
    """Per primary row, every same-block secondary row as (distance, index), sorted (brute
    force over all pairs, then filtered); a missing or empty key matches nothing."""
    n_s = len(ks)
    full = METRICS.get(metric).brute(p, s, n_s)
    out = []
    for i, key in enumerate(kp):
        out.append(sorted((float(d), int(j)) for d, j in zip(full.distances[i], full.indices[i],
                                                              strict=True)
                          if key not in (None, "") and ks[int(j)] == key))
    return out


def assert_equal_to_oracle(got: Neighbours, want: list[list[tuple[float, int]]], k: int
                           ) -> None:
    """Equal distances (NaN where fewer than K candidates); equal indices below the K-th
    distance, and at it distinct candidates at that distance (which members of a tie at the
    K-th place a search keeps is not specified: "ties aside", as for the chunked search)."""
    for i, cands in enumerate(want):
        row = cands[:k]
        d, idx = got.distances[i], got.indices[i]
        assert np.all(np.isnan(d[len(row):])) and np.all(idx[len(row):] == -1)
        np.testing.assert_allclose(d[:len(row)], [x for x, _ in row], rtol=1e-12, atol=1e-12)
        if not row:
            continue
        last = row[-1][0]
        below = [j for x, j in row if x < last - 1e-12]
        tied = {j for x, j in cands if abs(x - last) <= 1e-12}
        assert idx[:len(below)].tolist() == below
        rest = idx[len(below):len(row)].tolist()
        assert len(set(rest)) == len(rest) and set(rest) <= tied


@st.composite
def blocked_case(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, list[int], list[int], int,
                                           int]:
    # a skewed key: block sizes drawn per side, one block often far larger than the others
    n_blocks = draw(st.integers(1, 5))
    sizes_p = draw(st.lists(st.integers(0, 30), min_size=n_blocks, max_size=n_blocks))
    sizes_s = draw(st.lists(st.integers(0, 40), min_size=n_blocks, max_size=n_blocks))
    kp = [b for b, n in enumerate(sizes_p) for _ in range(n)] + [-1]  # -1: no secondary peer
    ks = [b for b, n in enumerate(sizes_s) for _ in range(n)] + [99]
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    kp = list(rng.permutation(kp))
    ks = list(rng.permutation(ks))
    grid = draw(st.booleans())  # small integers: many ties
    make = ((lambda n: rng.integers(0, 5, size=(n, 2)).astype(float)) if grid
            else (lambda n: rng.normal(size=(n, 2))))
    return make(len(kp)), make(len(ks)), kp, ks, draw(st.integers(1, 6)), \
        draw(st.integers(1, 200))


@settings(max_examples=80, deadline=None)
@given(blocked_case())
def test_blocked_search_equals_brute_force(case: tuple[np.ndarray, np.ndarray, list[int],
                                                       list[int], int, int]) -> None:
    p, s, kp, ks, k, cap = case
    got = search_blocked("euclidean", p, s, k, primary_keys=kp, secondary_keys=ks,
                         max_comparisons=cap)
    assert got.indices.shape == (len(p), k) and got.exact
    assert_equal_to_oracle(got, oracle("euclidean", p, s, kp, ks), k)
    # and the split changes nothing: one package per block gives the same links
    whole = search_blocked("euclidean", p, s, k, primary_keys=kp, secondary_keys=ks,
                           max_comparisons=10**9)
    np.testing.assert_array_equal(got.distances, whole.distances)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=60),
       st.lists(st.integers(0, 6), min_size=1, max_size=60), st.integers(1, 50))
def test_packages_cover_every_same_block_pair_once_within_the_cap(
        kp: list[int], ks: list[int], cap: int) -> None:
    packages = plan_blocks(kp, ks, max_comparisons=cap)
    pairs: list[tuple[int, int]] = []
    for package in packages:
        load = sum(piece.comparisons for piece in package)
        lone_row = len(package) == 1 and len(package[0].primary) == 1
        assert load <= cap or lone_row
        assert all(len(piece.secondary) <= cap for piece in package)
        for piece in package:
            pairs += [(int(i), int(j)) for i in piece.primary for j in piece.secondary]
    want = [(i, j) for i, a in enumerate(kp) for j, b in enumerate(ks) if a == b]
    assert sorted(pairs) == sorted(want)


def _strings(rng: np.random.Generator, n: int) -> list[str]:
    return ["".join(rng.choice(list("abcd"), rng.integers(2, 6))) for _ in range(n)]


@pytest.mark.parametrize("metric,make", [
    ("hamming", lambda r, n: r.integers(0, 256, size=(n, 4), dtype=np.uint8)),
    ("levenshtein", _strings),
    ("haversine", lambda r, n: np.c_[r.uniform(-60, 60, n), r.uniform(-170, 170, n)]),
])
def test_other_metrics_and_engines(metric: str, make: object) -> None:
    rng = np.random.default_rng(5)
    p, s = make(rng, 120), make(rng, 300)  # type: ignore[operator]
    # one block holds most records (skew), a few are tiny, some keys are empty
    kp = list(rng.choice(["big", "a", "b", ""], 120, p=[0.7, 0.1, 0.1, 0.1]))
    ks = list(rng.choice(["big", "a", "c", ""], 300, p=[0.8, 0.1, 0.05, 0.05]))
    want = oracle(metric, p, s, kp, ks)
    local = search_blocked(metric, p, s, 4, primary_keys=kp, secondary_keys=ks,
                           max_comparisons=500)
    assert_equal_to_oracle(local, want, 4)
    with LocalEngine(ComputeConfig(num_cpus=2)) as engine:
        threaded = search_blocked(metric, p, s, 4, primary_keys=kp, secondary_keys=ks,
                                  max_comparisons=500, compute=engine)
    np.testing.assert_array_equal(threaded.indices, local.indices)
    np.testing.assert_array_equal(threaded.distances, local.distances)


def test_bad_arguments() -> None:
    p = np.zeros((3, 2))
    with pytest.raises(LinkageError, match="blocking keys: 2 primary"):
        search_blocked("euclidean", p, p, 1, primary_keys=[1, 2], secondary_keys=[1, 2, 3])
    with pytest.raises(LinkageError, match="max_comparisons"):
        plan_blocks([1], [1], max_comparisons=0)
