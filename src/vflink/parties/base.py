"""What every party shares: a name, a channel, and dispatch of incoming messages by type."""

from __future__ import annotations

import contextvars
import logging
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from vflink.errors import ProtocolError, VflinkError
from vflink.parties.policy import PartyPolicy, check_sender
from vflink.protocol.boundary import boundary_error, local_detail, refuse
from vflink.protocol.messages import PROTOCOL_VERSION, Ack, Health, Hello, Message
from vflink.protocol.names import check_name, name_parts
from vflink.protocol.sessions import Admission, Session, SessionLimits, SessionTable
from vflink.types import Compute

__all__ = ["Party", "state_path"]

def state_path(root: Path, name: str, *, party: str | None = None) -> Path:
    """``root / name`` for a state name sent by a peer, refused before any file is touched
    unless it is a valid state name (:func:`vflink.protocol.names.check_name`: relative, no
    ``..``, no odd characters, at most 200 characters), so it never leaves ``root``."""
    return root.joinpath(*name_parts(check_name(name, "state", party=party)))

log = logging.getLogger(__name__)

#: The session of the message being handled (set by :meth:`Party.handle` for its handler).
_ACTIVE: contextvars.ContextVar[Admission | None] = contextvars.ContextVar(
    "vflink_active_session", default=None)


class Party:
    """Base class: ``handle`` dispatches a message to ``on_<kind>``.

    Given by whoever builds the federation (``vflink.runner``), at construction:
        roles: every known party's role (name → ``"primary"``/``"secondary"``/
            ``"coordinator"``); ``handle`` refuses a message kind the sender's role may not send
            (:data:`vflink.parties.policy.SENDERS`). ``None``: roles unknown, not checked.
        policy: what this party agrees to release and its limits (private defaults).

    Set after construction where the party has one: ``compute``, the party's own compute
    engine (:mod:`vflink.engine`), on which its chunked stages (top-K search, group
    operations) run; ``None`` runs them in this process. It never appears on the wire.

    Every message of a declared protocol (:mod:`vflink.protocol.sessions`) is admitted by the
    party's :class:`~vflink.protocol.sessions.SessionTable` before its handler runs: a message
    out of turn, from the wrong party, repeated beyond its count, of a size that disagrees with
    the session's commitments, or aimed at a finished session is refused with a
    ``ProtocolError`` naming the protocol, the state and the message. The handler then finds
    its session as :attr:`session`.
    """

    role = "party"
    roles: Mapping[str, str] | None = None
    compute: Compute | None = None
    _policy: PartyPolicy = PartyPolicy()
    sessions: SessionTable

    def __init__(self, name: str, *, roles: Mapping[str, str] | None = None,
                 policy: PartyPolicy | None = None) -> None:
        self.name = name
        self.roles = roles
        self.sessions = SessionTable(name, self.role)
        # the table calls back through a weak reference: a bound method would make the party
        # and its own table a cycle, and everything its sessions hold (a link's n × K arrays)
        # would wait for the cyclic garbage collector after the party's last use
        dropped = weakref.WeakMethod(self._session_dropped)

        def on_drop(session: Session) -> None:
            method = dropped()
            if method is not None:
                method(session)

        self.sessions.on_drop = on_drop
        self.policy = policy if policy is not None else PartyPolicy()

    @property
    def policy(self) -> PartyPolicy:
        """This party's policy; its session limits apply to the session table at once."""
        return self._policy

    @policy.setter
    def policy(self, policy: PartyPolicy) -> None:
        self._policy = policy
        self.sessions.limits = SessionLimits(
            max_sessions=policy.max_sessions, ttl_s=policy.session_ttl_s,
            max_finished_per_peer=policy.max_finished_sessions,
            max_life_s=policy.max_session_s, max_runs_per_peer=policy.max_training_runs)

    def _session_dropped(self, session: Session) -> None:
        """A session left the table (expired, evicted, failed): free what its handlers kept
        (each object of ``session.data`` with a ``close()``)."""
        for value in list(session.data.values()):
            close = getattr(value, "close", None)
            if callable(close):
                close()

    @property
    def session(self) -> Session:
        """The session of the message being handled (only inside a handler)."""
        admission = _ACTIVE.get()
        if admission is None:
            raise ProtocolError(f"party {self.name!r}: no session is being handled")
        return admission.session

    def handle(self, sender: str, message: Message) -> Message:
        # Whatever fails, the peer gets only a boundary message (class, code, which check);
        # the full text and any trace stay in this party's log (docs/security.md).
        try:
            sender_role = check_sender(self.name, self.role, self.roles, sender, message.kind)
            method: Callable[[str, Any], Message] | None = getattr(
                self, f"on_{message.kind}", None)
            if method is None:
                raise refuse(ProtocolError, f"party {self.name!r} ({self.role}) does not accept "
                                            f"{type(message).__name__} messages",
                             code="unexpected-kind")
            # the protocol's declaration first, before any work (vflink.protocol.sessions)
            admission = self.sessions.admit(sender, sender_role, message)
            if admission is None:
                return method(sender, message)
            token = _ACTIVE.set(admission)
            try:
                reply = method(sender, message)
            except BaseException:
                self.sessions.failed(admission)
                raise
            finally:
                _ACTIVE.reset(token)
            self.sessions.done(admission, message)
            return reply
        except Exception as exc:
            if isinstance(exc, VflinkError):
                log.warning("party %s refused %s from %s: %s", self.name, message.kind, sender,
                            local_detail(exc))
            raise boundary_error(exc, self.name, message.kind) from None

    def on_hello(self, sender: str, message: Hello) -> Message:
        if message.version != PROTOCOL_VERSION:
            raise ProtocolError(f"{sender!r} speaks protocol version {message.version}, "
                                f"{self.name!r} speaks {PROTOCOL_VERSION}")
        return Hello(party=self.name, role=self.role)

    def on_health(self, sender: str, message: Health) -> Ack:
        # Answered from no party state, so it needs no lock; a served party's transport
        # answers it itself, with its load (vflink.transport.grpc.server).
        return Ack(info={"busy": 0.0, "active": 0.0})
