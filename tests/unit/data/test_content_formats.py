"""A table's format comes from its bytes, not its name (docs/reference/file-formats.md): a CSV
saved as ``.parquet`` and a Parquet file named ``.csv`` are read by every table reader as what
they hold, with one warning naming the mismatch; a file that is no table vflink reads (a
workbook, an archive, JSON, binary) or whose compression contradicts its name is refused
naming the file, what it holds and the fix."""

from __future__ import annotations

import gzip
import logging
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from vflink._files import table_format
from vflink.data import PartySchema
from vflink.data.batches import read_frame_header, scan_frame
from vflink.data.streamed import _row_bound
from vflink.data.table import load_table, read_frame
from vflink.errors import DataError
from vflink.runner.align import KeyFile, file_key_batches, key_table
from vflink.runner.link.read import table_rows

FRAME = pd.DataFrame({"id": ["a1", "a2", "a3"], "lat": [1.5, 2.0, -3.25],
                      "label": [0, 1, 0]})


def _csv(path: Path) -> Path:
    FRAME.to_csv(path, index=False)
    return path


def _parquet(path: Path) -> Path:
    FRAME.to_parquet(path, index=False)
    return path


READERS: dict[str, Callable[[Path], Any]] = {
    "read_frame": lambda p: read_frame(p, text_columns=("id",))[["id", "lat"]],
    "scan_frame": lambda p: pd.concat(b.frame for b in scan_frame(
        p, columns=["id", "lat"], text_columns=["id"], numeric_columns=["lat"])),
    "header": lambda p: read_frame_header(p),
    "load_table": lambda p: load_table(PartySchema(
        name="bank", role="primary", key=("id",), numeric=("lat",), label="label",
        task="binary"), p).frame[["id", "lat"]],
    "key_table": lambda p: key_table(p, ["id"], name="bank").frame,
    "key_batches": lambda p: file_key_batches(KeyFile(p, ("id",), "bank"), chunk_rows=2).n,
    "rows": lambda p: table_rows(p),
    "row_bound": lambda p: _row_bound(p) is not None and _row_bound(p) >= len(FRAME),
}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, pd.DataFrame):
        return a.reset_index(drop=True).astype(str).equals(b.reset_index(drop=True).astype(str))
    return bool(a == b)


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_follows_the_content(tmp_path: Path, reader: str,
                                          caplog: pytest.LogCaptureFixture) -> None:
    read = READERS[reader]
    want_csv, want_pq = read(_csv(tmp_path / "ok.csv")), read(_parquet(tmp_path / "ok.parquet"))
    with caplog.at_level(logging.WARNING, logger="vflink._files"):
        got_csv = read(_csv(tmp_path / "people.parquet"))   # CSV text named .parquet
        got_pq = read(_parquet(tmp_path / "people.csv"))    # Parquet named .csv
    assert _same(got_csv, want_csv) and _same(got_pq, want_pq)
    said = [r.getMessage() for r in caplog.records]
    assert any("people.parquet: the file holds CSV text although its name promises Parquet"
               in m and "rename it to end in .csv" in m for m in said), said
    assert any("people.csv: the file holds Parquet although its name promises CSV text" in m
               for m in said), said


def test_the_mismatch_is_said_once_per_file(tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    path = _csv(tmp_path / "once.parquet")
    with caplog.at_level(logging.WARNING, logger="vflink._files"):
        for _ in range(3):
            assert table_format(path) == "csv"
    assert len(caplog.records) == 1


def _zip(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("xl/workbook.xml", "<workbook/>")
    return path


def _write(data: bytes) -> Callable[[Path], Path]:
    def make(path: Path) -> Path:
        path.write_bytes(data)
        return path
    return make


REFUSED: list[tuple[str, Callable[[Path], Path], str]] = [
    ("book.xlsx", _zip, "ZIP archive (an Excel .xlsx workbook"),
    ("book.csv", _zip, "export the sheet as CSV"),
    ("old.xls", _write(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(100)), "Excel 97-2003"),
    ("t.feather", _write(b"ARROW1\x00\x00" + bytes(50)), "write it as Parquet"),
    ("t.csv", _write(b"\x00\x01\x02\x03binary"), "binary data"),
    ("t.csv", _write(b'[{"id": "a1", "lat": 1.5}]'), "holds JSON"),
    ("t.csv", _write(gzip.compress(b"id,lat\na1,1.5\n")), "name it t.csv.gz"),
    ("t.csv.gz", _write(b"id,lat\na1,1.5\n"), "not gzip-compressed: name it t.csv"),
    ("t.parquet", _write(b"BZh91AY&SY" + bytes(20)), "bzip2"),
]


@pytest.mark.parametrize(("name", "make", "fix"), REFUSED,
                         ids=[f"{n}-{f.split()[0]}" for n, _, f in REFUSED])
@pytest.mark.parametrize("reader", ["read_frame", "scan_frame", "key_table"])
def test_what_is_no_table_is_named_with_the_fix(tmp_path: Path, name: str,
                                                make: Callable[[Path], Path], fix: str,
                                                reader: str) -> None:
    path = make(tmp_path / name)
    with pytest.raises(DataError, match=str(path).replace(".", r"\.")) as info:
        READERS[reader](path)
    assert fix in str(info.value), str(info.value)


def test_an_unknown_name_is_read_by_its_content(tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="vflink._files"):
        got = READERS["read_frame"](_csv(tmp_path / "export.dat"))
    assert _same(got, FRAME[["id", "lat"]])
    assert "export.dat: read as CSV text (from its content" in caplog.text
