"""Process-level heap settings for commands that stream large element lists.

The set protocols allocate and free arrays of a few MiB per chunk (100,000 elements of 32
bytes, their hashes, their exponentiations) for as long as they run. glibc serves a block
above its mmap threshold with its own mapping, returned to the system on ``free``; but it raises
that threshold to the size of each such block freed (its dynamic threshold, up to 32 MiB), so
from the first freed chunk on, chunks come from the arenas, whose freed holes between live
blocks the process keeps. Measured with ``benchmarks/align_command.py`` (PSU, 3·10⁵ keys per
side, ``--party``, local engine, one 2-core machine, the same hour): the command's resident
memory grew through the run to 643 MiB with glibc's default, and stayed flat at 542 MiB with
the threshold fixed, in the same time (77.0 s against 78.0 s).
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["M_MMAP_THRESHOLD", "MMAP_THRESHOLD", "keep_large_blocks_mapped"]

#: glibc's ``mallopt`` parameter for the mmap threshold (``<malloc.h>``).
M_MMAP_THRESHOLD = -3
#: glibc's own starting threshold (128 KiB); setting it explicitly turns the dynamic one off.
MMAP_THRESHOLD = 128 << 10


def keep_large_blocks_mapped() -> bool:
    """Fix the C heap's mmap threshold at 128 KiB for the rest of this process, so a freed
    chunk-sized block goes back to the system. True where it took effect (glibc on Linux);
    elsewhere nothing changes (another C library has its own policy) and False is returned."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
