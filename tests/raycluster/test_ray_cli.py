"""What a user runs, on both engines: ``vflink link``, ``vflink align --method
psi|psu`` and ``vflink train`` with ``--engine ray --address HEAD`` give the same outputs as
``--engine local``.

Each command runs as its own process (as a user runs it), joining the two-node loopback
cluster of ``conftest.py`` by its address. Outputs are compared whole: the link file byte for
byte, the alignment's row pairing (UIDs are fresh secret draws on every run, on any engine, so
only which rows meet under one UID can be equal), the training run's metrics.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.ray

TIMING_KEYS = {"seconds", "time", "elapsed", "duration", "started", "finished", "wall_seconds",
               "timings", "engine", "compute",
               # vflink align's crypto bound: measured costs and the ratio (its operation
               # counts and cores are compared)
               "us_per_operation", "ratio"}


def _vflink(*args: str, cwd: Path) -> None:
    env = {**os.environ, "VFLINK_SECRET": "both-engines-same-secret", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, "-m", "vflink.cli.main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


def _tables(tmp: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(7)
    n_p, n_s = 400, 600
    lat, lon = rng.uniform(40, 41, n_s), rng.uniform(-74, -73, n_s)
    sec = pd.DataFrame({"id": [f"k{i}" for i in range(n_s)], "lat": lat, "lon": lon,
                        "x0": rng.normal(size=n_s), "x1": rng.normal(size=n_s)})
    take = rng.choice(n_s, n_p, replace=False)
    pri = pd.DataFrame({"id": [f"k{i}" if j % 5 else f"p{j}" for j, i in enumerate(take)],
                        "lat": lat[take] + rng.normal(0, 1e-3, n_p),
                        "lon": lon[take] + rng.normal(0, 1e-3, n_p),
                        "y": (sec.x0.to_numpy()[take] > 0).astype(int)})
    p, s = tmp / "primary.csv", tmp / "secondary.csv"
    pri.to_csv(p, index=False)
    sec.to_csv(s, index=False)
    return p, s


def _strip(obj: Any) -> Any:
    """A JSON value without its timing and engine fields (they differ by design)."""
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in TIMING_KEYS
                and not k.endswith("_seconds") and not k.endswith("_s")}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _engines(ray_cluster: str) -> dict[str, list[str]]:
    return {"local": ["--engine", "local"], "ray": ["--engine", "ray", "--address", ray_cluster]}


def test_link_cli_equal(ray_cluster: str, tmp_path: Path) -> None:
    p, s = _tables(tmp_path)
    for name, flags in _engines(ray_cluster).items():
        _vflink("link", "--primary", str(p), "--secondary", str(s), "--on", "lat,lon",
                "--metric", "euclidean", "--top-k", "5", "--seed", "3",
                "--out", str(tmp_path / f"links-{name}.csv"), *flags, cwd=tmp_path)
    assert (tmp_path / "links-ray.csv").read_bytes() == (tmp_path / "links-local.csv").read_bytes()
    summaries = [_strip(json.loads((tmp_path / f"links-{n}.csv.summary.json").read_text()))
                 for n in ("local", "ray")]
    assert summaries[0] == summaries[1]


def _pairs(out: Path) -> list[tuple[int, int]]:
    a, b = pd.read_parquet(out / "primary.parquet"), pd.read_parquet(out / "secondary.parquet")
    m = a.merge(b, on="uid", how="outer", suffixes=("_p", "_s"))
    return sorted(zip(m.row_p.fillna(-1).astype(int), m.row_s.fillna(-1).astype(int)))


@pytest.mark.parametrize("method", ["psi", "psu"])
def test_align_cli_equal(ray_cluster: str, method: str, tmp_path: Path) -> None:
    p, s = _tables(tmp_path)
    for name, flags in _engines(ray_cluster).items():
        _vflink("align", "--method", method, "--primary", str(p), "--secondary", str(s),
                "--on", "id", "--out", str(tmp_path / f"align-{name}"), *flags, cwd=tmp_path)
    local, ray = tmp_path / "align-local", tmp_path / "align-ray"
    assert _pairs(ray) == _pairs(local)
    expected = 320 if method == "psi" else 680  # 4 of 5 primary keys are the secondary's
    assert len(_pairs(local)) == expected
    assert (_strip(json.loads((ray / "summary.json").read_text()))
            == _strip(json.loads((local / "summary.json").read_text())))


def test_train_cli_equal(ray_cluster: str, tmp_path: Path) -> None:
    run = tmp_path / "run.toml"
    run.write_text('version = 1\nseed = 1\nalgorithm = "fedsim"\n[data]\ndataset = "sklearn"\n'
                   '[data.options]\nn_samples = 600\nsigma_cf = 0.1\nseed = 5\n'
                   '[alignment]\nmethod = "soft"\nmetric = "euclidean"\ntop_k = 3\n'
                   '[training]\nepochs = 2\n[privacy]\nreproducible_noise = true\n')
    for name, flags in _engines(ray_cluster).items():
        _vflink("train", "--config", str(run), "--out", str(tmp_path / f"run-{name}"), *flags,
                cwd=tmp_path)
    got = [_strip(json.loads((tmp_path / f"run-{n}" / "metrics.json").read_text()))
           for n in ("local", "ray")]
    assert got[0] == got[1]


def test_link_cli_streamed_equal(ray_cluster: str, tmp_path: Path) -> None:
    """``vflink link --stream`` with Bloom filters: on Ray with small chunks (tasks
    over chunks × spilled partitions) the file of the in-memory local link, byte for byte."""
    p, s = _tables(tmp_path)
    runs = {"memory": ["--engine", "local", "--no-stream"],
            "local": ["--engine", "local", "--stream"],
            "ray": [*_engines(ray_cluster)["ray"], "--stream"]}
    for name, flags in runs.items():
        config = tmp_path / f"{name}.toml"
        config.write_text("[link]\ntop_k = 5\n\n[compute]\nchunk_rows = 64\n")
        _vflink("link", "--config", str(config), "--primary", str(p), "--secondary", str(s),
                "--on", "lat,lon", "--metric", "euclidean", "--top-k", "5", "--seed", "3",
                "--out", str(tmp_path / f"links-{name}.parquet"), *flags, cwd=tmp_path)
    want = (tmp_path / "links-memory.parquet").read_bytes()
    for name in ("local", "ray"):
        assert (tmp_path / f"links-{name}.parquet").read_bytes() == want


def test_address_local_never_joins_another_cluster(ray_cluster: str, tmp_path: Path) -> None:
    """``--address local`` starts this command's own cluster even while another one runs here.

    The session's cluster (started like ``ray start``: it is the machine's latest, in Ray's
    ``ray_current_cluster`` file) stands for a cluster someone else started. A Ray given no
    address joins that one; a user's shell has no ``RAY_AUTH_MODE=disabled``, and the link's
    tasks placed on its second node could not fetch their input (``OwnerDiedError``): an
    internal error of the coordinator after a minute. Made-up people at the reported size,
    2,000 × 1,600, Bloom-filter haversine, K = 5."""
    import ray

    rng = np.random.default_rng(11)
    lat, lon = rng.uniform(48, 52, 2000), rng.uniform(2, 8, 2000)
    take = rng.permutation(2000)[:1600]
    pd.DataFrame({"lat": lat, "lon": lon}).to_csv(tmp_path / "people_a.csv", index=False)
    pd.DataFrame({"lat": lat[take] + rng.normal(0, 1e-3, 1600),
                  "lon": lon[take] + rng.normal(0, 1e-3, 1600)}).to_csv(
        tmp_path / "people_b.csv", index=False)
    jobs = len(ray._private.state.jobs())
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    done = subprocess.run(
        [sys.executable, "-m", "vflink.cli.main", "link", "--primary", "people_a.csv",
         "--secondary", "people_b.csv", "--on", "lat,lon", "--metric", "haversine",
         "--top-k", "5", "--seed", "0", "--engine", "ray", "--address", "local",
         "--out", "links_ray.parquet"], cwd=tmp_path, env={**env, "PYTHONUNBUFFERED": "1"},
        capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(pd.read_parquet(tmp_path / "links_ray.parquet")) == 2000 * 5
    assert len(ray._private.state.jobs()) == jobs  # no driver joined the session's cluster
