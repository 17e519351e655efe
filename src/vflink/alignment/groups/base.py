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
import secrets
import weakref
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor

import numpy as np
import numpy.typing as npt

from vflink._cancel import checkpoint
from vflink.errors import ProtocolError
from vflink.types import Compute

__all__ = ["Elements", "Group", "default_workers", "hash_input", "scalar_width"]

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


def _power_task(shared: tuple[type[Group], int], chunk: Elements) -> Elements:
    """One engine task: a bucket of elements raised to the exponent (module-level: pickled)."""
    cls, exponent = shared
    return cls(workers=1)._power_chunk(chunk, exponent)


def _hash_task(shared: type[Group], keys: list[bytes]) -> Elements:
    """One engine task: a bucket of keys hashed to the group."""
    return shared(workers=1).hash_to_group(keys)


def _valid_task(shared: type[Group], chunk: Elements) -> bool:
    return shared(workers=1)._valid_chunk(chunk)


def scalar_width(order: int) -> int:
    """Bytes of a scalar modulo ``order`` (a proof's fixed-width encoding)."""
    return (order.bit_length() + 7) // 8


class Group(ABC):
    """A cyclic group of prime order in which DDH is believed hard.

    Args:
        workers: threads (or processes, where the library holds the GIL) used for batches of at
            least ``parallel_threshold`` elements; ``None`` means every available core.
        compute: a compute engine (issue 22): batches of at least ``parallel_threshold``
            elements are hashed, validated and exponentiated in buckets of at most its
            ``chunk_rows`` as its tasks, instead of in this object's pool. The exponent
            travels to the party's own cluster only (a party's engine is inside the party).
    """

    name: str = "group"
    element_bytes: int = 0
    order: int = 0
    #: batches smaller than this run in the calling thread (pool overhead would dominate)
    parallel_threshold: int = 4096
    #: exponentiations per chunk: about 0.1 s of work, so a call whose caller gave up stops
    #: within a fraction of a second (:func:`vflink._cancel.checkpoint` between chunks)
    chunk_rows: int = 1024
    #: hashes or validity checks between two checkpoints (each costs ~10-40 µs)
    check_rows: int = 4096
    #: a conservative *lower* bound on the seconds one exponentiation takes on one core (a
    #: fast machine): a request whose elements need more than its caller's deadline even at
    #: this rate can be refused before any work (vflink.parties.setalign)
    min_power_s: float = 20e-6

    def __init__(self, *, workers: int | None = None, compute: Compute | None = None) -> None:
        self.workers = default_workers() if workers is None else max(1, int(workers))
        self.compute = compute
        self.operations = 0  # exponentiations and hashes done, for benchmarks and summaries
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

    def _combination_worker(self) -> Callable[[Elements, Sequence[int]], bytes]:
        """What the pool runs per chunk of a combination (a process pool pickles it)."""
        return self._combination_chunk

    def _new_executor(self) -> Executor:
        return ThreadPoolExecutor(self.workers)

    def _chunk_worker(self) -> Callable[[Elements, int], Elements]:
        """What the pool runs per chunk (a process pool needs a picklable module function)."""
        return self._power_chunk

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

    # --- public surface ---------------------------------------------------------------

    def min_seconds(self, exponentiations: int) -> float:
        """A lower bound on the wall time of ``exponentiations`` with every worker busy."""
        return exponentiations * self.min_power_s / self.workers

    def random_exponent(self) -> int:
        """A secret exponent, uniform in ``[1, order)``, from the OS secure source."""
        return 1 + secrets.randbelow(self.order - 1)

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
        if n < self.parallel_threshold or self.workers == 1:
            parts = []
            for i in range(0, n, self.chunk_rows):
                checkpoint()
                parts.append(self._combination_chunk(elements[i:i + self.chunk_rows],
                                                     cs[i:i + self.chunk_rows]))
        else:
            size = min(max(self.chunk_rows, -(-n // (self.workers * 8))), 4 * self.chunk_rows)
            pool = self._executor()
            worker = self._combination_worker()
            pending: deque[Future[bytes]] = deque()
            parts = []
            try:
                for i in range(0, n, size):
                    checkpoint()
                    pending.append(pool.submit(worker, elements[i:i + size], cs[i:i + size]))
                    if len(pending) >= 2 * self.workers:
                        parts.append(pending.popleft().result())
                while pending:
                    checkpoint()
                    parts.append(pending.popleft().result())
            finally:
                for future in pending:
                    future.cancel()
        acc = self._identity()
        for part in parts:
            acc = self._operate(acc, part)
        self.operations += n
        return np.frombuffer(acc, dtype=np.uint8).reshape(1, -1).copy()

    def _buckets(self, n: int) -> list[tuple[int, int]] | None:
        """Row ranges for the compute engine's tasks, or None to work in this process."""
        c = self.compute
        if c is None or n < self.parallel_threshold:
            return None
        size = min(c.chunk_rows, max(1024, -(-n // (4 * max(1, c.workers)))))
        return [(i, min(n, i + size)) for i in range(0, n, size)]

    def hash_to_group(self, keys: Sequence[bytes]) -> Elements:
        """Each key hashed to a group element (random-oracle encoding of the record IDs)."""
        buckets = self._buckets(len(keys))
        if buckets is not None and self.compute is not None:
            keys = list(keys)
            parts = self.compute.map(_hash_task, [keys[a:b] for a, b in buckets],
                                     shared=type(self))
            self.operations += len(keys)
            return np.concatenate(parts)
        out = np.empty((len(keys), self.element_bytes), dtype=np.uint8)
        for i, key in enumerate(keys):
            if i % self.check_rows == 0:
                checkpoint()
            out[i] = np.frombuffer(self._hash_one(hash_input(key, self.name)), dtype=np.uint8)
        self.operations += len(keys)
        return out

    def power(self, elements: Elements, exponent: int,
              progress: Callable[[int], None] | None = None) -> Elements:
        """``x^exponent`` for every element, in order; batches use every worker."""
        elements = self.check(elements, "elements")
        n = len(elements)
        e = int(exponent) % self.order
        if e == 0:
            raise ValueError("the exponent must be non-zero modulo the group order")
        parts: list[Elements] = []
        buckets = self._buckets(n)
        if buckets is not None and self.compute is not None:
            # the party's own engine (a Ray cluster of its own): buckets as tasks
            sizes = iter([hi - lo for lo, hi in buckets])
            done = None if progress is None else (lambda _: progress(next(sizes)))
            checkpoint()
            parts.append(np.concatenate(self.compute.map(
                _power_task, [elements[lo:hi] for lo, hi in buckets], shared=(type(self), e),
                progress=done)))
        elif n < self.parallel_threshold or self.workers == 1:
            for i in range(0, n, self.chunk_rows):
                checkpoint()
                parts.append(self._power_chunk(elements[i:i + self.chunk_rows], e))
                if progress is not None:
                    progress(len(parts[-1]))
        else:
            # chunks several times the worker count (balanced load, regular progress), but
            # never much longer than ``chunk_rows``: the loop below checks between chunks
            size = min(max(self.chunk_rows, -(-n // (self.workers * 8))), 4 * self.chunk_rows)
            pool = self._executor()
            worker = self._chunk_worker()
            pending: deque[Future[Elements]] = deque()
            try:
                # a bounded window of chunks in flight: a cancelled call leaves at most this
                # many behind, and a process pool pickles no more than it needs
                for i in range(0, n, size):
                    checkpoint()
                    pending.append(pool.submit(worker, elements[i:i + size], e))
                    if len(pending) >= 2 * self.workers:
                        parts.append(pending.popleft().result())
                        if progress is not None:
                            progress(len(parts[-1]))
                while pending:
                    checkpoint()
                    parts.append(pending.popleft().result())
                    if progress is not None:
                        progress(len(parts[-1]))
            finally:
                for future in pending:
                    future.cancel()
        out = np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else self.empty()
        self.operations += n
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
        prime-order group (or the identity) could leak bits of the secret exponent.
        """
        arr = self.check(elements, what)
        buckets = self._buckets(len(arr))
        if buckets is not None and self.compute is not None:
            checkpoint()
            if not all(self.compute.map(_valid_task, [arr[lo:hi] for lo, hi in buckets],
                                        shared=type(self))):
                raise ProtocolError(f"{what}: not every row encodes a {self.name} group element")
        else:
            for i in range(0, len(arr), self.check_rows):
                checkpoint()
                if not self._valid_chunk(arr[i:i + self.check_rows]):
                    raise ProtocolError(f"{what}: not every row encodes a {self.name} group "
                                        "element")
        return arr

    def random_elements(self, n: int) -> Elements:
        """``n`` uniformly random elements (the simulators of FLORIST App. A draw these)."""
        return self.hash_to_group([secrets.token_bytes(32) for _ in range(n)])
