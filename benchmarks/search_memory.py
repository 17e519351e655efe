"""Memory of soft linkage at two table sizes: peak RSS of every process.

Soft linkage of 2-D numeric identifiers (K = 10, raw values, privacy off) of a primary of n
rows against a secondary of 10·n rows, streamed end to end (``vflink.linkage.streamed``): both
tables are read from Parquet in batches, the search runs as chunk tasks that scan the secondary
partition by partition with a running exact top-K merge, and the links are written as a
partitioned Parquet dataset. Every size runs in a fresh process (its own Ray cluster with 2
CPUs, or the local engine), sampled for the peak resident set (VmHWM) of the driver, the Ray
services and every worker (``benchmarks/engine.py``'s ``PeakRss``). At a fixed chunk size the
peaks should be flat in table size and under 2 GiB per process.

The search: a flat (brute-force) search does n × 10n distance computations, 10^13 at
10^6 × 10^7: at the 1.7·10^8 per second and core measured here (faiss, one thread), about 8
hours on 2 cores.
Each task therefore uses the metric's exact index for 2-D vectors (a k-d tree over each
secondary partition, ``dense_index="auto"``), which returns the same neighbours (tested);
``flat_search_projection`` gives the time a flat search would have taken, measured in the same
run on a sample.

    PYTHONPATH=src python benchmarks/search_memory.py --sizes 10000 100000   # ~1 minute
    PYTHONPATH=src python benchmarks/search_memory.py --sizes 100000 1000000  # the docs' table

(``PYTHONPATH=src``: Ray's workers import vflink from the checkout, as the driver does.)

``--cli bloom off`` instead times ``vflink link --stream`` itself: the command as a
user runs it, one subprocess per case, with the default privacy (keyed FEDERAL Bloom filters,
Hamming distance, exact search) and/or privacy off, sampling the peak RSS of every process in
its tree (the CLI, and the Ray services and workers with ``--engine ray``):

    PYTHONPATH=src python benchmarks/search_memory.py --cli bloom off --sizes 10000 100000

Tables are generated (seeded, in row groups, never whole in memory) under ``--workdir``
(default: a temporary directory, removed afterwards). Prints JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a cluster on loopback only

import numpy as np  # noqa: E402

K = 10


def _peak_rss() -> Any:
    """``PeakRss`` of ``benchmarks/engine.py`` (one sampler for every memory figure)."""
    spec = importlib.util.spec_from_file_location("_vflink_bench_engine",
                                                  Path(__file__).with_name("engine.py"))
    if spec is None or spec.loader is None:
        raise RuntimeError("benchmarks/engine.py not found")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PeakRss


def write_table(path: Path, n: int, seed: int, group_rows: int = 1_000_000) -> None:
    """``n`` rows of uniform 2-D points in [0, 1000)², written a row group at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    schema = pa.schema([("x", pa.float64()), ("y", pa.float64())])
    with pq.ParquetWriter(path, schema, compression="lz4") as writer:
        for start in range(0, n, group_rows):
            m = min(group_rows, n - start)
            xy = rng.uniform(0.0, 1000.0, size=(m, 2))
            writer.write_table(pa.table({"x": xy[:, 0], "y": xy[:, 1]}, schema=schema))


def flat_rate(sample: int = 2000, secondary: int = 200_000) -> float:
    """Distance computations per second and core of the flat (faiss) exact search."""
    from vflink.linkage import METRICS, SearchOptions

    rng = np.random.default_rng(0)
    p, s = rng.uniform(0, 1000, (sample, 2)), rng.uniform(0, 1000, (secondary, 2))
    t = time.perf_counter()
    METRICS.get("euclidean").search(p, s, K, options=SearchOptions(
        mode="exact", dense_index="flat", threads=1))
    return sample * secondary / (time.perf_counter() - t)


def run_case(n: int, workdir: Path, engine_name: str, chunk_rows: int, partition_rows: int
             ) -> dict[str, Any]:
    """One size in this process: generate, link streamed, measure."""
    from vflink.engine import ComputeConfig, get_engine
    from vflink.linkage.streamed import link_streamed

    PeakRss = _peak_rss()
    p_path, s_path = workdir / f"p{n}.parquet", workdir / f"s{n}.parquet"
    out = workdir / f"links{n}.parquet"
    t = time.perf_counter()
    write_table(p_path, n, seed=1)
    write_table(s_path, 10 * n, seed=2)
    generate_s = time.perf_counter() - t
    with PeakRss() as rss:
        config = (ComputeConfig(engine="ray", address="local", num_cpus=2, chunk_rows=chunk_rows)
                  if engine_name == "ray" else ComputeConfig(chunk_rows=chunk_rows))
        t = time.perf_counter()
        engine = get_engine(config)
        startup = time.perf_counter() - t
        try:
            t = time.perf_counter()
            summary = link_streamed(p_path, s_path, on=["x", "y"], out=out, top_k=K,
                                    compute=engine if engine_name == "ray" else None,
                                    chunk_rows=chunk_rows, partition_rows=partition_rows,
                                    sigma=0.5, seed=0)
            seconds = time.perf_counter() - t
        finally:
            engine.close()
    size = sum(f.stat().st_size for f in out.iterdir())
    for path in (p_path, s_path):
        path.unlink()
    shutil.rmtree(out)
    return {"primary_rows": n, "secondary_rows": 10 * n, "k": K, "links": summary["links"],
            "parts": summary["parts"], "links_bytes": size, "seconds": round(seconds, 1),
            "generate_seconds": round(generate_s, 1), "engine_startup_s": round(startup, 1),
            **rss.table()}


def run_cli_case(n: int, workdir: Path, engine_name: str, chunk_rows: int, privacy: str
                 ) -> dict[str, Any]:
    """``vflink link --stream`` as a subprocess on n × 10n points, its process tree sampled."""
    PeakRss = _peak_rss()
    p_path, s_path = workdir / f"p{n}.parquet", workdir / f"s{n}.parquet"
    if not p_path.exists():
        write_table(p_path, n, seed=1)
        write_table(s_path, 10 * n, seed=2)
    out = workdir / f"links{n}-{privacy}.parquet"
    config = workdir / "link.toml"
    config.write_text(f"[link]\ntop_k = {K}\n\n[compute]\nchunk_rows = {chunk_rows}\n")
    engine = (["--engine", "ray", "--address", "local"] if engine_name == "ray"
              else ["--engine", "local"])
    env = {**os.environ, "VFLINK_SECRET": "benchmark-secret-not-secret",
           "PYTHONPATH": str(ROOT / "src")}
    with PeakRss() as rss:
        t = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "vflink.cli.main", "link", "--config", str(config),
             "--primary", str(p_path), "--secondary", str(s_path), "--on", "x,y",
             "--metric", "euclidean", "--privacy", privacy, "--seed", "0", "--stream",
             "--out", str(out), "--overwrite", *engine],
            capture_output=True, text=True, check=False, env=env)
        seconds = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"vflink link failed:\n{done.stderr[-4000:]}")
    summary = json.loads(Path(f"{out}.summary.json").read_text())
    table = rss.table()
    table.pop("processes_seen", None)
    return {"privacy": privacy, "primary_rows": n, "secondary_rows": 10 * n, "k": K,
            "links": summary["sizes"]["links"], "encoding": summary["encoding"],
            "seconds": round(seconds, 1), **table}


def main_cli(args: argparse.Namespace) -> None:
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="vflink-link-memory-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for n in args.sizes:
            for privacy in args.cli:
                rows.append(run_cli_case(n, workdir, args.engine, args.chunk_rows, privacy))
                print(json.dumps(rows[-1]), file=sys.stderr)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps({"benchmark": "vflink link --stream, peak RSS per process",
                      "engine": args.engine, "chunk_rows": args.chunk_rows, "cases": rows},
                     indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000],
                    help="primary rows of each case (the secondary has 10×)")
    ap.add_argument("--engine", choices=("local", "ray"), default="ray")
    ap.add_argument("--chunk-rows", type=int, default=50_000,
                    help="primary rows per task (fixed across sizes)")
    ap.add_argument("--partition-rows", type=int, default=1_000_000,
                    help="secondary rows per partition a task scans (fixed across sizes)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--case", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--cli", nargs="+", choices=("bloom", "off"), default=None,
                    help="time `vflink link --stream` itself with these privacy settings")
    args = ap.parse_args()
    if args.cli:
        main_cli(args)
        return
    if args.case is not None:
        result = run_case(args.case, args.workdir, args.engine, args.chunk_rows,
                          args.partition_rows)
        print(json.dumps(result))
        return
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="vflink-search-memory-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for n in args.sizes:
            done = subprocess.run(
                [sys.executable, __file__, "--case", str(n), "--workdir", str(workdir),
                 "--engine", args.engine, "--chunk-rows", str(args.chunk_rows),
                 "--partition-rows", str(args.partition_rows)],
                capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"case {n} failed:\n{done.stderr[-4000:]}")
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    rate = flat_rate()
    largest = max(args.sizes)
    peaks = [r["max_rss_mib_any_process"] for r in rows]
    result = {
        "benchmark": "soft linkage memory, streamed",
        "engine": "ray, 2 CPUs, started here" if args.engine == "ray" else "local",
        "chunk_rows": args.chunk_rows, "partition_rows": args.partition_rows,
        "search": "exact; a k-d tree over each secondary partition (2-D)",
        "cases": rows,
        "max_rss_mib_any_process_any_case": max(peaks),
        "rss_ratio_largest_to_smallest": round(peaks[-1] / peaks[0], 2) if peaks[0] else None,
        "under_2_gib_per_process": max(peaks) < 2048,
        "flat_search_projection": {
            "distance_computations_per_s_per_core": round(rate),
            "hours_on_2_cores_for_largest": round(largest * 10 * largest / rate / 2 / 3600, 2),
        },
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
