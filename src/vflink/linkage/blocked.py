"""Blocked top-K search: blocking keys partition the work, skewed blocks split by comparison
count, partial top-Ks merged exactly (docs/how-to/scale-out.md).

With a blocking key (a postcode, a region, a year of birth), a primary record is compared only
with the secondary records of its own block, so the search is many small searches instead of
one n × m search. Real keys are skewed (one postcode holds a city): a block is a task of
``|P_b| × |S_b|`` comparisons, and one giant block would make one giant task that holds up the
run and bounds its memory by the block's size. The lesson of anonlink-entity-service (work
packages capped by comparison count) and Splink (blocking rules sized by the comparisons they
generate) is applied here:

* every block becomes *pieces* of at most ``max_comparisons`` comparisons: a grid of primary
  chunks × secondary partitions, the partitions as large as the cap allows (the whole
  secondary side of the block when it fits, else ``max_comparisons`` rows against one
  primary row) and the chunks as large as the partitions leave room for
  (:func:`plan_blocks`);
* small pieces are packed into *work packages* of up to ``max_comparisons`` comparisons (a
  task per tiny block would cost more to schedule than to run);
* each piece's search is the metric's own exact search on the piece's rows; a block's pieces
  over the same primary rows are merged with :func:`~vflink.linkage.chunked.merge_topk`,
  which is exact for the reason given there (each member of the block's top-K is among its
  partition's top-K).

The result equals a brute-force search restricted to same-block pairs (the oracle in
``tests/unit/linkage/test_linkage_blocked.py``), ties aside as for the chunked search. A
primary record whose block has fewer than K secondary records (or none, or a missing key) keeps
index −1 and distance NaN in the places left, as :func:`~vflink.linkage.fields.search_fields`
does with blocking.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from vflink.errors import LinkageError
from vflink.linkage.chunked import merge_topk
from vflink.linkage.search import METRICS, Identifiers, Neighbours, SearchOptions, _take_rows
from vflink.types import Compute

__all__ = ["DEFAULT_MAX_COMPARISONS", "Piece", "plan_blocks", "search_blocked",
           "search_package"]

log = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: Comparisons per work package: 10^6 × 10^2 keeps a task's distance work near a tenth of a
#: second for 2-D vectors and its temporaries in tens of megabytes.
DEFAULT_MAX_COMPARISONS = 100_000_000


@dataclass(frozen=True)
class Piece:
    """Primary rows × secondary rows of one block (sorted global row positions); ``group``
    numbers the (block, primary chunk) whose pieces are merged together."""

    group: int
    primary: IntArray
    secondary: IntArray

    @property
    def comparisons(self) -> int:
        return int(len(self.primary)) * int(len(self.secondary))


def _codes(primary_keys: Any, secondary_keys: Any) -> tuple[IntArray, IntArray]:
    """Shared integer codes of both sides' keys; −1 for a missing or empty key (it blocks
    nothing together)."""
    import pandas as pd

    p = pd.Series(np.asarray(primary_keys, dtype=object))
    s = pd.Series(np.asarray(secondary_keys, dtype=object))
    both = pd.concat([p, s], ignore_index=True)
    both = both.where(~both.isin([""]), None)
    codes, _ = pd.factorize(both, use_na_sentinel=True)
    codes = codes.astype(np.int64)
    return codes[:len(p)], codes[len(p):]


def plan_blocks(primary_keys: Any, secondary_keys: Any, *,
                max_comparisons: int = DEFAULT_MAX_COMPARISONS) -> list[list[Piece]]:
    """Work packages: lists of pieces, each package at most ``max_comparisons`` comparisons
    except a lone piece of one primary row × ``max_comparisons`` secondary rows (a piece is
    never below one primary row)."""
    if not isinstance(max_comparisons, int) or max_comparisons < 1:
        raise LinkageError(f"`max_comparisons` must be an int ≥ 1, got {max_comparisons!r}")
    cp, cs = _codes(primary_keys, secondary_keys)
    order_p = np.argsort(cp, kind="stable")
    order_s = np.argsort(cs, kind="stable")
    n_codes = int(max(cp.max(initial=-1), cs.max(initial=-1))) + 1
    # counts per code; code −1 (missing) sorts first and is skipped
    bp = np.searchsorted(cp[order_p], np.arange(-1, n_codes + 1))
    bs = np.searchsorted(cs[order_s], np.arange(-1, n_codes + 1))
    pieces: list[Piece] = []
    group = 0
    # blocks largest first: the big tasks start early and small ones fill the gaps
    sizes = [(int(bp[c + 2] - bp[c + 1]) * int(bs[c + 2] - bs[c + 1]), c)
             for c in range(n_codes)]
    for size, c in sorted(sizes, key=lambda t: (-t[0], t[1])):
        if size == 0:
            continue
        rows_p = order_p[bp[c + 1]:bp[c + 2]].astype(np.int64)
        rows_s = order_s[bs[c + 1]:bs[c + 2]].astype(np.int64)
        s_size = min(len(rows_s), max_comparisons)
        p_size = max(1, max_comparisons // s_size)
        for p0 in range(0, len(rows_p), p_size):
            chunk = rows_p[p0:p0 + p_size]
            for s0 in range(0, len(rows_s), s_size):
                pieces.append(Piece(group, chunk, rows_s[s0:s0 + s_size]))
            group += 1
    packages: list[list[Piece]] = []
    current: list[Piece] = []
    load = 0
    for piece in pieces:
        if current and load + piece.comparisons > max_comparisons:
            packages.append(current)
            current, load = [], 0
        current.append(piece)
        load += piece.comparisons
    if current:
        packages.append(current)
    return packages


def search_package(shared: tuple[str, Identifiers, Identifiers, int, SearchOptions],
                   package: Sequence[Piece]) -> list[tuple[int, FloatArray, IntArray]]:
    """One task: each piece's exact top-K (global secondary indices), as ``(group, distances,
    indices)``. A module-level function (an engine pickles it)."""
    metric, primary, secondary, k, options = shared
    search = METRICS.get(metric).search
    out = []
    for piece in package:
        found = search(_take_rows(primary, piece.primary), _take_rows(secondary, piece.secondary),
                       min(k, len(piece.secondary)), options=options)
        out.append((piece.group, found.distances, piece.secondary[found.indices]))
    return out


def _pad(dist: FloatArray, idx: IntArray, k: int) -> tuple[FloatArray, IntArray]:
    if dist.shape[1] >= k:
        return dist, idx
    n, w = dist.shape
    return (np.concatenate([dist, np.full((n, k - w), np.inf)], axis=1),
            np.concatenate([idx, np.full((n, k - w), np.iinfo(np.int64).max)], axis=1))


def search_blocked(metric: str, primary: Identifiers, secondary: Identifiers, k: int, *,
                   primary_keys: Any, secondary_keys: Any, compute: Compute | None = None,
                   max_comparisons: int = DEFAULT_MAX_COMPARISONS,
                   options: SearchOptions | None = None,
                   progress: Callable[[int], None] | None = None) -> Neighbours:
    """Top-K of every primary record among the secondary records of its block (see the module
    docstring); work packages mapped on ``compute`` (``None``: in this process)."""
    if len(primary_keys) != len(primary) or len(secondary_keys) != len(secondary):
        raise LinkageError(f"blocking keys: {len(primary_keys)} primary and "
                           f"{len(secondary_keys)} secondary keys for {len(primary)} and "
                           f"{len(secondary)} records")
    if not isinstance(k, int) or k < 1:
        raise LinkageError(f"`top_k` must be an int ≥ 1, got {k!r}")
    packages = plan_blocks(primary_keys, secondary_keys, max_comparisons=max_comparisons)
    # each piece exactly, one thread per task (the engine runs one task per CPU)
    o = options or SearchOptions()
    piece_options = dataclasses.replace(o, mode="exact",
                                        threads=1 if o.threads is None else o.threads)
    shared = (metric, primary, secondary, k, piece_options)
    log.info("blocked top-%d %s search: %d work packages of at most %d comparisons", k,
             metric, len(packages), max_comparisons)
    if compute is None:
        results = [search_package(shared, p) for p in packages]
    else:
        results = compute.map(search_package, packages, shared=shared)
    rows: dict[int, IntArray] = {}
    for package in packages:
        for piece in package:
            rows.setdefault(piece.group, piece.primary)
    partial: dict[int, list[tuple[FloatArray, IntArray]]] = {}
    for result in results:
        for group, dist, idx in result:
            partial.setdefault(group, []).append(_pad(dist, idx, k))
    n = len(primary)
    dist_out = np.full((n, k), np.nan)
    idx_out = np.full((n, k), -1, dtype=np.int64)
    for group, parts in partial.items():
        d, i = merge_topk(parts, k) if len(parts) > 1 else parts[0]
        d, i = d[:, :k], i[:, :k]
        missing = ~np.isfinite(d)
        d = np.where(missing, np.nan, d)
        i = np.where(missing, -1, i)
        dist_out[rows[group]] = d
        idx_out[rows[group]] = i
        if progress is not None:
            progress(len(rows[group]))
    return Neighbours(idx_out, dist_out, exact=True)
