"""Soft linkage between two tables, run as parties in this process (FedSim §4.1, §4.3, §5).

The primary and the secondary encode their own identifiers and send only the encodings to the
coordinator; the coordinator searches the top-K, normalises and noises the similarities and
returns indices to both and similarities to the primary only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from vflink.data.schema import PartySchema
from vflink.data.table import PartyTable
from vflink.errors import ConfigError
from vflink.linkage import BloomConfig, NumericRange, SearchOptions, SoftLinkage
from vflink.linkage.improvement import improvement_estimate
from vflink.linkage.validation import validate_identifiers
from vflink.parties import CoordinatorParty, SecondaryParty
from vflink.parties.linking import AlignmentInitiator, identifier_values
from vflink.parties.policy import PartyPolicy
from vflink.protocol import EncodingSpec
from vflink.runner.federation import secret_with_source
from vflink.transport import InProcessHub, Transcript
from vflink.types import Alignment

__all__ = ["LINK_METRICS", "PRIVACY", "LinkOutcome", "encoding_for", "encoding_summary",
           "linkage_table", "resolve_privacy", "run_linkage"]

log = logging.getLogger(__name__)

#: Metrics a user may ask for; ``hamming`` means Bloom filters (FedSim App. I).
LINK_METRICS = ("euclidean", "haversine", "hamming", "levenshtein")
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

    def summary(self) -> dict[str, Any]:
        lk = self.linkage
        return {
            "sizes": self.sizes, "seconds": round(self.seconds, 3), "metric": lk.metric,
            "privacy": self.privacy, "top_k": lk.k, "mode": lk.mode, "mu0": lk.mu0,
            "sigma0": lk.sigma0, "sigma": lk.sigma, "tau": lk.tau, "epsilon": lk.epsilon,
            "delta": lk.delta, "epsilon_valid": lk.epsilon_valid,
            "exact_search": lk.exact_search, "recall": lk.recall,
            "improvement_delta": self.improvement, "communication": self.communication,
            **encoding_summary(self.encoding, self.secret_source),
        }


#: What reaches the coordinator under each encoding (for summaries).
ENCODINGS = {
    "hmac-sha256": "keyed hashes (HMAC-SHA256) of the exact keys",
    "bloom": "keyed Bloom filters of the identifiers (FedSim App. I)",
    "raw": "RAW numeric identifiers (privacy off)",
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


def _kind(frame: pd.DataFrame, columns: Sequence[str], metric: str) -> str:
    if metric in ("euclidean", "haversine"):
        return "numeric"
    if metric == "levenshtein":
        return "string"
    numeric = all(pd.api.types.is_numeric_dtype(frame[c]) for c in columns)
    return "numeric" if numeric else "string"


def encoding_for(metric: str, *, bloom: bool,
                 sides: Sequence[tuple[pd.DataFrame, Sequence[str]]],
                 bloom_config: BloomConfig | None = None,
                 margin: float = 0.01, sources: Sequence[str] = ()) -> tuple[EncodingSpec, str]:
    """The encoding spec every data party uses, and the metric the coordinator searches with.

    ``sides`` are the (table, identifier columns) the value range is fitted on, primary first.
    ``hamming`` (or ``bloom=True``) means FEDERAL Bloom filters; numeric Bloom filters need an
    agreed value range: the min/max over ``sides`` widened by ``margin`` × range (values outside
    it still encode, with fewer bits set), which every party then uses.
    """
    if metric not in LINK_METRICS:
        raise ConfigError(f"`metric` must be one of {', '.join(LINK_METRICS)}, got {metric!r}")
    bloom = bloom or metric == "hamming"
    kind = _kind(sides[0][0], sides[0][1], metric)
    if not bloom:
        return EncodingSpec(encoder="raw" if kind == "numeric" else "string", kind=kind), metric
    cfg = bloom_config or BloomConfig()
    params = {k: getattr(cfg, k) for k in ("n_centres", "threshold", "filter_bits", "num_hashes",
                                           "qgram", "normalize")}
    if kind == "string":
        return EncodingSpec(encoder="bloom", kind="string", params=params), "hamming"
    tables = []
    for i, (frame, columns) in enumerate(sides):
        source = sources[i] if i < len(sources) else f"party {i}"
        values = np.asarray(identifier_values(frame, columns, "numeric", source=source))
        tables.append(values[np.isfinite(values).all(axis=1)])
    ranges = NumericRange.fit(*tables, margin=margin)
    return EncodingSpec(encoder="bloom", kind="numeric", params=params, low=ranges.low,
                        high=ranges.high), "hamming"


def run_linkage(primary: pd.DataFrame, secondary: pd.DataFrame, *, on: Sequence[str],
                secondary_on: Sequence[str] | None = None, metric: str, top_k: int,
                bloom: bool | None = None, mode: str = "soft", tau: float | None = None,
                sigma: float | None = None, delta: float = 1e-5, secret: bytes | None = None,
                seed: int | None = None, search: SearchOptions | None = None,
                bloom_config: BloomConfig | None = None, primary_source: str = "primary",
                secondary_source: str = "secondary",
                transcript: Transcript | None = None, privacy: str | None = None
                ) -> LinkOutcome:
    """Link ``primary`` to ``secondary`` through a coordinator, all parties in this process.

    Private by default: identifiers reach the coordinator as keyed Bloom filters unless
    ``privacy="off"`` (or ``bloom=False``) is given explicitly.
    """
    start = time.perf_counter()
    privacy = resolve_privacy(privacy, bloom)
    on = tuple(on)
    secondary_on = tuple(secondary_on or on)
    if len(on) != len(secondary_on):
        raise ConfigError(f"--on names {len(on)} column(s) but --secondary-on names "
                          f"{len(secondary_on)}; each primary identifier needs a counterpart")
    if metric in ("euclidean", "haversine", "levenshtein"):
        # Checked on the raw values here, where both tables are at hand: after Bloom encoding a
        # NaN coordinate or a latitude of 123° could no longer be told apart (in a deployment
        # each data party runs the same check on its own side).
        kind = "string" if metric == "levenshtein" else "numeric"
        validate_identifiers(
            identifier_values(primary, on, kind, source=primary_source),
            identifier_values(secondary, secondary_on, kind, source=secondary_source),
            metric=metric, top_k=top_k)
    spec, search_metric = encoding_for(metric, bloom=privacy == "bloom",
                                       sides=((primary, on), (secondary, secondary_on)),
                                       bloom_config=bloom_config,
                                       sources=(primary_source, secondary_source))
    secret_source = "given" if secret is not None else ""
    if spec.encoder == "bloom" and secret is None:
        # derived from the seed when unset (and said so), random without a seed: both data
        # parties are in this process
        secret, secret_source = secret_with_source("VFLINK_SECRET", seed=seed)
    hub = InProcessHub(transcript=transcript)
    # Both tables are this user's: the arguments are the explicit release choice.
    policy = PartyPolicy.permissive(identifiers="bloom" if spec.encoder == "bloom" else "any")
    roles = {"primary": "primary", "secondary": "secondary", COORDINATOR: "coordinator"}
    coordinator = CoordinatorParty(COORDINATOR, seed=seed, search=search)
    coordinator.roles, coordinator.policy = roles, policy
    hub.register(COORDINATOR, coordinator)
    sec_schema = PartySchema(name="secondary", role="secondary", identifiers=secondary_on)
    sec_party = SecondaryParty(PartyTable(sec_schema, secondary, secondary_source),
                               hub.channel("secondary"), secret=secret)
    sec_party.roles, sec_party.policy = roles, policy
    hub.register("secondary", sec_party)
    initiator = AlignmentInitiator("primary", primary, hub.channel("primary"),
                                   secondaries=("secondary",), identifiers=on, secret=secret,
                                   source=primary_source, policy=policy)
    alignment = initiator.align_soft(COORDINATOR, spec, metric=search_metric, top_k=top_k,
                                     mode=mode, tau=tau, sigma=sigma, delta=delta,
                                     session="link")["secondary"]
    linkage = coordinator.linkage("link", "secondary")
    improvement = {}
    if mode == "soft":
        for baseline in ("exact", "top1sim", "avgsim"):
            improvement[baseline] = improvement_estimate(linkage, baseline)
    sizes = {"primary_rows": len(primary), "secondary_rows": len(secondary), "top_k": top_k,
             "links": int((linkage.indices >= 0).sum())}
    return LinkOutcome(linkage=linkage, alignment=alignment,
                       seconds=time.perf_counter() - start, sizes=sizes,
                       privacy="bloom" if spec.encoder == "bloom" else "off",
                       search_metric=search_metric, improvement=improvement,
                       encoding=spec.encoder, secret_source=secret_source,
                       communication=hub.counter.snapshot())


def linkage_table(linkage: SoftLinkage) -> pd.DataFrame:
    """One row per (primary record, neighbour): the ``vflink link`` output format."""
    n, k = linkage.indices.shape
    valid = linkage.indices >= 0
    rows, ranks = np.nonzero(valid)
    return pd.DataFrame({
        "primary_index": rows.astype(np.int64),
        "secondary_index": linkage.indices[valid].astype(np.int64),
        "rank": ranks.astype(np.int64),
        "distance": linkage.distances[valid].astype(np.float64),
        "similarity": linkage.similarities[valid].astype(np.float64),
    })
