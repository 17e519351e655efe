"""The write stage: the links streamed to the file a stretch of records at a time
(LinkColumns.chunks, ColumnSink's writer threads) read back as the very columns the link holds
in memory, in every format and layout; a failed write publishes nothing; the charts drawn only
when asked for, beside the write."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import vflink
from vflink.data import parts as parts_mod
from vflink.data import sink as sink_mod
from vflink.data.parts import read_parts
from vflink.data.sink import ColumnSink
from vflink.linkage.soft import SoftLinkage
from vflink.runner.link.outcome import LinkColumns
from vflink.runner.link.write import write_links


def _linkage(n: int, k: int, seed: int, *, missing: bool = False,
             model: bool = False) -> SoftLinkage:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, 50, (n, k)).astype(np.int64)
    dist = np.sort(rng.random((n, k)), axis=1)
    sim = -dist + rng.normal(0, 0.1, (n, k))
    if missing:
        gone = rng.random((n, k)) < 0.3
        idx[gone], dist[gone], sim[gone] = -1, np.nan, np.nan
    extra = {}
    if model:
        weights = rng.normal(0, 3, (n, k))
        extra = {"match_weights": weights, "match_probabilities": 1 / (1 + np.exp(-weights)),
                 "matches": weights > 1}
    return SoftLinkage(indices=idx, distances=dist, similarities=sim, mu0=0.0, sigma0=1.0,
                       sigma=0.0, tau=1.0, epsilon=np.inf, delta=1e-5, epsilon_valid=True,
                       metric="euclidean", mode="soft", n_secondary=50, **extra)


def _brute(lk: SoftLinkage, names: list[str], ids: dict[str, np.ndarray]) -> pd.DataFrame:
    """One row per present link, column by column, by a loop over the links."""
    rows = []
    for i in range(lk.indices.shape[0]):
        for r in range(lk.indices.shape[1]):
            j = int(lk.indices[i, r])
            if j < 0:
                continue
            row = {"primary_index": i, "secondary_index": j, "rank": r,
                   "distance": lk.distances[i, r], "similarity": lk.similarities[i, r]}
            if lk.matches is not None:
                row.update(match_weight=lk.match_weights[i, r],
                           match_probability=lk.match_probabilities[i, r],
                           match=bool(lk.matches[i, r]))
            for name, values in ids.items():
                row[name] = values[i if name == "primary_id" else j]
            rows.append(row)
    return pd.DataFrame(rows, columns=names)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 30), k=st.integers(1, 5), seed=st.integers(0, 10**6),
       missing=st.booleans(), model=st.booleans(), with_ids=st.booleans(),
       chunk=st.integers(1, 40))
def test_columns_whole_and_in_chunks_equal_the_links(n: int, k: int, seed: int,
                                                     missing: bool, model: bool,
                                                     with_ids: bool, chunk: int) -> None:
    lk = _linkage(n, k, seed, missing=missing, model=model)
    columns = LinkColumns(lk)
    ids = {}
    if with_ids:
        ids = {"primary_id": np.array([f"p{i}" for i in range(n)], dtype=object),
               "secondary_id": np.array([f"s{j}" for j in range(50)], dtype=object)}
        for name, values in ids.items():
            columns.add_ids(name, values)
    want = _brute(lk, list(columns), ids)
    assert columns.rows == len(want)
    chunks = list(columns.chunks(chunk))
    joined = {c: np.concatenate([part[c] for part in chunks]) for c in columns}
    pd.testing.assert_frame_equal(pd.DataFrame(joined), want, check_dtype=False)
    pd.testing.assert_frame_equal(pd.DataFrame(dict(columns)), want, check_dtype=False)


def test_the_primary_view_holds_only_what_the_primary_receives() -> None:
    lk = _linkage(6, 3, 1, model=True)
    columns = LinkColumns(lk, view="primary")
    assert list(columns) == ["primary_index", "secondary_index", "rank", "similarity",
                             "match_probability", "match"]
    assert np.isfinite(columns["match_probability"]).all()


@pytest.mark.parametrize("layout", ["single", "parts", "csv"])
@pytest.mark.parametrize("missing", [False, True])
def test_the_streamed_file_equals_the_links_in_memory(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      layout: str, missing: bool) -> None:
    # small parts and row groups, so that the links go in many chunks through the threads
    monkeypatch.setattr(parts_mod, "PART_ROWS", 37)
    monkeypatch.setattr("vflink.runner.link.write.PART_ROWS", 37)
    monkeypatch.setattr(sink_mod, "PART_ROWS", 37)
    monkeypatch.setattr(sink_mod, "ROW_GROUP_ROWS", 29)
    monkeypatch.setattr("vflink.runner.link.write.ROW_GROUP_ROWS", 29)
    lk = _linkage(83, 4, 7, missing=missing)
    columns = LinkColumns(lk)
    out = tmp_path / ("links.csv" if layout == "csv" else "links.parquet")
    write_links(columns, out, parts=layout == "parts")
    in_memory = pd.DataFrame(dict(columns))
    if layout == "csv":
        pd.testing.assert_frame_equal(pd.read_csv(out), pd.read_csv(
            __import__("io").StringIO(in_memory.to_csv(index=False, float_format="%.6g"))))
        return
    got = read_parts(out).to_pandas()
    pd.testing.assert_frame_equal(got, in_memory)
    if layout == "parts":
        manifest = json.loads((out / "_vflink.json").read_text())
        assert manifest["rows"] == columns.rows and manifest["parts"] == -(-columns.rows // 37)
    else:
        meta = pq.ParquetFile(out)
        assert meta.metadata.num_row_groups == -(-columns.rows // 29)
        assert b"vflink.columns" in meta.schema_arrow.metadata
        assert not meta.schema_arrow.field("distance").nullable  # numbers: never null
    # the same bytes as the whole table written at once
    whole = tmp_path / ("whole" + out.suffix)
    write_links(dict(columns), whole, parts=layout == "parts")
    if layout == "single":
        assert whole.read_bytes() == out.read_bytes()


@pytest.mark.parametrize("parts", [True, False])
def test_a_failed_write_publishes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          parts: bool) -> None:
    """A write that fails in a writer thread (the disk full at the second part or row
    group): the error reaches the caller and no output appears, not even a partial one."""
    monkeypatch.setattr(sink_mod, "PART_ROWS", 10)
    monkeypatch.setattr(sink_mod, "ROW_GROUP_ROWS", 10)
    calls = []
    target = (parts_mod.PartitionedWriter, "_write_part") if parts else (ColumnSink,
                                                                        "_write_group")
    original = getattr(*target)

    def failing(self: object, *args: object) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise OSError("No space left on device")
        original(self, *args)

    monkeypatch.setattr(*target, failing)
    out = tmp_path / "links.parquet"
    chunk = {"a": np.arange(10, dtype=np.int64), "b": np.ones(10)}
    with pytest.raises(OSError, match="No space"), ColumnSink(out, rows=50, parts=parts) as sink:
        for _ in range(5):
            sink.write(chunk)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == []


def _tables(tmp_path: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    p, s = tmp_path / "p.parquet", tmp_path / "s.parquet"
    pd.DataFrame({"x": rng.random(40), "y": rng.random(40)}).to_parquet(p)
    pd.DataFrame({"x": rng.random(60), "y": rng.random(60)}).to_parquet(s)
    return p, s


def test_charts_only_when_asked_for(tmp_path: Path) -> None:
    p, s = _tables(tmp_path)
    out = tmp_path / "links.parquet"
    curve = tmp_path / "links.parquet.similarity.png"
    plain = vflink.link(p, s, on="x,y", metric="euclidean", top_k=3, seed=0, out=out)
    assert not curve.exists() and plain.summary["stages"]["charts"] == "none"
    assert plain.summary["charts"].startswith("none drawn")
    assert plain.summary["moments"].startswith("exact")
    assert set(plain.summary["step_seconds"]) == {"read", "encode", "search", "moments",
                                                  "noise", "write", "charts"}
    drawn = vflink.link(p, s, on="x,y", metric="euclidean", top_k=3, seed=0, out=out,
                        overwrite=True, charts=True)
    assert curve.stat().st_size > 1000
    assert drawn.summary["charts"] == [curve.name]
    assert drawn.summary["stage_seconds"]["charts"] > 0
    # the same links either way; a later link without charts takes the old figure away
    assert drawn.frame.equals(plain.frame)
    vflink.link(p, s, on="x,y", metric="euclidean", top_k=3, seed=0, out=out, overwrite=True)
    assert not curve.exists()


def test_len_needs_no_column(tmp_path: Path) -> None:
    p, s = _tables(tmp_path)
    links = vflink.link(p, s, on="x,y", metric="euclidean", top_k=3, seed=0)
    assert len(links) == 120
    assert isinstance(links.columns, LinkColumns) and not links.columns._whole


@pytest.mark.parametrize("parts", [False, True], ids=["file", "parts"])
def test_space_reserved_up_front_leaves_the_very_bytes(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     parts: bool) -> None:
    """The file's space is allocated before it is written (reserve_space) and the file then
    cut at the end of what was written: the same bytes as a write with no reservation, and
    not one byte more (no reserved tail past the footer)."""
    monkeypatch.setattr(sink_mod, "PART_ROWS", 300)
    monkeypatch.setattr(sink_mod, "ROW_GROUP_ROWS", 300)
    monkeypatch.setattr(parts_mod, "PART_ROWS", 300)
    links = LinkColumns(_linkage(97, 7, 3))
    calls: list[int] = []
    real = sink_mod.reserve_space

    def counted(fd: int, size: int) -> bool:
        calls.append(size)
        return real(fd, size)

    outputs = {}
    for name, reserve in (("reserved", counted), ("plain", lambda fd, size: False)):
        monkeypatch.setattr(sink_mod, "reserve_space", reserve)
        monkeypatch.setattr(parts_mod, "reserve_space", reserve)
        out = tmp_path / name / "links.parquet"
        write_links(links, out, parts=parts)
        outputs[name] = out
    files = (sorted(p.name for p in outputs["plain"].iterdir() if p.suffix == ".parquet")
             if parts else [""])
    assert len(calls) == len(files) and all(size > 0 for size in calls)
    for name in files:
        assert ((outputs["reserved"] / name).read_bytes()
                == (outputs["plain"] / name).read_bytes()), name
    if not parts:  # reserved for the whole file: 679 rows of five 8-byte columns, and more
        assert calls[0] >= 679 * 40 > (outputs["plain"]).stat().st_size


@pytest.mark.parametrize("charts", [False, True], ids=["no-charts", "charts"])
def test_delta_is_estimated_beside_the_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             charts: bool) -> None:
    """Δ (FedSim §4.3) is the summary's figure only: estimated on a thread of its own while the
    links are written, before the charts that show it; the summary's figures are
    improvement_estimates' of the link's linkage, to the bit."""
    import threading

    import vflink.linkage.improvement as improvement_mod
    import vflink.runner.link.write as write_mod

    events: list[tuple[str, str]] = []
    real_estimates, real_write = improvement_mod.improvement_estimates, write_mod.write_links

    def estimates(linkage: SoftLinkage) -> dict[str, float]:
        events.append(("delta", threading.current_thread().name))
        return real_estimates(linkage)

    def write(*args: object, **kwargs: object) -> None:
        events.append(("write", threading.current_thread().name))
        real_write(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(improvement_mod, "improvement_estimates", estimates)
    monkeypatch.setattr(write_mod, "write_links", write)
    p, s = _tables(tmp_path)
    links = vflink.link(p, s, on="x,y", metric="euclidean", top_k=3, seed=0,
                        out=tmp_path / "links.parquet", charts=charts)
    assert sorted(events) == [("delta", "vflink-beside"), ("write", "MainThread")]
    assert links.summary["improvement_delta"] == real_estimates(links.outcome.linkage)
    if charts:
        assert links.summary["charts"] == ["links.parquet.similarity.png"]


def test_an_error_in_delta_is_the_link_s_error(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import vflink.linkage.improvement as improvement_mod

    def broken(linkage: SoftLinkage) -> dict[str, float]:
        raise MemoryError("no room for Δ")

    monkeypatch.setattr(improvement_mod, "improvement_estimates", broken)
    p, s = _tables(tmp_path)
    with pytest.raises(MemoryError, match="no room"):
        vflink.link(p, s, on="x,y", metric="euclidean", top_k=3, seed=0,
                    out=tmp_path / "links.parquet")
