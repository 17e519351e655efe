"""Peak memory of a secondary party's whole process, table load included, on 10^5 … 10^7 rows.

The claim under test: a party's rows are read per batch from its on-disk columnar copy
(memory-mapped Arrow), not from a whole in-memory DataFrame, so a secondary with 10^7 rows
trains within a fixed memory. Each case runs in its own subprocess (peak memory is per
process): a secondary whose table (an int64 key and ``features`` float64 columns) is a Parquet
file of ``rows`` rows (written once per size, in row groups of 131,072 rows) loads it, is
linked to ``linked`` of its rows (the primary's records), fits its preprocessing on 70 % of
them, encodes its features and trains ``steps`` batches of ``batch`` rows through its real
handlers (Forward/Backward, the gradient a constant). The stores:

* ``memory``: the table read whole (``load_table``), the features one in-memory tensor;
* ``mmap``: the table read whole, the features memory-mapped (``feature_store = "mmap"`` on a
  table held in memory);
* ``streamed``: what a served or in-process secondary does from 10^6 rows (``open_table``):
  the table checked and read in record batches (``vflink.data.streamed.StreamedTable``),
  never whole; the fit on the gathered training rows; the features encoded from the batches
  into the mapped file.

Printed JSON, per case:

* ``process_mb``: the whole process's peak resident memory (VmHWM) minus its resident memory
  before the table is read (interpreter and imports): table load, fit, encoding and training;
* ``process_anon_mb``: the same for anonymous memory only (sampled every 5 ms). Pages of the
  table file or the mapped feature file that a batch touches count in RSS as *file* pages:
  clean page cache that the kernel drops under pressure, unlike anonymous memory;
* ``table_rss_mb``: resident memory added once the table is open (whole, or checked);
* ``training_rss_mb`` / ``training_anon_mb``: the peak minus the resident memory once the
  table is open (what fit, encoding and training added);
* ``load_s`` (reading or checking the table), ``setup_s`` (fit + encode, incl. writing the
  file) and ``step_ms`` (per batch);
* per size, the ratio of each store's ``process_anon_mb`` to the ``memory`` case's (the
  baseline measured in the same run), and across sizes the growth of each store's.

    python benchmarks/training_memory.py                        # 10^5 and 10^6 rows
    python benchmarks/training_memory.py --rows 100000 1000000 10000000
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) // 1024  # MiB
    return out


class _Sampler(threading.Thread):
    """The largest anonymous RSS seen (VmHWM covers only the total)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_anon = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak_anon = max(self.peak_anon, _status()["RssAnon"])
            time.sleep(0.005)


def write_table(path: Path, rows: int, features: int, seed: int) -> None:
    """The secondary's table as Parquet, written a chunk at a time (never whole here
    either), in row groups of 131,072 rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    names = [f"x{j}" for j in range(features)]
    schema = pa.schema([("id", pa.int64())] + [(n, pa.float64()) for n in names])
    chunk = 1 << 20
    with pq.ParquetWriter(str(path), schema) as writer:
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            cols = [pa.array(np.arange(start, start + n, dtype=np.int64))]
            cols += [pa.array(rng.standard_normal(n)) for _ in names]
            writer.write_table(pa.Table.from_arrays(cols, schema=schema),
                               row_group_size=1 << 17)


def case(path: Path, rows: int, features: int, store: str, linked: int, steps: int,
         batch: int, seed: int) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "src"))
    import numpy as np
    import torch

    from vflink.data.schema import PartySchema
    from vflink.data.streamed import open_table
    from vflink.data.table import load_table
    from vflink.models.spec import BottomSpec
    from vflink.parties import SecondaryParty
    from vflink.parties.resources import TrainingResources
    from vflink.protocol.messages import Backward, FitPreprocessing, Forward, SetupBottom
    from vflink.transport import InProcessHub

    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    names = tuple(f"x{j}" for j in range(features))
    schema = PartySchema(name="bank", role="secondary", key=("id",), numeric=names,
                         path=path)
    sampler = _Sampler()
    start = _status()
    sampler.start()
    t0 = time.perf_counter()
    feature_store = "memory" if store == "memory" else "mmap"
    table = open_table(schema, store="mmap") if store == "streamed" else load_table(schema)
    load_s = time.perf_counter() - t0
    source = type(table).__name__
    before = _status()
    with tempfile.TemporaryDirectory(prefix="vflink-bench-") as state:
        party = SecondaryParty(table, InProcessHub().channel("bank"), out_dir=Path(state),
                               resources=TrainingResources(feature_store=feature_store))
        linked_rows = np.sort(rng.choice(rows, size=min(linked, rows), replace=False))
        party.set_linked_rows(linked_rows, peer="primary")
        spec = BottomSpec(hidden=(64,), out_dim=16, seed=seed)
        t1 = time.perf_counter()
        party.on_setup_bottom("primary", SetupBottom(spec=spec))
        train = linked_rows[: int(0.7 * len(linked_rows))]
        party.on_fit_preprocessing("primary", FitPreprocessing(rows=train))
        setup_s = time.perf_counter() - t1
        t2 = time.perf_counter()
        for step in range(steps):
            idx = rng.choice(train, size=batch)
            reply = party.on_forward("primary", Forward(batch_id=step + 1, rows=idx, train=True))
            grad = torch.full(tuple(reply.embeddings.shape), 1e-3)
            party.on_backward("primary", Backward(batch_id=step + 1, grad=grad))
        step_ms = (time.perf_counter() - t2) / max(steps, 1) * 1e3
        end = _status()
        mapped = type(party.features).__name__
        if party.features is not None:
            party.features.close()
    sampler.stop.set()
    sampler.join()
    peak = _status()["VmHWM"]
    return {"rows": rows, "features": features, "store": store, "table": source,
            "source": mapped, "linked": int(len(linked_rows)), "steps": steps,
            "batch": batch,
            "process_mb": peak - start["VmRSS"],
            "process_anon_mb": sampler.peak_anon - start["RssAnon"],
            "table_rss_mb": before["VmRSS"] - start["VmRSS"],
            "training_rss_mb": peak - before["VmRSS"],
            "training_anon_mb": sampler.peak_anon - before["RssAnon"],
            "file_rss_after_mb": end["RssFile"] - before["RssFile"],
            "start_rss_mb": start["VmRSS"], "peak_rss_mb": peak,
            "load_s": round(load_s, 2), "setup_s": round(setup_s, 2),
            "step_ms": round(step_ms, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--features", type=int, default=4)
    parser.add_argument("--linked", type=int, default=100_000,
                        help="rows linked to the primary's records (fixed: the primary's size)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stores", nargs="+", default=["memory", "mmap", "streamed"],
                        choices=["memory", "mmap", "streamed"])
    parser.add_argument("--table", help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        rows, store = args.case.split(":")
        print(json.dumps(case(Path(args.table), int(rows), args.features, store, args.linked,
                              args.steps, args.batch, args.seed)))
        return
    results = []
    with tempfile.TemporaryDirectory(prefix="vflink-bench-tables-") as tables:
        for rows in args.rows:
            table = Path(tables) / f"secondary-{rows}.parquet"
            write_table(table, rows, args.features, args.seed)
            for store in args.stores:
                cmd = [sys.executable, __file__, "--case", f"{rows}:{store}",
                       "--table", str(table),
                       "--features", str(args.features), "--linked", str(args.linked),
                       "--steps", str(args.steps), "--batch", str(args.batch),
                       "--seed", str(args.seed)]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                results.append(json.loads(out.strip().splitlines()[-1]))
                print(json.dumps(results[-1]), file=sys.stderr)
            table.unlink()
    ratios: dict[str, dict[str, float]] = {}
    for rows in args.rows:
        by = {r["store"]: r for r in results if r["rows"] == rows}
        if "memory" in by:
            base = max(by["memory"]["process_anon_mb"], 1)
            ratios[str(rows)] = {s: round(max(r["process_anon_mb"], 1) / base, 3)
                                 for s, r in by.items() if s != "memory"}
    growth = {}
    sizes = sorted(args.rows)
    if len(sizes) > 1:
        for store in args.stores:
            by = {r["rows"]: r for r in results if r["store"] == store}
            growth[store] = {"rows": [sizes[0], sizes[-1]],
                             "process_mb": round(max(by[sizes[-1]]["process_mb"], 1)
                                                 / max(by[sizes[0]]["process_mb"], 1), 3),
                             "process_anon_mb": round(
                                 max(by[sizes[-1]]["process_anon_mb"], 1)
                                 / max(by[sizes[0]]["process_anon_mb"], 1), 3)}
    print(json.dumps({"benchmark": "training_memory", "cases": results,
                      "process_anon_over_memory": ratios,
                      "growth_smallest_to_largest": growth}, indent=1))


if __name__ == "__main__":
    main()
