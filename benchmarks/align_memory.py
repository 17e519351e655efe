"""Peak memory of ``vflink align --method psi|psu`` run as a command: is it flat in
table size at a fixed chunk size?

Each case writes two Parquet key tables (``id``, 12-digit text; n keys per side, half of them
shared), then runs the real command line in a fresh subprocess and reports the peak resident
set (VmHWM) of every process of its tree, as JSON:

* ``in-process``: ``vflink align --primary a.parquet --secondary b.parquet --chunk-rows C``:
  both parties in one process (that is what the in-process form is), each reading its keys
  from its file in batches and streaming its output to Parquet;
* ``party`` (``--forms party``): ``vflink serve --config bank.toml`` (the secondary, a process
  of its own, its table named in its party file, mutual TLS on loopback) and
  ``vflink align --party primary.toml`` (the primary), each measured on its own.

The command's own peak is exact (``getrusage`` at its exit, through a two-line launcher);
any child it starts (Ray workers with ``--engine ray``) is sampled every 0.1 s; the served
secondary's peak is read from ``/proc`` after the run, while it still serves.

    PYTHONPATH=src python benchmarks/align_memory.py                    # ~5 minutes here
    PYTHONPATH=src python benchmarks/align_memory.py --cases psi:1000000 psi:10000000 \\
        psu:1000000 --forms in-process party                             # 10^6 and 10^7

Cost: ristretto255 needs about 4 scalar multiplications per element and side for PSI and
about 5 for PSU (49 µs each on one core of this machine): PSI 10^6 ∩ 10^6 ≈ 2·10^6 · 4 ·
49 µs / cores ≈ 400 s on one core, PSI 10^7 ≈ 66 min on one core, PSU 10^6 ≈ 8 min.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: runs the CLI and writes its own peak RSS (KiB) and CPU seconds (user + system, all its
#: threads), from getrusage, to $VFLINK_BENCH_RSS at exit
LAUNCHER = ("import os, resource, sys\n"
            "from vflink.cli.main import main\n"
            "rc = main(sys.argv[1:])\n"
            "r = resource.getrusage(resource.RUSAGE_SELF)\n"
            "open(os.environ['VFLINK_BENCH_RSS'], 'w').write(\n"
            "    f'{r.ru_maxrss} {r.ru_utime + r.ru_stime}')\n"
            "sys.exit(rc)\n")


def _hwm_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    try:
        import psutil

        out = {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except Exception:  # noqa: BLE001 - the process has gone: no children left to sample
        pass
    return out


def write_keys(path: Path, lo: int, n: int) -> None:
    """Keys ``lo .. lo+n-1`` as 12-digit text, in a random order (seeded), row groups of 10^5."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    order = np.random.default_rng(lo + n).permutation(n) + lo
    with pq.ParquetWriter(path, pa.schema([("id", pa.string())])) as w:
        for s in range(0, n, 100_000):
            w.write_table(pa.table({"id": pa.array([f"{i:012d}" for i in order[s:s + 100_000]],
                                                    pa.string())}))


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_cli(args: list[str], work: Path) -> dict[str, Any]:
    """``vflink ARGS`` in a subprocess: its seconds, own peak and its children's peaks."""
    rss_file = work / "rss.txt"
    env = _env() | {"VFLINK_BENCH_RSS": str(rss_file)}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, *args], env=env, cwd=work,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    children: dict[int, float] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.1):
            for c in _children(proc.pid):
                children[c] = max(children.get(c, 0.0), _hwm_mib(c))

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    output, _ = proc.communicate()
    stop.set()
    t.join()
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"vflink {' '.join(args)} exited {proc.returncode}:\n{output[-3000:]}")
    rss, cpu = rss_file.read_text().split()
    own = int(rss) / 1024
    return {"seconds": round(seconds, 1), "command_mib": round(own, 1),
            "command_cpu_s": round(float(cpu), 1),
            "children_max_mib": round(max(children.values(), default=0.0), 1),
            "children_seen": len(children)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def party_files(work: Path, secondary: Path, chunk: int) -> tuple[Path, Path]:
    """Party files of a primary and a secondary ``bank`` on loopback with mutual TLS."""
    sys.path.insert(0, str(ROOT / "src"))
    from vflink.transport.grpc import create_dev_pki

    certs = work / "certs"
    if not certs.exists():
        create_dev_pki(certs, ["primary", "bank"])
    port = _free_port()
    coord = f'[peers.coordinator]\naddress = "127.0.0.1:{_free_port()}"\nrole = "coordinator"\n'
    sec = work / "bank.toml"
    sec.write_text(
        f'version = 1\n[party]\nname = "bank"\nrole = "secondary"\n'
        f'listen = "127.0.0.1:{port}"\nstate_dir = "{work / "state"}"\ndeadline_s = 3600\n'
        f'[party.table]\npath = "{secondary}"\nkey = ["id"]\n{coord}'
        f'[security]\ntls_dir = "{certs}"\nallowed = ["primary"]\n'
        f'[compute]\nchunk_rows = {chunk}\n')
    pri = work / "primary.toml"
    pri.write_text(
        f'version = 1\n[party]\nname = "primary"\nrole = "primary"\ndeadline_s = 3600\n'
        f'[peers.bank]\naddress = "127.0.0.1:{port}"\nrole = "secondary"\n{coord}'
        f'[security]\ntls_dir = "{certs}"\n[compute]\nchunk_rows = {chunk}\n')
    return pri, sec


def serve(sec: Path, work: Path) -> subprocess.Popen[str]:
    env = _env() | {"VFLINK_SECRET": "benchmark-secret-not-used-by-psi-or-psu"}
    proc = subprocess.Popen([sys.executable, "-c", "import sys\nfrom vflink.cli.main import "
                             "main\nsys.exit(main(sys.argv[1:]))", "serve", "--config",
                             str(sec)], env=env, cwd=work, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, text=True)
    port = int(sec.read_text().split('listen = "127.0.0.1:')[1].split('"')[0])
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vflink serve exited {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.2)
    proc.terminate()
    raise RuntimeError("vflink serve did not start")


def one_case(method: str, n: int, form: str, chunk: int, engine: list[str],
             work: Path) -> dict[str, Any]:
    case = work / f"{method}-{n}-{form}"
    case.mkdir(parents=True, exist_ok=True)
    a, b = case / "a.parquet", case / "b.parquet"
    write_keys(a, 0, n)
    write_keys(b, n // 2, n)  # half of each side shared
    out = case / "out"
    common = ["align", "--method", method, "--primary", str(a), "--on", "id", "--out",
              str(out), "--chunk-rows", str(chunk), *engine]
    row: dict[str, Any] = {"method": method, "n_per_side": n, "form": form,
                           "chunk_rows": chunk}
    if form == "in-process":
        row |= run_cli(common + ["--secondary", str(b)], case)
    else:
        pri, sec = party_files(case, b, chunk)
        server = serve(sec, case)
        try:
            row |= run_cli(common + ["--party", str(pri)], case)
            row["served_secondary_mib"] = round(_hwm_mib(server.pid), 1)
        finally:
            server.terminate()
            server.wait(timeout=60)
    summary = json.loads((out / "summary.json").read_text())
    row["sizes"] = summary["sizes"]
    shutil.rmtree(case, ignore_errors=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="+", default=["psi:10000", "psi:100000", "psi:300000",
                                                  "psu:10000", "psu:100000"],
                   help="METHOD:N (keys per side)")
    p.add_argument("--forms", nargs="+", default=["in-process", "party"],
                   choices=["in-process", "party"])
    p.add_argument("--chunk-rows", type=int, default=10_000)
    p.add_argument("--engine", nargs="*", default=[],
                   help="extra flags for vflink align, e.g. --engine ray --address local")
    p.add_argument("--workdir", type=Path)
    args = p.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="vflink-align-mem-"))
    rows = []
    try:
        for case in args.cases:
            method, n = case.split(":")
            for form in args.forms:
                row = one_case(method, int(n), form, args.chunk_rows, args.engine, work)
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"benchmark": "align_memory", "python": platform.python_version(),
                      "cpus": os.cpu_count(), "load_average": os.getloadavg(),
                      "chunk_rows": args.chunk_rows, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
