"""What binding PSU and PSI to what the secondary has seen costs (docs/security.md).

* PSU: this tree's PSU (line 11 raises the round-1 list: no proof, |A| fewer exponentiations)
  against a baseline tree's (e.g. an export of the commit before, with the paper's line 11),
  each run of ``benchmarks/psu.py`` in a fresh process, alternating between the two trees so
  both see the same load; medians and their ratio.
* PSI: the share of a PSI spent in its Chaum–Pedersen proof (the primary proving, the secondary
  verifying, over the elements that match), timed inside the same run: proof-on against the
  same run less its proof.

Prints JSON. The machine may be shared: ratios are of runs made in the same hour, and the
load average is printed with them.

    python benchmarks/set_binding.py --baseline /tmp/base --sizes 100000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def psu_seconds(tree: Path, n: int, workers: int | None) -> dict[str, Any]:
    """One PSU of ``n`` ∪ ``n`` (50 % overlap) by ``tree``'s code, in a fresh process."""
    cmd = [sys.executable, str(tree / "benchmarks" / "psu.py"), "--sizes", str(n),
           "--methods", "psu", "--modp-sample", "8"]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=tree)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    case = json.loads(out.stdout)["cases"][0]["ristretto255"]
    # CPU seconds of the run (both parties, every thread and child): the work done, which a
    # loaded machine stretches far less than the wall time
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"seconds": case["seconds"], "cpu_seconds": round(cpu, 1), "sizes": case["sizes"],
            "peak_rss_mb": case["peak_rss_mb"]}


def psi_case(n: int, workers: int | None, queue: Any) -> None:
    """A PSI (both learn it) of ``n`` ∪ ``n`` with 50 % overlap, timing its proof."""
    import pandas as pd

    from vflink.alignment import proofs
    from vflink.data.schema import PartySchema
    from vflink.data.table import PartyTable
    from vflink.parties import setalign
    from vflink.runner.align import align_in_process

    spent = {"prove": 0.0, "verify": 0.0}

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - started
        return wrapper

    setalign.proofs.prove_batches = timed("prove", proofs.prove_batches)  # type: ignore[attr-defined]
    setalign.proofs.verify_batches = timed("verify", proofs.verify_batches)  # type: ignore[attr-defined]

    def table(lo: int, name: str) -> PartyTable:
        keys = pd.Series([f"user-{i:09d}@example.org" for i in range(lo, lo + n)],
                         dtype="string")
        return PartyTable(PartySchema(name=name, role="secondary", key=("id",)),
                          pd.DataFrame({"id": keys}), name)

    started = time.perf_counter()
    out = align_in_process(table(0, "primary"), table(n // 2, "secondary"), method="psi",
                           group="ristretto255", workers=workers)
    total = time.perf_counter() - started
    proof = spent["prove"] + spent["verify"]
    queue.put({"seconds": round(total, 2), "proof_seconds": round(proof, 2),
               "prove_seconds": round(spent["prove"], 2),
               "verify_seconds": round(spent["verify"], 2),
               "without_proof_seconds": round(total - proof, 2),
               "overhead": round(proof / max(total - proof, 1e-9), 3),
               "sizes": out.summary()["sizes"]})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000])
    p.add_argument("--baseline", type=Path, default=None,
                   help="a tree with the paper's line 11 (e.g. `git archive` of the commit "
                        "before); without it, PSU is not compared")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=None, help="default: every core")
    p.add_argument("--methods", nargs="+", default=["psu", "psi"], choices=["psu", "psi"])
    args = p.parse_args()
    results: dict[str, Any] = {"cores": len(os.sched_getaffinity(0)),
                               "load_average_1min": os.getloadavg()[0], "cases": []}
    ctx = multiprocessing.get_context("spawn")
    for n in args.sizes:
        if "psu" in args.methods and args.baseline is not None:
            ours, base = [], []
            for _ in range(args.repeats):  # alternating: both see the same load
                ours.append(psu_seconds(ROOT, n, args.workers))
                base.append(psu_seconds(args.baseline, n, args.workers))
            assert all(r["sizes"] == base[0]["sizes"] for r in ours + base), "sizes differ"
            mo = statistics.median(r["seconds"] for r in ours)
            mb = statistics.median(r["seconds"] for r in base)
            co = statistics.median(r["cpu_seconds"] for r in ours)
            cb = statistics.median(r["cpu_seconds"] for r in base)
            results["cases"].append({
                "method": "psu", "n_per_side": n, "overlap": 0.5, "sizes": ours[0]["sizes"],
                "seconds": [r["seconds"] for r in ours],
                "baseline_seconds": [r["seconds"] for r in base],
                "cpu_seconds": [r["cpu_seconds"] for r in ours],
                "baseline_cpu_seconds": [r["cpu_seconds"] for r in base],
                "median_seconds": mo, "baseline_median_seconds": mb,
                "ratio": round(mo / mb, 3), "cpu_ratio": round(co / cb, 3),
                "peak_rss_mb": max(r["peak_rss_mb"] for r in ours),
                "baseline_peak_rss_mb": max(r["peak_rss_mb"] for r in base)})
            print(json.dumps(results["cases"][-1]), file=sys.stderr, flush=True)
        if "psi" in args.methods:
            runs = []
            for _ in range(args.repeats):
                queue = ctx.Queue()
                proc = ctx.Process(target=psi_case, args=(n, args.workers, queue))
                proc.start()
                runs.append(queue.get())
                proc.join()
            results["cases"].append({
                "method": "psi", "n_per_side": n, "overlap": 0.5, "runs": runs,
                "median_overhead": statistics.median(r["overhead"] for r in runs)})
            print(json.dumps(results["cases"][-1]), file=sys.stderr, flush=True)
    results["load_average_1min_end"] = os.getloadavg()[0]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
