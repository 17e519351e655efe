"""Process-level heap settings of commands: glibc's ``mallopt``, where the C library has it.

**Set protocols** (``vflink align``) stream large element lists.

The set protocols allocate and free arrays of a few MiB per chunk (100,000 elements of 32
bytes, their hashes, their exponentiations) for as long as they run. glibc serves a block
above its mmap threshold with its own mapping, returned to the system on ``free``; but it raises
that threshold to the size of each such block freed (its dynamic threshold, up to 32 MiB), so
from the first freed chunk on, chunks come from the arenas, whose freed holes between live
blocks the process keeps. Measured with ``benchmarks/align_command.py`` (PSU, 3·10⁵ keys per
side, ``--party``, local engine, one 2-core machine, the same hour): the command's resident
memory grew through the run to 643 MiB with glibc's default, and stayed flat at 542 MiB with
the threshold fixed, in the same time (77.0 s against 78.0 s).

**A link** (``vflink link``) allocates and frees blocks of up to a few MiB per batch of its
search on every thread, each thread in its own glibc arena. Where the dynamic threshold and the
arena's trimming fall badly for the batches' sizes, glibc hands each freed block back to the
system and the next batch faults its pages in again: with batches of 2 MiB (2^18 pairs), on
FedSim's house points rounded to 3 decimals (141,050 × 27,827, K = 100), the command took
555,000 page faults and 1.3–1.9 s of system time, against 37,000 and 0.45 s with blocks up to
32 MiB served from the arenas and 64 MiB of slack kept at the top of each. The search now
batches 1 MiB (2^17 pairs), for which glibc's own policy faults 40,000–59,000 times on those
points and the unrounded ones at K = 30 to 300, and this setting 35,000–47,000 (0.2–0.4 s less
system time at K = 300): it keeps the command off that cliff whatever block sizes the data
makes, for a peak resident memory within 10 MiB of glibc's default.
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["LINK_MMAP_THRESHOLD", "LINK_TOP_PAD", "MMAP_THRESHOLD", "M_MMAP_THRESHOLD",
           "M_TOP_PAD", "keep_large_blocks_mapped", "keep_batch_blocks"]

#: glibc's ``mallopt`` parameters (``<malloc.h>``): the mmap threshold, the top pad.
M_MMAP_THRESHOLD = -3
M_TOP_PAD = -2
#: glibc's own starting threshold (128 KiB); setting it explicitly turns the dynamic one off.
MMAP_THRESHOLD = 128 << 10
#: A link's blocks served from the arenas up to this size (glibc's largest threshold).
LINK_MMAP_THRESHOLD = 32 << 20
#: Slack a link keeps at the top of each arena instead of handing it back.
LINK_TOP_PAD = 64 << 20


def keep_large_blocks_mapped() -> bool:
    """Fix the C heap's mmap threshold at 128 KiB for the rest of this process, so a freed
    chunk-sized block goes back to the system. True where it took effect (glibc on Linux);
    elsewhere nothing changes (another C library has its own policy) and False is returned."""
    return _mallopt((M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def keep_batch_blocks() -> bool:
    """For the rest of this process, serve blocks up to :data:`LINK_MMAP_THRESHOLD` from the
    arenas and keep :data:`LINK_TOP_PAD` of slack at each arena's top, so the search's
    batches reuse their pages (a link's process, see the module's docs). True where it took
    effect (glibc on Linux)."""
    return _mallopt((M_MMAP_THRESHOLD, LINK_MMAP_THRESHOLD), (M_TOP_PAD, LINK_TOP_PAD))


def _mallopt(*settings: tuple[int, int]) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return all([bool(mallopt(param, value)) for param, value in settings])
