"""Protocol sessions: every protocol declared once, as a table, and enforced by every party.

A party used to check each message on its own; no party held *the protocol's state*: which
message may come next, from whom, how often, and what it must agree with. An authenticated
peer that left the script could therefore send round 2 of PSU with a longer list than it
committed to in round 1 (and learn which guessed IDs the secondary holds), replay PSI round 2
after an honest run (and rewrite a finished intersection), or ask for embeddings before any
alignment. Following the sans-IO model of h11 (``h11/_state.py``), each protocol is
declared here as a table of :class:`Step` rows, and one engine (:class:`SessionTable`) applies
the same rules to every message a party receives, *before* its handler runs:

* the message kind belongs to a protocol that this party's role serves;
* the session named by the message (or, for protocols without a session field, the sender's
  own session) is in a state from which that message is allowed, and the sender holds a role
  that may send it (for two-party protocols: the very party that opened the session);
* the message has not been sent more times than the step allows (per sender for the
  coordinator's submissions);
* its sizes agree with what was committed earlier in the session (a :class:`Bound`), e.g.
  ``len(PsuRound2.a_s2) == len(PsuRound1.a_s1)``;
* a finished session is immutable: any further message that would change it is refused, and its
  name can never open a new session (a new run opens a new session, see
  :func:`new_session_name`).

A refusal is a :class:`~vflink.errors.ProtocolError` naming the protocol, the state and the
message, raised before any work is done. Budgets that protect data (DP release counts) are not
session state: they live with the party's data (:mod:`vflink.privacy.budget`).

Every limit is per authenticated peer, so one peer can use up only its own share: the unfinished
sessions a peer has opened (``max_sessions`` each), and the finished ones kept in memory
(``max_finished_per_peer``; only the peer's own are ever evicted, and a party that keeps its
results on disk reloads an evicted one through its ``restore`` hook, so a finished result is
never lost to another peer's runs). An unfinished session that makes no progress for ``ttl_s``
(minutes) is dropped, and a two-party session whose handler failed is dropped at once; the
party's ``on_drop`` hook frees what it held (its spool files, its disk reservation).

:func:`describe` renders every declaration as Markdown; the docs' security page renders its
protocol tables from that output at every build (a test keeps them equal).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vflink.errors import PolicyViolation, ProtocolError
from vflink.protocol.boundary import refuse
from vflink.protocol.messages import Message
from vflink.protocol.names import check_name

log = logging.getLogger(__name__)

__all__ = [
    "ANY_DATA",
    "ENGINE_PSI",
    "Bound",
    "Chunked",
    "PROTOCOLS",
    "ProtocolSpec",
    "Session",
    "SessionLimits",
    "SessionTable",
    "Step",
    "at_least",
    "at_most",
    "describe",
    "equal",
    "new_session_name",
    "protocols_for",
    "purpose_of",
    "run_key",
]

#: Any data party (primary, secondary, or a data party of unknown role at a coordinator).
ANY_DATA = ("primary", "secondary", "data")
#: Recently ended sessions remembered per table, so that a late message learns why its
#: session is gone (expired, evicted) instead of finding "no session".
_ENDED_KEPT = 4096
#: ``<purpose>@<run id>``: the part before ``@`` says what the session is for
RUN_SEPARATOR = "@"


def new_session_name(purpose: str) -> str:
    """A fresh session name for one run: ``purpose@<random id>``.

    A finished session is immutable and its name can never be reused, so every run opens
    sessions under new names. Seeded components that must give the same result in every run
    (the coordinator's Eq. 2 noise with a fixed seed) derive it from :func:`purpose_of`.
    """
    return f"{purpose}{RUN_SEPARATOR}{secrets.token_hex(6)}"


def run_key(peer: str, run: str) -> str:
    """The session name of ``peer``'s training run ``run`` (the peer's name for its one
    default run, ``""``)."""
    return f"{peer}/{run}" if run else peer


def purpose_of(name: str) -> str:
    """The purpose part of a session name (``"soft@1a2b"`` → ``"soft"``)."""
    return name.split(RUN_SEPARATOR, 1)[0]


# --- declarations -------------------------------------------------------------------------------


#: message fields that state a size themselves (ints), not lists whose length is the size
_SIZE_FIELDS = frozenset({"n_a", "total", "chunk_rows"})


def _sized(field_name: str) -> str:
    """How a table names a field's size: ``len(x)``, or ``x`` for an int field."""
    return field_name if field_name in _SIZE_FIELDS else f"len({field_name})"


def _size(value: Any) -> int:
    # an int field states a size itself (a chunked list's announced total)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return len(value)


@dataclass(frozen=True)
class Chunked:
    """The message is one chunk of the list ``stream``: a round's list travels as
    chunks of at most ``commits[limit]`` elements, in order, and the step's ``target`` state is
    reached only once the chunks add up to the list's total.

    ``fetch``: the receiver sends the chunk (in the reply to a request naming ``index``); the
    list's total is the commitment ``total``. Otherwise the sender uploads ``elements`` and
    announces the list's total in ``message.total`` (bound by the step's ``bounds``); the
    first chunk fixes it, and it is committed under ``commit`` when given.

    Refused before any work: a chunk out of order or repeated (``index`` ≠ chunks so far), a
    chunk above the limit, an empty chunk of a non-empty list, elements beyond the total, a
    total that changes between chunks, and (by the state table) any chunk of a list whose
    round has closed.
    """

    stream: str
    total: str = ""
    fetch: bool = False
    commit: str = ""
    limit: str = "chunk"

    def text(self) -> str:
        what = (f"chunk of `{self.stream}` fetched in order, {self.limit} rows each, "
                f"{self.total} in all" if self.fetch else
                f"chunk of `{self.stream}`: index = chunks so far, ≤ {self.limit} elements, "
                "elements in all = total (fixed by the first chunk)")
        return what + (f"; commits {self.commit} = total" if self.commit else "")

    def check(self, message: Message, commits: Mapping[str, Any],
              progress: tuple[int, int, int] | None) -> tuple[str | None, int, int]:
        """(reason for refusal or None, elements of this chunk, the list's total)."""
        chunks, rows, total = progress if progress is not None else (0, 0, -1)
        if self.limit not in commits:
            return f"no chunk size was committed for {self.stream}", 0, 0
        limit = int(commits[self.limit])
        index = getattr(message, "index", None)
        if not isinstance(index, int) or isinstance(index, bool):
            return "the chunk has no index", 0, 0
        if self.fetch:
            total = int(commits.get(self.total, 0))
            n = max(0, min(limit, total - rows))
        else:
            announced = _size(getattr(message, "total", None))
            if total >= 0 and announced != total:
                return (f"{self.stream} was announced with {total} elements, this chunk says "
                        f"{announced}"), 0, 0
            total = announced
            n = _size(getattr(message, "elements", ()))
        if index != chunks:
            why = "repeats" if index < chunks else "skips ahead of"
            return (f"chunk {index} of {self.stream} {why} the stream: chunk {chunks} is "
                    "next (chunks travel in order, each once)"), 0, 0
        if n > limit:
            return f"chunk {index} of {self.stream} has {n} elements; the limit is {limit}", 0, 0
        if rows + n > total:
            return (f"chunk {index} of {self.stream} brings it to {rows + n} elements; "
                    f"{total} were committed"), 0, 0
        if n == 0 and not (total == 0 and chunks == 0):
            return f"chunk {index} of {self.stream} is empty", 0, 0
        return None, n, total


@dataclass(frozen=True)
class Bound:
    """``len(message.<field>)`` must relate to values committed earlier in the session.

    ``low``/``high`` are names of commitments (summed when several, or a maximum with
    ``low_max``); ``None`` leaves that side open.
    """

    field: str
    low: tuple[str, ...] = ()
    high: tuple[str, ...] = ()
    low_max: bool = False

    def check(self, message: Message, commits: Mapping[str, Any]) -> str | None:
        """A reason for refusal, or None."""
        try:
            n = _size(getattr(message, self.field))
        except TypeError:
            return f"{self.field} has no size"
        known = all(c in commits for c in (*self.low, *self.high))
        if not known:
            return None  # nothing committed yet for this bound: the handler's own checks apply
        vals = [int(commits[c]) for c in self.low]
        lo = (max(vals) if self.low_max else sum(vals)) if self.low else None
        hi = sum(int(commits[c]) for c in self.high) if self.high else None
        if lo is not None and n < lo or hi is not None and n > hi:
            return f"{self.field} has {n} elements; {self.text()} ({_values(self, commits)})"
        return None

    def text(self) -> str:
        low = (" + " if not self.low_max else ", ").join(self.low)
        if self.low_max and len(self.low) > 1:
            low = f"max({low})"
        high = " + ".join(self.high)
        if self.low and self.high and self.low == self.high:
            return f"{_sized(self.field)} = {high}"
        parts = []
        if self.low:
            parts.append(f"{low} ≤ {_sized(self.field)}")
        if self.high:
            parts.append(f"{_sized(self.field)} ≤ {high}" if not parts else f" ≤ {high}")
        return "".join(parts)


def _values(bound: Bound, commits: Mapping[str, Any]) -> str:
    names = dict.fromkeys((*bound.low, *bound.high))
    return ", ".join(f"{n} = {commits[n]}" for n in names)


def equal(field_name: str, *commits: str) -> Bound:
    """``len(field) == sum(commits)``."""
    return Bound(field_name, low=commits, high=commits)


def at_most(field_name: str, *commits: str) -> Bound:
    return Bound(field_name, high=commits)


def at_least(field_name: str, *commits: str, largest: bool = False) -> Bound:
    return Bound(field_name, low=commits, low_max=largest)


@dataclass(frozen=True)
class Step:
    """One row of a protocol table.

    Args:
        kind: the message kind (``Message.kind``).
        senders: roles that may send it. ``"opener"``: only the party that opened the session.
        source: states in which it is accepted (``"*"``: any state but a final one).
        target: the state after the handler succeeded (``None``: unchanged).
        times: how many times it is accepted in one session (per sender with ``per_sender``);
            ``None``: no count limit (still bounded by the session's other rules).
        bounds: sizes bound to earlier commitments (checked before the handler runs).
        commits: ``name → field``: sizes of this message's fields committed for later bounds.
        when: ``(field, values)``: the row applies only when ``message.<field>`` is one of
            ``values`` (e.g. PSI round 1 finishes the session when nothing is revealed to us).
        requires: ``(commitment, values)``: the row applies only when the session's committed
            value is one of ``values``.
        opens: this message may open a new session (the first step of a protocol).
    """

    kind: str
    senders: tuple[str, ...]
    source: tuple[str, ...]
    target: str | None = None
    times: int | None = 1
    per_sender: bool = False
    bounds: tuple[Bound, ...] = ()
    commits: tuple[tuple[str, str], ...] = ()
    when: tuple[str, tuple[Any, ...]] | None = None
    requires: tuple[str, tuple[Any, ...]] | None = None
    opens: bool = False
    #: the message is one chunk of a list streamed over several messages
    chunk: Chunked | None = None
    #: what the receiving party's handler binds the message to beyond sizes (its aligned rows,
    #: its data's release budget): part of the declaration a reader checks, enforced by the party
    note: str = ""
    #: ``(field, kind)``: fields that name something the party keeps (a state file, a snapshot
    #: tag), checked by :func:`vflink.protocol.names.check_name` before anything else
    names: tuple[tuple[str, str], ...] = ()

    def applies(self, message: Message, commits: Mapping[str, Any]) -> bool:
        if self.when is not None and getattr(message, self.when[0], None) not in self.when[1]:
            return False
        return self.requires is None or commits.get(self.requires[0]) in self.requires[1]


@dataclass(frozen=True)
class ProtocolSpec:
    """A protocol as one party (``receiver``) enforces it.

    ``key``: ``"session"``: sessions are named by the message's ``session`` field;
    ``"peer"``: one session per sending peer (protocols whose messages carry no session name);
    ``"run"``: one session per sending peer and run it names (the message's ``run`` field,
    empty for a peer's one run): split training, bound to the alignment completed with that
    peer, where each run of each primary keeps its own model (at most
    ``max_runs_per_peer`` per peer, its least recently used making room).
    ``two_party``: only the party that opened a session may send to it afterwards.
    """

    name: str
    title: str
    receiver: str
    key: str
    states: tuple[str, ...]
    initial: str
    final: tuple[str, ...]
    steps: tuple[Step, ...]
    two_party: bool = True
    paper: str = ""
    #: protocols sharing a namespace share session names (PSU and PSI: one result file each)
    namespace: str = ""
    #: a handler that fails ends the session at once (its handlers keep nothing a retry could
    #: use: PSU and PSI discard their files), instead of leaving it to expire
    ends_on_failure: bool = False

    @property
    def space(self) -> str:
        return self.namespace or self.name

    def kinds(self) -> frozenset[str]:
        return frozenset(s.kind for s in self.steps)

    def rows(self, kind: str) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.kind == kind)

    def names_of(self, kind: str) -> tuple[tuple[str, str], ...]:
        """The name fields of messages of ``kind`` (every row's declaration)."""
        return tuple(dict.fromkeys(n for s in self.rows(kind) for n in s.names))


# --- the protocols ----------------------------------------------------------------------------

_P = ("primary",)
_OPEN = "open"
_ROWS = "rows ⊆ the alignment this party completed with the sender"

def _up(kind: str, state: str, target: str, *bounds: Bound, commit: str = "") -> Step:
    """One uploaded list of a round, in chunks."""
    return Step(kind, _P, (state,), target, times=None, when=("stream", (state,)),
                chunk=Chunked(state, commit=commit), bounds=bounds)


def _alive(states: tuple[str, ...], lists: tuple[str, ...]) -> Step:
    """The driver's keepalive while it computes or processes one of the protocol's ``lists``
    (between two messages of any unfinished state)."""
    return Step("set_progress", _P, states, None, times=None, when=("stream", lists),
                note="stream: one of the protocol's lists; done grows with each message of "
                     "that list, ≤ 4·(n_a + n_p); the session's age ≤ policy.max_session_s")


def _down(kind: str, state: str, target: str, total: str,
          requires: tuple[str, tuple[Any, ...]] | None = None) -> Step:
    """One list the receiver sends back, fetched in chunks."""
    return Step(kind, _P, (state,), target, times=None, when=("stream", (state,)),
                chunk=Chunked(state, total=total, fetch=True), requires=requires)


#: FLORIST Algorithm 1 as the passive party P_p (a secondary) enforces it. P_a commits to its
#: set size n_a (positive, within P_p's policy) in round 1 and P_p answers the chunk size it
#: accepts; every list then travels in chunks, one list after the other in the order
#: of Algorithm 1, and each list's total must agree with the sizes committed (lines 6, 8, 12).
#: Line 11 takes no list from P_a: P_p raises the line-3 list it holds (vflink.alignment.psu),
#: so what P_a learns about is what it committed to in line 3. The state is the list being
#: streamed.
_PSU_STATES = ("new", "a_s1", "a_s1t1", "p_t1", "p_s1t1", "union_s123t1", "union", "a_s1t123",
               "p_t2", "p_s123t2", "done")
PSU = ProtocolSpec(
    name="psu", title="Private set union (FLORIST Alg. 1), at the secondary",
    receiver="secondary", key="session", paper="FLORIST Algorithm 1", namespace="set",
    ends_on_failure=True,
    states=_PSU_STATES, initial="new", final=("done",),
    steps=(
        # lines 3-5 announced; n_p (own records) is committed here too
        Step("psu_round1", _P, ("new",), "a_s1", opens=True,
             commits=(("n_a", "n_a"), ("chunk", "chunk_rows")),
             note="policy.min_set_elements ≤ n_a ≤ policy.max_set_elements; chunk ≤ "
                  "chunk_rows and ≤ this party's work limit per message "
                  "(policy.max_message_work_s), answered in the reply"),
        _up("psu_chunk", "a_s1", "a_s1t1", equal("total", "n_a")),  # line 3
        _down("psu_fetch", "a_s1t1", "p_t1", "n_a"),  # line 4
        _down("psu_fetch", "p_t1", "p_s1t1", "n_p"),  # line 5
        _up("psu_chunk", "p_s1t1", "union_s123t1", equal("total", "n_p")),  # line 6
        _up("psu_chunk", "union_s123t1", "union",  # line 8: the union
            at_least("total", "n_a", "n_p", largest=True), at_most("total", "n_a", "n_p"),
            commit="n_u"),
        _down("psu_fetch", "union", "a_s1t123", "n_u"),  # line 9
        _down("psu_fetch", "a_s1t123", "p_t2", "n_a"),  # line 11: the line-3 list raised
        _down("psu_fetch", "p_t2", "p_s123t2", "n_p"),  # line 12
        _up("psu_chunk", "p_s123t2", "done", equal("total", "n_p")),  # line 12
        # while P_a computes a list (lines 3, 6-8, 10-12) or works on one it fetched
        _alive(_PSU_STATES[1:-1], _PSU_STATES[1:-1]),
    ))

_REVEALED = ("reveal", ("both", "secondary"))
_HIDDEN = ("reveal", ("primary", "cardinality"))

#: ECDH PSI as the secondary enforces it; ``reveal`` fixed in round 1 decides whether round 2
#: and the fetch of its rows exist at all. Every list travels in chunks.
PSI = ProtocolSpec(
    name="psi", title="ECDH private set intersection, at the secondary",
    receiver="secondary", key="session", paper="ECDH PSI (FLORIST §2.2 baseline)",
    namespace="set", ends_on_failure=True,
    states=("new", "a_s", "a_st", "p_t", "p_ts", "done"), initial="new", final=("done",),
    steps=(
        Step("psi_round1", _P, ("new",), "a_s", opens=True,
             commits=(("n_a", "n_a"), ("reveal", "reveal"), ("chunk", "chunk_rows")),
             note="policy.min_set_elements ≤ n_a ≤ policy.max_set_elements; commitment = "
                  "G^a, a valid element; chunk as for psu_round1"),
        _up("psi_chunk", "a_s", "a_st", equal("total", "n_a")),
        _down("psi_fetch", "a_st", "p_t", "n_a"),
        _down("psi_fetch", "p_t", "p_ts", "n_p", requires=_REVEALED),
        _down("psi_fetch", "p_t", "done", "n_p", requires=_HIDDEN),
        Step("psi_chunk", _P, ("p_ts",), "done", times=None, when=("stream", ("p_ts",)),
             chunk=Chunked("p_ts"), bounds=(equal("total", "n_p"),),
             note="the last chunk's proof: the elements matching a_st are p_t raised to the "
                  "committed exponent (batched Chaum–Pedersen), else no row is accepted"),
        # while the primary blinds its set, works on the lists it fetched, and proves p_ts
        _alive(("a_s", "a_st", "p_t", "p_ts"), ("a_s", "a_st", "p_t", "p_ts")),
        # the intersection rows, to the party that ran the PSI only, when it is to learn them
        Step("fetch_alignment", _P, ("done",), None, times=None,
             requires=("reveal", ("both",))),
    ))

#: PSI through an engine (RR22, KKRT16: vflink.alignment.engine) as the secondary enforces it.
#: The engine's own link carries the protocol; this session is how the secondary agrees to it
#: (its policy's protocols, its set-size limits and allowance, the TLS settings, the key
#: columns) and follows it: the primary's status while the two engines run (each one keeps the
#: session alive), then the result, checked against the secondary's own output.
ENGINE_PSI = ProtocolSpec(
    name="engine_psi", title="PSI through an engine (RR22, KKRT16), at the secondary",
    receiver="secondary", key="session", paper="RR22 (Raghuraman–Rindal 2022); KKRT16",
    namespace="set", ends_on_failure=True,
    states=("new", "running", "done"), initial="new", final=("done",),
    steps=(
        Step("engine_psi_open", _P, ("new",), "running", opens=True,
             commits=(("n_a", "n_a"), ("reveal", "reveal"), ("protocol", "protocol")),
             note="protocol ∈ policy.psi_protocols; policy.min_set_elements ≤ n_a ≤ "
                  "policy.max_set_elements; key_columns = this party's; tls = this party's "
                  "own setting (a mismatch is refused before any link)"),
        Step("engine_psi_status", _P, ("running",), None, times=None,
             note="state: one of preparing, ready, running, done, failed (failed ends the "
                  "session); the session's age ≤ policy.max_session_s"),
        Step("engine_psi_result", _P, ("running",), "done",
             note="after this party's engine finished; with reveal = both, size and digest "
                  "equal this party's own output's, else no row is accepted"),
        # the intersection rows, to the party that ran the PSI only, when it is to learn them
        Step("fetch_alignment", _P, ("done",), None, times=None,
             requires=("reveal", ("both",))),
    ))

#: The data party's side of alignment through a coordinator (exact keys, soft linkage of
#: FedSim §4.1, several fields): key confirmation, one submission, then the coordinator's view.
DATA_ALIGNMENT = ProtocolSpec(
    name="alignment", title="Alignment through a coordinator, at a secondary",
    receiver="secondary", key="session", paper="FedSim §4.1; key confirmation",
    states=("open", "shared", "aligned"), initial=_OPEN, final=("aligned",),
    steps=(
        Step("confirm_key", _P, (_OPEN,), None, times=4, opens=True),
        Step("share_keys", _P, (_OPEN,), "shared", opens=True,
             note="after a successful key confirmation of this session"),
        Step("share_encodings", _P, (_OPEN,), "shared", opens=True),
        Step("share_field_encodings", _P, (_OPEN,), "shared", opens=True),
        # the coordinator's view of the session (or a PSI session of ours) becomes the rows
        # this party serves to that primary; asking again fetches the same immutable view
        Step("alignment_ready", _P, (_OPEN, "shared"), "aligned", opens=True,
             note="the coordinator's view linked for the sender, or a PSI of ours with the "
                  "sender: its rows become the rows served to it"),
        # asking again fetches the same immutable view (a run's training after its alignment)
        Step("alignment_ready", _P, ("aligned",), None, times=None),
    ))

#: Split learning (SplitNN, FedSim Algorithm 1) and FLORIST union training, at the secondary.
#: One session per primary; what it may be asked about is bound to the alignment completed
#: with that primary (rows) or to a PSU session it ran (UIDs). Release budgets are the data's.
TRAINING = ProtocolSpec(
    name="training", title="Split training, evaluation and prediction, at a secondary",
    receiver="secondary", key="run", paper="FedSim Algorithm 1; VFL-AFE Algorithm 1; "
                                             "FLORIST §2.3-2.4",
    states=("idle", "configured", "ready", "union"), initial="idle", final=(),
    steps=(
        Step("setup_bottom", _P, ("idle", "configured", "ready", "union"), "configured",
             times=None, opens=True),
        Step("setup_privacy", _P, ("idle", "configured", "ready"), None, times=None,
             opens=True),
        Step("fetch_privacy_report", _P, ("idle", "configured", "ready", "union"), None,
             times=None, opens=True),
        Step("fit_preprocessing", _P, ("configured", "ready"), "ready", times=None,
             note=_ROWS),
        Step("load_state", _P, ("idle", "configured", "ready"), "ready", times=None,
             opens=True, names=(("name", "state"),),
             note="a state the sender saved (another's name: refused as unknown)"),
        Step("forward", _P, ("ready",), None, times=None,
             note=_ROWS + "; each release within the data's DP budget; pending batches "
                          "≤ policy.max_pending_batches"),
        Step("backward", _P, ("ready", "union"), None, times=None,
             note="a pending batch of this peer; the gradient's shape = its embeddings'"),
        Step("snapshot", _P, ("ready", "union"), None, times=None,
             note="tags ≤ policy.max_snapshots", names=(("tag", "snapshot"),)),
        Step("restore", _P, ("ready", "union"), None, times=None, names=(("tag", "snapshot"),)),
        Step("save_state", _P, ("ready", "union"), None, times=None,
             names=(("name", "state"),),
             note="in the sender's own folder; names ≤ policy.max_saved_states"),
        Step("union_setup", _P, ("idle", "configured", "ready", "union"), "union",
             times=None, opens=True, note="a PSU session this party finished with the sender"),
        Step("union_forward", _P, ("union",), None, times=None,
             note="UIDs of that PSU's union; same answer path for held and synthetic rows"),
    ))

_SUBMIT = ("key_digests", "identifier_encodings", "field_encodings")
_LINK = ("match_keys", "soft_link", "field_link")

#: The coordinator's side of alignment (exact keys, soft linkage, several fields): each data
#: party submits once; the opener (the primary) links once; the result is immutable and each
#: secondary fetches its own view.
COORDINATION = ProtocolSpec(
    name="coordination", title="Alignment at the coordinator",
    receiver="coordinator", key="session", two_party=False,
    paper="FedSim §4.1, App. C; key confirmation",
    states=(_OPEN, "linked"), initial=_OPEN, final=("linked",),
    steps=(
        Step("key_tag", ANY_DATA, (_OPEN,), None, times=4, per_sender=True, opens=True),
        Step("fetch_key_tags", ANY_DATA, (_OPEN,), None, times=4, per_sender=True,
             opens=True),
        *(Step(kind, ANY_DATA, (_OPEN,), None, times=1, per_sender=True, opens=True)
          for kind in _SUBMIT),
        *(Step(kind, ("opener", "primary"), (_OPEN,), "linked") for kind in _LINK),
        Step("fetch_alignment", ANY_DATA, ("linked",), None, times=None, per_sender=True),
    ))

PROTOCOLS: tuple[ProtocolSpec, ...] = (PSU, PSI, ENGINE_PSI, DATA_ALIGNMENT, TRAINING,
                                        COORDINATION)


def protocols_for(role: str) -> tuple[ProtocolSpec, ...]:
    """The protocols a party of ``role`` serves."""
    return tuple(p for p in PROTOCOLS if p.receiver == role)


# --- state --------------------------------------------------------------------------------------


@dataclass
class Session:
    """One session's state at the receiving party."""

    protocol: ProtocolSpec
    name: str
    opener: str
    state: str
    created: float
    touched: float
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    commits: dict[str, Any] = field(default_factory=dict)
    #: chunked lists: stream → (chunks, elements so far, total)
    streams: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    #: lists with a chunk being handled: a second chunk of one waits its turn (is refused)
    busy: set[str] = field(default_factory=set)
    #: what the party keeps for this session (handlers' own objects)
    data: dict[str, Any] = field(default_factory=dict)
    #: handlers of this session running now: a session is never expired under one
    handling: int = 0
    #: why the table dropped it: "expired", "evicted", "failed", "aged" (past its life limit)
    #: or "" (still held); the party's ``on_drop`` hook reads it
    ended: str = ""

    @property
    def finished(self) -> bool:
        return self.state in self.protocol.final

    def participants(self) -> set[str]:
        """The opener and every party that sent a message counted per sender."""
        return {self.opener, *(who for _, who in self.counts if who)}

    def commit(self, name: str, value: Any) -> None:
        """Record a value later messages are bound to (a handler's own figure, e.g. n_p)."""
        if name in self.commits and self.commits[name] != value:
            raise ProtocolError(f"{self.protocol.name} session {self.name!r}: {name} was "
                                f"committed as {self.commits[name]}, not {value}")
        self.commits[name] = value


@dataclass(frozen=True)
class SessionLimits:
    """Limits on the sessions one party keeps (from its policy), each per peer.

    ``max_sessions``: unfinished sessions one peer may hold open; ``ttl_s``: an unfinished
    session untouched for this long is dropped; ``max_finished_per_peer``: finished sessions of
    one peer kept in memory (its least recently used make room); ``max_finished_names``:
    finished names remembered so they can never open a new session; ``max_life_s``: the age
    at which an unfinished session is dropped whatever it receives; ``max_runs_per_peer``: the
    training runs (``key = "run"`` sessions) one peer holds.
    """

    max_sessions: int = 16
    ttl_s: float = 600.0
    max_finished_names: int = 100_000
    max_finished_per_peer: int = 64
    #: an unfinished named session is dropped this long after it opened, however it is kept
    #: alive (a keepalive must not hold a peer's share for ever)
    max_life_s: float = 86400.0
    #: sessions of a ``key = "run"`` protocol one peer holds (its training runs' models)
    max_runs_per_peer: int = 4


@dataclass(frozen=True)
class Admission:
    """A message admitted by :meth:`SessionTable.admit`; pass it to :meth:`SessionTable.done`
    once the handler succeeded."""

    session: Session
    step: Step
    sender: str
    new: bool
    #: a chunk step: (chunks, elements, total) of its list once the handler succeeded
    stream: tuple[int, int, int] | None = None


class SessionTable:
    """The sessions one party keeps, and the engine that applies the declarations.

    Thread-safe: admission and the state change after a handler are each atomic; a party that
    serves several callers at once may run handlers of different sessions concurrently.
    """

    def __init__(self, party: str, role: str, limits: SessionLimits | None = None,
                 protocols: Iterable[ProtocolSpec] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        #: called with each session the table drops (expired, evicted, failed): the party
        #: frees what it held for it; never under the table's lock
        self.on_drop: Callable[[Session], None] | None = None
        #: ``restore(protocol, name, peer)``: a finished session the party kept on disk, or
        #: None; with ``peer``, only one that peer ran (nobody else can make it reload one)
        self.restore: Callable[[ProtocolSpec, str, str | None], Session | None] | None = None
        self.party = party
        self.role = role
        self.limits = limits or SessionLimits()
        self.protocols = tuple(protocols) if protocols is not None else protocols_for(role)
        self._by_kind: dict[str, ProtocolSpec] = {}
        #: kinds several protocols of one namespace declare (PSU's and PSI's SetProgress): the
        #: session the message names decides which protocol applies
        self._shared: dict[str, tuple[ProtocolSpec, ...]] = {}
        for p in self.protocols:
            for kind in p.kinds():
                first = self._by_kind.get(kind)
                if first is not None and first is not p:
                    if first.space != p.space or first.key != "session":
                        raise ProtocolError(f"message kind {kind!r} is declared by two "
                                            f"protocols of a {role} ({first.name}, {p.name})")
                    self._shared[kind] = (*self._shared.get(kind, (first,)), p)
                    continue
                self._by_kind[kind] = p
        self._sessions: dict[tuple[str, str], Session] = {}
        self._finished: OrderedDict[tuple[str, str], None] = OrderedDict()
        #: sessions dropped before they finished: (space, name) → (opener, why), so that the
        #: opener's late message is told why (bounded; the oldest are forgotten)
        self._ended: OrderedDict[tuple[str, str], tuple[str, str]] = OrderedDict()
        self._lock = threading.RLock()
        self._clock = clock

    def governs(self, kind: str) -> bool:
        return kind in self._by_kind

    def get(self, protocol: str, name: str, peer: str | None = None) -> Session | None:
        """The session ``name`` of ``protocol`` (None if there is none of that protocol); a
        finished one the party keeps on disk is reloaded (its ``restore`` hook; with ``peer``,
        only one that peer ran)."""
        spec = next((p for p in self.protocols if p.name == protocol), None)
        if spec is None:
            return None
        loaded = self._load(spec, name, peer)
        dropped: list[Session] = []
        try:
            with self._lock:
                s = self._sessions.get((spec.space, name))
                if s is None and loaded is not None:
                    s = self._install(loaded, dropped)
                return s if s is not None and s.protocol.name == protocol else None
        finally:
            self._dropped(dropped)

    def sessions(self, protocol: str | None = None) -> list[Session]:
        with self._lock:
            return [s for s in self._sessions.values() if protocol in (None, s.protocol.name)]

    def open(self, protocol: ProtocolSpec, name: str, opener: str, state: str) -> Session:
        """A session created by the party itself (e.g. an alignment adopted in-process)."""
        dropped: list[Session] = []
        try:
            with self._lock:
                now = self._expire(dropped)
                self._check_name(protocol, name)
                self._check_room(protocol, name, opener, now, dropped)
                s = Session(protocol, name, opener, state, now, now)
                self._sessions[(protocol.space, name)] = s
                self._note_finished(s, dropped)
                return s
        finally:
            self._dropped(dropped)

    def _dropped(self, sessions: list[Session]) -> None:
        """Let the party free what dropped sessions held (outside the lock)."""
        if self.on_drop is None:
            return
        for s in sessions:
            try:
                self.on_drop(s)
            except Exception:  # a failing hook must not fail the message being admitted
                log.exception("party %r: freeing dropped session %r failed", self.party, s.name)

    def _load(self, protocol: ProtocolSpec, name: str, peer: str | None) -> Session | None:
        """A finished session the party keeps on disk (or None), read outside the table's lock:
        reading a result back must not hold up every other peer's messages. Only a name the
        table does not hold is looked up."""
        if self.restore is None:
            return None
        with self._lock:
            if (protocol.space, name) in self._sessions:
                return None
        s = self.restore(protocol, name, peer)
        return s if s is not None and s.finished else None

    def _install(self, s: Session, dropped: list[Session]) -> Session:
        """A reloaded finished session, into the table (under its lock)."""
        self._sessions[(s.protocol.space, s.name)] = s
        self._note_finished(s, dropped)
        return s

    # -- admission ------------------------------------------------------------------------------

    def _refuse(self, protocol: ProtocolSpec, state: str, kind: str, why: str, *,
                code: str, cls: type[Exception] = ProtocolError) -> Exception:
        return refuse(cls,  # type: ignore[type-var]
                      f"party {self.party!r} ({self.role}): {protocol.name} protocol, state "
                      f"{state!r}: {kind} refused: {why}", code=code)

    def _check_name(self, protocol: ProtocolSpec, name: Any) -> None:
        check_name(name, "session", party=self.party)

    def _drop(self, key: tuple[str, str], s: Session, why: str,
              dropped: list[Session]) -> None:
        """Remove an unfinished session (under the lock), remembering why for its opener."""
        del self._sessions[key]
        s.ended = why
        dropped.append(s)
        self._ended[key] = (s.opener, why)
        self._ended.move_to_end(key)
        while len(self._ended) > _ENDED_KEPT:
            self._ended.popitem(last=False)

    def _why_ended(self, protocol: ProtocolSpec, name: str, sender: str) -> str | None:
        """Why the sender's own session ``name`` is gone (None: unknown, or another's)."""
        opener, why = self._ended.get((protocol.space, name), ("", ""))
        if opener != sender or not why:
            return None
        limits = self.limits
        return {
            "expired": f"session {name!r} expired: no message of it arrived for "
                       f"{limits.ttl_s:g} s (policy.session_ttl_s); a new run opens a new "
                       "session",
            "aged": f"session {name!r} was dropped {limits.max_life_s:g} s after it opened "
                    "(policy.max_session_s); a new run opens a new session",
            "evicted": f"training run {name[len(sender) + 1:]!r} was dropped to make room "
                       f"for a newer run of yours (policy.max_training_runs = "
                       f"{limits.max_runs_per_peer}, or policy.max_training_bytes); set it up "
                       "again or load a saved state",
            "failed": f"session {name!r} failed earlier and ended; a new run opens a new "
                      "session",
        }.get(why)

    def _expire(self, dropped: list[Session]) -> float:
        """Drop unfinished named sessions idle for ``ttl_s``, or older than ``max_life_s``
        (never one whose handler is running; a peer's training runs are bounded in number
        instead; finished ones stay within their peer's share)."""
        now = self._clock()
        ttl, life = self.limits.ttl_s, self.limits.max_life_s
        for key, s in list(self._sessions.items()):
            if s.finished or s.protocol.key != "session" or s.busy or s.handling:
                continue
            if now - s.touched > ttl:
                self._drop(key, s, "expired", dropped)
                log.info("party %r: %s session %r of %r expired after %g s without a message",
                         self.party, s.protocol.name, s.name, s.opener, ttl)
            elif now - s.created > life:
                self._drop(key, s, "aged", dropped)
                log.info("party %r: %s session %r of %r dropped at its age limit of %g s",
                         self.party, s.protocol.name, s.name, s.opener, life)
        return now

    def _check_room(self, protocol: ProtocolSpec, name: str, opener: str, now: float,
                    dropped: list[Session]) -> None:
        if (protocol.space, name) in self._finished:
            raise self._refuse(protocol, "done", "opening",
                               f"session {name!r} is finished and immutable; a new run opens a "
                               "new session", code="session.finished")
        if protocol.key == "run":  # a new run of this peer: its own oldest runs make room
            mine = sorted(((k, x) for k, x in self._sessions.items()
                           if x.protocol is protocol and x.opener == opener),
                          key=lambda kx: kx[1].touched)
            idle = [(k, x) for k, x in mine if not x.handling]
            while len(mine) >= self.limits.max_runs_per_peer and idle:
                key, old = idle.pop(0)
                mine.remove((key, old))
                self._drop(key, old, "evicted", dropped)
                log.info("party %r: %s run %r of %r dropped to make room for its run %r "
                         "(policy.max_training_runs)", self.party, protocol.name, old.name,
                         opener, name)
            return
        if protocol.key != "session":
            return  # one per peer by construction
        open_ = [s for s in self._sessions.values() if s.opener == opener
                 and not s.finished and s.protocol.key == "session"]
        if len(open_) >= self.limits.max_sessions:
            raise refuse(PolicyViolation,
                         f"party {self.party!r} already holds {len(open_)} sessions of "
                         f"{opener!r}, none finished (its limit per peer, "
                         f"policy.max_sessions); finish them or wait "
                         f"{self.limits.ttl_s:g} s for idle ones to expire",
                         code="limit.sessions")

    def _note_finished(self, s: Session, dropped: list[Session]) -> None:
        if s.finished:
            key = (s.protocol.space, s.name)
            self._finished[key] = None
            self._finished.move_to_end(key)
            while len(self._finished) > self.limits.max_finished_names:
                self._finished.popitem(last=False)
            # a peer's own finished sessions make room for each other, never another's
            mine = [(k, x) for k, x in self._sessions.items()
                    if x.finished and x.opener == s.opener and x.protocol.key == "session"]
            for k, x in sorted(mine, key=lambda kx: kx[1].touched)[
                    :max(0, len(mine) - self.limits.max_finished_per_peer)]:
                if x is not s:
                    del self._sessions[k]
                    dropped.append(x)

    def admit(self, sender: str, sender_role: str | None, message: Message) -> Admission | None:
        """Check ``message`` against its protocol's declaration before any work.

        Returns None for kinds no protocol of this party declares (lifecycle messages such as
        Hello, and kinds the party does not handle at all: its dispatch refuses those).
        """
        protocol = self._by_kind.get(message.kind)
        if protocol is None:
            return None
        if protocol.key == "session":
            raw = getattr(message, "session", None)
            self._check_name(protocol, raw)
            name = str(raw)
            shared = self._shared.get(message.kind)
            if shared is not None:
                with self._lock:
                    held = self._sessions.get((protocol.space, name))
                if held is not None and held.protocol in shared:
                    protocol = held.protocol
        elif protocol.key == "run":
            run = check_name(getattr(message, "run", ""), "run", party=self.party)
            name = run_key(sender, run)
        else:
            name = sender
        for fld, kind in protocol.names_of(message.kind):  # before any state or work
            check_name(getattr(message, fld, None), kind, party=self.party)
        loaded = self._load(protocol, name, sender)
        shared = self._shared.get(message.kind)
        if shared is not None and loaded is not None and loaded.protocol in shared:
            protocol = loaded.protocol  # a finished session reloaded as what it was
        dropped: list[Session] = []
        try:
            return self._admit(protocol, name, sender, sender_role, message, dropped, loaded)
        finally:
            self._dropped(dropped)

    def _admit(self, protocol: ProtocolSpec, name: str, sender: str, sender_role: str | None,
               message: Message, dropped: list[Session], loaded: Session | None
               ) -> Admission:
        with self._lock:
            now = self._expire(dropped)
            s = self._sessions.get((protocol.space, name))
            if s is None and loaded is not None:
                s = self._install(loaded, dropped)
            if s is not None and s.protocol is not protocol:
                raise self._refuse(protocol, s.state, message.kind,
                                   f"session {name!r} is a {s.protocol.name} session",
                                   code="session.protocol")
            new = s is None
            state = protocol.initial if s is None else s.state
            commits: Mapping[str, Any] = {} if s is None else s.commits
            rows = [r for r in protocol.rows(message.kind) if r.applies(message, commits)]
            if s is None and (protocol.space, name) in self._finished:
                raise self._refuse(protocol, "done", message.kind,
                                   f"session {name!r} is finished and immutable; a new run "
                                   "opens a new session", code="session.finished")
            if s is not None and s.finished and not any(
                    state in r.source and r.target is None for r in rows):
                if sender not in s.participants():
                    raise self._refuse(protocol, state, message.kind,
                                       f"session {name!r} belongs to other parties",
                                       code="session.bound", cls=PolicyViolation)
                raise self._refuse(protocol, state, message.kind,
                                   f"session {name!r} is already {state} and immutable; a new "
                                   "run opens a new session", code="session.finished")
            step = next((r for r in rows if state in r.source or "*" in r.source), None)
            if new and (step is None or not step.opens):
                # the sender's own session that ended is told why (expired, evicted), not
                # that its message does not fit a fresh session's state
                why = self._why_ended(protocol, name, sender)
                if why is not None:
                    raise self._refuse(protocol, "-", message.kind, why, code="session.ended")
            if step is None:
                allowed = sorted({r.kind for r in protocol.steps
                                  if state in r.source and r.applies(message, commits)})
                raise self._refuse(protocol, state, message.kind,
                                   f"allowed in this state: {', '.join(allowed) or 'nothing'}",
                                   code="session.state")
            if new and not step.opens:
                raise self._refuse(protocol, state, message.kind,
                                   f"no session {name!r} is open", code="session.unknown")
            self._check_sender(protocol, s, step, sender, sender_role, state, message.kind)
            if step.times is not None and s is not None:
                key = (message.kind, sender if step.per_sender else "")
                if s.counts.get(key, 0) >= step.times:
                    raise self._refuse(protocol, state, message.kind,
                                       f"already received {step.times} time(s) in session "
                                       f"{name!r}", code="session.repeated")
            for bound in step.bounds:
                why = bound.check(message, commits)
                if why is not None:
                    raise self._refuse(protocol, state, message.kind, why,
                                       code="session.bound-size")
            stream = None
            if step.chunk is not None:
                if s is not None and step.chunk.stream in s.busy:
                    # two chunks at once could both pass the order check below: one at a time
                    raise self._refuse(protocol, state, message.kind,
                                       f"a chunk of {step.chunk.stream} is still being "
                                       "handled; chunks travel one after the other",
                                       code="session.chunk")
                progress = None if s is None else s.streams.get(step.chunk.stream)
                why, n_el, total = step.chunk.check(message, commits, progress)
                if why is not None:
                    raise self._refuse(protocol, state, message.kind, why,
                                       code="session.chunk")
                n_chunks, n_rows, _ = progress or (0, 0, total)
                stream = (n_chunks + 1, n_rows + n_el, total)
            if new:
                self._check_room(protocol, name, sender, now, dropped)
                s = Session(protocol, name, sender, protocol.initial, now, now)
                self._sessions[(protocol.space, name)] = s
                self._ended.pop((protocol.space, name), None)
            if s is None:  # pragma: no cover - set just above
                raise ProtocolError("session vanished")
            s.touched = now
            s.handling += 1
            if step.chunk is not None:
                s.busy.add(step.chunk.stream)
            return Admission(s, step, sender, new, stream)

    def _check_sender(self, protocol: ProtocolSpec, s: Session | None, step: Step,
                      sender: str, sender_role: str | None, state: str, kind: str) -> None:
        if s is not None and protocol.two_party and sender != s.opener:
            raise self._refuse(protocol, state, kind,
                               f"session {s.name!r} belongs to other parties",
                               code="session.bound", cls=PolicyViolation)
        roles = [r for r in step.senders if r != "opener"]
        if "opener" in step.senders and s is not None:
            if sender == s.opener and sender_role in (None, "data", *roles):
                return  # a secondary never links a session, even one it opened
            if sender_role in (None, "data"):  # roles not configured: only the opener
                raise self._refuse(protocol, state, kind, f"only the party that opened "
                                   f"session {s.name!r} may send it", code="session.bound",
                                   cls=PolicyViolation)
        if sender_role is not None and sender_role not in roles:
            raise self._refuse(protocol, state, kind,
                               f"only a {' or '.join(roles)} party may send it",
                               code="session.role", cls=PolicyViolation)

    def done(self, admission: Admission, message: Message) -> None:
        """The handler succeeded: count the message, commit its sizes, move the state."""
        s, step = admission.session, admission.step
        with self._lock:
            s.handling = max(0, s.handling - 1)
            if step.chunk is not None:
                s.busy.discard(step.chunk.stream)
            key = (message.kind, admission.sender if step.per_sender else "")
            s.counts[key] = s.counts.get(key, 0) + 1
            for name, fld in step.commits:
                value = getattr(message, fld)
                s.commits.setdefault(name, value if isinstance(value, str) else _size(value))
            closed = True
            if step.chunk is not None and admission.stream is not None:
                s.streams[step.chunk.stream] = admission.stream
                _, rows, total = admission.stream
                closed = rows == total
                if step.chunk.commit:
                    s.commits.setdefault(step.chunk.commit, total)
            if step.target is not None and closed:
                s.state = step.target
            s.touched = self._clock()
            dropped: list[Session] = []
            self._note_finished(s, dropped)
        self._dropped(dropped)

    def failed(self, admission: Admission) -> None:
        """The handler refused or failed: a session the message had opened is dropped again,
        and so is an unfinished two-party session (only its opener can send to it, so only the
        opener's own failure ends it) of a protocol whose failures end it: it frees its share
        at once instead of at expiry."""
        s = admission.session
        dropped: list[Session] = []
        with self._lock:
            s.handling = max(0, s.handling - 1)
            if admission.step.chunk is not None:
                s.busy.discard(admission.step.chunk.stream)
            p = s.protocol
            fresh = admission.new and not s.counts and s.state == p.initial
            ends = p.ends_on_failure and not s.finished and not s.busy
            if fresh or ends:
                key = (p.space, s.name)
                if self._sessions.get(key) is s:
                    if fresh:  # nothing was kept: as if it never opened
                        del self._sessions[key]
                        s.ended = "failed"
                        dropped.append(s)
                    else:
                        self._drop(key, s, "failed", dropped)
        self._dropped(dropped)

    def evict(self, protocol: str, opener: str, *, keep: Session) -> bool:
        """Drop ``opener``'s least recently used session of ``protocol`` other than ``keep``
        (its own share making room, e.g. for a larger model); False when none can go."""
        dropped: list[Session] = []
        try:
            with self._lock:
                mine = sorted(((k, x) for k, x in self._sessions.items()
                               if x.protocol.name == protocol and x.opener == opener
                               and x is not keep and not x.handling),
                              key=lambda kx: kx[1].touched)
                if not mine:
                    return False
                key, old = mine[0]
                self._drop(key, old, "evicted", dropped)
                log.info("party %r: %s run %r of %r dropped to make room (its memory limit)",
                         self.party, protocol, old.name, opener)
                return True
        finally:
            self._dropped(dropped)


# --- documentation ------------------------------------------------------------------------------


def _senders(step: Step) -> str:
    return " or ".join("the opener" if r == "opener" else r for r in step.senders)


def describe(protocols: Iterable[ProtocolSpec] = PROTOCOLS) -> str:
    """Every declaration as Markdown: one table per protocol (the docs' security page)."""
    out: list[str] = []
    for p in protocols:
        out.append(f"#### `{p.name}`: {p.title}")
        out.append("")
        keyed = "its `session` field" if p.key == "session" else "the sending peer (one per peer)"
        final = ", ".join(f"`{s}`" for s in p.final) or "none (the session stays open)"
        out.append(f"Sessions named by {keyed}; states {' → '.join(f'`{s}`' for s in p.states)}"
                   f"; finished (immutable): {final}. From: {p.paper}.")
        out.append("")
        out.append("| message | from | in state | to state | times | bound to |")
        out.append("|---|---|---|---|---|---|")
        for st in p.steps:
            cond = []
            if st.when is not None:
                cond.append(f"when {st.when[0]} ∈ {{{', '.join(map(str, st.when[1]))}}}")
            if st.requires is not None:
                cond.append(f"if {st.requires[0]} ∈ {{{', '.join(map(str, st.requires[1]))}}}")
            bound = "; ".join(([st.chunk.text()] if st.chunk else [])
                              + [f"`{f}`: a {k} name" for f, k in st.names]
                              + [b.text() for b in st.bounds]
                              + [f"commits {n} = {_sized(f)}" if n != f else f"commits {n}"
                                 for n, f in st.commits] + cond
                              + ([st.note] if st.note else [])) or "–"
            times = ("per chunk" if st.chunk is not None else
                     "any" if st.times is None else str(st.times))
            if st.per_sender:
                times += " per sender"
            target = st.target or "(same)"
            out.append(f"| `{st.kind}` | {_senders(st)} | {', '.join(st.source)} | {target} | "
                       f"{times} | {bound} |")
        out.append("")
    return "\n".join(out)
