"""Peak memory of a secondary party training on 10^5 … 10^7 rows: in-memory vs mapped features.

Issue 22: "a party's rows are read per batch from its on-disk columnar copy (memory-mapped
Arrow), not from a whole in-memory DataFrame, so a secondary with 10^7 rows trains within a
fixed memory". Each case runs in its own subprocess (peak memory is per process): a secondary
with ``rows`` rows (an int64 key and ``features`` float64 columns) is linked to ``linked`` of
its rows (the primary's records), fits its preprocessing on 70 % of them, encodes its features
(``training.feature_store = "memory"`` or ``"mmap"``) and trains ``steps`` batches of
``batch`` rows through its real handlers (Forward/Backward, the gradient a constant).

Printed JSON, per case:

* ``table_rss_mb``: resident memory once the table is loaded (the DataFrame: the input stage,
  outside this measurement's scope; issue 22's batched readers bound that one);
* ``peak_rss_mb`` (VmHWM) and ``training_rss_mb`` = peak − table: what training added;
* ``peak_anon_mb`` / ``training_anon_mb``: the same for anonymous memory only (sampled every
  5 ms). Pages of the mapped file that a batch touches count in RSS as *file* pages: clean
  page cache that the kernel drops under pressure, unlike anonymous memory;
* ``setup_s`` (fit + encode, incl. writing the file) and ``step_ms`` (per batch);
* the ratio of the mapped case's training anonymous memory to the in-memory case's (the
  baseline measured in the same run).

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


def case(rows: int, features: int, store: str, linked: int, steps: int, batch: int,
         seed: int) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "src"))
    import numpy as np
    import pandas as pd
    import torch

    from vflink.data.schema import PartySchema
    from vflink.data.table import PartyTable
    from vflink.models.spec import BottomSpec
    from vflink.parties import SecondaryParty
    from vflink.parties.resources import TrainingResources
    from vflink.protocol.messages import Backward, FitPreprocessing, Forward, SetupBottom
    from vflink.transport import InProcessHub

    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    names = [f"x{j}" for j in range(features)]
    frame = pd.DataFrame({"id": np.arange(rows, dtype=np.int64)})
    for name in names:  # one column at a time: no n × d float64 temporary
        frame[name] = rng.standard_normal(rows)
    schema = PartySchema(name="bank", role="secondary", key=("id",), numeric=tuple(names))
    # built directly: the table is valid by construction, and validation's copy is the input
    # stage's memory, not training's
    table = PartyTable(schema, frame, "synthetic")
    del frame
    sampler = _Sampler()
    sampler.start()
    before = _status()
    with tempfile.TemporaryDirectory(prefix="vflink-bench-") as state:
        party = SecondaryParty(table, InProcessHub().channel("bank"), out_dir=Path(state),
                               resources=TrainingResources(feature_store=store))
        linked_rows = np.sort(rng.choice(rows, size=min(linked, rows), replace=False))
        party.set_linked_rows(linked_rows, peer="primary")
        spec = BottomSpec(hidden=(64,), out_dim=16, seed=seed)
        t0 = time.perf_counter()
        party.on_setup_bottom("primary", SetupBottom(spec=spec))
        train = linked_rows[: int(0.7 * len(linked_rows))]
        party.on_fit_preprocessing("primary", FitPreprocessing(rows=train))
        setup_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        for step in range(steps):
            idx = rng.choice(train, size=batch)
            reply = party.on_forward("primary", Forward(batch_id=step + 1, rows=idx, train=True))
            grad = torch.full(tuple(reply.embeddings.shape), 1e-3)
            party.on_backward("primary", Backward(batch_id=step + 1, grad=grad))
        step_ms = (time.perf_counter() - t1) / max(steps, 1) * 1e3
        end = _status()
        mapped = type(party.features).__name__
        if party.features is not None:
            party.features.close()
    sampler.stop.set()
    sampler.join()
    peak = _status()["VmHWM"]
    return {"rows": rows, "features": features, "store": store, "source": mapped,
            "linked": int(len(linked_rows)), "steps": steps, "batch": batch,
            "table_rss_mb": before["VmRSS"], "peak_rss_mb": peak,
            "training_rss_mb": peak - before["VmRSS"],
            "peak_anon_mb": sampler.peak_anon,
            "training_anon_mb": sampler.peak_anon - before["RssAnon"],
            "file_rss_after_mb": end["RssFile"] - before["RssFile"],
            "setup_s": round(setup_s, 2), "step_ms": round(step_ms, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--features", type=int, default=4)
    parser.add_argument("--linked", type=int, default=100_000,
                        help="rows linked to the primary's records (fixed: the primary's size)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stores", nargs="+", default=["memory", "mmap"])
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        rows, store = args.case.split(":")
        print(json.dumps(case(int(rows), args.features, store, args.linked, args.steps,
                              args.batch, args.seed)))
        return
    results = []
    for rows in args.rows:
        for store in args.stores:
            cmd = [sys.executable, __file__, "--case", f"{rows}:{store}",
                   "--features", str(args.features), "--linked", str(args.linked),
                   "--steps", str(args.steps), "--batch", str(args.batch),
                   "--seed", str(args.seed)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            results.append(json.loads(out.strip().splitlines()[-1]))
            print(json.dumps(results[-1]), file=sys.stderr)
    ratios = {}
    for rows in args.rows:
        by = {r["store"]: r for r in results if r["rows"] == rows}
        if "memory" in by and "mmap" in by:
            ratios[str(rows)] = round(max(by["mmap"]["training_anon_mb"], 1)
                                      / max(by["memory"]["training_anon_mb"], 1), 3)
    print(json.dumps({"benchmark": "training_memory", "cases": results,
                      "mmap_over_memory_training_anon": ratios}, indent=1))


if __name__ == "__main__":
    main()
