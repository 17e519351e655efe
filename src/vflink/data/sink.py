"""Write a table chunk by chunk into the very file :func:`vflink.data.parts.write_columns` (or
a CSV ``to_csv``) writes from the whole table, for the streamed ``vflink link``.

The output is byte for byte the one the whole table gives: a single Parquet file gets the row
groups ``pyarrow.parquet.write_table`` cuts (the chunks are re-cut to that length before each
``write_table`` of one ``ParquetWriter``); a partitioned dataset gets parts of ``PART_ROWS``
rows; a CSV gets one header and each row formatted on its own. Memory: one row group (or
part) of columns, whatever the table's length. Atomic, as every output (:mod:`vflink._files`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from vflink._files import atomic_open, reserve_space
from vflink.data.parts import (
    AUTO_PARTS_ROWS,
    PART_ROWS,
    PartitionedWriter,
    arrow_table,
    is_partitioned,
    parquet_bound,
    parquet_options,
)

__all__ = ["ROW_GROUP_ROWS", "ColumnSink"]

log = logging.getLogger(__name__)

#: pyarrow's default ``row_group_size`` of ``write_table`` (1024 × 1024 rows, pyarrow ≥ 15).
ROW_GROUP_ROWS = 1024 * 1024


class _Recut:
    """Collects chunks of columns and hands them on in pieces of exactly ``size`` rows."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._held: list[dict[str, Any]] = []
        self._rows = 0

    def push(self, columns: dict[str, Any]) -> Iterator[dict[str, Any]]:
        self._held.append(columns)
        self._rows += len(next(iter(columns.values())))
        while self._rows >= self.size:
            yield self._take(self.size)

    def rest(self) -> Iterator[dict[str, Any]]:
        if self._rows:
            yield self._take(self._rows)

    def _take(self, n: int) -> dict[str, Any]:
        first = self._held[0]
        if len(next(iter(first.values()))) >= n:  # no copy: views of the first chunk
            rest = {k: v[n:] for k, v in first.items()}
            self._held[0] = rest
            if not len(next(iter(rest.values()))):
                self._held.pop(0)
            self._rows -= n
            return {k: v[:n] for k, v in first.items()}
        keys = list(first)
        joined = {k: np.concatenate([np.asarray(c[k]) for c in self._held]) for k in keys}
        self._held = [{k: v[n:] for k, v in joined.items()}] if self._rows > n else []
        self._rows -= n
        return {k: v[:n] for k, v in joined.items()}


class ColumnSink:
    """``with ColumnSink(out, rows=n) as sink: sink.write(columns)`` for each chunk, in order.

    ``rows``: the table's total length, known beforehand (it decides, as in
    :func:`~vflink.data.parts.write_columns`, whether ``parts=None`` means parts); ``out``
    ending in ``.csv`` is written as ``DataFrame.to_csv(index=False, float_format="%.6g")``.

    Parquet is compressed and written beside the caller, which meanwhile makes the next chunk:
    the parts of a dataset by :class:`~vflink.data.parts.PartitionedWriter`'s threads, the
    row groups of a single file by one thread, in order. An error in a write surfaces at the
    next ``write`` or at the block's end, and the output is then not published.
    """

    def __init__(self, out: Path | str, *, rows: int, parts: bool | None = None,
                 compression: str = "lz4", metadata: dict[str, str] | None = None) -> None:
        self.out = Path(out)
        self.rows = rows
        self.metadata = metadata
        self.csv = self.out.suffix.lower() != ".parquet"
        if parts is None:
            parts = rows > AUTO_PARTS_ROWS or is_partitioned(self.out)
        self.parts = bool(parts) and not self.csv
        self.compression = compression
        self._stack = ExitStack()
        self._recut = _Recut(PART_ROWS if self.parts else ROW_GROUP_ROWS)
        self._target: Any = None
        self._writer: Any = None
        self._header = True
        self._pool: ThreadPoolExecutor | None = None
        self._last: Future[None] | None = None
        self._reserved = False

    def __enter__(self) -> ColumnSink:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        if self.parts:
            self._target = self._stack.enter_context(
                PartitionedWriter(self.out, compression=self.compression))
        elif self.csv:
            self._target = self._stack.enter_context(atomic_open(self.out, "w", newline=""))
        else:
            self._target = self._stack.enter_context(atomic_open(self.out, "wb"))
            # one thread keeps the row groups in order; registered after the file, so it is
            # shut down (its last write done) before the file is closed and published
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="vflink-sink")
            self._stack.callback(self._pool.shutdown, wait=True)
        return self

    def write(self, columns: Mapping[str, Any]) -> None:
        if self.csv:
            import pandas as pd

            pd.DataFrame(dict(columns)).to_csv(self._target, index=False, header=self._header,
                                         float_format="%.6g")
            self._header = False
            return
        for piece in self._recut.push(dict(columns)):
            self._emit(piece)

    def _emit(self, columns: dict[str, Any]) -> None:
        if self.parts:
            self._target.write(columns)
            return
        table = arrow_table(columns, self.metadata)
        if self._last is not None:
            self._last.result()  # one row group waits at most: memory stays one chunk
        if self._pool is None:  # pragma: no cover - made in __enter__
            raise RuntimeError("ColumnSink used outside its `with` block")
        self._last = self._pool.submit(self._write_group, table)

    def _write_group(self, table: Any) -> None:
        import pyarrow.parquet as pq

        if self._writer is None:
            # the whole file's space at once, from this first row group's bytes per row; cut
            # back to what was written when the file is complete (__exit__)
            per_row = table.nbytes / max(1, table.num_rows)
            self._reserved = reserve_space(self._target.fileno(),
                                           parquet_bound(int(per_row * max(self.rows, 1))))
            self._writer = pq.ParquetWriter(
                self._target, table.schema, **parquet_options(table.schema, self.compression))
        self._writer.write_table(table)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if kind is None and not self.csv:
                for piece in self._recut.rest():
                    self._emit(piece)
                if self._last is not None:
                    self._last.result()
                if self._writer is not None:
                    self._writer.close()
                if self._reserved:
                    self._target.truncate()  # at the end of the footer
        except BaseException as failed:  # a failed last write: nothing is published
            self._abandon()
            self._stack.__exit__(type(failed), failed, failed.__traceback__)
            raise
        if kind is not None:
            self._abandon()
        self._stack.__exit__(kind, exc, tb)

    def _abandon(self) -> None:
        """Stop the writer of a file that will not be published (its temporary file goes)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # noqa: BLE001 - the file is removed whatever its state
                log.debug("closing an abandoned Parquet writer failed", exc_info=True)
            self._writer = None
