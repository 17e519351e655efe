"""Loading a party's table from CSV or Parquet and checking it against its schema.

Bad input fails with one :class:`~vflink.errors.DataError` that names the file and lists every
problem found: each missing column, and the first few bad cells (row and value) of every bad
column, so the user can fix them all in one go.
"""

from __future__ import annotations

import csv
import gzip
import logging
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, cast

import numpy as np
import numpy.typing as npt

from vflink._files import table_format
from vflink.data.fingerprint import frame_fingerprint
from vflink.data.schema import (
    DELIMITERS,
    PartySchema,
    check_decimal,
    check_delimiter,
    check_encoding,
    parse_delimiter,
)
from vflink.errors import DataError
from vflink.types import Task

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

__all__ = ["NA_STRINGS", "PartyTable", "bad_cells", "decimal_hint", "has_column", "is_arrow",
           "load_table", "missing_columns", "numeric_column", "read_numeric_csv",
           "read_numeric_parquet", "select_columns", "take_rows",
           "read_frame", "report", "show_value", "validate_frame"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class PartyTable:
    """One party's validated table and the schema that describes it.

    ``source`` names where the rows came from (a path, or ``dataset:<name>``) for messages.
    ``frame``: a DataFrame; a link's party over numeric identifiers read from Parquet holds a
    pyarrow Table instead (:func:`read_numeric_parquet`), which ``len`` and :meth:`select`
    take, and the identifier functions (:func:`vflink.parties.linking.identifier_values`).
    """

    schema: PartySchema
    frame: pd.DataFrame | pa.Table
    source: str

    #: the whole table is in memory (``frame``); a :class:`~vflink.data.streamed.StreamedTable`
    #: reads its file in record batches instead (a table larger than memory)
    in_memory = True

    @property
    def name(self) -> str:
        return self.schema.name

    def __len__(self) -> int:
        return len(self.frame)

    # The methods below are what a stage that can work on part of a table asks for; a table
    # read in batches (vflink.data.streamed) answers them without holding the whole frame.

    @property
    def column_names(self) -> tuple[str, ...]:
        """Every column of the table (the schema's and any other the file holds)."""
        return tuple(str(c) for c in self.frame.columns)

    def select(self, columns: Sequence[str]) -> pd.DataFrame:
        """Only ``columns`` of every row (e.g. the key columns for alignment)."""
        return cast("pd.DataFrame", select_columns(self.frame, columns))

    def take(self, rows: npt.NDArray[np.int64], columns: Sequence[str] | None = None
             ) -> pd.DataFrame:
        """Rows ``rows`` (in that order) of ``columns`` (default: all), index 0..len-1."""
        frame = self.frame if columns is None else self.frame[list(columns)]
        return frame.iloc[np.asarray(rows, dtype=np.int64)].reset_index(drop=True)

    def batches(self, columns: Sequence[str] | None = None, *, batch_rows: int = 1 << 17
                ) -> Iterator[pd.DataFrame]:
        """Every row in order, ``batch_rows`` at a time (only ``columns``, default all)."""
        frame = self.frame if columns is None else self.frame[list(columns)]
        for start in range(0, len(frame), batch_rows):
            yield frame.iloc[start:start + batch_rows]

    def fingerprint(self) -> str:
        """The data fingerprint (:func:`vflink.data.fingerprint.frame_fingerprint`)."""
        return frame_fingerprint(self.frame)

    @classmethod
    def from_frame(cls, schema: PartySchema, frame: pd.DataFrame, source: str, *,
                   training: bool = True) -> PartyTable:
        """Validate ``frame`` against ``schema`` and wrap it (row order is preserved).

        ``training=False`` (new records to predict) skips the checks on the label's classes.
        """
        return cls(schema, validate_frame(frame.reset_index(drop=True), schema, source,
                                          training=training), source)


# --- a numeric Parquet table without pandas ----------------------------------------------------
#
# A link whose identifiers are numbers (Euclidean or great-circle distance) needs nothing of its
# tables but those columns as float64. Read from a Parquet file whose identifier columns are
# integers or floats, such a table stays a ``pyarrow.Table`` (:func:`read_numeric_parquet`):
# the link then never imports pandas, 0.2 s of every ``vflink link`` on the house-scale points
# (measured: 0.18-0.21 s after numpy and pyarrow.parquet). The few operations the numeric
# identifier path asks of a table take either kind (:func:`has_column`, :func:`take_rows`,
# :func:`select_columns`, :func:`vflink.parties.linking.identifier_values`).


def is_arrow(frame: object) -> bool:
    """Whether ``frame`` is a ``pyarrow.Table`` (without importing pyarrow: a table of it
    exists only once it is imported)."""
    pa = sys.modules.get("pyarrow")
    return pa is not None and isinstance(frame, pa.Table)


def numeric_column(table: pa.Table, name: str) -> npt.NDArray[np.float64]:
    """An integer or float column of a pyarrow Table as float64, a null as NaN (as pandas
    reads it). From the column's buffers: pyarrow's own ``to_numpy`` imports pandas."""
    import pyarrow as pa

    column = table.column(name)
    kind = column.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        raise TypeError(f"column {name!r} is {kind}, not integers or floats")
    code = "f" if pa.types.is_floating(kind) else ("i" if pa.types.is_signed_integer(kind)
                                                   else "u")
    dtype = np.dtype(f"{code}{kind.bit_width // 8}")
    out = np.empty(len(column), dtype=np.float64)
    at = 0
    for chunk in column.chunks:
        n, start = len(chunk), chunk.offset
        validity, data = chunk.buffers()[:2]
        part = out[at:at + n]
        if n:
            part[:] = np.frombuffer(data, dtype=dtype, count=start + n)[start:]
        if chunk.null_count:
            bits = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little")
            part[~bits[start:start + n].astype(bool)] = np.nan
        at += n
    return out


def has_column(frame: pd.DataFrame | pa.Table, name: str) -> bool:
    return name in (frame.column_names if is_arrow(frame) else frame.columns)


def take_rows(frame: pd.DataFrame | pa.Table, keep: npt.NDArray[np.bool_]
              ) -> pd.DataFrame | pa.Table:
    """The rows ``keep`` selects, in order, numbered again from 0."""
    if is_arrow(frame):
        return cast("pa.Table", frame).take(np.flatnonzero(keep))
    return cast("pd.DataFrame", frame)[keep].reset_index(drop=True)


def select_columns(frame: pd.DataFrame | pa.Table, columns: Sequence[str]
                   ) -> pd.DataFrame | pa.Table:
    if is_arrow(frame):
        return cast("pa.Table", frame).select(list(columns))
    return cast("pd.DataFrame", frame)[list(columns)]


def read_numeric_parquet(path: Path, columns: Sequence[str]) -> pa.Table | None:
    """The Parquet file ``path`` as a ``pyarrow.Table`` (every column, as
    :func:`read_frame` reads it) when each of ``columns`` is in it as integers or floats;
    ``None`` otherwise (a missing column, text, a file that is not Parquet or cannot be read:
    :func:`read_frame` then reads it and names the problem)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not columns or not path.is_file() or table_format(path) != "parquet":
        return None
    try:
        file = pq.ParquetFile(path)
        schema = file.schema_arrow
        if not all(name in schema.names and (pa.types.is_integer(schema.field(name).type)
                                             or pa.types.is_floating(schema.field(name).type))
                   for name in columns):
            return None
        return file.read()
    except (OSError, ValueError, KeyError, pa.ArrowException):
        return None


def read_frame(path: Path, *, text_columns: tuple[str, ...] = (), delimiter: str | None = None,
               encoding: str | None = None, decimal: str | None = None) -> pd.DataFrame:
    """Read a CSV/TSV (optionally gzipped) or Parquet file, translating reader errors.

    ``text_columns`` are read from CSV as text, so keys such as ``"007"`` keep leading zeros,
    ``"19151111"`` is not turned into a float and the country code ``"NA"`` is not read as
    missing: in those columns only an empty cell is missing. Parquet columns keep their types.

    ``delimiter``: the CSV's delimiter; ``None`` detects it among ``, ; \\t |`` on the first
    lines (falling back to ``,``, or a tab for ``.tsv``) and logs which was used.
    ``encoding``: the CSV's text encoding (default UTF-8, a byte-order mark skipped); a byte
    that does not decode is reported with its line and column. ``decimal``: ``","`` for
    numbers written ``1,5`` (default ``"."``).
    """
    import pandas as pd

    path = Path(path)
    if not path.exists():
        raise DataError(f"{path.absolute()}: file not found")
    if path.is_dir():
        raise DataError(f"{path}: is a directory, expected a CSV or Parquet file")
    kind = table_format(path)  # from the file's bytes, not its name
    problems: list[str] = []
    check_delimiter(problems, "delimiter", delimiter)
    check_encoding(problems, "encoding", encoding)
    check_decimal(problems, "decimal", decimal)
    if problems:
        raise DataError(f"{path}: " + "; ".join(problems), [f"{path}: {p}" for p in problems])
    if kind == "parquet":
        try:
            return pd.read_parquet(path)
        except (OSError, ValueError) as exc:
            raise DataError(f"{path}: cannot be read as a parquet table: {exc}") from exc
    codec = encoding or "utf-8-sig"  # UTF-8; a byte-order mark (Excel's "CSV UTF-8") skipped
    default = _default_delimiter(path, kind, decimal)
    sep = parse_delimiter(delimiter) if delimiter is not None else None
    try:
        if sep is None:
            sep = _detect_delimiter(path, codec, default)
            _log_delimiter(path, sep, default)
        if sep == (decimal or "."):
            raise DataError(f"{path}: the delimiter and the decimal mark are both {sep!r}; "
                            "give the file's delimiter with delimiter = ...")
        if not text_columns:
            return pd.read_csv(path, sep=sep, low_memory=False, encoding=codec,
                               decimal=decimal or ".")
        header = [str(c) for c in pd.read_csv(path, sep=sep, nrows=0, encoding=codec).columns]
        text = set(text_columns)
        # pandas' default missing-value strings ("NA", "null", "nan", ...) apply to every other
        # column; in text columns only the empty cell is missing.
        from pandas._libs.parsers import STR_NA_VALUES

        na_values = {c: ([""] if c in text else sorted(STR_NA_VALUES)) for c in header}
        return pd.read_csv(path, sep=sep, low_memory=False, keep_default_na=False,
                           na_values=na_values, dtype={c: str for c in header if c in text},
                           encoding=codec, decimal=decimal or ".")
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: the table is empty (no header and no rows)") from None
    except UnicodeDecodeError as exc:
        raise DataError(_decode_message(path, codec, sep or default, exc)) from None
    except DataError:
        raise
    except (pd.errors.ParserError, OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot be read as a {kind} table (delimiter {sep!r}): {exc}"
                        ) from exc


def _default_delimiter(path: Path, kind: str, decimal: str | None) -> str:
    """A CSV's delimiter unless its first lines show another: a tab for TSV, ``;`` where
    numbers are written ``1,5``, else ``,``."""
    return "\t" if kind == "tsv" or path.name.lower().endswith(".tsv.gz") else (
        ";" if decimal == "," else ",")


def _log_delimiter(path: Path, sep: str, default: str) -> None:
    if sep != default:
        log.warning("%s: read with delimiter %r (detected; set delimiter = %r to say so)", path,
                    sep, sep)
    else:
        log.info("%s: read with delimiter %r", path, sep)


#: pandas' own missing-value strings (``pandas._libs.parsers.STR_NA_VALUES``), which
#: :func:`read_frame` leaves pandas to apply to a column of numbers: the cells
#: :func:`read_numeric_csv` reads as missing too (pandas is not imported for them).
NA_STRINGS = ("", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND",
              "1.#QNAN", "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null")


def read_numeric_csv(path: Path, columns: Sequence[str], *, delimiter: str | None = None,
                     encoding: str | None = None, decimal: str | None = None
                     ) -> pa.Table | None:
    """The CSV or TSV file ``path`` as a ``pyarrow.Table`` of float64 ``columns`` (read by
    pyarrow's parser, on one thread per core) when each of them is in it and each of their
    cells is a number or one of pandas' missing-value strings (:data:`NA_STRINGS`: a null,
    then NaN, as :func:`read_frame` gives it); ``None`` otherwise, and for a text encoding
    other than UTF-8 or a decimal comma (:func:`read_frame` then reads the file and names any
    problem). The delimiter is found as :func:`read_frame` finds it.

    A house-scale table of coordinates (141,050 rows, 5 MB) took 0.31 s through pandas in
    ``vflink link``, most of it pandas' import; pyarrow, loaded for the link anyway, reads
    it in a few hundredths. The numbers are the same: both parsers round a decimal to the
    nearest float64 (a million values written by ``repr`` and with 6 decimals, compared).
    """
    import pyarrow as pa
    import pyarrow.csv as pc

    path = Path(path)
    codec = (encoding or "utf-8-sig").lower().replace("_", "-")
    if (not columns or not path.is_file() or decimal not in (None, ".")
            or codec not in ("utf-8", "utf8", "utf-8-sig")):
        return None
    try:
        kind = table_format(path)
        if kind not in ("csv", "tsv"):
            return None
        default = _default_delimiter(path, kind, decimal)
        sep = (parse_delimiter(delimiter) if delimiter is not None
               else _detect_delimiter(path, "utf-8-sig", default))
        if sep is None or sep == ".":  # an invalid delimiter: read_frame names it
            return None
        table = pc.read_csv(
            path, read_options=pc.ReadOptions(use_threads=True),
            parse_options=pc.ParseOptions(delimiter=sep, newlines_in_values=True),
            convert_options=pc.ConvertOptions(
                column_types={c: pa.float64() for c in columns}, null_values=list(NA_STRINGS)))
    except (OSError, ValueError, UnicodeError, DataError, pa.ArrowException):
        return None
    names = table.column_names
    if len(set(names)) != len(names) or not all(c in names for c in columns):
        return None  # pandas would rename a repeated name ("a.1"); a missing one is named
    if any(int(np.isnan(numeric_column(table, c)).sum()) > table.column(c).null_count
           for c in columns):
        # a NaN that is not a null: pyarrow reads "NAN", "Nan" or "+nan" so, pandas only its
        # own missing-value strings (nulls here) and such a cell as text (pyarrow.compute's
        # is_nan would take 0.044 s to import)
        return None
    if delimiter is None:
        _log_delimiter(path, sep, default)
    return table


#: Bytes read to detect a delimiter.
_SAMPLE_BYTES = 64 * 1024


def _open_bytes(path: Path) -> IO[bytes]:
    if path.name.lower().endswith(".gz"):
        return cast("IO[bytes]", gzip.open(path, "rb"))
    return open(path, "rb")


def _detect_delimiter(path: Path, encoding: str, default: str) -> str:
    """The delimiter of the CSV at ``path``: ``default`` when its first lines split on it into
    the same number (> 1) of fields, else what :class:`csv.Sniffer` finds among
    :data:`DELIMITERS`, else ``default``."""
    with _open_bytes(path) as fh:
        raw = fh.read(_SAMPLE_BYTES)
        complete = len(raw) < _SAMPLE_BYTES
    text = raw.decode(encoding, errors="replace")
    lines = text.splitlines()
    if not complete and len(lines) > 1:
        lines = lines[:-1]  # the last line may be cut
    lines = [line for line in lines if line.strip()][:100]
    if not lines:
        return default

    def fields(delim: str) -> set[int]:
        return {len(row) for row in csv.reader(lines, delimiter=delim)}

    counts = fields(default)
    if len(counts) == 1 and counts.pop() > 1:
        return default
    try:
        found = csv.Sniffer().sniff("\n".join(lines), delimiters="".join(DELIMITERS)).delimiter
    except csv.Error:
        return default
    header = next(csv.reader(lines[:1], delimiter=found))
    return found if len(header) > 1 else default


def _decode_message(path: Path, encoding: str, delimiter: str, exc: UnicodeDecodeError) -> str:
    """Name the line (1-based, the header is line 1), the column and the byte that does not
    decode, and the fix."""
    name = "utf-8" if encoding == "utf-8-sig" else encoding
    byte = exc.object[exc.start:exc.start + 1].hex() if exc.object else ""
    fix = ('the file is not in that encoding: give its encoding, e.g. encoding = "latin-1" '
           '(or "cp1252" for files from Windows) in the party, run or link file, or '
           "--encoding latin-1")
    try:
        with _open_bytes(path) as fh:
            if fh.read(2) in (b"\xff\xfe", b"\xfe\xff"):
                return (f"{path}: the file is UTF-16 (it starts with a UTF-16 byte-order mark), "
                        f"not {name}: give encoding = \"utf-16\" in the party, run or link "
                        "file, or --encoding utf-16")
            fh.seek(0)
            for number, line in enumerate(fh, start=1):
                try:
                    line.decode(encoding)
                except UnicodeDecodeError as bad:
                    prefix = line[:bad.start].decode(encoding, errors="replace")
                    cells = next(csv.reader([prefix], delimiter=delimiter), [""])
                    position = len(cells) - 1
                    where = f"column {position + 1}"
                    if number > 1:
                        fh.seek(0)
                        head = fh.readline().decode(encoding, errors="replace").rstrip("\r\n")
                        names = next(csv.reader([head], delimiter=delimiter), [])
                        if position < len(names):
                            where = f"column {names[position]!r}"
                    char = len(prefix) + 1
                    return (f"{path}: line {number}, {where} (character {char}): byte "
                            f"0x{line[bad.start:bad.start + 1].hex()} is not valid {name}; {fix}")
    except (OSError, EOFError):
        pass
    return f"{path}: byte 0x{byte} is not valid {name} ({exc.reason}); {fix}"


def load_table(schema: PartySchema, path: Path | None = None) -> PartyTable:
    """Read and validate the table of a party from ``path`` (or ``schema.path``)."""
    path = Path(path) if path is not None else schema.path
    if path is None:
        raise DataError(f"party {schema.name!r}: no data file given")
    frame = read_frame(path, text_columns=schema.key, delimiter=schema.delimiter,
                       encoding=schema.encoding, decimal=schema.decimal)
    return PartyTable(schema, validate_frame(frame, schema, str(path)), str(path))


#: Bad cells shown per column in a data error (the number of all of them is given too).
MAX_EXAMPLES = 3


def show_value(value: object) -> str:
    """A cell as the user wrote it: numbers as numbers (``nan``, ``1.5``), text quoted."""
    import pandas as pd

    if isinstance(value, np.generic):
        value = value.item()  # np.float64(nan) → nan: messages speak the user's language
    if value is None or value is pd.NA or value is pd.NaT:
        return "missing"
    if isinstance(value, (bool, int, float)):
        return repr(value)
    return repr(str(value)) if isinstance(value, str) else repr(value)


def bad_cells(frame: pd.DataFrame, mask: np.ndarray, column: str, *, offset: int = 0) -> str:
    """The first few flagged cells of ``column``: row, CSV line and value, and how many; and
    the ``decimal = ","`` hint when every flagged cell is a number with a decimal comma (so
    that every message about cells that are not numbers gives it, whichever command reads).

    ``offset``: the table row of ``frame``'s first row (a batch of a larger table)."""
    rows = np.flatnonzero(mask)
    # +2: one for the header line, one because people count rows from 1.
    shown = "; ".join(f"row {r + offset} (line {r + offset + 2} of a CSV), value "
                      f"{show_value(frame[column].iloc[r])}" for r in rows[:MAX_EXAMPLES])
    more = f" ({len(rows)} rows in all)" if len(rows) > MAX_EXAMPLES else ""
    return f"first at {shown}{more}{decimal_hint(frame[column].iloc[rows])}"


_DECIMAL_COMMA = r"^\s*[-+]?\d+,\d+\s*$"


def decimal_hint(values: pd.Series) -> str:
    """A hint when the bad cells are numbers written with a decimal comma (``1,5``)."""
    text = values.dropna().astype(str)
    if len(text) and text.str.match(_DECIMAL_COMMA).all():
        return ("; these look like numbers with a decimal comma: set decimal = \",\" in the "
                "party, run or link file (or --decimal , for vflink link and predict)")
    return ""


def missing_columns(frame: pd.DataFrame, columns: Sequence[str], what: str = "column") -> str:
    """The problem text for ``columns`` that the configuration names but the table lacks."""
    have = ", ".join(map(str, frame.columns))
    hint = ""
    if len(frame.columns) == 1:  # a header read as one column: the delimiter is not the file's
        used = [d for d in DELIMITERS if d in str(frame.columns[0])]
        if used:
            hint = (f"; the header was read as one column, so the file seems to use {used[0]!r} "
                    f"as its delimiter: set delimiter = {used[0]!r} (or --delimiter)")
    return (f"{what}(s) {list(columns)} expected but missing from the table; "
            f"this table has: {have}{hint}")


def report(where: str | None, problems: Sequence[str]) -> DataError:
    """One :class:`DataError` carrying every problem of a table (ARCHITECTURE.md, conv. 6);
    ``where=None`` for problems that already name their table (several tables of a run)."""
    if where is None:
        if len(problems) == 1:
            return DataError(problems[0], problems)
        listing = "\n  - ".join(problems)
        return DataError(f"{len(problems)} data problems:\n  - {listing}", problems)
    if len(problems) == 1:
        return DataError(f"{where}: {problems[0]}", [f"{where}: {problems[0]}"])
    listing = "\n  - ".join(problems)
    return DataError(f"{where} ({len(problems)} problems):\n  - {listing}",
                     [f"{where}: {p}" for p in problems])


def validate_frame(frame: pd.DataFrame, schema: PartySchema, source: str, *,
                   training: bool = True, offset: int = 0) -> pd.DataFrame:
    """Check ``frame`` against ``schema`` and return it with numeric columns as float64.

    Every problem is collected and raised as one :class:`DataError` (its ``problems`` list
    them): each column the schema names but the table lacks, and the first few bad cells of
    every bad column. ``offset``: the table row of ``frame``'s first row, when it is a batch
    of a larger table (:mod:`vflink.data.batches`); messages give table rows.
    """
    import pandas as pd

    where = f"{source} (party {schema.name!r})"
    if len(frame) == 0:
        raise DataError(f"{where}: the table is empty; it needs at least one row")
    problems: list[str] = []
    if schema.role == "secondary" and schema.label is not None:
        problems.append(
            f"column {schema.label!r} is configured as a label, but party "
            f"{schema.name!r} is a secondary party; only the primary party may hold labels"
        )
    missing = [c for c in schema.columns if c not in frame.columns]
    if missing:
        problems.append(missing_columns(frame, missing))
    frame = frame.copy()
    for col in schema.numeric:
        if col in missing:
            continue
        values = frame[col]
        if not pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
            coerced = pd.to_numeric(values, errors="coerce")
            bad = coerced.isna().to_numpy() & values.notna().to_numpy()
            if bad.any():
                problems.append(f"column {col!r} is numeric but holds non-numeric values, "
                                f"{bad_cells(frame, bad, col, offset=offset)}")
                continue
            values = coerced
        arr = values.to_numpy(dtype=np.float64, na_value=np.nan)
        inf = np.isinf(arr)
        if inf.any():
            problems.append(f"column {col!r} holds infinite values, "
                            f"{bad_cells(frame, inf, col, offset=offset)}")
            continue
        frame[col] = arr
    for col in schema.categorical:
        if col not in missing:
            frame[col] = frame[col].astype("string")
    if schema.label is not None and schema.role == "primary" and schema.label not in missing:
        problems.extend(_label_problems(frame, schema, schema.label, training, offset))
    if schema.key and not any(c in missing for c in schema.key):
        keys = frame[list(schema.key)]
        for col in schema.key:
            nan = frame[col].isna().to_numpy()
            if nan.any():
                problems.append(f"key column {col!r} has missing values, "
                                f"{bad_cells(frame, nan, col, offset=offset)}")
        dup = keys.duplicated(keep=False).to_numpy() & keys.notna().all(axis=1).to_numpy()
        if dup.any():
            rows = np.flatnonzero(dup)[:2]
            value = tuple(keys.iloc[int(rows[0])].tolist())
            problems.append(
                f"duplicate key {value!r} in column(s) {list(schema.key)} at rows "
                f"{(rows + offset).tolist()} ({int(dup.sum())} rows share a key); exact "
                "alignment needs unique keys"
            )
    if problems:
        raise report(where, problems)
    return frame


def _label_problems(frame: pd.DataFrame, schema: PartySchema, label: str, training: bool,
                    offset: int = 0) -> list[str]:
    """Checks the primary's label column; converts a regression label to float64 in place."""
    import pandas as pd

    lab = frame[label]
    nan = lab.isna().to_numpy()
    if nan.any():
        return [f"label column {label!r} has missing (NaN) values, "
                f"{bad_cells(frame, nan, label, offset=offset)}"]
    if schema.task is Task.REGRESSION:
        coerced = pd.to_numeric(lab, errors="coerce")
        bad = coerced.isna().to_numpy()
        if bad.any():
            return [f"regression label {label!r} is not numeric, "
                    f"{bad_cells(frame, bad, label, offset=offset)}"]
        inf = np.isinf(coerced.to_numpy(dtype=np.float64))
        if inf.any():  # caught here, not after training inside a metric
            return [f"regression label {label!r} holds infinite values, "
                    f"{bad_cells(frame, inf, label, offset=offset)}"]
        frame[label] = coerced.astype(np.float64)
    elif training:
        n_classes = lab.nunique()
        if n_classes < 2:
            return [f"label {label!r} has {n_classes} class; a "
                    f"{schema.task.value if schema.task else 'classification'} task needs ≥ 2"]
        if schema.task is Task.BINARY and n_classes != 2:
            return [f"task is binary but label {label!r} has {n_classes} classes: "
                    f"{sorted(map(str, lab.unique()))[:10]}"]
    return []


def iter_parquet_columns(path: Path, columns: Sequence[str], *, batch_rows: int = 1_000_000
                         ) -> Iterator[pd.DataFrame]:
    """The named columns of a Parquet file (or a directory of Parquet parts) in record batches
    of at most ``batch_rows`` rows (pyarrow datasets): a table wider or longer than
    memory can be scanned for a few columns. The schema is checked before any row is read: a
    missing column is a :class:`DataError` naming the file and the columns it has."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    try:
        dataset = ds.dataset(str(path), format="parquet")
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise DataError(f"{path}: cannot be read as a parquet table: {exc}") from exc
    names = dataset.schema.names
    missing = [c for c in columns if c not in names]
    if missing:
        raise DataError(f"{path}: column(s) {missing} not found; columns: {names[:20]}")
    try:
        for batch in dataset.to_batches(columns=list(columns), batch_size=batch_rows):
            yield batch.to_pandas()
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise DataError(f"{path}: cannot be read as a parquet table: {exc}") from exc
