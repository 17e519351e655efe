"""``vflink align`` against its own crypto bound, timed as a user runs it: the command line in a
subprocess.

Each case writes two CSV key tables (column ``id``, 12-digit text, in a seeded random order;
n keys per side, half of them shared), runs the command and reads what it reports in
``summary.json``: its wall time (engine start and stop, key passes, protocol, outputs) as a
ratio to its crypto bound, which it measures itself (the group's cost per operation on one core,
sampled before and after the run, times the protocol's operations per party, over the cores
used; :mod:`vflink.alignment.cost`). Printed per case, as JSON:

* ``ratio``: the command's own ratio (``crypto_bound.ratio`` of its summary);
* ``ratio_process``: the subprocess's whole time (interpreter start, imports and the cost
  samples included) over the same bound;
* ``us_per_operation``: the costs the bound used, so the figure can be checked elsewhere;
* ``cpu_ratio`` (in-process, local engine: both parties in the command's process): its CPU
  seconds over the bound's one-core seconds, the work done beyond the crypto, which other
  jobs on the machine do not inflate as they do the wall time;
* ``pairs``: the pairing each output gives (primary row ↔ secondary row through equal UIDs)
  checked against the plaintext one, and, across engines of one case, against each other.

    PYTHONPATH=src python benchmarks/align_command.py                        # 10^5 per side
    PYTHONPATH=src python benchmarks/align_command.py --sizes 100000 1000000 \\
        --methods psu psi --engines local ray --forms in-process party          # 10^6 too

``--engines ray`` needs the ray extra (``--engine ray --address local``: a cluster started by
the command, its start inside the command's time). ``--forms party`` serves the secondary with
``vflink serve`` (mutual TLS on loopback, the same engine) and runs ``vflink align --party``.
Each command's own peak memory is reported too. On a machine other jobs share, the ratio is
pessimistic (the bound assumes every core is the run's): say so beside any figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from align_memory import party_files, run_cli, serve  # noqa: E402

ENGINES = {"local": [], "ray": ["--engine", "ray", "--address", "local"]}


def write_csv(path: Path, lo: int, n: int) -> None:
    """Keys ``lo .. lo+n-1`` as 12-digit text, in a seeded random order, one per line."""
    import numpy as np

    order = np.random.default_rng(lo + n).permutation(n) + lo
    with open(path, "w") as fh:
        fh.write("id\n")
        for s in range(0, n, 100_000):
            fh.write("".join(f"{i:012d}\n" for i in order[s:s + 100_000]))


def pairs(case: Path, out: Path, method: str) -> dict[str, Any]:
    """The pairing the outputs give, checked against the plaintext one (keys equal), and a
    digest of it (to compare engines: UIDs differ between runs, pairings must not)."""
    import hashlib

    import numpy as np
    import pandas as pd

    a = pd.read_csv(case / "a.csv", dtype=str)["id"].to_numpy()
    b = pd.read_csv(case / "b.csv", dtype=str)["id"].to_numpy()
    sa, sb = pd.Series(a), pd.Series(b)
    widths = pd.concat([sa, sb]).str.len()
    if len(sa) and widths.nunique() == 1 and int(widths.iloc[0]) <= 18 and \
            sa.str.fullmatch(r"\d+").all() and sb.str.fullmatch(r"\d+").all():
        # digit keys of one width: as integers they sort and compare in the same order, in
        # seconds rather than the many minutes object arrays of 10⁷ strings take
        a, b = a.astype(np.int64), b.astype(np.int64)
    p = pd.read_parquet(out / "primary.parquet")
    s = pd.read_parquet(out / "secondary.parquet")
    joined = p.merge(s, on="uid", suffixes=("_a", "_b"))
    got = np.sort(a[joined["row_a"].to_numpy()]) if len(joined) else np.array([], dtype=object)
    ok = bool(((a[joined["row_a"].to_numpy()] == b[joined["row_b"].to_numpy()]).all())
              and np.array_equal(got, np.sort(np.intersect1d(a, b))))
    if method == "psu":  # every record has a UID; U holds |A ∪ B| distinct ones
        ok = ok and len(p) == len(a) and len(s) == len(b) and (
            len(set(p["uid"]) | set(s["uid"])) == len(np.union1d(a, b)))
    order = np.lexsort((joined["row_b"].to_numpy(), joined["row_a"].to_numpy()))
    digest = hashlib.sha256(joined["row_a"].to_numpy()[order].tobytes()
                            + joined["row_b"].to_numpy()[order].tobytes()).hexdigest()[:16]
    return {"pairs": int(len(joined)), "pairs_match_plaintext": ok, "pairs_digest": digest}


def one_case(method: str, n: int, form: str, engine: str, chunk: int | None,
             work: Path) -> dict[str, Any]:
    case = work / f"{n}"
    case.mkdir(parents=True, exist_ok=True)
    if not (case / "b.csv").exists():
        write_csv(case / "a.csv", 0, n)
        write_csv(case / "b.csv", n // 2, n)  # half of each side shared
    out = case / f"out-{method}-{form}-{engine}"
    shutil.rmtree(out, ignore_errors=True)
    flags = ["align", "--method", method, "--primary", str(case / "a.csv"), "--on", "id",
             "--out", str(out), *ENGINES[engine]]
    if chunk is not None:
        flags += ["--chunk-rows", str(chunk)]
    row: dict[str, Any] = {"method": method, "n_per_side": n, "form": form, "engine": engine}
    if form == "in-process":
        ran = run_cli(flags + ["--secondary", str(case / "b.csv")], case)
    else:
        state = case / f"party-{method}-{engine}"
        shutil.rmtree(state, ignore_errors=True)
        state.mkdir()
        pri, sec = party_files(state, case / "b.csv", chunk or 100_000)
        if engine == "ray":  # the served secondary on its own cluster too
            sec.write_text(sec.read_text() + 'engine = "ray"\naddress = "local"\n')
        server = serve(sec, state)
        try:
            ran = run_cli(flags + ["--party", str(pri)], case)
        finally:
            server.terminate()
            server.wait(timeout=120)
        # the secondary wrote its output into its state directory
        written = sorted((state / "state").rglob("*.parquet"))
        if written:
            shutil.copy(written[-1], out / "secondary.parquet")
    bound = json.loads((out / "summary.json").read_text())["crypto_bound"]
    row |= {"process_s": ran["seconds"], "command_s": bound["wall_seconds"],
            "bound_s": bound["seconds"], "cores": bound["cores"], "ratio": bound["ratio"],
            "ratio_process": round(ran["seconds"] / bound["seconds"], 3),
            "us_per_operation": bound["us_per_operation"]["mean"],
            "command_mib": ran["command_mib"], "children_max_mib": ran["children_max_mib"],
            "command_cpu_s": ran["command_cpu_s"]}
    if engine == "local" and form == "in-process":
        # both parties' work is this process's: its CPU time over the bound's one-core time
        # is the CPU spent beyond the crypto, whatever else shares the machine
        row["cpu_ratio"] = round(ran["command_cpu_s"] / (bound["seconds"] * bound["cores"]), 3)
    if (out / "secondary.parquet").exists():
        row |= pairs(case, out, method)
    shutil.rmtree(out, ignore_errors=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000], help="keys per side")
    p.add_argument("--methods", nargs="+", default=["psu", "psi"], choices=["psu", "psi"])
    p.add_argument("--engines", nargs="+", default=["local"], choices=sorted(ENGINES))
    p.add_argument("--forms", nargs="+", default=["in-process"],
                   choices=["in-process", "party"])
    p.add_argument("--chunk-rows", type=int, help="--chunk-rows of the command (default: its "
                   "own, 100,000)")
    p.add_argument("--workdir", type=Path)
    args = p.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="vflink-align-cmd-"))
    rows: list[dict[str, Any]] = []
    load = [os.getloadavg()[0]]
    try:
        for n in args.sizes:
            for method in args.methods:
                for form in args.forms:
                    digests = set()
                    for engine in args.engines:
                        row = one_case(method, n, form, engine, args.chunk_rows, work)
                        digests.add(row.get("pairs_digest"))
                        print(json.dumps(row), file=sys.stderr, flush=True)
                        rows.append(row)
                    if len(args.engines) > 1 and None not in digests:
                        rows[-1]["pairs_equal_across_engines"] = len(digests) == 1
            shutil.rmtree(work / f"{n}", ignore_errors=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    load.append(os.getloadavg()[0])
    print(json.dumps({"benchmark": "align_command", "python": platform.python_version(),
                      "cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
                      "load_average_1min_start_end": load, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
