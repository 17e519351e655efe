"""Linkage on several fields, each with its own metric and weight, and blocking keys.

Real tables link on more than one identifier: a name and an address, or a place's coordinates and
its name. Concatenating them into one string for one Levenshtein distance lets a long address
drown a short name, and cannot mix coordinates with text. Here every field has its own distance,
normalised to [0, 1], and the record distance is the weighted mean

    D(i, j) = Σ_f w_f · d_f(i, j) / Σ_f w_f,

which is the ``dist`` that FedSim's Eq. 1 normalises and Eq. 2 noises (unchanged). A field
that is empty on either side of a pair is left out of that pair's mean.

Per-field normalised distances (string scorers from rapidfuzz):

=================  =================================================================
``levenshtein``    edits / length of the longer string (``Levenshtein.normalized_distance``)
``jaro-winkler``   1 − Jaro–Winkler similarity
``token-set``      1 − token-set ratio / 100 (word order and repeated words ignored)
``exact``          0 when equal (after normalisation), else 1
``euclidean``      d / (d + scale)
``haversine``      d / (d + scale), d in km
``hamming``        Hamming distance / total set bits of both Bloom filters (Dice distance)
``date``           1 − Dice of the dates' token sets (:mod:`.encoding.dates`): a swapped
                   day and month or a year one off stay close
=================  =================================================================

With ``model = "fellegi-sunter"`` a field may leave ``metric`` out: the comparison follows the
column (:func:`auto_metric`: dates, numbers with decimals, else strings), and ``weight`` is
not used (the model learns each level's weight).

``scale`` of a numeric field is the distance counted as "half different"; by default the median
distance from a sample of primary records to their nearest secondary record on that field.

Blocking (optional) restricts the comparison to pairs that agree on at least one key the user
names: a column's normalised value, or its first ``prefix`` characters, or several columns
together (a combined rule: ``on = ["surname", "postcode"]`` keeps pairs equal on both). The
key is computed from the same normalised value as the field's encoding (:func:`key_text`):
dates parsed to ``YYYYMMDD`` (so ``19560409`` and ``09/04/1956`` block together), strings
case-, accent-, spacing- and punctuation-folded, phone numbers reduced to their digits,
numbers to one canonical form; a column that is no field gets the kind its values show
(:func:`key_kind`).
Without blocking every
pair is compared (chunked, so memory stays bounded). :func:`brute_fields` is the plain
reference: one scorer call per pair.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from vflink._checks import check_bool, check_choice, check_int, raise_if
from vflink.errors import ConfigError, DataError
from vflink.linkage.comparison import packed_words
from vflink.linkage.distances import euclidean_distances, haversine_distances
from vflink.linkage.search import Neighbours

__all__ = ["FIELD_METRICS", "KEY_KINDS", "Blocking", "FieldSpec", "FieldValues", "auto_metric",
           "brute_fields", "column_key_kind", "field_resolution", "field_scales", "key_kind",
           "key_text",
           "search_fields"]

FIELD_METRICS = ("levenshtein", "jaro-winkler", "token-set", "exact", "euclidean", "haversine",
                 "hamming", "date")
_STRING = ("levenshtein", "jaro-winkler", "token-set", "exact", "date")
FloatArray = npt.NDArray[np.float64]
#: Bytes budget of one chunk of a (primary rows × secondary rows) matrix per field.
_BUDGET = 64 * 2**20
#: Pairs one work package of a blocked search compares at most (a larger block is split).
BLOCK_COMPARISONS = 10**7


@dataclass(frozen=True, kw_only=True)
class FieldSpec:
    """One field: primary columns ``on`` (``secondary_on`` when the secondary's names differ),
    a metric from :data:`FIELD_METRICS` (``None``: chosen from the column by
    :func:`auto_metric`, for a Fellegi–Sunter link), a weight > 0 and, for numeric metrics, an
    optional ``scale`` (the distance whose normalised value is 1/2). For a Fellegi–Sunter
    link, ``levels`` (similarity thresholds between ``exact`` and ``else``, highest first;
    default per kind, :data:`vflink.linkage.comparison.DEFAULT_LEVELS`) and ``tf``
    (term-frequency adjustment of exact agreement; default on for strings and dates)."""

    on: tuple[str, ...]
    metric: str | None = None
    secondary_on: tuple[str, ...] = ()
    weight: float = 1.0
    scale: float | None = None
    levels: tuple[float, ...] | None = None
    tf: bool | None = None

    def __post_init__(self) -> None:
        for name in ("on", "secondary_on"):
            v = getattr(self, name)
            if isinstance(v, str):
                object.__setattr__(self, name, (v,))
            elif isinstance(v, list):
                object.__setattr__(self, name, tuple(v))
        problems: list[str] = []
        if not self.on or not all(isinstance(c, str) and c for c in self.on):
            problems.append(f"`on` must name one or more columns, got {self.on!r}")
        if self.secondary_on and len(self.secondary_on) != len(self.on):
            problems.append(f"`secondary_on` names {len(self.secondary_on)} column(s) but `on` "
                            f"names {len(self.on)}")
        if self.metric is not None:
            check_choice(problems, "metric", self.metric, FIELD_METRICS)
        if isinstance(self.levels, list):
            object.__setattr__(self, "levels", tuple(self.levels))
        if self.levels is not None and not (
                isinstance(self.levels, tuple) and self.levels
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < 1
                        for x in self.levels)
                and all(a > b for a, b in zip(self.levels, self.levels[1:]))):
            problems.append(f"`levels` must be similarities in (0, 1), highest first, got "
                            f"{self.levels!r}")
        if self.tf is not None:
            check_bool(problems, "tf", self.tf)
        if not (isinstance(self.weight, (int, float)) and not isinstance(self.weight, bool)
                and math.isfinite(self.weight) and self.weight > 0):
            problems.append(f"`weight` must be a number > 0, got {self.weight!r}")
        if self.scale is not None and not (isinstance(self.scale, (int, float))
                                           and math.isfinite(self.scale) and self.scale > 0):
            problems.append(f"`scale` must be a number > 0, got {self.scale!r}")
        if self.metric == "haversine" and len(self.on) != 2:
            problems.append("a haversine field needs two columns (latitude, longitude)")
        raise_if(problems, f"field {list(self.on)}")

    @property
    def columns_s(self) -> tuple[str, ...]:
        return self.secondary_on or self.on

    @property
    def kind(self) -> str:
        if self.metric is None or self.metric in _STRING:
            return "string"
        return "binary" if self.metric == "hamming" else "numeric"

    def describe(self) -> str:
        return f"{self.weight:g}·{self.metric or 'auto'}({','.join(self.on)})"


def auto_metric(values: Sequence[Any]) -> str:
    """The comparison of a field given without ``metric`` (a Fellegi–Sunter link), from its
    values as read (text): ``date`` when they read as dates (:func:`looks_like_dates`),
    ``euclidean`` when they are numbers and some have decimals (a quantity), else
    ``jaro-winkler`` (a string: names, addresses, and integer codes such as postcodes or
    street numbers, whose typos are character edits rather than numeric differences)."""
    from vflink.linkage.encoding.dates import looks_like_dates

    present = [str(v).strip() for v in values
               if v is not None and not (isinstance(v, float) and v != v) and str(v).strip()]
    if not present:
        return "jaro-winkler"
    if looks_like_dates(present):
        return "date"
    try:
        numbers = [float(v) for v in present]
    except ValueError:
        return "jaro-winkler"
    if all(math.isfinite(x) for x in numbers) and any(x != int(x) for x in numbers):
        return "euclidean"
    return "jaro-winkler"


#: How a blocking key's column is normalised (:func:`key_text`).
KEY_KINDS = ("string", "date", "digits", "number")
_PHONE = re.compile(r"^\+?[\d\s().\-/]{6,}$")


def key_kind(values: Sequence[Any], *, share: float = 0.9) -> str:
    """The normalisation a blocking column's values call for: ``date`` when they read as
    dates, ``digits`` when they are phone numbers (digits with spaces, dashes, dots,
    parentheses or a leading +, at least 6 digits, some of them written with a separator),
    else ``string``."""
    from vflink.linkage.encoding.dates import looks_like_dates

    present = [str(v).strip() for v in values
               if v is not None and not (isinstance(v, float) and v != v) and str(v).strip()]
    if not present:
        return "string"
    if looks_like_dates(present, share=share):
        return "date"
    phones = [v for v in present if _PHONE.match(v) and sum(c.isdigit() for c in v) >= 6]
    if len(phones) >= share * len(present) and any(not v.isdigit() for v in phones):
        return "digits"
    return "string"


def column_key_kind(field_kind: str | None, shown: str) -> str:
    """A blocking column's normalisation: its field's (``field_kind``: the field encoding's
    kind, None when the column is no field's) — dates parsed, numbers and places canonical,
    strings folded, phone numbers as digits — else what its values show (``shown``,
    :func:`key_kind`)."""
    if field_kind is None:
        return shown
    own = {"date": "date", "numeric": "number", "geo": "number"}.get(field_kind, "string")
    return "digits" if own == "string" and shown == "digits" else own


def key_text(value: Any, kind: str = "string") -> str:
    """One column's part of a blocking key, normalised as the field's encoding normalises it:
    ``date``: ``YYYYMMDD`` (:func:`~vflink.linkage.encoding.dates.date_parts`; a value that
    is no date falls back to ``string``); ``digits``: its digits only; ``number``: the float's
    shortest form (``1.50`` and ``1.5`` agree); ``string``: case, accents, punctuation and
    spacing folded (:func:`~vflink.linkage.encoding.normalize_string`). ``""``: no key."""
    from vflink.linkage.encoding import normalize_string
    from vflink.linkage.encoding.dates import date_parts

    if value is None or (isinstance(value, float) and value != value):
        return ""
    text = str(value).strip()
    if not text:
        return ""
    if kind == "date":
        parts = date_parts(text)
        if parts is not None:
            return "".join(parts)
    elif kind == "digits":
        return "".join(c for c in text if c.isdigit())
    elif kind == "number":
        try:
            x = float(text)
        except ValueError:
            pass
        else:
            return repr(x) if math.isfinite(x) else ""
    return normalize_string(text)


@dataclass(frozen=True, kw_only=True)
class Blocking:
    """A blocking rule: the primary column ``on`` (``secondary_on`` on the secondary), compared
    exactly after string normalisation, or on its first ``prefix`` characters; or several
    columns (``on = ["surname", "postcode"]``), all equal (each cut to ``prefix``). Rules are
    OR-ed: a pair is compared when it satisfies at least one."""

    on: str | tuple[str, ...]
    secondary_on: str | tuple[str, ...] | None = None
    prefix: int | None = None

    def __post_init__(self) -> None:
        problems: list[str] = []
        for name in ("on", "secondary_on"):
            value = getattr(self, name)
            if isinstance(value, (list, tuple)):
                value = tuple(value)
                object.__setattr__(self, name, value[0] if len(value) == 1 else value)
        cols = self.columns
        if not cols or not all(isinstance(c, str) and c for c in cols):
            problems.append(f"blocking `on` must name one column or a list of columns, got "
                            f"{self.on!r}")
        if self.secondary_on is not None and len(self.columns_s) != len(cols):
            problems.append(f"blocking `secondary_on` names {len(self.columns_s)} column(s) "
                            f"but `on` names {len(cols)}")
        if self.prefix is not None:
            check_int(problems, "prefix", self.prefix, min=1)
        raise_if(problems, "blocking key")

    @property
    def columns(self) -> tuple[str, ...]:
        """The primary's columns of the rule."""
        return (self.on,) if isinstance(self.on, str) else tuple(self.on)

    @property
    def columns_s(self) -> tuple[str, ...]:
        """The secondary's columns of the rule."""
        s = self.secondary_on if self.secondary_on is not None else self.on
        return (s,) if isinstance(s, str) else tuple(s)

    def describe(self) -> str:
        """``surname``, ``surname[:2]`` or ``surname & postcode``."""
        cut = f"[:{self.prefix}]" if self.prefix else ""
        return " & ".join(f"{c}{cut}" for c in self.columns)


@dataclass(frozen=True)
class FieldValues:
    """One side's values: per field a list of normalised strings, a float (n, d) array or
    packed Bloom filters; per blocking key a list of key strings."""

    fields: tuple[Any, ...]
    keys: tuple[Sequence[str], ...] = field(default_factory=tuple)

    def __len__(self) -> int:
        return len(self.fields[0]) if self.fields else 0


def _scorer(metric: str) -> Callable[..., Any]:
    """rapidfuzz's normalised distance of a string ``metric`` (``levenshtein``,
    ``jaro-winkler``). rapidfuzz is imported on the first string comparison, not with this
    module: a link of numbers or Bloom filters never loads it (8-16 ms here)."""
    from rapidfuzz.distance import JaroWinkler, Levenshtein

    scorers: dict[str, Callable[..., Any]] = {
        "levenshtein": Levenshtein.normalized_distance,
        "jaro-winkler": JaroWinkler.normalized_distance,
    }
    return scorers[metric]


def _metric(spec: FieldSpec) -> str:
    """The field's metric; a field without one is a Fellegi–Sunter link's, resolved from its
    column before any distance is computed."""
    if spec.metric is None:
        raise ConfigError(f"field {list(spec.on)} has no `metric`: give one, or link with "
                          "model = \"fellegi-sunter\"")
    return spec.metric


def _pair_string(metric: str, a: str, b: str) -> float:
    """The per-pair reference of the string metrics (used by :func:`brute_fields`)."""
    if metric == "date":
        from vflink.linkage.encoding.dates import token_dice

        return 1.0 - token_dice(a, b)
    if metric == "exact":
        return 0.0 if a == b else 1.0
    if metric == "token-set":
        from rapidfuzz import fuzz

        return 1.0 - fuzz.token_set_ratio(a, b) / 100.0
    return float(_scorer(metric)(a, b))


def _string_matrix(metric: str, a: Sequence[str], b: Sequence[str],
                   workers: int) -> npt.NDArray[np.float32]:
    if metric == "exact":
        return (np.asarray(a, dtype=object)[:, None] != np.asarray(b, dtype=object)[None, :]
                ).astype(np.float32)
    if metric == "date":  # token Dice (raw dates: privacy off only), each date parsed once
        from vflink.linkage.encoding.dates import set_dice, token_sets

        ta, tb = token_sets(a), token_sets(b)
        return np.asarray([[1.0 - set_dice(x, y) for y in tb] for x in ta],
                          dtype=np.float32).reshape(len(a), len(b))
    from rapidfuzz import fuzz, process

    if metric == "token-set":
        sim = process.cdist(a, b, scorer=fuzz.token_set_ratio, dtype=np.float32,
                            workers=workers)
        return np.asarray(1.0 - sim / 100.0, dtype=np.float32)
    return np.asarray(process.cdist(a, b, scorer=_scorer(metric), dtype=np.float32,
                                    workers=workers), dtype=np.float32)


def _raw_numeric(metric: str, a: Any, b: Any) -> FloatArray:
    if metric == "haversine":
        return haversine_distances(a, b)
    if metric == "hamming":
        # Dice distance |a ⊕ b| / (|a| + |b|) of packed filters, on 64-bit words.
        wa, wb = packed_words(a), packed_words(b)
        pa = np.bitwise_count(wa).sum(axis=1, dtype=np.int64)
        pb = np.bitwise_count(wb).sum(axis=1, dtype=np.int64)
        ham = np.zeros((wa.shape[0], wb.shape[0]), dtype=np.int64)
        for w in range(wa.shape[1]):
            ham += np.bitwise_count(wa[:, w, None] ^ wb[None, :, w])
        total = np.maximum(pa[:, None] + pb[None, :], 1)
        return np.asarray(ham / total, dtype=np.float64)
    return euclidean_distances(a, b)


def _field_matrix(spec: FieldSpec, scale: float, a: Any, b: Any,
                  workers: int) -> npt.NDArray[np.float32]:
    if spec.kind == "string":
        return _string_matrix(_metric(spec), a, b, workers)
    d = _raw_numeric(_metric(spec), a, b)
    if spec.metric == "hamming":
        return d.astype(np.float32)
    return (d / (d + scale)).astype(np.float32)


def _take(values: Any, rows: npt.NDArray[np.int64]) -> Any:
    if isinstance(values, np.ndarray):
        return values[rows]
    return [values[int(i)] for i in rows]


def field_scales(specs: Sequence[FieldSpec], primary: FieldValues, secondary: FieldValues, *,
                 sample: int = 500, seed: int = 0) -> tuple[float, ...]:
    """Each numeric field's ``scale``: the given one, or the median distance from a seeded
    sample of primary records to their nearest secondary record on that field."""
    out: list[float] = []
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(len(primary), size=min(sample, len(primary)), replace=False))
    for f, spec in enumerate(specs):
        if spec.scale is not None or spec.kind != "numeric":
            out.append(float(spec.scale or 1.0))
            continue
        a = _take(primary.fields[f], rows)
        b = secondary.fields[f]
        step = max(1, _BUDGET // (8 * max(1, len(b))))
        nearest = np.concatenate([_raw_numeric(_metric(spec), a[i:i + step], b).min(axis=1)
                                  for i in range(0, len(a), step)])
        med = float(np.median(nearest))
        out.append(med if med > 0 else 1.0)
    return tuple(out)


def _median_size(spec: FieldSpec, values: Any) -> float:
    """The median size of one side's present values in a field: set bits of a Bloom filter,
    characters of a string (0 when no value is present)."""
    if spec.metric == "hamming":
        sizes = np.bitwise_count(packed_words(values)).sum(axis=1, dtype=np.int64)
    else:
        sizes = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
    sizes = sizes[sizes > 0]
    return float(np.median(sizes)) if sizes.size else 0.0


def field_resolution(specs: Sequence[FieldSpec], scales: Sequence[float],
                     primary: FieldValues, secondary: FieldValues) -> float:
    """The distance step r at which FedSim's greedy attack works on the weighted distance D.

    Theorem 2 is about Bloom filters: its proof (App. A.2, Eq. 10) succeeds when the attacker
    rounds its estimate to the true *integer* Hamming distance, i.e. resolves the distance to
    within half of one bit. D = Σ_f w_f·d_f / W lies in [0, 1]; one bit of field f's filter
    moves its Dice distance |a ⊕ b| / (|a| + |b|) by about 1 / (|a| + |b|), so D by
    u_f = w_f / (W·(|a_f| + |b_f|)). An attacker who knew every other field's distance would
    still have to resolve D to within u_f / 2 to recover field f's filter, so the easiest
    field's step, r = max_f u_f, is where the attack works; Theorem 2 is applied on that scale
    (σ0 / r: the spread of D counted in bits). |a| + |b| is taken at the median filters of the
    two tables: a record with sparser filters (a very short string) is proportionally more
    exposed. Fields compared in clear (privacy off) use their own step: one character of a
    string (1 / median length; 1 for ``exact``) and, for numbers, one unit of the raw distance
    at the field's ``scale`` (d/(d + s) moves by 1/(4s) there), capped at the field's range.
    """
    total = float(sum(spec.weight for spec in specs))
    step = 0.0
    for f, spec in enumerate(specs):
        if spec.metric == "exact":
            unit = 1.0
        elif spec.kind == "numeric":
            unit = min(1.0, 1.0 / (4.0 * scales[f])) if scales[f] > 0 else 1.0
        else:  # Bloom filters (bits) and strings (characters)
            size = _median_size(spec, primary.fields[f]) + _median_size(spec, secondary.fields[f])
            if spec.metric != "hamming":
                size /= 2.0  # Levenshtein normalises by the longer string, not by the sum
            unit = 1.0 / size if size >= 1.0 else 1.0
        step = max(step, spec.weight / total * unit)
    return step


def _present(spec: FieldSpec, values: Any) -> npt.NDArray[np.bool_] | None:
    """Which records have a value in a field (None: all of them). An empty string, or an
    empty Bloom filter, is a missing value."""
    if spec.kind == "string":
        return np.fromiter((bool(v) for v in values), dtype=bool, count=len(values))
    if spec.metric == "hamming":
        return np.asarray(np.asarray(values).any(axis=1), dtype=bool)
    return None


def _combined(specs: Sequence[FieldSpec], scales: Sequence[float], primary: FieldValues,
              secondary: FieldValues, rows: npt.NDArray[np.int64], cols: Any,
              workers: int) -> npt.NDArray[np.float32]:
    """Weighted mean of the fields' normalised distances. A field missing on either side of a
    pair is left out of that pair's mean (its weight too), as record-linkage comparisons
    usually treat missing values: no evidence either way; a pair with no field in common is
    at distance 1."""
    num: npt.NDArray[np.float32] | None = None
    den: npt.NDArray[np.float32] | None = None
    for f, spec in enumerate(specs):
        a = _take(primary.fields[f], rows)
        b = secondary.fields[f] if cols is None else _take(secondary.fields[f], cols)
        m = _field_matrix(spec, scales[f], a, b, workers)
        w = np.float32(spec.weight)
        pa, pb = _present(spec, a), _present(spec, b)
        if pa is None or pb is None or (pa.all() and pb.all()):
            weight: Any = w
            m *= w
        else:
            weight = (pa[:, None] & pb[None, :]).astype(np.float32) * w
            m *= weight
        num = m if num is None else num + m
        den = (np.full(m.shape, weight, dtype=np.float32) if den is None else den + weight)
    if num is None or den is None:
        raise ConfigError("linkage needs at least one field")
    empty = den <= 0
    out = num / np.where(empty, np.float32(1.0), den)
    out[empty] = 1.0
    return np.asarray(out, dtype=np.float32)


def _check(specs: Sequence[FieldSpec], primary: FieldValues, secondary: FieldValues,
           k: int) -> None:
    if not specs:
        raise ConfigError("linkage needs at least one field")
    for side, v in (("primary", primary), ("secondary", secondary)):
        if len(v.fields) != len(specs):
            raise DataError(f"{side} has values for {len(v.fields)} field(s), expected "
                            f"{len(specs)}")
        if len(v) == 0:
            raise DataError(f"{side} identifiers are empty (0 rows)")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1 or k > len(secondary):
        raise DataError(f"`top_k` must be an int in [1, {len(secondary)}], got {k!r}")


def _rows_topk(rows: npt.NDArray[np.int64], cols: npt.NDArray[np.int64],
               dist: npt.NDArray[np.float64], n: int, k: int,
               resolution: float = 1.0) -> Neighbours:
    """Top-K per primary row from (row, col, distance) triples; rows with fewer than K
    candidates are padded with index −1 and NaN distance (no link)."""
    order = np.lexsort((cols, dist, rows))
    rows, cols, dist = rows[order], cols[order], dist[order]
    starts = np.searchsorted(rows, np.arange(n))
    rank = np.arange(len(rows)) - starts[rows]
    keep = rank < k
    idx = np.full((n, k), -1, dtype=np.int64)
    out = np.full((n, k), np.nan)
    idx[rows[keep], rank[keep]] = cols[keep]
    out[rows[keep], rank[keep]] = dist[keep]
    return Neighbours(idx, out, exact=True, resolution=resolution)


def search_fields(specs: Sequence[FieldSpec], primary: FieldValues, secondary: FieldValues,
                  k: int, *, blocking: Sequence[Blocking] = (),
                  scales: Sequence[float] | None = None, workers: int = -1) -> Neighbours:
    """Top-K secondary records of every primary record by the weighted field distance.

    Without ``blocking`` every pair is compared (exact top-K). With blocking, only pairs that
    share at least one key are; a primary record with fewer than K candidates gets index −1
    (no link) in the remaining places. Ties are broken by the lower secondary index.
    """
    _check(specs, primary, secondary, k)
    scales = tuple(scales) if scales is not None else field_scales(specs, primary, secondary)
    n, m = len(primary), len(secondary)
    from vflink.linkage.search import _topk_from_matrix

    if not blocking:
        dist = np.empty((n, k), dtype=np.float64)
        idx = np.empty((n, k), dtype=np.int64)
        step = max(1, _BUDGET // (16 * len(specs) * m))
        for start in range(0, n, step):
            rows = np.arange(start, min(n, start + step), dtype=np.int64)
            d = _combined(specs, scales, primary, secondary, rows, None, workers)
            dist[rows], idx[rows] = _topk_from_matrix(d.astype(np.float64), k)
        return Neighbours(idx, dist, exact=True,
                          resolution=field_resolution(specs, scales, primary, secondary))
    if len(primary.keys) != len(blocking) or len(secondary.keys) != len(blocking):
        raise DataError("blocking keys are missing from the identifier values")
    found_r: list[npt.NDArray[np.int64]] = []
    found_c: list[npt.NDArray[np.int64]] = []
    found_d: list[npt.NDArray[np.float64]] = []
    for b in range(len(blocking)):
        keys_p = np.asarray(primary.keys[b], dtype=object)
        keys_s = np.asarray(secondary.keys[b], dtype=object)
        codes, uniques = _factorize(np.concatenate([keys_p, keys_s]))
        cp, cs = codes[:n], codes[n:]
        order_s = np.argsort(cs, kind="stable")
        bounds = np.searchsorted(cs[order_s], np.arange(len(uniques) + 1))
        order_p = np.argsort(cp, kind="stable")
        bounds_p = np.searchsorted(cp[order_p], np.arange(len(uniques) + 1))
        for code in range(len(uniques)):
            if uniques[code] == "":
                continue  # an empty key blocks nothing together
            rows = order_p[bounds_p[code]:bounds_p[code + 1]].astype(np.int64)
            cols = order_s[bounds[code]:bounds[code + 1]].astype(np.int64)
            if rows.size == 0 or cols.size == 0:
                continue
            # A skewed block (one common surname, say) is split into work packages of at
            # most BLOCK_COMPARISONS pairs (as anonlink and Splink do), and each
            # package keeps only its rows' top-K: the K best pairs of a row over all its
            # blocks are among the union of its per-block top-Ks (ties: lower secondary
            # index, as `cols` ascends), so the result is the one of keeping every pair,
            # in memory of rows x K instead of rows x block size.
            kk = min(k, cols.size)
            step = max(1, BLOCK_COMPARISONS // cols.size)
            for start in range(0, rows.size, step):
                piece = rows[start:start + step]
                pair_d = _combined(specs, scales, primary, secondary, piece, cols, workers
                                   ).astype(np.float64)
                if kk < cols.size:
                    best, pos = _topk_from_matrix(pair_d, kk)
                    found_r.append(np.repeat(piece, kk))
                    found_c.append(cols[pos].ravel())
                    found_d.append(best.ravel())
                else:
                    found_r.append(np.repeat(piece, cols.size))
                    found_c.append(np.tile(cols, piece.size))
                    found_d.append(pair_d.ravel())
    resolution = field_resolution(specs, scales, primary, secondary)
    if not found_r:
        return _rows_topk(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0), n, k,
                          resolution)
    rows_a = np.concatenate(found_r)
    cols_a = np.concatenate(found_c)
    dist_a = np.concatenate(found_d)
    _, first = np.unique(rows_a * m + cols_a, return_index=True)  # a pair in two blocks
    return _rows_topk(rows_a[first], cols_a[first], dist_a[first], n, k, resolution)


def _factorize(values: npt.NDArray[Any]) -> tuple[npt.NDArray[np.int64], list[str]]:
    index: dict[str, int] = {}
    codes = np.fromiter((index.setdefault(str(v), len(index)) for v in values),
                        dtype=np.int64, count=len(values))
    return codes, list(index)


def brute_fields(specs: Sequence[FieldSpec], primary: FieldValues, secondary: FieldValues,
                 k: int, *, blocking: Sequence[Blocking] = (),
                 scales: Sequence[float] | None = None) -> Neighbours:
    """Reference: one scorer call per pair and field, the same weighted mean, a full sort."""
    _check(specs, primary, secondary, k)
    scales = tuple(scales) if scales is not None else field_scales(specs, primary, secondary)
    n, m = len(primary), len(secondary)
    rows_l, cols_l, dist_l = [], [], []
    for i in range(n):
        for j in range(m):
            if blocking and not any(
                    primary.keys[b][i] != "" and primary.keys[b][i] == secondary.keys[b][j]
                    for b in range(len(blocking))):
                continue
            num = den = 0.0
            for f, spec in enumerate(specs):
                a, c = primary.fields[f][i], secondary.fields[f][j]
                if spec.kind == "string":
                    if not a or not c:
                        continue  # missing on one side: no evidence
                    v = _pair_string(_metric(spec), a, c)
                else:
                    if spec.metric == "hamming" and not (np.any(a) and np.any(c)):
                        continue
                    raw = float(_raw_numeric(_metric(spec), np.asarray([a]), np.asarray([c]))[0, 0])
                    v = raw if spec.metric == "hamming" else raw / (raw + scales[f])
                num += spec.weight * v
                den += spec.weight
            d = num / den if den > 0 else 1.0
            rows_l.append(i)
            cols_l.append(j)
            dist_l.append(d)
    return _rows_topk(np.asarray(rows_l, dtype=np.int64), np.asarray(cols_l, dtype=np.int64),
                      np.asarray(dist_l, dtype=np.float64), n, k,
                      field_resolution(specs, scales, primary, secondary))
