"""Numeric CSV and TSV tables read without pandas (vflink.data.table.read_numeric_csv): the
values a link's identifiers get are those of the pandas reader (read_frame), to the bit, its
missing-value strings as NaN; anything else is left to the pandas reader (None), which names
the problem; and a link over such files writes the very links a link over the DataFrames
writes."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vflink.data.table import NA_STRINGS, numeric_column, read_frame, read_numeric_csv
from vflink.errors import DataError


def _pandas(path: Path, columns: list[str], **options: str | None) -> np.ndarray:
    frame = read_frame(path, **options)
    return np.column_stack([pd.to_numeric(frame[c]).to_numpy(dtype=np.float64,
                                                             na_value=np.nan)
                            for c in columns])


def _same(path: Path, columns: list[str], **options: str | None) -> None:
    table = read_numeric_csv(path, columns, **options)
    assert table is not None, "read by pandas instead"
    got = np.column_stack([numeric_column(table, c) for c in columns])
    want = _pandas(path, columns, **options)
    np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))  # bits, NaN too


def test_pandas_missing_value_strings_are_pandas_own() -> None:
    from pandas._libs.parsers import STR_NA_VALUES

    assert set(NA_STRINGS) == set(STR_NA_VALUES)


@pytest.mark.parametrize(("name", "text", "options"), [
    ("plain.csv", "lat,lon,name\n1.5,2,a\n-3e-5,4.25,b\n7,8,c\n", {}),
    ("tabs.tsv", "lat\tlon\n1.5\t2\n-3\t4.25\n", {}),
    ("semicolons.csv", "lat;lon\n1.5;2\n-3;4.25\n0.125;9\n", {}),  # detected
    ("given.csv", "lat|lon\n1.5|2\n-3|4.25\n", {"delimiter": "|"}),
    ("bom.csv", "\ufefflat,lon\n1.5,2\n-3,4.25\n", {}),  # Excel's "CSV UTF-8"
    ("bom-utf8.csv", "\ufefflat,lon\n1.5,2\n", {"encoding": "utf-8"}),  # pandas skips it too
    ("crlf.csv", "lat,lon\r\n1.5,2\r\n-3,4.25\r\n", {}),
    ("blank.csv", "lat,lon\n1.5,2\n\n-3,4.25\n", {}),
    ("quoted.csv", 'lat,lon,note\n"1.5",2,"a, b"\n-3,"4.25","line\nbreak"\n', {}),
    ("missing.csv", "lat,lon\n1.5,\nNA,2\nnan,3\nnull,4\n#N/A,5\nNone,6\n,\n1,-1.#IND\n", {}),
    ("integers.csv", "lat,lon\n1,2\n9007199254740993,-4\n", {}),
    ("utf8.csv", "lat,lon\n1.5,2\n", {"encoding": "utf-8"}),
], ids=lambda v: v if isinstance(v, str) and v.endswith(("csv", "tsv")) else "")
def test_numbers_and_missing_cells_equal_the_pandas_reader(tmp_path: Path, name: str,
                                                           text: str,
                                                           options: dict[str, str]) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8", newline="")
    _same(path, ["lat", "lon"], **options)


def test_a_gzipped_csv_equals_the_pandas_reader(tmp_path: Path) -> None:
    path = tmp_path / "points.csv.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("lat,lon\n1.5,2\n-3,4.25\n")
    _same(path, ["lat", "lon"])


@pytest.mark.parametrize(("text", "columns", "options"), [
    ("lat,lon\n1.5,2\nnorth,4\n", ["lat", "lon"], {}),  # text: pandas names it
    ("lat,lon\n1.5,2\n", ["lat", "height"], {}),  # a missing column: pandas names it
    ("lat,lat\n1.5,2\n", ["lat"], {}),  # pandas renames the second "lat.1"
    ("lat,lon\n1.5,2\n3,4,5\n", ["lat", "lon"], {}),  # a row too long
    ("lat;lon\n1,5;2\n", ["lat", "lon"], {"decimal": ","}),
    ("lat,lon\n1.5,2\n", ["lat", "lon"], {"encoding": "latin-1"}),
    ("lat,lon\n1.5,2\n", [], {}),
    ("lat,lon\n1.5,2\n", ["lat", "lon"], {"delimiter": "ab"}),  # pandas' path names it
], ids=["text", "missing-column", "repeated-name", "ragged", "decimal-comma", "latin-1",
        "no-columns", "bad-delimiter"])
def test_anything_else_is_left_to_the_pandas_reader(tmp_path: Path, text: str,
                                                    columns: list[str],
                                                    options: dict[str, str]) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text, encoding="utf-8")
    assert read_numeric_csv(path, columns, **options) is None


@pytest.mark.parametrize("cell", [
    "inf", "-inf", "+inf", "Infinity", "-Infinity", "INF", "nan", "NaN", "-nan", "-NaN",
    "+nan", "Nan", "NAN", "+1.5", "1.", ".5", "1E5", "1e+5", "0x10", "1_000", " 1.5", "1.5 ",
    "1d5", "true", "-", "+", "1e400", "-1e400", "1e-400", "00012", "-0", "-0.0", "1.5f",
    "4.9e-324", "2.5e-324", "1.#QNAN", "-1.#IND", "#N/A N/A", "<NA>", "nul", "1e", "e5",
    "\u0661"])
def test_an_odd_cell_is_read_as_pandas_reads_it_or_left_to_pandas(tmp_path: Path,
                                                                  cell: str) -> None:
    """Spellings of infinity, NaN, signs, exponents, padding, hexadecimal and other digits:
    pyarrow's values where it reads the file, those of the pandas reader bit for bit; a cell
    pandas reads as text (``NAN``, ``+nan``: pyarrow would take them for NaN) is left to it."""
    path = tmp_path / "t.csv"
    path.write_text(f"x,y\n1.0,{cell}\n2.0,3.0\n", encoding="utf-8")
    table = read_numeric_csv(path, ["x", "y"])
    frame = read_frame(path)
    if frame["y"].dtype == object or pd.api.types.is_string_dtype(frame["y"]):
        assert table is None  # text to pandas: its checks name the cell
        return
    if table is not None:
        got = numeric_column(table, "y")
        want = frame["y"].to_numpy(dtype=np.float64, na_value=np.nan)
        np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))


def test_files_that_are_not_csv_are_left_to_their_readers(tmp_path: Path) -> None:
    parquet = tmp_path / "t.parquet"
    pd.DataFrame({"lat": [1.5]}).to_parquet(parquet)
    assert read_numeric_csv(parquet, ["lat"]) is None
    assert read_numeric_csv(tmp_path / "absent.csv", ["lat"]) is None
    assert read_numeric_csv(tmp_path, ["lat"]) is None  # a directory
    with pytest.raises(DataError, match="not found"):
        read_frame(tmp_path / "absent.csv")


_FLOATS = st.floats(allow_nan=False, allow_infinity=False, width=64)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_FLOATS, _FLOATS), min_size=1, max_size=40),
       st.sampled_from(["repr", "6f", "3e", "g"]))
def test_written_numbers_read_back_as_pandas_reads_them(rows: list[tuple[float, float]],
                                                         style: str) -> None:
    """Floats written whole (repr), to 6 decimals, in scientific notation or by %g: the same
    float64 through either parser."""
    import tempfile

    def text(v: float) -> str:
        return repr(v) if style == "repr" else format(v, {"6f": ".6f", "3e": ".3e",
                                                          "g": "g"}[style])

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "points.csv"
        path.write_text("x,y\n" + "".join(f"{text(a)},{text(b)}\n" for a, b in rows))
        table = read_numeric_csv(path, ["x", "y"])
        assert table is not None
        got = np.column_stack([numeric_column(table, c) for c in ("x", "y")])
        want = np.array([[float(text(a)), float(text(b))] for a, b in rows])
        np.testing.assert_array_equal(got, want)  # the nearest float64, as Python's float
        np.testing.assert_array_equal(got, _pandas(path, ["x", "y"]))


@pytest.mark.parametrize("empty", ["error", "skip"])
def test_a_link_over_csv_files_writes_the_links_of_the_dataframes(tmp_path: Path,
                                                                  empty: str) -> None:
    """The whole link: CSV files read without pandas and the same tables as DataFrames, the
    same links to the bit; empty identifiers skipped or refused alike, the refusal naming the
    file, the column and the row."""
    from vflink import link

    rng = np.random.default_rng(3)
    p = pd.DataFrame({"x": rng.normal(0, 1, 300), "y": rng.normal(0, 1, 300)})
    s = pd.DataFrame({"x": rng.normal(0, 1, 120), "y": rng.normal(0, 1, 120)})
    p.loc[[4, 77], "x"] = np.nan
    pp, sp = tmp_path / "p.csv", tmp_path / "s.csv"
    p.to_csv(pp, index=False)
    s.to_csv(sp, index=False)
    kw = dict(on=["x", "y"], metric="euclidean", top_k=6, privacy="off", empty=empty)
    if empty == "error":
        with pytest.raises(DataError, match=r"p\.csv.*'x' is empty at row 4 \(line 6"):
            link(pp, sp, out=tmp_path / "a.parquet", **kw)
        return
    a = link(pp, sp, out=tmp_path / "a.parquet", **kw)
    b = link(pd.read_csv(pp), pd.read_csv(sp), out=tmp_path / "b.parquet", **kw)
    assert pq.read_table(tmp_path / "a.parquet").equals(pq.read_table(tmp_path / "b.parquet"))
    assert len(a) == len(b) and not math.isnan(len(a))
