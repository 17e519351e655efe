"""Partitioned Parquet output: the same content as the single file, readable by
pyarrow.dataset and pandas, published atomically (a failed write leaves nothing)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.cli import run_cli
from vflink.data import parts as parts_mod
from vflink.data.parts import (
    FORMAT,
    MANIFEST,
    PartitionedWriter,
    is_partitioned,
    read_parts,
    write_columns,
)
from vflink.errors import DataError


def _columns(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"primary_index": np.repeat(np.arange(n // 2 + 1), 2)[:n].astype(np.int64),
            "secondary_index": rng.integers(0, 100, n).astype(np.int64),
            "distance": rng.random(n), "similarity": rng.normal(size=n)}


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 60), st.integers(1, 25))
def test_parts_hold_the_single_files_table(n: int, rows_per_part: int) -> None:
    import tempfile

    columns = _columns(n)
    with tempfile.TemporaryDirectory() as tmp:
        single, split = Path(tmp) / "one.parquet", Path(tmp) / "split.parquet"
        assert write_columns(columns, single, parts=False) is False
        assert write_columns(columns, split, parts=True, rows_per_part=rows_per_part) is True
        assert single.is_file() and split.is_dir() and is_partitioned(split)
        expected = pq.read_table(single)
        assert ds.dataset(str(split), format="parquet").to_table().equals(expected)
        assert read_parts(split).equals(expected)
        pd.testing.assert_frame_equal(pd.read_parquet(split), pd.read_parquet(single))
        manifest = json.loads((split / MANIFEST).read_text())
        assert manifest["format"] == FORMAT and manifest["rows"] == n
        assert manifest["parts"] == max(1, -(-n // rows_per_part))
        assert manifest["columns"] == list(columns)
        assert _leftovers(Path(tmp)) == []


def test_a_failed_write_leaves_no_dataset_and_the_old_one_as_it_was(tmp_path: Path) -> None:
    out = tmp_path / "links.parquet"
    write_columns(_columns(10), out, parts=True, rows_per_part=3)
    before = read_parts(out)
    with pytest.raises(RuntimeError, match="search failed"), PartitionedWriter(out) as writer:
        writer.write(_columns(4, seed=1))
        raise RuntimeError("search failed")
    assert read_parts(out).equals(before)
    assert _leftovers(tmp_path) == []
    fresh = tmp_path / "new.parquet"
    with pytest.raises(RuntimeError), PartitionedWriter(fresh) as writer:
        writer.write(_columns(4))
        raise RuntimeError("interrupted")
    assert not fresh.exists() and _leftovers(tmp_path) == []


def test_parts_must_agree_on_their_columns(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="part 1 has columns"), \
            PartitionedWriter(tmp_path / "x.parquet") as writer:
        writer.write({"a": np.arange(3)})
        writer.write({"a": np.arange(3.0)})
    assert not (tmp_path / "x.parquet").exists()


def test_the_target_name_is_replaced_never_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "links.parquet"
    os.symlink(victim, out)
    write_columns(_columns(5), out, parts=True, rows_per_part=2)
    assert victim.read_text() == "keep me"
    assert out.is_dir() and not out.is_symlink() and read_parts(out).num_rows == 5
    # a single file replaced by a dataset, and back
    single = tmp_path / "one.parquet"
    write_columns(_columns(5), single, parts=False)
    write_columns(_columns(6), single, parts=True)
    assert read_parts(single).num_rows == 6
    write_columns(_columns(7), single, parts=None)  # an existing dataset stays a dataset
    assert is_partitioned(single) and read_parts(single).num_rows == 7
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("cores", [1, 2, 4])
def test_an_old_dataset_replaced_is_deleted_whole_following_no_link(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cores: int) -> None:
    """The old dataset that --overwrite moves aside is deleted, its parts on one thread per
    core: every file and folder in it, a link in it removed, never followed."""
    monkeypatch.setattr(parts_mod, "cores", lambda: cores)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep me")
    out = tmp_path / "links.parquet"
    write_columns(_columns(9), out, parts=True, rows_per_part=2)
    os.symlink(outside, out / "a-link-to-a-folder")
    os.symlink(outside / "keep.txt", out / "a-link-to-a-file")
    (out / "nested").mkdir()
    (out / "nested" / "x.bin").write_bytes(b"x")
    write_columns(_columns(4), out, parts=True, rows_per_part=2)
    for thread in threading.enumerate():
        if thread.name == "vflink-remove-old-dataset":
            thread.join()
    assert read_parts(out).num_rows == 4
    assert _leftovers(tmp_path) == []  # the old dataset, moved aside, is gone
    assert (outside / "keep.txt").read_text() == "keep me"


def test_removing_an_old_dataset_follows_no_link_put_in_its_place(tmp_path: Path) -> None:
    """A link standing where the old dataset was moved aside (put there meanwhile) is not
    followed: the folder it points to keeps its files."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for i in range(3):
        (elsewhere / f"part-{i:05d}.parquet").write_bytes(b"keep")
    planted = tmp_path / ".links.parquet.0123.old"
    os.symlink(elsewhere, planted)
    parts_mod._remove_dataset(planted)
    assert sorted(p.name for p in elsewhere.iterdir()) == [f"part-{i:05d}.parquet"
                                                           for i in range(3)]


def test_large_outputs_are_partitioned_automatically(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parts_mod, "AUTO_PARTS_ROWS", 8)
    assert write_columns(_columns(8), tmp_path / "small.parquet") is False
    assert write_columns(_columns(9), tmp_path / "big.parquet", rows_per_part=4) is True
    assert json.loads((tmp_path / "big.parquet" / MANIFEST).read_text())["parts"] == 3


def test_an_incomplete_dataset_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "links.parquet"
    write_columns(_columns(9), out, parts=True, rows_per_part=4)
    (out / "part-00002.parquet").unlink()
    with pytest.raises(DataError, match="8 rows, but its manifest states 9"):
        read_parts(out)
    (out / MANIFEST).unlink()
    with pytest.raises(DataError, match="without _vflink.json"):
        read_parts(out)


def test_vflink_link_parts_equal_the_single_file(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    p, s = tmp_path / "a.csv", tmp_path / "b.csv"
    rng = np.random.default_rng(3)
    pd.DataFrame({"x": rng.random(40), "y": rng.random(40)}).to_csv(p, index=False)
    pd.DataFrame({"x": rng.random(50), "y": rng.random(50)}).to_csv(s, index=False)
    base = ["link", "--primary", str(p), "--secondary", str(s), "--on", "x,y", "--metric",
            "euclidean", "--top-k", "3", "--privacy", "off", "--seed", "1"]
    assert run_cli([*base, "--out", str(tmp_path / "one.parquet")], capsys)[0] == 0
    assert run_cli([*base, "--parts", "--out", str(tmp_path / "many.parquet")], capsys)[0] == 0
    assert (tmp_path / "one.parquet").is_file() and is_partitioned(tmp_path / "many.parquet")
    assert read_parts(tmp_path / "many.parquet").equals(pq.read_table(tmp_path / "one.parquet"))
    summary = json.loads((tmp_path / "many.parquet.summary.json").read_text())
    assert summary["sizes"]


def test_with_every_writer_busy_the_caller_writes_the_part(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Parts written while the writer threads are busy are written by the caller instead of
    waiting: the same parts, in order, as one thread writes; a failure there still publishes
    nothing."""
    import threading
    import time

    real = PartitionedWriter._write_part
    writers: list[str] = []

    def slow(self: PartitionedWriter, table: object, path: Path) -> None:
        writers.append(threading.current_thread().name)
        time.sleep(0.05)
        real(self, table, path)

    monkeypatch.setattr(PartitionedWriter, "_write_part", slow)
    chunks = [_columns(50, seed) for seed in range(7)]
    for threads, out in ((2, tmp_path / "a"), (1, tmp_path / "b")):
        with PartitionedWriter(out, threads=threads) as writer:
            for chunk in chunks:
                writer.write(chunk)
    assert "MainThread" in writers[:7] and any(w != "MainThread" for w in writers[:7])
    for i in range(7):
        name = f"part-{i:05d}.parquet"
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()

    def fail_third(self: PartitionedWriter, table: object, path: Path) -> None:
        if path.name == "part-00002.parquet":
            raise OSError("disk full")
        slow(self, table, path)

    monkeypatch.setattr(PartitionedWriter, "_write_part", fail_third)
    with pytest.raises(OSError, match="disk full"):
        with PartitionedWriter(tmp_path / "c", threads=2) as writer:
            for chunk in chunks:
                writer.write(chunk)
    assert not (tmp_path / "c").exists() and not _leftovers(tmp_path)


class _CountingFile:
    """A writable binary file that counts the writes it is given."""

    def __init__(self, path: Path) -> None:
        self._fh = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.writes = 0
        self.closed = False

    def write(self, data: bytes) -> int:
        self.writes += 1
        return self._fh.write(data)

    def tell(self) -> int:
        return self._fh.tell()

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()
        self.closed = True


def test_parts_are_written_in_large_batches_and_pages(tmp_path: Path) -> None:
    """vflink's writer options: batches of WRITE_BATCH values and pages cut by their size
    (not at pyarrow's 20,000 rows) where this pyarrow takes a page-row limit; the table
    reads back the same, written in a fraction of the writes."""
    import pyarrow as pa

    table = pa.table(_columns(300_000, seed=5))
    options = parts_mod.parquet_options(table.schema)
    assert options["write_batch_size"] == parts_mod.WRITE_BATCH
    plain = {k: v for k, v in options.items() if k not in ("write_batch_size",
                                                             "max_rows_per_page")}
    counts = {}
    for name, opts in (("vflink", options), ("pyarrow's pages", plain)):
        fh = _CountingFile(tmp_path / f"{name}.parquet")
        pq.write_table(table, fh, **opts)
        fh.close()
        assert pq.read_table(tmp_path / f"{name}.parquet").equals(table)
        counts[name] = fh.writes
    takes_page_rows = "max_rows_per_page" in options
    if takes_page_rows:
        assert options["max_rows_per_page"] == parts_mod.PAGE_ROWS
        # 300,000 rows: 15 pages of 20,000 a column, against 3 of at most 1 MiB
        assert counts["vflink"] * 3 < counts["pyarrow's pages"], counts


def test_a_pyarrow_without_a_page_row_limit_gets_the_batch_size_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class OldWriter:  # the writer's signature before max_rows_per_page
        def __init__(self, where: object, schema: object, compression: str = "snappy",
                     write_batch_size: int | None = None) -> None:
            raise AssertionError("only looked at")

    parts_mod._page_options.cache_clear()
    monkeypatch.setattr(pq, "ParquetWriter", OldWriter)
    try:
        assert parts_mod._page_options() == {"write_batch_size": parts_mod.WRITE_BATCH}
    finally:
        parts_mod._page_options.cache_clear()


def test_wide_values_keep_the_writers_own_batches() -> None:
    """A batch is checked against the page size only when it ends: a table with text (record
    ids, say) keeps pyarrow's small batches, so its pages stay near their size limit."""
    import pyarrow as pa

    narrow = parts_mod.parquet_options(pa.schema([("primary_index", pa.int64()),
                                                  ("match", pa.bool_())]))
    wide = parts_mod.parquet_options(pa.schema([("primary_index", pa.int64()),
                                                ("primary_id", pa.string())]))
    assert narrow["write_batch_size"] == parts_mod.WRITE_BATCH
    assert "write_batch_size" not in wide
    assert wide.get("max_rows_per_page") == narrow.get("max_rows_per_page")
