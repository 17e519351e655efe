"""Batched reads: the batches, concatenated, equal the whole read (read_frame), for
CSV and Parquet, and every batch is checked against the schema with table rows in messages."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vflink.data.batches import scan_frame, scan_table
from vflink.data.schema import PartySchema
from vflink.data.table import load_table, read_frame
from vflink.errors import DataError

WORDS = st.sampled_from(["x", "y", "NA", "null", "", "007", "True", "False", "1.5", "-2",
                         "3", "abc", "1e3"])
INTS = st.integers(-10**6, 10**6).map(str)
FLOATS = st.floats(-1e6, 1e6, allow_nan=False).map(repr)
CELLS = st.one_of(WORDS, INTS, FLOATS)


def _concat(batches: list[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(batches, ignore_index=True)


@st.composite
def tables(draw: st.DrawFn) -> tuple[list[list[str]], int]:
    n = draw(st.integers(1, 25))
    kinds = draw(st.lists(st.sampled_from(["int", "float", "word", "any", "bool"]),
                          min_size=1, max_size=4))
    by = {"int": INTS, "float": st.one_of(INTS, FLOATS), "word": WORDS, "any": CELLS,
          "bool": st.sampled_from(["True", "False", "true", "FALSE"])}
    rows = []
    for i in range(n):
        row = [f"{i:03d}"]
        for kind in kinds:
            cell = draw(by[kind])
            row.append("" if draw(st.integers(0, 9)) == 0 else cell)
        rows.append(row)
    return rows, draw(st.integers(1, 30))


def _write(rows: list[list[str]], path: Path, sep: str = ",") -> list[str]:
    header = ["id"] + [f"c{j}" for j in range(len(rows[0]) - 1)]
    path.write_text("\n".join(sep.join(r) for r in [header, *rows]) + "\n", encoding="utf-8")
    return header


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables())
def test_csv_batches_equal_the_whole_read(case: tuple[list[list[str]], int]) -> None:
    rows, batch_rows = case
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.csv"
        _write(rows, path)
        whole = read_frame(path, text_columns=("id",), delimiter=",")
        batches = list(scan_frame(path, text_columns=("id",), delimiter=",",
                                  batch_rows=batch_rows))
        assert all(len(b) <= batch_rows for b in batches)
        assert [b.offset for b in batches] == list(range(0, len(rows), batch_rows))
        pd.testing.assert_frame_equal(_concat([b.frame for b in batches]), whole)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 40), st.integers(1, 50), st.integers(0, 2**31))
def test_parquet_batches_equal_the_whole_read(n: int, batch_rows: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"id": [f"{i:04d}" for i in range(n)], "x": rng.normal(size=n),
                          "k": rng.integers(0, 5, n), "c": rng.choice(["a", "b", None], n)})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.parquet"
        frame.to_parquet(path, row_group_size=7)
        whole = read_frame(path)
        got = _concat([b.frame for b in scan_frame(path, batch_rows=batch_rows)])
        pd.testing.assert_frame_equal(got, whole)
        # a directory of parts reads as one table, in the parts' order
        parts = Path(tmp) / "parts"
        parts.mkdir()
        for i, start in enumerate(range(0, n, 9)):
            frame.iloc[start:start + 9].to_parquet(parts / f"part-{i:05d}.parquet", index=False)
        got = _concat([b.frame for b in scan_frame(parts, batch_rows=batch_rows)])
        pd.testing.assert_frame_equal(got, whole)


@pytest.mark.parametrize("options", [
    {"delimiter": ";", "decimal": ","},
    {"encoding": "latin-1"},
    {"delimiter": "\t"},
])
def test_csv_options_as_for_the_whole_read(tmp_path: Path, options: dict[str, str]) -> None:
    sep = options.get("delimiter", ",")
    dec = options.get("decimal", ".")
    lines = [sep.join(["id", "name", "x"])] + [
        sep.join([f"{i:03d}", "café" if i % 2 else "naïve", f"{i}{dec}5"]) for i in range(13)]
    path = tmp_path / "t.csv"
    path.write_bytes(("\n".join(lines) + "\n").encode(options.get("encoding", "utf-8")))
    whole = read_frame(path, text_columns=("id",), **options)
    assert whole["x"].dtype == np.float64
    for batch_rows in (1, 4, 100):
        got = _concat([b.frame for b in scan_frame(path, text_columns=("id",),
                                                   batch_rows=batch_rows, **options)])
        pd.testing.assert_frame_equal(got, whole)
    # detected delimiter, as the whole read detects it
    if "encoding" not in options:
        got = _concat([b.frame for b in scan_frame(path, text_columns=("id",), batch_rows=5,
                                                   decimal=options.get("decimal"))])
        pd.testing.assert_frame_equal(got, whole)


def test_bad_bytes_named_as_by_the_whole_read(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes("id,name\n1,ok\n2,caf\xe9\n".encode("latin-1"))
    with pytest.raises(DataError) as whole:
        read_frame(path)
    with pytest.raises(DataError) as batched:
        list(scan_frame(path, batch_rows=1))
    assert str(batched.value) == str(whole.value)
    assert "line 3, column 'name'" in str(batched.value)


def _schema(path: Path) -> PartySchema:
    return PartySchema(name="bank", role="primary", key=("id",), numeric=("x", "y"),
                       categorical=("c",), label="label", task="binary", path=path)


def _table(tmp_path: Path, n: int = 20, suffix: str = ".csv") -> tuple[Path, pd.DataFrame]:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"id": [f"{i:03d}" for i in range(n)], "x": rng.normal(size=n),
                          "y": rng.integers(0, 9, n), "c": rng.choice(["a", "b"], n),
                          "label": np.arange(n) % 2})
    path = tmp_path / f"t{suffix}"
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False)
    return path, frame


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_checked_batches_equal_the_checked_whole_table(tmp_path: Path, suffix: str) -> None:
    path, _ = _table(tmp_path, suffix=suffix)
    whole = load_table(_schema(path)).frame
    got = _concat([b.frame for b in scan_table(_schema(path), batch_rows=6)])
    pd.testing.assert_frame_equal(got, whole)
    # a stage that needs a few columns reads only those
    ids = _concat([b.frame for b in scan_table(_schema(path), columns=("id", "x"),
                                               batch_rows=6)])
    pd.testing.assert_frame_equal(ids, whole[["id", "x"]])


def test_a_bad_batch_names_file_batch_columns_and_table_rows(tmp_path: Path) -> None:
    path, frame = _table(tmp_path)
    frame = frame.astype({"x": object, "y": object})
    frame.loc[13, "x"] = "oops"
    frame.loc[14, "y"] = "inf"
    frame.loc[3, "x"] = "bad-in-batch-0"
    frame.to_csv(path, index=False)
    batches = scan_table(_schema(path), batch_rows=10)
    with pytest.raises(DataError) as err:
        list(batches)
    # the first bad batch, every problem of it at once
    assert "batch 0" in str(err.value) and "row 3 (line 5" in str(err.value)
    frame.loc[3, "x"] = 0.5
    frame.to_csv(path, index=False)
    got = scan_table(_schema(path), batch_rows=10)
    first = next(got)
    assert len(first) == 10
    with pytest.raises(DataError) as err:
        next(got)
    message = str(err.value)
    assert str(path) in message and "batch 1" in message
    assert "column 'x'" in message and "row 13 (line 15 of a CSV), value 'oops'" in message
    assert "column 'y' holds infinite values" in message and "row 14" in message
    assert len(err.value.problems) == 2


def test_missing_columns_are_refused_before_any_row(tmp_path: Path) -> None:
    path, frame = _table(tmp_path)
    frame.drop(columns=["y"]).to_csv(path, index=False)
    with pytest.raises(DataError, match=r"\['y'\] expected but missing.*this table has: id, x"):
        next(scan_table(_schema(path)))
    pq = tmp_path / "t.parquet"
    frame.drop(columns=["y"]).to_parquet(pq)
    with pytest.raises(DataError, match=r"\['y'\] expected but missing"):
        next(scan_table(_schema(pq)))


def test_duplicate_keys_within_a_batch_name_table_rows(tmp_path: Path) -> None:
    path, frame = _table(tmp_path)
    frame.loc[15, "id"] = frame.loc[12, "id"]
    frame.to_csv(path, index=False)
    with pytest.raises(DataError, match=r"batch 1.*duplicate key \('012',\).*rows \[12, 15\]"):
        list(scan_table(_schema(path), batch_rows=10))
