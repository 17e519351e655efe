"""Comparison levels: each field of a candidate pair mapped to a few ordered levels.

Fellegi and Sunter (JASA 1969) compare two records field by field and let each field's outcome
be one of a few *levels* (Splink's "comparison levels"): here, per field,

=========  =====================================================================================
``exact``  the field's normalised values are equal: equal keyed hashes (HMAC-SHA256 under the
           data parties' secret) of the value, so the coordinator learns equality and nothing else
``≥ t_i``  no exact agreement, and the similarity of the two encodings is at least t_i (the
           thresholds of the field, highest first)
``else``   none of the above
missing    the value is empty on either side: a neutral level that weighs neither way
=========  =====================================================================================

The similarity is that of the encodings the coordinator already compares: the Dice
coefficient 2|a ∧ b| / (|a| + |b|) of two keyed Bloom filters (q-gram filters of strings,
token filters of dates, FEDERAL filters of numbers, geographic filters of places), or, with
privacy off, one minus the field's own normalised distance (:mod:`vflink.linkage.fields`).

Levels are numbered ``0`` (else) … ``len(thresholds) + 1`` (exact), and ``-1`` for missing, so
a larger level always means more agreement. Defaults per kind of field are in
:data:`DEFAULT_LEVELS`, chosen from the Dice values of typical errors: a one-character typo in
a 6-letter name leaves bigram Dice ≈ 0.7, a two-character one ≈ 0.45; a date with one wrong
component keeps at least 1/3 of its tokens (:mod:`vflink.linkage.encoding.dates`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from vflink.errors import ConfigError

__all__ = ["DEFAULT_LEVELS", "MAX_THRESHOLDS", "FieldComparator", "bloom_dice", "field_levels",
           "level_names", "pair_levels"]

#: Similarity thresholds (highest first) of each kind of field, between ``exact`` and ``else``.
DEFAULT_LEVELS: dict[str, tuple[float, ...]] = {
    "string": (0.8, 0.6),
    "date": (1.0 / 3.0 - 1e-9,),
    "numeric": (0.8, 0.5),
    "geo": (0.8, 0.5),
}
Int8Array = npt.NDArray[np.int8]
FloatArray = npt.NDArray[np.float64]
#: Most similarity thresholds of one field. Levels are stored as int8 (``else`` = 0, one per
#: threshold, ``exact``, and -1 for missing): 126 thresholds would still fit, but a field
#: needs a handful (Splink's comparisons have 3 to 5 levels) and every level is one more m
#: and u to estimate from the same pairs, so the cap is far below the storage's.
MAX_THRESHOLDS = 32


@dataclass(frozen=True, kw_only=True)
class FieldComparator:
    """How one field's pairs are turned into levels: the similarity ``thresholds`` (highest
    first, in (0, 1)), and whether the exact level's weight is adjusted by the frequency of the
    agreeing value (``tf``, term-frequency adjustment)."""

    name: str
    thresholds: tuple[float, ...]
    tf: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.thresholds, (tuple, list)) or \
                not 0 < len(self.thresholds) <= MAX_THRESHOLDS:
            n = len(self.thresholds) if isinstance(self.thresholds, (tuple, list)) else None
            raise ConfigError(f"field {self.name!r}: comparison `levels` must list 1 to "
                              f"{MAX_THRESHOLDS} similarity thresholds, got "
                              f"{n if n is not None else type(self.thresholds).__name__}")
        try:
            t = tuple(float(x) for x in self.thresholds)
        except (TypeError, ValueError):
            t = (math.nan,)
        if any(not 0.0 < x < 1.0 for x in t) or any(a <= b for a, b in zip(t, t[1:])):
            raise ConfigError(f"field {self.name!r}: comparison `levels` must be similarities "
                              f"in (0, 1), strictly decreasing, got {list(self.thresholds)}")
        object.__setattr__(self, "thresholds", t)

    @property
    def n_levels(self) -> int:
        return len(self.thresholds) + 2


def level_names(thresholds: Sequence[float]) -> tuple[str, ...]:
    """Names of levels 0 … L−1: ``else``, ``≥ t`` (lowest threshold first), ``exact``."""
    return ("else", *(f"≥ {t:.2g}" for t in reversed(tuple(thresholds))), "exact")


def packed_words(x: Any) -> npt.NDArray[np.uint64]:
    """Packed bit rows (uint8) as 64-bit words, zero-padded to a multiple of 8 bytes."""
    a = np.ascontiguousarray(x, dtype=np.uint8)
    pad = (-a.shape[1]) % 8
    if pad:
        a = np.pad(a, ((0, 0), (0, pad)))
    return a.view(np.uint64)


def bloom_dice(a: npt.NDArray[np.uint8], b: npt.NDArray[np.uint8], rows: npt.NDArray[np.int64],
               cols: npt.NDArray[np.int64], *, chunk: int = 1 << 16) -> FloatArray:
    """Dice coefficient of the packed filters ``a[rows[i]]`` and ``b[cols[i]]`` for each pair
    (0 where both are empty), in chunks so memory stays bounded."""
    wa, wb = packed_words(a), packed_words(b)
    pa = np.bitwise_count(wa).sum(axis=1, dtype=np.int64)
    pb = np.bitwise_count(wb).sum(axis=1, dtype=np.int64)
    out = np.empty(len(rows), dtype=np.float64)
    for start in range(0, len(rows), chunk):
        r, c = rows[start:start + chunk], cols[start:start + chunk]
        inter = np.bitwise_count(wa[r] & wb[c]).sum(axis=1, dtype=np.int64)
        total = pa[r] + pb[c]
        out[start:start + chunk] = 2.0 * inter / np.maximum(total, 1)
    return out


def field_levels(similarity: FloatArray, exact: npt.NDArray[np.bool_],
                 missing: npt.NDArray[np.bool_], thresholds: Sequence[float]) -> Int8Array:
    """Levels of one field for each pair (module docstring): exact agreement first, then the
    highest threshold the similarity reaches, ``0`` below all, ``-1`` where missing."""
    t = np.asarray(sorted(thresholds), dtype=np.float64)
    if len(t) > MAX_THRESHOLDS:  # the exact level, len(t) + 1, must fit an int8
        raise ConfigError(f"a field has at most {MAX_THRESHOLDS} comparison thresholds, got "
                          f"{len(t)}")
    level = np.searchsorted(t, np.asarray(similarity, dtype=np.float64), side="right")
    out = level.astype(np.int8)
    out[np.asarray(exact, dtype=bool)] = len(t) + 1
    out[np.asarray(missing, dtype=bool)] = -1
    return out


def pair_levels(similarities: Sequence[FloatArray], exact: Sequence[npt.NDArray[np.bool_]],
                missing: Sequence[npt.NDArray[np.bool_]],
                comparators: Sequence[FieldComparator]) -> Int8Array:
    """The ``(pairs, fields)`` level matrix of :func:`field_levels` over every field."""
    if not comparators:
        raise ConfigError("a comparison needs at least one field")
    cols = [field_levels(s, e, m, c.thresholds)
            for s, e, m, c in zip(similarities, exact, missing, comparators, strict=True)]
    return np.ascontiguousarray(np.stack(cols, axis=1), dtype=np.int8)
