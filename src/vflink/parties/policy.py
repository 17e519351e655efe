"""Each party's own policy: what it agrees to release, whom it takes orders from, its limits.

In VFL the peers are authenticated but curious (FedSim §5; FLORIST's threat model), so a party
does not let a peer decide its privacy: a secondary releases identifiers only in the forms its
own policy allows, whatever encoding the primary proposes; the coordinator releases similarities
only with at least its own minimum noise (Eq. 2, Theorem 2), whatever σ the primary asks for;
and every party accepts a message kind only from the role that may send it.

The defaults are the private ones: identifiers only as keyed Bloom filters (FedSim App. I),
similarities only with noise (τ < 1), bounded pending state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from vflink._checks import check_choice, check_float, check_int, raise_if
from vflink.errors import ConfigError, PolicyViolation, ProtocolError
from vflink.protocol.boundary import refuse

if TYPE_CHECKING:
    from vflink.protocol.messages import EncodingSpec

__all__ = [
    "DATA_ROLES",
    "DEFAULT_MAX_COMBINED_TAU",
    "DEFAULT_MAX_TAU",
    "IDENTIFIER_RELEASES",
    "PartyPolicy",
    "ROLE_UNKNOWN",
    "SAFE_UNION_FEATURES",
    "SENDERS",
    "UNION_FEATURES",
    "check_coordinator",
    "check_sender",
]

#: Role of a data party whose role the configuration does not say (a coordinator whose party
#: file lists its callers without roles): it may submit, and binds the sessions it opens.
ROLE_UNKNOWN = "data"
DATA_ROLES = frozenset({"primary", "secondary", ROLE_UNKNOWN})
_PRIMARY = frozenset({"primary"})

#: Who may send what, by the receiving party's role (message kind → sender roles). A kind
#: missing here has no role restriction; a new handler should add its kind.
SENDERS: dict[str, dict[str, frozenset[str]]] = {
    "secondary": {kind: _PRIMARY for kind in (
        "share_keys", "share_encodings", "share_field_encodings", "alignment_ready",
        "setup_bottom",
        "fit_preprocessing", "forward", "backward", "snapshot", "restore", "save_state",
        "load_state", "confirm_key", "setup_privacy", "fetch_privacy_report",
        # FLORIST PSU / PSI and union training (primary ⇄ secondary)
        "psu_round1", "psu_chunk", "psu_fetch", "psi_round1", "psi_chunk", "psi_fetch",
        "union_setup",
        "union_forward",
        # a PSI intersection's rows go to the primary that ran it, never to a third party
        "fetch_alignment")},
    "coordinator": {
        "key_digests": DATA_ROLES,
        "identifier_encodings": DATA_ROLES,
        "field_encodings": DATA_ROLES,
        # A sender of unknown role is also checked against the session it links: only the
        # party that opened a session may link it (CoordinatorParty).
        "match_keys": frozenset({"primary", ROLE_UNKNOWN}),
        "soft_link": frozenset({"primary", ROLE_UNKNOWN}),
        "field_link": frozenset({"primary", ROLE_UNKNOWN}),
        "fetch_alignment": DATA_ROLES,
        # key confirmation (vflink.alignment.confirm): the coordinator only relays tags
        "key_tag": DATA_ROLES,
        "fetch_key_tags": DATA_ROLES,
    },
}

IDENTIFIER_RELEASES = ("bloom", "any")
#: FLORIST's synthetic-feature strategies a secondary may fill union training with
UNION_FEATURES = ("fea-sampling", "fea-gaussian", "fea-random", "none")
#: ... and those whose answers carry no membership signal: fea-Gaussian and
#: fea-random draw embeddings off the real ones' distribution, and FLORIST itself measures their
#: attack AUC near 1.0 (Table 2), so a party serves them only when its policy says so
SAFE_UNION_FEATURES = ("fea-sampling", "none")
#: Noise-free similarities have τ = 1 (Theorem 2 with σ = 0): the default refuses them.
DEFAULT_MAX_TAU = 0.9999
#: A primary's releases of one secondary's similarities, averaged together: at the private
#: default τ = 0.05 per release, about 30 releases reach 0.25 (docs/security.md).
DEFAULT_MAX_COMBINED_TAU = 0.25


@dataclass(frozen=True, kw_only=True)
class PartyPolicy:
    """What this party agrees to release, and the limits it keeps.

    Attributes:
        identifiers: ``"bloom"``: identifiers leave this party only as keyed Bloom filters
            (FedSim App. I); ``"any"``: also as raw vectors or strings (explicit opt-out).
        min_sigma: coordinator: the smallest Eq. 2 noise σ it releases similarities with.
        max_tau: coordinator: the largest Theorem 2 greedy-attack bound τ it accepts
            (τ = 1 means no noise, so any value below 1 requires noise). Links in
            ``mode = "exact"`` carry no distance information and are exempt.
        max_combined_tau: coordinator: the largest Theorem 2 bound τ that all the noisy
            similarities one primary has received of one secondary may reach together. Each
            release draws fresh noise, so a primary that asks for the same link n times and
            averages what it gets attacks noise of σ/√n: the coordinator adds up each
            release's precision (1/σ² in distance units), and refuses a release whose
            combined τ would exceed this (or the release's own τ, when that is larger).
            Kept in memory for the coordinator process's life.
        embeddings: the DP this party requires on the embeddings it releases. Only ``"any"``
            exists for now; the VFL-AFE embedding DP adds its (ε, δ) minimum here.
        max_abs_value: largest magnitude accepted in received gradients, embeddings and
            similarities (non-finite values are always refused).
        max_pending_batches: training forwards kept waiting for their Backward.
        pending_ttl_s: a pending forward older than this is dropped.
        max_snapshots: distinct snapshot tags kept.
        max_sessions: unfinished protocol sessions one peer may hold open at once (each peer
            has its own share: one peer's abandoned sessions never lock another out).
        session_ttl_s: an unfinished session that receives no message for this long is dropped
            (minutes: an honest driver sends its next message well within it, and a PSU/PSI
            driver that computes a whole list first sends ``SetProgress`` meanwhile); one
            whose handler is still running never is. The peer's next message is told the
            session expired (``[session.ended]``).
        max_session_s: an unfinished session is dropped this long after it opened, however it
            is kept alive (``SetProgress`` must not let a peer hold its share for ever).
        max_finished_sessions: finished sessions of one peer kept in memory; its least
            recently used make room (a finished alignment is reloaded from
            ``alignments/<session>.parquet`` when asked for again, so nothing is lost).
        max_top_k: largest K a soft-linkage request may ask for.
        max_model_parameters: largest bottom model a SetupBottom may ask this party to build.
        max_set_elements: most group elements in one list a peer sends in a PSU or PSI round
            (FLORIST Alg. 1; ECDH PSI); each costs this party a validity check and an
            exponentiation (~80 µs with ristretto255, ~3.5 ms with modp2048). A PSU union
            may hold this many plus this party's own records.
        min_set_elements: fewest records a peer may align with (its ``n_a``); a non-positive
            size is always refused. PSU reveals |I_a ∩ I_p| and PSI the intersection itself,
            so a one-record set tests one guess: this and ``max_set_sessions`` bound how much
            a peer can test (docs/security.md, "Threat model of the set protocols").
        max_set_sessions: PSU and PSI sessions one peer may open within
            ``set_session_window_s`` (counted in the party's state directory, across
            restarts); each session's answer is information about this party's set. A
            session that ends before this party's first blinded own element left it (expired,
            or failed through this party's own fault, or cut off by a restart) gives it back.
        max_set_guesses: elements one peer may align with this party within
            ``set_session_window_s``, its sessions' ``n_a`` summed (counted and given back as
            the sessions are): each is one guessed identifier to a deviating primary
            (docs/security.md); with the session limit it gives
            :attr:`dictionary_limit`, the figure ``vflink serve`` logs at start.
        set_session_window_s: the window of ``max_set_sessions`` (a day by default).
        max_message_work_s: the work one message of a peer may cause this party, in seconds
            of its own measured speed: the chunk size of PSU/PSI lists is derived from it and
            announced to the peer in round 1 (a longer chunk is refused), so no peer's chunk
            holds the party for long, whatever deadline that peer gives.
        max_spool_bytes: disk one peer's running PSU/PSI sessions may hold in this party's
            spool (reserved when a session opens, from its set sizes).
        max_bloom_bits: longest Bloom filter a peer's encoding request may ask for (string
            and geographic ``filter_bits``; numeric filters: all dimensions' centres).
        max_bloom_hashes: most bits an encoding request may set per q-gram (string
            ``num_hashes``) or per record (geographic: grid tokens × ``num_hashes``).
        max_bloom_centres: most FEDERAL centres of a numeric filter, all dimensions together.
        max_concurrent_calls: calls a served party works on at once (handler calls are
            serialised and handed to the peers in turn, the others wait their turn within
            their deadline); a further call is refused at once as busy. Health requests are
            always answered besides. Union training forwards waiting for their Backward count
            against ``max_pending_batches`` like any training forward.
        max_calls_per_peer: calls one peer may have in progress at once (0: an equal share of
            ``max_concurrent_calls`` among the peers allowed to call).
        receive_timeout_s: a peer's streamed request must send each chunk (its first one
            included) within this of the one before,
        min_receive_bytes_per_s: ... and all of it at this rate at least, or it is cancelled.
        max_saved_states: distinct state files (``SaveState`` names) a secondary keeps for one
            peer (a served party keeps each peer's under ``peers/<peer>/``); a peer names
            them, so their number is bounded (disk).
        max_training_runs: training runs (models, optimisers, preprocessing, snapshots) a
            secondary holds in memory for one peer; a peer's new run drops its own least
            recently used one, never another peer's.
        max_training_bytes: memory one peer's training runs may hold at a secondary (model
            parameters with their optimiser state, snapshots, features encoded in memory); a
            new model that would not fit drops the peer's own older runs first, and is refused
            when it does not fit alone.
        union_features: the synthetic-feature strategies this secondary accepts in FLORIST
            union training; the default only those that carry no membership signal.
    """

    identifiers: str = "bloom"
    min_sigma: float = 0.0
    max_tau: float = DEFAULT_MAX_TAU
    max_combined_tau: float = DEFAULT_MAX_COMBINED_TAU
    embeddings: str = "any"
    max_abs_value: float = 1e6
    max_pending_batches: int = 8
    pending_ttl_s: float = 600.0
    max_snapshots: int = 8
    max_sessions: int = 16
    session_ttl_s: float = 600.0
    max_session_s: float = 86400.0
    max_finished_sessions: int = 64
    max_top_k: int = 1000
    max_model_parameters: int = 50_000_000
    max_set_elements: int = 2_000_000
    min_set_elements: int = 1
    max_set_sessions: int = 200
    max_set_guesses: int = 20_000_000
    set_session_window_s: float = 86400.0
    max_message_work_s: float = 2.0
    max_spool_bytes: int = 8 << 30
    max_bloom_bits: int = 16384
    max_bloom_hashes: int = 4096
    max_bloom_centres: int = 16384
    max_concurrent_calls: int = 8
    max_calls_per_peer: int = 0
    receive_timeout_s: float = 10.0
    min_receive_bytes_per_s: float = 262144.0
    max_saved_states: int = 1000
    max_training_runs: int = 4
    max_training_bytes: int = 4 << 30
    union_features: tuple[str, ...] = SAFE_UNION_FEATURES

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_choice(problems, "policy.identifiers", self.identifiers, IDENTIFIER_RELEASES)
        check_float(problems, "policy.min_sigma", self.min_sigma, min=0.0)
        check_float(problems, "policy.max_tau", self.max_tau, min=0.0, max=1.0,
                    min_exclusive=True)
        check_float(problems, "policy.max_combined_tau", self.max_combined_tau, min=0.0,
                    max=1.0, min_exclusive=True)
        check_choice(problems, "policy.embeddings", self.embeddings, ("any",))
        check_float(problems, "policy.max_abs_value", self.max_abs_value, min=0.0,
                    min_exclusive=True)
        for name in ("max_pending_batches", "max_snapshots", "max_sessions", "max_top_k",
                     "max_model_parameters", "max_set_elements", "max_bloom_bits",
                     "max_bloom_hashes", "max_bloom_centres", "max_concurrent_calls",
                     "max_saved_states", "max_finished_sessions", "min_set_elements",
                     "max_set_sessions", "max_spool_bytes", "max_set_guesses",
                     "max_training_runs", "max_training_bytes"):
            check_int(problems, f"policy.{name}", getattr(self, name), min=1)
        check_int(problems, "policy.max_calls_per_peer", self.max_calls_per_peer, min=0)
        for name in ("pending_ttl_s", "session_ttl_s", "max_session_s", "set_session_window_s",
                     "max_message_work_s", "receive_timeout_s", "min_receive_bytes_per_s"):
            check_float(problems, f"policy.{name}", getattr(self, name), min=0.0,
                        min_exclusive=True)
        if isinstance(self.union_features, list):  # from a TOML array
            object.__setattr__(self, "union_features", tuple(self.union_features))
        if not isinstance(self.union_features, tuple) or not self.union_features:
            problems.append(f"policy.union_features must be a non-empty list of "
                            f"{', '.join(UNION_FEATURES)}, got {self.union_features!r}")
        else:
            for name in self.union_features:
                check_choice(problems, "policy.union_features", name, UNION_FEATURES)
        raise_if(problems, "[policy] section")

    @property
    def dictionary_limit(self) -> int:
        """Identifiers one peer can test against this party's set within
        ``set_session_window_s``: a deviating primary learns, for each element it aligns,
        whether this party holds it (docs/security.md), and its elements per window are
        bounded by ``max_set_guesses`` and by ``max_set_sessions`` sessions of at most
        ``max_set_elements`` each."""
        return min(self.max_set_guesses, self.max_set_sessions * self.max_set_elements)

    def describe_dictionary_limit(self) -> str:
        """The dictionary limit as one sentence (the serve log, the ledger, the docs)."""
        window = self.set_session_window_s
        span = (f"{window / 86400:g} day(s)" if window >= 86400 and window % 86400 == 0
                else f"{window:g} s")
        return (f"a deviating primary can test at most {self.dictionary_limit:,} guessed "
                f"identifiers against this party's set per {span} "
                f"(min(max_set_guesses = {self.max_set_guesses:,}, max_set_sessions = "
                f"{self.max_set_sessions} x max_set_elements = {self.max_set_elements:,}))")

    @property
    def requires_noise(self) -> bool:
        return self.min_sigma > 0.0 or self.max_tau < 1.0

    @classmethod
    def permissive(cls, *, identifiers: str = "any") -> PartyPolicy:
        """No release restriction (limits unchanged): for a run whose single operator owns
        every party and chose the release explicitly (see ``vflink.runner.federation``)."""
        return cls(identifiers=identifiers, min_sigma=0.0, max_tau=1.0, max_combined_tau=1.0,
                   union_features=UNION_FEATURES)

    def check_identifier_release(self, party: str, encoder: str) -> None:
        """Refuse to release identifiers with ``encoder`` unless the policy allows it."""
        if encoder != "bloom" and self.identifiers != "any":
            raise refuse(PolicyViolation,
                         f"party {party!r} releases identifiers only as keyed Bloom filters "
                         f"(its policy: identifiers = \"bloom\"); the request asks for the "
                         f"{encoder!r} encoding, which would send raw identifiers",
                         code="policy.identifiers")


    def check_set_size(self, party: str, what: str, n: int, *, own: int | None = None) -> None:
        """Refuse a PSU/PSI list of ``n`` group elements above ``max_set_elements`` (plus
        ``own``, this party's record count, for a union), before any work on it."""
        if isinstance(n, bool) or not isinstance(n, int):
            raise refuse(ProtocolError, f"party {party!r}: {what} must be a whole number of "
                                        f"elements, got {type(n).__name__}", code="set.size")
        limit = self.max_set_elements + (own or 0)
        if n > limit:
            plus = " plus its own records" if own else ""
            raise refuse(PolicyViolation,
                         f"party {party!r} accepts at most {self.max_set_elements}{plus} group "
                         f"elements per list (policy.max_set_elements); {what} has {n}",
                         code="limit.set-elements")

    def check_peer_set_size(self, party: str, what: str, n: int) -> None:
        """Refuse a peer's set size (its ``n_a``) that is not positive or outside
        [``min_set_elements``, ``max_set_elements``], before any work."""
        self.check_set_size(party, what, n)
        if n < 1:
            raise refuse(ProtocolError, f"party {party!r}: {what} must be a positive number "
                                        f"of records, got {n}", code="set.size")
        if n < self.min_set_elements:
            raise refuse(PolicyViolation,
                         f"party {party!r} aligns with sets of at least "
                         f"{self.min_set_elements} records (policy.min_set_elements); {what} "
                         f"is {n}", code="limit.set-elements")

    def check_encoding(self, party: str, spec: EncodingSpec) -> None:
        """Refuse a peer's Bloom encoding request before any work: malformed or unknown
        parameters (:class:`ProtocolError` ``[encoding.params]``, a validation message naming
        the parameter), or more bits, hashes or centres than this party's limits
        (:class:`PolicyViolation` ``[limit.bloom-*]``). Other encoders take no work
        parameters; their release is :meth:`check_identifier_release`'s business."""
        if spec.encoder != "bloom":
            return
        from vflink.linkage.encoding.bloom import BloomConfig, NumericRange
        from vflink.linkage.encoding.geo import GeoBloomConfig

        def bad(text: str) -> ProtocolError:
            return refuse(ProtocolError, f"party {party!r} cannot encode with the requested "
                                         f"Bloom parameters: {text}", code="encoding.params")

        if spec.kind not in ("numeric", "string", "geo", "date"):
            raise bad(f"`kind` must be one of date, geo, numeric, string, got {spec.kind!r}")
        config_type: type[BloomConfig] | type[GeoBloomConfig] = \
            GeoBloomConfig if spec.kind == "geo" else BloomConfig
        known = sorted(f.name for f in fields(config_type))
        params = spec.params if isinstance(spec.params, dict) else {}
        unknown = sorted(str(k) for k in params if k not in known)
        if unknown or not isinstance(spec.params, dict):
            raise bad(f"unknown parameter(s) {unknown} for {spec.kind} filters; known: {known}")
        try:
            config = config_type(**params)  # type: ignore[arg-type]
            if isinstance(config, GeoBloomConfig):
                bits, hashes, centres = config.filter_bits, config.tokens * config.num_hashes, 0
            elif spec.kind in ("string", "date"):
                bits, hashes, centres = config.filter_bits, config.num_hashes, 0
            else:
                ranges = NumericRange(low=spec.low, high=spec.high)
                centres = sum(config.centres_per_dimension(ranges))
                bits, hashes = centres, 0
        except ConfigError as exc:  # the peer's own public parameters: safe to tell
            raise bad(str(exc)) from None
        for value, limit, name in ((bits, self.max_bloom_bits, "bits"),
                                   (hashes, self.max_bloom_hashes, "hashes"),
                                   (centres, self.max_bloom_centres, "centres")):
            if value > limit:
                raise refuse(PolicyViolation,
                             f"party {party!r} encodes with at most {limit} Bloom {name} "
                             f"(policy.max_bloom_{name}); the request asks for {value}",
                             code=f"limit.bloom-{name}")


def check_sender(party: str, role: str, roles: Mapping[str, str] | None, sender: str,
                 kind: str) -> str | None:
    """The sender's role, after refusing a ``kind`` message its role may not send to a party
    of ``role``. With ``roles`` unknown (None) nothing is checked and None is returned."""
    if roles is None:
        return None
    sender_role = roles.get(sender)
    allowed = SENDERS.get(role, {}).get(kind)
    if allowed is not None and sender_role not in allowed:
        who = f"role {sender_role!r}" if sender_role else "no known role"
        need = " or ".join(sorted(r for r in allowed if r != ROLE_UNKNOWN))
        raise refuse(PolicyViolation,
                     f"party {party!r} ({role}) does not accept {kind} from {sender!r} ({who}): "
                     f"only a {need} party may send it", code="role")
    return sender_role


def check_coordinator(party: str, roles: Mapping[str, str] | None, target: str) -> None:
    """Refuse to send keyed hashes or encodings to ``target`` unless it is the coordinator: a
    primary that named itself (or another data party, who holds the keys) could otherwise
    collect a secondary's Bloom filters and test guesses against them."""
    if roles is not None and roles.get(target) != "coordinator":
        raise refuse(PolicyViolation, f"party {party!r} sends identifier digests and encodings "
                                      f"only to the coordinator, and {target!r} is not it",
                     code="role.destination")
