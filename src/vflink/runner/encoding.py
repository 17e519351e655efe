"""How identifiers are encoded for a linkage: the encoding every data party applies (one
identifier or several fields), the metric the coordinator searches with, and the private
defaults (keyed Bloom filters, FedSim App. I; the noise of Theorem 2).

Shared by the link pipeline's encode and compare stages (:mod:`vflink.runner.link`) and a
run's alignment stage (:mod:`vflink.runner.prepare`); no party is built here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from vflink.errors import ConfigError
from vflink.linkage import BloomConfig, GeoBloomConfig, NumericRange
from vflink.linkage.fields import Blocking, FieldSpec, auto_metric, column_key_kind, key_kind
from vflink.linkage.privacy import DEFAULT_FALLBACK_SIGMA, DEFAULT_TAU
from vflink.parties.linking import LinkField, identifier_values
from vflink.protocol import EncodingSpec, FieldComparison

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ENCODINGS", "LINK_METRICS", "PRIVACY", "blocking_plan", "compared_as",
           "default_noise",
           "describe_fields", "encoding_for", "encoding_summary", "federal_spec",
           "field_encodings", "fields_encoder", "identifier_kind", "link_fields",
           "resolve_fields", "resolve_privacy"]

#: Metrics a user may ask for; ``hamming`` means Bloom filters (FedSim App. I).
LINK_METRICS = ("euclidean", "haversine", "hamming", "levenshtein")


def default_noise(tau: float | None, sigma: float | None, *, private: bool,
                  mode: str) -> tuple[float | None, float | None]:
    """The (tau, sigma) of a link: the given ones, or the private default when identifiers
    are private and neither is given: τ = :data:`~vflink.linkage.privacy.DEFAULT_TAU` (FedSim
    Theorem 2), with σ = ``DEFAULT_FALLBACK_SIGMA`` where the data cannot reach it (both are
    sent; :func:`~vflink.linkage.soft.soft_linkage` picks). Exact-mode links carry no
    distances and get no noise; ``tau = 1`` / ``sigma = 0`` is the explicit opt-out."""
    if private and mode != "exact" and tau is None and sigma is None:
        return DEFAULT_TAU, DEFAULT_FALLBACK_SIGMA
    return tau, sigma


#: What reaches the coordinator under each encoding (for summaries).
ENCODINGS = {
    "hmac-sha256": "keyed hashes (HMAC-SHA256) of the exact keys",
    "bloom": "keyed Bloom filters of the identifiers (FedSim App. I)",
    "raw": "RAW identifier values (privacy off)",
    "string": "RAW identifier strings (privacy off)",
}


PRIVACY = ("bloom", "off")


def resolve_privacy(privacy: str | None, bloom: bool | None = None) -> str:
    """``"bloom"`` unless raw identifiers were asked for explicitly (``privacy="off"`` or
    ``bloom=False``): private by default."""
    if privacy is not None and privacy not in PRIVACY:
        raise ConfigError(f"`privacy` must be one of {', '.join(PRIVACY)}, got {privacy!r}")
    if privacy is not None and bloom is not None and (privacy == "bloom") != bool(bloom):
        raise ConfigError(f"--bloom contradicts --privacy {privacy}; give one of them")
    if privacy is not None:
        return privacy
    return "off" if bloom is False else "bloom"


def encoding_summary(encoder: str, secret_source: str = "") -> dict[str, str]:
    """Which encoding reached the coordinator, for a run's or a linkage's summary."""
    out = {"encoding": encoder, "sent_to_coordinator": ENCODINGS.get(encoder, encoder)}
    if encoder in ("hmac-sha256", "bloom") and secret_source:
        out["secret"] = secret_source
    return out


def identifier_kind(frame: pd.DataFrame, columns: Sequence[str], metric: str) -> str:
    if metric in ("euclidean", "haversine"):
        return "numeric"
    if metric == "levenshtein":
        return "string"
    import pandas as pd

    numeric = all(pd.api.types.is_numeric_dtype(frame[c]) for c in columns)
    return "numeric" if numeric else "string"


def encoding_for(metric: str, *, bloom: bool,
                 sides: Sequence[tuple[pd.DataFrame, Sequence[str]]],
                 bloom_config: BloomConfig | None = None,
                 margin: float = 0.01, sources: Sequence[str] = (),
                 geo_config: GeoBloomConfig | None = None) -> tuple[EncodingSpec, str]:
    """The encoding spec every data party uses, and the metric the coordinator searches with.

    ``sides`` are the (table, identifier columns) the value range is fitted on, primary first.
    ``hamming`` (or ``bloom=True``) means FEDERAL Bloom filters; ``haversine`` with
    ``bloom=True`` means geographic Bloom filters on the whole globe (:func:`bloom_geo`, no
    fitted range); other numeric Bloom filters need an
    agreed value range: the min/max over ``sides`` widened by ``margin`` × range (values outside
    it still encode, with fewer bits set), which every party then uses.
    """
    if metric not in LINK_METRICS:
        raise ConfigError(f"`metric` must be one of {', '.join(LINK_METRICS)}, got {metric!r}")
    bloom = bloom or metric == "hamming"
    kind = identifier_kind(sides[0][0], sides[0][1], metric)
    if not bloom:
        return EncodingSpec(encoder="raw" if kind == "numeric" else "string", kind=kind), metric
    cfg = bloom_config or BloomConfig()
    if kind == "string":
        return EncodingSpec(encoder="bloom", kind="string", params=cfg.params()), "hamming"
    if metric == "haversine":
        # Places on the globe: the range is the whole sphere, fixed and public, so no party's
        # bounding box is revealed, and the encoding resolves ~1 km anywhere
        # (vflink.linkage.encoding.geo).
        geo = geo_config or GeoBloomConfig()
        return EncodingSpec(encoder="bloom", kind="geo", params=geo.params()), "hamming"
    sided = [(frame, columns, sources[i] if i < len(sources) else f"party {i}")
             for i, (frame, columns) in enumerate(sides)]
    return federal_spec(cfg, sided, margin=margin), "hamming"


def federal_spec(cfg: BloomConfig, sides: Sequence[tuple[pd.DataFrame, Sequence[str], str]], *,
                 margin: float) -> EncodingSpec:
    """FEDERAL numeric filters (App. I) on the agreed range: the min/max of the finite values of
    every (table, columns, source) in ``sides``, widened by ``margin`` × range. A resolution
    too fine for that range fails here, once, before anything is encoded."""
    tables = []
    for frame, columns, source in sides:
        values = np.asarray(identifier_values(frame, columns, "numeric", source=source))
        tables.append(values[np.isfinite(values).all(axis=1)])
    ranges = NumericRange.fit(*tables, margin=margin)
    cfg.centres_per_dimension(ranges)
    return EncodingSpec(encoder="bloom", kind="numeric", params=cfg.params(), low=ranges.low,
                        high=ranges.high)


def resolve_fields(fields: Sequence[FieldSpec], frame: pd.DataFrame) -> tuple[FieldSpec, ...]:
    """Fields with their ``metric``: given, or (a Fellegi–Sunter link's field without one)
    chosen from the primary's column by :func:`~vflink.linkage.fields.auto_metric`; a field of
    two numeric columns without a metric is compared by Euclidean distance."""
    out = []
    for spec in fields:
        if spec.metric is not None:
            out.append(spec)
            continue
        cols = [c for c in spec.on if c in frame.columns]
        if len(spec.on) == 1 and cols:
            metric = auto_metric(frame[cols[0]].tolist())
        elif len(cols) == len(spec.on) and all(
                auto_metric(frame[c].tolist()) == "euclidean" for c in cols):
            metric = "euclidean"
        else:
            metric = "jaro-winkler"
        out.append(dataclasses.replace(spec, metric=metric))
    return tuple(out)


def _field_kind(spec: FieldSpec, frame: pd.DataFrame, columns: Sequence[str]) -> str:
    """``"string"``, ``"date"`` or ``"numeric"``: by the metric, and for ``hamming`` (Bloom
    filters of whatever the columns hold) by the columns' type, as for one field."""
    if spec.metric == "date":
        return "date"
    if spec.kind == "string":
        return "string"
    if spec.metric in ("euclidean", "haversine"):
        return "numeric"
    missing = [c for c in columns if c not in frame.columns]
    return "string" if missing else identifier_kind(frame, columns, "hamming")


def field_encodings(fields: Sequence[FieldSpec], *, private: bool, primary: pd.DataFrame,
                    secondary: pd.DataFrame | None = None, margin: float = 0.01,
                    bloom_config: BloomConfig | None = None,
                    geo_config: GeoBloomConfig | None = None,
                    sources: Sequence[str] = ()) -> tuple[EncodingSpec, ...]:
    """The encoding every data party applies to each field, the analogue of
    :func:`encoding_for` for several fields.

    Private (the default): keyed Bloom filters for every field, q-gram filters for strings,
    geographic filters on the whole globe for ``haversine`` (no party's bounding box), and
    FEDERAL filters (App. I) for other numbers on a range fitted on ``primary`` (and
    ``secondary`` when both tables are at hand, as in ``vflink link``) widened by ``margin``.
    With ``private=False`` the normalised strings or raw numbers, except for ``hamming``
    fields, which always mean Bloom filters as for one field.
    """
    cfg = bloom_config or BloomConfig()
    out: list[EncodingSpec] = []
    for spec in fields:
        kind = _field_kind(spec, primary, spec.on)
        bloom = private or spec.metric == "hamming"
        if kind == "date":  # token filters of dates (vflink.linkage.encoding.dates)
            out.append(EncodingSpec(encoder="bloom", kind="date", params=cfg.params())
                       if bloom else EncodingSpec(encoder="string", kind="date"))
        elif kind == "string":
            out.append(EncodingSpec(encoder="bloom", kind="string", params=cfg.params())
                       if bloom else EncodingSpec(encoder="string", kind="string",
                                                  params={"normalize": True}))
        elif not bloom:
            out.append(EncodingSpec(encoder="raw", kind="numeric",
                                    params={"geo": True} if spec.metric == "haversine" else {}))
        elif spec.metric == "haversine":
            # Places on the globe: the range is the whole sphere, fixed and public.
            geo = geo_config or GeoBloomConfig()
            out.append(EncodingSpec(encoder="bloom", kind="geo", params=geo.params()))
        else:
            sides = [(primary, spec.on, sources[0] if sources else "primary")]
            if secondary is not None:
                sides.append((secondary, spec.columns_s,
                              sources[1] if len(sources) > 1 else "secondary"))
            out.append(federal_spec(cfg, sides, margin=margin))
    return tuple(out)


def link_fields(fields: Sequence[FieldSpec], encodings: Sequence[EncodingSpec]
                ) -> tuple[LinkField, ...]:
    """The primary's plan of a multi-field link: columns on each side, encoding, and how the
    coordinator compares it (Dice distance of Bloom filters, or the field's own raw metric
    and scale when privacy is off)."""
    if len(fields) != len(encodings):
        raise ConfigError(f"{len(fields)} field(s) but {len(encodings)} encoding(s)")
    out = []
    for spec, enc in zip(fields, encodings, strict=True):
        bloom = enc.encoder == "bloom"
        kind = "geo" if enc.kind == "geo" or enc.params.get("geo") else enc.kind
        out.append(LinkField(
            on=spec.on, secondary_on=spec.columns_s, spec=enc,
            comparison=FieldComparison(
                metric="hamming" if bloom else str(spec.metric), weight=float(spec.weight),
                scale=None if bloom else spec.scale, levels=tuple(spec.levels or ()),
                # term frequencies sharpen exact agreement on values of skewed frequency
                # (names, places, dates); numbers and places are near-unique, rarely equal
                tf=spec.tf if spec.tf is not None else kind in ("string", "date"),
                kind=kind)))
    return tuple(out)


def compared_as(fields: Sequence[FieldSpec], encodings: Sequence[EncodingSpec]) -> list[str]:
    """What each field was really compared with, for the summary: the configured metric
    applies only when its values reached the coordinator (privacy off); keyed Bloom filters
    are compared by Dice distance whatever the metric (it selects the encoding)."""
    out = []
    for spec, enc in zip(fields, encodings, strict=True):
        cols = ",".join(spec.on)
        if enc.encoder != "bloom":
            out.append(f"{cols}: {spec.metric} on the raw values")
            continue
        what = {"string": "keyed q-gram Bloom filters", "date": "keyed date-token Bloom filters",
                "geo": "keyed geographic Bloom filters",
                "numeric": "keyed FEDERAL numeric Bloom filters"}.get(enc.kind, enc.kind)
        out.append(f"{cols}: Dice distance of {what} ({spec.metric} asked)")
    return out


def describe_fields(fields: Sequence[FieldSpec], blocking: Sequence[Blocking] = ()) -> str:
    """``1·token-set(name) + 0.5·haversine(lat,lon) | blocking: postcode, surname[:2]``."""
    described = " + ".join(f.describe() for f in fields)
    if blocking:
        described += " | blocking: " + ", ".join(
            b.describe() for b in blocking)
    return described



def fields_encoder(encodings: Sequence[EncodingSpec]) -> str:
    """The summary's ``encoding`` of a multi-field link: ``bloom`` when every field is a keyed
    Bloom filter, else ``raw`` (some field's raw values reached the coordinator)."""
    return "bloom" if all(e.encoder == "bloom" for e in encodings) else "raw"


def blocking_plan(blocking: Sequence[Blocking], fields: Sequence[FieldSpec],
                  encodings: Sequence[EncodingSpec], primary: pd.DataFrame,
                  secondary: pd.DataFrame | None = None
                  ) -> tuple[tuple[tuple[str, ...], ...], tuple[tuple[int, ...], ...]]:
    """How each blocking rule's columns are normalised, and what each rule requires.

    ``kinds[r]``: per column of rule r, the normalisation of its key
    (:func:`~vflink.linkage.fields.key_text`): a field's column gets its field's (dates
    parsed, numbers canonical, strings folded; phone numbers as digits), any other column the
    kind its values show on both tables (:func:`~vflink.linkage.fields.key_kind`), so that
    ``19560409`` and ``09/04/1956`` block together. ``atoms[r]``: per column, the index of the
    field whose whole value the column is (no prefix, the same columns on both sides, the same
    normalisation: the rule then agrees exactly when the field does), else a negative number
    (−1 − the column's number among such columns): public structure the coordinator uses to
    estimate what the rules miss."""
    by_columns = {(spec.on, spec.columns_s): f for f, spec in enumerate(fields)
                  if len(spec.on) == 1}
    others: dict[tuple[str, str], int] = {}
    shown: dict[tuple[str, str], str] = {}  # each column pair's kind, read once
    kinds: list[tuple[str, ...]] = []
    atoms: list[tuple[int, ...]] = []
    for rule in blocking:
        rule_kinds: list[str] = []
        rule_atoms: list[int] = []
        for c, c_s in zip(rule.columns, rule.columns_s, strict=True):
            if (c, c_s) not in shown:
                values = primary[c].tolist() if c in primary.columns else []
                if secondary is not None and c_s in secondary.columns:
                    values += secondary[c_s].tolist()
                shown[(c, c_s)] = key_kind(values)
            f = by_columns.get(((c,), (c_s,)))
            kind = column_key_kind(None if f is None else encodings[f].kind, shown[(c, c_s)])
            rule_kinds.append(kind)
            if f is not None and not rule.prefix and kind != "digits":
                rule_atoms.append(f)
            else:
                rule_atoms.append(-1 - others.setdefault((c, c_s), len(others)))
        kinds.append(tuple(rule_kinds))
        atoms.append(tuple(rule_atoms))
    return tuple(kinds), tuple(atoms)
