"""Multi-field linkage between two tables, run as parties in this process.

Each field has its own metric and weight, with optional blocking keys; the weighted distance
goes through FedSim's Eq. 1-2 unchanged (:mod:`vflink.linkage.fields`). The encodings are
chosen in :mod:`vflink.runner.encoding`; the outcome is :class:`vflink.runner.link.LinkOutcome`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import pandas as pd

from vflink.data.schema import PartySchema
from vflink.data.table import PartyTable
from vflink.errors import ConfigError, DataError
from vflink.linkage import BloomConfig, GeoBloomConfig
from vflink.linkage.fields import FIELD_METRICS, Blocking, FieldSpec
from vflink.linkage.model_link import MODELS
from vflink.parties.coordinator import CoordinatorParty
from vflink.parties.link_peer import LinkingPeer
from vflink.parties.linking import AlignmentInitiator, field_raw_values
from vflink.parties.policy import PartyPolicy
from vflink.protocol import FieldEncoding
from vflink.runner.encoding import (
    compared_as,
    default_noise,
    describe_fields,
    field_encodings,
    fields_encoder,
    link_fields,
    resolve_fields,
    resolve_privacy,
)
from vflink.runner.link import COORDINATOR, LinkOutcome, check_top_k, link_outcome
from vflink.runner.local import local_roles, secret_with_source
from vflink.transport import InProcessHub, Transcript

__all__ = ["name_model", "run_field_linkage"]


def _unique(columns: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(columns))


def name_model(model: dict[str, Any], fields: Sequence[FieldSpec],
               blocking: Sequence[Blocking]) -> None:
    """Name a model link's fields and blocking rules by their columns in its summary (the
    coordinator knows them by number only)."""
    names = {f"field{i}": ",".join(f.on) for i, f in enumerate(fields)}
    for row in model.get("m_u", []):
        row["field"] = names.get(row["field"], row["field"])
    for row in model.get("waterfall", {}).get("fields", []):
        row["field"] = names.get(row["field"], row["field"])
    for rule, b in zip(model.get("blocking_rules", []), blocking, strict=False):
        rule["rule"] = b.describe()


def run_field_linkage(primary: pd.DataFrame, secondary: pd.DataFrame, *,
                      fields: Sequence[FieldSpec], blocking: Sequence[Blocking] = (),
                      top_k: int, bloom: bool | None = None, mode: str = "soft",
                      tau: float | None = None, sigma: float | None = None,
                      delta: float = 1e-5, secret: bytes | None = None, seed: int | None = None,
                      primary_source: str = "primary",
                      secondary_source: str = "secondary",
                      privacy: str | None = None, transcript: Transcript | None = None,
                      bloom_config: BloomConfig | None = None,
                      geo_config: GeoBloomConfig | None = None, model: str | None = None,
                      threshold: float = 0.5, one_to_one: str | None = None) -> LinkOutcome:
    """Multi-field linkage (:mod:`vflink.linkage.fields`): each field with its own metric and
    weight, optional blocking keys; the weighted distance goes through Eq. 1-2 unchanged.

    Run as parties in this process, as :func:`run_linkage`: each data party encodes its own
    fields and sends them to the coordinator (:meth:`AlignmentInitiator.align_fields`), which
    searches the top-K (:func:`search_fields`) and adds the noise. Private by default: every
    field is encoded as keyed Bloom filters (q-gram filters for strings, geographic filters
    for coordinates, FEDERAL filters on the range of both tables for other numbers) and
    compared by Dice distance; raw values only with ``privacy="off"`` (or ``bloom=False``).
    Blocking keys reach the coordinator as keyed digests (HMAC), never as text.

    ``model="fellegi-sunter"``: the coordinator scores every candidate pair (the pairs of the
    blocking rules; without rules, every pair of a small link or each record's nearest) with
    a Fellegi–Sunter model it trains without labels, decides the matches (probability ≥
    ``threshold``, then ``one_to_one`` ``"optimal"`` or ``"greedy"``) and keeps each primary
    record's K best candidates, its match first (:mod:`vflink.linkage.model_link`). Fields
    then need neither ``metric`` nor ``weight``.
    """
    start = time.perf_counter()
    private = resolve_privacy(privacy, bloom) == "bloom"
    tau, sigma = default_noise(tau, sigma, private=private, mode=mode)
    fields, blocking = tuple(fields), tuple(blocking)
    if not fields:
        raise ConfigError("linkage needs at least one field")
    check_top_k(top_k, len(secondary), secondary_source)
    if model is not None and model not in MODELS:
        raise ConfigError(f"`model` must be one of {', '.join(MODELS)}, got {model!r}")
    unset = [list(f.on) for f in fields if f.metric is None]
    if unset and model is None:
        raise ConfigError(f"field(s) {unset} need a `metric` (one of "
                          f"{', '.join(FIELD_METRICS)}), unless model = \"fellegi-sunter\" "
                          "chooses the comparison from the column")
    fields = resolve_fields(fields, primary)
    encodings = field_encodings(fields, private=private, primary=primary, secondary=secondary,
                                margin=0.01, bloom_config=bloom_config, geo_config=geo_config,
                                sources=(primary_source, secondary_source))
    plan = link_fields(fields, encodings)
    # Checked here, where both tables are at hand, so that an error names the file (in a
    # deployment each data party runs the same checks on its own side).
    for frame, source, theirs in ((primary, primary_source, False),
                                  (secondary, secondary_source, True)):
        own = [FieldEncoding(columns=f.secondary_on if theirs else f.on, spec=f.spec)
               for f in plan]
        field_raw_values(frame, own, source=source)
        columns = [c for b in blocking for c in (b.columns_s if theirs else b.columns)]
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise DataError(f"{source}: unknown blocking column(s) {missing}; the table has: "
                            f"{', '.join(map(str, frame.columns[:20]))}")
    keyed = bool(blocking) or model is not None or any(e.encoder == "bloom" for e in encodings)
    secret_source = "given" if secret is not None else ""
    if keyed and secret is None:
        # derived from the seed when unset (and said so), random without a seed: both data
        # parties are in this process
        secret, secret_source = secret_with_source("VFLINK_SECRET", seed=seed)
    hub = InProcessHub(transcript=transcript)
    # Both tables are this user's: the arguments are the explicit release choice.
    policy = PartyPolicy.permissive(
        identifiers="bloom" if all(e.encoder == "bloom" for e in encodings) else "any")
    policy = dataclasses.replace(policy, max_top_k=max(policy.max_top_k, len(secondary)))
    roles = local_roles("primary", ["secondary"])
    coordinator = CoordinatorParty(COORDINATOR, seed=seed, roles=roles, policy=policy)
    hub.register(COORDINATOR, coordinator)
    sec_schema = PartySchema(name="secondary", role="secondary", identifiers=_unique(
        [*(c for f in plan for c in f.secondary_on), *(c for b in blocking for c in b.columns_s)]))
    sec_party = LinkingPeer(PartyTable(sec_schema, secondary, secondary_source),
                            hub.channel("secondary"), secret=secret, roles=roles, policy=policy)
    hub.register("secondary", sec_party)
    initiator = AlignmentInitiator(
        "primary", primary, hub.channel("primary"), secondaries=("secondary",),
        identifiers=_unique([*(c for f in plan for c in f.on),
                             *(c for b in blocking for c in b.columns)]),
        secret=secret, source=primary_source, policy=policy)
    alignment = initiator.align_fields(COORDINATOR, plan, blocking=blocking, top_k=top_k,
                                       mode=mode, tau=tau, sigma=sigma, delta=delta,
                                       session="link", model=model or "",
                                       threshold=threshold,
                                       one_to_one=one_to_one or "")["secondary"]
    outcome = link_outcome(coordinator, alignment, hub, start=start, mode=mode, top_k=top_k,
                           rows=(len(primary), len(secondary)),
                           privacy="bloom" if private else "off",
                           search_metric=describe_fields(fields, blocking),
                           encoding=fields_encoder(encodings),
                           secret_source=secret_source if keyed else "")
    name_model(outcome.linkage.model, fields, blocking)
    return dataclasses.replace(outcome, fields_compared=compared_as(fields, encodings))
