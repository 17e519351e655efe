"""``vflink align`` reads its keys from the files in batches and streams its outputs:
the outputs equal the whole-table path's, and ``chunk_rows`` (``--chunk-rows``, a party file's
``[compute] chunk_rows``) sizes every protocol message."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tests.helpers.network import served_in_threads
from tests.integration.test_set_alignment import _party_files, check_psi, check_psu
from vflink.alignment._dh import key_bytes
from vflink.alignment.cost import OPERATIONS, ROLES, OpCosts, crypto_bound_s, protocol_ops
from vflink.cli.main import main
from vflink.errors import DataError
from vflink.protocol.messages import PsiChunk, PsuChunk, SetChunk
from vflink.runfiles.party import load_party_config
from vflink.runner.align import (
    KeyFile,
    align_in_process,
    align_over_network,
    file_key_batches,
    key_table,
)
from vflink.transport import Transcript


def _pairs(a: pd.DataFrame, b: pd.DataFrame) -> list[tuple[int, int]]:
    """(primary row, secondary row) sharing a UID, -1 for a UID one side lacks: what a run
    decides (the UIDs themselves are fresh secret draws every run)."""
    m = a.merge(b, on="uid", how="outer", suffixes=("_p", "_s"))
    return sorted(zip(m.row_p.fillna(-1).astype(int), m.row_s.fillna(-1).astype(int)))


def _keys(rng: np.random.Generator, n: int, pool: int) -> list[str]:
    return [f"{i:06d}" for i in rng.choice(pool, n, replace=False)]


@pytest.mark.parametrize(("n_a", "n_p", "chunk"), [(23, 17, 1), (40, 55, 7), (120, 90, 50)])
def test_cli_equals_whole_table_path(n_a: int, n_p: int, chunk: int, tmp_path: Path) -> None:
    rng = np.random.default_rng(n_a * 1000 + n_p)
    ka, kp = _keys(rng, n_a, 2 * max(n_a, n_p, 1)), _keys(rng, n_p, 2 * max(n_a, n_p, 1))
    # a CSV (semicolons, latin-1, a wide table) and a Parquet file
    pd.DataFrame({"x": np.arange(n_a), "id": ka, "name": ["é"] * n_a}).to_csv(
        tmp_path / "a.csv", index=False, sep=";", encoding="latin-1")
    pd.DataFrame({"id": kp, "y": np.arange(n_p)}).to_parquet(tmp_path / "b.parquet")
    for method, check in (("psu", check_psu), ("psi", check_psi)):
        out = tmp_path / f"cli-{method}"
        assert main(["align", "--method", method, "--primary", str(tmp_path / "a.csv"),
                     "--secondary", str(tmp_path / "b.parquet"), "--on", "id", "--out",
                     str(out), "--delimiter", ";", "--encoding", "latin-1",
                     "--chunk-rows", str(chunk)]) == 0
        a, b = pd.read_parquet(out / "primary.parquet"), pd.read_parquet(out / "secondary.parquet")
        check(ka, kp, a, b)
        # the whole-table path (tables in memory, results held, then written)
        old = align_in_process(
            key_table(tmp_path / "a.csv", ("id",), name="primary", delimiter=";",
                      encoding="latin-1"),
            key_table(tmp_path / "b.parquet", ("id",), name="secondary"), method=method)
        assert old.secondary is not None
        assert _pairs(a, b) == _pairs(old.primary.frame(), old.secondary.frame())
        assert list(a["row"]) == list(old.primary.frame()["row"])  # row order too
        summary = json.loads((out / "summary.json").read_text())
        assert summary["sizes"] == old.summary()["sizes"]


def test_an_empty_primary_table_is_refused_before_any_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A peer refuses a set of size 0 (n_a must be positive): the primary says so itself."""
    pd.DataFrame({"id": pd.Series([], dtype=str)}).to_csv(tmp_path / "a.csv", index=False)
    pd.DataFrame({"id": ["1", "2"]}).to_parquet(tmp_path / "b.parquet")
    for method in ("psu", "psi"):
        assert main(["align", "--method", method, "--primary", str(tmp_path / "a.csv"),
                     "--secondary", str(tmp_path / "b.parquet"), "--on", "id", "--out",
                     str(tmp_path / f"out-{method}")]) == 2
        assert "nothing to align" in " ".join(capsys.readouterr().err.split())


def _chunk_sizes(transcript: Transcript) -> dict[str, list[int]]:
    sizes: dict[str, list[int]] = {}
    for r in transcript.records:
        m = r.message
        if isinstance(m, (PsuChunk, PsiChunk, SetChunk)):
            sizes.setdefault(m.stream, []).append(len(m.elements))
    return sizes


def _check_chunked(sizes: dict[str, list[int]], chunk: int) -> None:
    assert sizes
    for stream, got in sizes.items():
        total = sum(got)
        assert all(0 < n <= chunk for n in got) or total == 0, stream
        assert len(got) == max(1, math.ceil(total / chunk)), stream


@pytest.mark.parametrize("method", ["psu", "psi"])
@pytest.mark.parametrize("chunk", [4, 1000])
def test_chunk_rows_sizes_the_messages(method: str, chunk: int, tmp_path: Path) -> None:
    pd.DataFrame({"id": [f"k{i}" for i in range(30)]}).to_csv(tmp_path / "a.csv", index=False)
    pd.DataFrame({"id": [f"k{i}" for i in range(15, 41)]}).to_parquet(tmp_path / "b.parquet")
    transcript = Transcript()
    outcome = align_in_process(KeyFile(tmp_path / "a.csv", ("id",), "primary"),
                               KeyFile(tmp_path / "b.parquet", ("id",), "secondary"),
                               method=method, chunk_rows=chunk, transcript=transcript,
                               out=tmp_path / "out")
    _check_chunked(_chunk_sizes(transcript), chunk)
    assert outcome.primary.path == tmp_path / "out" / "primary.parquet"
    both = 15 if method == "psi" else 41
    assert outcome.primary.size == both
    # the CLI: --chunk-rows decides the number of messages
    counts = {}
    for c in (4, 1000):
        out = tmp_path / f"cli-{c}"
        assert main(["align", "--method", method, "--primary", str(tmp_path / "a.csv"),
                     "--secondary", str(tmp_path / "b.parquet"), "--on", "id", "--out",
                     str(out), "--chunk-rows", str(c)]) == 0
        counts[c] = json.loads((out / "summary.json").read_text())["messages"]
    assert counts[4]["primary->secondary"] > counts[1000]["primary->secondary"]


@pytest.mark.network
def test_party_file_chunk_rows_reaches_the_protocol(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFLINK_SECRET", "not-used-by-psu-but-required-to-serve")
    ka, kp = [f"{i:04d}" for i in range(0, 25)], [f"{i:04d}" for i in range(10, 40)]
    pd.DataFrame({"id": kp, "x": np.arange(len(kp))}).to_csv(tmp_path / "bank.csv", index=False)
    pd.DataFrame({"id": ka}).to_parquet(tmp_path / "mine.parquet")
    pri, sec = _party_files(tmp_path, tmp_path / "bank.csv")
    pri.write_text(pri.read_text() + "[compute]\nchunk_rows = 6\n")
    sec.write_text(sec.read_text() + "[compute]\nchunk_rows = 5\n")  # its own batches only
    with served_in_threads(sec):
        for method, check in (("psu", check_psu), ("psi", check_psi)):
            transcript = Transcript()
            out = align_over_network(KeyFile(tmp_path / "mine.parquet", ("id",), "primary"),
                                     load_party_config(pri), "bank", method=method,
                                     transcript=transcript, out=tmp_path / method)
            _check_chunked(_chunk_sizes(transcript), 6)
            theirs = pd.read_parquet(tmp_path / "state" / "alignments" /
                                     f"{out.primary.session}.parquet")
            check(ka, kp, pd.read_parquet(tmp_path / method / "primary.parquet"), theirs)


def test_duplicate_keys_refused_as_in_memory(tmp_path: Path) -> None:
    keys = [f"k{i}" for i in range(40)]
    keys[31] = keys[7]
    keys[35] = keys[2]
    frame = pd.DataFrame({"id": keys})
    frame.to_csv(tmp_path / "a.csv", index=False)
    with pytest.raises(DataError) as whole:
        key_bytes(frame, ("id",), who="t")
    for chunk in (3, 100):
        with pytest.raises(DataError, match="duplicate key at row 31") as streamed:
            file_key_batches(KeyFile(tmp_path / "a.csv", ("id",), "a"), chunk_rows=chunk)
        assert str(streamed.value).split(": ", 1)[1] == str(whole.value).split(": ", 1)[1]
    with pytest.raises(DataError, match=r"key column\(s\) \['nope'\] not found"):
        file_key_batches(KeyFile(tmp_path / "a.csv", ("nope",), "a"), chunk_rows=5)


@pytest.mark.parametrize(("method", "reveal"), [("psu", "both"), ("psi", "primary")])
def test_summary_reports_the_run_against_its_crypto_bound(
        method: str, reveal: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ka, kp = [f"{i:04d}" for i in range(0, 30)], [f"{i:04d}" for i in range(12, 50)]
    pd.DataFrame({"id": ka}).to_csv(tmp_path / "a.csv", index=False)
    pd.DataFrame({"id": kp}).to_csv(tmp_path / "b.csv", index=False)
    out = tmp_path / "out"
    assert main(["align", "--method", method, "--reveal", reveal, "--primary",
                 str(tmp_path / "a.csv"), "--secondary", str(tmp_path / "b.csv"), "--on", "id",
                 "--out", str(out), "--workers", "1"]) == 0
    bound = json.loads((out / "summary.json").read_text())["crypto_bound"]
    union = len(set(ka) | set(kp)) if method == "psu" else None
    both = len(set(ka) & set(kp)) if method == "psi" else 0
    ops = {role: protocol_ops(method, role, n_a=30, n_p=38, n_union=union, n_both=both,
                              reveal=reveal) for role in ROLES}
    assert bound["operations"] == {role: o.as_dict() for role, o in ops.items()}
    assert bound["cores"] == 1  # --workers 1
    mean = bound["us_per_operation"]["mean"]
    for op in OPERATIONS:
        us = [bound["us_per_operation"][when][op] for when in ("before", "after")]
        assert us[0] > 0 and us[1] > 0 and mean[op] == pytest.approx(sum(us) / 2, abs=0.02)
    costs = OpCosts(**{op: mean[op] / 1e6 for op in OPERATIONS})
    assert bound["seconds"] == pytest.approx(crypto_bound_s(ops.values(), costs, 1), rel=1e-3)
    assert bound["ratio"] == pytest.approx(bound["wall_seconds"] / bound["seconds"], rel=1e-2)
    line = " ".join(capsys.readouterr().err.split())
    assert f"{bound['ratio']:.2f}× its crypto bound of {bound['seconds']:.2g} s on 1 core" \
        in line


@pytest.mark.network
@pytest.mark.parametrize("cut", [1, 3, 7])
def test_a_served_table_read_in_short_batches_aligns_as_a_whole_one(
        cut: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A served party's reader may cut its batches shorter than asked (a CSV block, a Parquet
    row group ends): PSU's line 12 still answers fetch ``i`` with exactly rows
    ``[i·chunk, (i+1)·chunk)`` of its table, and both outputs pair the plaintext sets."""
    from vflink.data.streamed import StreamedTable
    from vflink.data.table import PartyTable

    def shorter(whole: Any) -> Any:
        def batches(self: PartyTable, columns: Any = None, **kw: Any) -> Any:
            for frame in whole(self, columns, **kw):
                for lo in range(0, len(frame), cut):  # pieces of `cut` rows, under a chunk
                    yield frame.iloc[lo:lo + cut]
        return batches

    for cls in (PartyTable, StreamedTable):  # a small table is read whole, a large streamed
        monkeypatch.setattr(cls, "batches", shorter(cls.batches))
    monkeypatch.setenv("VFLINK_SECRET", "not-used-by-psu-but-required-to-serve")
    ka, kp = [f"{i:04d}" for i in range(0, 33)], [f"{i:04d}" for i in range(12, 50)]
    pd.DataFrame({"id": kp, "x": np.arange(len(kp))}).to_csv(tmp_path / "bank.csv", index=False)
    pd.DataFrame({"id": ka}).to_parquet(tmp_path / "mine.parquet")
    pri, sec = _party_files(tmp_path, tmp_path / "bank.csv")
    for p in (pri, sec):
        p.write_text(p.read_text() + "[compute]\nchunk_rows = 8\n")
    with served_in_threads(sec):
        for method, check in (("psu", check_psu), ("psi", check_psi)):
            out = align_over_network(KeyFile(tmp_path / "mine.parquet", ("id",), "primary"),
                                     load_party_config(pri), "bank", method=method,
                                     out=tmp_path / method)
            theirs = pd.read_parquet(tmp_path / "state" / "alignments" /
                                     f"{out.primary.session}.parquet")
            check(ka, kp, pd.read_parquet(tmp_path / method / "primary.parquet"), theirs)
