"""Private set union (FLORIST Algorithm 1) and ECDH PSI as party state machines.

:class:`SetAlignmentDriver` is the active side (the primary, P_a): it drives the protocol with
requests through its :class:`~vflink.protocol.Channel`. :class:`SetAlignmentPeer` is the passive
side (a secondary, P_p), mixed into :class:`~vflink.parties.SecondaryParty`: it answers the
``psu_*``/``psi_*`` messages statefully, one session at a time per name. Only shuffled lists of
group elements travel (see :mod:`vflink.protocol.messages`); the maths is in
:mod:`vflink.alignment.psu` and :mod:`vflink.alignment.psi`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from vflink._cancel import remaining_s
from vflink._files import atomic_open
from vflink.alignment import psi, psu
from vflink.alignment._dh import as_rows, key_bytes, lookup, sorted_unique, to_hex
from vflink.alignment.groups import Elements, Group, get_group
from vflink.data.table import PartyTable
from vflink.errors import PolicyViolation, ProtocolError
from vflink.parties.policy import PartyPolicy
from vflink.protocol.boundary import refuse
from vflink.protocol.channel import Channel
from vflink.protocol.messages import (
    Ack,
    AlignmentView,
    FetchAlignment,
    PsiRound1,
    PsiRound1Reply,
    PsiRound2,
    PsuRound1,
    PsuRound1Reply,
    PsuRound2,
    PsuRound2Reply,
    PsuRound3,
)
from vflink.protocol.sessions import PSI as PSI_PROTOCOL
from vflink.protocol.sessions import PSU as PSU_PROTOCOL
from vflink.protocol.sessions import Session, SessionTable
from vflink.types import Compute

__all__ = [
    "SetAlignment",
    "SetAlignmentDriver",
    "SetAlignmentPeer",
    "pair_by_uid",
    "write_set_alignment",
]

log = logging.getLogger(__name__)

#: ``progress(stage, done, total)`` over the protocol's steps
StepProgress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class SetAlignment:
    """One party's output of PSU or PSI.

    ``rows`` are this party's record rows (ascending) that hold a UID, ``uids`` their UIDs
    (encoded group elements; hex on disk). For PSU every row has one and ``union`` is the sorted
    UID list U, with ``uid_index[i]`` the position of ``rows[i]``'s UID in U. For PSI only the
    intersection rows are listed (or none, with ``size`` only, when the intersection is hidden
    from this party).
    """

    method: str
    group: str
    rows: npt.NDArray[np.int64]
    uids: Elements
    size: int
    union: Elements | None = None
    uid_index: npt.NDArray[np.int64] | None = None
    known: bool = True
    sizes: dict[str, int] = field(default_factory=dict)
    session: str = ""  # the protocol session that produced it

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({"row": self.rows.astype(np.int64), "uid": to_hex(self.uids)})


def write_set_alignment(result: SetAlignment, path: Path) -> None:
    """``row``/``uid`` Parquet of a party's output (atomically)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "wb") as fh:  # never through a link planted at ``path``
        result.frame().to_parquet(fh, index=False)


def _psu_output(group: Group, r: psu.PsuResult, sizes: dict[str, int]) -> SetAlignment:
    n = len(r.record_uid)
    return SetAlignment(method="psu", group=group.name, rows=np.arange(n, dtype=np.int64),
                        uids=np.ascontiguousarray(r.uids[r.record_uid]), size=len(r.uids),
                        union=r.uids, uid_index=r.record_uid, sizes=sizes)


def _psi_output(group: Group, r: psi.PsiResult, sizes: dict[str, int]) -> SetAlignment:
    if r.rows is None or r.uids is None:
        return SetAlignment(method="psi", group=group.name, rows=np.empty(0, dtype=np.int64),
                            uids=group.empty(), size=r.size, known=False, sizes=sizes)
    return SetAlignment(method="psi", group=group.name, rows=r.rows, uids=r.uids, size=r.size,
                        sizes=sizes)


class SetAlignmentDriver:
    """The active party's side of PSU and PSI.

    Args:
        name: the driving party's name (for messages in logs).
        keys: canonical key bytes of each own record (see :func:`key_bytes`).
        channel: the driving party's channel.
        group: the group object (its workers decide the parallelism).
    """

    def __init__(self, keys: Sequence[bytes], channel: Channel, group: Group, *,
                 progress: StepProgress | None = None) -> None:
        self.keys = list(keys)
        self.channel = channel
        self.group = group
        self.progress = progress

    def _step(self, stage: str, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(stage, done, total)

    def psu(self, peer: str, session: str = "psu") -> SetAlignment:
        """Run Algorithm 1 with ``peer`` (P_p); return this party's output."""
        g = self.group
        steps = 5
        self._step("hash", 0, steps)
        own = g.hash_to_group(self.keys)
        e = psu.PsuExponents.draw(g)  # line 1
        self._step("round 1", 1, steps)
        r1 = self.channel.request(peer, PsuRound1(session=session, group=g.name,
                                                  a_s1=psu.line3(g, own, e)), PsuRound1Reply)
        self._step("round 2", 2, steps)
        p_st, union = psu.lines6_8(g, r1.a_s1t1, r1.p_t1, e)
        a_s2 = psu.blind_own(g, own, e)
        r2 = self.channel.request(peer, PsuRound2(session=session, p_s1t1=p_st,
                                                  union_s123t1=union, a_s2=a_s2),
                                  PsuRound2Reply)
        self._step("mapping", 3, steps)
        uids = psu.line10(r2.union, group=g)
        n_p = len(r1.p_t1)
        if len(uids) != len(union) or len(r2.p_t2) != n_p:
            raise ProtocolError(f"{peer!r} returned lists of unexpected sizes")
        mine = psu.finish_own(g, r2.a_s2t123, e, uids, expected=len(own))
        self.channel.request(peer, PsuRound3(session=session,
                                             p_s123t2=psu.raise_for_peer(g, r2.p_t2, e)), Ack)
        self._step("done", steps, steps)
        sizes = {"primary": len(own), "secondary": n_p, "union": len(uids),
                 "intersection": len(own) + n_p - len(uids)}
        return dataclasses.replace(_psu_output(g, mine, sizes), session=session)

    def psi(self, peer: str, session: str = "psi", reveal: str = "both") -> SetAlignment:
        """ECDH PSI with ``peer``; this party learns the intersection unless ``reveal`` is
        ``secondary`` or ``cardinality`` (then only its size)."""
        how = psi.check_reveal(reveal)
        g = self.group
        self._step("hash", 0, 3)
        own = g.hash_to_group(self.keys)
        a = g.random_exponent()
        sent, order = psi.blind(g, own, a)
        self._step("round 1", 1, 3)
        r1 = self.channel.request(peer, PsiRound1(session=session, group=g.name, reveal=how,
                                                  a_s=sent), PsiRound1Reply)
        if len(r1.a_st) != len(own):
            raise ProtocolError(f"{peer!r} returned {len(r1.a_st)} elements for {len(own)}")
        p_ts = psi.reblind(g, r1.p_t, a, keep_order=True)
        mine = psi.intersect(g.validate(r1.a_st, "H(x)^ab"), order, p_ts,
                             ordered=how in ("both", "primary"))
        if how in ("both", "secondary"):
            self._step("round 2", 2, 3)
            self.channel.request(peer, PsiRound2(session=session, p_ts=p_ts), Ack)
        self._step("done", 3, 3)
        sizes = {"primary": len(own), "secondary": len(r1.p_t), "intersection": mine.size}
        return dataclasses.replace(_psi_output(g, mine, sizes), session=session)

    def fetch_rows(self, peer: str, session: str) -> AlignmentView:
        """After PSI with ``reveal="both"``: the peer's intersection rows in UID order (what
        exact alignment gives the primary; used to train on the intersection)."""
        return self.channel.request(peer, FetchAlignment(session=session), AlignmentView)


@dataclass
class _PeerSession:
    group: Group
    own: Elements
    psu_e: psu.PsuExponents | None = None
    psi_e: int | None = None
    union: Elements | None = None
    p_order: npt.NDArray[np.int64] | None = None
    p_t: Elements | None = None
    a_st: Elements | None = None
    reveal: str = "both"
    result: SetAlignment | None = None


class SetAlignmentPeer:
    """The passive party's side of PSU and PSI (a mixin: needs ``name``, ``table``, a
    ``sessions`` table and the active ``session`` of :class:`~vflink.parties.base.Party`, and
    optionally ``out_dir``, where results are written as ``alignments/<session>.parquet``).

    What may arrive when, from whom and of which sizes is declared in
    :data:`vflink.protocol.sessions.PSU` and :data:`~vflink.protocol.sessions.PSI` and checked
    before these handlers run; a finished session is immutable (issue 19).
    """

    name: str
    table: PartyTable
    out_dir: Path | None
    sessions: SessionTable
    compute: Compute | None
    if TYPE_CHECKING:
        @property
        def session(self) -> Session: ...  # from Party
    policy: PartyPolicy

    def _cap(self, what: str, elements: object, *, own: int | None = None) -> None:
        """Refuse a peer's list above policy.max_set_elements before any work on it."""
        arr = np.asarray(elements)
        self.policy.check_set_size(self.name, what, int(arr.shape[0]) if arr.ndim else 0,
                                   own=own)

    def _afford(self, group: Group, exponentiations: int, kind: str) -> None:
        """Refuse, before any work, a round whose exponentiations cannot finish within the
        caller's deadline even at the group's fastest rate (its work limit, issue 19)."""
        left = remaining_s()
        need = group.min_seconds(exponentiations)
        if left is not None and need > left:
            raise refuse(PolicyViolation,
                         f"party {self.name!r}: {kind} needs {exponentiations} {group.name} "
                         f"exponentiations, at least {need:.1f} s, and the caller's deadline "
                         f"leaves {max(left, 0.0):.1f} s; allow more time or send less",
                         code="limit.work")


    def _own_elements(self, group: Group) -> Elements:
        keys = key_bytes(self.table.frame, self.table.schema.key, who=self.table.source)
        return group.hash_to_group(keys)

    def _set_state(self) -> _PeerSession:
        state: _PeerSession | None = self.session.data.get("set")
        if state is None:  # pragma: no cover - round 1 creates it, the table orders rounds
            raise ProtocolError(f"party {self.name!r}: session {self.session.name!r} has no "
                                "state")
        return state

    def _finished(self, session: str, peer: str | None = None) -> SetAlignment | None:
        for protocol in (PSU_PROTOCOL.name, PSI_PROTOCOL.name):
            s = self.sessions.get(protocol, session)
            if s is not None and (peer is None or s.opener == peer):
                state: _PeerSession | None = s.data.get("set")
                return None if state is None else state.result
        return None

    def set_alignment(self, session: str) -> SetAlignment | None:
        """This party's finished output of ``session`` (None if not finished)."""
        return self._finished(session)

    def set_alignment_with(self, session: str, peer: str) -> SetAlignment | None:
        """The finished output of ``session`` if ``peer`` is the party that ran it."""
        return self._finished(session, peer)

    def local_alignment_rows(self, session: str, peer: str) -> npt.NDArray[np.int64] | None:
        """For a finished PSI session run with ``peer``: own intersection rows (to accept its
        Forward requests)."""
        r = self.set_alignment_with(session, peer)
        return None if r is None or r.method != "psi" else r.rows

    def _finish(self, session: str, result: SetAlignment) -> None:
        result = dataclasses.replace(result, session=session)
        self._set_state().result = result
        out_dir = getattr(self, "out_dir", None)
        if out_dir is not None and result.known:
            path = Path(out_dir) / "alignments" / f"{session}.parquet"
            if path.exists() or path.is_symlink():
                # nothing finished is rewritten by a peer (issue 19): a session name is used
                # once, also across restarts of this party
                raise refuse(ProtocolError, f"party {self.name!r}: session {session!r} finished "
                                            "before; a new run opens a new session",
                             code="session.finished")
            write_set_alignment(result, path)
        log.info("%s: %s session %r finished (%s)", self.name, result.method, session,
                 result.sizes)

    # --- PSU (passive side of Algorithm 1) ------------------------------------------------

    def on_psu_round1(self, sender: str, message: PsuRound1) -> PsuRound1Reply:
        self._cap("I_a^s1", message.a_s1)
        group = get_group(message.group, compute=self.compute)
        # lines 4-5: I_a^s1 and our own set once each (hashing ours is cheaper, not counted)
        self._afford(group, len(message.a_s1) + len(self.table), "PsuRound1")
        s = _PeerSession(group=group, own=self._own_elements(group))
        s.psu_e = psu.PsuExponents.draw(group)  # line 2
        a_st, p_t = psu.lines4_5(group, message.a_s1, s.own, s.psu_e)
        self.session.data["set"] = s
        self.session.commit("n_p", len(s.own))  # later rounds are bound to both set sizes
        return PsuRound1Reply(a_s1t1=a_st, p_t1=p_t)

    def on_psu_round2(self, sender: str, message: PsuRound2) -> PsuRound2Reply:
        # sizes were checked against round 1 by the declaration (PSU): |a_s2| = n_a, ...
        s = self._set_state()
        self._cap("I_p^(s1 t1)", message.p_s1t1, own=len(s.own))
        self._cap("the blinded union", message.union_s123t1, own=len(s.own))
        self._cap("I_a^s2", message.a_s2)
        # line 9 (the union) and line 11 (I_a^s2) once each, line 12 (our own set) once
        self._afford(s.group, len(message.union_s123t1) + len(message.a_s2) + len(s.own),
                     "PsuRound2")
        g, e = s.group, s.psu_e
        if e is None:  # pragma: no cover - the declaration orders the rounds
            raise ProtocolError(f"party {self.name!r}: session {message.session!r} is not PSU")
        g.validate(message.p_s1t1, "I_p^{s1 t1}")  # checked, though P_p needs no more of it
        final = psu.line9(g, message.union_s123t1, e)
        union = psu.line10(final, group=g)  # line 10 on our side
        a_s2t123 = psu.raise_for_peer(g, message.a_s2, e)
        s.union = union
        return PsuRound2Reply(union=final, a_s2t123=a_s2t123, p_t2=psu.blind_own(g, s.own, e))

    def on_psu_round3(self, sender: str, message: PsuRound3) -> Ack:
        s = self._set_state()
        self._cap("I_p^(s1 s2 s3 t2)", message.p_s123t2, own=len(s.own))
        if s.psu_e is None or s.union is None:  # pragma: no cover - declaration orders rounds
            raise ProtocolError(f"party {self.name!r}: PsuRound3 before PsuRound2")
        mine = psu.finish_own(s.group, message.p_s123t2, s.psu_e, s.union, expected=len(s.own))
        n_u = len(s.union)
        sizes = {"secondary": len(s.own), "union": n_u}
        self._finish(message.session, _psu_output(s.group, mine, sizes))
        return Ack()

    # --- PSI (passive side) -----------------------------------------------------------------

    def on_psi_round1(self, sender: str, message: PsiRound1) -> PsiRound1Reply:
        self._cap("H(x)^a", message.a_s)
        group = get_group(message.group, compute=self.compute)
        self._afford(group, len(message.a_s) + len(self.table), "PsiRound1")
        how = psi.check_reveal(message.reveal)
        s = _PeerSession(group=group, own=self._own_elements(group), reveal=how)
        s.psi_e = group.random_exponent()
        a_st = psi.reblind(group, message.a_s, s.psi_e, keep_order=how in ("both", "primary"))
        p_t, order = psi.blind(group, s.own, s.psi_e)
        s.p_order, s.a_st = order, a_st
        self.session.data["set"] = s
        self.session.commit("n_p", len(s.own))
        if how in ("primary", "cardinality"):  # we learn nothing more: done
            self._finish(message.session, SetAlignment(
                method="psi", group=group.name, rows=np.empty(0, dtype=np.int64),
                uids=group.empty(), size=-1, known=False, sizes={"secondary": len(s.own)}))
        return PsiRound1Reply(a_st=a_st, p_t=p_t)

    def on_psi_round2(self, sender: str, message: PsiRound2) -> Ack:
        s = self._set_state()
        self._cap("H(y)^ba", message.p_ts, own=len(s.own))
        if s.psi_e is None or s.a_st is None or s.p_order is None:  # pragma: no cover
            raise ProtocolError(f"party {self.name!r}: session {message.session!r} is not PSI")
        p_ts = s.group.validate(message.p_ts, "H(y)^ba")
        mine = psi.intersect(p_ts, s.p_order, s.a_st, ordered=True)
        self._finish(message.session, _psi_output(s.group, mine, {"secondary": len(s.own),
                                                                  "intersection": mine.size}))
        return Ack()

    def on_fetch_alignment(self, sender: str, message: FetchAlignment) -> AlignmentView:
        """Our intersection rows of a finished PSI session, ordered by UID, to the party that
        ran it with us only (the declaration: the session's opener, ``reveal = "both"``)."""
        r = self._set_state().result
        if r is None or r.method != "psi" or not r.known:
            raise refuse(ProtocolError, f"party {self.name!r}: no PSI intersection for session "
                                        f"{message.session!r}", code="session.no-alignment")
        by_uid = np.argsort(_uid_keys(r.uids), kind="stable")
        return AlignmentView(session=message.session, secondary=self.name,
                             primary_index=np.empty(0, dtype=np.int64),
                             secondary_index=r.rows[by_uid].astype(np.int64), primary=sender)


def _uid_keys(uids: Elements) -> npt.NDArray[Any]:
    return as_rows(uids)


def pair_by_uid(mine: SetAlignment, peer_rows_in_uid_order: npt.NDArray[np.int64]
                ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(own rows, peer rows) of the intersection, paired through the sorted UIDs."""
    ref = sorted_unique(mine.uids)
    pos = lookup(ref, mine.uids, "own intersection UIDs")
    own_sorted = np.empty(len(pos), dtype=np.int64)
    own_sorted[pos] = mine.rows
    if len(peer_rows_in_uid_order) != len(own_sorted):
        raise ProtocolError(f"the peer holds {len(peer_rows_in_uid_order)} intersection rows, "
                            f"we hold {len(own_sorted)}")
    return own_sorted, np.asarray(peer_rows_in_uid_order, dtype=np.int64)
