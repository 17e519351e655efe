"""Top-K Hamming search over a binary IVF, a group of queries at a time.

What is searched is what faiss's ``IndexBinaryIVF`` searches with the same cells and
``nprobe``: each primary filter is compared with every secondary filter of the ``nprobe`` cells
whose centres are nearest to it. Hand-written around faiss's pairwise ``hammings`` rather
than one call to the IVF's ``search`` because that search keeps a heap of K per query and
pushes most of its ~540 candidates through it: at FedSim's house scale (141,050 × 27,827
1024-bit filters, K = 100, 8 of 431 cells probed) 4.4 s of CPU, of which K = 1 costs 1.5 s.
Here:

- identical primary filters (FEDERAL numeric filters of nearby values are identical: 97,206
  distinct of 141,050 at house scale) are searched once;
- the distinct queries, ordered by the cells they probe (9,763 distinct sets of 8 at house
  scale), are cut into pieces of 64, each compared in one pairwise call with the members of
  every cell one of its queries probes (about 1,150 filters against a query's own 540: one
  call per exact probe set, 9,763 calls, spent more in Python than the union costs);
- each query's candidates are ranked by one sort of 32-bit keys, distance · 2^b + the
  candidate's position, positions in secondary-index order (a row longer than numpy's
  sorting network, 512 such keys, in pieces: :func:`~vflink.linkage.grouped.smallest`):
  rows come out ordered by (distance, secondary index), ties at the K-th distance to the
  lower index (faiss's heap leaves that choice to its own order).

The distances are faiss's (exact integers). Each query's row is the exact top-K of a superset
of its own cells' members, so it is never worse than the IVF's and equals the brute force when
every cell is probed (``tests/unit/linkage/test_binary_ivf.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from vflink._threads import in_pieces
from vflink.linkage.grouped import map_jobs, smallest

__all__ = ["assign", "ivf_hamming_knn", "search_in_threads"]

IntArray = npt.NDArray[np.int64]
Codes = npt.NDArray[np.uint8]

#: Queries of one group compared with its candidates in one call at most (a larger group is
#: cut into pieces of this many, which share the candidates' gathered codes).
GROUP = 64


def _faiss() -> Any:
    import faiss

    return faiss


#: Rows per thread at least for :func:`search_in_threads` to cut a search among threads.
_THREAD_ROWS = 2048


def search_in_threads(index: Any, codes: Codes, k: int, workers: int
                      ) -> tuple[npt.NDArray[Any], IntArray]:
    """``index.search(codes, k)`` (a faiss index) with the rows cut into ``workers`` slices,
    each searched by a thread of its own on one OpenMP thread (faiss releases the GIL).

    faiss parallelises a binary index's search over many short OpenMP regions, whose threads
    sleep between them where OMP_WAIT_POLICY is PASSIVE (as vflink's commands set it, see
    :mod:`vflink.cli.main`): 97,000 1024-bit filters' 8 nearest of 431 centres took 0.57-0.63 s
    on two OpenMP threads, 0.26 s on one, and 0.14 s as two slices on one OpenMP thread each
    (2 cores, measured); the results are the same (each row is searched alone)."""
    n = codes.shape[0]
    workers = max(1, min(workers, n // _THREAD_ROWS))
    if workers == 1:
        d, i = index.search(codes, k)
        return d, np.asarray(i, dtype=np.int64)
    faiss = _faiss()

    def run(rows: slice) -> Any:
        # this thread's own OpenMP setting, put back after (the first slice runs on the
        # caller's thread, the others on the process's pool threads)
        before = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)
        try:
            return index.search(codes[rows], k)
        finally:
            faiss.omp_set_num_threads(before)

    found = in_pieces(run, n, workers)
    return (np.concatenate([f[0] for f in found]),
            np.concatenate([np.asarray(f[1], dtype=np.int64) for f in found]))


def assign(codes: Codes, centres: Codes, nprobe: int, *, workers: int = 1) -> IntArray:
    """Each row of ``codes``' ``nprobe`` nearest ``centres`` (faiss's flat binary index, as the
    IVF's quantizer), each row's cells sorted (``workers``: :func:`search_in_threads`)."""
    faiss = _faiss()
    quantizer = faiss.IndexBinaryFlat(8 * centres.shape[1])
    quantizer.add(centres)
    _, cells = search_in_threads(quantizer, codes, nprobe, workers)
    cells.sort(axis=1)
    return cells


def _unique_rows(codes: Codes) -> tuple[IntArray, IntArray]:
    """(first row of each distinct code, in the rows' order; each row's distinct code).

    The rows are told apart by a 64-bit hash of their words first (a sort of integers: a
    sixth of the time numpy's ``unique`` takes to sort 141,050 rows of 128 bytes as byte
    strings), and every row is then compared with the first row of its hash: only where two
    different rows share a hash are the rows themselves sorted."""
    codes = np.ascontiguousarray(codes)
    n, width = codes.shape
    if n and width and width % 8 == 0:
        words = codes.view(np.uint64)
        h = words[:, 0] * np.uint64(0x9E3779B97F4A7C15)
        for j in range(1, words.shape[1]):
            h ^= h >> np.uint64(29)
            h += words[:, j]
            h *= np.uint64(0xBF58476D1CE4E5B9)
        _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        if np.array_equal(codes[first[inverse]], codes):
            return _by_first(first, inverse)
    view = codes.view(np.dtype((np.void, width)))[:, 0]
    _, first, inverse = np.unique(view, return_index=True, return_inverse=True)
    return _by_first(first, inverse.reshape(-1))


def _by_first(first: npt.NDArray[Any], inverse: npt.NDArray[Any]) -> tuple[IntArray, IntArray]:
    """The distinct codes renumbered in the order of their first rows (the same numbering
    whichever way they were told apart)."""
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return first[order].astype(np.int64), rank[inverse].astype(np.int64)


def ivf_hamming_knn(query: Codes, base: Codes, k: int, centres: Codes, nprobe: int, *,
                    workers: int = 1, out: tuple[npt.NDArray[Any], IntArray] | None = None
                    ) -> tuple[npt.NDArray[Any], IntArray, npt.NDArray[np.bool_]]:
    """The K nearest rows of ``base`` among (at least) the members of each query's ``nprobe``
    nearest cells (cells: ``base``'s rows by their nearest of ``centres``).

    Distinct queries are ordered by their probed cells (so that neighbours in that order probe
    nearly the same cells) and cut into pieces of :data:`GROUP`; a piece is compared with the
    members of every cell any of its queries probes, so each query sees its own cells and
    perhaps a few more (never fewer: its recall is at least the IVF's).

    Returns ``(distances, indices, short)``: ``(n, k)`` each (into ``out`` when given), rows
    sorted by (distance, index), and which queries' pieces hold fewer than K filters (their
    rows are left unset for the caller to search otherwise). ``workers`` threads share the
    pieces (faiss's pairwise distances and numpy's sorts release the GIL)."""
    query = np.ascontiguousarray(query, dtype=np.uint8)
    base = np.ascontiguousarray(base, dtype=np.uint8)
    n, nbytes = query.shape
    dist, idx = out if out is not None else (np.empty((n, k), dtype=np.int64),
                                             np.empty((n, k), dtype=np.int64))
    if n == 0:
        return dist, idx, np.zeros(0, dtype=bool)
    nlist = centres.shape[0]
    first, inverse = _unique_rows(query)
    # every query distinct: searched in their own order, no copy of them or of the result
    alone = len(first) == n
    uq = query if alone else query[first]
    cells = assign(uq, centres, nprobe, workers=workers)
    # the secondary's members of each cell, in index order within the cell
    home = assign(base, centres, 1, workers=workers)[:, 0]
    members = np.argsort(home, kind="stable")
    starts = np.concatenate(([0], np.cumsum(np.bincount(home, minlength=nlist))))
    # distinct queries in the lexicographic order of their (sorted) probed cells
    order = np.lexsort(cells.T[::-1])
    pieces = [order[at:at + GROUP] for at in range(0, len(order), GROUP)]
    d_bits = (8 * nbytes).bit_length()
    faiss = _faiss()
    u_short = np.zeros(len(uq), dtype=bool)
    # each distinct query's rows (its copies), so that a piece writes every copy's row while
    # its K nearest are in the cache: no n × K pass that copies them out afterwards
    copies = np.argsort(inverse, kind="stable") if not alone else None
    counts = np.bincount(inverse, minlength=len(uq)) if not alone else None
    begins = np.concatenate(([0], np.cumsum(counts)[:-1])) if counts is not None else None

    def run(rows: IntArray) -> None:
        probed = np.flatnonzero(np.bincount(cells[rows].reshape(-1), minlength=nlist))
        cand = np.concatenate([members[starts[c]:starts[c + 1]] for c in probed])
        w = len(cand)
        if w < k:
            u_short[rows] = True
            return
        cand.sort()
        codes = np.ascontiguousarray(base[cand])
        q = np.ascontiguousarray(uq[rows])
        d = np.empty((len(rows), w), dtype=np.int32)
        faiss.hammings(faiss.swig_ptr(q), faiss.swig_ptr(codes), len(rows), w, nbytes,
                       faiss.swig_ptr(d))
        # 32-bit keys while distance and position fit (a sort of half the bytes), else 64
        p_bits = 32 - d_bits if w <= 1 << (32 - d_bits) else 32
        kind = np.uint32 if p_bits < 32 else np.uint64
        key: npt.NDArray[Any] = d.view(np.uint32) if kind is np.uint32 else d.astype(np.uint64)
        key <<= kind(p_bits)
        key |= np.arange(w, dtype=kind)
        low, shift = kind((1 << p_bits) - 1), kind(p_bits)
        key = smallest(key, k)  # sorted in pieces a sorting network takes, when long
        got_d, got_i = key >> shift, cand[(key & low).astype(np.intp)]
        if copies is None or counts is None or begins is None:
            dist[rows], idx[rows] = got_d, got_i
            return
        many = counts[rows]
        first_of = np.repeat(np.cumsum(many) - many, many)
        at = copies[np.repeat(begins[rows], many) + np.arange(int(many.sum())) - first_of]
        which = np.repeat(np.arange(len(rows)), many)
        dist[at], idx[at] = got_d[which], got_i[which]

    map_jobs(run, pieces, workers)
    return dist, idx, u_short if alone else u_short[inverse]
