"""How many threads a large numpy pass takes: the cores this process may run on.

numpy releases the GIL inside its loops, so an elementwise pass, an exact sum or a fill of
random numbers over millions of elements can be cut into contiguous pieces, one per thread,
each computed exactly as it would be whole. Below a few million elements a thread costs more
than it saves; above :data:`MAX_PASS_THREADS` the passes are bound by memory, not cores.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["MAX_PASS_THREADS", "PASS_MIN", "cores", "extremes", "in_pieces", "pass_threads"]

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


def in_pieces(fn: Callable[[slice], T], size: int, threads: int, *, align: int = 1
              ) -> list[T]:
    """``fn`` of each of ``threads`` contiguous stretches of ``range(size)`` (as slices, in
    order), on a thread each; their bounds are multiples of ``align`` (but the last). One
    thread: ``fn(slice(0, size))`` here. Callers pass :func:`pass_threads` of their size."""
    if threads <= 1:
        return [fn(slice(0, size))]
    from concurrent.futures import ThreadPoolExecutor

    units = -(-size // align)
    bounds = [min(size, units * i // threads * align) for i in range(threads + 1)]
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(fn, [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]))


def extremes(values: Any) -> tuple[Any, Any]:
    """The minimum and maximum of a non-empty numpy array, a large one in pieces on one thread
    per core (numpy releases the GIL in its reductions); a NaN anywhere is both, as numpy's
    own ``min`` and ``max`` give it."""
    import numpy as np

    flat = np.ravel(values)
    parts = in_pieces(lambda r: (flat[r].min(), flat[r].max()), flat.size,
                      pass_threads(flat.size))
    return (np.min(np.array([p[0] for p in parts])), np.max(np.array([p[1] for p in parts])))
