"""How many threads a large numpy pass takes: the cores this process may run on.

numpy releases the GIL inside its loops, so an elementwise pass, an exact sum or a fill of
random numbers over millions of elements can be cut into contiguous pieces, one per thread,
each computed exactly as it would be whole. Below a few million elements a thread costs more
than it saves; above :data:`MAX_PASS_THREADS` the passes are bound by memory, not cores.
"""

from __future__ import annotations

import os

__all__ = ["MAX_PASS_THREADS", "PASS_MIN", "cores", "pass_threads"]

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
