"""Partitioned Parquet output, written part by part and published atomically.

A links or alignment table too large to build in one piece is written as a *dataset*: a
directory of Parquet parts ``part-00000.parquet``, ``part-00001.parquet``... in row order, and
a ``_vflink.json`` that states its format and version, the number of parts and rows, and the
columns. ``pyarrow.dataset.dataset(dir)``, ``pandas.read_parquet(dir)`` and vflink's own readers
read it as one table in row order (pyarrow skips names that start with ``_`` or ``.``, and
sorts the parts by name).

Atomic, as every file vflink writes (:mod:`vflink._files`): the parts go into a fresh,
exclusively created directory beside the target (``.<name>.<random>.tmp``), and only when the
last part is written is that directory renamed onto the target. A run that fails (or is
interrupted) removes its temporary directory and leaves the target as it was; the target
*name* is replaced, never written through (a symlink planted at it is moved aside, not
followed).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import secrets
import shutil
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from vflink._files import reserve_space
from vflink._threads import cores, in_pieces, in_pool_thread, shared_pool
from vflink.errors import DataError

__all__ = ["AUTO_PARTS_ROWS", "FORMAT", "MANIFEST", "PART_ROWS", "PartitionedWriter",
           "arrow_table", "is_partitioned", "parquet_bound", "parquet_options", "read_parts",
           "write_columns", "writer_threads"]

log = logging.getLogger(__name__)

#: Format and version of a partitioned dataset, in its manifest.
FORMAT = "vflink-parquet-parts/1"
#: The manifest's name inside the dataset (ignored by pyarrow's dataset discovery).
MANIFEST = "_vflink.json"
#: Rows per part: about 40 MB of links (five 8-byte columns) before compression.
PART_ROWS = 1_000_000
#: Above this many rows, a ``.parquet`` output is written as a partitioned dataset unless the
#: caller says otherwise (one pyarrow table of 10^7 links is already about 400 MB in memory).
AUTO_PARTS_ROWS = 10_000_000


def writer_threads() -> int:
    """Parts written at once: one per core, at most four (each part is compressed and written
    by pyarrow without the GIL; each holds a part, about 40 MB, in memory)."""
    return max(1, min(4, cores()))


def _numeric_array(pa: Any, values: npt.NDArray[Any]) -> Any:
    """A 1-D numpy array of numbers or booleans as a pyarrow array over the same memory (a
    boolean packed into bits), ``None`` for anything else. (``pa.array`` would do the same
    but imports pandas, 0.2 s, on its first call.)"""
    if values.ndim != 1 or values.dtype.kind not in "iufb" or not values.dtype.isnative:
        return None
    if values.dtype.kind == "b":
        bits = np.packbits(values, bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(bits)])
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values),
                                 [None, pa.py_buffer(values)])


def arrow_table(columns: dict[str, Any] | Any, metadata: dict[str, str] | None = None) -> Any:
    """A ``pyarrow.Table`` of numpy ``columns`` (zero-copy where the arrays allow), a numeric
    column marked non-nullable (a numpy number is never null; Parquet then stores no
    definition levels for it, a fifth of the write's time on 14 M links)."""
    import pyarrow as pa

    if isinstance(columns, pa.Table):
        table = columns
    else:
        arrays, fields = [], []
        for name, values in columns.items():
            array = _numeric_array(pa, np.asarray(values))
            if array is None:
                array = pa.array(np.asarray(values))
            numeric = (pa.types.is_integer(array.type) or pa.types.is_floating(array.type)
                       or pa.types.is_boolean(array.type))
            arrays.append(array)
            fields.append(pa.field(name, array.type, nullable=not numeric or array.null_count > 0))
        table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
    if metadata:
        table = table.replace_schema_metadata(metadata)
    return table


#: Integer columns of spread values, stored without compression like floats: LZ4 halves the
#: secondary's row numbers of a links table (their high bytes are zeros) but not their low
#: bytes, for a third of the write's CPU (14 M house-scale links written alone: 0.37-0.42 s
#: against 0.26-0.30 s of wall time on two threads, for a file of 341 MB instead of 284 MB).
SPREAD_COLUMNS = frozenset({"secondary_index"})


def parquet_options(schema: Any, compression: str = "lz4") -> dict[str, Any]:
    """``pyarrow.parquet`` writer options of vflink's tables (``schema``: the table's): LZ4
    (the fastest of pyarrow's codecs here) but for float columns, whose mantissas LZ4 cannot
    shrink (0.3 % on 14 M distances, for a tenth of the write's time), and the
    :data:`SPREAD_COLUMNS`; no dictionary encoding (on 14 M links it doubled the write's time
    for 7 % less space: LZ4 already folds the repeated row numbers and ranks); statistics
    only for the first column (the primary's row number of a links table, which lets a
    reader skip row groups; those of random distances buy nothing)."""
    import pyarrow as pa

    codecs = {f.name: "none" if compression == "lz4" and (
        pa.types.is_floating(f.type) or f.name in SPREAD_COLUMNS) else compression
        for f in schema}
    return {"compression": codecs, "use_dictionary": False,
            "write_statistics": list(schema.names[:1]),
            **_page_options(all(_narrow(f.type) for f in schema))}


def _narrow(kind: Any) -> bool:
    """A column of at most 8 bytes a value (numbers, booleans): a batch of
    :data:`WRITE_BATCH` of them stays within about a page."""
    import pyarrow as pa

    return bool(pa.types.is_integer(kind) or pa.types.is_floating(kind)
                or pa.types.is_boolean(kind))


#: Values the Parquet writer takes from a column at a time where every column is a narrow
#: one (pyarrow's default: 1,024; the writer looks at a page's size between batches, so a
#: table with wider values, record ids as text say, keeps the default) and rows a data page
#: holds at most (pyarrow's default: 20,000; the page still closes at its 1 MiB
#: ``data_page_size``). With the defaults a part of 10^6 links was 50 pages a column,
#: each its own header, statistics and two writes through the file object, and 977 batches
#: a column: 18.4 ms to encode and write, against 12.8 ms with batches of 65,536 and pages
#: cut by size alone (a 1 MiB page: 131,072 values of 8 bytes); batches of 2^14 took 13.7 ms,
#: 2^18 12.5 ms (pages of 2 MiB), 2^20 16.4 ms; pages of 512 KiB 13.0 ms, of 2 MiB 14.3 ms
#: (medians of 25, one thread, a links part of five 8-byte columns written to a new file).
WRITE_BATCH = 1 << 16
PAGE_ROWS = 1 << 20


@functools.cache
def _page_options(narrow: bool = True) -> dict[str, int]:
    """The writer's batch and page-row options: :data:`WRITE_BATCH` where every column is
    ``narrow``, and :data:`PAGE_ROWS`, only where this pyarrow's writer takes it
    (``max_rows_per_page``, newer than the oldest pyarrow vflink supports)."""
    import inspect

    import pyarrow.parquet as pq

    options = {"write_batch_size": WRITE_BATCH} if narrow else {}
    if "max_rows_per_page" in inspect.signature(pq.ParquetWriter.__init__).parameters:
        options["max_rows_per_page"] = PAGE_ROWS
    return options


def parquet_bound(nbytes: int) -> int:
    """Bytes a Parquet file of columns holding ``nbytes`` takes at most, with
    :func:`parquet_options` (plain encoding; LZ4 grows a block it cannot shrink by under
    1 %; page headers and the footer), to reserve before writing it
    (:func:`vflink._files.reserve_space`)."""
    return int(nbytes * 1.01) + (1 << 16)


def _temp_dir(target: Path) -> Path:
    for _ in range(100):
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
        try:
            tmp.mkdir(mode=0o777)
            return tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"{target}: could not create a temporary directory beside it")


class PartitionedWriter:
    """Write a table part by part into a dataset that appears at ``target`` only when complete.

    Use as a context manager::

        with PartitionedWriter(out) as writer:
            for chunk in chunks:          # each a dict of equal-length numpy columns
                writer.write(chunk)
        # out/ now holds part-00000.parquet ... and _vflink.json; on an error, nothing

    Every part must have the same columns, in the same order and of the same types.
    ``compression``: pyarrow's codec (LZ4: the fastest here, as for the single-file links).
    ``threads``: parts compressed and written at once, beside the caller, which meanwhile
    makes the next part (default :func:`writer_threads`); when they are all busy, the caller
    writes the part it holds itself (at most ``threads`` + 1 parts in memory).
    """

    def __init__(self, target: Path | str, *, compression: str = "lz4",
                 meta: dict[str, Any] | None = None, threads: int | None = None) -> None:
        self.target = Path(target)
        self.compression = compression
        self.meta = dict(meta or {})
        self.parts = 0
        self.rows = 0
        self.threads = writer_threads() if threads is None else max(1, int(threads))
        self._schema: Any = None
        self._tmp: Path | None = None
        self._pool: ThreadPoolExecutor | None = None  # the process's (vflink._threads)
        self._pending: deque[Future[None]] = deque()

    def __enter__(self) -> PartitionedWriter:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = _temp_dir(self.target)
        # at most `threads` parts at once on the process's own pool (a pool thread, which
        # must not wait for pool work, writes its parts itself)
        if self.threads > 1 and not in_pool_thread():
            self._pool = shared_pool()
        return self

    def write(self, columns: dict[str, Any] | Any) -> None:
        """Append one part (a dict of numpy columns, or a ``pyarrow.Table``); empty parts are
        skipped. The part is written beside the caller; an error surfaces here or at the
        block's end."""
        if self._tmp is None:
            raise DataError(f"{self.target}: PartitionedWriter.write outside its `with` block")
        table = arrow_table(columns)
        if table.num_rows == 0:
            return
        if self._schema is None:
            self._schema = table.schema
        elif not table.schema.equals(self._schema):
            raise DataError(f"{self.target}: part {self.parts} has columns {table.schema}, "
                            f"expected {self._schema} as the parts before it")
        path = self._tmp / f"part-{self.parts:05d}.parquet"
        self.parts += 1
        self.rows += table.num_rows
        while self._pending and self._pending[0].done():
            self._pending.popleft().result()
        if self._pool is None or len(self._pending) >= self.threads:
            # every writer busy: the caller writes this part itself rather than wait for one
            # (at most `threads` + 1 parts in memory), so no thread is left to finish the last
            # part alone while the others idle
            self._write_part(table, path)
            return
        self._pending.append(self._pool.submit(self._write_part, table, path))

    def _write_part(self, table: Any, path: Path) -> None:
        import pyarrow.parquet as pq

        # exclusive create: a name planted meanwhile in our fresh directory is not followed
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                     0o666)
        with os.fdopen(fd, "wb") as fh:
            reserved = reserve_space(fd, parquet_bound(table.nbytes))
            pq.write_table(table, fh, **parquet_options(table.schema, self.compression))
            if reserved:
                fh.truncate()  # at the end of what was written: the rest of the space goes

    def _wait(self) -> None:
        while self._pending:
            self._pending.popleft().result()

    def write_empty(self, columns: dict[str, Any]) -> None:
        """Write a part with no rows (a dataset must state its columns even when empty)."""
        if self._tmp is None or self.parts:
            return
        table = arrow_table(columns)
        self._schema = table.schema
        self._write_part(table, self._tmp / f"part-{self.parts:05d}.parquet")
        self.parts += 1

    def _publish(self) -> None:
        if self._tmp is None:
            raise DataError(f"{self.target}: PartitionedWriter used outside its `with` block")
        self._wait()
        manifest = {"format": FORMAT, "parts": self.parts, "rows": self.rows,
                    "columns": list(self._schema.names) if self._schema is not None else [],
                    **self.meta}
        with open(self._tmp / MANIFEST, "x", encoding="utf-8") as fh:
            fh.write(json.dumps(manifest, indent=2) + "\n")
        old: Path | None = None
        if self.target.exists() or self.target.is_symlink():
            # move the old name aside (a file, a directory, or a link: renamed, not followed)
            old = self.target.with_name(f".{self.target.name}.{secrets.token_hex(8)}.old")
            os.rename(self.target, old)
        try:
            os.rename(self._tmp, self.target)
        except BaseException:
            if old is not None:
                os.rename(old, self.target)
            raise
        self._tmp = None
        if old is not None:
            if old.is_dir() and not old.is_symlink():
                # the new dataset is in place: the old one (hundreds of MB of a house-scale
                # link, a tenth of a second to delete) goes in a thread of its own, which the
                # interpreter waits for before it exits
                threading.Thread(target=_remove_dataset, args=(old,),
                                 name="vflink-remove-old-dataset").start()
            else:
                old.unlink(missing_ok=True)
        log.info("%s: %d rows in %d parquet parts", self.target, self.rows, self.parts)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if kind is None:
                self._publish()
        finally:
            for pending in self._pending:
                pending.cancel()
            wait(self._pending)  # no part is written after the directory goes
            self._pool = None
            self._pending.clear()
            if self._tmp is not None:
                shutil.rmtree(self._tmp, ignore_errors=True)
                self._tmp = None


def _remove_dataset(path: Path) -> None:
    """Delete the dataset directory ``path`` (an old output moved aside): its files unlinked
    on one thread per core, then whatever is left (:func:`shutil.rmtree`). Unlinking a part
    has the kernel free its pages and its disk space: the 15 parts of a house-scale link took
    0.045-0.095 s on one thread, as the command ends. The directory is opened without
    following a link, and its files are unlinked relative to that very directory, so a link
    put in its place meanwhile leads nowhere (as rmtree's own checks)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        fd = -1
    try:
        files: list[str] = []
        if fd >= 0:
            with os.scandir(fd) as entries:
                files = [e.name for e in entries if e.is_file(follow_symlinks=False)]

        def unlink(r: slice) -> None:
            for name in files[r]:
                try:
                    os.unlink(name, dir_fd=fd)
                except OSError:
                    pass  # what is left goes with the directory below, or stays, as rmtree's

        in_pieces(unlink, len(files), max(1, min(cores(), len(files))))
    finally:
        if fd >= 0:
            os.close(fd)
    shutil.rmtree(path, ignore_errors=True)


def is_partitioned(path: Path | str) -> bool:
    """Whether ``path`` is a dataset written by :class:`PartitionedWriter`."""
    return (Path(path) / MANIFEST).is_file()


def read_parts(path: Path | str, *, columns: list[str] | None = None) -> Any:
    """The dataset at ``path`` as one ``pyarrow.Table`` in row order (a single Parquet file
    reads too), its manifest checked: the format named and the row count it states."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    path = Path(path)
    if not path.exists():
        raise DataError(f"{path.absolute()}: not found")
    if path.is_dir():
        manifest = path / MANIFEST
        if not manifest.is_file():
            raise DataError(f"{path}: a directory without {MANIFEST}; expected a dataset "
                            "written by vflink (or a .parquet file)")
        try:
            meta = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise DataError(f"{manifest}: not a vflink manifest: {exc}") from exc
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            found = meta.get("format") if isinstance(meta, dict) else meta
            raise DataError(f"{manifest}: format {found!r}, expected {FORMAT!r}")
    try:
        table = ds.dataset(str(path), format="parquet").to_table(columns=columns)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise DataError(f"{path}: cannot be read as a parquet table: {exc}") from exc
    if path.is_dir() and table.num_rows != meta.get("rows"):
        raise DataError(f"{path}: {table.num_rows} rows, but its manifest states "
                        f"{meta.get('rows')}; the dataset is incomplete")
    return table


def write_columns(columns: dict[str, Any], out: Path | str, *, parts: bool | None = None,
                  rows_per_part: int = PART_ROWS, compression: str = "lz4",
                  metadata: dict[str, str] | None = None) -> bool:
    """Write equal-length numpy ``columns`` to the Parquet output ``out``: one file, or, when
    ``parts`` is true (``None``: when there are more than :data:`AUTO_PARTS_ROWS` rows, or
    ``out`` is already a partitioned dataset), a dataset of ``rows_per_part``-row parts
    (:class:`PartitionedWriter`), each converted from its slice of the columns alone. Both
    atomic; the same columns and values either way. Returns whether it wrote parts.
    ``metadata``: key-value pairs stored in a single file's Parquet schema."""
    import pyarrow.parquet as pq

    from vflink._files import atomic_open

    out = Path(out)
    n = len(next(iter(columns.values()))) if columns else 0
    if parts is None:
        parts = n > AUTO_PARTS_ROWS or is_partitioned(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not parts:
        table = arrow_table(columns, metadata)
        with atomic_open(out, "wb") as fh:
            pq.write_table(table, fh, **parquet_options(table.schema, compression))
        return False
    step = max(1, int(rows_per_part))
    with PartitionedWriter(out, compression=compression) as writer:
        for start in range(0, max(n, 1), step):
            writer.write({k: v[start:start + step] for k, v in columns.items()})
        if n == 0:  # an empty table still states its columns
            writer.write_empty(columns)
    return True
