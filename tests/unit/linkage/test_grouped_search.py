"""The grouped exact k-d tree search (vflink.linkage.grouped) against brute force: the same
distances to the last bit, rows ordered by (distance, secondary index), ties at the K-th
distance resolved to the lower indices, on clustered, duplicated, spread and tiny inputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial import cKDTree

from vflink.linkage import SearchOptions, brute_euclidean, search_euclidean
from vflink.linkage.grouped import grouped_knn, in_index_order
from vflink.linkage.search import brute_haversine, search_haversine


def _canonical(p: np.ndarray, s: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's K nearest by (distance, index), distances from the coordinates' differences
    summed over the dimensions in order (the brute force an exact search must equal)."""
    diff = p[:, None, :] - s[None, :, :]
    d2 = diff[..., 0] ** 2
    for j in range(1, p.shape[1]):
        d2 = d2 + diff[..., j] ** 2
    d = np.sqrt(d2)
    order = np.lexsort((np.broadcast_to(np.arange(len(s)), d.shape), d), axis=-1)[:, :k]
    return np.take_along_axis(d, order, 1), order


def _check(p: np.ndarray, s: np.ndarray, k: int, **kw: object) -> None:
    dist, idx = grouped_knn(p, s, k, cKDTree(s), **kw)  # type: ignore[arg-type]
    want_d, want_i = _canonical(p, s, k)
    np.testing.assert_array_equal(dist, want_d)
    np.testing.assert_array_equal(idx, want_i)


def _clusters(rng: np.random.Generator, n: int, centres: np.ndarray, spread: float) -> np.ndarray:
    return centres[rng.integers(0, len(centres), n)] + rng.normal(0, spread, (n, centres.shape[1]))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_clustered_points_equal_brute_force(threads: int, dims: int) -> None:
    rng = np.random.default_rng(dims)
    centres = rng.uniform(0, 10, (25, dims))
    p, s = _clusters(rng, 3000, centres, 0.2), _clusters(rng, 700, centres, 0.2)
    _check(p, s, 40, threads=threads, group=16)


def test_duplicates_and_ties_resolve_to_the_lower_indices() -> None:
    """A grid: many equal distances, at the K-th one too; repeated points in both tables."""
    rng = np.random.default_rng(3)
    grid = np.stack(np.meshgrid(np.arange(12.0), np.arange(12.0)), -1).reshape(-1, 2)
    s = np.concatenate([grid, grid[rng.integers(0, len(grid), 60)]])
    p = np.concatenate([grid, grid + 0.5, grid[:30]])
    for k in (1, 5, 9, 30):
        _check(p, s, k, group=8)


def test_spread_groups_are_searched_query_by_query() -> None:
    """Far-apart clusters: groups of queries straddling them draw too many candidates and
    are answered one query at a time, with the same result."""
    rng = np.random.default_rng(4)
    s = np.concatenate([rng.normal(0, 0.01, (400, 2)), rng.normal(1000, 0.01, (400, 2))])
    p = np.concatenate([rng.normal(0, 0.01, (3, 2)), rng.normal(1000, 0.01, (3, 2)),
                        [[500.0, 500.0]]])
    _check(p, s, 20, group=8)


def test_spread_groups_of_clusters_in_a_background_are_searched_one_by_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Dense clusters in a sparse uniform background: the queries of groups astride a
    cluster's edge (and only those) are searched query by query, not grouped again, with the
    brute force's result."""
    import vflink.linkage.grouped as grouped

    rng = np.random.default_rng(11)
    centres = rng.uniform(0, 100, (6, 2))

    def mix(n: int) -> np.ndarray:
        dense = _clusters(rng, n * 9 // 10, centres, 0.05)
        return np.concatenate([dense, rng.uniform(0, 100, (n - len(dense), 2))])

    p, s = mix(6000), mix(1500)
    seen: dict[str, int] = {}
    real_search, real_single = grouped._search, grouped._single

    def search(query, rows, base, k, tree, workers, g, dist, idx,  # type: ignore[no-untyped-def]
               *rest):
        seen[f"group {g}"] = seen.get(f"group {g}", 0) + len(rows)
        return real_search(query, rows, base, k, tree, workers, g, dist, idx, *rest)

    def single(query, rows, k, tree, workers, dist, idx):  # type: ignore[no-untyped-def]
        seen["single"] = seen.get("single", 0) + len(rows)
        return real_single(query, rows, k, tree, workers, dist, idx)

    monkeypatch.setattr(grouped, "_search", search)
    monkeypatch.setattr(grouped, "_single", single)
    _check(p, s, 20, group=64)
    assert seen["group 64"] == len(p)
    assert set(seen) <= {"group 64", "single", "group 1"}
    assert 0 < seen["single"] < len(p) // 2


def test_a_tie_at_the_kth_place_of_a_single_query_takes_its_own_radius(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Query by query, the tree's K + 1 nearest are kept only where the (K + 1)-th is
    farther than the K-th: with points tied there (listed farthest index first, so that the
    tree may return any of them), the row is searched again and keeps the lower indices."""
    import vflink.linkage.grouped as grouped

    ring = np.array([[np.cos(a), np.sin(a)] for a in np.linspace(0, 2 * np.pi, 8,
                                                                 endpoint=False)])
    # distances from the origin: 0.5 (index 8), 1.0 eight times (the ring: here every
    # cos² + sin² rounds to 1; the tree returns them as 2, 1, 3, ...), then 3.0
    s = np.concatenate([ring[::-1], [[0.5, 0.0]], [[3.0, 0.0]]])
    p = np.zeros((3, 2))
    returned: list[int] = []
    real_single = grouped._single

    def single(query, rows, k, tree, workers, dist, idx):  # type: ignore[no-untyped-def]
        left = real_single(query, rows, k, tree, workers, dist, idx)
        returned.append(len(left))
        return left

    monkeypatch.setattr(grouped, "_single", single)
    for k in (1, 2, 3, 5, 9):
        returned.clear()
        _check(p, s, k, group=1)
        d = _canonical(p, s, k + 1)[0] if k + 1 <= len(s) else None
        tied = d is not None and d[0, k] == d[0, k - 1]
        assert returned == [3 if tied else 0], (k, returned)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_single_queries_in_pieces_write_their_rows_and_return_the_tied_ones(
        workers: int) -> None:
    """The query-by-query search in pieces (one per worker): every piece writes its clear
    rows, equal to the brute force, and returns its rows with a tie at the K-th place, in
    order; rows not asked for are left untouched."""
    import vflink.linkage.grouped as grouped

    rng = np.random.default_rng(21)
    ring = np.array([[np.cos(a), np.sin(a)] for a in np.linspace(0, 2 * np.pi, 8,
                                                                 endpoint=False)])
    s = np.concatenate([ring[::-1], [[0.5, 0.0]], rng.uniform(3, 9, (60, 2))])
    # ties at the origin (K = 3: two of the eight ring points at distance 1.0 beside 0.5)
    # spread through both halves of the rows, clear queries between them
    p = rng.uniform(3, 9, (40, 2))
    p[[1, 7, 22, 33]] = 0.0
    rows = np.arange(2, 40, dtype=np.int64)  # rows 0 and 1 are not asked for
    k = 3
    dist = np.full((40, k), -1.0)
    idx = np.full((40, k), -1, dtype=np.int64)
    left = grouped._single(p, rows, k, cKDTree(s), workers, dist, idx)
    want_d, want_i = _canonical(p, s, k + 1)
    tied = rows[want_d[rows, k] == want_d[rows, k - 1]]
    np.testing.assert_array_equal(left, tied)
    np.testing.assert_array_equal(left, [7, 22, 33])
    clear = np.setdiff1d(rows, tied)
    np.testing.assert_array_equal(dist[clear], want_d[clear, :k])
    np.testing.assert_array_equal(idx[clear], want_i[clear, :k])
    assert (dist[[0, 1]] == -1.0).all() and (idx[[0, 1]] == -1).all()


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 60), st.integers(1, 40), st.integers(0, 2**31 - 1), st.booleans())
def test_any_small_input_equals_brute_force(n: int, m: int, seed: int, coarse: bool) -> None:
    rng = np.random.default_rng(seed)
    p = rng.uniform(-1, 1, (n, 2))
    s = rng.uniform(-1, 1, (m, 2))
    if coarse:  # few distinct values: ties everywhere
        p, s = np.round(p * 2) / 2, np.round(s * 2) / 2
    k = int(rng.integers(1, m + 1))
    _check(p, s, k, group=int(rng.choice([1, 2, 4, 16])))


def test_no_queries() -> None:
    s = np.random.default_rng(5).uniform(0, 1, (50, 2))
    dist, idx = grouped_knn(np.empty((0, 2)), s, 3, cKDTree(s))
    assert dist.shape == (0, 3) and idx.shape == (0, 3)


def test_the_search_uses_it_for_many_neighbours() -> None:
    """search_euclidean / search_haversine with K ≥ 16 (the grouped path) equal brute force."""
    rng = np.random.default_rng(6)
    centres = rng.uniform(0, 5, (10, 2))
    p, s = _clusters(rng, 1500, centres, 0.3), _clusters(rng, 400, centres, 0.3)
    got = search_euclidean(p, s, 25, options=SearchOptions(threads=2))
    want = brute_euclidean(p, s, 25)
    np.testing.assert_allclose(got.distances, want.distances, rtol=1e-12)
    np.testing.assert_array_equal(got.indices, _canonical(p, s, 25)[1])
    ll_p = np.column_stack([rng.uniform(-80, 80, 800), rng.uniform(-180, 180, 800)])
    ll_s = np.column_stack([rng.uniform(-80, 80, 300), rng.uniform(-180, 180, 300)])
    got = search_haversine(ll_p, ll_s, 20)
    want = brute_haversine(ll_p, ll_s, 20)
    np.testing.assert_allclose(got.distances, want.distances, rtol=1e-9)


def test_thousands_of_ties_take_the_trees_query() -> None:
    """Every secondary point at one place: each query's radius holds all of them; the
    distances are still the brute force's."""
    s = np.zeros((700, 2))
    p = np.random.default_rng(7).uniform(-1, 1, (40, 2))
    dist, idx = grouped_knn(p, s, 5, cKDTree(s), group=8)
    np.testing.assert_array_equal(dist, _canonical(p, s, 5)[0])
    assert (np.diff(idx, axis=1) > 0).all()  # ties ordered by index


@pytest.mark.parametrize("k", [1, 3, 5, 8, 12, 19])
def test_squares_apart_by_ulps_in_reverse_index_order(k: int) -> None:
    """Squared distances a few units in the last place apart (equal in the bits the sort keys
    keep), the nearer points at the higher indices: the keys order those by index, so rows
    whose run of equal keys reaches the K-th place are sorted again, and equal the brute
    force's (distance, index) order."""
    x = 1.0 + np.arange(20)[::-1] * np.finfo(float).eps
    s = np.column_stack([x, np.zeros(20)])
    p = np.zeros((3, 2))
    for group in (1, 2):
        _check(p, s, k, group=group)


@pytest.mark.parametrize("k", [1, 3, 5, 7])
def test_a_run_of_equal_keys_across_the_kth_place_hides_nearer_points(k: int) -> None:
    """Ten points: five equal, farther ones first, then five equal nearer ones, their squares
    6 units in the last place apart (equal in the bits the keys keep). The first K + 1 keys
    are all the farther points, equal among themselves; the nearer ones are behind them in
    the run, and must still come first."""
    eps = np.finfo(float).eps
    s = np.column_stack([np.repeat([1.0 + 4 * eps, 1.0 + eps], 5), np.zeros(10)])
    p = np.zeros((2, 2))
    for group in (1, 2):
        _check(p, s, k, group=group)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_equal_distances_from_squares_a_key_apart_come_in_index_order(k: int) -> None:
    """Two points at the same distance whose squares are one unit in the last place apart,
    across a boundary of the bits the sort keys keep (so the keys put the farther square
    first), the nearer-keyed one at the higher index: the row must still be in (distance,
    index) order, whether the pair is inside the first K + 1 keys or at the K-th place."""
    a = (1.224744871391586, 2.384185791015625e-07)  # squared distance 1.5 + 223 ulp
    b = (1.2247448713916094, 0.0)  # 1.5 + 224 ulp: another key, the same square root
    assert a[0] ** 2 + a[1] ** 2 != b[0] ** 2 + b[1] ** 2
    assert np.sqrt(a[0] ** 2 + a[1] ** 2) == np.sqrt(b[0] ** 2 + b[1] ** 2)
    far = np.column_stack([np.arange(2.0, 20.0), np.zeros(18)])
    s = np.concatenate([[b, a], far])
    p = np.zeros((2, 2))
    for group in (1, 2):
        _check(p, s, k, group=group)


def _beyond_whole_rows(d2: np.ndarray, high: np.ndarray, square: np.ndarray, out: np.ndarray,
                       k: int, bits: int) -> np.ndarray:
    """_beyond's verdict on the rows whose K-th and (K + 1)-th keys share their high bits,
    from every candidate of the row: another square sharing the K-th key, or with its root."""
    want = out.copy()
    for b, g in zip(*np.nonzero(high[:, :, 0] == high[:, :, 1])):
        row, sq = d2[b, g], square[b, g, k - 1]
        same_key = (row.view(np.uint64) >> np.uint64(bits)) == high[b, g, 0]
        want[b, g] = ((row != sq) & (same_key | (np.sqrt(row) == np.sqrt(sq)))).any()
    return want


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 6), st.integers(12, 80), st.integers(0, 2**31 - 1),
       st.sampled_from([1, 4, 40, 600, 5000]))
def test_beyond_looks_at_the_squares_near_the_kth_as_a_whole_row_would(
        rows: int, width: int, seed: int, spread: int) -> None:
    """Squares a few to thousands of units in the last place from a handful of values (runs
    of equal keys, equal roots from unequal squares, exact ties): the rows whose K-th and
    (K + 1)-th keys share their high bits get the verdict of a check of every candidate."""
    import vflink.linkage.grouped as grouped

    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, width))
    base = rng.choice([0.5, 1.5, 2.0, 7.25], size=(1, rows, width))
    steps = rng.integers(-spread, spread + 1, size=base.shape)
    d2 = (base.view(np.int64) + steps).view(np.float64)
    d2[rng.random(d2.shape) < 0.3] = 1.5  # exact ties
    bits = max(1, (width - 1).bit_length())
    low = np.uint64((1 << bits) - 1)
    key = d2.view(np.uint64) & ~low
    key |= np.arange(width, dtype=np.uint64)
    key = np.sort(key, axis=-1)[..., :k + 1]
    pos = (key & low).view(np.intp)
    square = np.take_along_axis(d2, pos, axis=-1)
    dist = np.sqrt(square)
    tied = np.zeros((1, rows), dtype=bool)
    high = key[:, :, k - 1:k + 1] >> np.uint64(bits)
    got = grouped._beyond(d2, high, square, dist, tied, k, bits)
    crossing = high[:, :, 0] == high[:, :, 1]
    np.testing.assert_array_equal(got[crossing], _beyond_whole_rows(
        d2, high, square, got, k, bits)[crossing])


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 30), st.integers(2, 60), st.integers(0, 2**31 - 1))
def test_points_a_few_ulps_apart_equal_brute_force(n: int, m: int, seed: int) -> None:
    """Coordinates that differ in their last bits only, many equal: the sort keys' dropped
    bits decide nothing."""
    rng = np.random.default_rng(seed)
    eps = np.finfo(float).eps
    s = 1.0 + rng.integers(0, 40, (m, 2)) * eps
    p = 1.0 + rng.integers(-20, 60, (n, 2)) * eps
    k = int(rng.integers(1, m + 1))
    _check(p, s, k, group=int(rng.choice([1, 2, 4, 16])))


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_points_whose_squares_are_ulps_apart_equal_brute_force(seed: int) -> None:
    """Points on a circle around the queries, each moved by a few units in the last place:
    their squared distances are a few units apart (several per key, runs of equal keys with
    different squares, equal distances from different squares across a key's boundary),
    mixed with points further off; K from 2 (with K = 1 and more than 64 such points a query
    takes cKDTree's own choice among them, see the module docstring)."""
    rng = np.random.default_rng(seed)
    m, far = int(rng.integers(20, 80)), int(rng.integers(0, 30))
    y = rng.choice([0.0, *(2.0 ** -e for e in range(20, 30))], m)
    x = np.sqrt(1.5 - y * y)
    x = x + rng.integers(-6, 7, m) * np.spacing(x)
    circle = np.column_stack([x, y]) * rng.choice([-1.0, 1.0], (m, 2))
    s = np.concatenate([circle, rng.uniform(-5, 5, (far, 2))])
    rng.shuffle(s)
    p = np.zeros((int(rng.integers(1, 4)), 2))
    _check(p, s, int(rng.integers(2, len(s) + 1)), group=int(rng.choice([1, 2, 4])))


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 3), st.integers(1, 2600), st.integers(1, 300), st.integers(0, 2**31 - 1),
       st.booleans(), st.sampled_from([np.uint64, np.uint32]))
def test_the_smallest_keys_of_long_rows_equal_a_full_sort(rows: int, width: int, take: int,
                                                          seed: int, few: bool,
                                                          dtype: type) -> None:
    """Rows longer than a sorting network's are sorted in pieces whose smallest are sorted
    again: the same keys as sorting each row whole and cutting it, repeated keys too, 64-
    and 32-bit keys, rows of two and three dimensions."""
    from vflink.linkage.grouped import smallest

    rng = np.random.default_rng(seed)
    take = min(take, width)
    high = 50 if few else int(np.iinfo(dtype).max)
    key = rng.integers(0, high, (rows, 2, width), dtype=dtype)
    want = np.sort(key, axis=2)[:, :, :take]
    np.testing.assert_array_equal(smallest(key.copy(), take), want)
    np.testing.assert_array_equal(smallest(key[0].copy(), take), want[0])


def test_groups_drawing_hundreds_of_candidates_equal_brute_force(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """K = 100 on clustered points of varied spread: groups draw from under 256 to over a
    thousand candidates (rows sorted whole, in two pieces and in several rounds of pieces),
    all with the brute force's result."""
    import vflink.linkage.grouped as grouped

    rng = np.random.default_rng(12)
    centres = rng.uniform(0, 10, (8, 2))
    p = np.concatenate([_clusters(rng, 2500, centres, 0.4), rng.uniform(0, 10, (300, 2))])
    s = np.concatenate([_clusters(rng, 2200, centres, 0.4), rng.uniform(0, 10, (300, 2))])
    widths: set[int] = set()
    real = grouped.smallest
    net = grouped.network_length(np.dtype(np.uint64))

    def smallest(key, take):  # type: ignore[no-untyped-def]
        widths.add(key.shape[2])
        return real(key, take)

    monkeypatch.setattr(grouped, "smallest", smallest)
    _check(p, s, 100, threads=2)
    _check(p, s, 100, threads=2, group=4)  # small groups: rows within one sorting network
    assert net == 256
    assert min(widths) <= net < max(widths)
    assert max(widths) > 2 * net, sorted(widths)


@pytest.mark.parametrize("group", [48, 8, 1])
def test_before_writes_is_called_once_before_any_result_is_written(group: int) -> None:
    """``before_writes`` (the search's page toucher stops there) runs once, while the
    result arrays are still as the caller left them, however the rows are grouped."""
    rng = np.random.default_rng(14)
    centres = rng.uniform(0, 10, (10, 2))
    p = np.concatenate([_clusters(rng, 900, centres, 0.3), rng.uniform(0, 10, (60, 2))])
    s = _clusters(rng, 400, centres, 0.3)
    k = 20
    dist, idx = np.full((len(p), k), np.nan), np.full((len(p), k), -7, dtype=np.int64)
    calls: list[bool] = []

    def before() -> None:
        calls.append(bool(np.isnan(dist).all() and (idx == -7).all()))

    grouped_knn(p, s, k, cKDTree(s), group=group, threads=2, out=(dist, idx),
                before_writes=before)
    assert calls == [True]
    want_d, want_i = _canonical(p, s, k)
    np.testing.assert_array_equal(dist, want_d)
    np.testing.assert_array_equal(idx, want_i)


@pytest.mark.parametrize("threads", [1, 2])
def test_groups_of_many_queries_built_in_halves(threads: int,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """From ``_HALVES_FROM`` queries on two workers the queries' tree is built in two halves
    (cut at the median of the widest dimension), one per thread: every query in exactly one
    group of at most ``g``, a group's padding its own first query, groups as compact as one
    tree's; the search equals brute force either way."""
    import vflink.linkage.grouped as grouped

    monkeypatch.setattr(grouped, "_HALVES_FROM", 1000)
    rng = np.random.default_rng(15)
    centres = rng.uniform(0, 10, (12, 2))
    p = np.concatenate([_clusters(rng, 3000, centres, 0.3), rng.uniform(0, 30, (200, 2))])
    s = _clusters(rng, 500, centres, 0.3)
    rows = np.arange(len(p), dtype=np.int64)[::-1].copy()  # not in the points' order
    members, valid = grouped._groups(p, rows, 48, cKDTree, threads)
    odd, odd_valid = grouped._groups(p, rows[:1025], 48, cKDTree, threads)  # widths 32 and 33
    np.testing.assert_array_equal(np.sort(odd[odd_valid]), np.sort(rows[:1025]))
    np.testing.assert_array_equal(odd[~odd_valid],
                                  np.broadcast_to(odd[:, :1], odd.shape)[~odd_valid])
    assert members.shape[1] <= 48 and valid[:, 0].all()
    np.testing.assert_array_equal(np.sort(members[valid]), np.arange(len(p)))
    np.testing.assert_array_equal(members[~valid], np.broadcast_to(members[:, :1],
                                                                   members.shape)[~valid])
    one_tree, _ = grouped._groups(p, rows, 48, cKDTree, 1)
    assert abs(len(members) - len(one_tree)) <= 2  # a tree's leaves: n / g to 2n / g
    spans = {w: (p[m].max(axis=1) - p[m].min(axis=1)).max(axis=1)
             for w, m in ((threads, members), (1, one_tree))}
    assert np.median(spans[threads]) <= 1.5 * np.median(spans[1])
    _check(p, s, 30, threads=threads, group=48)


@pytest.mark.parametrize("threads", [1, 2])
def test_uneven_groups_are_not_padded_to_the_widest(threads: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Coordinates rounded to a grid (hundreds of queries on each value of a dimension): a
    balanced tree keeps every point equal to a median on one side, so its leaves are uneven
    (a third of the widest to all of it). The jobs take the groups largest first, each as
    wide as its largest group and none smaller than ``_FILL`` of it: the query rows whose
    distances are computed are the queries and little more, not groups × the widest. The
    search equals brute force."""
    import vflink.linkage.grouped as grouped

    rng = np.random.default_rng(21)
    centres = rng.uniform(0, 10, (8, 2))
    p = np.round(_clusters(rng, 4000, centres, 0.8), 1)
    s = np.round(_clusters(rng, 600, centres, 0.8), 1)
    assert len(np.unique(p[:, 0])) < 200  # ties by the hundred
    members, valid = grouped._groups(p, np.arange(len(p), dtype=np.int64), 32, cKDTree,
                                     threads)
    sizes = valid.sum(axis=1)
    assert sizes.max() - sizes.min() > 8  # uneven leaves
    assert members.size > 1.2 * len(p)  # padded to the widest: a fifth more rows at least
    rows: list[int] = []
    squared = grouped._squared

    def counting(q: np.ndarray, cand: np.ndarray) -> np.ndarray:
        rows.append(q.shape[1] * q.shape[2])
        return squared(q, cand)

    monkeypatch.setattr(grouped, "_squared", counting)
    monkeypatch.setattr(grouped, "_SPLIT_FACTOR", 10**6)  # every group searched as a group
    _check(p, s, 25, threads=threads, group=32)
    # a job's groups at least _FILL of its widest: the padding at most 1 / _FILL of the rows
    assert len(p) <= sum(rows) <= len(p) / grouped._FILL < members.size


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_group_centres_and_reaches_from_coordinate_planes(dims: int) -> None:
    """Each group's bounding-box centre (exactly) and its farthest query's distance from it
    (to rounding), computed a dimension at a time, equal those of the gathered groups."""
    import vflink.linkage.grouped as grouped

    rng = np.random.default_rng(dims)
    q = rng.normal(0, 5, (500, dims))
    members = rng.integers(0, 500, (40, 13))
    centre, reach = grouped._centres(np.ascontiguousarray(q.T), members)
    qg = q[members]
    want = (qg.min(axis=1) + qg.max(axis=1)) / 2
    np.testing.assert_array_equal(centre, want)
    np.testing.assert_allclose(reach, np.sqrt(((qg - want[:, None, :]) ** 2).sum(axis=2)).max(
        axis=1), rtol=1e-15)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 30), st.integers(1, 12), st.integers(1, 6), st.booleans(),
       st.integers(0, 2**31 - 1))
def test_rows_in_index_order_equal_a_sort_of_every_row(rows: int, width: int, levels: int,
                                                       presorted: bool, seed: int) -> None:
    """Rows of (distance, index) come out ordered by (distance, index), as a lexsort of every
    row gives them, whatever their order in (a tree's: sorted by distance, ties in any order;
    or none), and rows already in order are kept without a copy when all are."""
    rng = np.random.default_rng(seed)
    dist = rng.integers(0, levels, (rows, width)).astype(np.float64)  # ties by the dozen
    idx = np.stack([rng.permutation(1000)[:width] for _ in range(rows)]).astype(np.int64)
    if presorted:
        by_distance = np.argsort(dist, axis=1, kind="stable")
        dist = np.take_along_axis(dist, by_distance, 1)
        idx = np.take_along_axis(idx, by_distance, 1)
    before = dist.copy(), idx.copy()
    got_d, got_i = in_index_order(dist, idx)
    order = np.lexsort((idx, dist), axis=-1)
    np.testing.assert_array_equal(got_d, np.take_along_axis(dist, order, 1))
    np.testing.assert_array_equal(got_i, np.take_along_axis(idx, order, 1))
    np.testing.assert_array_equal(dist, before[0])  # the caller's arrays are not changed
    np.testing.assert_array_equal(idx, before[1])
    again_d, again_i = in_index_order(got_d, got_i)
    assert again_d is got_d and again_i is got_i


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-5, 5), max_size=40))
def test_distinct_is_numpys_unique(values: list[int]) -> None:
    from vflink.linkage.grouped import _distinct

    x = np.asarray(values, dtype=np.int64)
    got = _distinct(x)
    np.testing.assert_array_equal(got, np.unique(x))
    assert got.dtype == np.int64


@pytest.mark.parametrize("n", [0, 1, 2, 7, 500])
def test_nearest_in_pieces_is_the_trees_own_query(n: int) -> None:
    from vflink.linkage.grouped import _nearest

    rng = np.random.default_rng(n)
    s = rng.random((300, 2))
    x = rng.random((n, 2))
    tree = cKDTree(s)
    for k in (1, 5, [5]):
        want_d, want_i = tree.query(x, k=k, workers=2)
        got_d, got_i = _nearest(tree, x, k, 2)
        np.testing.assert_array_equal(got_d, want_d)
        np.testing.assert_array_equal(got_i, want_i)
        none, only_i = _nearest(tree, x, k, 3, distances=False)
        assert none is None
        np.testing.assert_array_equal(only_i, want_i)
