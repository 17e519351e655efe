"""``vflink link`` streamed: memory flat in the tables' size, the same links.

The parties and the boundary are those of :func:`vflink.runner.link.run_linkage`, in this
process: each data party reads its identifier columns in batches of ``chunk_rows`` rows
(:func:`vflink.data.batches.scan_frame`, each batch checked) and encodes them batch by batch
on its engine (:func:`~vflink.linkage.encoding.encode_chunked`: keyed Bloom filters by default,
raw values with privacy off); only the encodings reach the coordinator. The secondary's are
spilled to the coordinator's scratch directory as ``.npy`` partitions; the coordinator maps
each primary chunk over them (:func:`~vflink.linkage.streamed.search_chunk_against_parts`:
primary chunk × secondary partitions, a running exact top-K), keeps the raw top-K in scratch
and sums the distances exactly (:mod:`vflink.linkage.moments`), then a second pass gives σ0
and a third normalises (Eq. 1), draws the noise in row order from the session's generator
(Eq. 2) and writes the links through :class:`~vflink.data.sink.ColumnSink`.

The result is byte for byte the in-memory link's: the same encodings, the same exact top-K
ordered by (distance, index), the same μ0/σ0 bits, the same noise stream, the same file (a
single Parquet file, parts, or CSV, by the same rule). The search is always exact (an IVF over
the whole secondary cannot be streamed; ``search = "auto"`` on Bloom filters would go IVF in
memory above ``AUTO_APPROXIMATE_WORK``, so there the two differ and the streamed one is the
exact one). Figure 4 is drawn from the same rows the in-memory plot samples (all rows up to
50,000, else a seeded sample of 50,000), so it is the same figure; Δ (§4.3) is accumulated per
chunk (equal to rounding). Not streamed (the in-memory path runs): several fields, ``mode =
"exact"``, ``empty = "skip"``, record ids, ``search = "approximate"``, DataFrames.
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vflink._files import table_format
from vflink.data.batches import scan_frame
from vflink.data.sink import ColumnSink
from vflink.data.table import bad_cells
from vflink.errors import ConfigError, DataError
from vflink.linkage import BloomConfig, GeoBloomConfig, SearchOptions, SoftLinkage
from vflink.linkage.encoding import encode_chunked
from vflink.linkage.improvement import _PLOT_ROWS, improvement_estimates, plot_similarity_curve
from vflink.linkage.moments import ExactSum
from vflink.linkage.privacy import dp_epsilon, tau_for_sigma, theorem1_delta_limit
from vflink.linkage.soft import noise_scale
from vflink.linkage.streamed import search_chunk_against_parts
from vflink.parties.linking import build_encoder
from vflink.protocol.sessions import purpose_of
from vflink.randomness import secret_generator
from vflink.runner.encoding import default_noise, encoding_for, federal_spec, resolve_privacy
from vflink.runner.link import LinkOutcome, links_metadata
from vflink.runner.local import secret_with_source
from vflink.types import Compute

__all__ = ["stream_refusal", "stream_wanted", "streamed_linkage", "table_rows"]

log = logging.getLogger(__name__)


def stream_refusal(*, mode: str, empty: str, ids: bool, fields: bool, search: str,
                   tables: bool = True) -> str | None:
    """Why this link cannot be streamed (``None``: it can)."""
    if fields:
        return "a multi-field link (`fields`) is not streamed"
    if not tables:
        return "tables given as DataFrames are already in memory"
    if mode == "exact":
        return "mode = \"exact\" is not streamed"
    if empty != "error":
        return "empty = \"skip\" is not streamed"
    if ids:
        return "record ids (`id`, `secondary_id`) are not streamed"
    if search == "approximate":
        return "an approximate search is one index over the whole secondary; not streamed"
    return None


def table_rows(path: Path) -> int:
    """Rows of a table file, cheaply and in flat memory: Parquet metadata, or the CSV's line
    count less its header (a quoted line break counts twice: this only picks a path)."""
    if table_format(path) == "parquet":  # from the bytes, as the readers decide
        import pyarrow.dataset as ds

        return int(ds.dataset(str(path), format="parquet").count_rows())
    import gzip

    opener: Callable[..., Any] = gzip.open if path.suffix.lower() == ".gz" else open
    lines = 0
    with opener(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            lines += block.count(b"\n")
    return max(0, lines - 1)


def stream_wanted(stream: bool | None, primary: Path, secondary: Path, *,
                  threshold: int) -> bool:
    """``stream`` when given; else whether either table has more than ``threshold`` rows."""
    if stream is not None:
        return stream
    return max(table_rows(primary), table_rows(secondary)) > threshold


def _batches(path: Path, columns: Sequence[str], kind: str, metric: str, source: str,
             rows: int, read: dict[str, Any]) -> Iterator[tuple[int, Any, pd.DataFrame]]:
    """(first row, identifier values, raw batch) of a party's table, each batch checked as the
    in-memory link checks the whole table: numbers finite (and coordinates in range), strings
    not blank. Strings are the columns joined with a space, as ``identifier_values``."""
    numeric = kind == "numeric"
    for batch in scan_frame(path, columns=columns, text_columns=() if numeric else columns,
                            numeric_columns=columns if numeric else (), batch_rows=rows,
                            **read):
        frame, problems = batch.frame, []
        if numeric:
            values = np.empty((len(frame), len(columns)), dtype=np.float64)
            for j, col in enumerate(columns):
                arr = pd.to_numeric(frame[col], errors="coerce").to_numpy(
                    dtype=np.float64, na_value=np.nan)
                bad = ~np.isfinite(arr)
                if metric == "haversine" and len(columns) == 2:
                    bad |= np.abs(arr) > (90.0, 180.0)[j]
                if bad.any():
                    problems.append(f"identifier column {col!r} needs a finite number"
                                    + (" (latitude within ±90, longitude within ±180)"
                                       if metric == "haversine" else "") + " in every row, "
                                    + bad_cells(frame, bad, col, offset=batch.offset))
                values[:, j] = arr
            out: Any = values
        else:
            parts = frame[list(columns)].astype(object)
            parts = parts.where(parts.notna(), "")
            out = [" ".join(str(v) for v in row).strip()
                   for row in parts.itertuples(index=False, name=None)]
            blank = np.array([not s for s in out], dtype=bool)
            if blank.any():
                problems.append(f"identifier column {columns[0]!r} is empty, "
                                + bad_cells(frame, blank, columns[0], offset=batch.offset))
        if problems:
            raise DataError(f"{source}: " + "; ".join(problems),
                            [f"{source}: {p}" for p in problems])
        yield batch.offset, out, frame


def _range_frame(path: Path, columns: Sequence[str], metric: str, source: str, rows: int,
                 read: dict[str, Any]) -> pd.DataFrame:
    """A party's per-column min and max (two rows): all a FEDERAL range needs of it."""
    lo = np.full(len(columns), np.inf)
    hi = np.full(len(columns), -np.inf)
    for _, values, _ in _batches(path, columns, "numeric", metric, source, rows, read):
        if len(values):
            lo, hi = np.minimum(lo, values.min(axis=0)), np.maximum(hi, values.max(axis=0))
    return pd.DataFrame([lo, hi], columns=list(columns))


def streamed_linkage(primary: Path, secondary: Path, *, on: Sequence[str],
                     secondary_on: Sequence[str] | None, metric: str, top_k: int,
                     out: Path, privacy: str | None = None, mode: str = "soft",
                     tau: float | None = None, sigma: float | None = None,
                     delta: float = 1e-5, secret: bytes | None = None,
                     seed: int | None = None, search: SearchOptions | None = None,
                     bloom_config: BloomConfig | None = None,
                     geo_config: GeoBloomConfig | None = None,
                     read: tuple[dict[str, Any], dict[str, Any]] = ({}, {}),
                     compute: Compute | None = None, chunk_rows: int = 100_000,
                     parts: bool | None = None, figure: Path | None = None
                     ) -> LinkOutcome:
    """The streamed ``vflink link`` (module docstring): writes the links to ``out`` (and
    Figure 4 to ``figure``) and returns the outcome with a :class:`SoftLinkage` of no rows
    that carries the figures (μ0, σ0, σ, τ, ε)."""
    start = time.perf_counter()
    private = resolve_privacy(privacy) == "bloom"
    tau, sigma = default_noise(tau, sigma, private=private, mode=mode)
    if mode not in ("soft", "top1"):
        raise ConfigError(f"a streamed link's `mode` must be soft or top1, got {mode!r}")
    if mode != "soft" and top_k != 1:
        raise ConfigError(f"mode {mode!r} links one secondary row per primary row; `top_k` "
                          f"must be 1, got {top_k}")
    on, s_on = tuple(on), tuple(secondary_on or on)
    if len(on) != len(s_on):
        raise ConfigError(f"--on names {len(on)} column(s) but --secondary-on names "
                          f"{len(s_on)}; each primary identifier needs a counterpart")
    p_src, s_src = str(primary), str(secondary)
    rows = max(1, int(chunk_rows))
    if metric in ("euclidean", "haversine", "levenshtein"):
        kind = "string" if metric == "levenshtein" else "numeric"
    else:  # hamming: Bloom filters of whatever the columns hold, typed as the whole read types
        first = next(iter(scan_frame(primary, columns=on, batch_rows=rows, **read[0]))).frame
        kind = "numeric" if all(pd.api.types.is_numeric_dtype(first[c]) for c in on) \
            else "string"
    if kind == "numeric" and metric != "haversine" and (private or metric == "hamming"):
        # each data party's min and max: the agreed FEDERAL range (App. I), as in memory
        spec = federal_spec(bloom_config or BloomConfig(), [
            (_range_frame(primary, on, metric, p_src, rows, read[0]), on, p_src),
            (_range_frame(secondary, s_on, metric, s_src, rows, read[1]), s_on, s_src)],
            margin=0.01)
        search_metric = "hamming"
    else:
        typed = pd.DataFrame({c: pd.Series([], dtype=float if kind == "numeric" else object)
                              for c in on})
        spec, search_metric = encoding_for(metric, bloom=private, sides=((typed, on),),
                                           bloom_config=bloom_config, geo_config=geo_config)
    secret_source = "given" if secret is not None else ""
    if spec.encoder == "bloom" and secret is None:
        secret, secret_source = secret_with_source("VFLINK_SECRET", seed=seed)
    encoder = build_encoder(spec, secret)
    o = search or SearchOptions()
    task_options = SearchOptions(mode="exact", dense_index=o.dense_index,
                                 chunk_size=o.chunk_size, threads=o.threads if compute is None
                                 or o.threads is not None else 1)
    traffic = {"primary->coordinator": [0, 0], "secondary->coordinator": [0, 0],
               "coordinator->primary": [0, 0], "coordinator->secondary": [0, 0]}

    def encode(values: Any) -> Any:
        encoded = encode_chunked(encoder, values, compute)
        return np.asarray(encoded) if kind == "numeric" or isinstance(encoded, np.ndarray) \
            else np.array(list(encoded), dtype=str)

    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".scratch", dir=out.parent))
    try:
        # the secondary party: encodings only, spilled as partitions in the coordinator's scratch
        partitions: list[tuple[int, str]] = []
        n_secondary = 0
        for offset, values, _ in _batches(secondary, s_on, kind, metric, s_src, rows, read[1]):
            enc = encode(values)
            path = scratch / f"s-{len(partitions):06d}.npy"
            np.save(path, enc, allow_pickle=False)
            partitions.append((offset, str(path)))
            traffic["secondary->coordinator"][0] += 1
            traffic["secondary->coordinator"][1] += int(enc.nbytes)
            n_secondary = offset + len(enc)
        if n_secondary < top_k:
            raise DataError(f"{s_src}: `top_k` = {top_k} is larger than the secondary table "
                            f"({n_secondary} rows)")
        shared = (search_metric, tuple(partitions), top_k, task_options)
        window = 2 * (compute.workers if compute is not None else 1)
        raw: list[Path] = []
        total = ExactSum()

        def flush(chunks: list[Any]) -> None:
            results = ([search_chunk_against_parts(shared, c) for c in chunks]
                       if compute is None else
                       compute.map(search_chunk_against_parts, chunks, shared=shared))
            for dist, idx in results:
                path = scratch / f"r-{len(raw):06d}.npz"
                np.savez(path, distances=dist, indices=idx)
                raw.append(path)
                total.add(dist)

        held: list[Any] = []
        n_primary = 0
        for _, values, _ in _batches(primary, on, kind, metric, p_src, rows, read[0]):
            enc = encode(values)
            traffic["primary->coordinator"][0] += 1
            traffic["primary->coordinator"][1] += int(enc.nbytes)
            held.append(enc)
            n_primary += len(enc)
            if len(held) >= window:
                flush(held)
                held = []
        if held:
            flush(held)
        if not raw:
            raise DataError(f"{p_src}: the primary table is empty")
        # Eq. 1: μ0 from the exact sum, then σ0 from the exact sum of squared deviations
        mean = total.mean()
        squares = ExactSum()
        for path in raw:
            with np.load(path) as r:
                dev = r["distances"] - mean
            dev *= dev
            squares.add(dev)
        mu0, sigma0 = -mean, math.sqrt(squares.mean())
        noise = noise_scale(tau, sigma, sigma0)
        rng = (np.random.default_rng([seed, zlib.crc32(purpose_of("link").encode())])
               if seed is not None else secret_generator())
        pick = (np.sort(np.random.default_rng(0).choice(n_primary, _PLOT_ROWS, replace=False))
                if n_primary > _PLOT_ROWS else None)
        sample: list[tuple[Any, Any, Any]] = []
        delta_sums: dict[str, float] = {}
        row = 0
        with ColumnSink(out, rows=n_primary * top_k, parts=parts, metadata=links_metadata(
                ("primary_index", "secondary_index", "rank", "distance", "similarity"))) as sink:
            for path in raw:
                with np.load(path) as r:
                    dist, idx = r["distances"], r["indices"]
                n, k = dist.shape
                if sigma0 > 0.0:  # as normalize_similarities / perturb_similarities
                    rho = -dist
                    rho -= mu0
                    rho /= sigma0
                else:
                    rho = np.zeros_like(dist)
                if noise != 0.0:
                    sim = rng.normal(0.0, noise, size=rho.shape)
                    sim += rho
                else:
                    sim = rho
                sink.write({
                    "primary_index": np.repeat(np.arange(row, row + n, dtype=np.int64), k),
                    "secondary_index": idx.astype(np.int64, copy=False).reshape(-1),
                    "rank": np.tile(np.arange(k, dtype=np.int64), n),
                    "distance": dist.astype(np.float64, copy=False).reshape(-1),
                    "similarity": sim.astype(np.float64, copy=False).reshape(-1)})
                traffic["coordinator->primary"][0] += 1
                traffic["coordinator->primary"][1] += int(idx.nbytes + sim.nbytes)
                traffic["coordinator->secondary"][0] += 1
                traffic["coordinator->secondary"][1] += int(idx.nbytes)
                part = _figures(idx, dist, sim, mu0, sigma0, noise, search_metric, mode,
                                n_secondary)
                if mode == "soft":
                    for name, value in improvement_estimates(part).items():
                        delta_sums[name] = delta_sums.get(name, 0.0) + value * n
                keep = (np.arange(n) if pick is None else
                        pick[(pick >= row) & (pick < row + n)] - row)
                if keep.size:
                    sample.append((idx[keep], dist[keep], sim[keep]))
                row += n
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    improvement = {name: value / max(1, n_primary) for name, value in delta_sums.items()}
    shown = _figures(np.concatenate([r[0] for r in sample]),
                     np.concatenate([r[1] for r in sample]),
                     np.concatenate([r[2] for r in sample]), mu0, sigma0, noise, search_metric,
                     mode, n_secondary)
    if figure is not None and mode == "soft" and top_k > 1:
        plot_similarity_curve(shown, figure, delta=improvement.get("avgsim"))
    empty = np.empty((0, top_k))
    linkage = _figures(empty.astype(np.int64), empty, empty, mu0, sigma0, noise,
                       search_metric, mode, n_secondary, n_primary=n_primary, delta=delta)
    sizes = {"primary_rows": n_primary, "secondary_rows": n_secondary, "top_k": top_k,
             "links": n_primary * top_k}
    log.info("streamed link: %d × %d, %d primary chunks, %d secondary partitions",
             n_primary, n_secondary, len(raw), len(partitions))
    return LinkOutcome(linkage=linkage, alignment=linkage.to_alignment("secondary"),
                       seconds=time.perf_counter() - start, sizes=sizes,
                       privacy="bloom" if spec.encoder == "bloom" else "off",
                       search_metric=search_metric, improvement=improvement,
                       encoding=spec.encoder, secret_source=secret_source,
                       communication={k: {"messages": v[0], "bytes": v[1]}
                                      for k, v in sorted(traffic.items())})


def _figures(idx: Any, dist: Any, sim: Any, mu0: float, sigma0: float, noise: float,
             metric: str, mode: str, n_secondary: int, *, n_primary: int | None = None,
             delta: float = 1e-5) -> SoftLinkage:
    """A :class:`SoftLinkage` of some rows with the whole linkage's figures (Theorems 1-2)."""
    n = len(idx) if n_primary is None else n_primary
    epsilon = dp_epsilon(noise, n, mu0, sigma0)
    return SoftLinkage(indices=idx, distances=dist, similarities=sim, mu0=mu0, sigma0=sigma0,
                       sigma=noise, tau=tau_for_sigma(noise, sigma0), epsilon=epsilon,
                       delta=float(delta), epsilon_valid=bool(delta < theorem1_delta_limit(
                           epsilon)), metric=metric, mode=mode,  # type: ignore[arg-type]
                       n_secondary=n_secondary, exact_search=True)
