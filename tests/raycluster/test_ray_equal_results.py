"""The same results on both engines: link, align psi/psu and training, local vs a
two-node Ray cluster on loopback, in one process and across gRPC."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tests.helpers.links import linked
from tests.helpers.network import free_port, served_in_threads
from tests.raycluster.conftest import RAY_REASON
from vflink.alignment.groups import get_group
from vflink.engine import ComputeConfig, LocalEngine, RayEngine
from vflink.linkage import METRICS, BloomEncoder, search_blocked, search_chunked
from vflink.linkage.encoding import RawEncoder, StringEncoder, encode_chunked
from vflink.runfiles.config import parse_config
from vflink.runfiles.party import load_party_config
from vflink.runner.align import align_in_process, align_over_network, key_table
from vflink.runner.train import run_training

pytest.importorskip("ray", reason=RAY_REASON)
pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


@pytest.fixture
def engine(ray_cluster: str) -> RayEngine:
    # small chunks: several tasks on both nodes even for test-sized tables
    return RayEngine(ComputeConfig(engine="ray", address=ray_cluster, chunk_rows=1500))


def test_search_and_encoding_equal(engine: RayEngine) -> None:
    rng = np.random.default_rng(3)
    p, s = rng.normal(size=(2000, 3)), rng.normal(size=(3500, 3))
    whole = METRICS.get("euclidean").search(p, s, 10)
    got = search_chunked("euclidean", p, s, 10, compute=engine)
    np.testing.assert_array_equal(got.distances, whole.distances)
    np.testing.assert_array_equal(got.indices, whole.indices)
    words = [f"name {i % 97} {i}" for i in range(5000)]
    for encoder, values in ((BloomEncoder(secret=b"k" * 32), words),
                            (StringEncoder(), words), (RawEncoder(), p)):
        want = encoder.encode(values)
        got_enc = encode_chunked(encoder, values, engine)
        if isinstance(want, list):
            assert got_enc == want
        else:
            np.testing.assert_array_equal(got_enc, want)


def test_blocked_search_equal(engine: RayEngine) -> None:
    """Blocking keys partition the search, a skewed block is split by comparison count
    (as anonlink and Splink do): the packages' partial top-Ks merge to the same links on Ray
    as here."""
    rng = np.random.default_rng(4)
    p, s = rng.normal(size=(1500, 2)), rng.normal(size=(2500, 2))
    kp = rng.choice(["big", "a", "b", "c", ""], 1500, p=[0.8, 0.05, 0.05, 0.05, 0.05])
    ks = rng.choice(["big", "a", "b", "d"], 2500, p=[0.85, 0.05, 0.05, 0.05])
    local = search_blocked("euclidean", p, s, 10, primary_keys=kp, secondary_keys=ks,
                           max_comparisons=200_000)
    got = search_blocked("euclidean", p, s, 10, primary_keys=kp, secondary_keys=ks,
                         max_comparisons=200_000, compute=engine)
    np.testing.assert_array_equal(got.distances, local.distances)
    np.testing.assert_array_equal(got.indices, local.indices)


def test_streamed_link_equal(engine: RayEngine, tmp_path: Path) -> None:
    """Tables read in batches by the tasks, links written part by part: the same dataset on
    Ray as in this process."""
    from vflink.data.parts import read_parts
    from vflink.linkage.streamed import link_streamed

    rng = np.random.default_rng(6)
    pd.DataFrame(rng.uniform(0, 50, (900, 2)), columns=["x", "y"]).to_parquet(tmp_path / "p.pq")
    pd.DataFrame(rng.uniform(0, 50, (2100, 2)), columns=["x", "y"]).to_parquet(
        tmp_path / "s.parquet")
    options = {"on": ["x", "y"], "top_k": 10, "chunk_rows": 200, "partition_rows": 500,
               "sigma": 0.3, "seed": 2}
    link_streamed(tmp_path / "p.pq", tmp_path / "s.parquet", out=tmp_path / "local.parquet",
                  **options)
    link_streamed(tmp_path / "p.pq", tmp_path / "s.parquet", out=tmp_path / "ray.parquet",
                  compute=engine, **options)
    assert read_parts(tmp_path / "ray.parquet").equals(read_parts(tmp_path / "local.parquet"))


def test_group_operations_equal(engine: RayEngine) -> None:
    keys = [f"{i}".encode() for i in range(6000)]
    here, there = get_group("ristretto255", workers=1), get_group("ristretto255",
                                                                  compute=engine)
    e = here.random_exponent()
    h = here.hash_to_group(keys)
    np.testing.assert_array_equal(there.hash_to_group(keys), h)
    done: list[int] = []
    np.testing.assert_array_equal(there.power(h, e, progress=done.append), here.power(h, e))
    assert sum(done) == len(h) and len(done) > 1  # progress across tasks
    there.validate(h, "h")


def _tables(tmp: Path, n: int = 5000) -> tuple[Path, Path]:
    rng = np.random.default_rng(5)
    a, b = rng.choice(3 * n, n, replace=False), rng.choice(3 * n, n, replace=False)
    pd.DataFrame({"id": a, "x": rng.normal(size=n)}).to_csv(tmp / "p.csv", index=False)
    pd.DataFrame({"id": b, "x": rng.normal(size=n)}).to_csv(tmp / "s.csv", index=False)
    return tmp / "p.csv", tmp / "s.csv"


def _pairs(primary: pd.DataFrame, secondary: pd.DataFrame) -> list[tuple[int, int]]:
    """Which primary row meets which secondary row under one UID (UIDs themselves are fresh
    per run: the exponents are secret random draws)."""
    m = primary.merge(secondary, on="uid", how="outer", suffixes=("_p", "_s"))
    return sorted(zip(m.row_p.fillna(-1).astype(int), m.row_s.fillna(-1).astype(int)))


@pytest.mark.parametrize("method", ["psu", "psi"])
def test_align_in_process_equal(engine: RayEngine, method: str, tmp_path: Path) -> None:
    p, s = _tables(tmp_path)
    tp, ts = key_table(p, ("id",), name="primary"), key_table(s, ("id",), name="secondary")
    # the same chunk size on both engines: the lists travel in the same chunks
    local = align_in_process(tp, ts, method=method,
                             compute=LocalEngine(ComputeConfig(chunk_rows=1500)))
    ray = align_in_process(tp, ts, method=method, compute=engine)
    assert ray.primary.sizes == local.primary.sizes
    assert _pairs(ray.primary.frame(), ray.secondary.frame()) == _pairs(
        local.primary.frame(), local.secondary.frame())
    assert ray.communication == local.communication  # the same messages cross


@pytest.mark.parametrize("method", ["psu", "psi"])
def test_chunked_set_alignment_equal_to_one_chunk(engine: RayEngine, method: str,
                                                  tmp_path: Path) -> None:
    """Streamed in chunks of 1,500 on the Ray cluster = one chunk per list locally."""
    p, s = _tables(tmp_path)
    tp, ts = key_table(p, ("id",), name="primary"), key_table(s, ("id",), name="secondary")
    whole = align_in_process(tp, ts, method=method)  # local, chunk_rows 100,000: one chunk
    ray = align_in_process(tp, ts, method=method, compute=engine)
    assert ray.primary.sizes == whole.primary.sizes
    assert np.array_equal(ray.primary.rows, whole.primary.rows)
    assert _pairs(ray.primary.frame(), ray.secondary.frame()) == _pairs(
        whole.primary.frame(), whole.secondary.frame())
    # more, smaller messages
    assert sum(v["messages"] for v in ray.communication.values()) > sum(
        v["messages"] for v in whole.communication.values())


def _served_files(tmp: Path, s: Path, cluster: str) -> tuple[Path, Path]:
    port = free_port()
    sec = tmp / "bank.toml"
    sec.write_text(
        f'version = 1\n[party]\nname = "bank"\nrole = "secondary"\nlisten = "127.0.0.1:{port}"\n'
        f'state_dir = "{tmp / "state"}"\n[party.table]\npath = "{s}"\nkey = ["id"]\n'
        f'[peers.coordinator]\naddress = "127.0.0.1:{free_port()}"\nrole = "coordinator"\n'
        f'[security]\ninsecure = true\nallowed = ["primary"]\n'
        f'[compute]\nengine = "ray"\naddress = "{cluster}"\nchunk_rows = 1500\n')
    pri = tmp / "primary.toml"
    pri.write_text(
        f'version = 1\n[party]\nname = "primary"\nrole = "primary"\n'
        f'[peers.bank]\naddress = "127.0.0.1:{port}"\nrole = "secondary"\n'
        f'[peers.coordinator]\naddress = "127.0.0.1:{free_port()}"\nrole = "coordinator"\n'
        f'[security]\ninsecure = true\n')
    return pri, sec


@pytest.mark.network
@pytest.mark.parametrize("method", ["psu", "psi"])
def test_align_over_grpc_equal(engine: RayEngine, ray_cluster: str, method: str,
                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFLINK_SECRET", "served-secondary-needs-one")
    p, s = _tables(tmp_path)
    tp = key_table(p, ("id",), name="primary")
    # the primary's chunk size, on both engines: the same chunks cross
    local = align_in_process(tp, key_table(s, ("id",), name="bank"), method=method,
                             compute=LocalEngine(ComputeConfig(chunk_rows=1500)))
    pri, sec = _served_files(tmp_path, s, ray_cluster)
    assert load_party_config(sec).compute.engine == "ray"
    with served_in_threads(sec):  # the secondary's group operations on its own engine
        out = align_over_network(tp, load_party_config(pri), "bank", method=method,
                                 compute=engine, chunk_rows=1500)
    assert out.primary.sizes == local.primary.sizes
    if method == "psu":
        theirs = pd.read_parquet(tmp_path / "state" / "alignments" /
                                 f"{out.primary.session}.parquet")
        assert _pairs(out.primary.frame(), theirs) == _pairs(local.primary.frame(),
                                                             local.secondary.frame())
    else:
        np.testing.assert_array_equal(np.sort(out.primary.rows), np.sort(local.primary.rows))
    assert out.communication == local.communication


def test_link_equal(engine: RayEngine) -> None:
    rng = np.random.default_rng(9)
    p = pd.DataFrame({"x": rng.normal(size=3000), "y": rng.normal(size=3000)})
    s = pd.DataFrame({"x": rng.normal(size=4000), "y": rng.normal(size=4000)})
    kw: dict[str, Any] = {"on": ["x", "y"], "metric": "euclidean", "top_k": 5, "tau": 0.9,
                          "seed": 4}
    local, ray = linked(p, s, **kw), linked(p, s, compute=engine, **kw)
    np.testing.assert_array_equal(ray.linkage.indices, local.linkage.indices)
    np.testing.assert_array_equal(ray.linkage.distances, local.linkage.distances)
    np.testing.assert_array_equal(ray.linkage.similarities, local.linkage.similarities)


def _metrics(run: Path) -> str:
    """The run's metrics as text (NaN, e.g. an attack AUC without positives, equals itself)."""
    return json.dumps(json.loads((run / "metrics.json").read_text())["metrics"],
                      sort_keys=True)


@pytest.mark.parametrize("method", ["soft", "psu"])
def test_training_equal(ray_cluster: str, method: str, tmp_path: Path) -> None:
    algorithm = "fedsim" if method == "soft" else "florist"
    raw: dict[str, Any] = {
        "version": 1, "seed": 0, "algorithm": algorithm,
        "data": {"dataset": "sklearn-small"},
        "alignment": {"method": method, **({"top_k": 3, "tau": 0.9} if method == "soft"
                                           else {})},
        "training": {"epochs": 2, "batch_size": 128, "threads": 1},
        # compared number for number: the seeded noise, behind the one switch
        "privacy": {"reproducible_noise": True}}
    local = run_training(parse_config(raw), tmp_path / "local")
    raw["compute"] = {"engine": "ray", "address": ray_cluster, "chunk_rows": 200}
    ray = run_training(parse_config(raw), tmp_path / "ray")
    assert _metrics(tmp_path / "ray") == _metrics(tmp_path / "local")
    assert ray.best_epoch == local.best_epoch
