"""Top-K search as chunk tasks and the exact merge of partial top-Ks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vflink.engine import ComputeConfig, LocalEngine
from vflink.errors import LinkageError
from vflink.linkage import METRICS, Neighbours, SearchOptions, merge_topk, search_chunked
from vflink.linkage.chunked import plan_tasks


@given(st.integers(1, 6), st.lists(st.integers(1, 7), min_size=1, max_size=5),
       st.integers(0, 2**31 - 1), st.integers(1, 6))
def test_merge_topk_equals_brute_force(n: int, widths: list[int], seed: int, k: int) -> None:
    """Oracle: the K smallest (distance, index) of all candidates, per row. Small integer
    distances make ties common."""
    rng = np.random.default_rng(seed)
    total = sum(widths)
    k = min(k, total)
    dist = rng.integers(0, 4, size=(n, total)).astype(np.float64)
    idx = np.tile(rng.permutation(10 * total)[:total], (n, 1)).astype(np.int64)
    parts, start = [], 0
    for w in widths:
        d, i = dist[:, start:start + w], idx[:, start:start + w]
        order = np.lexsort((i, d), axis=-1)  # each part sorted, as a search returns it
        parts.append((np.take_along_axis(d, order, 1), np.take_along_axis(i, order, 1)))
        start += w
    got_d, got_i = merge_topk(parts, k)
    for r in range(n):
        want = sorted(zip(dist[r], idx[r]))[:k]
        assert list(zip(got_d[r], got_i[r])) == want


def test_merge_topk_refuses_bad_k() -> None:
    part = (np.zeros((2, 3)), np.arange(6).reshape(2, 3))
    with pytest.raises(LinkageError, match="k = 4"):
        merge_topk([part], 4)
    with pytest.raises(LinkageError):
        merge_topk([], 1)


def _strings(rng: np.random.Generator, n: int) -> list[str]:
    return ["".join(rng.choice(list("abcdefghij"), rng.integers(4, 12))) for _ in range(n)]


CASES = {
    "euclidean-2d": ("euclidean", lambda r, n: r.normal(size=(n, 2))),
    "euclidean-8d": ("euclidean", lambda r, n: r.normal(size=(n, 8))),
    "euclidean-grid": ("euclidean", lambda r, n: r.integers(0, 40, size=(n, 2)).astype(float)),
    "haversine": ("haversine", lambda r, n: np.c_[r.uniform(-60, 60, n), r.uniform(-170, 170,
                                                                                  n)]),
    "hamming": ("hamming", lambda r, n: r.integers(0, 256, size=(n, 8), dtype=np.uint8)),
    "levenshtein": ("levenshtein", _strings),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("threads", [1, 2])
def test_chunked_search_equals_one_search(case: str, threads: int) -> None:
    metric, make = CASES[case]
    rng = np.random.default_rng(7)
    p, s = make(rng, 700), make(rng, 1100)
    k = 7
    exact = SearchOptions(mode="exact")
    whole = METRICS.get(metric).search(p, s, k, options=exact)
    with LocalEngine(ComputeConfig(num_cpus=threads, chunk_rows=250)) as engine:
        chunked = search_chunked(metric, p, s, k, compute=engine)
    assert_same_topk(chunked, whole, METRICS.get(metric).search(p, s, k + 1, options=exact))
    assert chunked.exact


def assert_same_topk(got: Neighbours, want: Neighbours, next_one: Neighbours) -> None:
    """Equal distances everywhere; equal indices on every row without a tie across the K-th
    position (which tied member an index keeps is not specified: "ties aside")."""
    np.testing.assert_array_equal(got.distances, want.distances)
    if np.array_equal(got.indices, want.indices):  # searches that break ties by index
        return
    clear = want.distances[:, -1] < next_one.distances[:, -1]
    np.testing.assert_array_equal(got.indices[clear], want.indices[clear])
    assert clear.mean() > 0.2  # the comparison is not vacuous


def test_tasks_cover_every_pair_once() -> None:
    chunks, parts = plan_tasks(1000, 2500, chunk_rows=600, workers=2)
    assert [a for a, _ in parts] == [0, 600, 1200, 1800, 2400] and parts[-1][1] == 2500
    assert chunks[0][0] == 0 and chunks[-1][1] == 1000
    assert all(b - a <= 600 for a, b in chunks + parts)


def test_approximate_search_stays_one_search() -> None:
    rng = np.random.default_rng(0)
    p, s = rng.normal(size=(300, 8)), rng.normal(size=(2000, 8))
    calls: list[int] = []

    class Counting(LocalEngine):
        def map(self, fn, items, *, shared=None, progress=None):  # type: ignore[no-untyped-def]
            calls.append(len(items))
            return super().map(fn, items, shared=shared, progress=progress)

    options = SearchOptions(mode="approximate", recall_sample=50)
    got = search_chunked("euclidean", p, s, 5, compute=Counting(ComputeConfig(chunk_rows=100)),
                         options=options)
    want = METRICS.get("euclidean").search(p, s, 5, options=options)
    assert calls == [] and not got.exact
    np.testing.assert_array_equal(got.indices, want.indices)


def test_k_larger_than_the_secondary_is_the_search_error() -> None:
    with pytest.raises(LinkageError, match="larger than the secondary"):
        search_chunked("euclidean", np.zeros((3, 2)), np.zeros((2, 2)), 3,
                       compute=LocalEngine(ComputeConfig(chunk_rows=1)))
