"""PSI through the engine (RR22, KKRT16 from SecretFlow's spu) against vflink's DH PSI, each run
as a user runs it: ``vflink align --method psi --protocol P`` in a subprocess, in the same run
on the same tables.

Each size writes two CSV key tables (column ``id``, 12-digit text, in a seeded random order;
n keys per side, half of them shared). Forms:

* ``party`` (default): the secondary served by ``vflink serve --config bank.toml`` (a process
  of its own, its table in its party file) and the primary ``vflink align --party
  primary.toml``, mutual TLS on loopback from ``vflink certs``' certificates, each party's
  engine link on a port of its own ``[psi]`` section;
* ``in-process``: ``vflink align --primary a.csv --secondary b.csv`` (both parties in one
  process; the engine's two children still link over loopback).

Printed per case, as JSON: the wall time of the command's process (``process_s``) and its own
time (``command_s``, ``command_seconds`` of its summary), for an engine run the protocol's own
phase and the share of the command's time spent outside it (CSV, buckets and sorting, the
engine's start); per party its CPU seconds (the process and the engine child it waited for)
and peak resident set (the process's own, exact; the engine child's, sampled every 0.1 s);
the pairing the two outputs give, checked against the plaintext one and, across protocols,
against each other (one digest); and what was left in ``/tmp`` (``psi_*`` traces,
``vflink-set-*`` workdirs) and the parties' spools afterwards (must be nothing). Each size
ends with ``dh / P`` ratios of the command's time and of the process's, measured in this run.

    PYTHONPATH=src python benchmarks/psi_engine.py                          # 10^5, ~1 minute
    nice PYTHONPATH=src python benchmarks/psi_engine.py --sizes 100000 1000000 > psi.json

The engine needs the ``rr22`` extra: run this with the python of an environment that has it,
or point ``VFLINK_PSI_PYTHON`` at one (the command runs in this interpreter, its engine's
child in that one). On a machine other jobs share, every figure is pessimistic: say so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from align_command import pairs, write_csv  # noqa: E402
from align_memory import _env, _free_port, _hwm_mib  # noqa: E402

#: runs the CLI and writes, at its exit, its own peak RSS (KiB) and CPU seconds and those of
#: the children it waited for (the engine's child), from getrusage
LAUNCHER = ("import os, resource, sys\n"
            "from vflink.cli.main import main\n"
            "rc = main(sys.argv[1:])\n"
            "s = resource.getrusage(resource.RUSAGE_SELF)\n"
            "c = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
            "open(os.environ['VFLINK_BENCH_RSS'], 'w').write(\n"
            "    f'{s.ru_maxrss} {s.ru_utime + s.ru_stime} {c.ru_maxrss} "
            "{c.ru_utime + c.ru_stime}')\n"
            "sys.exit(rc)\n")
SERVE = "import sys\nfrom vflink.cli.main import main\nsys.exit(main(sys.argv[1:]))"
_TICK = os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` now (from /proc: no psutil in the engine's environment)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def _cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and of the children it waited for (utime, stime, cutime,
    cstime)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / _TICK


class _Sampler:
    """The peak resident set of every descendant of some processes, sampled every 0.1 s."""

    def __init__(self, *pids: int) -> None:
        self.pids, self.peak = pids, {p: 0.0 for p in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for root in self.pids:
                for c in _children(root):
                    self.peak[root] = max(self.peak[root], _hwm_mib(c))

    def stop(self) -> dict[int, float]:
        self._stop.set()
        self._thread.join()
        return self.peak


def party_files(work: Path, secondary: Path, n: int = 0) -> tuple[Path, Path]:
    """A primary and a served secondary ``bank`` on loopback with mutual TLS, each with its
    own engine link (``[psi]``); the primary has no state directory: its engine's spool is the
    system's temporary directory, which must be left clean. Above the default policy's 2·10^6
    records per list, the secondary's policy admits ``n``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from vflink.transport.grpc import create_dev_pki

    certs = work / "certs"
    if not certs.exists():
        create_dev_pki(certs, ["primary", "bank"])
    port = _free_port()
    # one call of the DH PSI carries a whole side's exponentiations: about 220 CPU-s per 10⁶
    # keys on this machine, so 10⁷ needs far more than the 600 s that suit smaller sizes
    deadline = max(600, n // 2500)
    coord = f'[peers.coordinator]\naddress = "127.0.0.1:{_free_port()}"\nrole = "coordinator"\n'
    sec = work / "bank.toml"
    sec.write_text(
        f'version = 1\n[party]\nname = "bank"\nrole = "secondary"\n'
        f'listen = "127.0.0.1:{port}"\nstate_dir = "{work / "state"}"\ndeadline_s = {deadline}\n'
        f'[party.table]\npath = "{secondary}"\nkey = ["id"]\n{coord}'
        f'[security]\ntls_dir = "{certs}"\nallowed = ["primary"]\n'
        f'[psi]\nlisten = "127.0.0.1:{_free_port()}"\n'
        + (f'[policy]\nmax_set_elements = {n}\nmax_set_guesses = {2 * n}\n'
           if n > 2_000_000 else ""))
    pri = work / "primary.toml"
    pri.write_text(
        f'version = 1\n[party]\nname = "primary"\nrole = "primary"\ndeadline_s = {deadline}\n'
        f'[peers.bank]\naddress = "127.0.0.1:{port}"\nrole = "secondary"\n{coord}'
        f'[security]\ntls_dir = "{certs}"\n[psi]\nlisten = "127.0.0.1:{_free_port()}"\n')
    return pri, sec


def serve(sec: Path, work: Path) -> subprocess.Popen[str]:
    env = _env() | {"VFLINK_SECRET": "benchmark-secret-not-used-by-psi"}
    proc = subprocess.Popen([sys.executable, "-c", SERVE, "serve", "--config", str(sec)],
                            env=env, cwd=work, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, text=True)
    import socket

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


def _tmp_now() -> set[str]:
    tmp = Path("/tmp")
    found = {str(p) for p in tmp.glob("psi_*")}
    found |= {str(p) for p in Path(tempfile.gettempdir()).glob("vflink-set-*")}
    return found


def _ours(path: str, pids: set[int]) -> bool:
    """Whether a leftover is this case's: a libpsi trace, or a workdir whose owner (its
    ``.owner`` file: pid and start time) was one of this case's processes or is gone (other
    jobs on a shared machine have workdirs of their own there while they run)."""
    if Path(path).name.startswith("psi_"):
        return True
    try:
        pid = int((Path(path) / ".owner").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return Path(path).exists()
    return pid in pids or not Path(f"/proc/{pid}").exists()


def _spooled(*folders: Path) -> list[str]:
    return [str(p) for f in folders if f.exists() for p in f.rglob("*")]


def one_case(protocol: str, n: int, form: str, case: Path) -> dict[str, Any]:
    out = case / f"out-{protocol}-{form}"
    shutil.rmtree(out, ignore_errors=True)
    flags = ["align", "--method", "psi", "--protocol", protocol, "--primary",
             str(case / "a.csv"), "--on", "id", "--out", str(out)]
    row: dict[str, Any] = {"protocol": protocol, "n_per_side": n, "form": form}
    before = _tmp_now()
    rss_file = case / "rss.txt"
    env = _env() | {"VFLINK_BENCH_RSS": str(rss_file)}
    server = None
    state = case / f"party-{protocol}"
    if form == "party":
        shutil.rmtree(state, ignore_errors=True)
        state.mkdir()
        pri, sec = party_files(state, case / "b.csv", n)
        server = serve(sec, state)
        flags += ["--party", str(pri)]
        sec_cpu0 = _cpu_s(server.pid)
    else:
        flags += ["--secondary", str(case / "b.csv")]
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, *flags], env=env, cwd=case,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler = _Sampler(proc.pid, *([server.pid] if server is not None else []))
    output, _ = proc.communicate()
    process_s = time.perf_counter() - start
    peaks = sampler.stop()
    try:
        if proc.returncode != 0:
            raise RuntimeError(f"vflink {' '.join(flags)} exited {proc.returncode}:\n"
                               f"{output[-3000:]}")
        own_kib, own_cpu, _, child_cpu = rss_file.read_text().split()
        primary = {"cpu_s": round(float(own_cpu) + float(child_cpu), 1),
                   "peak_mib": round(int(own_kib) / 1024, 1),
                   # sampled: getrusage's peak of the children counts the parent's pages a
                   # forked child held before its exec
                   "engine_child_peak_mib": round(peaks[proc.pid], 1)}
        if server is not None:
            time.sleep(0.5)  # the served secondary finishes its side (writes its output)
            row["secondary"] = {"cpu_s": round(_cpu_s(server.pid) - sec_cpu0, 1),
                                "peak_mib": round(_hwm_mib(server.pid), 1),
                                "engine_child_peak_mib": round(peaks[server.pid], 1)}
            row["primary"] = primary
        else:
            row["both_parties"] = primary  # one process holds both
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=120)
    summary = json.loads((out / "summary.json").read_text())
    row |= {"process_s": round(process_s, 2), "command_s": summary.get("command_seconds")}
    engine = summary.get("engine")
    if engine is not None:
        row |= {"protocol_s": engine["protocol_seconds"],
                "outside_protocol_share": engine["outside_protocol_share"],
                "outside_protocol_s": engine["outside_protocol"]}
    if form == "party":  # the secondary wrote its output into its state directory
        written = sorted((state / "state" / "alignments").glob("*.parquet"))
        if written:
            shutil.copy(written[-1], out / "secondary.parquet")
    if (out / "secondary.parquet").exists():
        row |= pairs(case, out, "psi")
    time.sleep(0.2)
    pids = {proc.pid} | ({server.pid} if server is not None else set())
    row["left_in_tmp"] = sorted(p for p in _tmp_now() - before if _ours(p, pids))
    row["left_in_spools"] = _spooled(state / "state" / ".set-tmp") if form == "party" else []
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(state, ignore_errors=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000], help="keys per side")
    p.add_argument("--protocols", nargs="+", default=["rr22", "kkrt", "dh"],
                   choices=["rr22", "kkrt", "dh"])
    p.add_argument("--forms", nargs="+", default=["party"], choices=["party", "in-process"])
    p.add_argument("--workdir", type=Path)
    args = p.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="vflink-psi-engine-"))
    rows: list[dict[str, Any]] = []
    ratios: list[dict[str, Any]] = []
    load = [os.getloadavg()[0]]
    try:
        for n in args.sizes:
            case = work / f"{n}"
            case.mkdir(parents=True, exist_ok=True)
            write_csv(case / "a.csv", 0, n)
            write_csv(case / "b.csv", n // 2, n)  # half of each side shared
            for form in args.forms:
                got: dict[str, dict[str, Any]] = {}
                for protocol in args.protocols:
                    row = one_case(protocol, n, form, case)
                    row["load_average_1min"] = os.getloadavg()[0]
                    print(json.dumps(row), file=sys.stderr, flush=True)
                    rows.append(row)
                    got[protocol] = row
                digests = {r.get("pairs_digest") for r in got.values()}
                entry: dict[str, Any] = {"n_per_side": n, "form": form,
                                         "pairs_equal_across_protocols": len(digests) == 1
                                         and None not in digests}
                if "dh" in got:
                    for protocol in ("rr22", "kkrt"):
                        if protocol in got:
                            entry[f"dh_over_{protocol}_command"] = round(
                                got["dh"]["command_s"] / got[protocol]["command_s"], 2)
                            entry[f"dh_over_{protocol}_process"] = round(
                                got["dh"]["process_s"] / got[protocol]["process_s"], 2)
                ratios.append(entry)
                print(json.dumps(entry), file=sys.stderr, flush=True)
            shutil.rmtree(case, ignore_errors=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    load.append(os.getloadavg()[0])
    print(json.dumps({"benchmark": "psi_engine", "python": platform.python_version(),
                      "engine_python": os.environ.get("VFLINK_PSI_PYTHON", sys.executable),
                      "cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
                      "load_average_1min_start_end": load, "rows": rows, "ratios": ratios},
                     indent=2))


if __name__ == "__main__":
    main()
