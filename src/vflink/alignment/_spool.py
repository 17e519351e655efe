"""On-disk lists of group elements for the chunked set protocols (docs/how-to/scale-out.md).

A PSU/PSI round used to be one array in one message and in one process's memory. Streamed in
chunks, each party keeps what it must remember between chunks on disk instead:

* :class:`Spool`: a flat list of fixed-width elements (and optionally an int64 row per
  element), appended chunk by chunk and read back by slice;
* :class:`Buckets`: elements partitioned by their *leading bits* into files, so that the
  sorted order of the whole list is the buckets' order followed by each bucket's own order
  (``sorted_unique``, intersections and ranks in the union are computed one bucket at a
  time, as secretflow/psi and FATE do with buckets of about 10^6 rows);
* :func:`shuffle`: a secret uniform permutation of a list too large for memory: every element
  goes to a bucket drawn at random, each bucket is permuted in memory, and the buckets are
  concatenated. This is uniform: a permutation's probability is
  ``sum over bucket sizes of B^-n * prod(1/n_i!)`` = ``1/n!`` (the multinomial theorem).

Every file lives in a :class:`Workdir` removed when the protocol finishes, fails, or its owner
is collected. A process killed before that leaves its workdir behind; each workdir names its
owning process (``.owner``: pid and start time), and :func:`sweep_stale` removes those whose
owner is gone (a party runs it when it starts and before each protocol). What a workdir holds is
keyed: the parties spool only elements blinded with the session's secret exponents, which live
in memory and die with the process, never the unblinded hash of a record's key.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt

from vflink.alignment.groups import Elements
from vflink.randomness import secret_generator

__all__ = ["Buckets", "RowOrder", "Spool", "Workdir", "process_alive", "process_token", "shuffle",
           "sweep_stale"]

log = logging.getLogger(__name__)

#: Prefix of every workdir (what :func:`sweep_stale` looks for).
PREFIX = "vflink-set-"
_OWNER = ".owner"


def _started(pid: int) -> str | None:
    """A token of process ``pid``'s identity: its start time on Linux (pid numbers are
    reused), "" where the system does not tell; None if no such process runs."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode("ascii", "replace")
        return stat.rsplit(")", 1)[1].split()[19]  # field 22, after the command name
    except FileNotFoundError:
        return None
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except OSError:
        pass
    return ""


def _alive(owner: str) -> bool:
    parts = owner.split()
    if len(parts) != 2 or not parts[0].isdigit():
        return False
    started = _started(int(parts[0]))
    return started is not None and (started == parts[1] or started == "" or parts[1] == "-")


def process_token() -> str:
    """This process's identity as ``"<pid> <start time>"`` (what a workdir's owner file
    holds), for records that must tell later whether their process is still running."""
    pid = os.getpid()
    return f"{pid} {_started(pid) or '-'}"


def process_alive(token: str) -> bool:
    """Whether the process :func:`process_token` named is still running."""
    return _alive(token)


#: A workdir without its owner file is being created (or predates them): left alone this long.
_UNOWNED_GRACE_S = 600.0


def sweep_stale(parent: Path | None = None) -> int:
    """Remove the workdirs under ``parent`` (default: the system's temporary directory) whose
    owning process is gone (a killed party's spool); returns how many. Only workdirs this user
    owns are touched, and one without an owner file only once it is old (another process may
    be creating it this very moment)."""
    root = Path(tempfile.gettempdir()) if parent is None else Path(parent)
    removed = 0
    try:
        entries = list(root.glob(PREFIX + "*"))
    except OSError:
        return 0
    uid = os.getuid() if hasattr(os, "getuid") else None
    for path in entries:
        try:
            st = path.lstat()
            if not path.is_dir() or path.is_symlink() or (uid is not None and st.st_uid != uid):
                continue
            owner = (path / _OWNER).read_text(encoding="ascii", errors="replace") \
                if (path / _OWNER).is_file() else ""
        except OSError:
            continue
        if owner and _alive(owner):
            continue
        if not owner and time.time() - st.st_mtime < _UNOWNED_GRACE_S:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    if removed:
        log.info("removed %d spool folder(s) of stopped processes under %s", removed, root)
    return removed

#: Most leading bits used to bucket (2^16 buckets; every element has at least two bytes).
_MAX_BITS = 16



def _append_by_bucket(path: Path, count: npt.NDArray[np.int64], ids: npt.NDArray[np.int64],
                      elements: Elements, rows: npt.NDArray[np.int64]) -> None:
    """Append each (element, row) to the files of its bucket ``ids[i]`` (``NNNNN.e`` / ``.r``
    under ``path``), keeping their order within a bucket; ``count`` counts per bucket."""
    order = np.argsort(ids, kind="stable")
    ids, elements, rows = ids[order], elements[order], rows[order]
    cuts = np.flatnonzero(np.diff(ids)) + 1
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(ids)], strict=True):
        b = int(ids[lo])
        with open(path / f"{b:05d}.e", "ab") as fh:
            fh.write(elements[lo:hi].tobytes())
        with open(path / f"{b:05d}.r", "ab") as fh:
            fh.write(np.ascontiguousarray(rows[lo:hi], dtype="<i8").tobytes())
        count[b] += hi - lo

class Workdir:
    """A private temporary directory (mode 0700) removed by :meth:`close`, or at collection."""

    def __init__(self, parent: Path | None = None, prefix: str = PREFIX) -> None:
        if parent is not None:
            parent.mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        self._count = 0
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.path, True)
        (self.path / _OWNER).write_text(process_token(), encoding="ascii")

    def new(self, name: str) -> Path:
        """A fresh sub-path for one list."""
        self._count += 1
        return self.path / f"{self._count:03d}-{name}"

    def close(self) -> None:
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive


class Spool:
    """A flat list of ``width``-byte elements on disk, with an optional int64 row for each."""

    def __init__(self, path: Path, width: int, *, rows: bool = False) -> None:
        self.path, self.width, self.has_rows = path, width, rows
        self.n = 0
        path.mkdir(parents=True, exist_ok=True)
        (path / "e.bin").touch()
        if rows:
            (path / "r.bin").touch()

    def __len__(self) -> int:
        return self.n

    def append(self, elements: Elements, rows: npt.NDArray[np.int64] | None = None) -> None:
        elements = np.ascontiguousarray(elements, dtype=np.uint8)
        with open(self.path / "e.bin", "ab") as fh:
            fh.write(elements.tobytes())
        if self.has_rows:
            if rows is None or len(rows) != len(elements):
                raise ValueError("a spool with rows needs one row per element")
            with open(self.path / "r.bin", "ab") as fh:
                fh.write(np.ascontiguousarray(rows, dtype="<i8").tobytes())
        self.n += len(elements)

    def read(self, lo: int, hi: int) -> tuple[Elements, npt.NDArray[np.int64] | None]:
        """Elements (and rows) ``lo:hi``."""
        lo, hi = max(0, lo), min(self.n, hi)
        count = max(0, hi - lo)
        with open(self.path / "e.bin", "rb") as fh:
            fh.seek(lo * self.width)
            e = np.fromfile(fh, dtype=np.uint8, count=count * self.width)
        rows = None
        if self.has_rows:
            with open(self.path / "r.bin", "rb") as fh:
                fh.seek(lo * 8)
                rows = np.fromfile(fh, dtype="<i8", count=count).astype(np.int64)
        return e.reshape(count, self.width), rows

    def chunks(self, size: int) -> Iterator[tuple[Elements, npt.NDArray[np.int64] | None]]:
        for lo in range(0, self.n, max(1, size)):
            yield self.read(lo, lo + size)


def bucket_bits(expected: int, per_bucket: int) -> int:
    """Leading bits giving buckets of about ``per_bucket`` elements for ``expected`` ones."""
    if expected <= per_bucket:
        return 0
    return min(_MAX_BITS, math.ceil(math.log2(expected / max(1, per_bucket))))


class Buckets:
    """Elements (each with an int64 row) split over ``2^bits`` files by their leading bits, or,
    with ``random``, by a bucket drawn from the OS secure source (for :func:`shuffle`)."""

    def __init__(self, path: Path, width: int, *, bits: int, random: bool = False) -> None:
        self.path, self.width, self.bits, self.random = path, width, bits, random
        self.count = np.zeros(1 << bits, dtype=np.int64)
        self._rng = secret_generator() if random else None
        path.mkdir(parents=True, exist_ok=True)

    def __len__(self) -> int:
        return int(self.count.sum())

    def _ids(self, elements: Elements) -> npt.NDArray[np.int64]:
        if self.bits == 0:
            return np.zeros(len(elements), dtype=np.int64)
        if self._rng is not None:
            return self._rng.integers(0, 1 << self.bits, size=len(elements), dtype=np.int64)
        lead = (elements[:, 0].astype(np.int64) << 8) | elements[:, 1].astype(np.int64)
        return lead >> (_MAX_BITS - self.bits)

    def add(self, elements: Elements, rows: npt.NDArray[np.int64] | None = None) -> None:
        if len(elements) == 0:
            return
        elements = np.ascontiguousarray(elements, dtype=np.uint8)
        rows = np.full(len(elements), -1, dtype=np.int64) if rows is None else rows
        _append_by_bucket(self.path, self.count, self._ids(elements), elements,
                          np.asarray(rows))

    def bucket(self, b: int) -> tuple[Elements, npt.NDArray[np.int64]]:
        n = int(self.count[b])
        if n == 0:
            return (np.empty((0, self.width), dtype=np.uint8), np.empty(0, dtype=np.int64))
        e = np.fromfile(self.path / f"{b:05d}.e", dtype=np.uint8).reshape(n, self.width)
        r = np.fromfile(self.path / f"{b:05d}.r", dtype="<i8").astype(np.int64)
        return e, r

    def __iter__(self) -> Iterator[tuple[Elements, npt.NDArray[np.int64]]]:
        """Buckets in the order of their leading bits (byte order of the elements)."""
        for b in range(len(self.count)):
            yield self.bucket(b)

    def drop(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def shuffle(source: Buckets, out: Spool) -> Spool:
    """Append ``source``'s elements (drawn into random buckets) to ``out`` in a uniformly
    random order; ``source`` is removed."""
    rng = secret_generator()  # vflink.randomness: never reproducible
    for e, r in source:
        perm = rng.permutation(len(e))
        out.append(e[perm], r[perm] if out.has_rows else None)
    source.drop()
    return out


class RowOrder:
    """(row, element) pairs arriving in any order, read back in ascending row order (an
    external sort by row ranges): a party's alignment output is written row by row without
    ever holding all of it, so its memory does not grow with the table. Rows are in
    ``[0, n)``, each at most once."""

    #: most row-range files (a tiny ``span`` on a large table would open too many)
    MAX_PARTS = 4096

    def __init__(self, path: Path, width: int, n: int, span: int) -> None:
        self.path, self.width = path, width
        self.span = max(1, span, -(-n // self.MAX_PARTS))
        self.count = np.zeros(max(1, -(-n // self.span)), dtype=np.int64)
        path.mkdir(parents=True, exist_ok=True)

    def __len__(self) -> int:
        return int(self.count.sum())

    def add(self, rows: npt.NDArray[np.int64], elements: Elements) -> None:
        if len(rows) == 0:
            return
        rows = np.asarray(rows, dtype=np.int64)
        elements = np.ascontiguousarray(elements, dtype=np.uint8)
        _append_by_bucket(self.path, self.count, rows // self.span, elements, rows)

    def __iter__(self) -> Iterator[tuple[npt.NDArray[np.int64], Elements]]:
        """(rows ascending, their elements), one row range at a time."""
        for b in range(len(self.count)):
            n = int(self.count[b])
            if n == 0:
                continue
            e = np.fromfile(self.path / f"{b:05d}.e", dtype=np.uint8).reshape(n, self.width)
            r = np.fromfile(self.path / f"{b:05d}.r", dtype="<i8").astype(np.int64)
            order = np.argsort(r, kind="stable")
            yield r[order], e[order]
