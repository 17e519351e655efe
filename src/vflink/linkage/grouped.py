"""Exact top-K Euclidean search for low-dimensional points, a group of queries at a time.

Hand-written rather than one call to scipy's ``cKDTree.query`` (or pykdtree's, which was no
faster): that query walks the tree and keeps a heap of K once per query, which for large K
(FedSim's K = 100) costs about 13 µs a query on one core. Queries near one another share
almost all their candidates, so here a group of them is answered at once with numpy's
vectorised arithmetic and SIMD sort: at FedSim's house scale (141,050 × 27,827 2-D points,
K = 100) this took 1.7 times less CPU than ``cKDTree.query`` on one thread and on two, and
1.6 times less wall time on two (0.61 s against 0.96 s; the best of five runs each,
alternately, on a 2-core machine: ``benchmarks/linkage.py --case grouped``). The tree is
still scipy's: it finds each group's candidates.

The bound (the triangle inequality). Cut the queries into compact groups (the leaves of a
balanced k-d tree of them); let ``c`` be a group's bounding-box centre and ``h`` the largest
distance from ``c`` to a query of the group. For a query ``q`` of the group, its K-th
neighbour distance is at most ``d_K(c) + |q − c|`` (the K nearest points of ``c`` are all
within that distance of ``q``), so each of its K nearest points ``y`` (and every point tied
with the K-th) has ``|y − c| ≤ |y − q| + |q − c| ≤ d_K(c) + 2h``. The points within that
radius of ``c`` are therefore a superset of every query's top K, ties included; the group's
query × candidate squared distances are computed in float64 from the coordinates'
differences (as ``cKDTree`` and the brute force do, summed over the dimensions in order), and
each row sorted. The result is exact: the distances are the brute force's, and the rows are
ordered by (distance, secondary index), ties at the K-th distance resolved to the lower
indices.

A group whose radius holds too many candidates (a group astride the edge of a cluster, or an
outlier among its queries) has its queries searched one by one: cKDTree's own query of
each one's K + 1 nearest, kept when the (K + 1)-th is strictly farther than the K-th (the K
nearest are then those K, whatever the tree's order; they are sorted by (distance, index)).
A query with a tie at its K-th place is searched with its own radius (``G = 1``: ``h = 0``,
the radius is its own K-th distance); one whose radius still holds more than 64·K points
(thousands tied at its K-th distance) takes cKDTree's query, whose distances are the same
but whose choice among the points tied at the K-th distance is its own. (Grouping a spread
group's queries again, in twelves, before that paid while the tree's rows were all sorted
again; since only the rows out of (distance, index) order are, going straight to the single
queries took less wall time and less CPU on every clustered shape: medians of 12 on two
threads, alternately, clusters in a 10 % uniform background 0.526 s against 0.563 s (CPU
0.94 s against 1.00 s), 50 clusters 0.404 s against 0.424 s, Gaussian blobs 0.420 s against
0.430 s, the same links to the bit.)

Each query's candidates are ranked by one sort of 64-bit keys (:func:`_rank`); a row longer
than numpy's sorting network (256 keys) is sorted in pieces of 256 whose K + 1 smallest are
sorted again (:func:`smallest`), several times faster than numpy's quicksort of the row.
"""

from __future__ import annotations

import contextvars
import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from vflink._cancel import checkpoint
from vflink._threads import cores, in_pieces

__all__ = ["GROUP", "grouped_knn", "in_index_order", "map_jobs", "network_length", "smallest",
           "sort_rows"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

#: Queries per group at most (the leaf size of the queries' balanced k-d tree: its leaves hold
#: between half and all of it). At FedSim's house scale (K = 100) groups of about 35 (64)
#: drew about 304 candidates per query, 55 % of the rows longer than the sorting network's
#: 256 (:func:`network_length`). With the rows sorted in pieces, 48 took the least time of 32 to 64
#: on two threads (medians of four, alternately, at house scale: 0.45 s with 48, 0.45 s with
#: 64, 0.47 s with 32; 20 tight clusters in a uniform background: 0.70, 0.85 and 0.79 s).
GROUP = 48
#: A group with more candidates than this many per top-K (times K) has its queries searched
#: one by one (:func:`_single`): 8 and 12 within the noise of each other on three shapes,
#: 18 and 24 no faster.
_SPLIT_FACTOR = 12
#: A query alone with more candidates than this many per top-K (times K), all within its own
#: K-th distance (points tied there by the thousand), takes cKDTree's query instead.
_TIED_FACTOR = 64
#: Squared distances computed per batch of groups (float64: 1 MB, within a core's L2 cache
#: here), bounding memory per thread too. Each batch costs some twenty numpy calls of Python,
#: which hold the GIL: at FedSim's house scale on two threads, best of five, batches of 2^14
#: pairs took 1.7 s; from 2^16 to 2^18 the search took 0.61-0.65 s, and on the points rounded
#: to 3 decimals 2^17 took 0.99 s against 1.02 s for 2^18 and 1.11 s for 2^16.
_BATCH_PAIRS = 1 << 17
#: Bytes of the longest row that numpy sorts with a sorting network (x86-simd-sort on AVX-512:
#: 256 keys of 64 bits, 512 of 32). A row of 256 64-bit keys took 0.43 µs here, one of 257
#: took 1.6 µs (its quicksort) and one of 320, 2.1 µs; sorted as pieces of 256 whose K + 1
#: smallest are sorted again, rows of 320 took 1.3 µs and rows of 512 1.8 µs instead of 4.6
#: (K = 100). 32-bit keys: 0.42 µs for 512, 1.9 µs for 513; a row of 1,150 keys' 100 smallest
#: took 1.5 µs in pieces against 5.0 µs partitioned then sorted (2 cores with AVX-512).
_NETWORK = 2048
#: The smallest group a job takes, as a fraction of its largest (:func:`_search`).
_FILL = 0.875
#: Relative margin on the radius: the bound holds exactly in real numbers, and this covers the
#: rounding of d_K(c) + 2h in floating point many times over.
_MARGIN = 1e-9


def _squared(q: FloatArray, cand: FloatArray) -> FloatArray:
    """(d, B, G) queries × (d, B, W) candidates, one plane per dimension → (B, G, W) squared
    distances, from the coordinates' differences summed over the dimensions in order. (One
    contiguous plane per dimension: the broadcast differences run on unit strides.)"""
    out = q[0][:, :, None] - cand[0][:, None, :]
    out *= out
    for j in range(1, q.shape[0]):
        diff = q[j][:, :, None] - cand[j][:, None, :]
        diff *= diff
        out += diff
    return out


def _rank(d2: FloatArray, cand: IntArray, k: int) -> tuple[FloatArray, IntArray]:
    """(B, G, W) squared distances of B groups' queries to their W candidates (B, W) → each
    query's K nearest, ordered by (distance, index): ``(B, G, K)`` distances and indices.

    One value sort instead of an argsort (numpy's SIMD sort of 64-bit keys took half the
    time): each squared distance (≥ 0, so its IEEE bits order as unsigned integers) has its
    lowest mantissa bits replaced by the candidate's position. ``cand``'s rows are in
    increasing index order, so keys order by (squared distance, index) except between
    *different* squared distances equal in their remaining bits; every query whose first
    K + 1 keys are then not in (distance, index) order (a nearer point behind a farther one,
    or equal distances out of index order: near-equal squares that share a key, or two
    different squares with one square root) is sorted again exactly by (distance, index):
    over those K + 1, or over all its candidates where its K nearest may lie beyond them
    (:func:`_beyond`), so the result does not depend on the trick. Equal squared distances
    (points tied, as rounded coordinates make by the thousand), and different ones that
    happen to come in order, need no second sort (on the house points rounded to 3 decimals
    that took a fifth less time than sorting again every row with a pair sharing a key)."""
    b, g, w = d2.shape
    bits = max(1, (w - 1).bit_length())
    low = np.uint64((1 << bits) - 1)
    key = d2.view(np.uint64) & ~low
    key |= np.arange(w, dtype=np.uint64)
    take = min(k + 1, w)
    key = smallest(key, take)
    pos = (key & low).view(np.intp)
    row = (np.arange(b * g, dtype=np.intp) * w).reshape(b, g, 1)
    at = pos + row
    square = np.take(d2.reshape(-1), at)
    dist = np.sqrt(square)
    at -= row - (np.arange(b, dtype=np.intp) * w)[:, None, None]  # into cand's rows
    idx = np.take(cand.reshape(-1), at)
    # rows whose first K + 1 are not in (distance, position) order
    nearer = dist[:, :, 1:] < dist[:, :, :-1]
    same = dist[:, :, 1:] == dist[:, :, :-1]
    same &= pos[:, :, 1:] < pos[:, :, :-1]
    nearer |= same
    tied = nearer.any(axis=2)
    # the keys at the K-th and (K + 1)-th places without their position bits (only those two
    # are looked at: one pass over two columns instead of all K + 1)
    hidden = (_beyond(d2, key[:, :, k - 1:k + 1] >> np.uint64(bits), square, dist, tied, k,
                      bits) if w > k else None)
    if hidden is not None and hidden.any():
        # the K nearest may lie beyond the first K + 1 keys: each such row sorted whole
        at_b, at_g = np.nonzero(hidden)
        full = np.sqrt(d2[at_b, at_g])
        # the candidates are in index order: a stable sort by distance is (distance, index)
        o = np.argsort(full, axis=1, kind="stable")[:, :take]
        dist[at_b, at_g] = np.take_along_axis(full, o, 1)
        idx[at_b, at_g] = np.take_along_axis(cand[at_b], o, 1)
        tied &= ~hidden
    if tied.any():
        # The K nearest are among the first K + 1 keys (nothing beyond shares the K-th key
        # or distance), only out of order where near-equal squares share a key or equal
        # distances come from different squares (rounded coordinates make such rows by the
        # thousand): those K + 1 sorted by (distance, position), not the row's W.
        rows = np.flatnonzero(tied)
        flat_d, flat_i = dist.reshape(-1, take), idx.reshape(-1, take)  # views
        near = flat_d[rows]
        o = np.lexsort((pos.reshape(-1, take)[rows], near), axis=-1)
        flat_d[rows] = np.take_along_axis(near, o, 1)
        flat_i[rows] = np.take_along_axis(flat_i[rows], o, 1)
    return dist[:, :, :k], idx[:, :, :k]


def smallest(key: npt.NDArray[Any], take: int) -> npt.NDArray[Any]:
    """The ``take`` smallest of each row (last axis) of the unsigned integer keys ``key``,
    sorted: ``key`` sorted along its last axis (in place) and cut, or, for rows longer than
    numpy's sorting network (:func:`network_length`), sorted in pieces of that length whose
    ``take`` smallest are gathered and sorted again (the smallest of a row are among the
    smallest of its pieces), until a row fits in one piece."""
    w, net = key.shape[-1], network_length(key.dtype)
    if w <= net or 2 * take > net:
        key.sort(axis=-1)
        return key[..., :take]
    while w > net:
        key = np.concatenate([np.sort(key[..., a:a + net], axis=-1)[..., :take]
                              for a in range(0, w, net)], axis=-1)
        w = key.shape[-1]
    key.sort(axis=-1)
    return key[..., :take]


def network_length(dtype: np.dtype[Any]) -> int:
    """The longest row of ``dtype`` keys numpy sorts with a sorting network (:data:`_NETWORK`
    bytes: 256 keys of 64 bits, 512 of 32)."""
    return max(1, _NETWORK // dtype.itemsize)


def _beyond(d2: FloatArray, high: npt.NDArray[np.uint64], square: FloatArray,
            dist: FloatArray, tied: npt.NDArray[np.bool_], k: int,
            bits: int) -> npt.NDArray[np.bool_]:
    """Which queries' K nearest may not all be among their first K + 1 keys (those rows are
    then sorted whole). ``high``: each row's K-th and (K + 1)-th keys without their position
    bits; ``tied``: the rows whose first K + 1 are out of order among themselves.

    Where no run of equal keys goes on past the K-th place, every point beyond the first K
    keys has a square of at least L = the (K + 1)-th key with its low bits cleared: the first
    K are the K nearest when the farthest of them is nearer than √L (else a point further on
    may be at the same distance, from another square, with a lower index). Where such a run
    goes on, the whole row is looked at: a point of that run with another square (nearer or
    not, behind a higher position), or at the run's distance from another square, may belong
    before the K-th place. Points tied exactly (equal squares: rounded coordinates make them
    by the thousand) are in index order already and raise nothing."""
    crossing = high[:, :, 0] == high[:, :, 1]
    lower = np.sqrt((high[:, :, 1] << np.uint64(bits)).view(np.float64))
    # out of order among themselves, the first K's farthest is not necessarily the K-th
    farthest = dist[:, :, k - 1].copy()
    if tied.any():
        farthest[tied] = dist[tied][:, :k].max(axis=1)
    out = ~crossing & ~(farthest < lower)
    if crossing.any():
        at_b, at_g = np.nonzero(crossing)
        # Both kinds of point that matter lie within 2^bits + _ULPS steps of the K-th square's
        # bits (squares ≥ 0 order as their bits): one sharing its key's high bits, or one
        # whose square root rounds to the same distance (a handful of steps at most). Those
        # few are found by one integer comparison over the rows and checked exactly, not by
        # the square root and key of every candidate: on listings at 6,000 shared places
        # (112,000 such rows of 112 to 1,280 candidates) the ranking took 0.315 s against
        # 0.485 s on one thread; on the rounded house points (29,000 rows) within the noise
        rows = d2[at_b, at_g].view(np.int64)  # a copy: shifted in place
        sq = square[at_b, at_g, k - 1]
        reach = (1 << bits) + _ULPS
        rows -= (sq.view(np.int64) - reach)[:, None]
        near = rows.view(np.uint64) <= np.uint64(2 * reach)
        near &= rows != reach  # another square, not the K-th's own
        r, c = np.nonzero(near)
        if r.size:
            x, y = d2[at_b[r], at_g[r], c], sq[r]
            hit = (x.view(np.uint64) >> np.uint64(bits)) == high[at_b[r], at_g[r], 0]
            hit |= np.sqrt(x) == np.sqrt(y)
            out[at_b[r[hit]], at_g[r[hit]]] = True
    return out


#: Steps of the last place around the K-th square within which another square may have the
#: same square root (correctly rounded: at most about 8; :func:`_beyond`).
_ULPS = 64


def _leaves(tree: Any) -> list[tuple[int, int]]:
    """The (start, end) ranges of ``tree.indices`` that its leaves hold."""
    stack, found = [tree.tree], []
    while stack:
        node = stack.pop()
        if node.split_dim == -1:
            found.append((node.start_idx, node.end_idx))
        else:
            stack.extend((node.greater, node.lesser))
    return found


def _groups(query: FloatArray, rows: IntArray, g: int, kdtree: Callable[..., Any],
            workers: int = 1) -> tuple[IntArray, npt.NDArray[np.bool_]]:
    """The queries ``rows`` in groups of at most ``g``: the leaves of a balanced k-d tree of
    them (median splits: compact boxes, all of nearly one size), as a (groups, g') array of
    rows padded with each group's first row, and which entries are not padding.

    Many queries on several workers: cut in two at the median of their widest dimension (the
    first split such a tree makes), each half's tree built on a thread of its own (cKDTree
    builds without the GIL): at FedSim's house scale 30 ms with the cut, against 40 ms for the
    one tree, on one core while the other waits."""
    if g == 1 or len(rows) <= g:
        members = rows[:, None] if g == 1 else rows[None, :]
        return members, np.ones(members.shape, dtype=bool)
    points = query[rows]
    if workers < 2 or len(rows) < _HALVES_FROM:
        groups = [_leaf_rows(points, g, kdtree)]
    else:
        # a column at a time: numpy's (n, d).max(axis=0) took 7 ms at house scale, 0.2 ms so
        widest = int(np.argmax([np.ptp(points[:, j]) for j in range(points.shape[1])]))
        order = np.argpartition(points[:, widest], len(rows) // 2)  # in_pieces cuts there

        def half(r: slice) -> tuple[IntArray, npt.NDArray[np.bool_]]:
            part = order[r]
            at, valid = _leaf_rows(points[part], g, kdtree)
            return part[at], valid

        groups = in_pieces(half, len(rows), 2)
    width = max(at.shape[1] for at, _ in groups)
    # the narrower half's groups padded to the other's width with their first row, as a
    # tree pads its own short leaves
    at = np.concatenate([np.concatenate([a, np.repeat(a[:, :1], width - a.shape[1], axis=1)],
                                        axis=1) for a, _ in groups])
    valid = np.concatenate([np.pad(v, ((0, 0), (0, width - v.shape[1]))) for _, v in groups])
    return rows[at], valid


#: Queries from which :func:`_groups` builds its tree in two halves, on two threads.
_HALVES_FROM = 1 << 14


def _leaf_rows(points: FloatArray, g: int, kdtree: Callable[..., Any]
               ) -> tuple[IntArray, npt.NDArray[np.bool_]]:
    """The leaves of a balanced k-d tree of ``points`` (leaf size ``g``): a (leaves, width)
    array of row numbers into ``points``, each leaf padded with its first row, and which
    entries are not padding."""
    tree = kdtree(points, leafsize=g, balanced_tree=True, compact_nodes=False)
    ranges = np.asarray(_leaves(tree), dtype=np.int64)
    sizes = ranges[:, 1] - ranges[:, 0]
    width = int(sizes.max())
    offsets = np.arange(width)
    valid = offsets[None, :] < sizes[:, None]
    at = ranges[:, :1] + np.where(valid, offsets[None, :], 0)
    return np.asarray(tree.indices, dtype=np.int64)[at], valid


def _centres(q_planes: FloatArray, members: IntArray) -> tuple[FloatArray, FloatArray]:
    """Each group's bounding-box centre c and largest query-to-centre distance h, from the
    queries' coordinate planes ((d, n), one contiguous row per dimension): a dimension at a
    time over contiguous (groups, g) rows (the (groups, g, d) gather reduced along its middle
    axis took eight times as long, 17 ms at FedSim's house scale). Padding repeats a group's
    first query, which changes neither. ``h`` bounds the triangle inequality's radius, with
    :data:`_MARGIN` for rounding."""
    centre = np.empty((members.shape[0], q_planes.shape[0]))
    reach: FloatArray | None = None
    for j, plane in enumerate(q_planes):
        x = plane[members]
        centre[:, j] = (x.min(axis=1) + x.max(axis=1)) / 2
        x -= centre[:, j, None]
        x *= x
        reach = x if reach is None else np.add(reach, x, out=reach)
    if reach is None:
        return centre, np.zeros(members.shape[0])
    return centre, np.sqrt(reach.max(axis=1))


def grouped_knn(query: FloatArray, base: FloatArray, k: int, tree: Any, *,
                threads: int | None = None, group: int = GROUP,
                out: tuple[FloatArray, IntArray] | None = None,
                before_writes: Callable[[], None] | None = None
                ) -> tuple[FloatArray, IntArray]:
    """The exact K nearest rows of ``base`` (indexed by ``tree``, a ``cKDTree`` of it) for
    every row of ``query``: ``(distances, indices)``, each ``(n, k)``, rows in the query's
    order, each row sorted by (distance, index). ``out``: arrays to fill;
    ``before_writes``: called once before the first result is written to them."""
    query = np.ascontiguousarray(query, dtype=np.float64)
    base = np.ascontiguousarray(base, dtype=np.float64)
    n = query.shape[0]
    dist, idx = out if out is not None else (np.empty((n, k)), np.empty((n, k), np.int64))
    if n == 0:
        return dist, idx
    workers = threads or cores()
    rows = np.arange(n, dtype=np.int64)
    ready = before_writes or _nothing
    if group > 1:  # the groups too spread to share their candidates: query by query below
        rows = _search(query, rows, base, k, tree, workers, group, dist, idx, ready)
        ready = _nothing
    ready()
    if rows.size:
        rows = _single(query, rows, k, tree, workers, dist, idx)
    if rows.size:  # a tie at the K-th place: the query's own radius
        rows = _search(query, rows, base, k, tree, workers, 1, dist, idx)
        if rows.size:  # thousands of points tied at a query's K-th distance
            _heap(query, rows, k, tree, workers, dist, idx)
    return dist, idx


def _single(query: FloatArray, rows: IntArray, k: int, tree: Any, workers: int,
            dist: FloatArray, idx: IntArray) -> IntArray:
    """cKDTree's query of each of ``rows``' K + 1 nearest; where the (K + 1)-th is strictly
    farther than the K-th, the K nearest are exactly the first K (whichever order the tree
    gave them in), written sorted by (distance, index). The rows with a tie there are
    returned. The tree's distances are the brute force's: the squares of the coordinates'
    differences summed in order, then the square root (scipy sums up to four dimensions in
    order; more than that, and every row is returned)."""
    m = tree.n
    if query.shape[1] > 4:
        return rows
    kk = min(k + 1, m)

    def piece(r: slice) -> IntArray:
        # each piece checks, orders and writes its own rows (disjoint rows of dist and idx),
        # on its own thread: done once on one thread after the joined query instead, the
        # search on clusters in a background at FedSim's house scale (15,460 such rows) took
        # 0.642 s against 0.576 s (medians of 12, two threads)
        part = rows[r]
        got_d, got_i = tree.query(query[part], k=kk, workers=1)
        got_d = np.asarray(got_d, dtype=np.float64).reshape(len(part), kk)
        got_i = np.asarray(got_i, dtype=np.int64).reshape(len(part), kk)
        clear = got_d[:, k] > got_d[:, k - 1] if kk > k else np.ones(len(part), dtype=bool)
        at = part[clear]
        dist[at], idx[at] = in_index_order(got_d[clear, :k], got_i[clear, :k])
        return part[~clear]

    return np.concatenate(_in_pieces_of(piece, len(rows), workers))


def _heap(query: FloatArray, rows: IntArray, k: int, tree: Any, workers: int,
          dist: FloatArray, idx: IntArray) -> None:
    """cKDTree's own query for ``rows``, each row ordered by (distance, index): the same
    distances; which of the points tied at the K-th distance it returns is the tree's."""
    got_d, got_i = _nearest(tree, query[rows], k, workers)
    got_d = np.asarray(got_d, dtype=np.float64).reshape(len(rows), k)
    got_i = np.asarray(got_i, dtype=np.int64).reshape(len(rows), k)
    dist[rows], idx[rows] = in_index_order(got_d, got_i)


def in_index_order(dist: FloatArray, idx: IntArray) -> tuple[FloatArray, IntArray]:
    """Each row of (distances, indices) ordered by (distance, index): the rows already in that
    order as they are (a tree gives its rows sorted by distance, in its own order only among
    equal distances), the others sorted (numpy's lexsort). The arrays themselves where every
    row is in order, else copies. (Sorting every row took 0.05-0.07 s for the 11,183 queries
    of clusters in a background that go one by one to the tree, on one thread; finding that
    none needed it, 2 ms.)"""
    later_d, earlier_d = dist[:, 1:], dist[:, :-1]
    out_of_order = later_d < earlier_d
    out_of_order |= (later_d == earlier_d) & (idx[:, 1:] < idx[:, :-1])
    rows = np.flatnonzero(out_of_order.any(axis=1))
    if rows.size:
        dist, idx = dist.copy(), idx.copy()
        dist[rows], idx[rows] = sort_rows(dist[rows], idx[rows])
    return dist, idx


def sort_rows(dist: FloatArray, idx: IntArray) -> tuple[FloatArray, IntArray]:
    """Each row sorted by (distance, index), so results are deterministic under ties."""
    order = np.lexsort((idx, dist), axis=-1)
    return np.take_along_axis(dist, order, 1), np.take_along_axis(idx, order, 1)


def _nearest(tree: Any, x: FloatArray, k: int | list[int], workers: int, *,
             distances: bool = True) -> tuple[Any, Any]:
    """``tree.query(x, k)`` on ``workers`` threads: ``x`` in contiguous pieces, each queried
    with one worker on :func:`~vflink._threads.in_pieces`' threads, the results joined (each
    point's neighbours are its own, the same whoever computes them). scipy's own
    ``workers=`` starts new threads at every call: the groups' candidates (15 calls, 50
    clusters at FedSim's house scale) took 0.104 s that way on two threads, 0.079 s so (one
    thread: 0.133 s). ``distances=False``: only the indices are joined."""
    parts = _in_pieces_of(lambda r: tree.query(x[r], k=k, workers=1), len(x), workers)
    if len(parts) == 1:
        return parts[0][0] if distances else None, parts[0][1]
    return (np.concatenate([d for d, _ in parts]) if distances else None,
            np.concatenate([i for _, i in parts]))


def _in_pieces_of(fn: Callable[[slice], Any], size: int, workers: int) -> list[Any]:
    """``fn`` of ``size`` rows in pieces, one per worker (at most one a row): the tree's own
    queries, each with one worker of its own (:func:`_nearest`)."""
    return in_pieces(fn, size, max(1, min(workers, size)))


def _nothing() -> None:
    return None


def _search(query: FloatArray, rows: IntArray, base: FloatArray, k: int, tree: Any,
            workers: int, g: int, dist: FloatArray, idx: IntArray,
            ready: Callable[[], None] = _nothing) -> IntArray:
    """Search the queries ``rows`` in groups of about ``g``; the rows of the groups left to
    search query by query. ``ready`` is called before the first result is written."""
    q_planes = np.ascontiguousarray(query.T)
    members, valid = _groups(query, rows, g, type(tree), workers)
    centre, h = _centres(q_planes, members)
    d_k = _nearest(tree, centre, [k], workers)[0][:, 0]
    radius = (d_k + 2.0 * h) * (1.0 + _MARGIN)
    counts = np.concatenate(_in_pieces_of(
        lambda r: np.asarray(tree.query_ball_point(centre[r], radius[r], return_length=True),
                             dtype=np.int64), len(centre), workers))
    counts = np.maximum(counts, k)  # the K nearest of c are within the radius: never fewer
    limit = min(base.shape[0], (_TIED_FACTOR if g == 1 else _SPLIT_FACTOR) * k)
    spread = counts > limit
    # widths in steps of an eighth (at least 16), so that a batch shares one candidate count
    step = np.maximum(16, 1 << np.maximum(0, np.ceil(np.log2(counts)).astype(np.int64) - 3))
    width = np.minimum(-(-counts // step) * step, base.shape[0])
    # A group's queries are the first of its row (its padding after them). Groups of a width
    # go to the jobs largest first, a job as wide as its largest group and holding none
    # smaller than _FILL of it: groups of uneven sizes (a tree's leaves on tied coordinates)
    # are not all padded to the widest. At FedSim's house scale on two threads (medians of
    # 8): the points rounded to 3 decimals 0.586 s → 0.500 s, 6,000 places each shared by
    # some 28 rows 0.415 s → 0.322 s, points without ties unchanged. (Leaves made even by
    # moving tied coordinates apart instead parted equal points between groups: 0.43 s
    # against 0.39 s on the shared places, in the same run.)
    fill = valid.sum(axis=1)
    jobs: list[tuple[IntArray, IntArray]] = []
    for w in _distinct(width[~spread]):
        chosen = np.flatnonzero((width == w) & ~spread)
        chosen = chosen[np.argsort(-fill[chosen], kind="stable")]
        smaller = -fill[chosen]  # ascending
        cand = np.asarray(_nearest(tree, centre[chosen], int(w), workers, distances=False)[1],
                          dtype=np.int64).reshape(len(chosen), int(w))
        a = 0
        while a < len(chosen):
            size = int(fill[chosen[a]])
            end = min(a + max(1, _BATCH_PAIRS // (size * int(w))),
                      int(np.searchsorted(smaller, -math.ceil(size * _FILL), side="right")))
            jobs.append((members[chosen[a:end], :size], cand[a:end]))
            a = end

    b_planes = np.ascontiguousarray(base.T)

    def run(job: tuple[IntArray, IntArray]) -> None:
        at, cand = job
        # index order (in place: the batch's own rows): _rank's keys then break ties by index;
        # sorted here, on the job's thread, rather than all at once before the jobs
        cand.sort(axis=1)
        d2 = _squared(q_planes[:, at], b_planes[:, cand])
        got_d, got_i = _rank(d2, cand, k)
        # a short group's padding repeats its first query: the same candidates give the same
        # K nearest, written to that query's row once more (no mask to gather through)
        dist[at] = got_d
        idx[at] = got_i

    ready()
    map_jobs(run, jobs, workers)
    return members[spread][valid[spread]]


def _distinct(values: IntArray) -> IntArray:
    """The distinct values of ``values``, sorted: ``numpy.unique``'s result, without its first
    call's import of ``numpy.ma`` (6-8 ms, on the search's path while the other core waits)."""
    v = np.sort(values)
    return v[np.concatenate(([True], v[1:] != v[:-1]))] if v.size else v


def map_jobs(fn: Callable[[Any], None], jobs: list[Any], workers: int) -> None:
    """Run ``fn`` on every job, on ``workers`` threads (numpy's sorts and arithmetic and
    faiss's distances release the GIL). Each thread takes the next job as soon as it is done
    with its last (no rounds for the other thread to wait at), in the caller's context, so a
    served request whose caller gave up stops at the next job (:func:`checkpoint`). The first
    error stops the other threads at their next job, and is raised."""
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            checkpoint()
            fn(job)
        return
    lock = threading.Lock()
    queue = iter(jobs)
    failed = threading.Event()

    def work() -> None:
        while not failed.is_set():
            with lock:
                job = next(queue, _DONE)
            if job is _DONE:
                return
            try:
                checkpoint()
                fn(job)
            except BaseException:
                failed.set()
                raise

    # one worker per piece of in_pieces (the calling thread and the process's pool, no thread
    # started per call), each in a copy of the caller's context
    threads = min(workers, len(jobs))
    contexts = [contextvars.copy_context() for _ in range(threads)]
    in_pieces(lambda r: contexts[r.start].run(work), threads, threads)


#: The end of :func:`map_jobs`' queue (a job may be anything, None included).
_DONE = object()
