"""A secondary's table read in record batches: a StreamedTable answers
what training asks (rows for the preprocessing fit, key columns, the features a batch at a
time, the fingerprint) equal to the whole read, without ever reading the table whole."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import vflink.data.featurestore as featurestore
import vflink.data.streamed as streamed
from vflink.data.featurestore import MappedFeatures, encode_features, write_features
from vflink.data.fingerprint import frame_fingerprint
from vflink.data.preprocess import Preprocessor
from vflink.data.schema import PartySchema
from vflink.data.streamed import StreamedTable, open_table
from vflink.data.table import load_table
from vflink.errors import DataError


def _write(tmp_path: Path, fmt: str, n: int = 503, seed: int = 0) -> PartySchema:
    """A secondary's table with missing numbers, a categorical column with missing and rare
    values, an integer-valued categorical and a column outside the schema."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 2))
    x[rng.random((n, 2)) < 0.1] = np.nan
    frame = pd.DataFrame({
        "id": [f"k{i:05d}" for i in rng.permutation(n)],
        "a": x[:, 0], "b": x[:, 1],
        "city": rng.choice(["x", "y", "z", "rare", None], size=n, p=[.4, .3, .2, .02, .08]),
        "grade": rng.integers(0, 4, size=n),
        "note": rng.choice(["p", "q"], size=n),
    })
    path = tmp_path / f"t.{fmt}"
    if fmt == "csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False, row_group_size=97)
    return PartySchema(name="bank", role="secondary", key=("id",), numeric=("a", "b"),
                       categorical=("city", "grade"), path=path)


def _no_whole_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any whole read of the table (the streamed path must not need one)."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the whole table was read")

    monkeypatch.setattr(streamed, "load_table", refuse)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
@pytest.mark.parametrize("batch_rows", [7, 64, 10_000])
def test_streamed_table_answers_as_the_whole_table(tmp_path: Path, fmt: str, batch_rows: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    schema = _write(tmp_path, fmt)
    whole = load_table(schema)
    _no_whole_read(monkeypatch)
    table = StreamedTable.open(schema, batch_rows=batch_rows)
    assert not table.in_memory and len(table) == len(whole)
    assert table.column_names == whole.column_names
    # the same digest as the whole frame's, hashed per batch
    assert table.fingerprint() == frame_fingerprint(whole.frame) == whole.fingerprint()
    pd.testing.assert_frame_equal(table.select(["id"]), whole.select(["id"]).reset_index(
        drop=True))
    rows = np.array([500, 3, 3, 0, 77, 250, 499, 6], dtype=np.int64)  # any order, repeats
    for columns in (None, ["a", "city"], ["grade"]):
        pd.testing.assert_frame_equal(table.take(rows, columns), whole.take(rows, columns))
    assert table.take(np.empty(0, np.int64), ["a"]).shape == (0, 1)
    assert table.take(rows, []).shape == (len(rows), 0)
    parts = list(table.batches(schema.features))
    assert max(len(p) for p in parts) <= batch_rows
    pd.testing.assert_frame_equal(pd.concat(parts, ignore_index=True),
                                  whole.frame[list(schema.features)])
    with pytest.raises(DataError, match=r"rows outside \[0, 503\)"):
        table.take(np.array([503]))


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
@pytest.mark.parametrize("standardize", [True, False])
def test_preprocessing_fit_on_gathered_rows_is_todays(tmp_path: Path, fmt: str,
                                                      standardize: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """FitPreprocessing on the training rows gathered from the batches fits exactly what the
    fit on the whole frame fits (medians, indicators, scaling, categories, infrequent)."""
    schema = _write(tmp_path, fmt)
    whole = load_table(schema)
    rows = np.unique(np.random.default_rng(1).choice(len(whole), size=300, replace=False))
    today = Preprocessor(schema, standardize=standardize, max_categories=4).fit(
        whole.frame, rows)
    _no_whole_read(monkeypatch)
    table = StreamedTable.open(schema, batch_rows=50)
    fitted = Preprocessor(schema, standardize=standardize, max_categories=4).fit(
        table.take(rows, schema.features), np.arange(len(rows)))
    assert fitted.to_json() == today.to_json()
    assert fitted.n_features == today.n_features > 4

    # the features, encoded from the batches into the mapped file or into memory, are today's
    expected = torch.from_numpy(today.transform(whole.frame))
    path = tmp_path / "f.arrow"
    write_features(path, fitted, table, chunk_rows=40)  # 50-row batches regrouped into 40
    mapped = MappedFeatures(path, n_rows=len(table))
    assert torch.equal(mapped.rows(np.arange(len(table))), expected)
    mapped.close()
    memory = encode_features(fitted, table, store="memory")
    assert torch.equal(memory.rows(np.arange(len(table))), expected)
    auto = encode_features(fitted, table, store="mmap", directory=tmp_path / "state",
                           fingerprint=table.fingerprint())
    assert isinstance(auto, MappedFeatures)
    assert torch.equal(auto.rows(np.arange(len(table))), expected)
    auto.close()


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_duplicate_keys_across_batches_are_refused(tmp_path: Path, fmt: str) -> None:
    frame = pd.DataFrame({"id": ["a", "b", "c", "d", "b", "e"], "a": np.arange(6.0)})
    path = tmp_path / f"d.{fmt}"
    frame.to_csv(path, index=False) if fmt == "csv" else frame.to_parquet(path, index=False)
    schema = PartySchema(name="bank", role="secondary", key=("id",), numeric=("a",),
                         path=path)
    with pytest.raises(DataError, match=r"duplicate key \('b',\) in column\(s\) \['id'\] at "
                                        r"rows \[1, 4\] \(2 rows share a key\)") as info:
        StreamedTable.open(schema, batch_rows=2)  # rows 1 and 4 in different batches
    assert str(path) in str(info.value)
    with pytest.raises(DataError, match="duplicate key"):  # within one batch: as today
        StreamedTable.open(schema, batch_rows=10)


def test_bad_cells_are_named_with_their_table_row(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("id,a\n" + "".join(f"k{i},{i}\n" for i in range(10)) + "k10,oops\n")
    schema = PartySchema(name="bank", role="secondary", key=("id",), numeric=("a",),
                         path=path)
    with pytest.raises(DataError, match=r"batch 2.*column 'a' is numeric but holds "
                                        r"non-numeric values, first at row 10 \(line 12"):
        StreamedTable.open(schema, batch_rows=4)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_open_table_streams_where_the_features_are_mapped(tmp_path: Path, fmt: str,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    schema = _write(tmp_path, fmt)
    assert open_table(schema, store="memory").in_memory
    assert open_table(schema, store="auto").in_memory  # 503 rows: below the threshold
    assert not open_table(schema, store="mmap").in_memory
    monkeypatch.setattr(featurestore, "MMAP_MIN_ROWS", 500)
    table = open_table(schema, store="auto")
    assert isinstance(table, StreamedTable) and len(table) == 503
    assert "rows=503" in repr(table)  # the repr does not read the table
    # a stage without a batched path still gets the whole table, as the whole read gives it
    pd.testing.assert_frame_equal(table.frame, load_table(schema).frame)
