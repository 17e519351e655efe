"""What a link gives: :class:`LinkOutcome` (the coordinator's linkage, the primary's
alignment, the figures), the columns of the links file and who holds each, and the summary
(``<out>.summary.json``) with each stage's seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from vflink.errors import ConfigError
from vflink.linkage import SoftLinkage
from vflink.linkage.privacy import describe_protection
from vflink.randomness import NOT_PRIVATE
from vflink.runner.encoding import encoding_summary
from vflink.types import Alignment

__all__ = ["LINK_COLUMNS", "LINK_COLUMNS_MODEL", "VIEWS", "LinkOutcome", "link_summary",
           "linkage_columns", "linkage_table", "links_metadata", "primary_probability"]


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
        said = describe_protection(lk.sigma, lk.tau, lk.epsilon, lk.delta)
        drawn = lk.sigma is not None and lk.sigma > 0.0 and lk.tau is not None and lk.tau < 1.0
        if drawn and self.alignment.meta.get("reproducible_noise"):
            # a seed given to the link (--seed): whoever knows it redraws the noise
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
