"""A party's table read from its file in record batches, never held whole.

"A secondary with 10^7 rows trains within a fixed memory": the mapped feature store
(:mod:`vflink.data.featurestore`) bounds training itself, but a party that first reads its
whole table into a DataFrame still grows with it. A :class:`StreamedTable` is that party's
table behind the same interface as :class:`~vflink.data.table.PartyTable`, answering what a
training secondary asks from its file, a record batch at a time
(:func:`vflink.data.batches.scan_table`):

* opening it is one pass over the file: every batch checked against the schema as
  :func:`~vflink.data.table.load_table` checks the whole table (the same messages, with the
  batch and the table row), the rows counted, the data fingerprint hashed per batch (the same
  digest as the whole frame's: :class:`~vflink.data.fingerprint.FingerprintBuilder`) and
  duplicate keys across batches found from 8-byte row hashes (confirmed on the values);
* :meth:`~StreamedTable.take` gathers given rows (the preprocessing's training rows: they grow
  with the primary's records, not with this table), :meth:`~StreamedTable.select` reads given
  columns only (the keys for alignment), :meth:`~StreamedTable.batches` streams columns for
  the feature encoding;
* ``frame`` still works, for a stage that has no batched path yet: it reads the whole table
  (once, logged) exactly as :func:`~vflink.data.table.load_table` does.

What still grows with the table is 1 to 8 bytes per row: the duplicate check's key hashes
while the table is opened (8 bytes, sorted in place), the linked-rows mask and the privacy
counters of a secondary.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from vflink._files import table_format
from vflink.data.batches import scan_frame, scan_table
from vflink.data.featurestore import WRITE_CHUNK_ROWS, use_mmap
from vflink.data.fingerprint import FingerprintBuilder
from vflink.data.schema import PartySchema
from vflink.data.table import PartyTable, _open_bytes, load_table, report, validate_frame
from vflink.errors import DataError

__all__ = ["StreamedTable", "open_table"]

log = logging.getLogger(__name__)


def _checked(schema: PartySchema, path: Path, batch_rows: int
             ) -> Iterator[tuple[int, pd.DataFrame]]:
    """(offset, batch) of every column of the file, each batch checked against ``schema`` as
    :func:`~vflink.data.table.load_table` checks the whole table."""
    for batch in scan_frame(path, text_columns=schema.key, numeric_columns=schema.numeric,
                            delimiter=schema.delimiter, encoding=schema.encoding,
                            decimal=schema.decimal, batch_rows=batch_rows):
        yield batch.offset, validate_frame(batch.frame, schema,
                                           f"{path} (batch {batch.number})", training=False,
                                           offset=batch.offset)


def _key_hashes(frame: pd.DataFrame, key: Sequence[str]) -> npt.NDArray[Any]:
    """A 64-bit hash of each row's key (equal keys, equal hashes)."""
    return pd.util.hash_pandas_object(frame[list(key)], index=False).to_numpy(dtype=np.uint64)


class StreamedTable(PartyTable):
    """A party's validated table on disk, read in record batches (see the module docstring).

    Built by :meth:`open` (one checking pass over the file), not directly.
    """

    in_memory = False

    def __init__(self, schema: PartySchema, path: Path, *, n_rows: int,
                 column_names: tuple[str, ...], fingerprint: str,
                 batch_rows: int = WRITE_CHUNK_ROWS) -> None:
        # a frozen dataclass's fields, set once here (PartyTable's `frame` is a property below)
        object.__setattr__(self, "schema", schema)
        object.__setattr__(self, "source", str(path))
        object.__setattr__(self, "path", Path(path))
        object.__setattr__(self, "_n_rows", int(n_rows))
        object.__setattr__(self, "_columns", tuple(column_names))
        object.__setattr__(self, "_fingerprint", fingerprint)
        object.__setattr__(self, "batch_rows", int(batch_rows))
        object.__setattr__(self, "_whole", None)
        object.__setattr__(self, "_lock", threading.Lock())

    path: Path
    batch_rows: int
    _n_rows: int
    _columns: tuple[str, ...]
    _fingerprint: str
    _whole: pd.DataFrame | None
    _lock: threading.Lock

    @classmethod
    def open(cls, schema: PartySchema, path: Path | str | None = None, *,
             batch_rows: int = WRITE_CHUNK_ROWS, expected_rows: int = 0) -> StreamedTable:
        """Check the table at ``path`` (default ``schema.path``) batch by batch, count its
        rows and hash it; the same problems as :func:`~vflink.data.table.load_table` raise.
        ``expected_rows``: about how many rows (sizes the key hashes' buffer once)."""
        path = Path(path) if path is not None else schema.path
        if path is None:
            raise DataError(f"party {schema.name!r}: no data file given")
        fingerprint = FingerprintBuilder()
        # one 8-byte hash per row's key, in one buffer (a list of per-batch arrays would need
        # a second copy to concatenate): the only per-row memory of opening the table
        hashes = np.empty(max(int(expected_rows), 1) if schema.key else 0, dtype=np.uint64)
        n = 0
        columns: tuple[str, ...] = ()
        # every column, as the whole read holds them (the fingerprint covers them all)
        for _, frame in _checked(schema, path, batch_rows):
            if not columns:
                columns = tuple(str(c) for c in frame.columns)
            fingerprint.update(frame)
            if schema.key:
                if n + len(frame) > len(hashes):
                    hashes = np.resize(hashes, max(2 * len(hashes), n + len(frame)))
                hashes[n:n + len(frame)] = _key_hashes(frame, schema.key)
            n += len(frame)
        if n == 0:
            raise DataError(f"{path} (party {schema.name!r}): the table is empty; it needs at "
                            "least one row")
        table = cls(schema, path, n_rows=n, column_names=columns,
                    fingerprint=fingerprint.hexdigest(), batch_rows=batch_rows)
        if schema.key:
            hashes = hashes[:n]
            hashes.sort()  # in place
            repeated = np.unique(hashes[1:][hashes[1:] == hashes[:-1]])
            del hashes
            if repeated.size:
                table._check_unique_keys(repeated)
        log.info("%s: %d rows checked in batches of %d; read per batch from now on", path, n,
                 batch_rows)
        return table

    def _check_unique_keys(self, repeated: npt.NDArray[Any]) -> None:
        """Duplicate keys across batches (each batch's own were checked with it): the rows
        whose key hash is ``repeated`` (a second pass over the key columns), confirmed on the
        key values (a hash collision is not a duplicate)."""
        key = list(self.schema.key)
        found: list[npt.NDArray[np.int64]] = []
        offset = 0
        for frame in self.batches(key):
            found.append(offset + np.flatnonzero(np.isin(_key_hashes(frame, key), repeated)))
            offset += len(frame)
        candidates = np.concatenate(found)
        keys = self.take(candidates, key)
        dup_mask = keys.duplicated(keep=False).to_numpy()
        if not dup_mask.any():
            return
        dup = candidates[dup_mask]
        first = keys[dup_mask].iloc[0]
        rows = dup[(keys[dup_mask] == first).all(axis=1).to_numpy()][:2]
        value = tuple(first.tolist())
        raise report(f"{self.path} (party {self.schema.name!r})", [
            f"duplicate key {value!r} in column(s) {key} at rows {rows.tolist()} "
            f"({len(dup)} rows share a key); exact alignment needs unique keys"])

    # --- PartyTable's interface ---------------------------------------------------------------

    def __len__(self) -> int:
        return self._n_rows

    @property
    def column_names(self) -> tuple[str, ...]:
        return self._columns

    def fingerprint(self) -> str:
        return self._fingerprint

    @property  # type: ignore[override]
    def frame(self) -> pd.DataFrame:
        """The whole table, read once on first use (a stage without a batched path)."""
        with self._lock:
            whole = self._whole
            if whole is None:
                log.warning("%s: reading the whole table (%d rows) into memory for a stage "
                            "that needs all of it", self.path, self._n_rows)
                whole = load_table(self.schema, self.path).frame
                object.__setattr__(self, "_whole", whole)
            return whole

    def __repr__(self) -> str:  # the dataclass's repr would read the whole frame
        return (f"StreamedTable(party={self.schema.name!r}, source={self.source!r}, "
                f"rows={self._n_rows})")

    def batches(self, columns: Sequence[str] | None = None, *, batch_rows: int | None = None
                ) -> Iterator[pd.DataFrame]:
        """The schema's ``columns`` (default: every column of the file, as the whole read
        holds them), checked, a batch at a time."""
        size = batch_rows or self.batch_rows
        if columns is None:
            yield from (frame for _, frame in _checked(self.schema, self.path, size))
            return
        for batch in scan_table(self.schema, self.path, columns=columns, batch_rows=size):
            yield batch.frame

    def select(self, columns: Sequence[str]) -> pd.DataFrame:
        if not columns:
            return pd.DataFrame(index=pd.RangeIndex(self._n_rows))
        parts = list(self.batches(columns))
        return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]

    def take(self, rows: npt.NDArray[np.int64], columns: Sequence[str] | None = None
             ) -> pd.DataFrame:
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self._n_rows):
            raise DataError(f"{self.path}: rows outside [0, {self._n_rows})")
        if columns is not None and not columns:
            return pd.DataFrame(index=pd.RangeIndex(len(rows)))
        wanted = np.unique(rows)
        parts: list[pd.DataFrame] = []
        offset = 0
        for frame in self.batches(columns):
            lo, hi = np.searchsorted(wanted, [offset, offset + len(frame)])
            if hi > lo:
                parts.append(frame.iloc[wanted[lo:hi] - offset])
            offset += len(frame)
            if hi == len(wanted):
                break
        if not parts:  # no rows asked for: the columns, typed as a batch types them
            return next(self.batches(columns, batch_rows=1)).iloc[:0].reset_index(drop=True)
        picked = pd.concat(parts, ignore_index=True) if len(parts) > 1 else \
            parts[0].reset_index(drop=True)
        if len(wanted) == len(rows) and np.array_equal(wanted, rows):
            return picked
        return picked.iloc[np.searchsorted(wanted, rows)].reset_index(drop=True)


def _row_bound(path: Path) -> int | None:
    """At least the table's row count, cheaply: a Parquet table's from its metadata (no rows
    read), a CSV's as its line breaks (a quoted line break counts too: an upper bound);
    ``None`` if the file cannot say (the reader then names the problem)."""
    try:
        parquet = table_format(path) == "parquet"
    except DataError:
        return None  # the reader names the problem
    if not parquet:
        try:
            lines = 0
            with _open_bytes(path) as fh:
                while block := fh.read(1 << 20):
                    lines += block.count(b"\n")
            return lines
        except (OSError, EOFError):
            return None
    import pyarrow as pa
    import pyarrow.dataset as ds

    try:
        return int(ds.dataset(str(path), format="parquet").count_rows())
    except (OSError, ValueError, pa.ArrowException):
        return None  # the reader names the problem


def open_table(schema: PartySchema, path: Path | str | None = None, *, store: str = "auto",
               batch_rows: int = WRITE_CHUNK_ROWS) -> PartyTable:
    """A party's table as its training needs it: read in record batches
    (:class:`StreamedTable`) where ``store`` (``training.feature_store``) maps its features
    (``mmap``, or ``auto`` from :data:`~vflink.data.featurestore.MMAP_MIN_ROWS` rows), else
    read whole as always (:func:`~vflink.data.table.load_table`)."""
    use_mmap(store, 0)  # validates the name
    file = Path(path) if path is not None else schema.path
    if store == "memory" or file is None:
        return load_table(schema, file)
    bound = _row_bound(file)
    if bound is None or not use_mmap(store, bound):
        return load_table(schema, file)  # small: read whole, as always
    table = StreamedTable.open(schema, file, batch_rows=batch_rows, expected_rows=bound)
    if not use_mmap(store, len(table)):  # a CSV whose line breaks overstated its rows
        return load_table(schema, file)
    return table
