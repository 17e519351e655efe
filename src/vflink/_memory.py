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
from typing import Any

import numpy.typing as npt

__all__ = ["Prefault", "small_pages"]


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


class Prefault:
    """Touch the pages of fresh arrays on a thread of their own while the caller does work
    that holds one core only (loading an extension module, say), so that the work after
    does not stop at each page's first touch (the kernel's fault: 0.055 s per 113 MB here).
    The arrays are written (zeros) a piece at a time; :meth:`stop` ends it at the next
    piece and waits, so the caller never waits for more than one piece. Use the arrays only
    after :meth:`stop`: their contents are the caller's to write from then on."""

    #: Bytes touched between two looks at the stop flag.
    PIECE = 1 << 23

    def __init__(self, *arrays: npt.NDArray[Any]) -> None:
        import threading

        self._stop = threading.Event()
        self._arrays = [a.reshape(-1) for a in arrays if a.flags.c_contiguous and a.size]
        self._thread = threading.Thread(target=self._touch, name="vflink-prefault",
                                        daemon=True)
        self._thread.start()

    def _touch(self) -> None:
        for flat in self._arrays:
            step = max(1, self.PIECE // flat.itemsize)
            for start in range(0, flat.size, step):
                if self._stop.is_set():
                    return
                flat[start:start + step].fill(0)  # numpy fills without the GIL

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
