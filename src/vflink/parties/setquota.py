"""What one peer's set sessions (PSU, PSI) may take from a served party: its allowance per
window, in sessions and in elements, and the disk its running sessions spool.

Every answer of a set session is information about this party's set: PSU reveals
|I_a ∩ I_p|, PSI the intersection, and a deviating primary learns, for each element it aligns,
whether this party holds it (docs/security.md, "Threat model of the set protocols"). So a peer
may open at most ``policy.max_set_sessions`` sessions and align at most
``policy.max_set_guesses`` elements within ``policy.set_session_window_s``
(:attr:`~vflink.parties.policy.PartyPolicy.dictionary_limit` is the resulting figure). Both are
counted in ``<state_dir>/_set-sessions.json``, across restarts.

A session uses its allowance when it opens, and gives it back if it ends before this party's
first blinded own element left it (before that, the peer holds nothing of this party's set):
when it expires without a message for ``policy.session_ttl_s``, when a handler fails through
this party's own fault (an internal error, not a refusal of what the peer sent), or when the
process that ran it is gone (a restart). A session the peer abandoned after an answer, or whose
messages were refused, keeps counting.

Engines of the set-alignment session (PSU and PSI now) take a :class:`Grant` when a session
opens and mark it :meth:`Grant.reveal` at their first informative answer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vflink._files import atomic_write_json
from vflink._typed import ANY, Bool, Int, ListOf, MapOf, Num, Obj, Str, read_typed_json, typed
from vflink.alignment._spool import process_alive, process_token
from vflink.errors import PolicyViolation, VflinkError
from vflink.parties.policy import PartyPolicy
from vflink.protocol.boundary import refuse

__all__ = ["Grant", "SetAllowance", "SpoolQuota"]

log = logging.getLogger(__name__)

_FILE = "_set-sessions.json"
_VERSION = 2
_SCHEMA = Obj({"version": Int(), "peers": MapOf(ListOf(ANY))})
_ENTRY = Obj({"t": Num(finite=True), "session": Str(), "elements": Int(min=-1),
              "revealed": Bool(), "owner": Str()})


@dataclass(eq=False)
class _Entry:
    """One session's use of its peer's allowance."""

    t: float
    session: str
    #: the session's n_a (-1: unknown, a record of an older version: counted at the maximum)
    elements: int
    revealed: bool
    #: the process that ran it (``pid start``), so a restart can tell it is gone
    owner: str

    def to_json(self) -> dict[str, Any]:
        return {"t": self.t, "session": self.session, "elements": self.elements,
                "revealed": self.revealed, "owner": self.owner}


class Grant:
    """One session's share of its peer's allowance: :meth:`reveal` once its first
    informative answer leaves, :meth:`give_back` when it ended before that through no fault
    of the peer."""

    def __init__(self, allowance: SetAllowance, peer: str, entry: _Entry) -> None:
        self._allowance, self.peer, self._entry = allowance, peer, entry

    @property
    def revealed(self) -> bool:
        return self._entry.revealed

    def reveal(self) -> None:
        if not self._entry.revealed:
            self._allowance._update(self.peer, self._entry, reveal=True)

    def give_back(self, why: str) -> None:
        """Return the session's share (only before anything was revealed; once)."""
        if not self._entry.revealed:
            self._allowance._update(self.peer, self._entry, reveal=False)
            log.info("set session %r of %r gave back its allowance (%s, nothing revealed)",
                     self._entry.session, self.peer, why)


class SetAllowance:
    """Each peer's set sessions and elements within the policy's window (the file above)."""

    def __init__(self, directory: Path | None) -> None:
        self.path = None if directory is None else Path(directory) / _FILE
        self._lock = threading.Lock()
        self._peers: dict[str, list[_Entry]] | None = None

    def _parse(self, raw: Any) -> _Entry:
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):  # version 1: a time
            return _Entry(float(raw), "", -1, True, "")
        doc = typed(raw, _ENTRY, source=str(self.path))
        return _Entry(float(doc["t"]), doc["session"], int(doc["elements"]),
                      bool(doc["revealed"]), doc["owner"])

    def _load(self) -> dict[str, list[_Entry]]:
        if self._peers is not None:
            return self._peers
        self._peers = {}
        if self.path is not None and self.path.is_file():
            try:
                doc = read_typed_json(self.path.parent, self.path.name, _SCHEMA)
                peers = {str(k): [self._parse(e) for e in v] for k, v in doc["peers"].items()}
            except VflinkError as exc:
                # writes are atomic, so only a hand-edited or damaged file gets here: the
                # count restarts (the operator is told) rather than refusing every peer
                log.warning("%s unreadable (%s); counting from now", self.path, exc)
                peers = {}
            # sessions of a process that is gone and had revealed nothing: cut off by a
            # restart, no fault of their peer
            for peer, entries in peers.items():
                kept = [e for e in entries if e.revealed or process_alive(e.owner)]
                if len(kept) < len(entries):
                    log.info("%d set session(s) of %r ended by a restart before they revealed "
                             "anything: their allowance is given back", len(entries) - len(kept),
                             peer)
                self._peers[peer] = kept
        return self._peers

    def _save(self) -> None:
        if self.path is None or self._peers is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path, {"version": _VERSION, "peers": {
            p: [e.to_json() for e in entries] for p, entries in self._peers.items()}},
            indent=None)

    def used(self, peer: str, policy: PartyPolicy) -> tuple[int, int]:
        """(sessions, elements) ``peer`` has used in the current window."""
        with self._lock:
            recent = self._recent(peer, policy, time.time())
            return len(recent), _elements(recent, policy)

    def _recent(self, peer: str, policy: PartyPolicy, now: float) -> list[_Entry]:
        return [e for e in self._load().get(peer, []) if now - e.t < policy.set_session_window_s]

    def admit(self, party: str, peer: str, policy: PartyPolicy, what: str, *, session: str,
              elements: int) -> Grant:
        """Count a new session of ``peer`` on ``elements`` elements, or refuse it
        (``[limit.set-sessions]``, ``[limit.set-guesses]``) before any work."""
        now = time.time()
        window = policy.set_session_window_s
        with self._lock:
            recent = self._recent(peer, policy, now)
            if len(recent) >= policy.max_set_sessions:
                raise refuse(PolicyViolation,
                             f"party {party!r}: {peer!r} opened {len(recent)} set-alignment "
                             f"sessions in the last {window:g} s (its limit, "
                             "policy.max_set_sessions); each one is information about this "
                             f"party's set, so {what} waits for the window to pass",
                             code="limit.set-sessions")
            used = _elements(recent, policy)
            if used + elements > policy.max_set_guesses:
                raise refuse(PolicyViolation,
                             f"party {party!r}: {peer!r} aligned {used:,} elements in the last "
                             f"{window:g} s and {what} brings {elements:,} more, over its limit "
                             f"of {policy.max_set_guesses:,} (policy.max_set_guesses): each "
                             "element is a guess a deviating primary can test against this "
                             "party's set", code="limit.set-guesses")
            entry = _Entry(now, session, int(elements), False, process_token())
            self._peers = self._load()
            self._peers[peer] = [*recent, entry]
            self._save()
        return Grant(self, peer, entry)

    def _update(self, peer: str, entry: _Entry, *, reveal: bool) -> None:
        with self._lock:
            entries = self._load().get(peer, [])
            if reveal:
                entry.revealed = True
            elif entry in entries:
                entries.remove(entry)
            self._save()


def _elements(entries: list[_Entry], policy: PartyPolicy) -> int:
    return sum(policy.max_set_elements if e.elements < 0 else e.elements for e in entries)


class SpoolQuota:
    """Disk reserved by each peer's running set sessions (``policy.max_spool_bytes`` each)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reserved: dict[str, int] = {}

    def reserve(self, party: str, peer: str, n: int, limit: int) -> Callable[[], None]:
        with self._lock:
            held = self.reserved.get(peer, 0)
            if held + n > limit:
                raise refuse(PolicyViolation,
                             f"party {party!r}: this session would spool about {n:,} bytes "
                             f"and {peer!r}'s running sessions hold {held:,}; its limit is "
                             f"{limit:,} (policy.max_spool_bytes): finish or abandon them "
                             "first", code="limit.spool")
            self.reserved[peer] = held + n
        done = [False]

        def release() -> None:
            with self._lock:
                if not done[0]:
                    done[0] = True
                    left = self.reserved.get(peer, 0) - n
                    if left > 0:
                        self.reserved[peer] = left
                    else:
                        self.reserved.pop(peer, None)
        return release
