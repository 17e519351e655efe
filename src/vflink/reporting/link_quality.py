"""How well the primary's records were linked, in training and at prediction time.

A prediction is only as good as the link behind it: a new record with no plausible counterpart
at the secondaries still gets a confident probability from the model. So training stores, in the
run directory, the lowest percentile of the *best link's similarity* over the training rows
(soft linkage; rank 0 of FedSim §4.1's top-K, after Eq. 1 normalisation and Eq. 2 noise) as
versioned JSON (``link_quality.json``; data, never pickle), and prediction reports per row the
best link's similarity, or under exact alignment whether a match was found, and counts the rows
below that training percentile. At prediction the linkage reuses the training linkage's scale
(μ0, σ0) and noise σ, so the two distributions are comparable.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from vflink._files import read_json_file
from vflink.errors import RunError
from vflink.runfiles.rundir import write_json
from vflink.types import MISSING, Alignment

__all__ = [
    "LINK_QUALITY_FILE",
    "LINK_QUALITY_VERSION",
    "PERCENTILE",
    "best_similarity",
    "link_columns",
    "read_link_quality",
    "training_link_quality",
    "write_link_quality",
]

LINK_QUALITY_FILE = "link_quality.json"
LINK_QUALITY_VERSION = 1
#: The training percentile of the best link's similarity below which a new row is flagged.
PERCENTILE = 1.0


def best_similarity(alignment: Alignment, n_primary: int) -> npt.NDArray[np.float64]:
    """Per primary row, the similarity of its best (rank 0) link; NaN where it has none."""
    out = np.full(n_primary, np.nan, dtype=np.float64)
    if alignment.similarity is None:
        return out
    linked = alignment.secondary_index[:, 0] != MISSING
    out[alignment.primary_index[linked]] = alignment.similarity[linked, 0]
    return out


def matched(alignment: Alignment, n_primary: int) -> npt.NDArray[np.bool_]:
    """Per primary row, whether it has at least one linked secondary row."""
    return np.asarray(alignment.for_primary_rows(n_primary)[:, 0] != MISSING)


def training_link_quality(method: str, alignments: Mapping[str, Alignment],
                          secondaries: Sequence[str], train_rows: npt.NDArray[np.int64],
                          n_primary: int) -> dict[str, Any]:
    """What ``link_quality.json`` holds for a run aligned with ``method`` (training rows)."""
    out: dict[str, Any] = {"version": LINK_QUALITY_VERSION, "method": method,
                           "train_rows": int(len(train_rows))}
    if method == "soft" and secondaries:
        anchor = secondaries[0]  # its similarities drive the gates (FedSim App. C)
        sims = best_similarity(alignments[anchor], n_primary)[train_rows]
        sims = sims[np.isfinite(sims)]
        out.update({"secondary": anchor, "percentile": PERCENTILE,
                    "best_similarity": float(np.percentile(sims, PERCENTILE))
                    if sims.size else None})
    else:
        out["matched_fraction"] = {
            name: float(matched(alignments[name], n_primary)[train_rows].mean())
            if len(train_rows) else 0.0 for name in secondaries}
    return out


def write_link_quality(run_dir: Path, quality: Mapping[str, Any]) -> None:
    write_json(Path(run_dir) / LINK_QUALITY_FILE, dict(quality))


def read_link_quality(run_dir: Path) -> dict[str, Any] | None:
    """The training's link quality, or ``None`` for a run written before it was recorded."""
    path = Path(run_dir) / LINK_QUALITY_FILE
    if not os.path.lexists(path):
        return None
    # a regular file inside the run directory, within size and depth limits (vflink._files)
    raw = read_json_file(run_dir, LINK_QUALITY_FILE, error=RunError)
    version = raw.get("version") if isinstance(raw, dict) else None
    if version != LINK_QUALITY_VERSION:
        raise RunError(f"{path}: link-quality format version {version!r}; this vflink reads "
                       f"version {LINK_QUALITY_VERSION} (was the run written by another "
                       "version of vflink?)")
    return dict(raw)


def link_columns(method: str, alignments: Mapping[str, Alignment], secondaries: Sequence[str],
                 n_rows: int, quality: Mapping[str, Any] | None, *,
                 exact: Mapping[str, Alignment] | None = None
                 ) -> tuple[pd.DataFrame, list[str]]:
    """Per-row link columns for predictions, and warnings with counts.

    ``alignments`` are the run's base alignments of the new rows; ``exact`` the exact-match
    alignments an algorithm such as ``exact`` trains on under soft linkage. Soft linkage:
    ``best_similarity`` (the best link's similarity) and, when the training percentile is
    known, ``low_similarity`` (below it). Exact alignment, or exact links: ``matched``
    (``matched_<party>`` with several secondaries).
    """
    columns: dict[str, Any] = {}
    warnings: list[str] = []
    if not secondaries:
        return pd.DataFrame(index=range(n_rows)), warnings
    if method == "soft":
        anchor = secondaries[0]
        best = best_similarity(alignments[anchor], n_rows)
        columns["best_similarity"] = best
        threshold = None if quality is None else quality.get("best_similarity")
        percentile = None if quality is None else quality.get("percentile", PERCENTILE)
        if threshold is not None and math.isfinite(float(threshold)):
            low = ~(best >= float(threshold))  # a row without any link counts as low
            columns["low_similarity"] = low
            if low.any():
                warnings.append(
                    f"{int(low.sum())} of {n_rows} rows have a best-link similarity below the "
                    f"lowest {percentile:g}% of training ({float(threshold):.4g}); "
                    "their records may have no real counterpart at the other parties, so "
                    "treat their predictions with care (column low_similarity)")
    exact_alignments = alignments if method == "exact" else exact
    if exact_alignments is not None:
        for name in secondaries:
            col = "matched" if len(secondaries) == 1 else f"matched_{name}"
            found = matched(exact_alignments[name], n_rows)
            columns[col] = found
            if not found.all():
                warnings.append(
                    f"{int((~found).sum())} of {n_rows} rows have no exact match at {name!r}; "
                    f"their predictions do without {name!r}'s features (column {col})")
    return pd.DataFrame(columns), warnings
