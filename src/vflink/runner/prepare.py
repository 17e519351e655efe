"""The alignment stage: alignment methods by name (``ALIGNMENTS``) and :func:`prepare`.

===========  ==================================================================================
``exact``    keyed hashes (HMAC-SHA256) of the identifiers, matched by the coordinator
``soft``     FedSim soft linkage: encoded identifiers (Bloom filters by default), top-K search at
             the coordinator, normalised and noised similarities to the primary (Eq. 1, Thm 1-2)
``fields``   soft linkage on several fields, each with its metric and weight
             (``[[alignment.fields]]``; ``alignment.method = "soft"``)
``psi``      ECDH private set intersection between the data parties (FLORIST)
``psu``      private set union between the data parties, for union training (FLORIST); it fixes
             the training plan (``union``)
===========  ==================================================================================

Each entry (:class:`~vflink.runner.context.AlignmentMethod`) aligns through the parties: the
primary's :class:`~vflink.parties.linking.AlignmentInitiator` or
:class:`~vflink.parties.setalign.SetAlignmentDriver` is the party-side hook. The result is a
:class:`~vflink.runner.context.Prepared`: alignment indices (and similarities) per kind of
algorithm, never a linkage object.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from vflink._checks import column_order_warning
from vflink.data.table import PartyTable
from vflink.errors import ConfigError
from vflink.parties import PrimaryParty
from vflink.parties.linking import LinkField
from vflink.protocol import EncodingSpec
from vflink.protocol.sessions import new_session_name
from vflink.registry import Registry
from vflink.runfiles.algorithms import Algorithm, get_algorithm
from vflink.runfiles.config import AlignmentConfig, RunConfig
from vflink.runfiles.inputs import Inputs, identifier_features, load_inputs
from vflink.runner.compute import current_compute
from vflink.runner.context import AlignmentMethod, Prepared, RunContext
from vflink.runner.encoding import (
    compared_as,
    describe_fields,
    encoding_for,
    encoding_summary,
    field_encodings,
    fields_encoder,
    link_fields,
    resolve_fields,
)
from vflink.runner.federation import Federation, in_process
from vflink.runner.link.read import check_top_k
from vflink.runner.pools import link_by_split, run_splits
from vflink.runner.protections import ALIGNMENT, Protection, chosen, request_settings
from vflink.runner.setalign import prepare_psi, prepare_psu
from vflink.runner.union import union_fractions
from vflink.transport import TrafficCounter, Transcript
from vflink.types import MISSING, Alignment

__all__ = ["ALIGNMENTS", "as_inputs", "field_encodings_for", "method_name", "prepare"]

log = logging.getLogger(__name__)


def method_name(alignment: AlignmentConfig) -> str:
    """The ``ALIGNMENTS`` entry of an ``[alignment]`` section."""
    return "fields" if alignment.method == "soft" and alignment.fields else alignment.method


def as_inputs(tables: Inputs | tuple[PartyTable, Sequence[PartyTable]]) -> Inputs:
    if isinstance(tables, Inputs):
        return tables
    return Inputs(tables[0], tuple(tables[1]))


def _needs(algorithms: Sequence[Algorithm]) -> set[str]:
    return {a.links for a in algorithms if a.kind == "vfl"} | {"base"}


def prepare(config: RunConfig, tables: Inputs | tuple[PartyTable, Sequence[PartyTable]] | None
            = None, *, algorithms: Sequence[str] | None = None,
            transcript: Transcript | None = None, federation: Federation | None = None,
            scale: tuple[float, float] | None = None,
            encoding: EncodingSpec | tuple[EncodingSpec, ...] | None = None) -> Prepared:
    """Align the parties through the coordinator (the real protocol).

    Without a ``federation`` the other parties are built in this process. ``scale`` fixes
    Eq. 1's (μ0, σ0) and ``encoding`` the identifier encoding (e.g. a Bloom filter's value
    range; one per field for [[alignment.fields]]), both to a training linkage's when
    predicting. ``algorithms`` (default: the run file's) decide which alignments are made
    (FedSim's K links, exact matches...), so that every algorithm of an experiment reuses one.
    """
    inputs = as_inputs(tables) if tables is not None else load_inputs(config)
    needs = _needs([get_algorithm(a) for a in (algorithms or [config.algorithm])])
    if federation is None:
        federation = in_process(inputs, config, transcript=transcript)
    if not federation.secondaries:
        rows = np.arange(len(inputs.primary), dtype=np.int64)
        return Prepared(inputs, {}, {}, rows, {}, federation)
    method = ALIGNMENTS.get(method_name(config.alignment))
    return method.prepare(config, inputs, federation, needs=needs, scale=scale,
                          encoding=encoding, protections=chosen(config, ALIGNMENT))


class _Opened:
    """What every method through the coordinator starts from: the primary's alignment hook
    and the traffic counters before it ran."""

    def __init__(self, inputs: Inputs, federation: Federation) -> None:
        primary = PrimaryParty(inputs.primary, federation.channel,
                               secondaries=federation.secondaries, secret=federation.secret,
                               policy=federation.policy)
        primary.compute = current_compute()
        self.initiator = primary.initiator()
        self.before = federation.counter.snapshot()
        self.before_kinds = federation.counter.kinds()

    def close(self, config: RunConfig, inputs: Inputs, federation: Federation,
              alignments: dict[str, dict[str, Alignment]], sessions: dict[str, str],
              summary: dict[str, Any], *, drop_unmatched: bool = False) -> Prepared:
        """The rows every algorithm trains on, the matched fractions and the traffic."""
        a_cfg = config.alignment
        n = len(inputs.primary)
        rows = np.arange(n, dtype=np.int64)
        if drop_unmatched:
            for a in alignments["base"].values():
                rows = rows[a.for_primary_rows(n)[rows, 0] != MISSING]
        summary["matched_fraction"] = {k: float(np.mean(a.matched))
                                       for k, a in alignments["base"].items()}
        summary["unmatched"] = a_cfg.unmatched
        crossing = identifier_features(inputs)
        if crossing:  # for the ledger: these identifiers also crossed as features
            summary["identifiers_as_features"] = crossing
        log.info("aligned: %d of %d primary rows kept (%s)", len(rows), n,
                 summary["matched_fraction"])
        communication = TrafficCounter.delta(federation.counter.snapshot(), self.before)
        summary["messages"] = TrafficCounter.kinds_delta(federation.counter.kinds(),
                                                         self.before_kinds)
        return Prepared(inputs, alignments, sessions, rows, communication, federation, summary)


def prepare_exact(config: RunConfig, inputs: Inputs, federation: Federation, *,
                  needs: set[str], **_: Any) -> Prepared:
    """``exact``: keyed hashes (HMAC-SHA256) of the identifiers, matched by the coordinator."""
    if "topk" in needs:
        raise ConfigError("algorithms that use K links (fedsim, avgsim, featuresim...) need "
                          "soft linkage: set alignment.method = \"soft\"")
    _warn_column_order(inputs, "key")
    opened = _Opened(inputs, federation)
    # every run opens its sessions under new names: a finished session is immutable
    session = new_session_name("exact")
    base = opened.initiator.align_exact(federation.coordinator, session=session)
    alignments = {"base": base, "top1": base, "exact": base}
    summary: dict[str, Any] = {"method": config.alignment.method,
                               **encoding_summary("hmac-sha256", federation.secret_source)}
    return opened.close(config, inputs, federation, alignments,
                        dict.fromkeys(alignments, session), summary,
                        drop_unmatched=config.alignment.unmatched == "drop")


def _check_top_k(config: RunConfig, inputs: Inputs, needs: set[str]) -> None:
    """K against every secondary table in this process, before any alignment work (a
    secondary elsewhere is checked by the coordinator)."""
    if "topk" not in needs:
        return  # the algorithm links one record each (top_k is not used)
    for table in inputs.secondaries:
        check_top_k(config.alignment.top_k, len(table), f"of party {table.name!r} "
                    f"({table.source})", where="alignment.top_k")


def _warn_column_order(inputs: Inputs, what: str) -> None:
    """Warn when a secondary in this process names the primary's identifier (or key) columns
    in another order: they are paired by position (a party file elsewhere is checked by that
    party)."""
    def columns(table: PartyTable) -> tuple[str, ...]:
        return table.schema.key if what == "key" else table.schema.identifiers

    for table in inputs.secondaries:
        text = column_order_warning(columns(inputs.primary), columns(table), what=what)
        if text is not None:
            log.warning("party %r: %s", table.name, text.replace(
                "(e.g. --secondary-on", f"(the {what} list of party {table.name!r}, e.g."))


#: ``align(top_k=..., mode=..., tau=..., sigma=..., delta=..., session=..., scale=...)``: one
#: soft linkage through the primary's hook (one identifier, or several fields)
_Align = Callable[..., dict[str, Alignment]]


def _top_k_linkage(config: RunConfig, inputs: Inputs, federation: Federation, *,
                   needs: set[str], protections: Sequence[Protection], align: _Align,
                   spec: EncodingSpec | None, fields: tuple[LinkField, ...],
                   search_metric: str, scale: tuple[float, float] | None,
                   decided: bool = False
                   ) -> tuple[dict[str, dict[str, Alignment]], dict[str, str], dict[str, Any]]:
    """What ``soft`` and ``fields`` share: the top-K linkage with the alignment protections'
    settings (similarity noise), its top-1 view, exact matches when an algorithm needs them,
    and the summary of the linkage's parameters and protections. ``decided``: a model link,
    whose rank-0 link is the match when there is one and whose exact-style links are its
    (one-to-one) matches, without a second session."""
    a_cfg = config.alignment
    names = federation.secondaries
    top_k = a_cfg.top_k if "topk" in needs else 1
    # every run opens its sessions under new names: a finished session is immutable
    soft_session, exact_session = new_session_name("soft"), new_session_name("exact")
    if a_cfg.pool == "split":  # the FedSim authors' protocol (vflink.runner.pools)
        splits = run_splits(config, inputs, np.arange(len(inputs.primary), dtype=np.int64))
        soft = link_by_split(config, inputs, federation, splits, spec, metric=search_metric,
                             top_k=top_k, session=soft_session, fields=fields,
                             protections=protections)
    else:
        soft = align(top_k=top_k, session=soft_session, scale=scale,
                     **request_settings(protections, config))
    top1 = {k: Alignment(a.primary_index, a.secondary_index[:, :1],
                         None if a.similarity is None else a.similarity[:, :1], k,
                         dict(a.meta)) for k, a in soft.items()}
    alignments = {"base": top1, "top1": top1, "topk": soft}
    sessions = dict.fromkeys(("base", "top1", "topk"), soft_session)
    if "exact" in needs and decided:
        alignments["exact"] = {k: _matches_only(a) for k, a in soft.items()}
    elif "exact" in needs and a_cfg.pool == "split":
        alignments["exact"] = link_by_split(config, inputs, federation, splits, spec,
                                            metric=search_metric, top_k=1, mode="exact",
                                            session=exact_session, fields=fields,
                                            protections=protections)
    elif "exact" in needs:
        alignments["exact"] = align(top_k=1, mode="exact", session=exact_session)
    if "exact" in needs:
        sessions["exact"] = soft_session if decided else exact_session
    first = soft[names[0]].meta
    summary: dict[str, Any] = {"method": a_cfg.method, "mu0": first.get("mu0"),
                               "sigma0": first.get("sigma0")}
    for protection in protections:  # what the coordinator applied (similarity noise)
        summary.update(protection.report(first))
    summary.update({"metric": a_cfg.metric if spec is not None else search_metric,
                    "top_k": top_k, "privacy": a_cfg.privacy, "pool": a_cfg.pool})
    return alignments, sessions, summary


def _matches_only(a: Alignment) -> Alignment:
    """A model link's matches as an exact-style alignment: each primary row's match, MISSING
    where it has none."""
    match = a.match if a.match is not None else np.zeros(a.secondary_index.shape, dtype=bool)
    first = np.where(match[:, 0], a.secondary_index[:, 0], MISSING)
    return Alignment(a.primary_index, first[:, None], None, a.secondary, dict(a.meta),
                     match[:, :1])


def prepare_soft(config: RunConfig, inputs: Inputs, federation: Federation, *,
                 needs: set[str], protections: Sequence[Protection] = (),
                 scale: tuple[float, float] | None = None,
                 encoding: EncodingSpec | tuple[EncodingSpec, ...] | None = None,
                 **_: Any) -> Prepared:
    """``soft``: FedSim soft linkage of one identifier's encodings (Bloom filters by
    default): top-K at the coordinator, normalised and protected similarities to the primary."""
    a_cfg = config.alignment
    _warn_column_order(inputs, "identifier")
    _check_top_k(config, inputs, needs)
    opened = _Opened(inputs, federation)
    # The primary proposes the encoding; a numeric Bloom range comes from its own identifiers
    # (widened by 10 %), as it must when the secondaries' data are elsewhere.
    sides = [(inputs.primary.frame, inputs.primary.schema.identifiers)]
    spec, search_metric = encoding_for(a_cfg.metric, bloom=a_cfg.privacy == "bloom",
                                       sides=sides, margin=0.1)
    if isinstance(encoding, EncodingSpec):  # the training's: same centres
        spec = encoding
    one: EncodingSpec = spec
    coordinator = federation.coordinator

    def align(**kw: Any) -> dict[str, Alignment]:
        return opened.initiator.align_soft(coordinator, one, metric=search_metric, **kw)

    alignments, sessions, summary = _top_k_linkage(
        config, inputs, federation, needs=needs, protections=protections, align=align,
        spec=spec, fields=(), search_metric=search_metric, scale=scale)
    summary.update(encoding_summary(spec.encoder, federation.secret_source))
    summary["encoding_spec"] = dataclasses.asdict(spec)  # public; reused by predict
    return opened.close(config, inputs, federation, alignments, sessions, summary)


def prepare_fields(config: RunConfig, inputs: Inputs, federation: Federation, *,
                   needs: set[str], protections: Sequence[Protection] = (),
                   scale: tuple[float, float] | None = None,
                   encoding: EncodingSpec | tuple[EncodingSpec, ...] | None = None,
                   **_: Any) -> Prepared:
    """``fields``: soft linkage on several fields, each with its own metric and weight
    (``[[alignment.fields]]``), with optional blocking keys."""
    a_cfg = config.alignment
    _check_top_k(config, inputs, needs)
    for i, spec in enumerate(a_cfg.fields):
        text = column_order_warning(spec.on, spec.columns_s)
        if text is not None:
            log.warning("[[alignment.fields]] #%d: %s", i + 1, text.replace(
                "(e.g. --secondary-on", "(e.g. secondary_on ="))
    opened = _Opened(inputs, federation)
    specs = resolve_fields(a_cfg.fields, inputs.primary.frame)
    encodings = field_encodings_for(inputs, dataclasses.replace(a_cfg, fields=specs), encoding)
    fields = link_fields(specs, encodings)
    search_metric = describe_fields(specs, a_cfg.blocking)
    coordinator = federation.coordinator
    decided: dict[str, Any] = {}
    if a_cfg.model is not None:
        decided = {"model": a_cfg.model, "threshold": float(a_cfg.threshold),
                   "one_to_one": ("optimal" if a_cfg.one_to_one is True
                                  else a_cfg.one_to_one or "")}

    def align(**kw: Any) -> dict[str, Alignment]:
        if decided and kw.get("mode", "soft") != "exact":
            kw = {**kw, **decided}
        return opened.initiator.align_fields(coordinator, fields, blocking=a_cfg.blocking, **kw)

    alignments, sessions, summary = _top_k_linkage(
        config, inputs, federation, needs=needs, protections=protections, align=align,
        spec=None, fields=fields, search_metric=search_metric, scale=scale,
        decided=bool(decided))
    encoder = fields_encoder([f.spec for f in fields])
    summary.update(encoding_summary(encoder, federation.secret_source))
    # public, per field; reused by predict (same centres, so similarities compare)
    summary["fields"] = [f.describe() for f in specs]
    summary["fields_compared"] = compared_as(specs, encodings)
    if decided:
        first = alignments["topk"][federation.secondaries[0]]
        summary["model"] = {**decided, **{k: first.meta[k] for k in (
            "expected_matches", "estimated_precision", "estimated_recall", "estimated_f1",
            "lambda") if k in first.meta},
            "matched_fraction": float(np.mean(first.match[:, 0]))
            if first.match is not None else 0.0}
    summary["field_encoding_specs"] = [dataclasses.asdict(f.spec) for f in fields]
    if a_cfg.blocking:
        summary["blocking"] = "keyed digests (HMAC-SHA256) of " + ", ".join(
            b.describe() for b in a_cfg.blocking)
    return opened.close(config, inputs, federation, alignments, sessions, summary)


def field_encodings_for(inputs: Inputs, alignment: AlignmentConfig,
                     encoding: EncodingSpec | tuple[EncodingSpec, ...] | None
                     ) -> tuple[EncodingSpec, ...]:
    """Each field's encoding, proposed by the primary from its own table (a numeric range from
    its own values widened by 10 %, as for one field), or the training's when predicting."""
    p = inputs.primary
    own = [c for f in alignment.fields for c in f.on] + [c for b in alignment.blocking
                                                          for c in b.columns]
    undeclared = sorted({c for c in own if c not in p.schema.identifiers})
    if undeclared:
        raise ConfigError(f"[[alignment.fields]] / [[alignment.blocking]] name {undeclared}, "
                          f"which party {p.name!r} does not declare as `identifiers` "
                          f"({', '.join(p.schema.identifiers) or 'none'}): every party links "
                          "only on columns it declares as identifiers")
    if isinstance(encoding, tuple):
        if len(encoding) != len(alignment.fields):
            raise ConfigError(f"the training linkage had {len(encoding)} field(s), the run "
                              f"file has {len(alignment.fields)}")
        return encoding
    return field_encodings(alignment.fields, private=alignment.privacy == "bloom",
                           primary=p.frame, margin=0.1, sources=(p.source,))



def _connect(ctx: RunContext) -> Federation:
    """The run's federation: given (parties served elsewhere), or built in this process with
    each party's state directory under the run's ``models/``."""
    if ctx.federation is None:
        if ctx.inputs is None:  # pragma: no cover - the load stage ran
            raise ConfigError("the align stage needs the parties' tables")
        ctx.federation = in_process(ctx.inputs, ctx.config, transcript=ctx.transcript,
                                    state_root=ctx.models_dir)
    return ctx.federation


def _run_stage(ctx: RunContext) -> Prepared:
    """The align stage of a run through a federation (every method but psu)."""
    return prepare(ctx.config, ctx.inputs, transcript=ctx.transcript, federation=_connect(ctx))


def _psu_stage(ctx: RunContext) -> Prepared:
    """The align stage of a union run: hide, then PSU, with the strategy's fractions."""
    if ctx.inputs is None:  # pragma: no cover - the load stage ran
        raise ConfigError("the align stage needs the parties' tables")
    return prepare_psu(ctx.config, ctx.inputs, ctx.federation,
                       fractions=union_fractions(ctx.config), transcript=ctx.transcript)


ALIGNMENTS: Registry[AlignmentMethod] = Registry("alignment method")
ALIGNMENTS.add("exact", AlignmentMethod("exact", prepare_exact, _run_stage))
ALIGNMENTS.add("soft", AlignmentMethod("soft", prepare_soft, _run_stage))
ALIGNMENTS.add("fields", AlignmentMethod("fields", prepare_fields, _run_stage))
ALIGNMENTS.add("psi", AlignmentMethod("psi", prepare_psi, _run_stage))
ALIGNMENTS.add("psu", AlignmentMethod("psu", prepare_psu, _psu_stage, plan="union"))
