"""Loading a party's table from CSV or Parquet and checking it against its schema.

Bad input fails fast with a :class:`~vflink.errors.DataError` that names the file, the column
and an example row, so the user can find and fix it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from pandas._libs.parsers import STR_NA_VALUES

from vflink.data.schema import PartySchema
from vflink.errors import DataError
from vflink.types import Task

__all__ = ["PartyTable", "load_table", "read_frame", "validate_frame"]

_READERS = {".csv": "csv", ".tsv": "tsv", ".gz": "csv", ".parquet": "parquet", ".pq": "parquet"}


@dataclass(frozen=True, eq=False)
class PartyTable:
    """One party's validated table and the schema that describes it.

    ``source`` names where the rows came from (a path, or ``dataset:<name>``) for messages.
    """

    schema: PartySchema
    frame: pd.DataFrame
    source: str

    @property
    def name(self) -> str:
        return self.schema.name

    def __len__(self) -> int:
        return len(self.frame)

    @classmethod
    def from_frame(cls, schema: PartySchema, frame: pd.DataFrame, source: str, *,
                   training: bool = True) -> PartyTable:
        """Validate ``frame`` against ``schema`` and wrap it (row order is preserved).

        ``training=False`` (new records to predict) skips the checks on the label's classes.
        """
        return cls(schema, validate_frame(frame.reset_index(drop=True), schema, source,
                                          training=training), source)


def read_frame(path: Path, *, text_columns: tuple[str, ...] = ()) -> pd.DataFrame:
    """Read a CSV/TSV (optionally gzipped) or Parquet file, translating reader errors.

    ``text_columns`` are read from CSV as text, so keys such as ``"007"`` keep leading zeros,
    ``"19151111"`` is not turned into a float and the country code ``"NA"`` is not read as
    missing: in those columns only an empty cell is missing. Parquet columns keep their types.
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: file not found")
    if path.is_dir():
        raise DataError(f"{path}: is a directory, expected a CSV or Parquet file")
    suffix = path.suffix.lower()
    kind = _READERS.get(suffix)
    if kind is None:
        raise DataError(
            f"{path}: unsupported file type {suffix!r}; expected .csv, .tsv, .csv.gz or .parquet"
        )
    try:
        if kind == "parquet":
            return pd.read_parquet(path)
        sep = "\t" if kind == "tsv" or path.name.lower().endswith(".tsv.gz") else ","
        if not text_columns:
            return pd.read_csv(path, sep=sep, low_memory=False)
        header = [str(c) for c in pd.read_csv(path, sep=sep, nrows=0).columns]
        text = set(text_columns)
        # pandas' default missing-value strings ("NA", "null", "nan", ...) apply to every other
        # column; in text columns only the empty cell is missing.
        na_values = {c: ([""] if c in text else sorted(STR_NA_VALUES)) for c in header}
        return pd.read_csv(path, sep=sep, low_memory=False, keep_default_na=False,
                           na_values=na_values, dtype={c: str for c in header if c in text})
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: the table is empty (no header and no rows)") from None
    except (pd.errors.ParserError, UnicodeDecodeError, OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot be read as a {kind} table: {exc}") from exc


def load_table(schema: PartySchema, path: Path | None = None) -> PartyTable:
    """Read and validate the table of a party from ``path`` (or ``schema.path``)."""
    path = Path(path) if path is not None else schema.path
    if path is None:
        raise DataError(f"party {schema.name!r}: no data file given")
    frame = read_frame(path, text_columns=schema.key)
    return PartyTable(schema, validate_frame(frame, schema, str(path)), str(path))


def _example(frame: pd.DataFrame, mask: np.ndarray, column: str) -> str:
    row = int(np.flatnonzero(mask)[0])
    # +2: one for the header line, one because people count rows from 1.
    return f"first at row {row} (line {row + 2} of a CSV), value {frame[column].iloc[row]!r}"


def validate_frame(frame: pd.DataFrame, schema: PartySchema, source: str, *,
                   training: bool = True) -> pd.DataFrame:
    """Check ``frame`` against ``schema`` and return it with numeric columns as float64."""
    where = f"{source} (party {schema.name!r})"
    if len(frame) == 0:
        raise DataError(f"{where}: the table is empty; it needs at least one row")
    if schema.role == "secondary" and schema.label is not None:
        raise DataError(
            f"{where}: column {schema.label!r} is configured as a label, but party "
            f"{schema.name!r} is a secondary party; only the primary party may hold labels"
        )
    missing = [c for c in schema.columns if c not in frame.columns]
    if missing:
        have = ", ".join(map(str, frame.columns[:20]))
        raise DataError(f"{where}: unknown column(s) {missing}; the table has: {have}")
    frame = frame.copy()
    for col in schema.numeric:
        values = frame[col]
        if not pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
            coerced = pd.to_numeric(values, errors="coerce")
            bad = coerced.isna().to_numpy() & values.notna().to_numpy()
            if bad.any():
                raise DataError(
                    f"{where}: column {col!r} is numeric but holds a non-numeric value, "
                    f"{_example(frame, bad, col)}"
                )
            values = coerced
        arr = values.to_numpy(dtype=np.float64, na_value=np.nan)
        inf = np.isinf(arr)
        if inf.any():
            raise DataError(f"{where}: column {col!r} holds an infinite value, "
                            f"{_example(frame, inf, col)}")
        frame[col] = arr
    for col in schema.categorical:
        frame[col] = frame[col].astype("string")
    if schema.label is not None and schema.role == "primary":
        lab = frame[schema.label]
        nan = lab.isna().to_numpy()
        if nan.any():
            raise DataError(f"{where}: label column {schema.label!r} has a missing (NaN) value, "
                            f"{_example(frame, nan, schema.label)}")
        if schema.task is Task.REGRESSION:
            coerced = pd.to_numeric(lab, errors="coerce")
            bad = coerced.isna().to_numpy()
            if bad.any():
                raise DataError(f"{where}: regression label {schema.label!r} is not numeric, "
                                f"{_example(frame, bad, schema.label)}")
            frame[schema.label] = coerced.astype(np.float64)
        elif training:
            n_classes = lab.nunique()
            if n_classes < 2:
                raise DataError(
                    f"{where}: label {schema.label!r} has {n_classes} class; a "
                    f"{schema.task.value if schema.task else 'classification'} task needs ≥ 2"
                )
            if schema.task is Task.BINARY and n_classes != 2:
                raise DataError(f"{where}: task is binary but label {schema.label!r} has "
                                f"{n_classes} classes: {sorted(map(str, lab.unique()))[:10]}")
    if schema.key:
        keys = frame[list(schema.key)]
        nan = keys.isna().any(axis=1).to_numpy()
        if nan.any():
            col = next(c for c in schema.key if frame[c].isna().any())
            raise DataError(f"{where}: key column {col!r} has a missing value, "
                            f"{_example(frame, frame[col].isna().to_numpy(), col)}")
        dup = keys.duplicated(keep=False).to_numpy()
        if dup.any():
            rows = np.flatnonzero(dup)[:2]
            value = tuple(keys.iloc[int(rows[0])].tolist())
            raise DataError(
                f"{where}: duplicate key {value!r} in column(s) {list(schema.key)} at rows "
                f"{rows.tolist()}; exact alignment needs unique keys"
            )
    return frame
