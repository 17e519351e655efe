"""PSU (FLORIST Algorithm 1) and ECDH PSI between two in-process parties: ristretto255 against
modp2048 (the paper's QR(Z_p*) with the RFC 3526 2048-bit prime).

Each side holds ``n`` keys with 50 % overlap (|A ∩ B| = n/2, |A ∪ B| = 1.5 n). ristretto255 runs
the whole protocol; modp2048 is timed on a sample of exponentiations (same worker count) and
extrapolated to the protocol's exponentiation count, which does not depend on the group
(PSU: 4|A| + 5|B| + 2|A ∪ B|, line 11 raising the round-1 list; PSI: 2|A| + 2|B| plus the
proof over the matching elements, plus the hashes). Each case runs in a fresh
process so its peak resident memory is its own. Prints JSON.

    python benchmarks/psu.py                          # n = 100,000 per side
    python benchmarks/psu.py --sizes 100000 1000000   # 1e5 and 1e6 (1e6: minutes)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def exponentiations(method: str, n_a: int, n_p: int, n_union: int) -> int:
    """Group exponentiations of the protocol, both parties together (hashes excluded), as
    :func:`vflink.alignment.cost.protocol_ops` counts them (PSU: 4|A| + 5|B| + 2|U|)."""
    from vflink.alignment.cost import ROLES, OpCounts, protocol_ops

    ops = sum((protocol_ops(method, role, n_a=n_a, n_p=n_p, n_union=n_union)
               for role in ROLES), OpCounts())
    return ops.power + ops.power_checked


def run_case(method: str, n: int, workers: int | None, queue: Any) -> None:
    import pandas as pd

    from vflink.data.schema import PartySchema
    from vflink.data.table import PartyTable
    from vflink.runner.align import align_in_process

    def table(lo: int, name: str) -> PartyTable:
        keys = pd.Series([f"user-{i:09d}@example.org" for i in range(lo, lo + n)],
                         dtype="string")
        return PartyTable(PartySchema(name=name, role="secondary", key=("id",)),
                          pd.DataFrame({"id": keys}), name)

    a, b = table(0, "primary"), table(n // 2, "secondary")
    start = time.perf_counter()
    out = align_in_process(a, b, method=method, group="ristretto255", workers=workers)
    seconds = time.perf_counter() - start
    sizes = out.summary()["sizes"]
    union = sizes.get("union", 2 * n - sizes["intersection"])
    ops = exponentiations(method, n, n, union)
    queue.put({"seconds": round(seconds, 2), "sizes": sizes, "exponentiations": ops,
               "hashes": 2 * n, "exponentiations_per_s": round(ops / seconds),
               "bytes": out.summary()["bytes"],
               "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                                    1)})


def modp_rate(sample: int, workers: int | None) -> dict[str, float]:
    from vflink.alignment.groups import get_group

    g = get_group("modp2048", workers=workers)
    g.parallel_threshold = 1  # the pool, as a large batch would use it
    x = g.random_elements(sample)
    e = g.random_exponent()
    g.power(x[:8], e)  # start-up of the pool is not what we measure
    start = time.perf_counter()
    g.power(x, e)
    power = sample / (time.perf_counter() - start)
    start = time.perf_counter()
    g.hash_to_group([str(i).encode() for i in range(sample)])
    hashing = sample / (time.perf_counter() - start)
    return {"sample": sample, "exponentiations_per_s": round(power, 1),
            "hashes_per_s": round(hashing, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000])
    p.add_argument("--methods", nargs="+", default=["psu", "psi"], choices=["psu", "psi"])
    p.add_argument("--modp-sample", type=int, default=400)
    p.add_argument("--workers", type=int, default=None, help="default: every core")
    args = p.parse_args()
    ctx = multiprocessing.get_context("spawn")
    modp = modp_rate(args.modp_sample, args.workers)
    results: dict[str, Any] = {"cores": len(os.sched_getaffinity(0)),
                               "load_average_1min": os.getloadavg()[0],
                               "modp2048_sample": modp, "cases": []}
    for n in args.sizes:
        for method in args.methods:
            queue = ctx.Queue()
            proc = ctx.Process(target=run_case, args=(method, n, args.workers, queue))
            proc.start()
            r = queue.get()
            proc.join()
            modp_seconds = (r["exponentiations"] / modp["exponentiations_per_s"]
                            + r["hashes"] / modp["hashes_per_s"])
            results["cases"].append({
                "method": method, "n_per_side": n, "overlap": 0.5,
                "ristretto255": r,
                "modp2048_extrapolated": {
                    "seconds": round(modp_seconds, 1),
                    "bytes": {k: v * 256 // 32 for k, v in r["bytes"].items()}},
                "speedup_ristretto_vs_modp": round(modp_seconds / r["seconds"], 1)})
            print(json.dumps(results["cases"][-1]), file=sys.stderr, flush=True)
    results["load_average_1min_end"] = os.getloadavg()[0]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
