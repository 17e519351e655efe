"""Soft linkage between two tables, run as parties in this process (FedSim §4.1, §4.3, §5).

The primary and the secondary encode their own identifiers and send only the encodings to the
coordinator; the coordinator searches the top-K, normalises and noises the similarities and
returns indices to both and similarities to the primary only. The encodings are chosen in
:mod:`vflink.runner.encoding`; multi-field linkage is :mod:`vflink.runner.field_link`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from vflink._files import atomic_open
from vflink.data.parts import write_columns
from vflink.data.schema import PartySchema
from vflink.data.table import PartyTable, report, show_value
from vflink.errors import ConfigError, DataError, LinkageError
from vflink.linkage import BloomConfig, GeoBloomConfig, SearchOptions, SoftLinkage
from vflink.linkage.improvement import improvement_estimates
from vflink.linkage.privacy import describe_protection
from vflink.linkage.validation import validate_identifiers
from vflink.parties.coordinator import CoordinatorParty
from vflink.parties.link_peer import LinkingPeer
from vflink.parties.linking import AlignmentInitiator, identifier_values
from vflink.parties.policy import PartyPolicy
from vflink.runner.encoding import (
    default_noise,
    encoding_for,
    encoding_summary,
    identifier_kind,
    resolve_privacy,
)
from vflink.runner.local import local_roles, secret_with_source
from vflink.transport import InProcessHub, Transcript
from vflink.types import MISSING, Alignment, Compute

__all__ = ["COORDINATOR", "LINK_COLUMNS", "LINK_COLUMNS_MODEL", "VIEWS", "LinkOutcome",
           "check_top_k", "linkage_columns", "linkage_table", "links_metadata",
           "primary_probability", "run_linkage", "write_links"]

log = logging.getLogger(__name__)

COORDINATOR = "coordinator"


@dataclass(frozen=True)
class LinkOutcome:
    """The coordinator's linkage, the primary's alignment and the figures to report."""

    linkage: SoftLinkage
    alignment: Alignment
    seconds: float
    sizes: dict[str, int]
    privacy: str
    search_metric: str
    improvement: dict[str, float] = field(default_factory=dict)
    communication: dict[str, dict[str, int]] = field(default_factory=dict)
    encoding: str = ""
    secret_source: str = ""
    skipped_rows: dict[str, int] = field(default_factory=lambda: {"primary": 0, "secondary": 0})
    #: a multi-field link's comparison of each field as really made (metric or encoding)
    fields_compared: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        lk = self.linkage
        extra: dict[str, Any] = {}
        if self.fields_compared:
            extra["fields_compared"] = self.fields_compared
        if lk.model:
            extra["model"] = {k: v for k, v in lk.model.items() if k != "released"}
        described = LINK_COLUMNS_MODEL if lk.matches is not None else LINK_COLUMNS
        extra["view"] = "operator"
        extra["columns"] = dict(described)
        return {
            "sizes": self.sizes, "seconds": round(self.seconds, 3), "metric": lk.metric,
            "privacy": self.privacy, "top_k": lk.k, "mode": lk.mode, "mu0": lk.mu0,
            "sigma0": lk.sigma0, "sigma": lk.sigma, "tau": lk.tau, "epsilon": lk.epsilon,
            "delta": lk.delta, "epsilon_valid": lk.epsilon_valid,
            "resolution": lk.resolution, "similarity_protection": self.protection(),
            "exact_search": lk.exact_search, "recall": lk.recall,
            "improvement_delta": self.improvement, "communication": self.communication,
            **encoding_summary(self.encoding, self.secret_source),
            "skipped_rows": self.skipped_rows, **extra,
        }

    def protection(self) -> str:
        """The similarities' protection in words (FedSim Theorems 1-2)."""
        lk = self.linkage
        if lk.mode == "exact":
            return "similarities: none needed (exact matches only, no distance information)"
        return describe_protection(lk.sigma, lk.tau, lk.epsilon, lk.delta)


def run_linkage(primary: pd.DataFrame, secondary: pd.DataFrame, *, on: Sequence[str],
                secondary_on: Sequence[str] | None = None, metric: str, top_k: int,
                bloom: bool | None = None, mode: str = "soft", tau: float | None = None,
                sigma: float | None = None, delta: float = 1e-5, secret: bytes | None = None,
                seed: int | None = None, search: SearchOptions | None = None,
                bloom_config: BloomConfig | None = None, primary_source: str = "primary",
                secondary_source: str = "secondary",
                transcript: Transcript | None = None, privacy: str | None = None,
                empty: str = "error", geo_config: GeoBloomConfig | None = None,
                compute: Compute | None = None) -> LinkOutcome:
    """Link ``primary`` to ``secondary`` through a coordinator, all parties in this process.

    With ``compute`` (this process's engine) every party's chunked stages run on it:
    the data parties' encoding and the coordinator's top-K search; the links are the same.

    Private by default: identifiers reach the coordinator as keyed Bloom filters unless
    ``privacy="off"`` (or ``bloom=False``) is given explicitly, and then the similarities get
    the noise of the default greedy-attack bound τ = ``DEFAULT_TAU`` (FedSim Theorem 2; see
    :func:`default_noise`) unless ``tau`` or ``sigma`` is given (``tau=1`` / ``sigma=0``: none).

    ``empty`` is the policy for records whose identifier is empty (a blank string, or a
    missing coordinate): ``"error"`` stops with a message naming the file, the column and the
    row; ``"skip"`` links the other records, and a skipped record keeps its position, gets no
    link (index −1) and is counted in the summary's ``skipped_rows``.
    """
    start = time.perf_counter()
    bloom = resolve_privacy(privacy, bloom) == "bloom"  # private unless explicitly off
    tau, sigma = default_noise(tau, sigma, private=bloom, mode=mode)
    on = tuple(on)
    secondary_on = tuple(secondary_on or on)
    if len(on) != len(secondary_on):
        raise ConfigError(f"--on names {len(on)} column(s) but --secondary-on names "
                          f"{len(secondary_on)}; each primary identifier needs a counterpart")
    if empty not in ("error", "skip"):
        raise ConfigError(f"`empty` must be one of error, skip, got {empty!r}")
    check_top_k(top_k, len(secondary), secondary_source)
    kind = "string" if metric == "levenshtein" else (
        "numeric" if metric in ("euclidean", "haversine")
        else identifier_kind(primary, on, metric))
    keep_p = _check_empty(primary, on, kind, primary_source, empty)
    keep_s = _check_empty(secondary, secondary_on, kind, secondary_source, empty)
    if not (keep_p.all() and keep_s.all()):
        # Checked here, on the whole tables: the rows of the linkage below are renumbered, and
        # a bad cell must be named by its row in the file, not by its renumbered row.
        _check_kept(primary, on, kind, metric, primary_source, keep_p)
        _check_kept(secondary, secondary_on, kind, metric, secondary_source, keep_s)
        inner = run_linkage(
            primary[keep_p].reset_index(drop=True), secondary[keep_s].reset_index(drop=True),
            on=on, secondary_on=secondary_on, metric=metric, top_k=top_k, bloom=bloom,
            mode=mode, tau=tau, sigma=sigma, delta=delta, secret=secret, seed=seed,
            search=search, bloom_config=bloom_config, primary_source=primary_source,
            secondary_source=secondary_source, transcript=transcript, empty="error",
            geo_config=geo_config, compute=compute)
        return _expand(inner, keep_p, keep_s, start)
    try:
        return _run_linkage(primary, secondary, on=on, secondary_on=secondary_on,
                            metric=metric, top_k=top_k, bloom=bloom, mode=mode, tau=tau,
                            sigma=sigma, delta=delta, secret=secret, seed=seed, search=search,
                            bloom_config=bloom_config, primary_source=primary_source,
                            secondary_source=secondary_source, transcript=transcript,
                            start=start, geo_config=geo_config, compute=compute)
    except DataError as exc:
        # The pure layers name the side ("primary identifiers ..."); the user needs the file.
        text = str(exc)
        for side, source in (("primary", primary_source), ("secondary", secondary_source)):
            if text.startswith(side) and not text.startswith(source):
                raise DataError(f"{source}: {text}") from None
        raise


def _blank(frame: pd.DataFrame, column: str) -> npt.NDArray[np.bool_]:
    values = frame[column]
    missing = values.isna().to_numpy()
    if values.dtype == object or pd.api.types.is_string_dtype(values):
        text = values.astype(object).where(~missing, "")
        missing = missing | np.asarray([not str(v).strip() for v in text], dtype=bool)
    return np.asarray(missing, dtype=bool)


def _check_empty(frame: pd.DataFrame, columns: Sequence[str], kind: str, source: str,
                 policy: str) -> npt.NDArray[np.bool_]:
    """Rows to keep under the empty-identifier policy (raises under ``"error"``).

    A numeric identifier is empty when any of its columns is missing; a string identifier
    when all its columns are blank (several string columns are joined, e.g. first and last
    name, so one blank part still leaves a name to compare).
    """
    present = [c for c in columns if c in frame.columns]
    if not present:
        return np.ones(len(frame), dtype=bool)
    blank = np.stack([_blank(frame, c) for c in present], axis=1)
    empty = blank.any(axis=1) if kind == "numeric" else blank.all(axis=1)
    if empty.any() and policy == "error":
        row = int(np.flatnonzero(empty)[0])
        column = present[int(np.flatnonzero(blank[row])[0])]
        raise DataError(
            f"{source}: identifier column {column!r} is empty at row {row} (line {row + 2} of a "
            f"CSV); {int(empty.sum())} row(s) have an empty identifier. Fill them in, or set "
            f"empty = \"skip\" (--empty skip) to link the other rows and leave these unlinked")
    return np.asarray(~empty, dtype=bool)


def _check_kept(frame: pd.DataFrame, columns: Sequence[str], kind: str, metric: str,
                source: str, keep: npt.NDArray[np.bool_]) -> None:
    """The checks of the numeric identifiers of the rows ``keep`` selects (non-numeric and
    infinite values, coordinates out of range), with every row named by its position in
    ``frame``: one :class:`DataError` listing every problem."""
    if kind != "numeric" or not all(c in frame.columns for c in columns):
        return  # strings need no more checks once the empty ones are skipped
    x = np.asarray(identifier_values(frame, columns, "numeric", source=source))
    problems: list[str] = []

    def first(mask: npt.NDArray[np.bool_], col: int, what: str) -> None:
        rows = np.flatnonzero(mask)
        if rows.size:
            row = int(rows[0])
            problems.append(f"identifier column {columns[col]!r} {what} at row {row} (line "
                            f"{row + 2} of a CSV), value {show_value(x[row, col])}; "
                            f"{rows.size} row(s) in all")

    for col in range(x.shape[1]):
        first(keep & np.isinf(x[:, col]), col, "holds an infinite value")
    if metric == "haversine" and x.shape[1] == 2:
        for col, name, limit in ((0, "latitude", 90.0), (1, "longitude", 180.0)):
            first(keep & np.isfinite(x[:, col]) & (np.abs(x[:, col]) > limit), col,
                  f"({name}) is outside [-{limit:g}, {limit:g}]")
    if problems:
        raise report(source, problems)


def _expand(inner: LinkOutcome, keep_p: npt.NDArray[np.bool_], keep_s: npt.NDArray[np.bool_],
            start: float) -> LinkOutcome:
    """Put a linkage of the non-empty rows back at the rows' original positions."""
    lk = inner.linkage
    rows = np.flatnonzero(keep_p)
    cols = np.flatnonzero(keep_s)
    k = lk.k
    indices = np.full((len(keep_p), k), MISSING, dtype=np.int64)
    distances = np.full((len(keep_p), k), np.nan)
    similarities = np.full((len(keep_p), k), np.nan)
    valid = lk.indices >= 0
    indices[rows] = np.where(valid, cols[np.where(valid, lk.indices, 0)], MISSING)
    distances[rows] = lk.distances
    similarities[rows] = lk.similarities
    linkage = dataclasses.replace(lk, indices=indices, distances=distances,
                                  similarities=similarities, n_secondary=len(keep_s))
    skipped = {"primary": int((~keep_p).sum()), "secondary": int((~keep_s).sum())}
    log.info("skipped %d primary and %d secondary row(s) with an empty identifier",
             skipped["primary"], skipped["secondary"])
    sizes = {**inner.sizes, "primary_rows": len(keep_p), "secondary_rows": len(keep_s)}
    return dataclasses.replace(
        inner, linkage=linkage, alignment=linkage.to_alignment("secondary"),
        seconds=time.perf_counter() - start, sizes=sizes, skipped_rows=skipped)


def _run_linkage(primary: pd.DataFrame, secondary: pd.DataFrame, *, on: tuple[str, ...],
                 secondary_on: tuple[str, ...], metric: str, top_k: int, bloom: bool,
                 mode: str, tau: float | None, sigma: float | None, delta: float,
                 secret: bytes | None, seed: int | None, search: SearchOptions | None,
                 bloom_config: BloomConfig | None, primary_source: str,
                 secondary_source: str, transcript: Transcript | None,
                 start: float, geo_config: GeoBloomConfig | None = None,
                 compute: Compute | None = None) -> LinkOutcome:
    if metric in ("euclidean", "haversine", "levenshtein"):
        # Checked on the raw values here, where both tables are at hand: after Bloom encoding a
        # NaN coordinate or a latitude of 123° could no longer be told apart (in a deployment
        # each data party runs the same check on its own side).
        kind = "string" if metric == "levenshtein" else "numeric"
        validate_identifiers(
            identifier_values(primary, on, kind, source=primary_source),
            identifier_values(secondary, secondary_on, kind, source=secondary_source),
            metric=metric, top_k=top_k)
    spec, search_metric = encoding_for(metric, bloom=bloom,
                                       sides=((primary, on), (secondary, secondary_on)),
                                       bloom_config=bloom_config, geo_config=geo_config,
                                       sources=(primary_source, secondary_source))
    secret_source = "given" if secret is not None else ""
    if spec.encoder == "bloom" and secret is None:
        # derived from the seed when unset (and said so), random without a seed: both data
        # parties are in this process
        secret, secret_source = secret_with_source("VFLINK_SECRET", seed=seed)
    hub = InProcessHub(transcript=transcript)
    # Both tables are this user's: the arguments are the explicit release choice, and any K up
    # to the secondary's rows (checked before any work) is theirs to ask.
    policy = PartyPolicy.permissive(identifiers="bloom" if spec.encoder == "bloom" else "any")
    policy = dataclasses.replace(policy, max_top_k=max(policy.max_top_k, len(secondary)))
    roles = local_roles("primary", ["secondary"])
    coordinator = CoordinatorParty(COORDINATOR, seed=seed, search=search, roles=roles,
                                   policy=policy)
    coordinator.compute = compute
    hub.register(COORDINATOR, coordinator)
    sec_schema = PartySchema(name="secondary", role="secondary", identifiers=secondary_on)
    sec_party = LinkingPeer(PartyTable(sec_schema, secondary, secondary_source),
                            hub.channel("secondary"), secret=secret, roles=roles, policy=policy)
    sec_party.compute = compute
    hub.register("secondary", sec_party)
    initiator = AlignmentInitiator("primary", primary, hub.channel("primary"),
                                   secondaries=("secondary",), identifiers=on, secret=secret,
                                   source=primary_source, policy=policy)
    initiator.compute = compute
    alignment = initiator.align_soft(COORDINATOR, spec, metric=search_metric, top_k=top_k,
                                     mode=mode, tau=tau, sigma=sigma, delta=delta,
                                     session="link")["secondary"]
    return link_outcome(coordinator, alignment, hub, start=start, mode=mode, top_k=top_k,
                        rows=(len(primary), len(secondary)),
                        privacy="bloom" if spec.encoder == "bloom" else "off",
                        search_metric=search_metric, encoding=spec.encoder,
                        secret_source=secret_source)


def link_outcome(coordinator: Any, alignment: Alignment, hub: Any, *, start: float, mode: str,
                 top_k: int, rows: tuple[int, int], privacy: str, search_metric: str,
                 encoding: str, secret_source: str) -> LinkOutcome:
    """What an in-process link returns, once its coordinator holds session ``"link"`` with
    ``"secondary"``: the linkage, sizes, the improvement estimate (§4.3, soft mode), the
    traffic, and how it was made (privacy, search metric, encoding, secret source)."""
    linkage = coordinator.linkage("link", "secondary")
    improvement = improvement_estimates(linkage) if mode == "soft" else {}
    sizes = {"primary_rows": rows[0], "secondary_rows": rows[1], "top_k": top_k,
             "links": int((linkage.indices >= 0).sum())}
    return LinkOutcome(linkage=linkage, alignment=alignment,
                       seconds=time.perf_counter() - start, sizes=sizes,
                       improvement=improvement, communication=hub.counter.snapshot(),
                       privacy=privacy, search_metric=search_metric, encoding=encoding,
                       secret_source=secret_source)


def check_top_k(top_k: int, secondary_rows: int, secondary: str, *,
                where: str = "--top-k") -> None:
    """K against the secondary table, before any encoding or search: each primary record is
    linked to K secondary records, so K cannot exceed them."""
    if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k > secondary_rows:
        raise LinkageError(f"{where} = {top_k} is larger than the secondary table {secondary} "
                           f"({secondary_rows:,} rows): each primary record is linked to K "
                           f"secondary records; give K ≤ {secondary_rows:,}")


#: Who holds each column of the links file: in a deployment the primary receives the indices,
#: ranks, similarities and decisions; the distance and exact match weights stay with the
#: coordinator (they would undo the similarity noise of FedSim Theorem 2).
LINK_COLUMNS = {
    "primary_index": "primary: row of the primary table",
    "secondary_index": "primary: row of the secondary table",
    "rank": "primary: 0 = best link (a model link: the match first)",
    "distance": "coordinator only: the exact field distance; a primary in a deployment never "
                "receives it (it would undo the similarity noise)",
    "similarity": "primary: Eq. 1-normalised, Eq. 2-noised similarity (a model link: of the "
                  "match weight)",
}
#: The columns a model link adds (operator's view; the primary view replaces
#: ``match_probability`` by the primary's own, from the noised similarity).
LINK_COLUMNS_MODEL = {
    **LINK_COLUMNS,
    "match_weight": "coordinator only: the exact Fellegi-Sunter match weight (bits)",
    "match_probability": "operator view: the coordinator's exact probability (the one-to-one "
                         "posterior); primary view: the same posterior of the de-normalised "
                         "noised similarities it received",
    "match": "primary: the decision (probability >= threshold, then one-to-one)",
}
VIEWS = ("operator", "primary")


def links_metadata(columns: Sequence[str], view: str = "operator") -> dict[str, str]:
    """The Parquet metadata of a links file: whose view it is and who holds each column."""
    import json

    return {"vflink.view": view, "vflink.columns": json.dumps(
        {c: LINK_COLUMNS_MODEL.get(c, "") for c in columns}, ensure_ascii=False)}


def primary_probability(linkage: SoftLinkage) -> npt.NDArray[np.float64]:
    """The match probability a primary derives from what it receives: the one-to-one
    posterior of its links' de-normalised noised weights w̃ = μ0 + σ0·s (a post-processing of
    s; :func:`vflink.linkage.fellegi_sunter.one_to_one_posterior` over every link it holds)."""
    from vflink.linkage.fellegi_sunter import one_to_one_posterior

    noised = linkage.mu0 + linkage.sigma0 * linkage.similarities
    valid = (linkage.indices >= 0) & np.isfinite(noised)
    out = np.full(noised.shape, np.nan)
    if valid.any():
        rows = np.nonzero(valid)[0].astype(np.int64)
        out[valid] = one_to_one_posterior(rows, linkage.indices[valid].astype(np.int64),
                                          noised[valid])
    return out


def linkage_columns(linkage: SoftLinkage, *, view: str = "operator"
                    ) -> dict[str, npt.NDArray[Any]]:
    """The columns of the ``vflink link`` output: one entry per (primary record, neighbour).

    ``view="operator"`` (default, an operator who holds both tables and runs every party):
    every column of :data:`LINK_COLUMNS` / :data:`LINK_COLUMNS_MODEL`; ``"primary"``: only
    what the primary receives in a deployment. When every link is present (the usual soft
    linkage) the columns are flat views and ``repeat``/``tile`` instead of a boolean gather
    over the n × K arrays.
    """
    if view not in VIEWS:
        raise ConfigError(f"`view` must be one of {', '.join(VIEWS)}, got {view!r}")
    n, k = linkage.indices.shape
    valid = linkage.indices >= 0
    per_link: dict[str, npt.NDArray[Any]] = {"distance": linkage.distances,
                                            "similarity": linkage.similarities}
    if linkage.matches is not None:
        per_link["match_weight"] = np.asarray(linkage.match_weights)
        per_link["match_probability"] = (np.asarray(linkage.match_probabilities)
                                         if view == "operator" else
                                         primary_probability(linkage))
        per_link["match"] = linkage.matches
    if view == "primary":
        per_link = {c: v for c, v in per_link.items()
                    if not LINK_COLUMNS_MODEL[c].startswith("coordinator")}
    if valid.all():
        out: dict[str, npt.NDArray[Any]] = {
            "primary_index": np.repeat(np.arange(n, dtype=np.int64), k),
            "secondary_index": linkage.indices.astype(np.int64, copy=False).reshape(-1),
            "rank": np.tile(np.arange(k, dtype=np.int64), n),
        }
        for c, v in per_link.items():
            out[c] = (v.reshape(-1) if v.dtype == bool
                      else v.astype(np.float64, copy=False).reshape(-1))
        return out
    rows, ranks = np.nonzero(valid)
    out = {
        "primary_index": rows.astype(np.int64),
        "secondary_index": linkage.indices[valid].astype(np.int64),
        "rank": ranks.astype(np.int64),
    }
    for c, v in per_link.items():
        out[c] = v[valid] if v.dtype == bool else v[valid].astype(np.float64)
    return out


def linkage_table(linkage: SoftLinkage) -> pd.DataFrame:
    """One row per (primary record, neighbour): the ``vflink link`` output format."""
    return pd.DataFrame(linkage_columns(linkage))


def write_links(columns: dict[str, npt.NDArray[Any]], out: Path, *,
                parts: bool | None = None, view: str = "operator") -> None:
    """Write the links (``.parquet`` or ``.csv``) atomically: never a half-written output.

    ``parts``: write a ``.parquet`` output as a partitioned dataset (a directory of parts,
    :mod:`vflink.data.parts`); ``None``: only above ``AUTO_PARTS_ROWS`` links.

    Parquet goes straight from the numpy columns through pyarrow (no DataFrame: building one
    stacks the 14 M house-scale links into blocks first, measured at 1.6 s), compressed with
    LZ4, the fastest of pyarrow's codecs here (0.6 s against 0.8 s for snappy on 14 M rows).
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".parquet":
        # one file, or part by part above a size (vflink.data.parts); the file says
        # whose view it is and who holds each column
        write_columns(columns, out, parts=parts, metadata=links_metadata(list(columns), view))
    else:
        with atomic_open(out, "w", newline="") as fh:
            pd.DataFrame(columns).to_csv(fh, index=False, float_format="%.6g")


