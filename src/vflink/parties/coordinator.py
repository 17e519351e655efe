"""The coordinator: matches keyed hashes (and, for soft linkage, encodings) without raw data.

It sees only what the boundary table in ARCHITECTURE.md allows: digests or encodings in, and
alignment indices out — similarities go to the primary only.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from vflink.alignment.exact import exact_alignment
from vflink.errors import ConfigError, DataError, LinkageError, PolicyViolation, ProtocolError
from vflink.linkage import SearchOptions, SoftLinkage, soft_linkage, tau_for_sigma
from vflink.linkage.api import search_neighbours
from vflink.linkage.comparison import DEFAULT_LEVELS, FieldComparator
from vflink.linkage.decisions import ONE_TO_ONE, match_clusters
from vflink.linkage.fellegi_sunter import CARDINALITIES
from vflink.linkage.fields import Blocking, FieldSpec, FieldValues, field_scales, search_fields
from vflink.linkage.model_link import MODELS, all_or_none, model_linkage
from vflink.linkage.scoring import candidate_pairs, value_codes
from vflink.parties.base import Party
from vflink.parties.policy import ROLE_UNKNOWN, PartyPolicy
from vflink.protocol.boundary import refuse
from vflink.protocol.messages import (
    Ack,
    AlignmentView,
    AlignmentViews,
    FetchAlignment,
    FetchKeyTags,
    FieldEncodings,
    FieldLink,
    IdentifierEncodings,
    KeyDigests,
    KeyTag,
    KeyTags,
    MatchKeys,
    SoftLink,
)
from vflink.protocol.sessions import COORDINATION, purpose_of
from vflink.randomness import secret_generator
from vflink.types import Alignment

__all__ = ["CoordinatorParty"]

log = logging.getLogger(__name__)


@dataclass
class _Session:
    digests: dict[str, npt.NDArray[np.uint8]] = field(default_factory=dict)
    encodings: dict[str, tuple[str, Any]] = field(default_factory=dict)
    primary: str | None = None
    alignments: dict[str, Alignment] = field(default_factory=dict)
    linkages: dict[str, SoftLinkage] = field(default_factory=dict)
    opener: str | None = None  # the data party that opened it (its primary, in the protocol)
    key_tags: dict[tuple[str, str], npt.NDArray[np.uint8]] = field(default_factory=dict)
    #: multi-field encodings per party: (encoders, values per field, blocking-key digests)
    fields: dict[str, tuple[tuple[str, ...], tuple[Any, ...], tuple[Any, ...]]] = field(
        default_factory=dict)
    #: per party, each field's exact-agreement hashes (a model link)
    exact: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    #: seconds the link spent in each of its steps (candidates, model, decide): coordinator-side
    seconds: dict[str, float] = field(default_factory=dict)


#: Which comparison metrics each field encoder admits: keyed Bloom filters are
#: compared by Dice distance only; raw metrics need raw values (privacy off).
_FIELD_METRICS = {"bloom": ("hamming",), "raw": ("euclidean", "haversine"),
                  "string": ("levenshtein", "jaro-winkler", "token-set", "exact", "date")}


def _key_texts(digests: npt.NDArray[np.uint8]) -> list[str]:
    """Blocking digests as hashable texts for :func:`search_fields`; "" for no key."""
    present = np.asarray(digests.any(axis=1), dtype=bool).tolist()
    return [row.tobytes().hex() if has else "" for row, has in zip(digests, present,
                                                                     strict=True)]


def _timed(seconds: dict[str, float], step: str, since: float) -> float:
    """Add the time since ``since`` to ``seconds[step]``; the time now."""
    now = time.perf_counter()
    seconds[step] = seconds.get(step, 0.0) + now - since
    return now


def view_of(session: str, alignment: Alignment, *, with_similarity: bool,
            primary: str = "") -> AlignmentView:
    return AlignmentView(
        session=session,
        secondary=alignment.secondary,
        primary_index=alignment.primary_index,
        secondary_index=alignment.secondary_index,
        similarity=alignment.similarity if with_similarity else None,
        meta=dict(alignment.meta) if with_similarity else {},
        primary=primary,
        match=alignment.match if with_similarity else None,
    )


def _comparators(message: FieldLink) -> list[FieldComparator]:
    """Each field's comparison levels of a model link (the request's own, else its kind's
    default), refused in the coordinator's words when they are not 1 to
    :data:`~vflink.linkage.comparison.MAX_THRESHOLDS` similarities in (0, 1), highest first."""
    out: list[FieldComparator] = []
    problems: list[str] = []
    for i, c in enumerate(message.fields):
        try:
            out.append(FieldComparator(name=f"field{i}",
                                       thresholds=c.levels or DEFAULT_LEVELS.get(c.kind,
                                                                                 (0.8, 0.6)),
                                       tf=c.tf))
        except ConfigError as exc:  # the request's own numbers: safe to tell
            problems.extend(exc.problems)
    if problems:
        raise refuse(ProtocolError, "the coordinator cannot compare with the requested levels: "
                                    + "; ".join(problems), code="link.levels")
    return out


class CoordinatorParty(Party):
    """Matches digests (exact) or links encodings (soft linkage) for the data parties.

    Args:
        name: the coordinator's party name.
        seed: seeds the Eq. 2 similarity noise, only where the run or the coordinator's party
            file asked for reproducible noise (``[privacy] reproducible_noise``: not private,
            the alignment's meta says so); ``None`` (the default) draws it from the secret
            source (:mod:`vflink.randomness`). It is the coordinator's own: never taken from a
            data party.
        search: top-K search options (exact or approximate, chunk size, threads).
    """

    role = "coordinator"

    def __init__(self, name: str = "coordinator", *, seed: int | None = None,
                 search: SearchOptions | None = None, roles: Mapping[str, str] | None = None,
                 policy: PartyPolicy | None = None) -> None:
        super().__init__(name, roles=roles, policy=policy)
        self._seed = seed
        # secret: one ChaCha20 stream keyed from the OS for every session (vflink.randomness),
        # made on the first noise drawn (:meth:`_noise_rng`)
        self._rng: np.random.Generator | None = None
        self._search = search
        # Σ 1/(σ·σ0)² of the noisy similarities each (primary, secondary) has received: the
        # precision of their average, which the policy's max_combined_tau bounds
        self._released: dict[tuple[str, str], float] = {}

    def _noise_rng(self, session: str) -> np.random.Generator:
        """With a seed, each session's noise depends on (seed, the session's purpose) only, so
        a long-lived coordinator gives the same linkage as a fresh in-process one (a run names
        its sessions ``purpose@<run id>``); without, OS entropy."""
        if self._seed is None:
            if self._rng is None:
                self._rng = secret_generator()
            return self._rng
        return np.random.default_rng([self._seed, zlib.crc32(purpose_of(session).encode())])

    @property
    def _sessions(self) -> dict[str, _Session]:
        """Each coordination session's state, by name (the session table keeps them)."""
        return {s.name: self._state_of(s) for s in self.sessions.sessions(COORDINATION.name)}

    @staticmethod
    def _state_of(session: Any) -> _Session:
        state: _Session | None = session.data.get("coordinator")
        if state is None:
            state = session.data["coordinator"] = _Session(opener=session.opener)
        return state

    def linkage(self, session: str, secondary: str) -> SoftLinkage:
        """The coordinator's full linkage result (raw distances included): coordinator-side.
        ``session`` is a session's name or, when one session has it, its purpose."""
        name, state = self._named(session)
        try:
            return state.linkages[secondary]
        except KeyError:
            raise ProtocolError(f"no linkage for {secondary!r} in session {name!r}") from None

    def seconds(self, session: str) -> dict[str, float]:
        """How long the link of ``session`` took in each of its steps, coordinator-side: the
        candidates (the search, or the blocking rules' pairs), the model (a model link's
        scores and decisions) and the decisions (Eq. 1-2: normalise, then noise)."""
        return dict(self._named(session)[1].seconds)

    def _named(self, session: str) -> tuple[str, _Session]:
        """A session's name and state, by its name or, when one session has it, its purpose."""
        sessions = self._sessions
        if session not in sessions:
            named = [n for n in sessions if purpose_of(n) == session]
            session = named[0] if len(named) == 1 else session
        state = sessions.get(session)
        return session, state if state is not None else _Session()

    def _session(self, session: str, sender: str | None = None) -> _Session:
        """The state of the session being handled; the session table admitted the message
        (its declaration: who may submit, how often, and that a linked session is final)."""
        del sender
        current = self.session
        if current.name != session:  # pragma: no cover - the table keys sessions by name
            raise ProtocolError(f"session {session!r} is not the one being handled")
        return self._state_of(current)

    def on_key_digests(self, sender: str, message: KeyDigests) -> Ack:
        digests = np.asarray(message.digests)
        if digests.ndim != 2 or digests.shape[1] != 32:
            raise refuse(ProtocolError, "key digests must be an (n, 32) array of HMAC-SHA256 "
                                        "digests", code="digests.shape")
        self._session(message.session, sender).digests[sender] = digests
        log.info("coordinator: %d key digests from %s", len(message.digests), sender)
        return Ack(info={"rows": float(len(message.digests))})

    # Key confirmation (vflink.alignment.confirm): the coordinator only relays the tags; it holds
    # no secret, so it can neither check nor forge them.

    def on_key_tag(self, sender: str, message: KeyTag) -> Ack:
        tag = np.asarray(message.tag, dtype=np.uint8)
        if tag.shape != (32,):
            raise refuse(ProtocolError, "a key-confirmation tag is 32 bytes", code="key-tag.shape")
        self._session(message.session, sender).key_tags[(message.nonce, sender)] = tag
        return Ack()

    def on_fetch_key_tags(self, sender: str, message: FetchKeyTags) -> KeyTags:
        tags = self._session(message.session, sender).key_tags
        absent = [p for p in message.parties if (message.nonce, p) not in tags]
        if absent:
            raise refuse(ProtocolError, f"no key-confirmation tag from {absent} in session "
                                        f"{message.session!r}", code="key-tag.missing")
        stacked = (np.stack([tags[(message.nonce, p)] for p in message.parties])
                   if message.parties else np.zeros((0, 32), dtype=np.uint8))
        return KeyTags(session=message.session, nonce=message.nonce, parties=message.parties,
                       tags=stacked)

    def _complete(self, session: str, parties: list[str], store: str, what: str) -> _Session:
        """The session, once every party in ``parties`` has submitted its ``store``; the first
        of ``parties`` (the sender) must be allowed to link it with the others."""
        # who may link (the primary, or the party that opened the session when roles are not
        # configured) and that a linked session is final are the declaration's (COORDINATION)
        sender, *secondaries = parties
        s = self._session(session)
        if not secondaries or len(set(secondaries)) != len(secondaries) or sender in secondaries:
            raise refuse(ProtocolError, "a link request must name distinct secondary parties "
                                        "other than the sender", code="link.secondaries")
        for sec in secondaries:
            sec_role = None if self.roles is None else self.roles.get(sec, ROLE_UNKNOWN)
            if sec_role not in (None, "secondary", ROLE_UNKNOWN):
                raise refuse(PolicyViolation, f"{sec!r} is not a secondary party",
                             code="role")
        absent = [p for p in parties if p not in getattr(s, store)]
        if absent:
            raise refuse(ProtocolError, f"session {session!r} has no {what} from {absent}",
                         code="session.incomplete")
        return s

    def _check_noise(self, message: SoftLink | FieldLink) -> None:
        """Refuse a request outside the coordinator's own limits before any work: K, the
        Eq. 2 noise (σ ≥ min_sigma, τ ≤ max_tau) and the reused Eq. 1 scale."""
        policy = self.policy
        if isinstance(message.top_k, bool) or not 1 <= message.top_k <= policy.max_top_k:
            raise refuse(PolicyViolation, f"top_k must be in [1, {policy.max_top_k}] "
                                          "(policy.max_top_k)", code="limit.top-k")
        if message.mode not in ("soft", "top1", "exact"):
            raise refuse(ProtocolError, "mode must be soft, top1 or exact", code="link.mode")
        if message.scale and (len(message.scale) != 2 or not all(map(math.isfinite,
                                                                      message.scale))
                              or message.scale[1] < 0):
            # σ0 = 0 is a fitted scale too: the training links' distances were all equal (e.g.
            # exact identifiers), so Eq. 1 gives ρ = 0 everywhere and nothing is revealed
            raise refuse(ProtocolError, "scale must be (mu0, sigma0) with finite values and "
                                        "sigma0 >= 0", code="link.scale")
        if message.mode == "exact" or not policy.requires_noise:
            return  # exact links carry no distance information
        sigma, tau = message.sigma, message.tau
        if tau is not None and sigma is not None:
            # τ with a fallback σ (the runners' private default): the σ actually used depends
            # on the data's spread, and _check_released checks it after the link
            sigma = None
        if (sigma is None and tau is None) or (sigma is not None and (
                sigma < policy.min_sigma or (sigma == 0 and policy.max_tau < 1))) or (
                tau is not None and tau > policy.max_tau * (1 + 1e-9)):
            raise refuse(PolicyViolation,
                         f"the coordinator releases similarities only with noise sigma >= "
                         f"{policy.min_sigma:g} and a greedy-attack bound tau <= "
                         f"{policy.max_tau:g} (its policy); the request asks for sigma = "
                         f"{message.sigma}, tau = {tau}", code="policy.noise")

    def _link(self, primary: Any, secondary: Any, *, metric: str, top_k: int, mode: str,
              rng: Callable[[], np.random.Generator], seconds: dict[str, float],
              tau: float | None = None,
              sigma: float | None = None, delta: float = 1e-5,
              scale: tuple[float, float] | None = None) -> SoftLinkage:
        """The top-K search, then Eq. 1-2 (:func:`soft_linkage`), each step timed. ``rng``
        gives the noise's generator, asked for only when noise is drawn."""
        try:
            clock = time.perf_counter()
            neighbours, n_secondary = search_neighbours(primary, secondary, metric=metric,
                                                        top_k=top_k, search=self._search,
                                                        compute=self.compute)
            clock = _timed(seconds, "candidates", clock)
            linkage = soft_linkage(neighbours, metric=metric, n_secondary=n_secondary,
                                   mode=mode,  # type: ignore[arg-type]
                                   tau=tau, sigma=sigma, delta=delta, rng=rng, scale=scale)
            _timed(seconds, "decide", clock)
            return linkage
        except LinkageError as exc:
            # The linkage package's errors concern parameters and sizes (an unreachable τ and
            # its τ_min, K against the table size), never identifier values: safe to tell.
            raise refuse(LinkageError, str(exc), code="link.parameters") from None
        except DataError as exc:
            # Encodings that do not fit the metric or each other (raw numbers for a string
            # metric, widths that differ): what peers sent, so a protocol fault here. The
            # message may quote identifier values, so it stays in this party's log.
            log.warning("coordinator: encodings refused: %s", exc)
            raise refuse(ProtocolError, "the encoded identifiers do not fit the requested "
                         "metric or each other", code="encodings.metric") from None

    def _charge_release(self, primary: str, secondary: str, lk: SoftLinkage,
                        mode: str) -> None:
        """Count these noisy similarities against what ``primary`` already received of
        ``secondary``'s, or refuse them. Fresh noise per release means n releases of one link,
        averaged, carry noise σ/√n (σ·σ0 in distance units: Σ 1/(σ_r·σ0_r)² adds up), and
        FedSim Theorem 2's greedy attack on that average succeeds with τ(σ_eff); a release is
        refused when that combined τ would exceed the policy's ``max_combined_tau`` (or the
        release's own τ, where the caller accepted a larger one)."""
        policy = self.policy
        if (mode == "exact" or policy.max_combined_tau >= 1.0
                or not (lk.sigma > 0.0 and lk.sigma0 > 0.0 and lk.tau < 1.0)):
            return
        key = (primary, secondary)
        precision = self._released.get(key, 0.0) + 1.0 / (lk.sigma * lk.sigma0) ** 2
        sigma_eff = 1.0 / (math.sqrt(precision) * lk.sigma0)
        combined = tau_for_sigma(sigma_eff, lk.sigma0, resolution=lk.resolution)
        if combined > max(policy.max_combined_tau, lk.tau) * (1 + 1e-9):
            raise refuse(PolicyViolation,
                         f"this link's similarities, averaged with those of {secondary} this "
                         f"primary already received, would give a greedy-attack bound "
                         f"τ = {combined:.4g} (FedSim Theorem 2 at the averaged noise "
                         f"σ = {sigma_eff:.4g}); the coordinator's policy allows "
                         f"max_combined_tau = {policy.max_combined_tau:g} (ask its "
                         f"operator, or link again after the coordinator restarts)",
                         code="policy.combined_noise")
        self._released[key] = precision

    def _check_released(self, linkage: SoftLinkage, mode: str) -> None:
        policy = self.policy
        if mode == "exact" or not policy.requires_noise:
            return
        if linkage.sigma < policy.min_sigma or linkage.tau > policy.max_tau * (1 + 1e-9):
            raise refuse(PolicyViolation,
                         f"the requested noise gives sigma = {linkage.sigma:.6g} and tau = "
                         f"{linkage.tau:.6g}; the coordinator's policy needs sigma >= "
                         f"{policy.min_sigma:g} and tau <= {policy.max_tau:g}",
                         code="policy.noise")

    def on_match_keys(self, sender: str, message: MatchKeys) -> AlignmentViews:
        s = self._complete(message.session, [sender, *message.secondaries], "digests",
                           "key digests")
        s.primary = sender
        views = []
        for sec in message.secondaries:
            alignment = exact_alignment(s.digests[sender], s.digests[sec], sec)
            s.alignments[sec] = alignment
            views.append(view_of(message.session, alignment, with_similarity=True,
                                 primary=sender))
        return AlignmentViews(views=tuple(views))

    def on_identifier_encodings(self, sender: str, message: IdentifierEncodings) -> Ack:
        if message.encoder not in ("bloom", "raw", "string"):
            raise refuse(ProtocolError, "unknown identifier encoder; valid: bloom, raw, string",
                         code="encodings.encoder")
        if isinstance(message.values, np.ndarray) and message.values.ndim != 2:
            raise refuse(ProtocolError, "encoded identifiers must be one row per record",
                         code="encodings.shape")
        if len(message.values) == 0:  # nothing to link; refused here, not deep in linkage
            raise refuse(ProtocolError, "no encoded identifiers: a party links at least one "
                         "record", code="encodings.empty")
        s = self._session(message.session, sender)
        s.encodings[sender] = (message.encoder, message.values)
        log.info("coordinator: %d %s encodings from %s", len(message.values), message.encoder,
                 sender)
        return Ack(info={"rows": float(len(message.values))})

    def on_soft_link(self, sender: str, message: SoftLink) -> AlignmentViews:
        self._check_noise(message)
        needed = [sender, *message.secondaries]
        s = self._complete(message.session, needed, "encodings", "identifier encodings")
        encoders = {s.encodings[p][0] for p in needed}
        if len(encoders) != 1:
            raise ProtocolError(f"coordinator: parties used different encoders {sorted(encoders)}")
        s.primary = sender
        anchor = message.secondaries[0]
        linkage = self._link(s.encodings[sender][1], s.encodings[anchor][1], metric=message.metric,
                             top_k=message.top_k, mode=message.mode, tau=message.tau,
                             sigma=message.sigma, delta=message.delta,
                             rng=lambda: self._noise_rng(message.session),
                             seconds=s.seconds,
                             scale=(message.scale[0], message.scale[1]) if message.scale
                             else None)
        return self._release(message.session, s, message.secondaries, message.mode, linkage,
                             lambda sec: self._link(
                                 s.encodings[anchor][1], s.encodings[sec][1],
                                 metric=message.metric, top_k=1, mode="top1",
                                 rng=lambda: self._noise_rng(f"{message.session}/{sec}"),
                                 seconds=s.seconds), similarities=message.similarities)

    def _release(self, session: str, s: _Session, secondaries: tuple[str, ...], mode: str,
                 linkage: SoftLinkage, hop_to: Callable[[str], SoftLinkage], *,
                 similarities: bool = True) -> AlignmentViews:
        """Keep the anchor's linkage and chain the other secondaries to it; the views
        (``similarities=False``: the primary's without its similarities, as it asked)."""
        # FedSim App. C: the first secondary is soft-linked (top-K) to the primary; every other
        # secondary is linked one-to-one to that first one, so a primary record's k-th pair is
        # the chain primary → first secondary → others. K^(n-1) pairs would not scale.
        anchor, *others = secondaries
        self._check_released(linkage, mode)
        # the primary receives the anchor's similarities only (a chain carries them)
        self._charge_release(s.primary or "", anchor, linkage, mode)
        s.linkages[anchor] = linkage
        # released all the same (charged above): a primary that declines them in its view
        # reads them elsewhere (the links file of an in-process link)
        first = linkage.to_alignment(anchor, include_similarity=similarities)
        if self._seed is not None:  # the ledger says the noise can be regenerated
            first.meta["reproducible_noise"] = 1.0
        s.alignments[anchor] = first
        views = [view_of(session, first, with_similarity=True, primary=s.primary or "")]
        hops: list[tuple[int, int, Any, Any]] = []
        for number, sec in enumerate(others, start=2):
            one = hop_to(sec)
            s.linkages[sec] = one
            hop = one.indices[:, 0]
            chained = np.where(first.secondary_index >= 0,
                               hop[np.maximum(first.secondary_index, 0)], -1)
            match = first.match
            if match is not None and one.matches is not None:
                # a chain is a match when both of its links are (a model link's decisions)
                hop_match = one.matches[:, 0]
                match = match & np.where(first.secondary_index >= 0,
                                         hop_match[np.maximum(first.secondary_index, 0)], False)
                rows = np.flatnonzero(hop_match)
                hops.append((1, number, rows, hop[rows]))
            alignment = Alignment(first.primary_index, chained, first.similarity, sec,
                                  dict(first.meta), match)
            s.alignments[sec] = alignment
            views.append(view_of(session, alignment, with_similarity=True,
                                 primary=s.primary or ""))
        if hops and linkage.matches is not None:
            # records of every party joined by matched pairs: the clusters of a model link
            sizes = [len(linkage), linkage.n_secondary,
                     *(s.linkages[sec].n_secondary for sec in others)]
            r, c = np.nonzero(linkage.matches)
            labels = match_clusters(sizes, [(0, 1, r, linkage.indices[r, c]), *hops])
            counts = np.bincount(np.concatenate(labels))
            linkage.model["clusters"] = {"parties": len(sizes),
                                         "clusters": int((counts >= 2).sum()),
                                         "records_in_clusters": int(counts[counts >= 2].sum()),
                                         "all_parties": int((counts == len(sizes)).sum())}
        return AlignmentViews(views=tuple(views))

    # --- several fields (docs/how-to/linkage.md) -------------------------------------------------

    def on_field_encodings(self, sender: str, message: FieldEncodings) -> Ack:
        encoders, values, keys = message.encoders, message.values, message.keys
        if not encoders or len(encoders) != len(values):
            raise refuse(ProtocolError, "field encodings need one encoder per field and at "
                                        "least one field", code="encodings.fields")
        rows: set[int] = set()
        for enc, v in zip(encoders, values, strict=True):
            if enc not in _FIELD_METRICS:
                raise refuse(ProtocolError, "unknown field encoder; valid: bloom, raw, string",
                             code="encodings.encoder")
            if enc == "string":
                ok = isinstance(v, tuple)
            else:
                ok = isinstance(v, np.ndarray) and v.ndim == 2 and (
                    v.dtype == np.uint8 if enc == "bloom" else v.dtype.kind == "f")
            if not ok:
                raise refuse(ProtocolError, "a field's values must be packed uint8 filters "
                                            "(bloom), a float matrix (raw) or strings (string), "
                                            "one row per record", code="encodings.shape")
            rows.add(len(v))
        for k in keys:
            if not (isinstance(k, np.ndarray) and k.dtype == np.uint8 and k.ndim == 2
                    and k.shape[1] == 32):
                raise refuse(ProtocolError, "blocking keys must be (n, 32) uint8 HMAC-SHA256 "
                                            "digests", code="digests.shape")
            rows.add(len(k))
        if message.exact and len(message.exact) != len(encoders):
            raise refuse(ProtocolError, "exact-agreement hashes come one per field",
                         code="encodings.exact")
        for h in message.exact:
            if not (isinstance(h, np.ndarray) and h.dtype == np.uint8 and h.ndim == 2
                    and h.shape[1] == 16):
                raise refuse(ProtocolError, "exact-agreement hashes must be (n, 16) uint8 "
                                            "keyed digests", code="digests.shape")
            rows.add(len(h))
        if len(rows) != 1:
            raise refuse(ProtocolError, "every field and blocking key needs one row per record",
                         code="encodings.shape")
        s = self._session(message.session, sender)
        s.fields[sender] = (tuple(encoders), tuple(values), tuple(keys))
        s.exact[sender] = tuple(message.exact)
        n = rows.pop()
        log.info("coordinator: %d records × %d field(s) (%s), %d blocking key(s) from %s", n,
                 len(encoders), ", ".join(encoders), len(keys), sender)
        return Ack(info={"rows": float(n)})

    def _field_specs(self, message: FieldLink, parties: list[str], s: _Session
                     ) -> tuple[FieldSpec, ...]:
        """The coordinator's field specs from the request, after checking that every party
        sent the same fields, encoders and widths and that each metric suits its encoder."""
        first = s.fields[parties[0]]
        n_fields = len(message.fields)
        for p in parties:
            encoders, values, keys = s.fields[p]
            if len(encoders) != n_fields or encoders != first[0]:
                raise refuse(ProtocolError, "the parties' field encodings differ from the "
                                            "request (number of fields or encoders)",
                             code="link.fields")
            widths = [v.shape[1] if isinstance(v, np.ndarray) else 0 for v in values]
            if widths != [v.shape[1] if isinstance(v, np.ndarray) else 0 for v in first[1]]:
                raise refuse(ProtocolError, "the parties' encodings of a field differ in width",
                             code="link.fields")
            if len(keys) != message.blocking:
                raise refuse(ProtocolError, f"the request names {message.blocking} blocking "
                                            "key(s); a party sent another number",
                             code="link.blocking")
        specs = []
        for i, (comparison, enc, v) in enumerate(zip(message.fields, first[0], first[1],
                                                     strict=True)):
            if comparison.metric not in _FIELD_METRICS[enc]:
                raise refuse(ProtocolError, f"field {i}: metric {comparison.metric!r} does not "
                                            f"compare {enc!r} encodings (valid: "
                                            f"{', '.join(_FIELD_METRICS[enc])})",
                             code="link.metric")
            width = v.shape[1] if enc == "raw" else 1
            try:
                specs.append(FieldSpec(on=tuple(f"field{i}.{j}" for j in range(width)),
                                       metric=comparison.metric, weight=comparison.weight,
                                       scale=comparison.scale))
            except ConfigError as exc:  # the request's own numbers: safe to tell
                raise refuse(ProtocolError, f"field {i}: {'; '.join(exc.problems)}",
                             code="link.fields") from None
        return tuple(specs)

    def _link_fields(self, specs: tuple[FieldSpec, ...], primary: tuple[Any, ...],
                     secondary: tuple[Any, ...], *, top_k: int, mode: str,
                     tau: float | None = None, sigma: float | None = None,
                     delta: float = 1e-5, rng: np.random.Generator,
                     scale: tuple[float, ...] = (),
                     seconds: dict[str, float] | None = None) -> SoftLinkage:
        """search_fields (weighted mean of per-field normalised distances, blocking on equal
        digests) then Eq. 1-2 (:func:`soft_linkage`) on the weighted distance."""
        n_keys = len(primary[2])
        p = FieldValues(primary[1], tuple(_key_texts(k) for k in primary[2]))
        q = FieldValues(secondary[1], tuple(_key_texts(k) for k in secondary[2]))
        blocking = tuple(Blocking(on=f"key{b}") for b in range(n_keys))
        seconds = {} if seconds is None else seconds
        try:
            clock = time.perf_counter()
            neighbours = search_fields(specs, p, q, top_k, blocking=blocking)
            clock = _timed(seconds, "candidates", clock)
            linkage = soft_linkage(neighbours, metric="fields", n_secondary=len(q),
                                   mode=mode, tau=tau, sigma=sigma,  # type: ignore[arg-type]
                                   delta=delta, rng=rng,
                                   scale=(scale[0], scale[1]) if scale else None)
            _timed(seconds, "decide", clock)
            return linkage
        except (LinkageError, ConfigError, DataError) as exc:
            # parameters and sizes (K against the table size, an unreachable τ), never values
            raise refuse(LinkageError, str(exc), code="link.parameters") from None

    def _model_link(self, message: FieldLink, specs: tuple[FieldSpec, ...], s: _Session,
                    primary: str, secondary: str, rng: np.random.Generator) -> SoftLinkage:
        """A Fellegi–Sunter link (:func:`vflink.linkage.model_link.model_linkage`) of the two
        parties' encodings: candidates from the blocking digests (every pair, or a search's
        nearest, without them), levels from the encodings and the exact-agreement hashes."""
        if message.model not in MODELS:
            raise refuse(ProtocolError, f"unknown linkage model; valid: {', '.join(MODELS)}",
                         code="link.model")
        if message.one_to_one not in ("", *ONE_TO_ONE) or not (
                0.0 < message.threshold < 1.0) or message.cardinality not in (
                "", *CARDINALITIES):
            raise refuse(ProtocolError, "a model link's threshold is a probability in (0, 1), "
                                        "one_to_one one of optimal, greedy or empty, and "
                                        "cardinality one of "
                                        f"{', '.join(CARDINALITIES)} or empty",
                         code="link.model")
        if message.rule_atoms and (
                len(message.rule_atoms) != message.blocking
                or any(not atoms or any(isinstance(a, bool) or not isinstance(a, int)
                                        or a >= len(specs) for a in atoms)
                       for atoms in message.rule_atoms)):
            raise refuse(ProtocolError, "rule_atoms name, per blocking key, one field index "
                                        "(or a negative number) per column",
                         code="link.blocking")
        ours, theirs = s.fields[primary], s.fields[secondary]
        exact_p, exact_s = s.exact.get(primary, ()), s.exact.get(secondary, ())
        if len(exact_p) != len(specs) or len(exact_s) != len(specs):
            raise refuse(ProtocolError, "a model link needs every party's exact-agreement "
                                        "hashes, one per field", code="link.exact")
        comparators = _comparators(message)
        fields = [(enc, spec.metric or "hamming", a, b) for enc, spec, a, b in
                  zip(ours[0], specs, ours[1], theirs[1], strict=True)]
        codes = [value_codes(a, b) for a, b in zip(exact_p, exact_s, strict=True)]
        # each blocking rule's key as codes (equal digests, equal codes): which rules each
        # candidate pair satisfies, for the estimate of what the rules miss
        rule_keys = [value_codes(a, b) for a, b in zip(ours[2], theirs[2], strict=True)]
        p = FieldValues(ours[1], tuple(_key_texts(k) for k in ours[2]))
        q = FieldValues(theirs[1], tuple(_key_texts(k) for k in theirs[2]))
        try:
            clock = time.perf_counter()
            scales = field_scales(specs, p, q)
            ranks = None
            if ours[2]:
                rows, cols, rules = candidate_pairs(p.keys, q.keys)
            else:
                rules = []
                found = all_or_none(len(p), len(q))
                if found is None:  # each primary record's nearest by the field distance
                    near = search_fields(specs, p, q, min(len(q), max(message.top_k, 10)),
                                         scales=scales)
                    r, c = np.nonzero(near.indices >= 0)
                    found = (r.astype(np.int64), near.indices[r, c].astype(np.int64))
                    ranks = c.astype(np.int64)
                rows, cols = found
            clock = _timed(s.seconds, "candidates", clock)
            linkage = model_linkage(
                comparators, fields, codes, candidates=(rows, cols), top_k=message.top_k,
                rng=np.random.default_rng(rng.integers(2**63)), noise_rng=rng,
                mode=message.mode,  # type: ignore[arg-type]
                tau=message.tau, sigma=message.sigma, delta=message.delta,
                scale=(message.scale[0], message.scale[1]) if message.scale else None,
                threshold=message.threshold, one_to_one=message.one_to_one or None,
                field_weights=[c.weight for c in message.fields], scales=scales,
                blocking=rules, cardinality=message.cardinality or None,
                kinds=[c.kind for c in message.fields], rule_keys=rule_keys,
                rule_atoms=message.rule_atoms, candidate_ranks=ranks)
            _timed(s.seconds, "model", clock)
            return linkage
        except (LinkageError, ConfigError, DataError) as exc:
            # parameters and sizes (K, blocking sizes, an unreachable τ), never values
            raise refuse(LinkageError, str(exc), code="link.parameters") from None

    def on_field_link(self, sender: str, message: FieldLink) -> AlignmentViews:
        self._check_noise(message)
        if not message.fields:
            raise refuse(ProtocolError, "a field link needs at least one field",
                         code="link.fields")
        if message.model:
            _comparators(message)  # the levels of every field, before any work
        needed = [sender, *message.secondaries]
        s = self._complete(message.session, needed, "fields", "field encodings")
        specs = self._field_specs(message, needed, s)
        s.primary = sender
        anchor = message.secondaries[0]
        session = message.session
        if message.model:
            linkage = self._model_link(message, specs, s, sender, anchor,
                                       self._noise_rng(session))
            hop = dataclasses.replace(message, top_k=1, mode="top1")
            return self._release(session, s, message.secondaries, message.mode, linkage,
                                 lambda sec: self._model_link(
                                     hop, specs, s, anchor, sec,
                                     self._noise_rng(f"{session}/{sec}")),
                                 similarities=message.similarities)
        else:
            linkage = self._link_fields(specs, s.fields[sender], s.fields[anchor],
                                        top_k=message.top_k, mode=message.mode, tau=message.tau,
                                        sigma=message.sigma, delta=message.delta,
                                        rng=self._noise_rng(session), scale=message.scale,
                                        seconds=s.seconds)
        return self._release(session, s, message.secondaries, message.mode, linkage,
                             lambda sec: self._link_fields(
                                 specs, s.fields[anchor], s.fields[sec], top_k=1, mode="top1",
                                 rng=self._noise_rng(f"{session}/{sec}"), seconds=s.seconds),
                             similarities=message.similarities)

    def adopt(self, session: str, alignments: dict[str, Alignment], *,
              primary: str = "") -> None:
        """Serve ``alignments`` under ``session`` (an alignment computed elsewhere in this
        process, e.g. the per-split linkage of ``alignment.pool = "split"``), linked for
        ``primary``."""
        opened = self.sessions.open(COORDINATION, session, opener=primary, state="linked")
        state = self._state_of(opened)
        state.primary = primary or None
        state.alignments.update(alignments)

    def on_fetch_alignment(self, sender: str, message: FetchAlignment) -> AlignmentView:
        s = self._session(message.session)
        if sender not in s.alignments:
            raise refuse(ProtocolError, f"the coordinator has no alignment for {sender!r} in "
                                        f"session {message.session!r}",
                         code="session.no-alignment")
        # Similarities are for the primary only (ARCHITECTURE.md, boundary table).
        return view_of(message.session, s.alignments[sender], with_similarity=False,
                       primary=s.primary or "")
