"""How many threads a large numpy pass takes: the cores this process may run on.

numpy releases the GIL inside its loops, so an elementwise pass, an exact sum or a fill of
random numbers over millions of elements can be cut into contiguous pieces, one per thread,
each computed exactly as it would be whole. Below a few million elements a thread costs more
than it saves; above :data:`MAX_PASS_THREADS` the passes are bound by memory, not cores.

The pieces run on the calling thread (the first) and on a pool of threads the process keeps
(:func:`shared_pool`), not on threads started for each call: starting a thread waits for it
to take the GIL, and while other threads compute that took 1-2 ms a thread in ``vflink
link`` (72 ms in all on the command's own thread, counted in a link of 50 clusters at
FedSim's house scale, of which scipy's k-d tree queries with ``workers=2``, which start
their threads at every call, took 33 ms; see :mod:`vflink.linkage.grouped`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

__all__ = ["MAX_PASS_THREADS", "PASS_MIN", "cores", "extremes", "in_pieces", "in_pool_thread",
           "pass_threads", "shared_pool"]

T = TypeVar("T")

#: Elements from which a pass is split between threads (and per thread at least half this).
PASS_MIN = 1 << 21
#: Threads a memory-bound pass takes at most.
MAX_PASS_THREADS = 8


def cores() -> int:
    """The cores this process may run on (its affinity), at least one."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1  # pragma: no cover - platforms without affinity


def pass_threads(size: int) -> int:
    """Threads for a pass over ``size`` elements: one below :data:`PASS_MIN`, else one per
    core (at most :data:`MAX_PASS_THREADS`), each with at least ``PASS_MIN / 2`` elements."""
    if size < PASS_MIN:
        return 1
    return max(1, min(cores(), MAX_PASS_THREADS, size // (PASS_MIN // 2)))


#: The process's pool (:func:`shared_pool`), made at its first use.
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
#: Marks the pool's own threads (:func:`in_pieces` called on one runs its pieces in turn).
_IN_POOL = threading.local()


def _mark_pool_thread() -> None:
    _IN_POOL.yes = True


def _forget_pool() -> None:
    """In a forked child: the parent's pool threads do not exist there."""
    global _POOL
    _POOL = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def in_pool_thread() -> bool:
    """Whether the calling thread is one of :func:`shared_pool`'s."""
    return bool(getattr(_IN_POOL, "yes", False))


def shared_pool() -> ThreadPoolExecutor:
    """The process's pool of worker threads (as many as the cores, and at least
    :data:`MAX_PASS_THREADS`), each started when work first finds no idle one, and kept for
    the next call. Work given to it must not wait for other work given to it (a piece of
    :func:`in_pieces` run on a pool thread runs its own pieces in turn)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max(cores(), MAX_PASS_THREADS),
                                       thread_name_prefix="vflink-pass",
                                       initializer=_mark_pool_thread)
        return _POOL


def in_pieces(fn: Callable[[slice], T], size: int, threads: int, *, align: int = 1
              ) -> list[T]:
    """``fn`` of each of ``threads`` contiguous stretches of ``range(size)`` (as slices, in
    order), on a thread each: the first on the calling thread, the others on
    :func:`shared_pool`'s; their bounds are multiples of ``align`` (but the last). One
    thread: ``fn(slice(0, size))`` here. Callers pass :func:`pass_threads` of their size.
    An error is raised once every piece has ended."""
    if threads <= 1:
        return [fn(slice(0, size))]
    units = -(-size // align)
    bounds = [min(size, units * i // threads * align) for i in range(threads + 1)]
    pieces = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    if in_pool_thread():  # a pool thread waits for no other pool work
        return [fn(piece) for piece in pieces]
    pool = shared_pool()
    rest: list[Future[T]] = []
    try:
        for piece in pieces[1:]:
            rest.append(pool.submit(fn, piece))
    except RuntimeError:
        # The pool takes no more work once the interpreter's exit has begun (its threads are
        # stopped before the other threads are joined): a thread still at work then (the
        # deletion of an old output, in a thread of its own) runs the pieces left itself.
        pass
    try:
        first = fn(pieces[0])
        here = [fn(piece) for piece in pieces[1 + len(rest):]]
    finally:
        wait(rest)
    return [first, *(done.result() for done in rest), *here]


def extremes(values: Any) -> tuple[Any, Any]:
    """The minimum and maximum of a non-empty numpy array, a large one in pieces on one thread
    per core (numpy releases the GIL in its reductions); a NaN anywhere is both, as numpy's
    own ``min`` and ``max`` give it."""
    import numpy as np

    flat = np.ravel(values)
    parts = in_pieces(lambda r: (flat[r].min(), flat[r].max()), flat.size,
                      pass_threads(flat.size))
    return (np.min(np.array([p[0] for p in parts])), np.max(np.array([p[1] for p in parts])))
