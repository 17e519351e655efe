"""Soft linkage of tables larger than memory: read in batches, searched in chunk tasks, links
written part by part (docs/how-to/scale-out.md).

:func:`link_streamed` links numeric identifiers (``euclidean``, ``haversine``; raw values,
privacy off, as ``vflink link --privacy off``) of two files without ever holding either
table, or the links, in one process:

1. the primary is read in batches of ``chunk_rows`` rows (:func:`vflink.data.batches.scan_frame`,
   each batch checked: numbers, finite, not empty); a few chunks at a time (two per worker)
   are handed to the engine;
2. each task (:func:`search_chunk_against_file`) scans the secondary file in partitions of
   ``partition_rows`` rows, runs the metric's exact search of its chunk against each
   partition and keeps a running top-K with :func:`~vflink.linkage.chunked.merge_topk`
   (exact, see there); its memory is one chunk, one partition and the search's index over it
   (a k-d tree in 2-D: the metric's ``dense_index="auto"``), whatever the tables' sizes;
3. the driver writes each chunk's raw top-K to a scratch part and accumulates the count, mean
   and squared deviations of the distances (Chan et al.'s pairwise update), which give
   FedSim Eq. 1's μ0 and σ0 over all n × K distances;
4. a second pass over the scratch parts writes the links (the columns of ``vflink link``:
   ``primary_index``, ``secondary_index``, ``rank``, ``distance``, ``similarity``) as a
   partitioned Parquet dataset (:class:`vflink.data.parts.PartitionedWriter`, atomic), the
   similarities normalised (Eq. 1) and noised (Eq. 2) part by part; the noise is drawn in row
   order from one generator, so it equals one draw over all the links.

The links equal :func:`vflink.linkage.link`'s on the same tables (ties aside, μ0 and σ0 to
rounding): ``tests/unit/linkage/test_linkage_streamed.py``. The tasks read the secondary file
themselves: on a Ray cluster of several nodes it must sit on storage every node reads (a shared
file system, or a copy at the same path). This module does file I/O, never I/O to peers.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from vflink.data.batches import DEFAULT_BATCH_ROWS, scan_frame
from vflink.data.parts import PartitionedWriter
from vflink.data.table import bad_cells
from vflink.errors import ConfigError, DataError
from vflink.linkage.chunked import merge_topk
from vflink.linkage.privacy import dp_epsilon, sigma_for_tau, tau_for_sigma
from vflink.linkage.search import METRICS, SearchOptions
from vflink.randomness import secret_generator
from vflink.types import Compute

__all__ = ["STREAM_METRICS", "link_streamed", "search_chunk_against_file",
           "search_chunk_against_parts"]

log = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: Metrics of numeric identifiers that :func:`link_streamed` links.
STREAM_METRICS = ("euclidean", "haversine")


def _values(path: Path | str, columns: Sequence[str], batch_rows: int
            ) -> Iterator[tuple[int, FloatArray]]:
    """(first row, values) of the identifier columns in batches, each checked: a cell that is
    missing, not a number or infinite is a :class:`DataError` naming the file, column, row."""
    import pandas as pd

    for batch in scan_frame(path, columns=columns, numeric_columns=columns,
                            batch_rows=batch_rows):
        problems = []
        block = np.empty((len(batch), len(columns)), dtype=np.float64)
        for j, col in enumerate(columns):
            values = batch.frame[col]
            arr = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64,
                                                                   na_value=np.nan)
            bad = ~np.isfinite(arr)
            if bad.any():
                problems.append(f"column {col!r} needs a finite number in every row (batch "
                                f"{batch.number}), "
                                f"{bad_cells(batch.frame, bad, col, offset=batch.offset)}")
            block[:, j] = arr
        if problems:
            raise DataError(f"{path}: " + "; ".join(problems),
                            [f"{path}: {p}" for p in problems])
        yield batch.offset, block


def search_chunk_against_file(shared: tuple[str, tuple[str, ...], str, int, SearchOptions, int],
                              chunk: FloatArray) -> tuple[FloatArray, IntArray]:
    """One task: the exact top-K of ``chunk`` (primary rows) over the whole secondary file,
    scanned partition by partition with a running :func:`merge_topk`. Module-level (an
    engine pickles it)."""
    path, columns, metric, k, options, partition_rows = shared
    search = METRICS.get(metric).search
    best: tuple[FloatArray, IntArray] | None = None
    for offset, part in _values(path, columns, partition_rows):
        found = search(chunk, part, min(k, len(part)), options=options)
        partial = (found.distances, found.indices + offset)
        if best is None:
            best = partial
        else:
            best = merge_topk([best, partial], min(k, best[0].shape[1] + partial[0].shape[1]))
    if best is None:
        raise DataError(f"{path}: the secondary table is empty")
    return best


def search_chunk_against_parts(
        shared: tuple[str, tuple[tuple[int, str], ...], int, SearchOptions],
        chunk: Any) -> tuple[FloatArray, IntArray]:
    """One task of the streamed ``vflink link``: the exact top-K of ``chunk`` (a
    primary chunk's encodings) over the secondary's encodings, spilled as ``.npy`` partitions
    ``(first row, path)`` in the coordinator's scratch directory, with a running
    :func:`merge_topk`. Equal, row by row, to one search over the whole secondary ordered by
    (distance, index). Module-level (an engine pickles it)."""
    metric, partitions, k, options = shared
    search = METRICS.get(metric).search
    best: tuple[FloatArray, IntArray] | None = None
    for offset, path in partitions:
        part = np.load(path, allow_pickle=False)
        found = search(chunk, part, min(k, len(part)), options=options)
        partial = (found.distances, found.indices + offset)
        best = partial if best is None else merge_topk(
            [best, partial], min(k, best[0].shape[1] + partial[0].shape[1]))
    if best is None:
        raise DataError("the secondary table is empty")
    return best


def _merge_stats(stats: tuple[int, float, float], d: FloatArray) -> tuple[int, float, float]:
    """(count, mean, M2) of the distances so far, updated with ``d`` (Chan et al. 1979)."""
    n_a, mean_a, m2_a = stats
    n_b = d.size
    if n_b == 0:
        return stats
    mean_b = float(d.mean())
    m2_b = float(((d - mean_b) ** 2).sum())
    n = n_a + n_b
    delta = mean_b - mean_a
    return n, mean_a + delta * n_b / n, m2_a + m2_b + delta * delta * n_a * n_b / n


def link_streamed(primary: Path | str, secondary: Path | str, *, on: Sequence[str],
                  out: Path | str, top_k: int, metric: str = "euclidean",
                  secondary_on: Sequence[str] | None = None, compute: Compute | None = None,
                  chunk_rows: int = DEFAULT_BATCH_ROWS, partition_rows: int | None = None,
                  sigma: float | None = None, tau: float | None = None, delta: float = 1e-5,
                  seed: int | None = None, options: SearchOptions | None = None,
                  progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Link every primary record to its ``top_k`` nearest secondary records, streamed (see
    the module docstring); the links go to ``out`` as a partitioned Parquet dataset. Returns
    the summary (sizes, μ0, σ0, σ, τ, ε, parts)."""
    if metric not in STREAM_METRICS:
        raise ConfigError(f"`metric` must be one of {', '.join(STREAM_METRICS)} for a streamed "
                          f"link, got {metric!r}")
    if not isinstance(top_k, int) or top_k < 1:
        raise ConfigError(f"`top_k` must be an int ≥ 1, got {top_k!r}")
    if sigma is not None and tau is not None:
        raise ConfigError("give at most one of `tau` and `sigma`")
    on = tuple(on)
    s_on = tuple(secondary_on or on)
    partition_rows = partition_rows or chunk_rows
    o = options or SearchOptions()
    task_options = dataclasses.replace(o, mode="exact",
                                       threads=1 if o.threads is None else o.threads)
    shared = (str(secondary), s_on, metric, top_k, task_options, partition_rows)
    window = 2 * (compute.workers if compute is not None else 1)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".raw", dir=out.parent))
    stats: tuple[int, float, float] = (0, 0.0, 0.0)
    parts: list[Path] = []
    n_primary = 0
    width = top_k
    try:
        def flush(offsets: list[int], chunks: list[FloatArray]) -> None:
            nonlocal stats, n_primary, width
            if compute is None:
                results = [search_chunk_against_file(shared, c) for c in chunks]
            else:
                results = compute.map(search_chunk_against_file, chunks, shared=shared)
            for offset, chunk, (dist, idx) in zip(offsets, chunks, results, strict=True):
                path = scratch / f"{len(parts):06d}.npz"
                np.savez(path, offset=offset, distances=dist, indices=idx)
                parts.append(path)
                stats = _merge_stats(stats, dist)
                n_primary = max(n_primary, offset + len(chunk))
                width = dist.shape[1]
                if progress is not None:
                    progress(len(chunk))

        offsets: list[int] = []
        chunks: list[FloatArray] = []
        for offset, values in _values(primary, on, chunk_rows):
            offsets.append(offset)
            chunks.append(values)
            if len(chunks) >= window:
                flush(offsets, chunks)
                offsets, chunks = [], []
        if chunks:
            flush(offsets, chunks)
        if not parts:
            raise DataError(f"{primary}: the primary table is empty")
        if width < top_k:
            raise DataError(f"{secondary}: {width} rows, fewer than top_k = {top_k}")
        count, mean, m2 = stats
        mu0, sigma0 = -mean, math.sqrt(m2 / count)
        noise = (sigma_for_tau(tau, sigma0) if tau is not None else
                 0.0 if sigma is None else float(sigma))
        # the Eq. 2 noise: secret unless a seed asks for reproducible noise (vflink.randomness)
        rng = secret_generator() if seed is None else np.random.default_rng(seed)
        with PartitionedWriter(out, meta={"metric": metric, "top_k": top_k}) as writer:
            for path in parts:
                with np.load(path) as raw:
                    offset = int(raw["offset"])
                    dist, idx = raw["distances"], raw["indices"]
                n, k = dist.shape
                if sigma0 > 0.0:
                    sim = (-dist - mu0) / sigma0
                else:
                    sim = np.zeros_like(dist)
                if noise > 0.0:  # Eq. 2, in row order from one generator (= one draw)
                    sim = sim + rng.normal(0.0, noise, size=sim.shape)
                writer.write({
                    "primary_index": np.repeat(np.arange(offset, offset + n, dtype=np.int64), k),
                    "secondary_index": idx.astype(np.int64).reshape(-1),
                    "rank": np.tile(np.arange(k, dtype=np.int64), n),
                    "distance": dist.astype(np.float64).reshape(-1),
                    "similarity": sim.astype(np.float64).reshape(-1)})
            n_parts = writer.parts
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"primary_rows": n_primary, "top_k": top_k, "metric": metric, "mu0": mu0,
            "sigma0": sigma0, "sigma": noise, "tau": tau_for_sigma(noise, sigma0),
            "epsilon": dp_epsilon(noise, n_primary, mu0, sigma0), "delta": delta,
            "parts": n_parts, "links": count, "chunk_rows": chunk_rows,
            "partition_rows": partition_rows}
