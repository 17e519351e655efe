"""How a link's large arrays get their memory: numpy's transparent-huge-page advice.

numpy asks Linux for transparent huge pages on every large array (``madvise(MADV_HUGEPAGE)``).
Where the kernel's THP defrag setting is ``madvise`` (a common default), the first touch of
each 2 MB of such an array then waits for the kernel to compact memory: filling a fresh
113 MB array took 0.18-0.25 s with the advice and 0.055 s without, and a house-scale link
(a dozen such arrays) spent 0.2 s more CPU (2 cores, measured). vflink's commands turn the
advice off before numpy loads (``NUMPY_MADVISE_HUGEPAGE=0``, :mod:`vflink.cli.main`); a link
run through the Python API, in a process whose numpy is already loaded, turns it off for the
link's duration (:func:`small_pages`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["small_pages"]


@contextmanager
def small_pages() -> Iterator[None]:
    """numpy's huge-page advice off inside the block, as it was after it. Nothing changes
    where the user set ``NUMPY_MADVISE_HUGEPAGE`` (their choice) or where this numpy has no
    such switch. (The switch is process-wide: arrays other threads allocate meanwhile get
    ordinary pages too, which changes only how fast their memory is first touched.)"""
    import numpy as np

    core = getattr(np, "_core", None) or getattr(np, "core", None)  # numpy 2, numpy 1
    setter = getattr(getattr(core, "multiarray", None), "_set_madvise_hugepage", None)
    if setter is None or "NUMPY_MADVISE_HUGEPAGE" in os.environ:
        yield
        return
    previous = setter(False)
    try:
        yield
    finally:
        setter(previous)
