"""Input validation for linkage: bad identifiers fail fast with a message naming the side, the
row and the value (ARCHITECTURE.md, convention 7).

Data problems raise :class:`~vflink.errors.DataError`; a request the data cannot satisfy (K
larger than the secondary table) raises :class:`~vflink.errors.LinkageError`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from vflink.errors import DataError, LinkageError
from vflink.linkage.search import METRICS

__all__ = ["validate_identifiers"]

_SIDES = ("primary", "secondary")


def _first_bad(mask: npt.NDArray[np.bool_]) -> tuple[int, int, int]:
    """(count of bad rows, first bad row, first bad column) of a 2-D boolean mask."""
    bad_rows = np.flatnonzero(mask.any(axis=1))
    row = int(bad_rows[0])
    col = int(np.flatnonzero(mask[row])[0])
    return int(bad_rows.size), row, col


def _dense(side: str, values: Any, metric: str) -> npt.NDArray[np.float64]:
    try:
        x = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(
            f"{side} identifiers for metric {metric!r} must be numeric: {exc}"
        ) from None
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2:
        raise DataError(f"{side} identifiers must be a 2-D array (rows × dims), got shape "
                        f"{x.shape}")
    if x.shape[0] == 0:
        raise DataError(f"{side} identifiers are empty (0 rows)")
    finite = np.isfinite(x)
    if not finite.all():
        count, row, col = _first_bad(~finite)
        raise DataError(f"{side} identifiers contain {count} row(s) with NaN or infinite values; "
                        f"first at row {row}, column {col}: {float(x[row, col])!r}")
    return x


def _latlon(side: str, values: Any) -> npt.NDArray[np.float64]:
    x = _dense(side, values, "haversine")
    if x.shape[1] != 2:
        raise DataError(f"{side} identifiers for metric 'haversine' must have 2 columns "
                        f"(latitude, longitude in degrees), got {x.shape[1]}")
    for col, name, limit in ((0, "latitude", 90.0), (1, "longitude", 180.0)):
        bad = np.abs(x[:, col]) > limit
        if bad.any():
            rows = np.flatnonzero(bad)
            row = int(rows[0])
            raise DataError(
                f"{side} identifiers: {rows.size} row(s) with {name} outside "
                f"[-{limit:g}, {limit:g}]; first at row {row}: {float(x[row, col])!r}"
            )
    return x


def _packed(side: str, values: Any) -> npt.NDArray[np.uint8]:
    x = np.asarray(values)
    if x.ndim != 2:
        raise DataError(f"{side} Bloom filters must be a 2-D array (rows × bytes), got shape "
                        f"{x.shape}")
    if x.shape[0] == 0:
        raise DataError(f"{side} identifiers are empty (0 rows)")
    if x.shape[1] == 0:
        raise DataError(f"{side} Bloom filters have zero length")
    if x.dtype != np.uint8:
        if not np.issubdtype(x.dtype, np.integer) or x.min() < 0 or x.max() > 255:
            raise DataError(f"{side} Bloom filters must be packed bytes (uint8), got dtype "
                            f"{x.dtype}")
        x = x.astype(np.uint8)
    return np.ascontiguousarray(x)


def _strings(side: str, values: Any) -> list[str]:
    if isinstance(values, (str, bytes)):
        raise DataError(f"{side} identifiers must be a sequence of strings, not one string")
    out = list(values)
    if not out:
        raise DataError(f"{side} identifiers are empty (0 rows)")
    for row, v in enumerate(out):
        if not isinstance(v, str):
            raise DataError(f"{side} identifiers: row {row} is not a string: {v!r} "
                            f"({type(v).__name__})")
        if not v.strip():
            raise DataError(f"{side} identifiers: row {row} is an empty string {v!r}")
    return out


def validate_identifiers(primary: Any, secondary: Any, *, metric: str,
                         top_k: int) -> tuple[Any, Any]:
    """Check and convert both sides' identifiers for ``metric``; return them ready to search.

    Checks: known metric; non-empty sides; numeric arrays without NaN/inf; same number of
    dimensions (or Bloom-filter bytes) on both sides; latitude in [-90, 90] and longitude in
    [-180, 180] for haversine; strings non-empty; 1 ≤ ``top_k`` ≤ secondary rows.
    """
    kind = METRICS.get(metric).kind
    converted: list[Any] = []
    for side, values in zip(_SIDES, (primary, secondary), strict=True):
        if kind == "vector":
            converted.append(_dense(side, values, metric))
        elif kind == "latlon":
            converted.append(_latlon(side, values))
        elif kind == "binary":
            converted.append(_packed(side, values))
        else:
            converted.append(_strings(side, values))
    p, s = converted
    if kind != "string" and p.shape[1] != s.shape[1]:
        what = "bytes per Bloom filter" if kind == "binary" else "identifier dimensions"
        raise DataError(f"mismatched {what}: primary has {p.shape[1]}, secondary has "
                        f"{s.shape[1]}")
    if not isinstance(top_k, (int, np.integer)) or isinstance(top_k, bool) or top_k < 1:
        raise LinkageError(f"`top_k` must be an int ≥ 1, got {top_k!r}")
    n_secondary = len(s)
    if top_k > n_secondary:
        raise LinkageError(f"`top_k` = {top_k} is larger than the secondary table "
                           f"({n_secondary} rows)")
    return p, s
