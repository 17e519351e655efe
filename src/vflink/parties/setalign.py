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
from collections.abc import Callable, Iterable, Iterator, Sequence
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
from vflink.alignment._spool import Buckets, RowOrder, Spool, Workdir, bucket_bits, shuffle
from vflink.alignment.groups import Elements, Group, get_group
from vflink.data.table import PartyTable
from vflink.errors import PolicyViolation, ProtocolError
from vflink.parties.policy import PartyPolicy
from vflink.protocol.boundary import refuse
from vflink.protocol.channel import Channel
from vflink.protocol.messages import (
    MAX_CHUNK_ROWS,
    Ack,
    AlignmentView,
    FetchAlignment,
    Message,
    PsiChunk,
    PsiFetch,
    PsiRound1,
    PsuChunk,
    PsuFetch,
    PsuRound1,
    SetChunk,
)
from vflink.protocol.sessions import PSI as PSI_PROTOCOL
from vflink.protocol.sessions import PSU as PSU_PROTOCOL
from vflink.protocol.sessions import Session, SessionTable
from vflink.types import Compute

__all__ = [
    "KeyBatches",
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
    #: set when the output was streamed to this Parquet file instead of being held: then
    #: ``rows``/``uids`` are empty and ``union``/``uid_index`` None (issue 22)
    path: Path | None = None

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({"row": self.rows.astype(np.int64), "uid": to_hex(self.uids)})


#: rows per record batch of a written alignment (hex UIDs are made one batch at a time)
WRITE_BATCH_ROWS = 65_536


def write_set_alignment(result: SetAlignment, path: Path) -> None:
    """``row``/``uid`` Parquet of a party's output (atomically), written in record batches
    so the hex text of the UIDs never exists for all rows at once (issue 22)."""
    n = len(result.rows)
    write_alignment_rows(path, ((result.rows[lo:lo + WRITE_BATCH_ROWS],
                                 result.uids[lo:lo + WRITE_BATCH_ROWS])
                                for lo in range(0, n, WRITE_BATCH_ROWS)))


def write_alignment_rows(path: Path, batches: Iterable[tuple[npt.NDArray[np.int64], Elements]]
                         ) -> None:
    """``row``/``uid`` Parquet (atomically) from (rows, UIDs) batches in row order, each cut
    to at most :data:`WRITE_BATCH_ROWS` rows: what :func:`write_set_alignment` writes, from a
    stream (issue 22). No batch at all writes the empty table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    empty = pd.DataFrame({"row": np.empty(0, dtype=np.int64), "uid": pd.Series([], dtype=object)})
    schema = pa.Schema.from_pandas(empty, preserve_index=False).set(
        1, pa.field("uid", pa.string()))
    with atomic_open(path, "wb") as fh:  # never through a link planted at ``path``
        with pq.ParquetWriter(fh, schema) as writer:
            wrote = False
            for rows, uids in batches:
                for lo in range(0, len(rows), WRITE_BATCH_ROWS):
                    hi = lo + WRITE_BATCH_ROWS
                    writer.write_table(pa.table({
                        "row": pa.array(np.asarray(rows[lo:hi], dtype=np.int64), pa.int64()),
                        "uid": pa.array(to_hex(uids[lo:hi]), pa.string())}, schema=schema))
                    wrote = True
            if not wrote:
                writer.write_table(pa.table({"row": pa.array([], pa.int64()),
                                             "uid": pa.array([], pa.string())}, schema=schema))


def _psu_rows(pairs: Iterable[tuple[tuple[Elements, npt.NDArray[np.int64]],
                                    tuple[Elements, npt.NDArray[np.int64]]]],
              n_own: int, order: RowOrder) -> int:
    """:func:`~vflink.alignment.psu.locate_buckets` streamed: the same checks, each own
    record's UID (its own final element, which U holds) to ``order``; returns |U|."""
    n_u = 0
    for (union, _), (mine, rows) in pairs:
        uids, _ = psu.bucket_union(union, mine)  # every record's element is in U
        order.add(rows, mine)
        n_u += len(uids)
    if len(order) != n_own:
        raise ProtocolError(f"expected {n_own} elements for our records, got {len(order)}")
    return n_u


def _psi_rows(pairs: Iterable[tuple[tuple[Elements, npt.NDArray[np.int64]],
                                    tuple[Elements, npt.NDArray[np.int64]]]],
              order: RowOrder) -> int:
    """:func:`~vflink.alignment.psi.intersect_buckets` streamed (one pass): each own row that
    hits, with its UID, to ``order``; returns the intersection's size."""
    size = 0
    for (mine, mine_rows), (theirs, _) in pairs:
        hit = psi.bucket_hits(mine, theirs)
        size += int(hit.sum())
        order.add(mine_rows[hit], mine[hit])
    return size


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


class KeyBatches:
    """Record keys read in batches (issue 22): ``len()`` and ``batches(size)`` yielding lists
    of canonical key bytes in row order. A list of keys is one too (see :func:`key_batches`)."""

    def __init__(self, n: int, read: Callable[[int], Iterable[Sequence[bytes]]]) -> None:
        self.n, self._read = n, read

    def __len__(self) -> int:
        return self.n

    def batches(self, size: int) -> Iterator[Sequence[bytes]]:
        """Batches of at most ``size`` keys, in row order, re-cut from the reader's batches."""
        pending: list[bytes] = []
        for batch in self._read(size):
            pending.extend(batch)
            while len(pending) >= size:
                yield pending[:size]
                pending = pending[size:]
        if pending:
            yield pending


def key_batches(keys: Sequence[bytes] | KeyBatches) -> KeyBatches:
    if isinstance(keys, KeyBatches):
        return keys
    return KeyBatches(len(keys), lambda size: (keys[i:i + size]
                                               for i in range(0, len(keys), size)))


def default_chunk_rows(group: Group) -> int:
    """Elements per chunk: the engine's ``chunk_rows`` (``[compute]``), else its default."""
    from vflink.engine.base import DEFAULT_CHUNK_ROWS

    rows = group.compute.chunk_rows if group.compute is not None else DEFAULT_CHUNK_ROWS
    return max(1, min(int(rows), MAX_CHUNK_ROWS))


def _hashed(group: Group, keys: KeyBatches, size: int
            ) -> Iterator[tuple[npt.NDArray[np.int64], Elements]]:
    """(rows, H(key)) for every key, one batch at a time."""
    lo = 0
    for batch in keys.batches(size):
        yield np.arange(lo, lo + len(batch), dtype=np.int64), group.hash_to_group(batch)
        lo += len(batch)


class SetAlignmentDriver:
    """The active party's side of PSU and PSI.

    Every list travels in chunks of at most ``chunk_rows`` elements (issue 22), and what this
    party must remember between chunks is kept on disk under ``tmp_dir`` (a private temporary
    directory, removed when the protocol ends or fails): neither a message nor this process
    ever holds a whole round.

    Args:
        keys: canonical key bytes of each own record (see :func:`key_bytes`), or
            :class:`KeyBatches` reading them in batches.
        channel: the driving party's channel.
        group: the group object (its workers decide the parallelism).
        chunk_rows: elements per chunk (default: the group's engine's ``chunk_rows``).
        tmp_dir: where the on-disk buckets go (default: the system's temporary directory).
        out: stream this party's output to this ``row``/``uid`` Parquet file (written
            atomically when the protocol ends) instead of holding it: the returned
            :class:`SetAlignment` then has ``path`` set and no rows or UIDs.
    """

    def __init__(self, keys: Sequence[bytes] | KeyBatches, channel: Channel, group: Group, *,
                 progress: StepProgress | None = None, chunk_rows: int | None = None,
                 tmp_dir: Path | None = None, out: Path | None = None) -> None:
        self.keys = key_batches(keys)
        self.channel = channel
        self.group = group
        self.progress = progress
        self.chunk_rows = default_chunk_rows(group) if chunk_rows is None else int(chunk_rows)
        if not 1 <= self.chunk_rows <= MAX_CHUNK_ROWS:
            raise ProtocolError(f"chunk_rows must be in [1, {MAX_CHUNK_ROWS}], got "
                                f"{self.chunk_rows}")
        self.tmp_dir = tmp_dir
        self.out = out

    def _step(self, stage: str, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(stage, done, total)

    # --- streaming -------------------------------------------------------------------------

    def _upload(self, peer: str, kind: type[PsuChunk] | type[PsiChunk], session: str,
                stream: str, chunks: Iterable[Elements], total: int) -> None:
        sent = index = 0
        for el in chunks:
            if len(el) == 0:
                continue
            self.channel.request(peer, kind(session=session, stream=stream, index=index,
                                            total=total, elements=el), Ack)
            sent += len(el)
            index += 1
        if total == 0:  # an empty list is one empty chunk, so its round still closes
            self.channel.request(peer, kind(session=session, stream=stream, index=0, total=0,
                                            elements=self.group.empty()), Ack)
        if sent != total:  # pragma: no cover - our own lists
            raise ProtocolError(f"{stream}: sent {sent} elements of {total}")

    def _fetch(self, peer: str, kind: type[PsuFetch] | type[PsiFetch], session: str,
               stream: str, total: int) -> Iterator[Elements]:
        got = index = 0
        while got < total or index == 0:
            want = min(self.chunk_rows, total - got)
            reply = self.channel.request(peer, kind(session=session, stream=stream,
                                                    index=index), SetChunk)
            el = self.group.check(reply.elements, stream)
            if reply.stream != stream or reply.index != index or len(el) != want:
                raise ProtocolError(f"{peer!r} returned chunk {reply.index} of "
                                    f"{reply.stream!r} with {len(el)} elements; expected "
                                    f"chunk {index} of {stream!r} with {want}")
            yield el
            got += want
            index += 1
            if total == 0:
                return

    def _shuffled(self, work: Workdir, name: str, parts: Iterable[tuple[Elements,
                  npt.NDArray[np.int64] | None]], expected: int, *, rows: bool = False
                  ) -> Spool:
        """Elements (and rows) in a secret uniformly random order, on disk."""
        g = self.group
        rb = Buckets(work.new(name + "-draw"), g.element_bytes,
                     bits=bucket_bits(expected, self.chunk_rows), random=True)
        for el, r in parts:
            rb.add(el, r)
        return shuffle(rb, Spool(work.new(name), g.element_bytes, rows=rows))

    def _buckets(self, work: Workdir, name: str, expected: int) -> Buckets:
        return Buckets(work.new(name), self.group.element_bytes,
                       bits=bucket_bits(expected, self.chunk_rows))

    # --- the protocols ---------------------------------------------------------------------

    def psu(self, peer: str, session: str = "psu") -> SetAlignment:
        """Run Algorithm 1 with ``peer`` (P_p); return this party's output."""
        g, c = self.group, self.chunk_rows
        steps = 5
        n_a = len(self.keys)
        work = Workdir(self.tmp_dir)
        try:
            e = psu.PsuExponents.draw(g)  # line 1
            self._step("round 1", 1, steps)
            opened = self.channel.request(peer, PsuRound1(session=session, group=g.name,
                                                          n_a=n_a, chunk_rows=c), Ack)
            n_p = _count(opened, peer, "n_p")
            # line 3: I_a^{s1}, shuffled; the hashed records are kept on disk in record order
            # for line 11 (hashed once, as with whole lists)
            own = Spool(work.new("own"), g.element_bytes)

            def hashed_once() -> Iterator[tuple[Elements, None]]:
                for _, h in _hashed(g, self.keys, c):
                    own.append(h)
                    yield g.power(h, e.first), None

            a_s1 = self._shuffled(work, "a_s1", hashed_once(), n_a)
            self._upload(peer, PsuChunk, session, "a_s1", (x for x, _ in a_s1.chunks(c)), n_a)
            self._step("round 2", 2, steps)
            # line 7: the union of I_a^{s1 t1} and I_p^{s1 t1}, merged bucket by bucket
            merged = self._buckets(work, "merge", n_a + n_p)
            for el in self._fetch(peer, PsuFetch, session, "a_s1t1", n_a):
                merged.add(g.validate(el, "I_a^{s1 t1}"))
            p_st = self._shuffled(work, "p_s1t1", (
                (g.power(el, e.first, check="I_p^{t1}"), None)
                for el in self._fetch(peer, PsuFetch, session, "p_t1", n_p)), n_p)
            for el, _ in p_st.chunks(c):
                merged.add(el)
            self._upload(peer, PsuChunk, session, "p_s1t1", (x for x, _ in p_st.chunks(c)),
                         n_p)  # line 6
            x23 = g.combine(e.second, e.third)
            union = self._shuffled(work, "union", ((g.power(u, x23), None) for u in (
                sorted_unique(el) for el, _ in merged) if len(u)), n_a + n_p)  # line 8
            merged.drop()
            n_u = len(union)
            self._upload(peer, PsuChunk, session, "union_s123t1",
                         (x for x, _ in union.chunks(c)), n_u)
            self._upload(peer, PsuChunk, session, "a_s2",  # line 11, own order
                         (psu.blind_own(g, h, e) for h, _ in own.chunks(c)), n_a)
            self._step("mapping", 3, steps)
            final = self._buckets(work, "U", n_u)  # line 10: U, bucket by bucket
            for el in self._fetch(peer, PsuFetch, session, "union", n_u):
                final.add(g.validate(el, "U"))
            mine = self._buckets(work, "mine", n_u)
            f13 = g.combine(e.first, e.third)
            lo = 0
            for el in self._fetch(peer, PsuFetch, session, "a_s2t123", n_a):
                z = g.power(el, f13, check="x^{s2 t1 t2 t3} / x^{s1 s2 s3 t2}")
                mine.add(z, np.arange(lo, lo + len(z), dtype=np.int64))
                lo += len(z)
            if self.out is None:
                result = psu.locate_buckets(zip(final, mine, strict=True), n_a,
                                            g.element_bytes)
            else:  # each record's UID to disk, in row order
                order = RowOrder(work.new("rows"), g.element_bytes, n_a, c)
                _psu_rows(zip(final, mine, strict=True), n_a, order)
            back = Spool(work.new("p_s123t2"), g.element_bytes)
            for el in self._fetch(peer, PsuFetch, session, "p_t2", n_p):
                back.append(psu.raise_for_peer(g, el, e))  # line 12, in the order received
            self._upload(peer, PsuChunk, session, "p_s123t2", (x for x, _ in back.chunks(c)),
                         n_p)
            if self.out is not None:
                write_alignment_rows(self.out, order)
        finally:
            work.close()
        self._step("done", steps, steps)
        sizes = {"primary": n_a, "secondary": n_p, "union": n_u,
                 "intersection": n_a + n_p - n_u}
        if self.out is not None:
            return SetAlignment(method="psu", group=g.name, rows=np.empty(0, dtype=np.int64),
                                uids=g.empty(), size=n_u, sizes=sizes, session=session,
                                path=self.out)
        return dataclasses.replace(_psu_output(g, result, sizes), session=session)

    def psi(self, peer: str, session: str = "psi", reveal: str = "both") -> SetAlignment:
        """ECDH PSI with ``peer``; this party learns the intersection unless ``reveal`` is
        ``secondary`` or ``cardinality`` (then only its size)."""
        how = psi.check_reveal(reveal)
        g, c = self.group, self.chunk_rows
        n_a = len(self.keys)
        ordered = how in ("both", "primary")
        work = Workdir(self.tmp_dir)
        try:
            a = g.random_exponent()
            self._step("round 1", 1, 3)
            opened = self.channel.request(peer, PsiRound1(session=session, group=g.name,
                                                          reveal=how, n_a=n_a, chunk_rows=c),
                                          Ack)
            n_p = _count(opened, peer, "n_p")
            # H(x)^a in a secret order; ``sent`` remembers each position's record row
            sent = self._shuffled(work, "a_s", ((g.power(h, a), rows) for rows, h in
                                                _hashed(g, self.keys, c)), n_a, rows=True)
            self._upload(peer, PsiChunk, session, "a_s", (x for x, _ in sent.chunks(c)), n_a)
            mine = self._buckets(work, "mine", n_a + n_p)
            lo = 0
            for el in self._fetch(peer, PsiFetch, session, "a_st", n_a):
                el = g.validate(el, "H(x)^ab")
                _, rows = sent.read(lo, lo + len(el))
                lo += len(el)
                mine.add(el, rows if ordered else None)
            theirs = self._buckets(work, "theirs", n_a + n_p)
            back = Spool(work.new("p_ts"), g.element_bytes)
            for el in self._fetch(peer, PsiFetch, session, "p_t", n_p):
                p_ts = psi.reblind(g, el, a, keep_order=True)
                theirs.add(p_ts)
                if how in ("both", "secondary"):
                    back.append(p_ts)
            order = None
            if self.out is not None and ordered:  # the intersection rows to disk, in row order
                order = RowOrder(work.new("rows"), g.element_bytes, n_a, c)
                found = psi.PsiResult(rows=None, uids=None, size=_psi_rows(
                    zip(mine, theirs, strict=True), order))
            else:
                found = psi.intersect_buckets(lambda: zip(mine, theirs, strict=True),
                                              n_rows=n_a, ordered=ordered and self.out is None)
            if how in ("both", "secondary"):
                self._step("round 2", 2, 3)
                self._upload(peer, PsiChunk, session, "p_ts", (x for x, _ in back.chunks(c)),
                             n_p)
            if self.out is not None:  # a party that learns only the size writes no rows
                write_alignment_rows(self.out, order if order is not None else ())
        finally:
            work.close()
        self._step("done", 3, 3)
        sizes = {"primary": n_a, "secondary": n_p, "intersection": found.size}
        if self.out is not None:
            return SetAlignment(method="psi", group=g.name, rows=np.empty(0, dtype=np.int64),
                                uids=g.empty(), size=found.size, known=ordered, sizes=sizes,
                                session=session, path=self.out)
        return dataclasses.replace(_psi_output(g, found, sizes), session=session)

    def fetch_rows(self, peer: str, session: str) -> AlignmentView:
        """After PSI with ``reveal="both"``: the peer's intersection rows in UID order (what
        exact alignment gives the primary; used to train on the intersection)."""
        return self.channel.request(peer, FetchAlignment(session=session), AlignmentView)


def _count(reply: Ack, peer: str, name: str) -> int:
    value = reply.info.get(name)
    if value is None or value != int(value) or value < 0:
        raise ProtocolError(f"{peer!r} did not state its set size ({name})")
    return int(value)


@dataclass
class _PeerSession:
    group: Group
    work: Workdir
    n_own: int
    chunk: int  # elements per message, as the driver announced
    local: int  # elements per batch of this party's own work (its own chunk_rows)
    psu_e: psu.PsuExponents | None = None
    psi_e: int | None = None
    reveal: str = "both"
    lists: dict[str, Spool] = field(default_factory=dict)
    draws: dict[str, Buckets] = field(default_factory=dict)
    buckets: dict[str, Buckets] = field(default_factory=dict)
    got: dict[str, int] = field(default_factory=dict)
    result: SetAlignment | None = None

    def close(self) -> None:
        self.work.close()
        self.lists.clear()
        self.draws.clear()
        self.buckets.clear()


class SetAlignmentPeer:
    """The passive party's side of PSU and PSI (a mixin: needs ``name``, ``table``, a
    ``sessions`` table and the active ``session`` of :class:`~vflink.parties.base.Party`, and
    optionally ``out_dir``, where results are written as ``alignments/<session>.parquet`` and
    the on-disk buckets of running sessions go, under ``.set-tmp``).

    Optional attributes (issue 22): ``set_keys``, own keys read in batches (e.g. from the
    table's file) instead of from ``table``; ``set_chunk_rows``, this party's own batch size
    (its ``[compute] chunk_rows``; the messages keep the driver's); ``set_out``, a path for
    each session's output, which is then streamed there instead of held (the result has
    ``path`` set and no rows: it cannot serve :class:`FetchAlignment` or training).

    What may arrive when, from whom and of which sizes is declared in
    :data:`vflink.protocol.sessions.PSU` and :data:`~vflink.protocol.sessions.PSI` and checked
    before these handlers run, chunk by chunk (issue 22); a finished session is immutable
    (issue 19). A handler that fails removes the session's files and ends it.
    """

    name: str
    table: PartyTable
    out_dir: Path | None
    sessions: SessionTable
    compute: Compute | None
    set_keys: KeyBatches | None = None
    set_chunk_rows: int | None = None
    set_out: Callable[[str], Path] | None = None
    if TYPE_CHECKING:
        @property
        def session(self) -> Session: ...  # from Party
    policy: PartyPolicy

    def _cap(self, what: str, n: int, *, own: int | None = None) -> None:
        """Refuse a peer's list above policy.max_set_elements before any work on it."""
        self.policy.check_set_size(self.name, what, int(n), own=own)

    def _afford(self, group: Group, exponentiations: int, kind: str) -> None:
        """Refuse, before any work, a chunk whose exponentiations cannot finish within the
        caller's deadline even at the group's fastest rate (its work limit, issue 19)."""
        left = remaining_s()
        need = group.min_seconds(exponentiations)
        if left is not None and need > left:
            raise refuse(PolicyViolation,
                         f"party {self.name!r}: {kind} needs {exponentiations} {group.name} "
                         f"exponentiations, at least {need:.1f} s, and the caller's deadline "
                         f"leaves {max(left, 0.0):.1f} s; allow more time or send less",
                         code="limit.work")

    def _own_hashed(self, group: Group, size: int
                    ) -> Iterator[tuple[npt.NDArray[np.int64], Elements]]:
        """(rows, H(key)) of own records, one batch of ``size`` at a time."""
        if self.set_keys is not None:
            yield from _hashed(group, self.set_keys, size)
            return
        # the key columns only, a batch at a time: a streamed (large) table is never read whole
        start = 0
        for batch in self.table.batches(self.table.schema.key, batch_rows=max(1, size)):
            stop = start + len(batch)
            keys = key_bytes(batch, self.table.schema.key, who=self.table.source, offset=start)
            yield np.arange(start, stop, dtype=np.int64), group.hash_to_group(keys)
            start = stop

    def _set_state(self) -> _PeerSession:
        state: _PeerSession | None = self.session.data.get("set")
        if state is None:  # pragma: no cover - round 1 creates it, the table orders rounds
            raise ProtocolError(f"party {self.name!r}: session {self.session.name!r} has no "
                                "state")
        if state.work.closed and state.result is None:
            raise refuse(ProtocolError, f"party {self.name!r}: session "
                                        f"{self.session.name!r} failed earlier; a new run "
                                        "opens a new session", code="session.failed")
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

    def _streamed_to(self, session: str) -> Path | None:
        """Where ``session``'s output is streamed (``set_out``; whoever sets it owns that
        path and replaces it atomically), or None to hold it."""
        return None if self.set_out is None else Path(self.set_out(session))

    def _finish(self, session: str, result: SetAlignment) -> None:
        result = dataclasses.replace(result, session=session)
        state = self._set_state()
        out_dir = getattr(self, "out_dir", None)
        if out_dir is not None and result.known and result.path is None:
            path = Path(out_dir) / "alignments" / f"{session}.parquet"
            if path.exists() or path.is_symlink():
                # nothing finished is rewritten by a peer (issue 19): a session name is used
                # once, also across restarts of this party
                raise refuse(ProtocolError, f"party {self.name!r}: session {session!r} finished "
                                            "before; a new run opens a new session",
                             code="session.finished")
            write_set_alignment(result, path)
        state.result = result
        state.close()
        log.info("%s: %s session %r finished (%s)", self.name, result.method, session,
                 result.sizes)

    def _open(self, group_name: str, n_a: int, chunk_rows: int, kind: str) -> _PeerSession:
        self._cap(f"{kind}: n_a", n_a)
        # one chunk's work and size: ≤ MAX_CHUNK_ROWS elements, and never more than the list
        # (whose total policy.max_set_elements caps)
        if not 1 <= chunk_rows <= MAX_CHUNK_ROWS:
            raise refuse(PolicyViolation, f"party {self.name!r}: chunk_rows must be in [1, "
                                          f"{MAX_CHUNK_ROWS}], got {chunk_rows}",
                         code="limit.chunk")
        group = get_group(group_name, compute=self.compute)
        n_own = len(self.set_keys) if self.set_keys is not None else len(self.table)
        self._afford(group, n_own, kind)  # our own set, once
        out_dir = getattr(self, "out_dir", None)
        work = Workdir(None if out_dir is None else Path(out_dir) / ".set-tmp")
        local = max(1, min(int(self.set_chunk_rows or chunk_rows), MAX_CHUNK_ROWS))
        return _PeerSession(group=group, work=work, n_own=n_own, chunk=chunk_rows,
                            local=local)

    def _shuffle_own(self, s: _PeerSession, name: str, exponent: int, *, rows: bool,
                     keep: bool = False) -> None:
        """Own records to ``exponent``, in a secret random order, as list ``name``; with
        ``keep``, the hashed records are also kept on disk in record order (list ``own``)."""
        g = s.group
        draw = Buckets(s.work.new(name + "-draw"), g.element_bytes,
                       bits=bucket_bits(s.n_own, s.local), random=True)
        own = Spool(s.work.new("own"), g.element_bytes) if keep else None
        for r, h in self._own_hashed(g, s.local):
            if own is not None:
                own.append(h)
            draw.add(g.power(h, exponent), r)
        if own is not None:
            s.lists["own"] = own
        s.lists[name] = shuffle(draw, Spool(s.work.new(name), g.element_bytes, rows=rows))

    def _draw(self, s: _PeerSession, name: str, expected: int) -> Buckets:
        if name not in s.draws:
            s.draws[name] = Buckets(s.work.new(name + "-draw"), s.group.element_bytes,
                                    bits=bucket_bits(expected, s.local), random=True)
        return s.draws[name]

    def _bucketed(self, s: _PeerSession, name: str, expected: int) -> Buckets:
        if name not in s.buckets:
            s.buckets[name] = Buckets(s.work.new(name), s.group.element_bytes,
                                      bits=bucket_bits(expected, s.local))
        return s.buckets[name]

    def _received(self, s: _PeerSession, message: PsuChunk | PsiChunk) -> tuple[int, bool]:
        """(offset of this chunk in its list, whether it completes the list)."""
        lo = s.got.get(message.stream, 0)
        s.got[message.stream] = lo + len(message.elements)
        return lo, s.got[message.stream] == message.total

    def _serve(self, s: _PeerSession, message: PsuFetch | PsiFetch) -> SetChunk:
        spool = s.lists[message.stream]
        el, _ = spool.read(message.index * s.chunk, (message.index + 1) * s.chunk)
        return SetChunk(stream=message.stream, index=message.index, elements=el)

    def _guarded(self, handler: Callable[[], Message]) -> Message:
        """Run a set handler; on failure the session's files are removed and it ends."""
        try:
            return handler()
        except BaseException:
            state: _PeerSession | None = self.session.data.get("set")
            if state is not None and state.result is None:
                state.close()
            raise

    # --- PSU (passive side of Algorithm 1) ------------------------------------------------

    def on_psu_round1(self, sender: str, message: PsuRound1) -> Ack:
        s = self._open(message.group, message.n_a, message.chunk_rows, "PsuRound1")
        self.session.data["set"] = s

        def run() -> Ack:
            s.psu_e = psu.PsuExponents.draw(s.group)  # line 2
            self._shuffle_own(s, "p_t1", s.psu_e.first, rows=False, keep=True)  # line 5
            self.session.commit("n_p", s.n_own)  # later lists are bound to both set sizes
            return Ack(info={"n_p": float(s.n_own)})
        return self._guarded(run)  # type: ignore[return-value]

    def on_psu_chunk(self, sender: str, message: PsuChunk) -> Ack:
        s = self._set_state()
        return self._guarded(lambda: self._psu_chunk(s, message))  # type: ignore[return-value]

    def _psu_chunk(self, s: _PeerSession, message: PsuChunk) -> Ack:
        g, e, n = s.group, s.psu_e, len(message.elements)
        if e is None:  # pragma: no cover - the declaration orders the rounds
            raise ProtocolError(f"party {self.name!r}: session {message.session!r} is not PSU")
        stream = message.stream
        if stream == "union_s123t1":
            self._cap("the blinded union", message.total, own=s.n_own)
        if stream in ("a_s1", "union_s123t1", "a_s2", "p_s123t2"):
            self._afford(g, n, f"PsuChunk {stream}")
        lo, closed = self._received(s, message)
        if stream == "a_s1":  # line 4: I_a^{s1 t1}, shuffled
            self._draw(s, "a_s1t1", message.total).add(
                g.power(message.elements, e.first, check="I_a^s1"))
            if closed:
                s.lists["a_s1t1"] = shuffle(s.draws.pop("a_s1t1"), Spool(
                    s.work.new("a_s1t1"), g.element_bytes))
        elif stream == "p_s1t1":  # line 6: checked, though P_p needs no more of it
            g.validate(message.elements, "I_p^{s1 t1}")
        elif stream == "union_s123t1":  # line 9, and line 10 on our side
            final = psu.line9(g, message.elements, e)
            self._draw(s, "union", message.total).add(final)
            self._bucketed(s, "U", message.total).add(final)
            if closed:
                s.lists["union"] = shuffle(s.draws.pop("union"), Spool(
                    s.work.new("union"), g.element_bytes))
        elif stream == "a_s2":  # line 11, in the order received
            if "a_s2t123" not in s.lists:
                s.lists["a_s2t123"] = Spool(s.work.new("a_s2t123"), g.element_bytes)
            s.lists["a_s2t123"].append(psu.raise_for_peer(g, message.elements, e))
        elif stream == "p_s123t2":  # line 12: our records located in U
            z = g.power(message.elements, g.combine(e.first, e.third),
                        check="x^{s2 t1 t2 t3} / x^{s1 s2 s3 t2}")
            union = s.buckets["U"]
            self._bucketed(s, "mine", len(union)).add(
                z, np.arange(lo, lo + len(z), dtype=np.int64))
            if closed:
                out = self._streamed_to(message.session)
                if out is None:
                    mine = psu.locate_buckets(zip(union, s.buckets["mine"], strict=True),
                                              s.n_own, g.element_bytes)
                    sizes = {"secondary": s.n_own, "union": len(mine.uids)}
                    self._finish(message.session, _psu_output(g, mine, sizes))
                    return Ack()
                order = RowOrder(s.work.new("rows"), g.element_bytes, s.n_own, s.local)
                n_u = _psu_rows(zip(union, s.buckets["mine"], strict=True), s.n_own, order)
                write_alignment_rows(out, order)
                self._finish(message.session, SetAlignment(
                    method="psu", group=g.name, rows=np.empty(0, dtype=np.int64),
                    uids=g.empty(), size=n_u, sizes={"secondary": s.n_own, "union": n_u},
                    path=out))
        return Ack()

    def on_psu_fetch(self, sender: str, message: PsuFetch) -> SetChunk:
        s = self._set_state()
        return self._guarded(lambda: self._psu_fetch(s, message))  # type: ignore[return-value]

    def _psu_fetch(self, s: _PeerSession, message: PsuFetch) -> SetChunk:
        g, e = s.group, s.psu_e
        if e is None:  # pragma: no cover - the declaration orders the rounds
            raise ProtocolError(f"party {self.name!r}: session {message.session!r} is not PSU")
        if message.stream == "p_t2":  # line 12: x^{t2} for our records, in our order
            lo = message.index * s.chunk
            self._afford(g, min(s.chunk, s.n_own - lo), "PsuFetch p_t2")
            h, _ = s.lists["own"].read(lo, lo + s.chunk)
            return SetChunk(stream="p_t2", index=message.index,
                            elements=psu.blind_own(g, h, e))
        return self._serve(s, message)

    # --- PSI (passive side) -----------------------------------------------------------------

    def on_psi_round1(self, sender: str, message: PsiRound1) -> Ack:
        how = psi.check_reveal(message.reveal)
        s = self._open(message.group, message.n_a, message.chunk_rows, "PsiRound1")
        s.reveal = how
        self.session.data["set"] = s

        def run() -> Ack:
            s.psi_e = s.group.random_exponent()
            self._shuffle_own(s, "p_t", s.psi_e, rows=True)  # H(y)^b, secret order
            self.session.commit("n_p", s.n_own)
            return Ack(info={"n_p": float(s.n_own)})
        return self._guarded(run)  # type: ignore[return-value]

    def on_psi_chunk(self, sender: str, message: PsiChunk) -> Ack:
        s = self._set_state()
        return self._guarded(lambda: self._psi_chunk(s, message))  # type: ignore[return-value]

    def _psi_chunk(self, s: _PeerSession, message: PsiChunk) -> Ack:
        g, b = s.group, s.psi_e
        if b is None:  # pragma: no cover - the declaration orders the rounds
            raise ProtocolError(f"party {self.name!r}: session {message.session!r} is not PSI")
        lo, closed = self._received(s, message)
        if message.stream == "a_s":
            self._afford(g, len(message.elements), "PsiChunk a_s")
            a_st = g.power(message.elements, b, check="blinded elements")
            if s.reveal in ("both", "primary"):  # in the order received
                if "a_st" not in s.lists:
                    s.lists["a_st"] = Spool(s.work.new("a_st"), g.element_bytes)
                s.lists["a_st"].append(a_st)
            else:  # shuffled: the primary learns only the size
                self._draw(s, "a_st", message.total).add(a_st)
            if closed and "a_st" not in s.lists:
                s.lists["a_st"] = shuffle(s.draws.pop("a_st"), Spool(
                    s.work.new("a_st"), g.element_bytes))
        elif message.stream == "p_ts":
            p_ts = g.validate(message.elements, "H(y)^ba")
            _, rows = s.lists["p_t"].read(lo, lo + len(p_ts))
            expected = len(s.lists["a_st"]) + s.n_own
            self._bucketed(s, "mine", expected).add(p_ts, rows)
            if closed:
                theirs = self._bucketed(s, "theirs", expected)
                for el, _ in s.lists["a_st"].chunks(s.local):
                    theirs.add(el)
                out = self._streamed_to(message.session)
                if out is not None:
                    order = RowOrder(s.work.new("rows"), g.element_bytes, s.n_own, s.local)
                    size = _psi_rows(zip(s.buckets["mine"], theirs, strict=True), order)
                    write_alignment_rows(out, order)
                    self._finish(message.session, SetAlignment(
                        method="psi", group=g.name, rows=np.empty(0, dtype=np.int64),
                        uids=g.empty(), size=size,
                        sizes={"secondary": s.n_own, "intersection": size}, path=out))
                    return Ack()
                mine = psi.intersect_buckets(
                    lambda: zip(s.buckets["mine"], theirs, strict=True), n_rows=s.n_own,
                    ordered=True)
                self._finish(message.session, _psi_output(
                    g, mine, {"secondary": s.n_own, "intersection": mine.size}))
        return Ack()

    def on_psi_fetch(self, sender: str, message: PsiFetch) -> SetChunk:
        s = self._set_state()

        def run() -> SetChunk:
            reply = self._serve(s, message)
            last = (message.index + 1) * s.chunk >= s.n_own
            if message.stream == "p_t" and last and s.reveal in ("primary", "cardinality"):
                # we learn nothing more: done
                self._finish(message.session, SetAlignment(
                    method="psi", group=s.group.name, rows=np.empty(0, dtype=np.int64),
                    uids=s.group.empty(), size=-1, known=False,
                    sizes={"secondary": s.n_own}))
            return reply
        return self._guarded(run)  # type: ignore[return-value]

    def on_fetch_alignment(self, sender: str, message: FetchAlignment) -> AlignmentView:
        """Our intersection rows of a finished PSI session, ordered by UID, to the party that
        ran it with us only (the declaration: the session's opener, ``reveal = "both"``)."""
        r = self._set_state().result
        if r is None or r.method != "psi" or not r.known or r.path is not None:
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
