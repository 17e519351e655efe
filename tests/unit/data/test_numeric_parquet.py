"""Numeric Parquet tables read without pandas (vflink.data.table.read_numeric_parquet): the
values a link's identifiers get are the ones pandas reads, to the bit, nulls as NaN; anything
else is left to the pandas reader; and a link over such tables writes the very links a link
over the DataFrames writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vflink.data.parts import arrow_table
from vflink.data.table import is_arrow, numeric_column, read_numeric_parquet, take_rows
from vflink.parties.linking import identifier_values

TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(),
         pa.uint64(), pa.float16(), pa.float32(), pa.float64()]


def _pandas_values(table: pa.Table, name: str) -> np.ndarray:
    """What the pandas path gives: ``pd.to_numeric`` of the column pandas reads, as float64."""
    return pd.to_numeric(table.to_pandas()[name]).to_numpy(dtype=np.float64, na_value=np.nan)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(TYPES), st.lists(st.integers(0, 40), min_size=1, max_size=4),
       st.integers(0, 2**32 - 1), st.floats(0, 1), st.integers(0, 5))
def test_a_column_reads_as_pandas_reads_it(kind: pa.DataType, sizes: list[int], seed: int,
                                           nulls: float, cut: int) -> None:
    """Every integer and float type, in several chunks (sliced: a chunk's offset), with and
    without nulls: the same float64 values as pandas', NaN where it has NaN."""
    rng = np.random.default_rng(seed)
    chunks = []
    for n in sizes:
        if pa.types.is_floating(kind):
            raw = rng.normal(0, 1e3, n + cut).astype(kind.to_pandas_dtype())
        else:
            info = np.iinfo(kind.to_pandas_dtype())
            raw = rng.integers(info.min, info.max, n + cut, dtype=kind.to_pandas_dtype(),
                               endpoint=True)
        mask = rng.random(n + cut) < nulls
        chunks.append(pa.array(raw, type=kind, mask=mask).slice(cut))
    table = pa.table({"x": pa.chunked_array(chunks, type=kind)})
    got = numeric_column(table, "x")
    want = _pandas_values(table, "x")
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.float64


def test_a_column_of_anything_else_is_refused() -> None:
    table = pa.table({"s": ["a", "b"]})
    with pytest.raises(TypeError, match="not integers or floats"):
        numeric_column(table, "s")


def _write(tmp: Path, name: str, frame: pd.DataFrame) -> Path:
    path = tmp / name
    frame.to_parquet(path)
    return path


def test_only_numeric_identifiers_of_a_parquet_file_are_read_without_pandas(
        tmp_path: Path) -> None:
    frame = pd.DataFrame({"x": [1.5, np.nan, 3.0], "n": [1, 2, 3], "s": ["a", "b", "c"]})
    path = _write(tmp_path, "t.parquet", frame)
    table = read_numeric_parquet(path, ["x", "n"])
    assert table is not None and is_arrow(table)
    assert table.column_names[:3] == ["x", "n", "s"]  # every column, as read_frame reads it
    assert read_numeric_parquet(path, ["x", "s"]) is None  # text: pandas' reader
    assert read_numeric_parquet(path, ["x", "nope"]) is None  # missing: its message
    assert read_numeric_parquet(path, []) is None
    csv = tmp_path / "t.csv"
    frame.to_csv(csv, index=False)
    assert read_numeric_parquet(csv, ["x"]) is None
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(path.read_bytes()[:40])
    assert read_numeric_parquet(broken, ["x"]) is None
    assert read_numeric_parquet(tmp_path / "absent.parquet", ["x"]) is None


def test_identifier_values_and_rows_of_an_arrow_table_equal_the_dataframes(
        tmp_path: Path) -> None:
    frame = pd.DataFrame({"a": np.array([1, 2, 3, 4], dtype=np.int32),
                          "b": [0.5, np.nan, -2.0, 1e300]})
    table = read_numeric_parquet(_write(tmp_path, "t.parquet", frame), ["a", "b"])
    assert table is not None
    np.testing.assert_array_equal(identifier_values(table, ["a", "b"], "numeric"),
                                  identifier_values(frame, ["a", "b"], "numeric"))
    keep = np.array([True, False, True, True])
    kept = take_rows(table, keep)
    assert is_arrow(kept)
    np.testing.assert_array_equal(identifier_values(kept, ["b", "a"], "numeric"),
                                  identifier_values(take_rows(frame, keep), ["b", "a"],
                                                    "numeric"))
    with pytest.raises(Exception, match="missing"):
        identifier_values(table, ["a", "zz"], "numeric", source="t.parquet")


@pytest.mark.parametrize("dtype", ["int64", "int32", "uint8", "float64", "float32", "bool"])
def test_arrow_table_columns_equal_pyarrows_own_conversion(dtype: str) -> None:
    """The write's zero-copy arrays (no pandas) hold what ``pa.array`` would, views too."""
    rng = np.random.default_rng(1)
    values = (rng.random(101) < 0.5) if dtype == "bool" else (rng.random(101) * 100).astype(dtype)
    for column in (values, values[3:90:2], values[::-1]):
        got = arrow_table({"c": column}).column("c")
        assert got.combine_chunks().equals(pa.array(column))


@pytest.mark.parametrize("empty", ["error", "skip"])
def test_a_link_over_parquet_files_writes_the_links_of_the_dataframes(
        tmp_path: Path, empty: str) -> None:
    """The whole link: tables read without pandas (files) and as DataFrames (the API's), the
    same links to the bit, empty identifiers skipped or refused alike."""
    from vflink import link

    rng = np.random.default_rng(2)
    p = pd.DataFrame({"x": rng.normal(0, 1, 400), "y": rng.integers(-5, 5, 400)})
    s = pd.DataFrame({"x": rng.normal(0, 1, 150), "y": rng.integers(-5, 5, 150)})
    if empty == "skip":
        p.loc[[3, 50], "x"] = np.nan
    pp, sp = _write(tmp_path, "p.parquet", p), _write(tmp_path, "s.parquet", s)
    kw = dict(on=["x", "y"], metric="euclidean", top_k=7, privacy="off", empty=empty)
    a = link(pp, sp, out=tmp_path / "a.parquet", **kw)
    b = link(p, s, out=tmp_path / "b.parquet", **kw)
    assert pq.read_table(tmp_path / "a.parquet").equals(pq.read_table(tmp_path / "b.parquet"))
    assert len(a) == len(b)
