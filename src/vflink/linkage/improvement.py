"""Improvement estimate Δ of FedSim over a baseline, without training (FedSim §4.3, Def. 1),
and the sorted-similarity curve of Figure 4.

Definition 1: for primary record i, a baseline 𝓕 splits the secondary records into matches and
non-matches; with s_ij the *scaled* similarity,

    Δ_i(𝓕) = Σ_{j ∈ matches} (1 − s_ij) + Σ_{j ∈ non-matches} s_ij,    Δ(𝓕) = (1/m) Σ_i Δ_i(𝓕).

The first sum is "redundant information" (weakly similar pairs treated as full matches), the
second "lost information" (similar pairs the baseline ignores).

Assumptions, stated because the paper leaves them open:

* **Scaling.** "Scaled similarity" is not defined in the paper. We min–max scale each primary
  record's K similarities to [0, 1] (``scale="row"``), as the authors' released code for this
  metric does (``plot_sim_distribution.py``: ``MinMaxScaler`` over each record's K
  similarities); ``scale="global"`` scales with the minimum and maximum over the whole linkage
  instead. A row whose similarities are all equal scales to 0 (scikit-learn's convention).
* **Which records.** Definition 1 sums over all n secondary records, but only the K linked ones
  have a similarity. Records outside the top-K are taken to contribute s_ij = 0, i.e. K is
  assumed large enough that every informative pair is linked (the paper's own advice for K,
  §4.1); the authors' code makes the same restriction.
* **Baselines.** Exact: matches are the linked records at distance 0 (exact identifier match);
  Top1Sim: the nearest record; AvgSim: the ``avgsim_k`` nearest (default: all K).
* **Noise.** By default the similarities of the linkage (after Eq. 2 noise — what the primary
  party holds) are used; ``noisy=False`` uses ρ of Eq. 1.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

from vflink._files import atomic_open
from vflink._threads import MAX_PASS_THREADS, cores, in_pieces
from vflink.errors import ConfigError
from vflink.linkage.soft import SoftLinkage
from vflink.registry import Registry
from vflink.types import MISSING

__all__ = [
    "BASELINES",
    "baseline_matches",
    "improvement_estimate",
    "improvement_estimates",
    "improvement_per_record",
    "plot_similarity_curve",
    "scale_similarities",
]

Scale = Literal["row", "global"]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def scale_similarities(similarities: npt.ArrayLike, *, scale: Scale = "row") -> FloatArray:
    """Min–max scale similarities to [0, 1] per row (default) or globally; NaN (missing) → 0."""
    s = np.asarray(similarities, dtype=np.float64)
    if scale == "row" and s.ndim == 2 and s.shape[1] > 0:
        fast = _scale_rows_finite(s)
        if fast is not None:
            return fast
    valid = np.isfinite(s)
    filled_lo = np.where(valid, s, np.inf)
    filled_hi = np.where(valid, s, -np.inf)
    if scale == "row":
        lo = filled_lo.min(axis=1, keepdims=True)
        hi = filled_hi.max(axis=1, keepdims=True)
    elif scale == "global":
        lo = np.asarray(filled_lo.min()).reshape(1, 1)
        hi = np.asarray(filled_hi.max()).reshape(1, 1)
    else:
        raise ConfigError(f"`scale` must be one of global, row, got {scale!r}")
    span = hi - lo
    ok_span = np.isfinite(span) & (span > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        scaled = np.where(ok_span, (s - lo) / np.where(ok_span, span, 1.0), 0.0)
    return np.where(valid, scaled, 0.0)


def _scale_rows_finite(s: FloatArray) -> FloatArray | None:
    """Row min–max scaling when every entry is finite (the usual soft linkage), in a few
    passes over the data instead of the masked general path: at FedSim's house scale
    (141,050 × 100) this is what keeps the summary of ``vflink link`` under a second."""
    lo = s.min(axis=1, keepdims=True)
    hi = s.max(axis=1, keepdims=True)
    if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
        return None  # NaN (missing links) or inf: the general path handles them
    span = hi - lo
    flat = span <= 0
    out = s - lo
    out /= np.where(flat, 1.0, span)
    if flat.any():
        out[flat[:, 0]] = 0.0
    return out


def improvement_per_record(scaled: npt.ArrayLike, matches: npt.ArrayLike) -> FloatArray:
    """Δ_i of Definition 1 over the linked records: Σ_matches (1 − s) + Σ_non-matches s."""
    s = np.asarray(scaled, dtype=np.float64)
    m = np.asarray(matches, dtype=bool)
    if s.shape != m.shape:
        raise ConfigError(f"similarity shape {s.shape} != matches shape {m.shape}")
    return np.asarray(np.where(m, 1.0 - s, s).sum(axis=1), dtype=np.float64)


def _exact(linkage: SoftLinkage, avgsim_k: int | None) -> BoolArray:
    return np.asarray((linkage.indices != MISSING) & (linkage.distances == 0.0))


def _top1(linkage: SoftLinkage, avgsim_k: int | None) -> BoolArray:
    m = np.zeros(linkage.indices.shape, dtype=bool)
    m[:, 0] = linkage.indices[:, 0] != MISSING
    return m


def _avg(linkage: SoftLinkage, avgsim_k: int | None) -> BoolArray:
    k = linkage.k if avgsim_k is None else avgsim_k
    if not 1 <= k <= linkage.k:
        raise ConfigError(f"`avgsim_k` must be an int in [1, {linkage.k}], got {avgsim_k!r}")
    m = np.zeros(linkage.indices.shape, dtype=bool)
    m[:, :k] = True
    return np.asarray(m & (linkage.indices != MISSING))


#: Which linked records each baseline treats as matches.
BASELINES: Registry[Callable[[SoftLinkage, int | None], BoolArray]] = Registry("baseline")
BASELINES.add("exact", _exact)
BASELINES.add("top1sim", _top1)
BASELINES.add("avgsim", _avg)
#: The baselines Δ is reported against by default (FedSim §4.3).
BASELINE_NAMES = ("exact", "top1sim", "avgsim")


def baseline_matches(linkage: SoftLinkage, baseline: str, *,
                     avgsim_k: int | None = None) -> BoolArray:
    """``(n, K)`` mask of the linked records that ``baseline`` counts as matches."""
    fn = BASELINES.get(baseline)
    return fn(linkage, avgsim_k)


def improvement_estimate(linkage: SoftLinkage, baseline: str = "top1sim", *,
                         avgsim_k: int | None = None, scale: Scale = "row",
                         noisy: bool = True) -> float:
    """Δ(𝓕) of FedSim over ``baseline`` ("exact", "top1sim", "avgsim"), Definition 1."""
    sims = linkage.similarities if noisy else linkage.raw_similarities()
    scaled = scale_similarities(sims, scale=scale)
    matches = baseline_matches(linkage, baseline, avgsim_k=avgsim_k)
    per = improvement_per_record(scaled, matches)
    return float(per.mean()) if per.size else 0.0


def improvement_estimates(linkage: SoftLinkage, baselines: tuple[str, ...] = BASELINE_NAMES,
                          *, scale: Scale = "row", noisy: bool = True,
                          scaled: FloatArray | None = None) -> dict[str, float]:
    """Δ of Definition 1 for several baselines, scaling the similarities once.

    Uses Δ_i = Σ_j s_ij + Σ_{j ∈ matches} (1 − 2 s_ij), equal to Definition 1's two sums; the
    all-matches (AvgSim over all K) and first-column (Top1Sim) cases need no mask at all.
    ``scaled`` passes similarities already scaled with ``scale``.
    """
    if scaled is None:
        if noisy:  # a block of rows at a time (no n × K array where ρ is made on demand)
            rows_of: Callable[[int, int], FloatArray] = linkage.similarity_rows
        else:
            raw = linkage.raw_similarities()
            rows_of = lambda lo, hi: raw[lo:hi]  # noqa: E731
        fast = _row_estimates(linkage, rows_of, baselines) if scale == "row" else None
        if fast is not None:
            return fast
        sims = linkage.similarities if noisy else rows_of(0, len(linkage))
        scaled = scale_similarities(sims, scale=scale)
    valid = linkage.indices != MISSING
    all_valid = bool(valid.all())
    row_sum = scaled.sum(axis=1)
    out: dict[str, float] = {}
    n = max(1, scaled.shape[0])
    for name in baselines:
        if name == "avgsim" and all_valid:
            per_sum = float(linkage.k * scaled.shape[0] - row_sum.sum())
        elif name == "top1sim" and all_valid:
            per_sum = float(row_sum.sum() + (1.0 - 2.0 * scaled[:, 0]).sum())
        else:
            m = baseline_matches(linkage, name)
            # Boolean gather instead of a masked n × K temporary: the Exact baseline's matches
            # (distance 0) are usually few.
            picked = scaled[m]
            per_sum = float(row_sum.sum() + picked.size - 2.0 * picked.sum())
        out[name] = per_sum / n if scaled.size else 0.0
    return out


def _row_estimates(linkage: SoftLinkage, rows_of: Callable[[int, int], FloatArray],
                   baselines: tuple[str, ...]) -> dict[str, float] | None:
    """:func:`improvement_estimates` with row scaling when every link is present and every
    similarity finite (the usual soft linkage), from each row's minimum, maximum and sum
    instead of the n × K scaled matrix: a row's scaled sum is (Σ s − K·min) / span, so Δ
    needs three passes over the similarities and none over a scaled copy (at FedSim's house
    scale, 14 M similarities, that halves the summary's cost). The passes go over blocks of
    rows that stay in the cache, the blocks shared by one thread per core (numpy releases the
    GIL in its reductions). ``rows_of(lo, hi)``: the similarities of rows ``lo`` to ``hi``
    (made for those rows alone where they are Eq. 1 of the distances). ``None``: not that
    case."""
    indices = linkage.indices
    # every link present: no index at MISSING (the least index above it: one pass, no mask)
    if indices.ndim != 2 or indices.shape[1] == 0 or not indices.size or \
            not indices.min() > MISSING:
        return None
    n, k = indices.shape
    others = [name for name in baselines if name not in ("avgsim", "top1sim", "exact")]
    d = np.asarray(linkage.distances) if "exact" in baselines else None

    def block(rows: slice) -> tuple[float, float, float, int] | None:
        """(Σ of the rows' scaled sums, Σ of their first columns' 1 − 2·scaled, Σ of the
        scaled similarities of their links at distance 0, how many); ``None`` where a row's
        minimum or maximum is not finite."""
        part = np.asarray(rows_of(rows.start, rows.stop), dtype=np.float64)
        scaling = _row_scaling(part)
        if scaling is None:
            return None
        lo, inv = scaling
        row_sum = float(((part.sum(axis=1) - k * lo) * inv).sum())
        first = float((1.0 - 2.0 * (part[:, 0] - lo) * inv).sum())
        picked_sum, picked = 0.0, 0
        # distances are ≥ 0: a block whose least is above 0 has no link at distance 0, found
        # in one pass (0.1 ns a link here) instead of a mask and its nonzero (1.9 ns)
        if d is not None and not d[rows].min() > 0.0:
            r, c = np.nonzero(d[rows] == 0.0)
            if r.size:
                picked_sum, picked = float(((part[r, c] - lo[r]) * inv[r]).sum()), int(r.size)
        return row_sum, first, picked_sum, picked

    step = max(1, _ROW_BLOCK // k)
    blocks = [slice(a, min(n, a + step)) for a in range(0, n, step)]
    threads = min(len(blocks), cores(), MAX_PASS_THREADS)
    # the blocks in `threads` stretches, one per thread (the process's own: in_pieces), in order
    parts = [p for stretch in in_pieces(lambda r: [block(b) for b in blocks[r]], len(blocks),
                                        threads) for p in stretch]
    if any(p is None for p in parts):
        return None
    done = [p for p in parts if p is not None]
    total = sum(p[0] for p in done)
    out: dict[str, float] = {}
    for name in baselines:
        if name == "avgsim":
            per_sum = k * n - total
        elif name == "top1sim":
            per_sum = total + sum(p[1] for p in done)
        elif name == "exact":
            # every link is present: Exact's matches are the links at distance 0
            per_sum = total + sum(p[3] for p in done) - 2.0 * sum(p[2] for p in done)
        else:
            continue
        out[name] = per_sum / max(1, n)
    s = np.asarray(rows_of(0, n), dtype=np.float64) if others else None
    scaling = _row_scaling(s) if s is not None else None
    if s is not None and scaling is not None:
        lo, inv = scaling
        for name in others:
            rows, cols = np.nonzero(baseline_matches(linkage, name))
            picked = (s[rows, cols] - lo[rows]) * inv[rows]
            out[name] = (total + picked.size - 2.0 * float(picked.sum())) / max(1, n)
    return {name: out[name] for name in baselines}


def _row_scaling(s: FloatArray) -> tuple[FloatArray, FloatArray] | None:
    """Each row's minimum and 1 / (maximum − minimum) (0 for a flat row, which scales to 0):
    row scaling is (s − min) · that; ``None`` where a row's minimum or maximum is not
    finite."""
    lo, hi = _row_extremes(s)
    if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
        return None
    span = hi - lo
    flat = span <= 0
    return lo, np.where(flat, 0.0, 1.0 / np.where(flat, 1.0, span))


def _row_extremes(s: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Each row's minimum and maximum (NaN where the row has one). Rows of a C-contiguous
    array are reduced as segments of its flat view: numpy's ``min(axis=1)`` over rows of
    K = 100 took twice the time (0.58 against 0.29 ns a value here); the same values."""
    n, k = s.shape
    if k == 0 or n == 0 or not s.flags.c_contiguous:
        return s.min(axis=1), s.max(axis=1)
    flat, starts = s.reshape(-1), np.arange(0, n * k, k)
    return np.minimum.reduceat(flat, starts), np.maximum.reduceat(flat, starts)


#: Similarities per block of rows of :func:`_row_estimates` (float64: 2 MB, in the cache).
_ROW_BLOCK = 1 << 18


#: Sample of records drawn for Figure 4's mean curve and band when a linkage is larger: the
#: mean of 50,000 sorted curves is within ~1e-3 of the full mean (the plot's line width), and
#: sorting and taking percentiles over all 141,050 × 100 house-scale similarities cost a second.
_PLOT_ROWS = 50_000


def plot_similarity_curve(linkage: SoftLinkage, path: str | Path, *,
                          baseline: str = "avgsim", avgsim_k: int | None = None,
                          scale: Scale = "row", noisy: bool = True,
                          scaled: FloatArray | None = None, delta: float | None = None,
                          seed: int = 0) -> Path:
    """Write Figure 4 as a PNG: each record's scaled similarities sorted in decreasing order,
    averaged over records (with the 10–90 % band), the baseline's match threshold, and the
    redundant (1 − s on matches) and lost (s on non-matches) areas whose sum is Δ.

    ``scaled`` and ``delta`` reuse values the caller has already computed; above
    ``_PLOT_ROWS`` records the curve is drawn from a seeded random sample of records (Δ in
    the title is always computed on all of them).
    """
    # Imported here: matplotlib is only needed for this one function, and the object API on a
    # bare Figure uses the Agg canvas without touching pyplot's global state or a display.
    from matplotlib.figure import Figure

    if scaled is None:
        sims = linkage.similarities if noisy else linkage.raw_similarities()
        scaled = scale_similarities(sims, scale=scale)
    if delta is None:
        delta = improvement_estimate(linkage, baseline, avgsim_k=avgsim_k, scale=scale,
                                     noisy=noisy)
    matches = baseline_matches(linkage, baseline, avgsim_k=avgsim_k)
    threshold = float(matches.sum(axis=1).mean())
    rows = scaled
    if rows.shape[0] > _PLOT_ROWS:
        pick = np.sort(np.random.default_rng(seed).choice(rows.shape[0], _PLOT_ROWS,
                                                          replace=False))
        rows = rows[pick]
    curves = -np.sort(-rows, axis=1)
    mean = curves.mean(axis=0)
    lo, hi = np.percentile(curves, [10, 90], axis=0)
    ranks = np.arange(1, linkage.k + 1)

    fig = Figure(figsize=(6.0, 4.0), dpi=120)
    ax = fig.add_subplot()
    ax.fill_between(ranks, lo, hi, color="tab:blue", alpha=0.15, label="10–90 % of records")
    ax.plot(ranks, mean, color="tab:blue", label="mean sorted scaled similarity")
    left = ranks <= threshold + 0.5
    ax.fill_between(ranks, mean, 1.0, where=left, color="tab:red", alpha=0.25,
                    label="redundant information (1 − s, matches)")
    ax.fill_between(ranks, 0.0, mean, where=~left, color="tab:orange", alpha=0.25,
                    label="lost information (s, non-matches)")
    ax.axvline(threshold + 0.5, color="k", linestyle="--", label=f"{baseline} threshold")
    ax.set_xlabel("rank of linked record (most similar first)")
    ax.set_ylabel("scaled similarity")
    ax.set_ylim(0.0, 1.05)
    ax.set_title(f"FedSim vs {baseline}: Δ = {delta:.3f} (K = {linkage.k})")
    ax.legend(fontsize="small", loc="upper right")
    fig.tight_layout()
    out = Path(path)
    with atomic_open(out, "wb") as fh:
        fig.savefig(fh, format="png")
    return out
