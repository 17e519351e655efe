"""The streamed ``vflink link``: tables read, encoded and searched in chunks, links
written chunk by chunk; the output equals the in-memory link's byte for byte (Parquet, CSV,
parts), its summary and Figure 4 too, on numeric and string identifiers, privacy on and off,
with and without noise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vflink
from vflink.data.parts import is_partitioned
from vflink.engine import ComputeConfig, LocalEngine
from vflink.errors import ConfigError, LinkageError
from vflink.linkage.moments import ExactSum, exact_moments
from vflink.runner.link.read import table_rows

WORDS = ["anna", "bert", "carla", "dieter", "emil", "frieda", "gustav", "hanna"]
CASES = [("euclidean", ("x", "y")), ("haversine", ("lat", "lon")), ("levenshtein", ("name",)),
         ("hamming", ("name",))]
SKIP = ("seconds", "phase_seconds", "stage_seconds", "step_seconds", "stages", "communication",
        "charts")


def _write(tmp: Path, n: int, m: int, seed: int) -> tuple[Path, Path]:
    rng = np.random.default_rng(seed)

    def frame(k: int) -> pd.DataFrame:
        return pd.DataFrame({
            "x": rng.integers(0, 20, k) / 4.0,  # coarse: ties at the K-th distance are common
            "y": rng.uniform(0, 10, k), "lat": rng.uniform(-60, 60, k),
            "lon": rng.uniform(-170, 170, k),
            "name": [f"{rng.choice(WORDS)} {rng.choice(WORDS)}{rng.integers(0, 9)}"
                     for _ in range(k)]})

    p, s = tmp / "p.csv", tmp / "s.parquet"
    frame(n).to_csv(p, index=False)
    frame(m).to_parquet(s)
    return p, s


def _in_memory(p: Path, s: Path, out: Path, **kw: object) -> dict[str, object]:
    links = vflink.link(p, s, out=out, overwrite=True, stream=False, seed=5, **kw)  # type: ignore[arg-type]
    return links.summary


def _strip(summary: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in summary.items() if k not in SKIP}


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 60), m=st.integers(3, 90), chunk=st.integers(1, 40),
       case=st.sampled_from(CASES), privacy=st.sampled_from(["bloom", "off"]),
       sigma=st.sampled_from([None, 0.25]), suffix=st.sampled_from([".parquet", ".csv"]),
       seed=st.integers(0, 10**6))
def test_streamed_equals_in_memory(tmp_path_factory: pytest.TempPathFactory, n: int, m: int,
                                   chunk: int, case: tuple[str, tuple[str, ...]],
                                   privacy: str, sigma: float | None, suffix: str,
                                   seed: int) -> None:
    tmp = tmp_path_factory.mktemp("stream")
    p, s = _write(tmp, n, m, seed)
    metric, on = case
    k = min(3, m)
    kw = dict(on=list(on), metric=metric, top_k=k, privacy=privacy, sigma=sigma, charts=True)
    try:
        want = _in_memory(p, s, tmp / f"mem{suffix}", **kw)
    except LinkageError as refused:  # the private default out of reach: refused alike
        assert "private default" in str(refused)
        with pytest.raises(LinkageError) as streamed_refused:
            vflink.link(p, s, out=tmp / f"st{suffix}", overwrite=True, stream=True, seed=5,
                        chunk_rows=chunk, **kw)  # type: ignore[arg-type]
        assert "private default" in str(streamed_refused.value)
        assert not (tmp / f"st{suffix}").exists() and not (tmp / f"mem{suffix}").exists()
        return
    streamed = vflink.link(p, s, out=tmp / f"st{suffix}", overwrite=True, stream=True, seed=5,
                           chunk_rows=chunk, **kw)  # type: ignore[arg-type]
    assert streamed.streamed and streamed.summary["stages"]["read"] == "batches"
    assert (tmp / f"st{suffix}").read_bytes() == (tmp / f"mem{suffix}").read_bytes()
    got = streamed.summary
    assert set(got) == set(want)
    for key, value in _strip(want).items():
        if key == "improvement_delta":  # accumulated per chunk: equal to rounding
            assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12)
        else:
            assert got[key] == value, key
    if k > 1:  # Figure 4 from the same rows
        assert ((tmp / f"st{suffix}.similarity.png").read_bytes()
                == (tmp / f"mem{suffix}.similarity.png").read_bytes())


def test_parts_and_engine(tmp_path: Path) -> None:
    """A partitioned output (parts of PART_ROWS rows) equal part by part, on the engine's map
    with chunk tasks (the local engine with 2 workers)."""
    p, s = _write(tmp_path, 150, 220, 1)
    kw = dict(on=["x", "y"], metric="euclidean", top_k=4, privacy="bloom", parts=True)
    _in_memory(p, s, tmp_path / "mem.parquet", **kw)
    with LocalEngine(ComputeConfig(engine="local", num_cpus=2, chunk_rows=32)) as engine:
        links = vflink.link(p, s, out=tmp_path / "st.parquet", overwrite=True, stream=True,
                            seed=5, compute=engine, **kw)  # type: ignore[arg-type]
    assert links.streamed and len(links) == 600
    assert is_partitioned(tmp_path / "st.parquet")
    for name in ("part-00000.parquet", "_vflink.json"):
        assert ((tmp_path / "st.parquet" / name).read_bytes()
                == (tmp_path / "mem.parquet" / name).read_bytes())
    mem = pd.read_parquet(tmp_path / "mem.parquet")
    pd.testing.assert_frame_equal(links.frame, mem)


def test_threshold_and_refusals(tmp_path: Path) -> None:
    p, s = _write(tmp_path, 5, 9, 2)
    assert table_rows(p) == 5 and table_rows(s) == 9
    small = vflink.link(p, s, on=["x", "y"], metric="euclidean", top_k=2, seed=1,
                        out=tmp_path / "a.csv")
    assert not small.streamed  # below STREAM_ROWS: in memory, as before
    with pytest.raises(ConfigError, match="record ids"):
        vflink.link(p, s, on=["x", "y"], metric="euclidean", top_k=2, id="name",
                    out=tmp_path / "b.csv", stream=True)
    with pytest.raises(ConfigError, match="needs `out`"):
        vflink.link(p, s, on=["x", "y"], metric="euclidean", top_k=2, stream=True)


def test_exact_moments_order_free() -> None:
    rng = np.random.default_rng(0)
    d = rng.gamma(2.0, 3.0, size=(400, 7))
    mean, std = exact_moments(d)
    assert mean == pytest.approx(d.mean(), rel=1e-15) and std == pytest.approx(d.std(), rel=1e-14)
    acc = ExactSum()
    for part in np.array_split(d.ravel()[rng.permutation(d.size)], 13):
        acc.add(part)
    assert acc.mean() == mean and acc.count == d.size


def test_cli_stream(tmp_path: Path) -> None:
    """``vflink link --stream`` as a user runs it: the same file and summary as --no-stream."""
    p, s = _write(tmp_path, 80, 120, 4)
    for flag in ("--stream", "--no-stream"):
        done = subprocess.run(
            [sys.executable, "-m", "vflink.cli.main", "link", "--primary", str(p),
             "--secondary", str(s), "--on", "name", "--metric", "levenshtein", "--top-k", "3",
             "--seed", "2", "--sigma", "0.5", "--out", str(tmp_path / f"l{flag}.parquet"),
             flag],
            capture_output=True, text=True, timeout=300, check=False,
            env={"PATH": "", "VFLINK_SECRET": "a-secret-for-the-test-only", "PYTHONPATH":
                 str(Path(vflink.__file__).parents[1])})
        assert done.returncode == 0, done.stderr[-2000:]
    a, b = tmp_path / "l--stream.parquet", tmp_path / "l--no-stream.parquet"
    assert a.read_bytes() == b.read_bytes()
    sa, sb = (_strip(json.loads(Path(f"{x}.summary.json").read_text())) for x in (a, b))
    assert sa == sb
