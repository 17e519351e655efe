"""The compute engine (docs/how-to/scale-out.md): 1 vs 2 Ray workers for search, encoding, PSU
and PSI, the set protocols against the crypto bound, peak memory per process, and a projection.

Everything is measured in one run on this machine, with its own baselines:

- ``us_per_operation``: each ristretto255 operation (hash to the group, exponentiation,
  checked exponentiation of a peer's element, check) on one core, through rbcl (libsodium); the
  *crypto bound* of a protocol is its operations (:mod:`vflink.alignment.cost`) × their costs
  ÷ cores, as ``vflink align`` reports its own.
- each stage runs in-process (the local engine: today's code) and as tasks on a Ray cluster
  started here with 1 and with 2 CPUs; ``scaling`` = time(1 worker) / time(2 workers) and
  ``vs_local`` = time(local) / time(ray, 2 workers).
- peak RSS of every process in the tree (driver, raylet, GCS, workers), sampled every 0.1 s.

    .venv-ray/bin/python benchmarks/engine.py                      # defaults: ~3 minutes
    .venv-ray/bin/python benchmarks/engine.py --set-size 100000    # larger PSU/PSI

Cluster start-up (seconds) is excluded from stage times and reported apart. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a cluster on loopback only

import numpy as np  # noqa: E402

GiB = 2**30


def _proc_tree(root: int) -> dict[int, str]:
    """pid -> command name of ``root`` and all its descendants (Linux /proc)."""
    parent: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        parent[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
        names[int(entry)] = name
    tree, frontier = {root: "driver"}, [root]
    while frontier:
        pid = frontier.pop()
        for child, ppid in parent.items():
            if ppid == pid and child not in tree:
                tree[child] = names[child]
                frontier.append(child)
    return tree


def _hwm_bytes(pid: int) -> int:
    """The kernel's own peak resident set (VmHWM) of a process, 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class PeakRss:
    """Peak resident memory (VmHWM) of this process and all its descendants, per process,
    sampled every ``interval`` seconds (a process that lives less than that may be missed)."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.peaks: dict[int, tuple[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        for pid, name in _proc_tree(os.getpid()).items():
            hwm = _hwm_bytes(pid)
            old = self.peaks.get(pid, (name, 0))
            self.peaks[pid] = (name, max(old[1], hwm))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> PeakRss:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def table(self) -> dict[str, Any]:
        by_kind: dict[str, int] = {}
        for name, rss in self.peaks.values():
            kind = "ray worker" if name.startswith(("ray::", "default_worker")) else name
            by_kind[kind] = max(by_kind.get(kind, 0), rss)
        return {"max_rss_mib_by_process_kind": {k: round(v / 2**20, 1)
                                                for k, v in sorted(by_kind.items())},
                "max_rss_mib_any_process": round(max(by_kind.values()) / 2**20, 1),
                "processes_seen": len(self.peaks)}


def op_costs() -> Any:
    """Seconds per group operation on one core (ristretto255 through libsodium), sampled
    through the group's own chunk functions as ``vflink align`` samples them
    (:func:`vflink.alignment.cost.sample_costs`), on a larger budget."""
    from vflink.alignment.cost import sample_costs
    from vflink.alignment.groups import get_group

    return sample_costs(get_group("ristretto255", workers=1), budget_s=0.5)


def set_bound(method: str, n_a: int, n_p: int, n_union: int, costs: Any,
              cores: int = 1) -> tuple[float, dict[str, int]]:
    """The protocol's crypto bound on ``cores`` (both parties' operations, counted per role
    by :func:`vflink.alignment.cost.protocol_ops`) and its operation counts."""
    from vflink.alignment.cost import ROLES, OpCounts, crypto_bound_s, protocol_ops

    # PSI's intersection follows from the same sizes: |A ∩ B| = |A| + |B| − |A ∪ B|
    ops = [protocol_ops(method, role, n_a=n_a, n_p=n_p, n_union=n_union,
                        n_both=n_a + n_p - n_union if method == "psi" else 0)
           for role in ROLES]
    return crypto_bound_s(ops, costs, cores), sum(ops, OpCounts()).as_dict()


@contextmanager
def ray_engine(cpus: int | None, chunk_rows: int) -> Iterator[Any]:
    from vflink.engine import ComputeConfig, get_engine

    if cpus is None:
        yield None
        return
    t = time.perf_counter()
    engine = get_engine(ComputeConfig(engine="ray", address="local", num_cpus=cpus,
                                      chunk_rows=chunk_rows))
    engine.map(_noop, list(range(2 * cpus)))  # workers up before timing
    startup[cpus] = time.perf_counter() - t
    try:
        yield engine
    finally:
        engine.close()


def _noop(shared: Any, item: Any) -> Any:
    return item


startup: dict[int, float] = {}


def timed(fn: Callable[[Any], Any], chunk_rows: int, repeat: int = 1) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, cpus in (("local", None), ("ray_1", 1), ("ray_2", 2)):
        with ray_engine(cpus, chunk_rows) as engine:
            best = float("inf")
            for _ in range(repeat):
                t = time.perf_counter()
                fn(engine)
                best = min(best, time.perf_counter() - t)
            out[f"{label}_s"] = round(best, 3)
    out["scaling_1_to_2_workers"] = round(out["ray_1_s"] / out["ray_2_s"], 2)
    out["vs_local"] = round(out["local_s"] / out["ray_2_s"], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--search", type=int, nargs=2, default=(20000, 100000),
                    help="primary and secondary rows of the top-K search (8-D, K = 10)")
    ap.add_argument("--encode", type=int, default=200000, help="strings Bloom-encoded")
    ap.add_argument("--set-size", type=int, default=20000, help="keys per side, 50 %% shared")
    ap.add_argument("--chunk-rows", type=int, default=100000)
    ap.add_argument("--memory", nargs="*", default=None, metavar="CASE:N",
                    help="only the memory table: each case (psi:N, psu:N, link:N, N primary "
                         "rows against 10 N secondary) in a fresh process, ray engine, 2 CPUs; "
                         "default psi:100000 psi:400000 link:10000 link:100000. The docs' "
                         "table: psi:1000000 psi:10000000 psu:100000 psu:1000000")
    ap.add_argument("--memory-case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.memory_case:
        print(json.dumps(memory_case(args.memory_case, args.chunk_rows)))
        return
    if args.memory is not None:
        print(json.dumps(memory_table(args.memory or ["psi:100000", "psi:400000",
                                                      "link:10000", "link:100000"],
                                      args.chunk_rows), indent=2))
        return

    import pandas as pd

    from vflink.data.schema import PartySchema
    from vflink.data.table import PartyTable
    from vflink.linkage import METRICS, BloomEncoder, search_chunked
    from vflink.linkage.encoding import encode_chunked
    from vflink.runner.align import align_in_process

    rng = np.random.default_rng(0)
    result: dict[str, Any] = {"machine": {"cpus": os.cpu_count(),
                                          "affinity": len(os.sched_getaffinity(0))}}
    cost = op_costs()
    result["us_per_operation"] = cost.as_us()

    with PeakRss() as rss:
        n_p, n_s = args.search
        p, s = rng.normal(size=(n_p, 8)), rng.normal(size=(n_s, 8))

        def search(engine: Any) -> None:
            if engine is None:
                METRICS.get("euclidean").search(p, s, 10)
            else:
                search_chunked("euclidean", p, s, 10, compute=engine)

        result["search"] = {"rows": [n_p, n_s], "k": 10, "dims": 8,
                            **timed(search, args.chunk_rows)}
        words = [f"{rng.integers(10**6)} main street {i % 1000}" for i in range(args.encode)]
        encoder = BloomEncoder(secret=b"benchmark-secret" * 2)

        def encode(engine: Any) -> None:
            encode_chunked(encoder, words, engine)

        result["encoding"] = {"rows": args.encode, "encoder": "bloom strings",
                              **timed(encode, args.chunk_rows)}
        n = args.set_size

        def table(lo: int, name: str) -> PartyTable:
            ids = [f"{i:012d}" for i in range(lo, lo + n)]
            return PartyTable(PartySchema(name=name, role="secondary", key=("id",)),
                              pd.DataFrame({"id": ids}), name)

        a, b = table(0, "a"), table(n // 2, "b")
        for method in ("psu", "psi"):
            def run(engine: Any, method: str = method) -> None:
                align_in_process(a, b, method=method, compute=engine,
                                 workers=None if engine is not None else 2)

            row = {"keys_per_side": n, "shared": n // 2, **timed(run, args.chunk_rows)}
            one_core, ops = set_bound(method, n, n, n + n // 2, cost)
            mults = ops["power"] + ops["power_checked"]
            row.update({"operations": ops,
                        "bound_1_core_s": round(one_core, 2),
                        "bound_2_cores_s": round(one_core / 2, 2),
                        "ratio_to_2_core_bound": round(row["ray_2_s"] / (one_core / 2), 2),
                        "mults_per_element": round(mults / (2 * n), 2)})
            result[method] = row
    result["peak_memory"] = rss.table()
    result["ray_startup_s"] = {f"{k}_cpus": round(v, 1) for k, v in startup.items()}
    result["projection"] = projection(result, cost)
    print(json.dumps(result, indent=2))


def memory_case(case: str, chunk_rows: int) -> dict[str, Any]:
    """One case in this process, on a Ray cluster started here with 2 CPUs."""
    import pandas as pd

    import vflink
    from vflink.data.schema import PartySchema
    from vflink.data.table import PartyTable

    kind, n_text = case.split(":")
    n = int(n_text)
    with PeakRss() as rss, ray_engine(2, chunk_rows) as engine:
        t = time.perf_counter()
        if kind in ("psi", "psu"):
            # the primary's keys are READ from a Parquet file in record batches
            # (written here batch by batch), never made whole in this process; every PSU/PSI
            # list travels in chunks of ``chunk_rows`` and each party's working state is in
            # on-disk buckets. The secondary is served in this process from a key-only table.
            import tempfile

            import pyarrow as pa
            import pyarrow.compute as pc
            import pyarrow.parquet as pq

            from vflink.alignment._dh import key_bytes
            from vflink.alignment.groups import get_group
            from vflink.data.table import iter_parquet_columns
            from vflink.parties import SecondaryParty
            from vflink.parties.policy import PartyPolicy
            from vflink.parties.setalign import KeyBatches, SetAlignmentDriver
            from vflink.protocol.sessions import new_session_name
            from vflink.transport import InProcessHub

            def ids_of(lo: int, hi: int) -> pa.Array:
                """``%012d`` keys made by Arrow (no Python string per key)."""
                return pc.utf8_lpad(pc.cast(pa.array(np.arange(lo, hi)), pa.string()), 12, "0")

            tmp = Path(tempfile.mkdtemp(prefix="vflink-memory-"))
            keys_file = tmp / "primary.parquet"
            with pq.ParquetWriter(keys_file, pa.schema([("id", pa.string())])) as writer:
                for lo in range(0, n, 10**6):
                    writer.write_table(pa.table({"id": ids_of(lo, min(n, lo + 10**6))}))

            def read(size: int) -> Iterator[list[bytes]]:
                for frame in iter_parquet_columns(keys_file, ["id"], batch_rows=size):
                    yield key_bytes(frame.astype("string"), ["id"])

            # the secondary's key column as Arrow strings (about 20 bytes a key in memory)
            ids = pd.DataFrame({"id": pd.Series(pd.arrays.ArrowExtensionArray(
                pa.chunked_array([ids_of(lo, min(n // 2 + n, lo + 10**6))
                                  for lo in range(n // 2, n // 2 + n, 10**6)])))})
            b = PartyTable(PartySchema(name="b", role="secondary", key=("id",)), ids, "b")
            hub = InProcessHub()
            # the default policy.max_set_elements (2 * 10^6) refuses larger lists: a party
            # that expects them raises it (docs/how-to/scale-out.md)
            peer = SecondaryParty(b, hub.channel("b"), out_dir=tmp / "b",
                                  policy=PartyPolicy(max_set_elements=max(2 * n, 2_000_000)))
            peer.compute = engine
            hub.register("b", peer)
            driver = SetAlignmentDriver(KeyBatches(n, read), hub.channel("a"),
                                        get_group("ristretto255", compute=engine),
                                        chunk_rows=chunk_rows, tmp_dir=tmp / "a")
            name = new_session_name(kind)
            out = driver.psu("b", name) if kind == "psu" else driver.psi("b", name)
            sizes = {"keys_per_side": n, "result": out.sizes}
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
        else:  # numeric soft linkage, raw 2-D identifiers (privacy off), K = 10
            rng = np.random.default_rng(0)
            p = pd.DataFrame(rng.uniform(0, 1000, size=(n, 2)), columns=["x", "y"])
            s = pd.DataFrame(rng.uniform(0, 1000, size=(10 * n, 2)), columns=["x", "y"])
            vflink.link(p, s, on=["x", "y"], metric="euclidean", top_k=10, privacy="off",
                        tau=0.9, seed=0, compute=engine)
            sizes = {"primary_rows": n, "secondary_rows": 10 * n, "k": 10}
        seconds = time.perf_counter() - t
    return {"case": kind, **sizes, "seconds": round(seconds, 1), **rss.table()}


def memory_table(cases: list[str], chunk_rows: int) -> dict[str, Any]:
    import subprocess

    cost = op_costs()  # this run's per-operation costs: the bound of each set case
    rows = []
    for case in cases:
        out = subprocess.run([sys.executable, __file__, "--memory-case", case, "--chunk-rows",
                              str(chunk_rows)], capture_output=True, text=True, check=False)
        if out.returncode != 0:
            sys.stderr.write(out.stderr)
            raise SystemExit(f"memory case {case} failed (exit {out.returncode})")
        row = json.loads(out.stdout.strip().splitlines()[-1])
        kind, n = case.split(":")[0], int(case.split(":")[1])
        if kind in ("psi", "psu"):  # keys [0, n) against [n/2, 3n/2): 50 % shared
            one_core, ops = set_bound(kind, n, n, n + n // 2, cost)
            row.update(operations=ops, bound_2_cores_s=round(one_core / 2, 1),
                       ratio_to_2_core_bound=round(row["seconds"] / (one_core / 2), 2))
        rows.append(row)
    return {"chunk_rows": chunk_rows, "engine": "ray, 2 CPUs, started here",
            "us_per_operation": cost.as_us(), "cases": rows}


def projection(result: dict[str, Any], cost: Any) -> dict[str, Any]:
    """Time on a 64-core cluster per party, from this run's per-core rates, assuming the
    measured 1→2 worker efficiency holds per doubling (a model, not a measurement)."""
    cores = 64
    eff = {k: min(1.0, result[k]["scaling_1_to_2_workers"] / 2)
           for k in ("search", "psu", "psi")}
    out: dict[str, Any] = {"cores_per_party": cores, "parallel_efficiency_measured": eff}
    doublings = np.log2(cores)
    for method, n_a, n_p, n_u in (("psi", 10**8, 10**8, int(1.5e8)),
                                  ("psu", 10**8, 10**8, int(1.5e8))):
        # each party does half the work on its own cluster
        one_core = set_bound(method, n_a, n_p, n_u, cost)[0] / 2
        # measured overhead over the bound on 2 cores carries over
        overhead = result[method]["ratio_to_2_core_bound"]
        speed = cores * eff[method] ** (doublings - 1)
        out[f"{method}_1e8_x_1e8_s"] = round(one_core * overhead / speed)
    r = result["search"]
    pairs = r["rows"][0] * r["rows"][1]
    rate = pairs / r["ray_1_s"]  # pair comparisons per second per worker (8-D, K = 10)
    speed = cores * eff["search"] ** (doublings - 1)
    out["soft_linkage_1e7_x_1e8_dense_8d_s"] = round(1e7 * 1e8 / rate / speed)
    out["published"] = {"secretflow_psi_ecdh_25519_1e8_per_side_32_cores_s": 697,
                        "fate_psi_1e8_2x16_cores_s": 50 * 60}
    return out


if __name__ == "__main__":
    main()
