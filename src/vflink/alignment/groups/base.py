"""The prime-order group interface the DH protocols (PSU, ECDH PSI) are written against.

Elements travel as fixed-width byte strings, held as ``(n, element_bytes)`` uint8 arrays so a
list of them is one array on the wire. Exponents are Python ints in ``[1, order)``, drawn from the
operating system's secure source (:mod:`secrets`). All group arithmetic is delegated to a
library (libsodium through rbcl, GMP through gmpy2); nothing here does curve or modular
arithmetic beyond multiplying exponents modulo the group order.
"""

from __future__ import annotations

import hashlib
import os
import weakref
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, Literal, TypeVar

import numpy as np
import numpy.typing as npt

from vflink._cancel import checkpoint
from vflink.errors import ProtocolError
from vflink.randomness import secret_below, secret_bytes
from vflink.types import Compute

__all__ = ["Elements", "Group", "default_workers", "hash_input", "scalar_width"]

R = TypeVar("R")

#: A list of group elements, one encoded element per row.
Elements = npt.NDArray[np.uint8]

#: Domain separation: a key hashed for vflink's DH protocols never collides with another use.
_DOMAIN = b"vflink/dh-set-protocols/v1\x00"


def default_workers() -> int:
    """Worker count for large batches: every core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def hash_input(key: bytes, group: str) -> bytes:
    """SHA-512 of a record key under vflink's and the group's domain tags (64 bytes)."""
    return hashlib.sha512(_DOMAIN + group.encode() + b"\x00" + key).digest()


def _power_task(shared: tuple[type[Group], int, bool], chunk: Elements) -> Elements | None:
    """One task: a piece of elements raised to the exponent; with ``checked`` (a peer's
    elements) None if a row is not a group element (module-level: pickled for a process pool
    or an engine)."""
    cls, exponent, checked = shared
    g = cls(workers=1)
    return g._power_checked_chunk(chunk, exponent) if checked else g._power_chunk(chunk, exponent)


def _hash_task(shared: type[Group], keys: Sequence[bytes]) -> Elements:
    """One task: a piece of keys hashed to the group."""
    return shared(workers=1)._hash_chunk(keys)


def _valid_task(shared: type[Group], chunk: Elements) -> bool:
    return shared(workers=1)._valid_chunk(chunk)


def _combination_task(shared: type[Group], piece: tuple[Elements, list[int]]) -> bytes:
    """One task: ``prod_i x_i^{c_i}`` over a piece of a combination (module-level: pickled)."""
    elements, scalars = piece
    return shared(workers=1)._combination_chunk(elements, scalars)


def scalar_width(order: int) -> int:
    """Bytes of a scalar modulo ``order`` (a proof's fixed-width encoding)."""
    return (order.bit_length() + 7) // 8


#: pieces of a large batch per worker: short pieces keep every worker busy until the batch's
#: end (a worker left idle while the last piece runs costs up to one piece per call, and a
#: protocol run makes hundreds of calls), long ones amortise a task's fixed cost
PIECES_PER_WORKER = 16

#: ``"here"`` (the calling thread), ``"pool"`` (this object's workers) or ``"engine"``
Where = Literal["here", "pool", "engine"]


class Group(ABC):
    """A cyclic group of prime order in which DDH is believed hard.

    Args:
        workers: threads (or processes, where the library holds the GIL) used for batches of at
            least ``parallel_threshold`` elements; ``None`` means every available core.
        compute: a compute engine (:mod:`vflink.engine`): batches of at least
            ``parallel_threshold`` elements are hashed, validated and exponentiated in
            buckets of at most its ``chunk_rows`` as its tasks, instead of in this object's
            pool. The exponent travels to the party's own cluster only (a party's engine is
            inside the party).

    Every large batch (hashing, validation, exponentiation) is cut into pieces that run on
    every worker; the calling thread only hands them out and collects them in order, so a
    batch costs its operations divided by the workers (the crypto bound of
    :mod:`vflink.alignment.cost`).
    """

    name: str = "group"
    element_bytes: int = 0
    order: int = 0
    #: batches smaller than this run in the calling thread (pool overhead would dominate)
    parallel_threshold: int = 4096
    #: exponentiations per chunk: about 0.04 s of work, so a call whose caller gave up stops
    #: within a fraction of a second (:func:`vflink._cancel.checkpoint` between chunks)
    chunk_rows: int = 1024
    #: hashes or validity checks between two checkpoints (each costs ~4-40 µs)
    check_rows: int = 4096
    #: a conservative *lower* bound on the seconds one exponentiation takes on one core (a
    #: fast machine): a request whose elements need more than its caller's deadline even at
    #: this rate can be refused before any work (vflink.parties.setalign)
    min_power_s: float = 20e-6

    def __init__(self, *, workers: int | None = None, compute: Compute | None = None) -> None:
        self.workers = default_workers() if workers is None else max(1, int(workers))
        self.compute = compute
        self.operations = 0  # exponentiations and hashes done, for benchmarks and summaries
        #: operations done by kind (the kinds of :class:`vflink.alignment.cost.OpCounts`)
        self.counts: dict[str, int] = dict.fromkeys(
            ("hash", "power", "power_checked", "validate", "combine"), 0)
        self._pool: Executor | None = None
        self._finalizer: weakref.finalize | None = None

    # --- what each implementation provides --------------------------------------------

    @abstractmethod
    def _hash_one(self, digest: bytes) -> bytes:
        """Map a 64-byte uniform digest to an encoded element."""

    @abstractmethod
    def _power_chunk(self, elements: Elements, exponent: int) -> Elements:
        """``x^e`` for every row of ``elements`` (run in a worker)."""

    @abstractmethod
    def _valid_chunk(self, elements: Elements) -> bool:
        """Do all rows encode elements of the group (and not the identity)?"""

    def _power_checked_chunk(self, elements: Elements, exponent: int) -> Elements | None:
        """``x^e`` for every row of a peer's ``elements``, or None if a row is not a group
        element or is the identity (see :meth:`validate`). A group whose exponentiation
        already refuses such rows overrides this to skip the separate check."""
        return self._power_chunk(elements, exponent) if self._valid_chunk(elements) else None

    def _hash_chunk(self, keys: Sequence[bytes]) -> Elements:
        """Each key hashed to the group, in the calling thread."""
        raw = b"".join(self._hash_one(hash_input(key, self.name)) for key in keys)
        return np.frombuffer(raw, dtype=np.uint8).reshape(len(keys), self.element_bytes).copy()

    @abstractmethod
    def _generator(self) -> bytes:
        """The encoding of the group's fixed generator (a proof's base, never secret)."""

    @abstractmethod
    def _identity(self) -> bytes:
        """The encoding of the identity (the neutral element of :meth:`combine_elements`)."""

    @abstractmethod
    def _operate(self, a: bytes, b: bytes) -> bytes:
        """The group operation on two encoded elements (``a·b``; ``a + b`` on a curve)."""

    @abstractmethod
    def _combination_chunk(self, elements: Elements, scalars: Sequence[int]) -> bytes:
        """``prod_i x_i^{c_i}`` over the rows of ``elements`` (scalars in ``[0, order)``; run
        in a worker)."""

    def _new_executor(self) -> Executor:
        return ThreadPoolExecutor(self.workers)

    def _executor(self) -> Executor:
        """One pool per group object, kept for its lifetime (a process pool is slow to start)."""
        if self._pool is None:
            self._pool = self._new_executor()
            self._finalizer = weakref.finalize(self, self._pool.shutdown, wait=False)
        return self._pool

    def close(self) -> None:
        """Shut the worker pool down now (it is also shut down when the group is collected)."""
        if self._finalizer is not None:
            self._finalizer()
        self._pool = self._finalizer = None

    # --- where a batch runs -------------------------------------------------------------

    def _where(self, n: int) -> Where:
        if n < self.parallel_threshold:
            return "here"
        if self.compute is not None:
            return "engine"
        return "pool" if self.workers > 1 else "here"

    def _ranges(self, n: int, unit: int, where: Where) -> list[tuple[int, int]]:
        """``[lo, hi)`` pieces of a batch of ``n``: about :data:`PIECES_PER_WORKER` per worker,
        at least ``unit`` rows (a piece's fixed cost), at most the engine's ``chunk_rows``
        (a task's memory) or, in this process, ``4 * unit`` (the checks between pieces stay
        a fraction of a second apart)."""
        if where == "here":
            size = unit
        else:
            c = self.compute
            workers = c.workers if where == "engine" and c is not None else self.workers
            size = max(unit, -(-n // (PIECES_PER_WORKER * max(1, workers))))
            size = min(size, c.chunk_rows if where == "engine" and c is not None else 4 * unit)
        size = max(1, size)
        return [(i, min(n, i + size)) for i in range(0, n, size)]

    def _map(self, task: Callable[[Any, Any], R], shared: Any, items: Sequence[Any],
             where: Where, *, check: Callable[[R], None] | None = None,
             progress: Callable[[int], None] | None = None) -> list[R]:
        """``[task(shared, item) for item in items]`` in the calling thread, this object's
        pool or the engine. ``check(result)`` may raise to refuse a result (the pieces not
        started are then dropped); ``progress(i)`` after piece ``i`` is done, in order. A
        checkpoint comes between pieces, so a caller that gave up stops within a piece."""
        out: list[R] = []
        if where == "engine" and self.compute is not None:
            checkpoint()
            count = iter(range(len(items)))
            step = None if progress is None else (lambda _: progress(next(count)))
            out = self.compute.map(task, items, shared=shared, progress=step)
            if check is not None:
                for r in out:
                    check(r)
            return out

        def collected(result: R) -> None:
            if check is not None:
                check(result)
            out.append(result)
            if progress is not None:
                progress(len(out) - 1)

        if where == "here" or len(items) <= 1:
            for item in items:
                checkpoint()
                collected(task(shared, item))
            return out
        pool = self._executor()
        pending: deque[Future[R]] = deque()
        try:
            # a bounded window of pieces in flight: a cancelled call leaves at most this many
            # behind, and a process pool pickles no more than it needs
            for item in items:
                checkpoint()
                pending.append(pool.submit(task, shared, item))
                if len(pending) >= 2 * self.workers:
                    collected(pending.popleft().result())
            while pending:
                checkpoint()
                collected(pending.popleft().result())
        finally:
            for future in pending:
                future.cancel()
        return out

    # --- public surface ---------------------------------------------------------------

    def min_seconds(self, exponentiations: int) -> float:
        """A lower bound on the wall time of ``exponentiations`` with every worker busy."""
        return exponentiations * self.min_power_s / self.workers

    def random_exponent(self) -> int:
        """A secret exponent, uniform in ``[1, order)``, from the OS CSPRNG
        (:func:`vflink.randomness.secret_below`: :func:`secrets.randbelow`; never
        reproducible, whatever the run's noise switch)."""
        return 1 + secret_below(self.order - 1)

    def combine(self, *exponents: int) -> int:
        """The product of exponents modulo the group order (``x^a^b = x^(a·b)``)."""
        out = 1
        for e in exponents:
            out = out * e % self.order
        return out

    def empty(self) -> Elements:
        return np.empty((0, self.element_bytes), dtype=np.uint8)

    @property
    def scalar_bytes(self) -> int:
        """Bytes of a scalar modulo the group order, as proofs encode it."""
        return scalar_width(self.order)

    def generator(self) -> Elements:
        """The group's fixed generator, as a one-row list."""
        return np.frombuffer(self._generator(), dtype=np.uint8).reshape(1, -1).copy()

    def identity(self) -> Elements:
        """The identity element, as a one-row list (never a valid element of a peer's list)."""
        return np.frombuffer(self._identity(), dtype=np.uint8).reshape(1, -1).copy()

    def operate(self, a: Elements, b: Elements) -> Elements:
        """The group operation on two one-row lists (libsodium's point addition for
        ristretto255, a product modulo p for modp2048)."""
        a, b = self.check(a, "operand"), self.check(b, "operand")
        if len(a) != 1 or len(b) != 1:
            raise ValueError("operate() takes one element on each side")
        out = self._operate(a[0].tobytes(), b[0].tobytes())
        return np.frombuffer(out, dtype=np.uint8).reshape(1, -1).copy()

    def combine_elements(self, elements: Elements, scalars: Sequence[int]) -> Elements:
        """``prod_i x_i^{c_i}`` (a multi-exponentiation: ``sum c_i·x_i`` on a curve), as a
        one-row list, with every worker on large batches.

        The batched proofs of :mod:`vflink.alignment.proofs` combine a whole chunk this way;
        the group library does every multiplication and addition (libsodium has no
        multi-scalar multiplication, so this is one scalar multiplication per row).
        """
        elements = self.check(elements, "elements")
        if len(elements) != len(scalars):
            raise ValueError(f"{len(elements)} elements but {len(scalars)} scalars")
        cs = [int(c) % self.order for c in scalars]
        n = len(cs)
        where = self._where(n)
        ranges = self._ranges(n, self.chunk_rows, where)
        parts = self._map(_combination_task, type(self),
                          [(elements[lo:hi], cs[lo:hi]) for lo, hi in ranges], where)
        acc = self._identity()
        for part in parts:
            acc = self._operate(acc, part)
        self.operations += n
        self.counts["combine"] += n
        return np.frombuffer(acc, dtype=np.uint8).reshape(1, -1).copy()

    def hash_to_group(self, keys: Sequence[bytes]) -> Elements:
        """Each key hashed to a group element (random-oracle encoding of the record IDs)."""
        n = len(keys)
        where = self._where(n)
        ranges = self._ranges(n, self.check_rows, where)
        parts = self._map(_hash_task, type(self), [list(keys[a:b]) for a, b in ranges], where)
        self.operations += n
        self.counts["hash"] += n
        return np.concatenate(parts) if parts else self.empty()

    def power(self, elements: Elements, exponent: int,
              progress: Callable[[int], None] | None = None, *, check: str | None = None
              ) -> Elements:
        """``x^exponent`` for every element, in order; batches use every worker.

        With ``check`` (what the elements are, for the error), the elements are a peer's: each
        is validated as in :meth:`validate`, in the same pass as its exponentiation, and a
        ProtocolError is raised if any is not a group element or is the identity. Nothing is
        returned then, so no power of an invalid element ever leaves this call.
        """
        elements = self.check(elements, check or "elements")
        n = len(elements)
        e = int(exponent) % self.order
        if e == 0:
            raise ValueError("the exponent must be non-zero modulo the group order")
        if n == 0:
            return self.empty()
        where = self._where(n)
        ranges = self._ranges(n, self.chunk_rows, where)

        def valid(part: Elements | None) -> None:
            if part is None:
                raise ProtocolError(f"{check}: not every row encodes a {self.name} group "
                                    "element")

        step = None if progress is None else (lambda i: progress(ranges[i][1] - ranges[i][0]))
        parts = self._map(_power_task, (type(self), e, check is not None),
                          [elements[lo:hi] for lo, hi in ranges], where, check=valid,
                          progress=step)
        done = [p for p in parts if p is not None]  # all of them: ``valid`` refused None
        out = np.concatenate(done) if len(done) > 1 else done[0]
        self.operations += n
        self.counts["power_checked" if check is not None else "power"] += n
        return out

    def check(self, elements: object, what: str) -> Elements:
        """``elements`` as an ``(n, element_bytes)`` uint8 array, or ProtocolError."""
        arr = np.asarray(elements)
        if arr.dtype != np.uint8 or arr.ndim != 2 or arr.shape[1] != self.element_bytes:
            raise ProtocolError(f"{what}: expected an (n, {self.element_bytes}) uint8 array of "
                                f"{self.name} elements, got {arr.dtype} {arr.shape}")
        return np.ascontiguousarray(arr)

    def validate(self, elements: object, what: str) -> Elements:
        """Like :meth:`check`, and every row must encode a non-identity group element.

        A peer's elements are validated before they are exponentiated: an element outside the
        prime-order group (or the identity) could leak bits of the secret exponent. Elements
        that are exponentiated at once are validated by :meth:`power` with ``check`` instead.
        """
        arr = self.check(elements, what)
        where = self._where(len(arr))
        ranges = self._ranges(len(arr), self.check_rows, where)

        def valid(ok: bool) -> None:
            if not ok:
                raise ProtocolError(f"{what}: not every row encodes a {self.name} group "
                                    "element")

        self._map(_valid_task, type(self), [arr[lo:hi] for lo, hi in ranges], where,
                  check=valid)
        self.counts["validate"] += len(arr)
        return arr

    def random_elements(self, n: int) -> Elements:
        """``n`` uniformly random elements (the simulators of FLORIST App. A draw these)."""
        return self.hash_to_group([secret_bytes(32) for _ in range(n)])
