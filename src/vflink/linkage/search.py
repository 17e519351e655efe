"""Top-K nearest-neighbour search between primary and secondary identifiers (FedSim §4.1 step 1).

Each metric has an accelerated search and a plain brute-force reference **with the same
signature** ``fn(primary, secondary, k, *, options=None) -> Neighbours`` (ARCHITECTURE.md,
convention 8); tests run both and compare distances (indices may differ on ties).

=============  ======================================  ==========================================
metric         accelerated (``mode="exact"``)           ``mode="approximate"``
=============  ======================================  ==========================================
euclidean      faiss ``IndexFlatL2``; scipy ``cKDTree``  faiss ``IndexIVFFlat``
               when d ≤ 4 (``dense_index="auto"``),
               queries in groups for K ≥ 16
               (:mod:`.grouped`)
haversine      the same on 3-D unit vectors (chord is   faiss ``IndexIVFFlat`` on unit vectors
               monotone in the great-circle
               distance), then km
hamming        faiss ``IndexBinaryFlat``                a binary IVF around sampled
                                                        filters, queries probing the same
                                                        cells searched together
                                                        (:mod:`.binary_ivf`)
levenshtein    rapidfuzz ``cdist`` over all pairs,      verification in order of a lower bound
               multi-threaded, chunked                  (length and LCS, :mod:`.blocking`) until
                                                        no unverified pair can enter: distances
                                                        equal the exact search's
=============  ======================================  ==========================================

The default ``mode="auto"`` is exact, except for Hamming searches large enough that comparing
every pair costs seconds (more than :data:`AUTO_APPROXIMATE_WORK` byte comparisons, e.g. FedSim's
house scale, 141,050 × 27,827 1024-bit filters, or 28,298 × 234,908 geographic filters): those run
the binary IVF, whose recall is measured and reported. On those two cases it was measured at
recall@K 0.998 and 0.993, with a sixth and a fiftieth of the flat index's CPU time
(``benchmarks/linkage.py``); searched a group of queries at a time (:mod:`.binary_ivf`), the
house-scale case's recall@K is 0.9994, for 1.8-2.4 s of CPU against 3.2-4.0 s for faiss's
IVF search of the same cells (repeated runs on a shared 2-core machine).

The approximate string search returns the exact top-K distances (its measured recall is 1.0;
only which member of a tie at the K-th distance is returned may differ) and needs less work
where the bounds prune: on the benchmark's 25,000 × 100,000 typo-ridden titles (K = 10) it
computes LCS bounds for 45 % of the pairs and Levenshtein distances for 1.7 % (measuring its
recall on 500 rows included), in 29 s of CPU against 108 s for the exact search, one thread
(``benchmarks/linkage.py``, cases c-blocking and c). On short strings of one length over a
small alphabet the bounds prune little; rows whose sample shows that are searched over all
pairs, which kept random 20-40-character strings over 2, 4 and 26 letters (1,000 × 20,000,
K = 10) within 5 % of the exact search's time (recall measurement aside).

All searches work on chunks of primary rows so memory stays bounded. Rows of the result are
sorted by (distance, secondary index). Exact searches recompute the distances of the returned
neighbours in float64 (faiss works in float32), so exact results equal brute force up to ties at
the K-th position: faiss's flat index picks K and a margin in float32, the K nearest of those
are kept in float64, and a row whose float32 scores cannot rule out a point left out (points
closer together than float32 can tell: near the antipode, or far from the origin) is searched
again in float64 over every point. Approximate searches measure their recall@K against brute
force on a sample of primary rows and report it in :attr:`Neighbours.recall`.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import math
import threading
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from vflink._cancel import checkpoint
from vflink._checks import check_choice, check_int, raise_if
from vflink._memory import Prefault
from vflink._threads import cores
from vflink.errors import LinkageError
from vflink.linkage.binary_ivf import ivf_hamming_knn, search_in_threads
from vflink.linkage.blocking import lcs_lower_bounds, length_window
from vflink.linkage.distances import (
    chord_to_km,
    euclidean_distances,
    hamming_distances,
    haversine_distances,
    latlon_to_unit,
    levenshtein_distances,
)
from vflink.linkage.grouped import grouped_knn, in_index_order, sort_rows
from vflink.registry import Registry

__all__ = [
    "METRICS",
    "Metric",
    "Neighbours",
    "SearchFn",
    "SearchOptions",
    "SEARCH_MODES",
    "AUTO_APPROXIMATE_WORK",
    "brute_euclidean",
    "brute_hamming",
    "brute_haversine",
    "brute_levenshtein",
    "recall_at_k",
    "search_euclidean",
    "search_hamming",
    "search_haversine",
    "search_levenshtein",
]

log = logging.getLogger(__name__)

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
Identifiers = Any  # float (n, d) array, packed uint8 (n, B) array, or a sequence of str

#: Memory budget (bytes) for one chunk of a brute-force distance matrix.
_BRUTE_BUDGET = 128 * 2**20
#: The exact k-d tree search answers queries in groups (:mod:`vflink.linkage.grouped`) from
#: this K on; below it cKDTree's own query, whose heap of K is cheap for few neighbours (the
#: grouped search was measured at K = 100 only: 1.7 times less CPU).
GROUPED_FROM_K = 16
#: ... and for points of at most this many dimensions (or on the sphere: great-circle
#: searches, 3-D unit vectors on a 2-D surface). A group's candidates grow with the volume its
#: radius spans: on 141,050 × 27,827 clustered points at K = 100 (best of three, 2 cores) the
#: grouped search took 0.81 s against cKDTree's 0.97 s in 2-D, but 2.0 s against 1.6 s in 3-D
#: and 2.6 s against 1.7 s in 4-D, where the tree's own query in Z order matched cKDTree;
#: on the sphere (the house points, great-circle) it took 1.41 s against 1.51 s.
GROUPED_MAX_DIMS = 2
#: Search modes: ``auto`` is exact except for large Hamming searches (see the module docstring).
SEARCH_MODES = ("auto", "exact", "approximate")
#: ``mode="auto"`` runs a Hamming search approximately above this many byte comparisons
#: (primary rows × secondary rows × bytes per filter): about 3 s of faiss's flat binary index on
#: 2 cores; below it the exact search is cheap enough to keep.
AUTO_APPROXIMATE_WORK = 2 * 10**11
#: Byte comparisons an approximate binary search spends on measuring its recall.
_RECALL_WORK = 10**10
#: Secondary strings sampled to bound each primary string's K-th Levenshtein distance from
#: above: a sixteenth of them, at least _MIN_SAMPLE and at most _BOUND_SAMPLE (and 4K).
_BOUND_SAMPLE = 4096
_MIN_SAMPLE = 1024
#: Candidates verified in the first batch after the sample (doubling after each batch).
_VERIFY_BATCH = 64
#: Levenshtein distances computed one query at a time cost about this many times more per
#: pair than in a bulk SIMD call (rapidfuzz 3.14, 28-character titles: 100-200 ns against 24-43)
_SINGLE_COST = 4
#: Rows whose sample has more than this share of strings with a bound below the K-th distance
#: found are searched over all pairs (verifying them would cost more than that).
_ALL_PAIRS_SHARE = 1 / _SINGLE_COST


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """How to run a top-K search.

    Attributes:
        mode: ``"auto"`` (default: exact, but the binary IVF for Hamming searches of more than
            :data:`AUTO_APPROXIMATE_WORK` byte comparisons), ``"exact"`` or ``"approximate"``
            (IVF for dense/binary, LCS-bound verification for strings); the recall of an
            approximate search is measured and reported.
        chunk_size: primary rows searched per chunk (bounds memory).
        threads: threads for faiss and rapidfuzz; ``None`` keeps faiss's setting and lets
            rapidfuzz use all cores. Set it deliberately on small machines (ARCHITECTURE.md,
            performance principles).
        dense_index: exact index for dense vectors: ``"flat"`` (faiss ``IndexFlatL2``, brute
            force over all pairs), ``"kdtree"`` (scipy ``cKDTree``, exact, float64) or
            ``"auto"`` (kdtree for ≤ 4 dimensions, flat otherwise). A k-d tree prunes almost all
            pairs in low dimensions — at FedSim's house scale (2-D, K = 100) it was measured
            at 3.5 s against 10.0 s for the flat index on 2 cores — but degrades towards brute
            force as the dimension grows, where faiss's BLAS-blocked flat search wins.
        nlist: IVF cells; default ``min(4·√n, n / 39)`` for dense vectors (faiss wants ≥ 39
            training points each); for binary filters see :func:`_binary_ivf_shape`.
        nprobe: IVF cells visited per query; default ``max(8, nlist / 16)`` for dense vectors
            and ``max(8, ⌈K / 5⌉)`` for binary filters.
        recall_sample: primary rows on which an approximate search measures its recall against
            brute force (0: do not measure).
        seed: seed of the recall sample and of the filters a binary IVF is centred on.
    """

    mode: Literal["auto", "exact", "approximate"] = "auto"
    dense_index: Literal["auto", "flat", "kdtree"] = "auto"
    chunk_size: int = 16384
    threads: int | None = None
    nlist: int | None = None
    nprobe: int | None = None
    recall_sample: int = 500
    seed: int = 0

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_choice(problems, "mode", self.mode, SEARCH_MODES)
        check_choice(problems, "dense_index", self.dense_index, ("auto", "flat", "kdtree"))
        check_int(problems, "chunk_size", self.chunk_size, min=1)
        if self.threads is not None:
            check_int(problems, "threads", self.threads, min=1)
        if self.nlist is not None:
            check_int(problems, "nlist", self.nlist, min=1)
        if self.nprobe is not None:
            check_int(problems, "nprobe", self.nprobe, min=1)
        check_int(problems, "recall_sample", self.recall_sample, min=0)
        check_int(problems, "seed", self.seed, min=0)
        raise_if(problems, "search options")


@dataclass(frozen=True, eq=False)
class Neighbours:
    """Result of a top-K search.

    Attributes:
        indices: ``(n, k)`` secondary row positions, nearest first.
        distances: ``(n, k)`` float64 distances in the metric's unit.
        exact: whether the search was exact.
        recall: tie-aware recall@K measured against brute force (approximate searches);
            ``None`` means not measured (exact searches).
        recall_rows: number of primary rows the recall was measured on.
        resolution: the smallest step of the distance that FedSim's greedy attack must resolve
            (Theorem 2's rounding, App. A.2 Eq. 10): 1 for Hamming distances of Bloom filters
            and other integer distances; a multi-field distance sets its own
            (:func:`vflink.linkage.fields.field_resolution`).
    """

    indices: IntArray
    distances: FloatArray
    exact: bool
    recall: float | None = None
    recall_rows: int = 0
    resolution: float = 1.0

    @property
    def k(self) -> int:
        return int(self.indices.shape[1])

    def __len__(self) -> int:
        return int(self.indices.shape[0])


class SearchFn(Protocol):
    def __call__(self, primary: Identifiers, secondary: Identifiers, k: int, *,
                 options: SearchOptions | None = None) -> Neighbours: ...


# ---------------------------------------------------------------------------------------------
# shared helpers


def _faiss() -> Any:
    """faiss, imported where a search uses it: a k-d tree or string search (and every link
    that runs one) does not pay for loading it."""
    import faiss

    return faiss


@contextmanager
def _faiss_threads(threads: int | None) -> Iterator[None]:
    if threads is None:
        yield
        return
    faiss = _faiss()
    old = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(threads)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(old)




def _topk_from_matrix(d: npt.NDArray[Any], k: int) -> tuple[FloatArray, IntArray]:
    """Row-wise K smallest of a dense distance matrix, ties broken by lower column index.

    Uses the K-th value per row as a threshold instead of ``argpartition`` over the whole row,
    which would allocate an int64 array as large as the chunk.
    """
    kth = np.partition(d, k - 1, axis=1)[:, k - 1]
    rows, cols = np.nonzero(d <= kth[:, None])
    vals = d[rows, cols]
    order = np.lexsort((cols, vals, rows))
    rows, cols, vals = rows[order], cols[order], vals[order]
    starts = np.concatenate(([0], np.cumsum(np.bincount(rows, minlength=d.shape[0]))[:-1]))
    take = starts[:, None] + np.arange(k)[None, :]
    return vals[take].astype(np.float64), cols[take].astype(np.int64)


def _brute_rows(n_secondary: int, bytes_per_pair: int) -> int:
    return max(1, _BRUTE_BUDGET // max(1, n_secondary * bytes_per_pair))


def _brute(
    n_primary: int,
    n_secondary: int,
    k: int,
    pairwise: Callable[[slice], npt.NDArray[Any]],
    bytes_per_pair: int,
) -> Neighbours:
    dist = np.empty((n_primary, k), dtype=np.float64)
    idx = np.empty((n_primary, k), dtype=np.int64)
    step = _brute_rows(n_secondary, bytes_per_pair)
    for start in range(0, n_primary, step):
        checkpoint()  # a served request whose caller gave up stops here
        rows = slice(start, min(n_primary, start + step))
        dist[rows], idx[rows] = _topk_from_matrix(pairwise(rows), k)
    return Neighbours(idx, dist, exact=True)


def recall_at_k(found: FloatArray, truth: FloatArray, *, rtol: float = 1e-9) -> float:
    """Tie-aware recall@K: the fraction of returned neighbours whose distance is at most the
    true K-th distance of their row. Comparing distances, not indices, does not penalise an
    index that returns a different member of a tie."""
    if found.size == 0:
        return 1.0
    kth = truth[:, -1:]
    ok = found <= kth + rtol * np.maximum(1.0, np.abs(kth))
    return float(ok.mean())


def _measure_recall(
    primary: Identifiers,
    secondary: Identifiers,
    k: int,
    result: Neighbours,
    brute: SearchFn,
    options: SearchOptions,
    take: Callable[[Identifiers, IntArray], Identifiers],
) -> Neighbours:
    n = len(result)
    if options.recall_sample == 0 or n == 0:
        return result
    rng = np.random.default_rng(options.seed)
    rows = np.sort(rng.choice(n, size=min(n, options.recall_sample), replace=False))
    truth = brute(take(primary, rows), secondary, k)
    recall = recall_at_k(result.distances[rows], truth.distances)
    log.info("approximate top-%d search: measured recall %.4f on %d rows", k, recall, len(rows))
    return Neighbours(result.indices, result.distances, exact=False, recall=recall,
                      recall_rows=len(rows))


def _take_rows(x: Identifiers, rows: IntArray) -> Identifiers:
    if isinstance(x, np.ndarray):
        return x[rows]
    return [x[int(i)] for i in rows]


def _resolved(options: SearchOptions | None, approximate: bool = False) -> SearchOptions:
    """``options`` with ``mode="auto"`` resolved: approximate when ``approximate``, else exact."""
    o = options or SearchOptions()
    if o.mode != "auto":
        return o
    return dataclasses.replace(o, mode="approximate" if approximate else "exact")


def _check_k(k: int, n_secondary: int) -> None:
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
        raise LinkageError(f"`top_k` must be an int ≥ 1, got {k!r}")
    if k > n_secondary:
        raise LinkageError(
            f"`top_k` = {k} is larger than the secondary table ({n_secondary} rows)"
        )


# ---------------------------------------------------------------------------------------------
# dense vectors (euclidean, haversine) with faiss


def _default_nlist(n: int) -> int:
    return max(1, min(round(4 * math.sqrt(n)), n // 39))


def _dense_index(base: npt.NDArray[np.float32], options: SearchOptions) -> Any:
    faiss = _faiss()
    d = base.shape[1]
    index: Any
    if options.mode == "exact":
        index = faiss.IndexFlatL2(d)
    else:
        nlist = options.nlist or _default_nlist(base.shape[0])
        nlist = min(nlist, base.shape[0])
        quantizer = faiss.IndexFlatL2(d)
        index = faiss.IndexIVFFlat(quantizer, d, nlist)
        index.cp.verbose = False
        index.train(base)
        index.nprobe = min(nlist, options.nprobe or max(8, nlist // 16))
    index.add(base)
    return index


def _dense_search(
    query: FloatArray,
    base: FloatArray,
    k: int,
    options: SearchOptions,
    rowwise: Callable[[FloatArray, FloatArray], FloatArray],
    to_unit: Callable[[FloatArray], FloatArray] | None = None,
) -> Neighbours:
    """Search in float32 with faiss, then recompute float64 distances of the K hits.

    ``query``/``base`` are already in the space where L2 is monotone in the target distance;
    they are centred on the base mean first because faiss's ``|x|²+|y|²-2xy`` expansion in
    float32 loses nearby-point precision when coordinates are far from the origin (e.g.
    latitude 39.9° or unit vectors).
    """
    n = query.shape[0]
    dist = np.empty((n, k), dtype=np.float64)
    idx = np.empty((n, k), dtype=np.int64)
    kind = options.dense_index
    if kind == "auto":
        kind = "kdtree" if base.shape[1] <= 4 else "flat"
    if options.mode == "exact" and kind == "kdtree":
        grouped = k >= GROUPED_FROM_K and (base.shape[1] <= GROUPED_MAX_DIMS
                                           or to_unit is not None)
        # The first load of cKDTree (0.08 s on one core) and the grouped search's preparation
        # (the queries' grouping, each group's candidates) leave a core idle: a thread
        # touches the result's fresh pages meanwhile, which the search would otherwise fault
        # in itself, and stops before the first result is written (:class:`Prefault`).
        warm = Prefault(dist, idx) if grouped or not kdtree_loaded() else None
        try:
            tree = kdtree_class()(base)
            if grouped:
                # many neighbours: groups of near queries share their candidates (grouped.py)
                grouped_knn(query, base, k, tree, threads=options.threads, out=(dist, idx),
                            before_writes=warm.stop if warm is not None else None)
                if to_unit is not None:  # a monotone change of unit may make new ties
                    dist, idx = in_index_order(to_unit(dist), idx)
                return Neighbours(idx, dist, exact=True)
        finally:
            if warm is not None:
                warm.stop()
        # Queries in Z order (near queries one after another, so the tree nodes and points
        # one query visits are in the cache for the next): 13 % less CPU than the tables'
        # order at FedSim's house scale (141,050 × 27,827, K = 100); the results are each
        # query's own, put back at its row.
        order = z_order(query) if n > options.chunk_size // 4 else None
        for start in range(0, n, options.chunk_size):
            checkpoint()  # a served request whose caller gave up stops here
            stop = min(n, start + options.chunk_size)
            rows = slice(start, stop) if order is None else order[start:stop]
            tree_d, found = tree.query(query[rows], k=k,
                                       workers=-1 if options.threads is None else options.threads)
            found = np.asarray(found, dtype=np.int64).reshape(stop - start, k)
            tree_d = np.asarray(tree_d, dtype=np.float64).reshape(stop - start, k)
            # cKDTree computes float64 Euclidean distances from differences, exactly what
            # ``rowwise`` would recompute (it only changes the unit: chord → km), and returns
            # them sorted; only rows with tied distances need the (distance, index) order.
            d = tree_d if to_unit is None else to_unit(tree_d)
            dist[rows], idx[rows] = in_index_order(d, found)
        return Neighbours(idx, dist, exact=True)
    faiss = _faiss()
    center = base.mean(axis=0)
    xb = np.ascontiguousarray(base - center, dtype=np.float32)
    exact = options.mode == "exact"
    # An exact search picks in float32 more than K (``pick``), then keeps the K nearest in
    # float64; a row is certain only if no point faiss left out can be as near (see
    # _uncertain); the others are searched in float64 over every point.
    pick = min(base.shape[0], k + max(8, k // 4)) if exact else k
    reach = float(np.sqrt(np.einsum("ij,ij->i", xb, xb, dtype=np.float64).max(initial=0.0)))
    with _faiss_threads(options.threads):
        index = _dense_index(xb, options)
        exact_index: Any = None
        for start in range(0, n, options.chunk_size):
            checkpoint()  # a served request whose caller gave up stops here
            stop = min(n, start + options.chunk_size)
            xq = np.ascontiguousarray(query[start:stop] - center, dtype=np.float32)
            scores, found = index.search(xq, pick)
            missing = (found < 0).any(axis=1)
            if missing.any():
                # IVF can return fewer than k hits when the probed cells are small; finish those
                # rows exactly rather than returning holes.
                if exact_index is None:
                    exact_index = faiss.IndexFlatL2(xb.shape[1])
                    exact_index.add(xb)
                _, found[missing] = exact_index.search(xq[missing], k)
            q = query[start:stop]
            d = rowwise(q, base[found])
            d, found = sort_rows(d, found.astype(np.int64))
            d, found = d[:, :k], found[:, :k]
            if exact and pick < base.shape[0]:
                unsure = _uncertain(q, base, xq, scores[:, -1], found[:, -1], reach)
                if unsure.any():  # settled over every point, as the brute force does
                    whole = _brute(int(unsure.sum()), base.shape[0], k,
                                   _against_all(rowwise, q[unsure], base),
                                   8 * (base.shape[1] + 1))
                    d[unsure], found[unsure] = whole.distances, whole.indices
            dist[start:stop], idx[start:stop] = d, found
    return Neighbours(idx, dist, exact=exact)


def _against_all(rowwise: Callable[[FloatArray, FloatArray], FloatArray], query: FloatArray,
                 base: FloatArray) -> Callable[[slice], FloatArray]:
    """:func:`_brute`'s pairwise distances from a row-wise function: rows ``r`` of ``query``
    against every ``base`` point."""
    def pairs(r: slice) -> FloatArray:
        return rowwise(query[r], np.broadcast_to(base, (r.stop - r.start, *base.shape)))

    return pairs


#: Unit roundoff of float32, doubled: a generous bound on each float32 operation's error.
_F32 = 2.0 ** -23


def _uncertain(query: FloatArray, base: FloatArray, xq: npt.NDArray[np.float32],
               last_score: npt.NDArray[np.float32], kth: IntArray,
               reach: float) -> npt.NDArray[np.bool_]:
    """Rows of a float32 pick whose K nearest may lie outside it.

    faiss scored every point in float32 (‖q'‖² + ‖y'‖² − 2q'·y' on the centred coordinates
    rounded to float32, or the plain sum of squares) and left out only points scoring at
    least the last picked one's ``last_score``. Such a score is within
    ``E = 4(d + 4)·u·(‖q'‖ + R)²`` of the rounded points' squared distance (u the float32
    unit roundoff, R the largest centred base norm), and rounding moved the points' difference
    by at most ``δ = 2u(‖q'‖ + R)``; so a point left out is at least
    ``√(last_score − E) − δ`` from the query. A row is certain when its K-th nearest, in
    float64, is nearer than that (by a relative margin that keeps a monotone change of unit,
    chord to km, from making a tie)."""
    norm = np.sqrt(np.einsum("ij,ij->i", xq, xq, dtype=np.float64))
    span = norm + reach
    error = 4.0 * (query.shape[1] + 4) * _F32 * span * span
    bound = np.sqrt(np.maximum(last_score.astype(np.float64) - error, 0.0)) - 2.0 * _F32 * span
    diff = base[kth] - query
    kth_dist = np.sqrt(np.einsum("ij,ij->i", diff, diff))
    return ~(kth_dist * (1.0 + 1e-9) < bound)


#: The extension module that holds scipy's cKDTree (:func:`kdtree_class`).
_KDTREE_MODULE = "scipy.spatial._ckdtree"


def kdtree_loaded() -> bool:
    """Whether :func:`kdtree_class` would find cKDTree loaded already."""
    import sys

    return _KDTREE_MODULE in sys.modules


def kdtree_class() -> Any:
    """scipy's ``cKDTree``.

    Loaded from its own extension module when ``scipy.spatial`` is not imported yet: the
    package's ``__init__`` also loads qhull, scipy.linalg, scipy.special and the distance
    functions, which a k-d tree does not use, 0.17 s of CPU on every link (measured on 2
    cores). The module is registered under its own name, so a later ``import
    scipy.spatial`` takes this very module (the same class). The extension's own imports
    that a k-d tree does not use are stood in for while it loads (:func:`_stand_ins`). Any
    surprise in the layout falls back to the plain import.
    """
    import sys

    name = _KDTREE_MODULE
    with _KDTREE_LOCK:  # one thread loads it; the others wait for it, whole
        loaded = sys.modules.get(name)
        if loaded is None and "scipy.spatial" not in sys.modules:
            try:
                loaded = _load_extension(name)
            except Exception:  # noqa: BLE001 - any other layout: the ordinary import below
                log.debug("loading %s directly failed; importing scipy.spatial", name,
                          exc_info=True)
                sys.modules.pop(name, None)
                loaded = None
        if loaded is None:
            from scipy.spatial import cKDTree

            return cKDTree
    return loaded.cKDTree


#: Held while :func:`kdtree_class` loads the extension.
_KDTREE_LOCK = threading.Lock()


def _stand_ins() -> dict[str, dict[str, Any]]:
    """What the cKDTree extension imports at its load and a k-d tree's build and queries do
    not use, with the names it takes from each (:func:`_load_extension`).

    ``scipy.sparse``: the result types of ``sparse_distance_matrix``, looked up through the
    ``scipy`` package when that method is called (the real module is imported then, by
    scipy's own lazy submodules). ``scipy._lib._util``: one constant, ``copy_if_needed``,
    the ``copy`` argument of ``numpy.array`` that copies only where it must: ``None`` from
    numpy 2 on (as scipy defines it there). Loading those two took 0.035-0.04 s of the
    0.047 s that cKDTree's load took in ``vflink link`` (scipy's array-API layer imports
    every public submodule of numpy), on one core while the other waited; stood in for,
    the load took 0.008 s. Before numpy 2 nothing is stood in for.
    """
    if int(np.__version__.split(".")[0]) < 2:
        return {}
    return {"scipy.sparse": {}, "scipy._lib._util": {"copy_if_needed": None}}


class _StandIn(types.ModuleType):
    """A module that stands in for another while cKDTree's extension loads: the names the
    extension takes from it, nothing else for the loading thread; another thread that gets
    hold of it (imported in that instant) waits for the load to end, then reads each name
    from the real module."""

    def __init__(self, name: str, names: dict[str, Any], done: threading.Event) -> None:
        super().__init__(name)
        vars(self).update(names)
        self._vflink_loader = threading.get_ident()
        self._vflink_done = done

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") or threading.get_ident() == self._vflink_loader:
            raise AttributeError(attr)
        self._vflink_done.wait()
        return getattr(importlib.import_module(self.__name__), attr)


def _load_extension(name: str) -> Any:
    """The extension module ``name`` loaded from its file, its package's ``__init__`` not
    run; registered in ``sys.modules``. While it loads, the modules of :func:`_stand_ins`
    not imported yet are :class:`_StandIn` modules; they are gone again afterwards, from
    ``sys.modules`` and from their packages, so a later import gets the real ones."""
    import importlib.machinery
    import importlib.util
    import sys
    from pathlib import Path

    top, *middle, leaf = name.split(".")
    spec = importlib.util.find_spec(top)  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"no package {top}")
    folder = Path(next(iter(spec.submodule_search_locations)), *middle)
    path = next(folder / (leaf + suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES
                if (folder / (leaf + suffix)).is_file())
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    module_spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    if module_spec is None:
        raise ImportError(f"no spec for {path}")
    done = threading.Event()
    stood: dict[str, _StandIn] = {}
    try:
        for stand_in, names in _stand_ins().items():
            if stand_in not in sys.modules:
                stood[stand_in] = sys.modules[stand_in] = _StandIn(stand_in, names, done)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        loader.exec_module(module)
    finally:
        for stand_in, fake in stood.items():
            if sys.modules.get(stand_in) is fake:
                del sys.modules[stand_in]
            parent, _, child = stand_in.rpartition(".")
            package = sys.modules.get(parent)
            # the import bound it on its package: unbound (vars, not getattr: scipy's
            # packages import a missing submodule on attribute access)
            if package is not None and vars(package).get(child) is fake:
                delattr(package, child)
        done.set()
    if not hasattr(module, "cKDTree"):
        raise ImportError(f"{path} has no cKDTree")
    return module


def z_order(points: FloatArray) -> IntArray:
    """The rows of ``points`` (n × d, d ≤ 4 is where it helps) in Z (Morton) order: each
    coordinate scaled to an integer grid over its range, the grid cells' bits interleaved,
    the rows sorted by that code (stably: ties keep their order)."""
    x = np.asarray(points, dtype=np.float64)
    n, d = x.shape
    if n == 0 or d == 0:
        return np.arange(n, dtype=np.int64)
    bits = min(16, 63 // d)
    lo = x.min(axis=0)
    span = x.max(axis=0) - lo
    span[~(span > 0)] = 1.0  # a constant (or non-finite) column adds nothing to the order
    grid = np.nan_to_num((x - lo) / span * ((1 << bits) - 1), nan=0.0, posinf=0.0, neginf=0.0)
    cells = np.clip(grid, 0, (1 << bits) - 1).astype(np.uint64)
    code = np.zeros(n, dtype=np.uint64)
    for b in range(bits):
        for j in range(d):
            code |= ((cells[:, j] >> np.uint64(b)) & np.uint64(1)) << np.uint64(b * d + j)
    return np.argsort(code, kind="stable").astype(np.int64)


def _euclid_rowwise(q: FloatArray, b: FloatArray) -> FloatArray:
    diff = b - q[:, None, :]
    return np.asarray(np.sqrt(np.einsum("ijk,ijk->ij", diff, diff)), dtype=np.float64)


def _as_dense(x: Identifiers) -> FloatArray:
    a = np.asarray(x, dtype=np.float64)
    return a[:, None] if a.ndim == 1 else a


def search_euclidean(primary: Identifiers, secondary: Identifiers, k: int, *,
                     options: SearchOptions | None = None) -> Neighbours:
    """Top-K Euclidean neighbours with faiss (flat: exact; IVF: approximate, recall measured)."""
    o = _resolved(options)
    p, s = _as_dense(primary), _as_dense(secondary)
    _check_k(k, s.shape[0])
    result = _dense_search(p, s, k, o, _euclid_rowwise)
    if o.mode == "approximate":
        result = _measure_recall(p, s, k, result, brute_euclidean, o, _take_rows)
    return result


def brute_euclidean(primary: Identifiers, secondary: Identifiers, k: int, *,
                    options: SearchOptions | None = None) -> Neighbours:
    """Reference: chunked numpy distance matrices and row-wise selection."""
    p, s = _as_dense(primary), _as_dense(secondary)
    _check_k(k, s.shape[0])
    return _brute(p.shape[0], s.shape[0], k, lambda r: euclidean_distances(p[r], s),
                  8 * (s.shape[1] + 1))


def _chord_km_rowwise(q_unit: FloatArray, b_unit: FloatArray) -> FloatArray:
    # Chord lengths in float64 on unit vectors, converted to km: exact up to float64 rounding
    # and consistent with haversine_distances (tested).
    return chord_to_km(_euclid_rowwise(q_unit, b_unit))


def search_haversine(primary: Identifiers, secondary: Identifiers, k: int, *,
                     options: SearchOptions | None = None) -> Neighbours:
    """Top-K great-circle neighbours (km) of (lat, lon) degrees, via faiss on unit vectors."""
    o = _resolved(options)
    p, s = _as_dense(primary), _as_dense(secondary)
    _check_k(k, s.shape[0])
    pu, su = latlon_to_unit(p), latlon_to_unit(s)
    result = _dense_search(pu, su, k, o, _chord_km_rowwise, chord_to_km)
    if o.mode == "approximate":
        result = _measure_recall(p, s, k, result, brute_haversine, o, _take_rows)
    return result


def brute_haversine(primary: Identifiers, secondary: Identifiers, k: int, *,
                    options: SearchOptions | None = None) -> Neighbours:
    """Reference: chunked haversine-formula distance matrices and row-wise selection."""
    p, s = _as_dense(primary), _as_dense(secondary)
    _check_k(k, s.shape[0])
    return _brute(p.shape[0], s.shape[0], k, lambda r: haversine_distances(p[r], s), 8 * 6)


# ---------------------------------------------------------------------------------------------
# Bloom filters (hamming) with faiss binary indexes


def _as_packed(x: Identifiers) -> npt.NDArray[np.uint8]:
    a = np.ascontiguousarray(x, dtype=np.uint8)
    return a[:, None] if a.ndim == 1 else a


def _binary_ivf_shape(n_primary: int, n_secondary: int, k: int,
                      options: SearchOptions) -> tuple[int, int]:
    """(nlist, nprobe) of a binary IVF.

    nprobe = max(8, ⌈K / 12.5⌉) cells per query; nlist balances the quantizer's cost (every
    filter of both sides against nlist centres) against the scan's (nprobe cells of
    n_secondary / nlist filters per query): nlist = √(n_p · nprobe · n_s / (n_p + n_s)).
    The cells are refined (:func:`_binary_centres`), so fewer of them hold the neighbours:
    at house scale (K = 100: 431 cells, 8 probed) recall@K 0.998 on 2,000 rows, as 681 cells
    of sampled filters with 20 probed gave, for a quarter less CPU (``benchmarks/linkage.py``).
    """
    nprobe = options.nprobe or max(8, math.ceil(k / 12.5))
    balanced = math.sqrt(n_primary * nprobe * n_secondary / max(1, n_primary + n_secondary))
    nlist = options.nlist or max(1, min(round(balanced), n_secondary // 39))
    nlist = min(nlist, n_secondary)
    return nlist, min(nlist, nprobe)


#: Rounds of majority voting that refine a binary IVF's sampled centres.
_CENTRE_ROUNDS = 2


def _binary_centres(secondary: npt.NDArray[np.uint8], nlist: int, seed: int, *,
                    workers: int = 1) -> npt.NDArray[np.uint8]:
    """The centres of a binary IVF's cells: ``nlist`` filters sampled (seeded), then
    :data:`_CENTRE_ROUNDS` rounds of k-means in Hamming space, each filter to its nearest
    centre and each centre to its members' bitwise majority (the Hamming median; a centre
    without members keeps its place). faiss trains binary IVF by k-means on the bits as
    floats, which for long filters costs more than the search; two rounds of the Hamming
    median cost a tenth of a second at house scale and make cells compact enough to probe
    less than half as many for the same recall. ``workers``: threads of the searches
    (:func:`~vflink.linkage.binary_ivf.search_in_threads`)."""
    faiss = _faiss()
    nbits = 8 * secondary.shape[1]
    pick = np.random.default_rng(seed).choice(secondary.shape[0], nlist, replace=False)
    centres = secondary[np.sort(pick)].copy()
    bits = np.unpackbits(secondary, axis=1)
    for _ in range(_CENTRE_ROUNDS):
        index = faiss.IndexBinaryFlat(nbits)
        index.add(centres)
        _, nearest = search_in_threads(index, secondary, 1, workers)
        cell = nearest[:, 0]
        order = np.argsort(cell, kind="stable")
        members = np.bincount(cell, minlength=nlist)
        used = np.flatnonzero(members)
        ones = np.empty((len(used), nbits), dtype=np.int32)
        for i, rows in enumerate(np.split(order, np.cumsum(members[used])[:-1])):
            ones[i] = bits[rows].sum(axis=0, dtype=np.int32)
        centres[used] = np.packbits(2 * ones > members[used, None], axis=1)
    return np.ascontiguousarray(centres)


def _flat_rows(flat: Any, rows: npt.NDArray[np.uint8], k: int, workers: int = 1
               ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """faiss's flat binary search of ``rows`` (on ``workers`` threads:
    :func:`~vflink.linkage.binary_ivf.search_in_threads`), each row sorted by (distance,
    index)."""
    d, found = search_in_threads(flat, rows, k, workers)
    # Hamming distances from faiss are exact integers: sort each row by one integer key,
    # distance · 2^32 + index, which orders ties by index (a third of lexsort's time; shifts
    # and masks instead of a division and a remainder by n)
    key = d.astype(np.int64)
    key <<= 32
    key |= found
    key.sort(axis=1)
    dist = key >> 32
    key &= 0xFFFFFFFF
    return dist, key


def search_hamming(primary: Identifiers, secondary: Identifiers, k: int, *,
                   options: SearchOptions | None = None) -> Neighbours:
    """Top-K Hamming neighbours of packed uint8 Bloom filters.

    ``mode="auto"`` searches exactly (faiss's flat binary index) unless the flat search would
    compare more than :data:`AUTO_APPROXIMATE_WORK` bytes; then, as with
    ``mode="approximate"``, a binary IVF whose cells are centred on a seeded sample of the
    secondary filters, refined (:func:`_binary_centres`; faiss trains binary IVF by k-means on
    the bits as floats, which for 1024- to 4096-bit filters costs more than the whole search),
    searched a group of queries at a time (:func:`~vflink.linkage.binary_ivf.ivf_hamming_knn`:
    each query sees at least its ``nprobe`` nearest cells). The recall is measured on as many
    primary rows as :data:`_RECALL_WORK` allows.
    """
    p, s = _as_packed(primary), _as_packed(secondary)
    _check_k(k, s.shape[0])
    n = p.shape[0]
    o = _resolved(options, approximate=n * s.shape[0] * s.shape[1] > AUTO_APPROXIMATE_WORK)
    nbits = 8 * s.shape[1]
    dist = np.empty((n, k), dtype=np.float64)
    idx = np.empty((n, k), dtype=np.int64)
    faiss = _faiss()
    workers = o.threads or cores()
    with _faiss_threads(o.threads):
        flat = faiss.IndexBinaryFlat(nbits)
        # For large K faiss's counting selection (use_heap=False) is exact and measured faster
        # than its heap on 2 cores (0.05 s vs 0.08 s for 7k × 1.4k, K = 100).
        flat.use_heap = k < 32  # type: ignore[attr-defined]  # SWIG attribute
        flat.add(s)
        if o.mode == "approximate":
            nlist, nprobe = _binary_ivf_shape(n, s.shape[0], k, o)
            log.info("binary IVF: %d cells, %d probed per query", nlist, nprobe)
            centres = _binary_centres(s, nlist, o.seed, workers=workers)
            _, _, short = ivf_hamming_knn(p, s, k, centres, nprobe, out=(dist, idx),
                                          workers=workers)
            if short.any():  # cells holding fewer than K filters: the flat index for those
                few = np.flatnonzero(short)
                dist[few], idx[few] = _flat_rows(flat, p[few], k, workers)
        else:
            for start in range(0, n, o.chunk_size):
                checkpoint()  # a served request whose caller gave up stops here
                stop = min(n, start + o.chunk_size)
                dist[start:stop], idx[start:stop] = _flat_rows(flat, p[start:stop], k, workers)
    result = Neighbours(idx, dist, exact=o.mode == "exact")
    if o.mode == "approximate":
        # The reference is faiss's flat binary index: exact (Hamming distances are integers)
        # and far faster than the numpy popcount reference on long filters.
        def exact(primary: Identifiers, secondary: Identifiers, k: int, *,
                  options: SearchOptions | None = None) -> Neighbours:
            with _faiss_threads(o.threads):
                d, _ = search_in_threads(flat, np.ascontiguousarray(primary, dtype=np.uint8),
                                         k, workers)
            return Neighbours(np.zeros(d.shape, np.int64), d.astype(np.float64), exact=True)

        rows = min(o.recall_sample, max(1, _RECALL_WORK // max(1, s.shape[0] * s.shape[1])))
        result = _measure_recall(p, s, k, result, exact,
                                 dataclasses.replace(o, recall_sample=rows), _take_rows)
    return result


def brute_hamming(primary: Identifiers, secondary: Identifiers, k: int, *,
                  options: SearchOptions | None = None) -> Neighbours:
    """Reference: XOR + byte popcount table, chunked, row-wise selection."""
    p, s = _as_packed(primary), _as_packed(secondary)
    _check_k(k, s.shape[0])
    return _brute(p.shape[0], s.shape[0], k, lambda r: hamming_distances(p[r], s),
                  2 * s.shape[1] + 16)


# ---------------------------------------------------------------------------------------------
# strings (levenshtein) with rapidfuzz


def _as_strings(x: Identifiers) -> list[str]:
    return [str(v) for v in x]


def _workers(options: SearchOptions) -> int:
    return -1 if options.threads is None else options.threads


def search_levenshtein(primary: Identifiers, secondary: Identifiers, k: int, *,
                       options: SearchOptions | None = None) -> Neighbours:
    """Top-K Levenshtein neighbours of strings.

    ``mode="exact"``: every pair is compared with rapidfuzz's SIMD bit-parallel ``cdist``
    (multi-threaded), chunk by chunk, with small integer dtypes. ``mode="approximate"``:
    candidates are verified in increasing order of a lower bound on their distance (length
    difference, then max(|s|, |t|) − LCS(s, t), :mod:`.blocking`) until the K-th distance found
    is at most the next candidate's bound (:func:`_bounded_levenshtein`), so the distances
    returned equal the exact search's; rows whose bounds would prune too little (measured on a
    sample of the secondary strings) are searched over all pairs. The result is still marked
    ``exact=False`` and its recall is measured on ``options.recall_sample`` rows.
    """
    o = _resolved(options)
    p, s = _as_strings(primary), _as_strings(secondary)
    _check_k(k, len(s))
    n = len(p)
    if o.mode == "exact" or n == 0:
        dist, idx = _exact_levenshtein(p, s, k, o)
        return Neighbours(idx, dist, exact=o.mode == "exact")
    dist, idx, stats = _bounded_levenshtein(p, s, k, o)
    log.info("bound-ordered top-%d search: LCS bounds on %.1f %% of pairs, Levenshtein on "
             "%.2f %%, %d of %d rows searched over all pairs", k, 100.0 * stats["bounded"],
             100.0 * stats["verified"], stats["all_pairs_rows"], n)
    result = Neighbours(idx, dist, exact=False)
    return _measure_recall(p, s, k, result, search_levenshtein_exact_reference(o), o,
                           _take_rows)


def _exact_levenshtein(p: list[str], s: list[str], k: int,
                       o: SearchOptions) -> tuple[FloatArray, IntArray]:
    """Every pair with rapidfuzz's bulk ``cdist``, chunk by chunk, K smallest per row."""
    from rapidfuzz import process
    from rapidfuzz.distance import Levenshtein

    n = len(p)
    dist = np.empty((n, k), dtype=np.float64)
    idx = np.empty((n, k), dtype=np.int64)
    if n == 0:
        return dist, idx
    longest = max(max(map(len, p)), max(map(len, s)))
    # Levenshtein distance ≤ the longer length, so uint8 suffices for strings up to 255 chars.
    dtype = np.uint8 if longest <= 255 else np.int32
    step = min(o.chunk_size, _brute_rows(len(s), np.dtype(dtype).itemsize + 1))
    for start in range(0, n, step):
        checkpoint()  # a served request whose caller gave up stops here
        stop = min(n, start + step)
        m = process.cdist(p[start:stop], s, scorer=Levenshtein.distance, dtype=dtype,
                          workers=_workers(o))
        dist[start:stop], idx[start:stop] = _topk_from_matrix(m, k)
    return dist, idx


def _bounded_levenshtein(p: list[str], s: list[str], k: int,
                         o: SearchOptions) -> tuple[FloatArray, IntArray, dict[str, float]]:
    """Top-K by verifying candidates in increasing order of a Levenshtein lower bound.

    (1) For each primary string, among an evenly spaced sample of the secondary strings the
    ``max(2K, 64)`` with the smallest LCS bound (:mod:`.blocking`) are verified, which bounds
    its K-th distance from above by U. (2) Primary strings sorted by (length, U) are taken in
    chunks of similar length windows. The LCS bounds of a chunk against the secondary strings
    whose length differs by less than ⌈U/2⌉ are computed in one bulk rapidfuzz call, and per
    primary string those with a bound below U are verified in increasing order of the bound, in
    batches, until the K-th verified distance is at most the next candidate's bound; that K-th
    distance is the new, tighter U. (3) The same for the ring of lengths that differ by at least
    ⌈U/2⌉ (the previous step's) and less than the new U; strings whose length differs by U or
    more have a length bound ≥ U. Every string left unverified then has a distance ≥ its bound
    ≥ the K-th distance returned, so the returned distances equal brute force's; only the member
    of a tie at the K-th distance may differ. Splitting the window in (2) and (3) bounds 45 %
    instead of 57 % of the pairs on the benchmark's titles at --scale 1 (a window from the
    true K-th distance would hold about 43 %).
    Returns (distances, indices, statistics): the shares of pairs whose LCS bound (``bounded``)
    and Levenshtein distance (``verified``) were computed, and the rows searched over all
    pairs (``all_pairs_rows``).
    """
    n, n_s = len(p), len(s)
    search = _BoundedSearch(s, n, k, _workers(o))
    p_len = np.fromiter(map(len, p), dtype=np.int64, count=n)
    # bytes per pair: bounds (int16) and LCS (uint8), and the int64 order of the sample
    step = min(o.chunk_size, _brute_rows(search.sample.size, 12))
    for start in range(0, n, step):
        checkpoint()  # a served request whose caller gave up stops here
        search.from_sample(p, p_len, np.arange(start, min(n, start + step)))
    # Rows whose sample says the bounds will not prune enough to pay for verifying one query
    # at a time (short strings of one length over a small alphabet: LCS bounds far below the
    # distances) are searched exactly over all pairs instead.
    hopeless = np.flatnonzero(search.survivors > _ALL_PAIRS_SHARE)
    if hopeless.size:
        search.top_d[hopeless], search.top_i[hopeless] = _exact_levenshtein(
            [p[i] for i in hopeless], s, k, o)
        search.verified += hopeless.size * n_s
    bounded_rows = np.flatnonzero(search.survivors <= _ALL_PAIRS_SHARE)
    # bytes per pair: bounds (int16), LCS (uint8), masks, and distances of dense rows (int32)
    most = min(o.chunk_size, _brute_rows(n_s, 10))
    half = -(-search.top_d[:, -1] // 2)
    lo_c, hi_c = length_window(search.lengths, p_len, half)
    done_lo, done_hi = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    for rows, ranges in _window_chunks(bounded_rows[np.lexsort((half[bounded_rows],
                                                              p_len[bounded_rows]))],
                                       p_len, [(lo_c, hi_c)], most):
        search.verify(p, p_len, rows, ranges)
        done_lo[rows], done_hi[rows] = ranges[0]
    upper = search.top_d[:, -1].copy()
    lo, hi = length_window(search.lengths, p_len, upper)
    ring = [(np.minimum(lo, lo_c), lo_c), (hi_c, np.maximum(hi, hi_c))]
    by_ring = bounded_rows[np.lexsort((upper[bounded_rows], half[bounded_rows],
                                       p_len[bounded_rows]))]
    for rows, ranges in _window_chunks(by_ring, p_len, ring, most):
        search.verify(p, p_len, rows, ranges, done=(done_lo[rows], done_hi[rows]))
    pairs = max(1, n * n_s)
    stats = {"bounded": search.bounded / pairs, "verified": search.verified / pairs,
             "all_pairs_rows": float(hopeless.size)}
    return search.top_d.astype(np.float64), search.top_i, stats


class _BoundedSearch:
    """State of :func:`_bounded_levenshtein`: the secondary strings sorted by length, and each
    primary row's top-K so far (``top_d``, ``top_i``) and sample columns verified in (1)."""

    def __init__(self, s: list[str], n: int, k: int, workers: int) -> None:
        n_s = len(s)
        lengths = np.fromiter(map(len, s), dtype=np.int64, count=n_s)
        self.order = np.argsort(lengths, kind="stable")
        self.lengths = lengths[self.order]
        self.strings = [s[i] for i in self.order]
        self.k, self.workers = k, workers
        n_sample = min(n_s, max(4 * k, min(_BOUND_SAMPLE, max(_MIN_SAMPLE, n_s // 16))))
        self.sample = np.unique(np.linspace(0, n_s - 1, n_sample).round().astype(np.int64))
        self.first = min(self.sample.size, max(2 * k, 64))
        self.verified = 0
        self.bounded = 0
        self.top_d = np.empty((n, k), dtype=np.int64)
        self.top_i = np.empty((n, k), dtype=np.int64)
        self.picked = np.empty((n, self.first), dtype=np.int64)
        self.survivors = np.empty(n, dtype=np.float64)

    def from_sample(self, p: list[str], p_len: IntArray, rows: IntArray) -> None:
        """Step (1) for primary ``rows``: verify their best sample columns by the LCS bound."""
        from rapidfuzz import process
        from rapidfuzz.distance import Levenshtein

        queries = [p[i] for i in rows]
        lb = lcs_lower_bounds(queries, p_len[rows], [self.strings[i] for i in self.sample],
                              self.lengths[self.sample], workers=self.workers)
        # a stable sort of small integers is a radix sort: cheaper than argpartition here
        chosen = self.sample[np.argsort(lb, axis=1, kind="stable")[:, :self.first]]
        d = process.cpdist(np.repeat(np.asarray(queries, dtype=object), self.first).tolist(),
                           [self.strings[i] for i in chosen.ravel()],
                           scorer=Levenshtein.distance, dtype=np.int64,
                           workers=self.workers).reshape(-1, self.first)
        self.verified += d.size
        best = np.lexsort((self.order[chosen], d), axis=1)[:, :self.k]
        self.picked[rows] = chosen
        self.top_d[rows] = np.take_along_axis(d, best, 1)
        self.top_i[rows] = self.order[np.take_along_axis(chosen, best, 1)]
        # share of the sample whose bound is below the K-th distance found
        self.survivors[rows] = (lb < self.top_d[rows, -1:]).mean(axis=1)

    def _bulk(self, queries: list[str], rows: IntArray, dense: IntArray, lo: int, hi: int,
              settled: npt.NDArray[np.bool_]) -> None:
        """Merge the exact top-K of ``rows[dense]`` over positions ``[lo, hi)`` (except
        ``settled`` ones) into their top-K so far."""
        from rapidfuzz import process
        from rapidfuzz.distance import Levenshtein

        d = process.cdist([queries[r] for r in dense], self.strings[lo:hi],
                          scorer=Levenshtein.distance, dtype=np.int32, workers=self.workers)
        self.verified += d.size
        d[settled] = np.iinfo(np.int32).max
        kk = min(self.k, hi - lo)
        part_d, part_c = _topk_from_matrix(d, kk)
        target = rows[dense]
        dd = np.concatenate((self.top_d[target], part_d.astype(np.int64)), axis=1)
        ii = np.concatenate((self.top_i[target], self.order[part_c + lo]), axis=1)
        best = np.lexsort((ii, dd), axis=1)[:, :self.k]
        self.top_d[target] = np.take_along_axis(dd, best, 1)
        self.top_i[target] = np.take_along_axis(ii, best, 1)

    def verify(self, p: list[str], p_len: IntArray, rows: IntArray,
               ranges: list[tuple[int, int]],
               done: tuple[IntArray, IntArray] | None = None) -> None:
        """Verify, per row, the columns in ``ranges`` (sorted positions) whose LCS bound is
        below the row's K-th distance so far, in increasing order of the bound, until the K-th
        distance is at most the next bound. ``done`` (per row, ``[lo, hi)``) are columns an
        earlier call has already settled for the row."""
        from rapidfuzz import process
        from rapidfuzz.distance import Levenshtein

        queries = [p[i] for i in rows]
        q_len = p_len[rows]
        upper = self.top_d[rows, -1]
        chosen = self.picked[rows]
        pieces = []
        for lo, hi in ranges:
            if hi <= lo:
                continue
            lb = lcs_lower_bounds(queries, q_len, self.strings[lo:hi], self.lengths[lo:hi],
                                  workers=self.workers)
            self.bounded += lb.size
            settled = np.iinfo(lb.dtype).max  # no real bound reaches it (see lcs_lower_bounds)
            inside = (chosen >= lo) & (chosen < hi)
            lb[np.nonzero(inside)[0], chosen[inside] - lo] = settled  # verified in (1)
            if done is not None:
                cols = np.arange(lo, hi)
                lb[(cols >= done[0][:, None]) & (cols < done[1][:, None])] = settled
            below = lb < upper[:, None]
            # Where many strings survive, one bulk Levenshtein call over the range is cheaper
            # than verifying them one query at a time (rapidfuzz's SIMD cdist against a
            # single-query cdist: about _SINGLE_COST times less per pair).
            dense = np.flatnonzero(below.sum(axis=1) * _SINGLE_COST > hi - lo)
            if dense.size:
                self._bulk(queries, rows, dense, lo, hi, lb[dense] == settled)
                below[dense] = False
            r_, c_ = np.nonzero(below)
            pieces.append((np.searchsorted(r_, np.arange(rows.size + 1)), c_ + lo, lb[r_, c_]))
        if not pieces:
            return
        for r, q in enumerate(queries):
            cols = np.concatenate([c[ptr[r]:ptr[r + 1]] for ptr, c, _ in pieces])
            lbs = np.concatenate([b[ptr[r]:ptr[r + 1]] for ptr, _, b in pieces])
            sort = np.argsort(lbs, kind="stable")
            cols, lbs = cols[sort], lbs[sort]
            row = rows[r]
            kd, ki = self.top_d[row], self.top_i[row]
            kth, at, batch = int(kd[-1]), 0, _VERIFY_BATCH
            while at < cols.size and lbs[at] < kth:
                stop = min(at + batch, int(np.searchsorted(lbs, kth, side="left")))
                cand = cols[at:stop]
                # distances above the K-th so far cannot enter: rapidfuzz may stop early
                d = process.cdist([q], [self.strings[i] for i in cand],
                                  scorer=Levenshtein.distance, dtype=np.int64, workers=1,
                                  score_cutoff=kth)[0]
                self.verified += cand.size
                keep = d <= kth
                if keep.any():
                    dd = np.concatenate((kd, d[keep]))
                    ii = np.concatenate((ki, self.order[cand[keep]]))
                    best = np.lexsort((ii, dd))[:self.k]
                    kd, ki = dd[best], ii[best]
                    kth = int(kd[-1])
                at, batch = stop, 2 * batch
            self.top_d[row], self.top_i[row] = kd, ki


def _simd_lanes(length: int) -> int:
    """Strings of this length rapidfuzz compares at once in a bulk call (256-bit vectors of
    8-, 16-, 32- or 64-bit words; longer strings one at a time)."""
    for lanes, longest in ((32, 8), (16, 16), (8, 32), (4, 64)):
        if length <= longest:
            return lanes
    return 1


def _window_chunks(rows: IntArray, lengths: IntArray,
                   intervals: list[tuple[IntArray, IntArray]],
                   most: int) -> Iterator[tuple[IntArray, list[tuple[int, int]]]]:
    """Consecutive runs of ``rows`` whose intervals of sorted secondary positions are bounded
    together, as ``(rows, [(lo, hi) per interval])``.

    ``intervals`` holds, per interval, the ``lo`` and ``hi`` of every primary row. A run
    bounds the hull of its rows' intervals in one bulk call, whose cost is the hull's size
    times the number of SIMD groups of its rows (:func:`_simd_lanes`, measured: a bulk LCS call
    costs the same for 1 to 8 strings of 17-32 characters). A row joins the run before it
    when that adds no more than the row's own intervals would cost alone, and a run has at
    most ``most`` rows.
    """
    los = [lo[rows].tolist() for lo, _ in intervals]
    his = [hi[rows].tolist() for _, hi in intervals]
    row_len = lengths[rows].tolist()
    start = 0
    while start < rows.size:
        hull = [(lo[start], hi[start]) for lo, hi in zip(los, his)]
        longest = row_len[start]
        cost = sum(max(0, b - a) for a, b in hull)
        stop = start + 1
        while stop < rows.size and stop - start < most:
            grown, own = [], 0
            for (h_lo, h_hi), lo, hi in zip(hull, los, his):
                a, b = lo[stop], hi[stop]
                own += max(0, b - a)
                if b <= a:  # empty: does not widen the hull
                    grown.append((h_lo, h_hi))
                elif h_hi <= h_lo:
                    grown.append((a, b))
                else:
                    grown.append((min(h_lo, a), max(h_hi, b)))
            wider = max(longest, row_len[stop])
            new_cost = (-(-(stop + 1 - start) // _simd_lanes(wider))
                        * sum(max(0, b - a) for a, b in grown))
            if new_cost - cost > own:
                break
            hull, longest, cost, stop = grown, wider, new_cost, stop + 1
        yield rows[start:stop], hull
        start = stop


def search_levenshtein_exact_reference(options: SearchOptions) -> SearchFn:
    """The exact search used to measure the recall of blocking (same threads as the search)."""
    exact = SearchOptions(mode="exact", threads=options.threads)

    def run(primary: Identifiers, secondary: Identifiers, k: int, *,
            options: SearchOptions | None = None) -> Neighbours:
        return search_levenshtein(primary, secondary, k, options=exact)
    return run


def brute_levenshtein(primary: Identifiers, secondary: Identifiers, k: int, *,
                      options: SearchOptions | None = None) -> Neighbours:
    """Reference: single-threaded full distance matrices (float64), chunked, row-wise selection."""
    p, s = _as_strings(primary), _as_strings(secondary)
    _check_k(k, len(s))
    return _brute(len(p), len(s), k, lambda r: levenshtein_distances(p[r], s), 8 + 1)


# ---------------------------------------------------------------------------------------------
# registry


@dataclass(frozen=True)
class Metric:
    """A distance with its accelerated search and brute-force reference.

    ``integer`` marks metrics whose distances are integers — the setting of FedSim's Theorem 2,
    whose proof rounds the attacker's predicted distance to the nearest integer (App. A.2,
    Eq. 10).
    """

    name: str
    kind: Literal["vector", "latlon", "binary", "string"]
    search: SearchFn
    brute: SearchFn
    integer: bool
    unit: str


METRICS: Registry[Metric] = Registry("metric")
METRICS.add("euclidean", Metric("euclidean", "vector", search_euclidean, brute_euclidean,
                                False, "identifier units"))
METRICS.add("haversine", Metric("haversine", "latlon", search_haversine, brute_haversine,
                                False, "km"))
METRICS.add("hamming", Metric("hamming", "binary", search_hamming, brute_hamming, True, "bits"))
METRICS.add("levenshtein", Metric("levenshtein", "string", search_levenshtein,
                                  brute_levenshtein, True, "edits"))
