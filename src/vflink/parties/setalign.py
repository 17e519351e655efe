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
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt
import pandas as pd

from vflink._cancel import remaining_s
from vflink._files import (
    atomic_open,
    atomic_write_bytes,
    atomic_write_json,
    open_data_bytes,
    read_data_file,
)
from vflink._typed import Bool, Int, MapOf, Obj, Opt, Str, read_typed_json
from vflink.alignment import proofs, psi, psu
from vflink.alignment._dh import as_rows, key_bytes, lookup, sorted_unique, to_hex
from vflink.alignment._spool import (
    Buckets,
    RowOrder,
    Spool,
    Workdir,
    bucket_bits,
    shuffle,
    sweep_stale,
)
from vflink.alignment.groups import Elements, Group, get_group
from vflink.data.table import PartyTable
from vflink.errors import DataError, PolicyViolation, ProtocolError, VflinkError
from vflink.parties.policy import PartyPolicy
from vflink.parties.setquota import Grant, SetAllowance, SpoolQuota
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
    SetProgress,
)
from vflink.protocol.sessions import PSI as PSI_PROTOCOL
from vflink.protocol.sessions import PSU as PSU_PROTOCOL
from vflink.protocol.sessions import ProtocolSpec, Session, SessionTable
from vflink.types import Compute

__all__ = [
    "SET_KINDS",
    "SPOOL_DIR",
    "KeyBatches",
    "SetAlignment",
    "SetAlignmentDriver",
    "SetAlignmentPeer",
    "chunk_cap",
    "exponentiation_seconds",
    "pair_by_uid",
    "spool_bytes",
    "write_set_alignment",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
M = TypeVar("M", bound=Message)

#: Where a passive party's running sessions spool, under its state directory.
SPOOL_DIR = ".set-tmp"

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
    #: ``rows``/``uids`` are empty and ``union``/``uid_index`` None (a table too large to hold)
    path: Path | None = None
    #: what the peer's policy said in round 1 (``guess_limit``: the identifiers a deviating
    #: primary can test against its set per ``guess_window_s``; ``idle_s``: its expiry)
    limits: dict[str, float] = field(default_factory=dict)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({"row": self.rows.astype(np.int64), "uid": to_hex(self.uids)})


#: rows per record batch of a written alignment (hex UIDs are made one batch at a time)
WRITE_BATCH_ROWS = 65_536


def write_set_alignment(result: SetAlignment, path: Path) -> None:
    """``row``/``uid`` Parquet of a party's output (atomically), written in record batches
    so the hex text of the UIDs never exists for all rows at once."""
    n = len(result.rows)
    write_alignment_rows(path, ((result.rows[lo:lo + WRITE_BATCH_ROWS],
                                 result.uids[lo:lo + WRITE_BATCH_ROWS])
                                for lo in range(0, n, WRITE_BATCH_ROWS)))


def write_alignment_rows(path: Path, batches: Iterable[tuple[npt.NDArray[np.int64], Elements]]
                         ) -> None:
    """``row``/``uid`` Parquet (atomically) from (rows, UIDs) batches in row order, each cut
    to at most :data:`WRITE_BATCH_ROWS` rows: what :func:`write_set_alignment` writes, from a
    stream. No batch at all writes the empty table."""
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
    """Record keys read in batches: ``len()`` and ``batches(size)`` yielding lists
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


@dataclass
class _Keepalive:
    """The driver's side of a session's idle expiry: while it computes a list, it tells the
    peer how far it has come (:class:`SetProgress`) at a quarter of the peer's idle time."""

    peer: str
    session: str
    every_s: float
    #: most elements a SetProgress may claim (the peer's bound: a few passes over both sets)
    bound: int
    done: dict[str, int] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)


class SetAlignmentDriver:
    """The active party's side of PSU and PSI.

    Every list travels in chunks of at most ``chunk_rows`` elements, and what this
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
        self._alive: _Keepalive | None = None
        self._last = time.monotonic()

    def _step(self, stage: str, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(stage, done, total)

    # --- keeping the session alive ---------------------------------------------------------

    def _request(self, peer: str, message: Message, reply: type[M]) -> M:
        """A request to the peer (every message keeps the session alive)."""
        out = self.channel.request(peer, message, reply)
        self._last = time.monotonic()
        return out

    def _open(self, peer: str, session: str, round1: PsuRound1 | PsiRound1, n_a: int
              ) -> tuple[Ack, int, int]:
        """Round 1: the peer's answer, its set size and the chunk size it accepts; from here
        on the driver keeps the session alive while it computes."""
        opened = self._request(peer, round1, Ack)
        n_p = _count(opened, peer, "n_p")
        c = self._agreed_chunk(opened, peer)
        idle = opened.info.get("idle_s")
        self._alive = None if idle is None or not idle > 0 else _Keepalive(
            peer=peer, session=session, every_s=float(idle) / 4.0,
            bound=_PROGRESS_PASSES * (n_a + n_p))
        return opened, n_p, c

    def _tick(self, stream: str, n: int) -> None:
        """``n`` more elements of ``stream`` computed: a SetProgress if the peer has not heard
        from us for a third of its idle time."""
        k = self._alive
        if k is None:
            return
        k.done[stream] = k.done.get(stream, 0) + n
        if time.monotonic() - self._last < k.every_s:
            return
        done = min(k.done[stream], k.bound)
        if done > k.sent.get(stream, 0):
            self._request(k.peer, SetProgress(session=k.session, stream=stream, done=done),
                          Ack)
            k.sent[stream] = done

    def _apply(self, stream: str, f: Callable[[Elements], Elements], el: Elements) -> Elements:
        """``f`` (a group operation on each element) on a fetched chunk, in batches with the
        keepalive between: a chunk is the peer's work limit, which may be more than ours."""
        b = self._batch(len(el))
        if b >= len(el):
            out = f(el)
            self._tick(stream, len(el))
            return out
        parts = []
        for lo in range(0, len(el), b):
            parts.append(f(el[lo:lo + b]))
            self._tick(stream, len(parts[-1]))
        return np.concatenate(parts)

    def _ticking(self, items: Iterable[T], stream: str, size: Callable[[T], int]) -> Iterator[T]:
        """``items`` as they come, each counted as progress on ``stream``."""
        for item in items:
            yield item
            self._tick(stream, size(item))

    def _batch(self, c: int) -> int:
        """Elements per batch of our own group operations: at most a chunk, and few enough
        that one batch (a hash and an exponentiation each, at this machine's single-core speed
        whatever its workers: a loaded machine gives them no spare core) takes a quarter of
        the keepalive's interval."""
        k = self._alive
        if k is None:
            return c
        per = 2.0 * exponentiation_seconds(self.group)
        return max(1, min(c, int(0.25 * k.every_s / per)))

    def _limits(self, opened: Ack) -> dict[str, float]:
        return {k: float(opened.info[k]) for k in ("guess_limit", "guess_window_s", "idle_s")
                if k in opened.info}

    # --- streaming -------------------------------------------------------------------------

    def _upload(self, peer: str, kind: type[PsuChunk] | type[PsiChunk], session: str,
                stream: str, chunks: Iterable[Elements], total: int,
                last: Callable[[], dict[str, Any]] | None = None) -> None:
        """``chunks`` as messages of ``stream``; ``last()`` gives extra fields of the last one
        (a proof over the whole list), the one that completes ``total``."""
        sent = index = 0
        for el in chunks:
            if len(el) == 0:
                continue
            extra = last() if last is not None and sent + len(el) == total else {}
            self._request(peer, kind(session=session, stream=stream, index=index,
                                            total=total, elements=el, **extra), Ack)
            sent += len(el)
            index += 1
        if total == 0:  # an empty list is one empty chunk, so its round still closes
            extra = last() if last is not None else {}
            self._request(peer, kind(session=session, stream=stream, index=0, total=0,
                                            elements=self.group.empty(), **extra), Ack)
        if sent != total:  # pragma: no cover - our own lists
            raise ProtocolError(f"{stream}: sent {sent} elements of {total}")

    def _fetch(self, peer: str, kind: type[PsuFetch] | type[PsiFetch], session: str,
               stream: str, total: int, chunk: int) -> Iterator[Elements]:
        got = index = 0
        while got < total or index == 0:
            want = min(chunk, total - got)
            reply = self._request(peer, kind(session=session, stream=stream,
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

    def _own_size(self) -> int:
        """Our record count: a peer refuses a set size that is not positive, so an empty
        table is refused here, before any message, naming what is wrong."""
        n = len(self.keys)
        if n < 1:
            raise DataError("the aligning party's table has no records: there is nothing to "
                            "align (a peer refuses a set of size 0)")
        return n

    def _agreed_chunk(self, reply: Ack, peer: str) -> int:
        """The chunk size the peer accepted in round 1 (at most ours: its work limit)."""
        value = reply.info.get("chunk_rows")
        if value is None:
            return self.chunk_rows
        if value != int(value) or not 1 <= value <= self.chunk_rows:
            raise ProtocolError(f"{peer!r} answered chunk_rows = {value}; expected an int in "
                                f"[1, {self.chunk_rows}]")
        return int(value)

    # --- the protocols ---------------------------------------------------------------------

    def psu(self, peer: str, session: str = "psu") -> SetAlignment:
        """Run Algorithm 1 with ``peer`` (P_p); return this party's output.

        Line 11 as vflink runs it (:mod:`vflink.alignment.psu`): P_p raises the list of line
        3 it already holds, in our order, which the list ``a_s1`` maps back to our records.
        """
        g = self.group
        steps = 5
        n_a = self._own_size()
        sweep_stale(self.tmp_dir)
        work = Workdir(self.tmp_dir)
        try:
            e = psu.PsuExponents.draw(g)  # line 1
            self._step("round 1", 1, steps)
            opened, n_p, c = self._open(peer, session, PsuRound1(
                session=session, group=g.name, n_a=n_a, chunk_rows=self.chunk_rows), n_a)
            # line 3: I_a^{s1} in a secret order; the spool keeps each position's record row,
            # by which line 11's answer (in this order) comes back to our records. A shuffle
            # needs the whole list before its first chunk: the peer hears of our progress
            a_s1 = self._shuffled(work, "a_s1", self._ticking(
                ((g.power(h, e.first), rows) for rows, h in _hashed(g, self.keys, self._batch(c))),
                "a_s1", _first_len), n_a, rows=True)
            self._upload(peer, PsuChunk, session, "a_s1", (x for x, _ in a_s1.chunks(c)), n_a)
            self._step("round 2", 2, steps)
            # line 7: the union of I_a^{s1 t1} and I_p^{s1 t1}, merged bucket by bucket
            merged = self._buckets(work, "merge", n_a + n_p)
            for el in self._fetch(peer, PsuFetch, session, "a_s1t1", n_a, c):
                merged.add(self._apply("a_s1t1", lambda x: g.validate(x, "I_a^{s1 t1}"), el))
            p_st = self._shuffled(work, "p_s1t1", (
                (self._apply("p_t1", lambda x: g.power(x, e.first, check="I_p^{t1}"), el), None)
                for el in self._fetch(peer, PsuFetch, session, "p_t1", n_p, c)), n_p)
            for el, _ in self._ticking(p_st.chunks(c), "p_s1t1", _first_len):
                merged.add(el)
            self._upload(peer, PsuChunk, session, "p_s1t1", (x for x, _ in p_st.chunks(c)),
                         n_p)  # line 6
            x23 = g.combine(e.second, e.third)
            b = self._batch(c)
            union = self._shuffled(work, "union", self._ticking(
                ((g.power(u[i:i + b], x23), None) for u in (sorted_unique(el) for el, _ in merged)
                 for i in range(0, len(u), b)), "union_s123t1", _first_len), n_a + n_p)  # line 8
            merged.drop()
            n_u = len(union)
            self._upload(peer, PsuChunk, session, "union_s123t1",
                         (x for x, _ in union.chunks(c)), n_u)
            self._step("mapping", 3, steps)
            final = self._buckets(work, "U", n_u)  # line 10: U, bucket by bucket
            for el in self._fetch(peer, PsuFetch, session, "union", n_u, c):
                final.add(self._apply("union", lambda x: g.validate(x, "U"), el))
            mine = self._buckets(work, "mine", n_u)
            lo = 0
            for el in self._fetch(peer, PsuFetch, session, "a_s1t123", n_a, c):  # line 11
                z = self._apply("a_s1t123", lambda x: psu.line11_finish(g, x, e), el)
                _, rows = a_s1.read(lo, lo + len(z))
                mine.add(z, rows)
                lo += len(z)
            located = self._ticking(zip(final, mine, strict=True), "p_t2", _pair_len)
            if self.out is None:
                result = psu.locate_buckets(located, n_a, g.element_bytes)
            else:  # each record's UID to disk, in row order
                order = RowOrder(work.new("rows"), g.element_bytes, n_a, c)
                _psu_rows(located, n_a, order)
            back = Spool(work.new("p_s123t2"), g.element_bytes)
            for el in self._fetch(peer, PsuFetch, session, "p_t2", n_p, c):
                # line 12, in the order received
                back.append(self._apply("p_t2", lambda x: psu.raise_for_peer(g, x, e), el))
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
                                path=self.out, limits=self._limits(opened))
        return dataclasses.replace(_psu_output(g, result, sizes), session=session,
                                   limits=self._limits(opened))

    def psi(self, peer: str, session: str = "psi", reveal: str = "both") -> SetAlignment:
        """ECDH PSI with ``peer``; this party learns the intersection unless ``reveal`` is
        ``secondary`` or ``cardinality`` (then only its size).

        When the peer is to learn the intersection, its part (our exponent applied to its
        list, ``p_ts``) carries a batched Chaum–Pedersen proof (:mod:`vflink.alignment.proofs`)
        over the elements that match, against the exponent committed in round 1: the peer
        accepts no row we did not raise with that exponent.
        """
        how = psi.check_reveal(reveal)
        g = self.group
        n_a = self._own_size()
        ordered = how in ("both", "primary")
        told = how in ("both", "secondary")
        sweep_stale(self.tmp_dir)
        work = Workdir(self.tmp_dir)
        try:
            a = g.random_exponent()
            self._step("round 1", 1, 3)
            opened, n_p, c = self._open(peer, session, PsiRound1(
                session=session, group=g.name, reveal=how, n_a=n_a, chunk_rows=self.chunk_rows,
                commitment=proofs.commit(g, a)[0].tobytes()), n_a)
            # H(x)^a in a secret order; ``sent`` remembers each position's record row
            sent = self._shuffled(work, "a_s", self._ticking(
                ((g.power(h, a), rows) for rows, h in _hashed(g, self.keys, self._batch(c))),
                "a_s", _first_len), n_a, rows=True)
            self._upload(peer, PsiChunk, session, "a_s", (x for x, _ in sent.chunks(c)), n_a)
            mine = self._buckets(work, "mine", n_a + n_p)
            lo = 0
            for el in self._fetch(peer, PsiFetch, session, "a_st", n_a, c):
                el = self._apply("a_st", lambda x: g.validate(x, "H(x)^ab"), el)
                _, rows = sent.read(lo, lo + len(el))
                lo += len(el)
                mine.add(el, rows if ordered else None)
            theirs = self._buckets(work, "theirs", n_a + n_p)
            p_t = Spool(work.new("p_t"), g.element_bytes) if told else None
            back = Spool(work.new("p_ts"), g.element_bytes)
            at = 0
            for el in self._fetch(peer, PsiFetch, session, "p_t", n_p, c):
                p_ts = self._apply("p_t", lambda x: psi.reblind(g, x, a, keep_order=True), el)
                # positions in p_t's order: the proof covers those that match
                theirs.add(p_ts, np.arange(at, at + len(p_ts), dtype=np.int64))
                at += len(p_ts)
                if p_t is not None:
                    p_t.append(g.check(el, "H(y)^b"))
                    back.append(p_ts)
            order = None
            # with p_ts to send, the peer waits for it while we intersect and prove: keep it
            # alive (without, its session is done once it has sent p_t)

            def buckets() -> Iterator[tuple[tuple[Elements, npt.NDArray[np.int64]],
                                            tuple[Elements, npt.NDArray[np.int64]]]]:
                pairs = zip(mine, theirs, strict=True)
                return self._ticking(pairs, "p_ts", _pair_len) if told else pairs

            if self.out is not None and ordered:  # the intersection rows to disk, in row order
                order = RowOrder(work.new("rows"), g.element_bytes, n_a, c)
                found = psi.PsiResult(rows=None, uids=None, size=_psi_rows(buckets(), order))
            else:
                found = psi.intersect_buckets(buckets, n_rows=n_a,
                                              ordered=ordered and self.out is None)
            if told and p_t is not None:
                self._step("round 2", 2, 3)
                matched = _matched_positions(mine, theirs, n_p,
                                             tick=lambda n: self._tick("p_ts", n))
                gathered = _gathered(p_t, back, matched, self._batch(c))

                def pairs() -> Iterator[tuple[Elements, Elements]]:
                    return self._ticking(gathered(), "p_ts", _first_len)

                self._upload(peer, PsiChunk, session, "p_ts", (x for x, _ in back.chunks(c)),
                             n_p, last=lambda: {"proof": proofs.prove_batches(
                                 g, a, pairs, ctx=proofs.context(session, "p_ts", -1))})
            if self.out is not None:  # a party that learns only the size writes no rows
                write_alignment_rows(self.out, order if order is not None else ())
        finally:
            work.close()
        self._step("done", 3, 3)
        sizes = {"primary": n_a, "secondary": n_p, "intersection": found.size}
        if self.out is not None:
            return SetAlignment(method="psi", group=g.name, rows=np.empty(0, dtype=np.int64),
                                uids=g.empty(), size=found.size, known=ordered, sizes=sizes,
                                session=session, path=self.out, limits=self._limits(opened))
        return dataclasses.replace(_psi_output(g, found, sizes), session=session,
                                   limits=self._limits(opened))

    def fetch_rows(self, peer: str, session: str) -> AlignmentView:
        """After PSI with ``reveal="both"``: the peer's intersection rows in UID order (what
        exact alignment gives the primary; used to train on the intersection)."""
        return self._request(peer, FetchAlignment(session=session), AlignmentView)


def _count(reply: Ack, peer: str, name: str) -> int:
    value = reply.info.get(name)
    if value is None or value != int(value) or value < 0:
        raise ProtocolError(f"{peer!r} did not state its set size ({name})")
    return int(value)


def _first_len(item: tuple[Any, ...]) -> int:
    return len(item[0])


def _pair_len(item: tuple[tuple[Any, ...], tuple[Any, ...]]) -> int:
    return len(item[0][0]) + len(item[1][0])


def _matched_positions(mine: Buckets, theirs: Buckets, n: int,
                       tick: Callable[[int], None] | None = None) -> npt.NDArray[np.int64]:
    """Ascending positions (the rows stored with ``theirs``) of ``theirs``'s elements that
    ``mine`` holds, bucket by bucket; a repeated element of ``theirs`` is refused. ``tick``
    is told each bucket pair's size (a driver's keepalive)."""
    mask = np.zeros(n, dtype=bool)
    for (m, _), (t, rows) in zip(mine, theirs, strict=True):
        if tick is not None:
            tick(len(m) + len(t))
        if len(t) == 0 or len(m) == 0:
            continue
        if len(sorted_unique(t)) != len(t):
            raise refuse(ProtocolError, "the peer's list holds repeated elements",
                         code="set.repeated")
        hit = lookup(sorted_unique(m), t, "matches", missing_ok=True) >= 0
        mask[rows[hit]] = True
    return np.flatnonzero(mask).astype(np.int64)


def _windows(n: int, positions: npt.NDArray[np.int64], chunk: int
             ) -> Iterator[tuple[int, int, npt.NDArray[np.int64]]]:
    """``(lo, hi, offsets)``: the windows of ``[0, n)``, a chunk long, that hold some of the
    ascending ``positions``, with their offsets in the window (a list is read once, in order)."""
    for lo in range(0, n, max(1, chunk)):
        hi = min(n, lo + chunk)
        a, b = np.searchsorted(positions, [lo, hi])
        if a < b:
            yield lo, hi, positions[a:b] - lo


def _gathered(xs: Spool, ys: Spool, positions: npt.NDArray[np.int64], chunk: int
              ) -> proofs.Pairs:
    """The pairs ``(xs[i], ys[i])`` at ``positions`` (ascending), streamed a chunk of each
    list at a time: what a proof over the matched elements covers."""
    def pairs() -> Iterator[tuple[Elements, Elements]]:
        for lo, hi, sel in _windows(len(xs), positions, chunk):
            x, _ = xs.read(lo, hi)
            y, _ = ys.read(lo, hi)
            yield x[sel], y[sel]
    return pairs


#: measured seconds of one exponentiation on one core, per group (see exponentiation_seconds)
_RATES: dict[str, float] = {}
#: guards the lazy creation of a party's set-session allowance and spool quota
_RESOURCES_LOCK = threading.Lock()
_RATE_LOCK = threading.Lock()


def exponentiation_seconds(group: Group) -> float:
    """Seconds one exponentiation of ``group`` takes on one core of this machine, measured
    once per process (about 20 ms of work) and never below the group's declared fastest rate:
    what a party's work limit per message (``policy.max_message_work_s``) is converted with."""
    with _RATE_LOCK:
        known = _RATES.get(group.name)
        if known is not None:
            return known
        probe = type(group)(workers=1)
        n = max(8, int(0.02 / probe.min_power_s))
        elements = probe.hash_to_group([b"vflink-rate-probe-%d" % i for i in range(n)])
        started = time.perf_counter()
        probe.power(elements, probe.random_exponent())
        rate = max((time.perf_counter() - started) / n, group.min_power_s)
        probe.close()
        _RATES[group.name] = rate
        return rate


def chunk_cap(group: Group, max_work_s: float) -> int:
    """The most elements per chunk whose work (a validity check, an exponentiation and the
    spooling of each, about 1.5 exponentiations) fits ``max_work_s`` on the group's workers."""
    per = 1.5 * exponentiation_seconds(group) / max(1, group.workers)
    return max(1, min(MAX_CHUNK_ROWS, int(max_work_s / per)))


def spool_bytes(method: str, width: int, n_a: int, n_p: int) -> int:
    """An upper bound on the disk a passive party's PSU/PSI session spools (every list it
    keeps, each bucket file with its 8-byte rows, and the union at its largest, |I_a| + |I_p|),
    reserved against the peer's ``policy.max_spool_bytes`` when the session opens."""
    n_u = n_a + n_p
    r = width + 8  # a bucketed element with its row
    if method == "psu":
        need = n_p * (3 * r + 2 * width) + n_a * (r + 2 * width) + n_u * (2 * r + width)
    else:
        need = n_p * (5 * r + width) + n_a * (r + 2 * width)
    return int(need * 1.25) + (4 << 20)


@dataclass
class _PeerSession:
    group: Group
    work: Workdir | None
    n_own: int
    chunk: int  # elements per message, as agreed in round 1 (≤ this party's work cap)
    local: int  # elements per batch of this party's own work (its own chunk_rows)
    psu_e: psu.PsuExponents | None = None
    psi_e: int | None = None
    reveal: str = "both"
    commitment: Elements | None = None  # PSI: G^a, the primary's committed exponent
    lists: dict[str, Spool] = field(default_factory=dict)
    draws: dict[str, Buckets] = field(default_factory=dict)
    buckets: dict[str, Buckets] = field(default_factory=dict)
    got: dict[str, int] = field(default_factory=dict)
    result: SetAlignment | None = None
    release: Callable[[], None] | None = None  # the peer's spool reservation
    #: our records' hashes, a chunk at a time, for line 12 (in memory only)
    own: Iterator[tuple[npt.NDArray[np.int64], Elements]] | None = None
    #: the session's share of its peer's allowance (sessions and elements per window)
    grant: Grant | None = None
    #: how far the driver said it has come with each list it computes (SetProgress)
    progress: dict[str, int] = field(default_factory=dict)
    #: a handler failed through this party's own fault (not a refusal of what was sent)
    our_fault: bool = False

    @property
    def failed(self) -> bool:
        return self.result is None and (self.work is None or self.work.closed)

    def end(self, why: str) -> None:
        """The session ended (``why``: the session table's reason): the allowance goes back
        if nothing was revealed and the peer is not to blame (an expiry, our own failure)."""
        if self.grant is not None and self.result is None and (why == "expired"
                                                               or self.our_fault):
            self.grant.give_back("expired" if why == "expired" else "this party's failure")
        self.close()

    def close(self) -> None:
        if self.work is not None:
            self.work.close()
        self.own = None
        self.lists.clear()
        self.draws.clear()
        self.buckets.clear()
        if self.release is not None:
            self.release()
            self.release = None


#: the messages of the set protocols: their handlers touch only their own session's state, so a
#: served party runs them beside its other calls (one per peer at a time; the gRPC server)
SET_KINDS = frozenset({"psu_round1", "psu_chunk", "psu_fetch", "psi_round1", "psi_chunk",
                       "psi_fetch", "set_progress"})

#: SetProgress counts the elements a driver has processed while preparing one list: a few
#: passes over both sets at most (PSI's p_ts: the intersection, the matches, the proof)
_PROGRESS_PASSES = 4

#: the record of a finished set session beside its ``alignments/<session>.parquet``
_SIDECAR = Obj({"format": Str(), "version": Int(), "session": Str(), "method": Str(),
                "group": Str(), "opener": Str(), "known": Bool(), "size": Int(),
                "sizes": MapOf(Int()), "reveal": Opt(Str())})


class SetAlignmentPeer:
    """The passive party's side of PSU and PSI (a mixin: needs ``name``, ``table``, a
    ``sessions`` table and the active ``session`` of :class:`~vflink.parties.base.Party`, and
    optionally ``out_dir``, where results are written as ``alignments/<session>.parquet`` and
    the on-disk buckets of running sessions go, under ``.set-tmp``).

    Optional attributes (for tables larger than memory): ``set_keys``, own keys read in
    batches (e.g. from the table's file) instead of from ``table``; ``set_chunk_rows``, this
    party's own batch size (its ``[compute] chunk_rows``; the messages keep the driver's);
    ``set_out``, a path for each session's output, which is then streamed there instead of
    held (the result has ``path`` set and no rows: it cannot serve :class:`FetchAlignment`
    or training).

    What may arrive when, from whom and of which sizes is declared in
    :data:`vflink.protocol.sessions.PSU` and :data:`~vflink.protocol.sessions.PSI` and checked
    before these handlers run, chunk by chunk; a finished session is immutable (a peer
    cannot rewrite a result). A handler that fails removes the session's files and ends it.

    What a peer can make this party do is bounded per peer (docs/security.md): its set size
    (``policy.min_set_elements`` .. ``max_set_elements``), its sessions and elements in a
    window (``max_set_sessions``, ``max_set_guesses``: :mod:`vflink.parties.setquota`), the
    disk its running sessions spool (``max_spool_bytes``, reserved at round 1), the work of one
    message (``max_message_work_s``: the chunk size announced in round 1), and a session's
    life (``session_ttl_s`` without a message, ``SetProgress`` included; ``max_session_s`` in
    all). Nothing on disk is an unkeyed hash of this party's IDs: every
    spooled list is blinded with the session's secret exponents, which live only in memory,
    and a restarted party sweeps the spools a killed process left (:func:`sweep_stale`).
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

    def concurrent(self, message: Message) -> bool:
        """Set-protocol handlers run beside the serialised ones (see :data:`SET_KINDS`)."""
        return message.kind in SET_KINDS

    def _set_resources(self) -> tuple[SetAllowance, SpoolQuota]:
        """This party's set-session allowance and spool quota, made once: different peers'
        first rounds run concurrently, and two of each would count their sessions and spools
        apart."""
        with _RESOURCES_LOCK:
            res = self.__dict__.get("_set_res")
            if res is None:
                out_dir = getattr(self, "out_dir", None)
                res = (SetAllowance(None if out_dir is None else Path(out_dir)), SpoolQuota())
                self.__dict__["_set_res"] = res
        return res  # type: ignore[no-any-return]

    def _session_dropped(self, session: Session) -> None:
        """A set session left the table: give back its allowance where the peer is not to
        blame (:meth:`_PeerSession.end`), then free what it held."""
        state = session.data.get("set")
        if isinstance(state, _PeerSession):
            state.end(session.ended)
        super()._session_dropped(session)  # type: ignore[misc]

    def _cap(self, what: str, n: int, *, own: int | None = None) -> None:
        """Refuse a peer's list above policy.max_set_elements before any work on it."""
        self.policy.check_set_size(self.name, what, int(n), own=own)

    def _afford(self, group: Group, exponentiations: int, kind: str) -> None:
        """Refuse, before any work, a chunk whose exponentiations cannot finish within the
        caller's deadline even at the group's fastest rate (work the caller would not wait
        for). The work one message may cause is the party's own limit: the chunk size agreed
        in round 1 (:func:`chunk_cap`)."""
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
        """(rows, H(key)) of own records, in batches of exactly ``size`` (the last one the
        rest), in memory only: an unkeyed hash of our IDs is never written to disk.

        Exact sizes matter: PSU's line 12 answers fetch ``i`` with rows ``[i·size, (i+1)·size)``
        from this iterator, while a streamed table's reader may cut its batches shorter (a CSV
        block, a Parquet row group); :class:`KeyBatches` re-cuts them."""
        if self.set_keys is not None:
            yield from _hashed(group, self.set_keys, size)
            return
        table, key = self.table, self.table.schema.key

        def read(rows: int) -> Iterator[Sequence[bytes]]:
            # the key columns only, a batch at a time: a streamed table is never read whole
            start = 0
            for batch in table.batches(key, batch_rows=max(1, rows)):
                yield key_bytes(batch, key, who=table.source, offset=start)
                start += len(batch)

        yield from _hashed(group, KeyBatches(len(table), read), size)

    def _set_state(self) -> _PeerSession:
        state: _PeerSession | None = self.session.data.get("set")
        if state is None:  # pragma: no cover - round 1 creates it, the table orders rounds
            raise ProtocolError(f"party {self.name!r}: session {self.session.name!r} has no "
                                "state")
        if state.failed:
            raise refuse(ProtocolError, f"party {self.name!r}: session "
                                        f"{self.session.name!r} failed earlier; a new run "
                                        "opens a new session", code="session.failed")
        return state

    def _finished(self, session: str, peer: str | None = None) -> SetAlignment | None:
        for protocol in (PSU_PROTOCOL.name, PSI_PROTOCOL.name):
            s = self.sessions.get(protocol, session, peer)
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

    # --- finished results: on disk, owned by their peer, reloadable -------------------------

    def _result_dir(self) -> Path | None:
        out_dir = getattr(self, "out_dir", None)
        return None if out_dir is None else Path(out_dir) / "alignments"

    def _refuse_finished_name(self, session: str) -> None:
        """A session name is used once, also across restarts of this party: nothing finished
        is rewritten, and no peer opens a session under a finished one's name (after a
        restart, before its owner reloads it, that session would shadow the owner's)."""
        folder = self._result_dir()
        if folder is None:
            return
        if any((folder / f"{session}{ext}").exists() or (folder / f"{session}{ext}").is_symlink()
               for ext in (".json", ".parquet")):
            raise refuse(ProtocolError, f"party {self.name!r}: session {session!r} finished "
                                        "before; a new run opens a new session",
                         code="session.finished")

    def _finish(self, session: str, result: SetAlignment) -> None:
        result = dataclasses.replace(result, session=session)
        state = self._set_state()
        folder = self._result_dir()
        if folder is not None and result.known and result.path is None:
            self._refuse_finished_name(session)  # again: a run racing another of one name
            path = folder / f"{session}.parquet"
            write_set_alignment(result, path)
            if result.union is not None:  # union training needs U itself
                atomic_write_bytes(folder / f"{session}.union", result.union.tobytes())
            s = self.session
            atomic_write_json(folder / f"{session}.json", {
                "format": "vflink-set-alignment", "version": 1, "session": session,
                "method": result.method, "group": result.group, "opener": s.opener,
                "known": result.known, "size": int(result.size),
                "sizes": {k: int(v) for k, v in result.sizes.items()},
                "reveal": s.commits.get("reveal")})
        state.result = result
        state.close()
        log.info("%s: %s session %r finished (%s)", self.name, result.method, session,
                 result.sizes)

    def _restore_session(self, protocol: ProtocolSpec, name: str, peer: str | None = None
                         ) -> Session | None:
        """A finished session of ours kept on disk (``alignments/<name>.json`` beside its
        result), back as a finished session of the peer that ran it: a result evicted from
        memory, or from before a restart, is served again (and its name stays used). With
        ``peer``, only a session that peer ran is loaded: no other peer can make this party
        read results back (or push the owner's others out of memory)."""
        folder = self._result_dir()
        if folder is None or protocol.space != PSU_PROTOCOL.space or \
                not (folder / f"{name}.json").is_file():
            return None
        try:
            doc = read_typed_json(folder, f"{name}.json", _SIDECAR)
            if doc["session"] != name or doc["method"] not in (PSU_PROTOCOL.name,
                                                               PSI_PROTOCOL.name):
                raise DataError(f"{folder / (name + '.json')}: it describes another session")
            if peer is not None and doc["opener"] != peer:
                return None
            result = _read_result(folder, name, doc)
        except VflinkError as exc:
            log.warning("%s: finished session %r cannot be reloaded: %s", self.name, name, exc)
            return None
        spec = PSU_PROTOCOL if doc["method"] == PSU_PROTOCOL.name else PSI_PROTOCOL
        now = time.monotonic()
        s = Session(spec, name, doc["opener"], spec.final[0], now, now)
        if doc["reveal"] is not None:
            s.commits["reveal"] = doc["reveal"]
        s.data["set"] = _PeerSession(group=get_group(doc["group"], workers=1), work=None,
                                     n_own=len(result.rows), chunk=1, local=1, result=result)
        log.info("%s: reloaded finished %s session %r of %r from %s", self.name,
                 doc["method"], name, doc["opener"], folder)
        return s

    # --- opening a session ------------------------------------------------------------------

    def _open(self, sender: str, group_name: str, n_a: int, chunk_rows: int, kind: str,
              method: str) -> _PeerSession:
        self._refuse_finished_name(self.session.name)
        self.policy.check_peer_set_size(self.name, f"{kind}: n_a", n_a)
        # one chunk's work and size: ≤ MAX_CHUNK_ROWS elements, and never more than the list
        # (whose total policy.max_set_elements caps)
        if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or \
                not 1 <= chunk_rows <= MAX_CHUNK_ROWS:
            raise refuse(PolicyViolation, f"party {self.name!r}: chunk_rows must be in [1, "
                                          f"{MAX_CHUNK_ROWS}], got {chunk_rows}",
                         code="limit.chunk")
        group = get_group(group_name, compute=self.compute)
        n_own = len(self.set_keys) if self.set_keys is not None else len(self.table)
        own_work = 2 * n_own if method == "psu" else n_own
        self._afford(group, own_work, kind)  # our own set, once
        chunk = min(chunk_rows, chunk_cap(group, self.policy.max_message_work_s))
        allowance, quota = self._set_resources()
        release = quota.reserve(self.name, sender,
                                spool_bytes(method, group.element_bytes, n_a, n_own),
                                self.policy.max_spool_bytes)
        grant = None
        try:
            grant = allowance.admit(self.name, sender, self.policy, kind,
                                    session=self.session.name, elements=n_a)
            out_dir = getattr(self, "out_dir", None)
            work = Workdir(None if out_dir is None else Path(out_dir) / SPOOL_DIR)
        except BaseException as exc:
            release()
            if grant is not None and not isinstance(exc, VflinkError):
                grant.give_back("this party's failure")  # our disk, not the peer's doing
            raise
        local = max(1, min(int(self.set_chunk_rows or chunk), MAX_CHUNK_ROWS))
        self.session.commit("chunk", chunk)  # what the session table bounds chunks with
        return _PeerSession(group=group, work=work, n_own=n_own, chunk=chunk, local=local,
                            release=release, grant=grant)

    def _opened(self, s: _PeerSession) -> Ack:
        """Round 1's answer: our set size, the chunk size we accept, the idle time after
        which the session expires (a driver keeps it alive meanwhile, :class:`SetProgress`)
        and the dictionary limit of our policy (the figure the primary's ledger states)."""
        return Ack(info={"n_p": float(s.n_own), "chunk_rows": float(s.chunk),
                         "idle_s": float(self.policy.session_ttl_s),
                         "guess_limit": float(self.policy.dictionary_limit),
                         "guess_window_s": float(self.policy.set_session_window_s)})

    def _new_path(self, s: _PeerSession, name: str) -> Path:
        if s.work is None:  # pragma: no cover - a reloaded session takes no more messages
            raise ProtocolError(f"party {self.name!r}: session {self.session.name!r} is over")
        return s.work.new(name)

    def _draw(self, s: _PeerSession, name: str, expected: int) -> Buckets:
        if name not in s.draws:
            s.draws[name] = Buckets(self._new_path(s, name + "-draw"), s.group.element_bytes,
                                    bits=bucket_bits(expected, s.local), random=True)
        return s.draws[name]

    def _bucketed(self, s: _PeerSession, name: str, expected: int) -> Buckets:
        if name not in s.buckets:
            s.buckets[name] = Buckets(self._new_path(s, name), s.group.element_bytes,
                                      bits=bucket_bits(expected, s.local))
        return s.buckets[name]

    def _spool(self, s: _PeerSession, name: str, *, rows: bool = False) -> Spool:
        if name not in s.lists:
            s.lists[name] = Spool(self._new_path(s, name), s.group.element_bytes, rows=rows)
        return s.lists[name]

    def _shuffled_draw(self, s: _PeerSession, name: str, *, rows: bool = False) -> None:
        """The list drawn into random buckets as ``name``, shuffled into its spool."""
        s.lists[name] = shuffle(s.draws.pop(name), Spool(self._new_path(s, name),
                                                         s.group.element_bytes, rows=rows))

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
        """Run a set handler; on failure the session's files are removed and it ends (its
        allowance given back if the failure is this party's own and nothing was revealed)."""
        try:
            return handler()
        except BaseException as exc:
            state: _PeerSession | None = self.session.data.get("set")
            if state is not None and state.result is None:
                state.our_fault = not isinstance(exc, VflinkError)
                state.end("failed")
            raise

    def on_set_progress(self, sender: str, message: SetProgress) -> Ack:
        """The driver is still computing or working on one of the protocol's lists (the
        session table checked the list's name and took the message as a sign of life); here
        what it says it has done of that list must grow, within a few passes over both sets,
        so the keepalives are bounded in number, as ``policy.max_session_s`` bounds the
        session's life."""
        s = self._set_state()
        session = self.session
        bound = _PROGRESS_PASSES * (int(session.commits.get("n_a", 0)) + s.n_own)
        done = message.done
        last = s.progress.get(message.stream, 0)
        if isinstance(done, bool) or not isinstance(done, int) or not last < done <= bound:
            raise refuse(ProtocolError, f"party {self.name!r}: SetProgress of "
                                        f"{message.stream!r} must say more done than before "
                                        f"({last}) and at most {bound}", code="session.progress")
        s.progress[message.stream] = done
        return Ack()

    # --- PSU (passive side of Algorithm 1) ------------------------------------------------

    def on_psu_round1(self, sender: str, message: PsuRound1) -> Ack:
        s = self._open(sender, message.group, message.n_a, message.chunk_rows, "PsuRound1",
                       "psu")
        self.session.data["set"] = s

        def run() -> Ack:
            g = s.group
            e = s.psu_e = psu.PsuExponents.draw(g)  # line 2
            # line 5's I_p^{t1}, shuffled; our records' hashes are not kept (line 12 hashes
            # them again, chunk by chunk), so nothing unblinded is ever spooled
            draw = self._draw(s, "p_t1", s.n_own)
            for _, h in self._own_hashed(g, s.local):
                draw.add(g.power(h, e.first))
            self._shuffled_draw(s, "p_t1")
            self.session.commit("n_p", s.n_own)  # later lists are bound to both set sizes
            return self._opened(s)
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
        if stream in ("a_s1", "union_s123t1", "p_s123t2"):
            self._afford(g, n, f"PsuChunk {stream}")
        lo, closed = self._received(s, message)
        if stream == "a_s1":  # line 4: I_a^{s1 t1}, shuffled; kept in P_a's order for line 11
            a1 = g.power(message.elements, e.first, check="I_a^s1")
            self._draw(s, "a_s1t1", message.total).add(a1)
            self._spool(s, "a_s1t1-ordered").append(a1)
            if closed:
                self._shuffled_draw(s, "a_s1t1")
        elif stream == "p_s1t1":  # line 6: checked, though P_p needs no more of it
            g.validate(message.elements, "I_p^{s1 t1}")
        elif stream == "union_s123t1":  # line 9, and line 10 on our side
            final = psu.line9(g, message.elements, e)
            self._draw(s, "union", message.total).add(final)
            self._bucketed(s, "U", message.total).add(final)
            if closed:
                self._shuffled_draw(s, "union")
        elif stream == "p_s123t2":  # line 12: our records located in U
            z = g.power(message.elements, g.combine(e.first, e.third), check="x^{s1 s2 s3 t2}")
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
                order = RowOrder(self._new_path(s, "rows"), g.element_bytes, s.n_own, s.local)
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
        if message.stream == "a_s1t123":  # line 11: the round-1 list, in P_a's order
            lo = message.index * s.chunk
            kept = s.lists["a_s1t1-ordered"]
            self._afford(g, min(s.chunk, len(kept) - lo), "PsuFetch a_s1t123")
            x, _ = kept.read(lo, lo + s.chunk)
            return SetChunk(stream="a_s1t123", index=message.index,
                            elements=psu.line11_peer(g, x, e))
        if message.stream == "p_t2":  # line 12: x^{t2} for our records, in record order
            lo = message.index * s.chunk
            self._afford(g, min(s.chunk, s.n_own - lo), "PsuFetch p_t2")
            if s.own is None:  # chunks are fetched in order, each once (the session table)
                s.own = self._own_hashed(g, s.chunk)
            _, h = next(s.own, (None, g.empty()))
            if len(h) != min(s.chunk, s.n_own - lo):  # pragma: no cover - our own records
                raise ProtocolError(f"party {self.name!r}: our records changed during PSU")
            return SetChunk(stream="p_t2", index=message.index,
                            elements=psu.blind_own(g, h, e))
        if message.stream == "p_t1" and s.grant is not None:
            # our blinded set leaves (with a_s1t1, the primary counts the intersection):
            # from here on the session has used its allowance whatever happens
            s.grant.reveal()
        return self._serve(s, message)

    # --- PSI (passive side) -----------------------------------------------------------------

    def on_psi_round1(self, sender: str, message: PsiRound1) -> Ack:
        how = psi.check_reveal(message.reveal)
        s = self._open(sender, message.group, message.n_a, message.chunk_rows, "PsiRound1",
                       "psi")
        s.reveal = how
        self.session.data["set"] = s

        def run() -> Ack:
            g = s.group
            raw = message.commitment
            committed = np.frombuffer(raw, dtype=np.uint8).reshape(1, -1) \
                if isinstance(raw, bytes) and len(raw) == g.element_bytes else None
            if committed is None:
                raise refuse(ProtocolError, f"party {self.name!r}: PsiRound1 must commit to "
                                            f"its exponent as one {g.name} element "
                                            f"({g.element_bytes} bytes)",
                             code="proof.commitment")
            s.commitment = g.validate(committed.copy(), "the exponent's commitment")
            s.psi_e = g.random_exponent()
            draw = self._draw(s, "p_t", s.n_own)  # H(y)^b, secret order, rows kept
            for r, h in self._own_hashed(g, s.local):
                draw.add(g.power(h, s.psi_e), r)
            self._shuffled_draw(s, "p_t", rows=True)
            self.session.commit("n_p", s.n_own)
            return self._opened(s)
        return self._guarded(run)  # type: ignore[return-value]

    def on_psi_chunk(self, sender: str, message: PsiChunk) -> Ack:
        s = self._set_state()
        return self._guarded(lambda: self._psi_chunk(s, message))  # type: ignore[return-value]

    def _psi_chunk(self, s: _PeerSession, message: PsiChunk) -> Ack:
        g, b = s.group, s.psi_e
        if b is None:  # pragma: no cover - the declaration orders the rounds
            raise ProtocolError(f"party {self.name!r}: session {message.session!r} is not PSI")
        lo, closed = self._received(s, message)
        if message.proof and not (closed and message.stream == "p_ts"):
            raise refuse(ProtocolError, f"party {self.name!r}: a proof travels with the last "
                                        "chunk of p_ts only", code="proof.misplaced")
        if message.stream == "a_s":
            self._afford(g, len(message.elements), "PsiChunk a_s")
            a_st = g.power(message.elements, b, check="blinded elements")
            if s.reveal in ("both", "primary"):  # in the order received
                self._spool(s, "a_st").append(a_st)
            else:  # shuffled: the primary learns only the size
                self._draw(s, "a_st", message.total).add(a_st)
            if closed and "a_st" not in s.lists:
                self._shuffled_draw(s, "a_st")
        elif message.stream == "p_ts":
            p_ts = g.validate(message.elements, "H(y)^ba")
            self._spool(s, "p_ts").append(p_ts)  # in p_t's order, for the proof
            expected = len(s.lists["a_st"]) + s.n_own
            self._bucketed(s, "mine", expected).add(
                p_ts, np.arange(lo, lo + len(p_ts), dtype=np.int64))
            if closed:
                self._psi_close(s, message)
        return Ack()

    def _psi_close(self, s: _PeerSession, message: PsiChunk) -> None:
        """All of p_ts is here: the rows whose element is in the intersection, accepted only
        if the proof shows the primary raised exactly those with its committed exponent."""
        g = s.group
        theirs = self._bucketed(s, "theirs", len(s.lists["a_st"]) + s.n_own)
        for el, _ in s.lists["a_st"].chunks(s.local):
            theirs.add(el)
        matched = _matched_positions(theirs, s.buckets["mine"], s.n_own)
        p_t, p_ts = s.lists["p_t"], s.lists["p_ts"]
        if s.commitment is None or not proofs.verify_batches(
                g, s.commitment, _gathered(p_t, p_ts, matched, s.local), message.proof,
                ctx=proofs.context(message.session, "p_ts", -1)):
            raise refuse(ProtocolError,
                         f"party {self.name!r}: PSI session {message.session!r}: the proof that "
                         "p_ts is our list raised to the exponent committed in round 1 does not "
                         "verify; no row is accepted", code="proof.invalid")
        size = len(matched)
        sizes = {"secondary": s.n_own, "intersection": size}
        out = self._streamed_to(message.session)
        if out is not None:
            order = RowOrder(self._new_path(s, "rows"), g.element_bytes, s.n_own, s.local)
            for rows, uids in _gathered_rows(p_t, p_ts, matched, s.local):
                order.add(rows, uids)
            write_alignment_rows(out, order)
            self._finish(message.session, SetAlignment(
                method="psi", group=g.name, rows=np.empty(0, dtype=np.int64),
                uids=g.empty(), size=size, sizes=sizes, path=out))
            return
        parts = list(_gathered_rows(p_t, p_ts, matched, s.local))
        rows = np.concatenate([r for r, _ in parts]) if parts else np.empty(0, dtype=np.int64)
        uids = np.concatenate([u for _, u in parts]) if parts else g.empty()
        by_row = np.argsort(rows, kind="stable")
        self._finish(message.session, SetAlignment(
            method="psi", group=g.name, rows=rows[by_row].astype(np.int64),
            uids=np.ascontiguousarray(uids[by_row]), size=size, sizes=sizes))

    def on_psi_fetch(self, sender: str, message: PsiFetch) -> SetChunk:
        s = self._set_state()

        def run() -> SetChunk:
            if message.stream == "p_t" and s.grant is not None:
                s.grant.reveal()  # our blinded set leaves: the intersection can be counted
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


def _gathered_rows(p_t: Spool, p_ts: Spool, positions: npt.NDArray[np.int64], chunk: int
                   ) -> Iterator[tuple[npt.NDArray[np.int64], Elements]]:
    """(record rows, UIDs) of the matched positions: p_t's spool holds each position's row."""
    for lo, hi, sel in _windows(len(p_t), positions, chunk):
        _, rows = p_t.read(lo, hi)
        uids, _ = p_ts.read(lo, hi)
        if rows is None:  # pragma: no cover - p_t is spooled with rows
            raise ProtocolError("p_t lost its rows")
        yield rows[sel], uids[sel]


def _read_result(folder: Path, name: str, doc: dict[str, Any]) -> SetAlignment:
    """A finished session's result from its files (every value checked before use)."""
    import pyarrow.parquet as pq

    group = get_group(doc["group"], workers=1)
    known = bool(doc["known"])
    rows = np.empty(0, dtype=np.int64)
    uids = group.empty()
    source = folder / f"{name}.parquet"
    if known:
        try:
            table = pq.read_table(open_data_bytes(folder, f"{name}.parquet"))
        except VflinkError:
            raise
        except Exception as exc:  # pyarrow's own errors: the file is not ours
            raise DataError(f"{source}: not a readable Parquet file ({exc})") from None
        if table.column_names != ["row", "uid"] or str(table.schema.field("row").type) != \
                "int64" or str(table.schema.field("uid").type) != "string":
            raise DataError(f"{source}: expected columns row (int64) and uid (string), got "
                            f"{table.schema}")
        rows = table.column("row").to_numpy().astype(np.int64)
        try:
            raw = b"".join(bytes.fromhex(h) for h in table.column("uid").to_pylist())
        except (TypeError, ValueError):
            raise DataError(f"{source}: key 'uid': expected hex text") from None
        if len(raw) != len(rows) * group.element_bytes:
            raise DataError(f"{source}: key 'uid': expected {group.element_bytes}-byte UIDs")
        uids = np.frombuffer(raw, dtype=np.uint8).reshape(len(rows), -1).copy()
    union = uid_index = None
    if doc["method"] == "psu" and (folder / f"{name}.union").is_file():
        raw = read_data_file(folder, f"{name}.union")
        if len(raw) % group.element_bytes:
            raise DataError(f"{folder / (name + '.union')}: not a list of "
                            f"{group.element_bytes}-byte elements")
        union = np.frombuffer(raw, dtype=np.uint8).reshape(-1, group.element_bytes).copy()
        uid_index = lookup(union, uids, "own UIDs in U")
    return SetAlignment(method=doc["method"], group=group.name, rows=rows, uids=uids,
                        size=int(doc["size"]), union=union, uid_index=uid_index, known=known,
                        sizes=dict(doc["sizes"]), session=name)


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
