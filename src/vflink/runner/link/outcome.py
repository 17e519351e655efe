"""What a link gives: :class:`LinkOutcome` (the coordinator's linkage, the primary's
alignment, the figures), the columns of the links file and who holds each, and the summary
(``<out>.summary.json``) with each stage's seconds.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from vflink.errors import ConfigError
from vflink.linkage import SoftLinkage
from vflink.linkage.privacy import describe_protection
from vflink.randomness import NOT_PRIVATE
from vflink.runner.encoding import encoding_summary
from vflink.types import Alignment

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["LINK_COLUMNS", "LINK_COLUMNS_MODEL", "VIEWS", "LinkColumns", "LinkOutcome",
           "link_summary", "linkage_columns", "linkage_table", "links_metadata",
           "primary_probability"]


#: How Eq. 1's μ0 and σ0 were computed, as the summary says (:mod:`vflink.linkage.moments`).
MOMENTS = ("exact: the mean and population deviation of the n × K links' distances (Eq. 1), "
           "each rounded once from an exact sum; the same bits whole or in chunks")


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
    #: the noise was seeded (a link's ``seed``): whoever knows the seed regenerates it
    reproducible_noise: bool = False

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
            "moments": MOMENTS, "exact_search": lk.exact_search, "recall": lk.recall,
            "improvement_delta": self.improvement, "communication": self.communication,
            **encoding_summary(self.encoding, self.secret_source),
            "skipped_rows": self.skipped_rows, **extra,
        }

    def protection(self) -> str:
        """The similarities' protection in words (FedSim Theorems 1-2)."""
        lk = self.linkage
        if lk.mode == "exact":
            return "similarities: none needed (exact matches only, no distance information)"
        said = describe_protection(lk.sigma, lk.tau, lk.epsilon, lk.delta)
        drawn = lk.sigma is not None and lk.sigma > 0.0 and lk.tau is not None and lk.tau < 1.0
        if drawn and self.reproducible_noise:
            said = f"{said}; {NOT_PRIVATE}"
        return said


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
    "match_probability": "operator view: the coordinator's exact probability (the posterior "
                         "under the link's cardinality); primary view: the same posterior of "
                         "the de-normalised noised similarities it received",
    "match": "primary: the decision (probability >= threshold, then one-to-one)",
}
VIEWS = ("operator", "primary")


def links_metadata(columns: Sequence[str], view: str = "operator") -> dict[str, str]:
    """The Parquet metadata of a links file: whose view it is and who holds each column."""
    import json

    return {"vflink.view": view, "vflink.columns": json.dumps(
        {c: LINK_COLUMNS_MODEL.get(c, "") for c in columns}, ensure_ascii=False)}


def primary_probability(linkage: SoftLinkage) -> npt.NDArray[np.float64]:
    """The match probability a primary derives from what it receives: the posterior, under
    the link's cardinality (released with the estimates), of its links' de-normalised noised
    weights w̃ = μ0 + σ0·s (a post-processing of s; :func:`vflink.linkage.fellegi_sunter.
    posterior` over every link it holds)."""
    from vflink.linkage.fellegi_sunter import posterior

    noised = linkage.mu0 + linkage.sigma0 * linkage.similarities
    valid = (linkage.indices >= 0) & np.isfinite(noised)
    out = np.full(noised.shape, np.nan)
    if valid.any():
        rows = np.nonzero(valid)[0].astype(np.int64)
        card = linkage.model.get("cardinality", {}).get("cardinality", "one-to-one")
        out[valid] = posterior(rows, linkage.indices[valid].astype(np.int64), noised[valid],
                               card)
    return out


class LinkColumns(Mapping[str, npt.NDArray[Any]]):
    """The columns of the ``vflink link`` output, one entry per (primary record, neighbour),
    made when they are asked for: a whole column on ``columns[name]`` (kept), or every
    column a stretch of primary records at a time (:meth:`chunks`, what the write stage
    streams to the file: views of the linkage's arrays, so writing 14 M links copies no
    n × K array).

    ``view="operator"`` (default, an operator who holds both tables and runs every party):
    every column of :data:`LINK_COLUMNS` / :data:`LINK_COLUMNS_MODEL`; ``"primary"``: only
    what the primary receives in a deployment. :meth:`add_ids` adds a record-id column.
    """

    def __init__(self, linkage: SoftLinkage, *, view: str = "operator") -> None:
        if view not in VIEWS:
            raise ConfigError(f"`view` must be one of {', '.join(VIEWS)}, got {view!r}")
        self.linkage, self.view = linkage, view
        indices = linkage.indices
        # one pass for the minimum where no link is missing (no n × K mask)
        self._all = bool(not indices.size or indices.min() >= 0)
        #: the number of links (rows of the file)
        self.rows = int(indices.size if self._all else np.count_nonzero(indices >= 0))
        per_link = ["distance", "similarity"]
        if linkage.matches is not None:
            per_link += ["match_weight", "match_probability", "match"]
        if view == "primary":
            per_link = [c for c in per_link if not LINK_COLUMNS_MODEL[c].startswith("coordinator")]
        self._per_link = per_link
        self._names = ["primary_index", "secondary_index", "rank", *per_link]
        self._ids: dict[str, npt.NDArray[Any]] = {}
        self._whole: dict[str, npt.NDArray[Any]] = {}
        self._probability: npt.NDArray[np.float64] | None = None

    def add_ids(self, name: str, ids: npt.NDArray[Any]) -> None:
        """Add ``primary_id`` (or ``secondary_id``): ``ids`` of the primary's (secondary's)
        rows, gathered at each link's ``primary_index`` (``secondary_index``)."""
        self._ids[name] = ids
        if name not in self._names:
            self._names.append(name)

    def __getitem__(self, name: str) -> npt.NDArray[Any]:
        if name not in self._names:
            raise KeyError(name)
        if name not in self._whole:
            self._whole[name] = self._columns(0, len(self.linkage), (name,))[name]
        return self._whole[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def chunks(self, rows: int) -> Iterator[dict[str, npt.NDArray[Any]]]:
        """Every column, about ``rows`` links at a time (whole primary records), in order."""
        n, k = self.linkage.indices.shape
        step = max(1, rows // max(1, k))
        # every chunk but the last has the same row-number pattern and ranks: made once (the
        # ranks read-only, shared by the chunks), not repeated and tiled again per chunk
        shared: dict[int, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = {}
        for lo in range(0, max(n, 1), step):
            yield self._columns(lo, min(n, lo + step), self._names, shared)

    def _link_values(self, name: str, lo: int, hi: int) -> npt.NDArray[Any]:
        """Rows ``lo`` to ``hi`` of the per-link column ``name``."""
        lk = self.linkage
        if name == "distance":
            return lk.distances[lo:hi]
        if name == "similarity":  # without noise, Eq. 1 of these rows alone (no n × K array)
            return lk.similarity_rows(lo, hi)
        return self._whole_values(name)[lo:hi]

    def _whole_values(self, name: str) -> npt.NDArray[Any]:
        lk = self.linkage
        if name == "match_weight":
            return np.asarray(lk.match_weights)
        if name == "match":
            return np.asarray(lk.matches)
        if self.view == "operator":  # match_probability
            return np.asarray(lk.match_probabilities)
        if self._probability is None:  # the primary's own, over every link it holds
            self._probability = primary_probability(lk)
        return self._probability

    def _columns(self, lo: int, hi: int, names: Sequence[str],
                 shared: dict[int, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]
                 | None = None) -> dict[str, npt.NDArray[Any]]:
        """The columns ``names`` of the links of primary records ``lo`` to ``hi``
        (``shared``: the row-number patterns and ranks already made, by stretch length)."""
        lk = self.linkage
        k = lk.indices.shape[1]
        out: dict[str, npt.NDArray[Any]] = {}
        indices = lk.indices[lo:hi]
        if self._all:  # flat views and repeat/tile, no boolean gather over the n × K arrays
            made = None if shared is None else shared.get(hi - lo)
            if made is None:
                made = (np.repeat(np.arange(hi - lo, dtype=np.int64), k),
                        np.tile(np.arange(k, dtype=np.int64), hi - lo))
                if shared is not None:
                    made[1].flags.writeable = False  # the chunks share it: nobody writes it
                    shared.clear()  # one length at a time: the last, shorter chunk's own
                    shared[hi - lo] = made
            rows, ranks = made
            for name in names:
                if name == "primary_index":
                    out[name] = rows + lo
                elif name == "secondary_index":
                    out[name] = indices.astype(np.int64, copy=False).reshape(-1)
                elif name == "rank":
                    out[name] = ranks
                elif name in self._ids:
                    out[name] = self._gather_ids(name, out, lo, hi, names)
                else:
                    v = self._link_values(name, lo, hi)
                    out[name] = (v.reshape(-1) if v.dtype == bool
                                 else v.astype(np.float64, copy=False).reshape(-1))
            return out
        valid = indices >= 0
        rows, ranks = np.nonzero(valid)
        for name in names:
            if name == "primary_index":
                out[name] = rows.astype(np.int64) + lo
            elif name == "secondary_index":
                out[name] = indices[valid].astype(np.int64)
            elif name == "rank":
                out[name] = ranks.astype(np.int64)
            elif name in self._ids:
                out[name] = self._gather_ids(name, out, lo, hi, names)
            else:
                v = self._link_values(name, lo, hi)
                out[name] = v[valid] if v.dtype == bool else v[valid].astype(np.float64)
        return out

    def _gather_ids(self, name: str, done: dict[str, npt.NDArray[Any]], lo: int, hi: int,
                    names: Sequence[str]) -> npt.NDArray[Any]:
        index = f"{name[:-3]}_index"
        rows = done[index] if index in done else self._columns(lo, hi, (index,))[index]
        return self._ids[name][rows]


def linkage_columns(linkage: SoftLinkage, *, view: str = "operator") -> LinkColumns:
    """The columns of the ``vflink link`` output (:class:`LinkColumns`: each made when asked
    for): one entry per (primary record, neighbour)."""
    return LinkColumns(linkage, view=view)


def linkage_table(linkage: SoftLinkage) -> pd.DataFrame:
    """One row per (primary record, neighbour): the ``vflink link`` output format."""
    import pandas as pd

    return pd.DataFrame(dict(linkage_columns(linkage)))


#: What the summary says of the record-id columns the links may hold.
ID_COLUMNS = {"primary_id": "primary: its own record id",
              "secondary_id": "operator only: the secondary's record id, read from its table"}


def link_summary(outcome: LinkOutcome, *, columns: Sequence[str], view: str,
                 choices: Mapping[str, str], seconds: Mapping[str, float],
                 phases: Mapping[str, float]) -> dict[str, Any]:
    """The summary of a link (``<out>.summary.json``): :meth:`LinkOutcome.summary`, whose view
    the links are and who holds each of their ``columns``, each stage's registry entry
    (``stages``) and seconds (``stage_seconds``), and the coarser ``phase_seconds``."""
    summary = outcome.summary()
    summary["view"] = view
    if columns:  # a streamed link's columns are the operator's, as LinkOutcome.summary says
        summary["columns"] = {c: LINK_COLUMNS_MODEL[c] for c in columns
                              if c in LINK_COLUMNS_MODEL}
        summary["columns"].update({c: ID_COLUMNS[c] for c in ID_COLUMNS if c in columns})
    summary["phase_seconds"] = {k: round(v, 3) for k, v in phases.items()}
    summary["stages"] = dict(choices)
    summary["stage_seconds"] = dict(seconds)
    return summary
