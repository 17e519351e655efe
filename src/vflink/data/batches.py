"""A party's table read in record batches: CSV and Parquet through pyarrow datasets.

:func:`scan_frame` yields a table as :class:`TableBatch` es of at most ``batch_rows`` rows, so a
stage that streams (linkage encoding, key reading for PSI/PSU, the streamed search of
``benchmarks/search_memory.py``) never holds a whole table that is larger than memory;
:func:`scan_table` checks every batch against the party's schema as it arrives.

The oracle is :func:`vflink.data.table.read_frame`: the batches, concatenated, equal the whole
read (same columns, dtypes and values; ``tests/unit/data/test_batches.py`` checks it with
Hypothesis over batch sizes, for CSV and Parquet). Parquet batches keep the file's types. A
CSV is read by pyarrow with every cell as text, and the columns are typed as pandas types a
whole file: text columns (``text_columns``: keys) stay text with only the empty cell missing;
in the others pandas' missing-value strings (``NA``, ``null``, ``nan``...) are missing, and a
column is ``int64`` when every cell is an integer, ``float64`` when every cell is a number
(or an integer column has a missing cell), ``bool`` for ``True``/``False`` and text otherwise.
That decision needs the whole column, so a CSV with such columns is scanned twice (once for the
types, once for the batches); a scan of numeric-schema and text columns only needs one pass.
The delimiter (detected as :func:`read_frame` does), the text encoding and the decimal comma
work as for the whole read.
"""

from __future__ import annotations

import csv
import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vflink._files import table_format
from vflink.data.schema import PartySchema, check_decimal, check_delimiter, check_encoding
from vflink.data.schema import parse_delimiter as _parse_delimiter
from vflink.data.table import (
    _decode_message,
    _detect_delimiter,
    _open_bytes,
    missing_columns,
    validate_frame,
)
from vflink.errors import DataError

if TYPE_CHECKING:
    import pandas as pd

#: pyarrow's scanner reads ahead 16 batches of 4 files by default: at a million rows a batch
#: that alone holds hundreds of MiB, more the larger the table. One batch of one file ahead
#: keeps a scan's memory at about two batches whatever the table's size (memory flat in
#: table size at a fixed batch size); measured with benchmarks/search_memory.py.
READAHEAD = {"batch_readahead": 1, "fragment_readahead": 1}

__all__ = ["DEFAULT_BATCH_ROWS", "TableBatch", "read_frame_header", "scan_frame", "scan_table"]

log = logging.getLogger(__name__)

#: Rows per batch when none is given: the order of secretflow/psi's and FATE's buckets
#: (about 10^6 rows) divided by ten, as the engine's default chunk.
DEFAULT_BATCH_ROWS = 100_000


def _na_texts() -> frozenset[str]:
    """The texts pandas' CSV reader takes as missing (and the empty cell)."""
    from pandas._libs.parsers import STR_NA_VALUES

    return frozenset(STR_NA_VALUES) | {""}


_INT = re.compile(r"^[+-]?\d+$")
_BOOL = {"True": True, "TRUE": True, "true": True, "False": False, "FALSE": False,
         "false": False}


@dataclass(frozen=True, eq=False)
class TableBatch:
    """Rows ``offset .. offset + len(frame) - 1`` of a table (0-based, as ``bad_cells``
    counts them), and the batch's number (0-based) for messages."""

    offset: int
    number: int
    frame: pd.DataFrame

    def __len__(self) -> int:
        return len(self.frame)


def _kind(path: Path) -> str:
    """"csv", "tsv" or "parquet", from the file's bytes (:func:`vflink._files.table_format`)."""
    return table_format(path)


def scan_frame(path: Path | str, *, columns: Sequence[str] | None = None,
               text_columns: Sequence[str] = (), numeric_columns: Sequence[str] = (),
               delimiter: str | None = None, encoding: str | None = None,
               decimal: str | None = None, batch_rows: int = DEFAULT_BATCH_ROWS
               ) -> Iterator[TableBatch]:
    """The table at ``path`` (CSV/TSV/.csv.gz file, Parquet file or directory of Parquet
    parts) in batches of at most ``batch_rows`` rows; see the module docstring.

    ``columns``: read only these (default: all), checked against the header or the Parquet
    schema before any row is read (a missing one is a :class:`DataError` listing the columns
    the file has). ``text_columns``, ``delimiter``, ``encoding``, ``decimal``: as for
    :func:`~vflink.data.table.read_frame`. ``numeric_columns``: CSV columns the caller needs
    as numbers (the schema's numeric features, numeric identifiers): typed ``float64`` at once
    where every cell of the batch is a number, which spares the typing pass (a bad cell keeps
    its text, for the schema check to name it)."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path.absolute()}: file not found")
    if not isinstance(batch_rows, int) or isinstance(batch_rows, bool) or batch_rows < 1:
        raise DataError(f"`batch_rows` must be an int ≥ 1, got {batch_rows!r}")
    kind = _kind(path)
    problems: list[str] = []
    check_delimiter(problems, "delimiter", delimiter)
    check_encoding(problems, "encoding", encoding)
    check_decimal(problems, "decimal", decimal)
    if problems:
        raise DataError(f"{path}: " + "; ".join(problems), [f"{path}: {p}" for p in problems])
    if kind == "parquet":
        yield from _scan_parquet(path, columns, batch_rows)
    else:
        yield from _scan_csv(path, kind, columns, tuple(text_columns), tuple(numeric_columns),
                             delimiter, encoding, decimal, batch_rows)


def _scan_parquet(path: Path, columns: Sequence[str] | None, batch_rows: int
                  ) -> Iterator[TableBatch]:
    import pandas as pd
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    try:
        dataset = ds.dataset(str(path), format="parquet")
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise DataError(f"{path}: cannot be read as a parquet table: {exc}") from exc
    names = dataset.schema.names
    wanted = list(names) if columns is None else list(columns)
    missing = [c for c in wanted if c not in names]
    if missing:
        raise DataError(f"{path}: " + missing_columns(pd.DataFrame(columns=names), missing))
    offset = 0
    number = 0
    try:
        # File by file (the dataset's order), a row group at a time, without pre-buffering
        # and without the dataset scanner: both read ahead of a slow consumer (the checks,
        # the encoding) into memory that grows with the file (measured with 131,072-row
        # batches: the scanner 102 MiB at 3 x 10^6 rows against 41 MiB at 10^6; this reader
        # 33 MiB at both)
        for file in dataset.files:
            reader = pq.ParquetFile(file, pre_buffer=False)
            for batch in reader.iter_batches(batch_size=batch_rows, columns=wanted,
                                             use_threads=False):
                if batch.num_rows == 0:
                    continue
                # a batch may be smaller (one per row group); split only larger ones
                for start in range(0, batch.num_rows, batch_rows):
                    part = batch.slice(start, batch_rows)
                    frame = part.to_pandas()
                    yield TableBatch(offset, number, frame)
                    offset += len(frame)
                    number += 1
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise DataError(f"{path}: batch {number} (rows from {offset}): cannot be read as a "
                        f"parquet table: {exc}") from exc


def _csv_layout(path: Path, kind: str, delimiter: str | None, encoding: str | None,
                decimal: str | None) -> tuple[str, str, list[str]]:
    """(text codec, delimiter, header) of a CSV, the delimiter detected as ``read_frame``
    does."""
    codec = encoding or "utf-8-sig"
    default = "\t" if kind == "tsv" or path.name.lower().endswith(".tsv.gz") else (
        ";" if decimal == "," else ",")
    sep = _parse_delimiter(delimiter) if delimiter is not None else None
    if sep is None:
        sep = _detect_delimiter(path, codec, default)
        if sep != default:
            log.warning("%s: read with delimiter %r (detected; set delimiter = %r to say so)",
                        path, sep, sep)
    if sep == (decimal or "."):
        raise DataError(f"{path}: the delimiter and the decimal mark are both {sep!r}; give the "
                        "file's delimiter with delimiter = ...")
    try:
        with _open_bytes(path) as fh:
            first = fh.readline()
    except (OSError, EOFError) as exc:
        raise DataError(f"{path}: cannot be read as a {kind} table: {exc}") from exc
    try:
        line = first.decode(codec).rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise DataError(_decode_message(path, codec, sep, exc)) from None
    if not line.strip():
        raise DataError(f"{path}: the table is empty (no header and no rows)")
    header = next(csv.reader([line], delimiter=sep))
    return codec, sep, header


def read_frame_header(path: Path | str, *, delimiter: str | None = None,
                      encoding: str | None = None, decimal: str | None = None) -> list[str]:
    """The column names of a CSV/TSV or Parquet table, without reading its rows."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path.absolute()}: file not found")
    kind = _kind(path)
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.dataset as ds

        try:
            return list(ds.dataset(str(path), format="parquet").schema.names)
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise DataError(f"{path}: cannot be read as a parquet table: {exc}") from exc
    problems: list[str] = []
    check_delimiter(problems, "delimiter", delimiter)
    check_encoding(problems, "encoding", encoding)
    check_decimal(problems, "decimal", decimal)
    if problems:
        raise DataError(f"{path}: " + "; ".join(problems), [f"{path}: {p}" for p in problems])
    return _csv_layout(path, kind, delimiter, encoding, decimal)[2]


def _numbers(values: pd.Series, decimal: str | None) -> pd.Series:
    """``values`` (text, no missing cells) as float64; NaN where a cell is not a number."""
    import pandas as pd

    text = values.astype(object)
    if decimal == ",":
        # with a decimal comma, "1.5" is text (as pandas reads it) and "1,5" is 1.5
        dotted = text.str.contains(".", regex=False)
        text = text.str.replace(",", ".", regex=False).where(~dotted, "x")
    return pd.to_numeric(text, errors="coerce").astype(np.float64)


def _cell_kind(values: pd.Series, decimal: str | None) -> str:
    """What pandas would type a column whose present cells are ``values``: ``int``,
    ``float``, ``bool`` or ``text`` (``none`` without cells)."""
    if len(values) == 0:
        return "none"
    text = values.astype(object)
    if text.isin(list(_BOOL)).all():
        return "bool"
    if text.str.match(_INT).all():
        return "int"
    if _numbers(values, decimal).notna().all():
        return "float"
    return "text"


_ORDER = {"none": 0, "int": 1, "float": 2}


def _merge_kind(a: str, b: str) -> str:
    if a == "none":
        return b
    if b == "none" or a == b:
        return a
    if a in _ORDER and b in _ORDER:
        return a if _ORDER[a] > _ORDER[b] else b
    return "text"


def _typed(values: pd.Series, kind: str, has_na: bool, decimal: str | None) -> pd.Series:
    """A column of text cells (NaN = missing) typed as the whole read types it."""
    import pandas as pd

    present = values.notna()
    if kind == "none":
        return pd.Series(np.full(len(values), np.nan), index=values.index)
    if kind == "int" and not has_na:
        return values.astype(object).astype("int64")
    if kind in ("int", "float"):
        return _numbers(values.where(present, "nan"), decimal).where(present, np.nan)
    if kind == "bool":
        mapped = values.map(_BOOL)
        return mapped.astype(bool) if not has_na else mapped.astype(object).where(present,
                                                                                  np.nan)
    return values.astype("str")


def _scan_csv(path: Path, kind: str, columns: Sequence[str] | None, text: tuple[str, ...],
              numeric: tuple[str, ...], delimiter: str | None, encoding: str | None,
              decimal: str | None, batch_rows: int) -> Iterator[TableBatch]:
    import pandas as pd
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.dataset as ds

    codec, sep, header = _csv_layout(path, kind, delimiter, encoding, decimal)
    wanted = list(header) if columns is None else list(columns)
    missing = [c for c in wanted if c not in header]
    if missing:
        raise DataError(f"{path}: " + missing_columns(pd.DataFrame(columns=header), missing))
    # pyarrow reads UTF-8 natively (and skips a byte-order mark); other codecs are transcoded
    native = codec.lower().replace("_", "-") in ("utf-8", "utf8", "utf-8-sig")
    read = pacsv.ReadOptions(encoding="utf8" if native else codec, block_size=1 << 22)
    fmt = ds.CsvFileFormat(
        parse_options=pacsv.ParseOptions(delimiter=sep),
        read_options=read,
        convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in header},
                                             strings_can_be_null=False,
                                             quoted_strings_can_be_null=False))
    try:
        dataset = ds.dataset(str(path), format=fmt)
    except (OSError, ValueError, pa.ArrowException) as exc:
        if isinstance(exc, UnicodeDecodeError) or "utf8" in str(exc).lower():
            _raise_decode(path, codec, sep)
        raise DataError(f"{path}: cannot be read as a {kind} table (delimiter {sep!r}): {exc}"
                        ) from exc

    def text_batches() -> Iterator[tuple[int, int, pd.DataFrame]]:
        offset = number = 0
        try:
            for batch in dataset.to_batches(columns=wanted, batch_size=batch_rows, **READAHEAD):
                for start in range(0, batch.num_rows, batch_rows):
                    part = batch.slice(start, batch_rows)
                    frame = pd.DataFrame({c: part.column(c).to_numpy(zero_copy_only=False)
                                          for c in wanted})
                    for c in wanted:
                        na = frame[c].isin(("",) if c in text else _na_texts())
                        frame[c] = frame[c].where(~na, np.nan)
                    yield offset, number, frame
                    offset += len(frame)
                    number += 1
        except (OSError, ValueError, pa.ArrowException) as exc:
            if isinstance(exc, UnicodeDecodeError) or "utf8" in str(exc).lower():
                _raise_decode(path, codec, sep)
            raise DataError(f"{path}: batch {number} (rows from {offset}): cannot be read as a "
                            f"{kind} table (delimiter {sep!r}): {exc}") from exc

    # The columns whose type only the whole column decides (pandas types a whole file): one
    # pass over the file for them first; numeric-schema columns are typed per batch
    infer = [c for c in wanted if c not in text and c not in numeric]
    kinds = dict.fromkeys(infer, "none")
    has_na = dict.fromkeys(infer, False)
    if infer:
        for _, _, frame in text_batches():
            for c in infer:
                col = frame[c]
                has_na[c] = has_na[c] or bool(col.isna().any())
                if kinds[c] != "text":
                    kinds[c] = _merge_kind(kinds[c], _cell_kind(col.dropna(), decimal))
    for offset, number, frame in text_batches():
        out: dict[str, Any] = {}
        for c in wanted:
            col = frame[c]
            if c in text:
                out[c] = col.astype("str")
            elif c in kinds:
                out[c] = _typed(col, kinds[c], has_na[c], decimal)
            else:
                out[c] = _quick_number(col, decimal)
        yield TableBatch(offset, number, pd.DataFrame(out))


def _quick_number(col: pd.Series, decimal: str | None) -> pd.Series:
    """A numeric-schema column: float64 where every present cell is a number; else the text,
    for the schema check to name the bad cells."""
    present = col.notna()
    numbers = _numbers(col.where(present, "nan"), decimal).where(present, np.nan)
    if bool((numbers.notna() | ~present).all()):
        return numbers
    return col.astype("str")


def _raise_decode(path: Path, codec: str, sep: str) -> None:
    """The whole read's message for a byte that does not decode (line, column, fix); the
    file is scanned line by line for it."""
    decoder = __import__("codecs").getincrementaldecoder(codec)()
    try:
        with _open_bytes(path) as fh:
            for line in fh:
                decoder.decode(line)
    except UnicodeDecodeError as exc:
        raise DataError(_decode_message(path, codec, sep, exc)) from None
    raise DataError(f"{path}: is not valid {codec} text")


def scan_table(schema: PartySchema, path: Path | str | None = None, *,
               columns: Sequence[str] | None = None, batch_rows: int = DEFAULT_BATCH_ROWS
               ) -> Iterator[TableBatch]:
    """The party's table in batches, each checked against ``schema`` as it arrives.

    ``columns``: the schema's columns a stage needs (default: all of them); only they are read
    and checked. A batch with problems raises one :class:`DataError` listing all of them (the
    file, the batch, each column, the global row and CSV line of its first bad cells, what was
    expected), as :func:`~vflink.data.table.validate_frame` does for a whole table. Checks
    that need the whole table are left to the stage that holds it: the label's number of
    classes, and duplicate keys across batches (within a batch they are reported)."""
    path = Path(path) if path is not None else schema.path
    if path is None:
        raise DataError(f"party {schema.name!r}: no data file given")
    wanted = tuple(schema.columns) if columns is None else tuple(columns)
    unknown = [c for c in wanted if c not in schema.columns]
    if unknown:
        raise DataError(f"{path}: column(s) {unknown} are not in party {schema.name!r}'s schema")
    import dataclasses

    # the schema restricted to the columns read, so that the checks ask for nothing else; a
    # primary's scan without its label (identifiers or keys only) leaves the label's checks to
    # the read that holds it
    label = schema.label if schema.label in wanted else None
    keep_role = schema.role == "secondary" or label is not None
    sub = dataclasses.replace(
        schema, key=tuple(c for c in schema.key if c in wanted),
        identifiers=tuple(c for c in schema.identifiers if c in wanted),
        numeric=tuple(c for c in schema.numeric if c in wanted),
        categorical=tuple(c for c in schema.categorical if c in wanted), label=label,
        role=schema.role if keep_role else "secondary", task=schema.task if keep_role else None)
    n = 0
    for batch in scan_frame(path, columns=wanted, text_columns=sub.key,
                            numeric_columns=sub.numeric,
                            delimiter=schema.delimiter, encoding=schema.encoding,
                            decimal=schema.decimal, batch_rows=batch_rows):
        frame = validate_frame(batch.frame, sub, f"{path} (batch {batch.number})",
                               training=False, offset=batch.offset)
        n += len(frame)
        yield TableBatch(batch.offset, batch.number, frame)
    if n == 0:
        raise DataError(f"{path} (party {schema.name!r}): the table is empty; it needs at least "
                        "one row")
