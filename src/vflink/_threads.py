"""How many threads a large numpy pass takes: the cores this process may run on.

numpy releases the GIL inside its loops, so an elementwise pass, an exact sum or a fill of
random numbers over millions of elements can be cut into contiguous pieces, one per thread,
each computed exactly as it would be whole. Below a few million elements a thread costs more
than it saves; above :data:`MAX_PASS_THREADS` the passes are bound by memory, not cores.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

__all__ = ["MAX_PASS_THREADS", "PASS_MIN", "cores", "extremes", "in_pieces", "pass_threads"]

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


def in_pieces(fn: Callable[[Any], Any], values: Any) -> list[Any]:
    """``fn`` of each contiguous piece of the flattened ``values`` (a C-contiguous numpy array),
    one piece per thread of :func:`pass_threads`; a single piece when the array is small or
    not contiguous."""
    threads = pass_threads(values.size)
    if threads == 1 or not values.flags.c_contiguous:
        return [fn(values.reshape(-1))]
    from concurrent.futures import ThreadPoolExecutor

    flat = values.reshape(-1)
    bounds = [flat.size * i // threads for i in range(threads + 1)]
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda r: fn(flat[r[0]:r[1]]), zip(bounds[:-1], bounds[1:])))


def extremes(values: Any) -> tuple[Any, Any]:
    """The minimum and maximum of a non-empty numpy array, a large one in pieces on one thread
    per core (numpy releases the GIL in its reductions); a NaN anywhere is both, as numpy's
    own ``min`` and ``max`` give it."""
    import numpy as np

    parts = in_pieces(lambda piece: (piece.min(), piece.max()), values)
    return (np.min(np.array([p[0] for p in parts])), np.max(np.array([p[1] for p in parts])))
