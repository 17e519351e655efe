"""The top-K search as chunk tasks: primary chunks × secondary partitions, merged exactly.

The coordinator's search grows with both tables. Here it is cut into tasks that a compute
engine maps (:class:`vflink.types.Compute`): each task searches one chunk of primary
rows against one partition of the secondary rows with the metric's own exact search, and keeps
that partition's K nearest (a *partial* top-K, indices made global); :func:`merge_topk` then
keeps, per primary row, the K smallest by (distance, secondary index) over all partitions.

Why the merge is exact: every row of the global top-K lies in some partition, where it is
also among that partition's K nearest, so the union of the partial top-Ks contains the global
top-K, and sorting it by (distance, index) picks it. The accelerated searches order rows by
(distance, secondary index) too, so the result equals one search over the whole secondary up
to which member of a tie at the K-th distance is kept when faiss's float32 pass decides it
(distances are recomputed in float64 in both paths). anonlink-entity-service caps its work
packages by comparison count the same way: a task costs ``chunk × partition`` comparisons.

Approximate searches (IVF, bound-ordered strings) and ``mode="auto"`` cases that resolve to
them stay one search: splitting the secondary would change the index and the measured recall.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from vflink.errors import LinkageError
from vflink.linkage.search import (
    AUTO_APPROXIMATE_WORK,
    METRICS,
    Identifiers,
    Neighbours,
    SearchOptions,
)
from vflink.types import Compute

__all__ = ["merge_topk", "plan_tasks", "search_chunk", "search_chunked"]

log = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def merge_topk(parts: Sequence[tuple[FloatArray, IntArray]], k: int
               ) -> tuple[FloatArray, IntArray]:
    """Per row, the ``k`` smallest (distance, index) pairs over partial top-K lists.

    Args:
        parts: ``(distances, indices)`` pairs, each ``(n, k_j)`` for the same ``n`` rows, with
            global, distinct indices across parts (each part from its own partition).
        k: how many to keep; at most the total ``sum(k_j)``.

    Returns:
        ``(distances, indices)``, ``(n, k)``, each row sorted by (distance, index).
    """
    if not parts:
        raise LinkageError("merge_topk needs at least one partial top-K")
    dist = np.concatenate([np.asarray(d, dtype=np.float64) for d, _ in parts], axis=1)
    idx = np.concatenate([np.asarray(i, dtype=np.int64) for _, i in parts], axis=1)
    if k < 1 or k > dist.shape[1]:
        raise LinkageError(f"merge_topk: k = {k} must be in 1..{dist.shape[1]} (the partial "
                           "lists' total width)")
    order = np.lexsort((idx, dist), axis=-1)[:, :k]
    return np.take_along_axis(dist, order, 1), np.take_along_axis(idx, order, 1)


def _rows(x: Identifiers, start: int, stop: int) -> Identifiers:
    return x[start:stop] if isinstance(x, np.ndarray) else list(x[start:stop])


def search_chunk(shared: tuple[str, Identifiers, Identifiers, int, SearchOptions],
                 task: tuple[int, int, int, int]) -> tuple[FloatArray, IntArray]:
    """One task: primary rows ``[p0, p1)`` against secondary rows ``[s0, s1)``, exactly.

    A module-level function (an engine pickles it). Returns the partial top-K with global
    secondary indices."""
    metric, primary, secondary, k, options = shared
    p0, p1, s0, s1 = task
    found = METRICS.get(metric).search(_rows(primary, p0, p1), _rows(secondary, s0, s1),
                                       min(k, s1 - s0), options=options)
    return found.distances, found.indices + s0


def plan_tasks(n_primary: int, n_secondary: int, *, chunk_rows: int, workers: int
               ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Primary chunks and secondary partitions: each at most ``chunk_rows`` rows, and, when the
    tables are small, enough tasks that every worker gets about four."""
    def bounds(n: int, size: int) -> list[tuple[int, int]]:
        size = max(1, size)
        return [(i, min(n, i + size)) for i in range(0, n, size)]

    parts = bounds(n_secondary, chunk_rows)
    want = 4 * max(1, workers)
    per_part = max(1, -(-want // len(parts)))
    size = min(chunk_rows, max(256, -(-n_primary // per_part)))
    return bounds(n_primary, size), parts


def _is_exact(metric: str, p: Identifiers, s: Identifiers, options: SearchOptions) -> bool:
    if options.mode == "exact":
        return True
    if options.mode == "approximate":
        return False
    # "auto": exact except for large Hamming searches (search_hamming's own rule, decided on
    # the whole problem, not on a task's share of it)
    if METRICS.get(metric).kind == "binary":
        return bool(len(p) * len(s) * np.asarray(s).shape[1] <= AUTO_APPROXIMATE_WORK)
    return True


def search_chunked(metric: str, primary: Identifiers, secondary: Identifiers, k: int, *,
                   compute: Compute, options: SearchOptions | None = None,
                   progress: Callable[[int], None] | None = None) -> Neighbours:
    """The metric's top-K search as chunk tasks on ``compute`` (see the module docstring).

    Equal to ``METRICS.get(metric).search(primary, secondary, k, options=options)`` ties aside;
    an approximate search runs as that one call."""
    m = METRICS.get(metric)
    o = options or SearchOptions()
    if not _is_exact(metric, primary, secondary, o):
        log.info("approximate %s search: one task (partitioning would change its index)",
                 metric)
        return m.search(primary, secondary, k, options=options)
    n_s = len(secondary)
    if k > n_s:  # the search's own message
        return m.search(primary, secondary, k, options=options)
    chunks, parts = plan_tasks(len(primary), n_s, chunk_rows=max(compute.chunk_rows, k),
                               workers=compute.workers)
    # one thread per task: the engine runs one task per CPU
    task_options = dataclasses.replace(o, mode="exact",
                                       threads=1 if o.threads is None else o.threads)
    tasks = [(p0, p1, s0, s1) for p0, p1 in chunks for s0, s1 in parts]
    log.info("top-%d %s search: %d primary chunks × %d secondary partitions", k, metric,
             len(chunks), len(parts))
    results = compute.map(search_chunk, tasks, shared=(metric, primary, secondary, k, task_options))
    n = len(primary)
    dist = np.empty((n, k), dtype=np.float64)
    idx = np.empty((n, k), dtype=np.int64)
    for c, (p0, p1) in enumerate(chunks):
        partial = results[c * len(parts):(c + 1) * len(parts)]
        dist[p0:p1], idx[p0:p1] = merge_topk(partial, k)
        if progress is not None:
            progress(p1 - p0)
    return Neighbours(idx, dist, exact=True)
