"""The grouped binary IVF search (vflink.linkage.binary_ivf) against brute force: every row is
the exact top-K, by (distance, index), of a candidate set that holds at least the members of
the query's own nprobe nearest cells; with every cell probed it is the brute force itself, ties
at the K-th distance included; identical queries get identical rows; queries whose cells hold
fewer than K filters are flagged and searched flat by search_hamming."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from vflink.linkage import SearchOptions
from vflink.linkage.binary_ivf import assign, ivf_hamming_knn
from vflink.linkage.distances import hamming_distances
from vflink.linkage.search import search_hamming


def _canonical(p: np.ndarray, s: np.ndarray, k: int,
               allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each row's K nearest by (distance, index) among ``allowed`` (rows × secondary mask)."""
    d = hamming_distances(p, s)
    if allowed is not None:
        d = np.where(allowed, d, np.inf)
    order = np.lexsort((np.broadcast_to(np.arange(len(s)), d.shape), d), axis=-1)[:, :k]
    return np.take_along_axis(d, order, 1), order


def _clustered_filters(rng: np.random.Generator, n: int, centres: np.ndarray,
                       flips: float) -> np.ndarray:
    bits = centres[rng.integers(0, len(centres), n)].copy()
    bits ^= rng.random(bits.shape) < flips
    return np.packbits(bits, axis=1)


def _data(seed: int, n_p: int = 400, n_s: int = 300, nbits: int = 128
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    modes = rng.random((12, nbits)) < 0.2
    p = _clustered_filters(rng, n_p, modes, 0.05)
    s = _clustered_filters(rng, n_s, modes, 0.05)
    centres = s[rng.choice(n_s, 10, replace=False)]
    return p, s, centres


def test_every_cell_probed_is_the_brute_force() -> None:
    p, s, centres = _data(0)
    assert len(np.unique(p, axis=0)) == len(p)  # every query distinct: searched in place
    dist, idx, short = ivf_hamming_knn(p, s, 15, centres, len(centres), workers=2)
    want_d, want_i = _canonical(p, s, 15)
    assert not short.any()
    np.testing.assert_array_equal(dist, want_d)
    np.testing.assert_array_equal(idx, want_i)


def test_rows_are_the_top_k_of_a_superset_of_their_own_cells() -> None:
    p, s, centres = _data(1)
    k, nprobe = 10, 3
    dist, idx, short = ivf_hamming_knn(p, s, k, centres, nprobe, workers=2)
    assert not short.any()
    home = assign(s, centres, 1)[:, 0]
    own = assign(p, centres, nprobe)
    allowed = (home[None, :] == own[:, :, None]).any(axis=1)
    within_d, _ = _canonical(p, s, k, allowed)
    exact_d, _ = _canonical(p, s, k)
    true = hamming_distances(p, s)
    # the distances returned are the pairs' own, rows ordered by (distance, index)
    np.testing.assert_array_equal(dist, np.take_along_axis(true, idx, 1))
    assert ((np.diff(dist, axis=1) > 0) | ((np.diff(dist, axis=1) == 0)
                                           & (np.diff(idx, axis=1) > 0))).all()
    # never worse than searching the query's own cells, never better than the brute force
    assert (dist <= within_d).all() and (dist >= exact_d).all()
    # every filter of the query's own cells nearer than its K-th distance was kept
    for r in range(len(p)):
        below = np.flatnonzero(allowed[r] & (true[r] < dist[r, -1]))
        assert set(below) <= set(idx[r])


def test_identical_queries_get_identical_rows() -> None:
    p, s, centres = _data(2)
    p = np.concatenate([p, p[::7], p[:3]])
    dist, idx, _ = ivf_hamming_knn(p, s, 8, centres, 2, workers=1)
    n = 400
    np.testing.assert_array_equal(dist[n:n + len(p[:n:7])], dist[:n:7])
    np.testing.assert_array_equal(idx[n:n + len(p[:n:7])], idx[:n:7])
    np.testing.assert_array_equal(idx[-3:], idx[:3])


def test_cells_too_small_are_flagged_and_searched_flat() -> None:
    p, s, centres = _data(3, n_s=60)
    _, _, short = ivf_hamming_knn(p, s, 50, centres, 1)
    assert short.any()
    res = search_hamming(p, s, 50, options=SearchOptions(mode="approximate", nlist=10,
                                                         nprobe=1))
    truth, _ = _canonical(p, s, 50)
    rows = np.flatnonzero(short)
    np.testing.assert_array_equal(res.distances[rows], truth[rows])
    assert res.indices.shape == (len(p), 50) and (res.indices >= 0).all()


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_property_all_cells_equal_brute_force(data: st.DataObject) -> None:
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    nbytes = data.draw(st.sampled_from([1, 2, 8]))
    n_s = data.draw(st.integers(1, 40))
    n_p = data.draw(st.integers(0, 30))
    k = data.draw(st.integers(1, n_s))
    s = rng.integers(0, 256, (n_s, nbytes), dtype=np.uint8)
    # few distinct values: many ties and duplicate queries
    p = s[rng.integers(0, n_s, n_p)] if data.draw(st.booleans()) else rng.integers(
        0, 4, (n_p, nbytes), dtype=np.uint8)
    centres = s[rng.choice(n_s, min(n_s, data.draw(st.integers(1, 5))), replace=False)]
    dist, idx, short = ivf_hamming_knn(p, s, k, centres, len(centres),
                                       workers=data.draw(st.sampled_from([1, 2])))
    want_d, want_i = _canonical(p, s, k)
    assert not short.any()
    np.testing.assert_array_equal(dist, want_d)
    np.testing.assert_array_equal(idx, want_i)


def _first_occurrences(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The reference: each distinct row's first row, in the rows' order, and each row's
    number among them (a dictionary of the rows' bytes)."""
    seen: dict[bytes, int] = {}
    first, inverse = [], []
    for i, row in enumerate(codes):
        key = row.tobytes()
        if key not in seen:
            seen[key] = len(first)
            first.append(i)
        inverse.append(seen[key])
    return np.asarray(first, dtype=np.int64), np.asarray(inverse, dtype=np.int64)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 80), st.sampled_from([1, 3, 8, 16, 24]), st.integers(1, 6),
       st.integers(0, 2**31 - 1))
def test_distinct_rows_are_numbered_by_their_first_row(n: int, width: int, values: int,
                                                        seed: int) -> None:
    """Rows drawn from few distinct ones (widths that are and are not whole 64-bit words)."""
    from vflink.linkage.binary_ivf import _unique_rows

    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 256, (values, width), dtype=np.uint8)
    codes = pool[rng.integers(0, values, n)]
    first, inverse = _unique_rows(codes)
    want_first, want_inverse = _first_occurrences(codes)
    np.testing.assert_array_equal(first, want_first)
    np.testing.assert_array_equal(inverse, want_inverse)


def test_different_rows_with_one_hash_are_told_apart() -> None:
    """Two different 16-byte rows built to share the 64-bit hash the rows are first told
    apart by: the rows themselves decide."""
    from vflink.linkage.binary_ivf import _unique_rows

    def mixed(w0: int) -> int:
        h = (w0 * 0x9E3779B97F4A7C15) % 2**64
        return h ^ (h >> 29)

    w0, w1, v0 = 12345, 678, 99999
    v1 = (w1 + mixed(w0) - mixed(v0)) % 2**64
    codes = np.array([[w0, w1], [v0, v1], [w0, w1]], dtype=np.uint64).view(np.uint8)
    first, inverse = _unique_rows(codes)
    np.testing.assert_array_equal(first, [0, 1])
    np.testing.assert_array_equal(inverse, [0, 1, 0])


def test_a_search_cut_among_threads_equals_one_search() -> None:
    """search_in_threads cuts the rows among threads that each search on one OpenMP thread:
    the same distances and labels as faiss's one search, in the rows' order, for a flat
    index with a heap (small K) and with its counting selection (large K); the caller's own
    OpenMP setting is left alone; fewer rows than a thread's share take one search."""
    import faiss

    from vflink.linkage import binary_ivf
    from vflink.linkage.binary_ivf import search_in_threads

    rng = np.random.default_rng(21)
    s = rng.integers(0, 256, (700, 32), dtype=np.uint8)
    q = rng.integers(0, 256, (3 * binary_ivf._THREAD_ROWS + 17, 32), dtype=np.uint8)
    before = faiss.omp_get_max_threads()
    for k, heap in ((8, True), (60, False)):
        index = faiss.IndexBinaryFlat(256)
        index.use_heap = heap
        index.add(s)
        want_d, want_i = index.search(q, k)
        for workers in (1, 2, 3, 8):
            got_d, got_i = search_in_threads(index, q, k, workers)
            np.testing.assert_array_equal(got_d, want_d)
            np.testing.assert_array_equal(got_i, want_i)
            assert got_i.dtype == np.int64
        few_d, few_i = search_in_threads(index, q[:100], k, 2)
        np.testing.assert_array_equal(few_i, want_i[:100])
    assert faiss.omp_get_max_threads() == before
