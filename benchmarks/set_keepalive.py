"""An honest PSU whose driver computes for longer than the secondary's idle expiry.

The reported case: with ``session_ttl_s = 30`` a 200,000-record PSU failed after 46.6 s with
"state 'new': psu_chunk refused", and used up one of the peer's ``max_set_sessions``. This
serves a secondary as a real ``vflink serve`` process (issued certificates, loopback) with a
short expiry and runs the primary's PSU against it twice in this process: with the driver's
keepalive (``SetProgress`` while it computes a list) and without (an older driver, the
baseline), timing each and reading the secondary's allowance file after each.

Prints JSON: sizes, the expiry, wall seconds and outcome of each run, the keepalives sent,
the sessions counted against the peer, the driver's peak memory, and the load average (the
machine may be shared).

    python benchmarks/set_keepalive.py --records 200000 --ttl 30
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(tmp: Path, n: int, ttl: float) -> tuple[subprocess.Popen[bytes], str, Path]:
    import pandas as pd

    from vflink.cli.main import main

    certs = tmp / "certs"
    main(["certs", "--out", str(certs), "--parties", "primary,secondary,coordinator"])
    csv = tmp / "secondary.csv"
    # half of the secondary's records are the primary's too
    pd.DataFrame({"id": [f"shared{i}" if i < n // 2 else f"bank{i}" for i in range(n)]}
                 ).to_csv(csv, index=False)
    address = f"127.0.0.1:{_free_port()}"
    party = tmp / "secondary.toml"
    party.write_text(
        f'version = 1\n[party]\nname = "secondary"\nrole = "secondary"\n'
        f'listen = "{address}"\nstate_dir = "{tmp / "state"}"\ndeadline_s = 600\n'
        f'[party.table]\npath = "{csv}"\nkey = ["id"]\n'
        f'[peers.coordinator]\naddress = "127.0.0.1:{_free_port()}"\nrole = "coordinator"\n'
        f'[security]\ntls_dir = "{certs}"\nallowed = ["primary"]\n'
        f'[policy]\nsession_ttl_s = {ttl}\n')
    env = {**os.environ, "VFLINK_SECRET": "benchmark-secret-0123456789abcdef"}
    log = (tmp / "secondary.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "vflink.cli.main", "serve", "--config",
                             str(party)], stdout=log, stderr=subprocess.STDOUT, env=env)
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((host, int(port))) == 0:
                return proc, address, certs
        time.sleep(0.2)
    proc.terminate()
    raise RuntimeError("the secondary did not start")


def _sessions(tmp: Path) -> int:
    path = tmp / "state" / "_set-sessions.json"
    if not path.is_file():
        return 0
    return len(json.loads(path.read_text())["peers"].get("primary", []))


def _run(address: str, certs: Path, n: int, keepalive: bool) -> dict[str, Any]:
    import pandas as pd

    from vflink.alignment._dh import key_bytes
    from vflink.alignment.groups import get_group
    from vflink.errors import VflinkError
    from vflink.parties.setalign import SetAlignmentDriver
    from vflink.protocol.sessions import new_session_name
    from vflink.transport.grpc import GrpcChannel, TlsConfig

    keys = key_bytes(pd.DataFrame({"id": [f"shared{i}" if i < n // 2 else f"mine{i}"
                                          for i in range(n)]}), ("id",))
    sent = {"n": 0}
    driver_cls = SetAlignmentDriver
    if not keepalive:
        driver_cls = type("OldDriver", (SetAlignmentDriver,), {"_tick": lambda *a: None})
    tick = driver_cls._tick

    def counted(self: Any, stream: str, count: int) -> None:
        before = self._last
        tick(self, stream, count)
        sent["n"] += int(self._last != before)

    driver_cls = type("Counted", (driver_cls,), {"_tick": counted})
    with GrpcChannel("primary", {"secondary": address}, TlsConfig.for_party(certs, "primary"),
                     deadline_s=600) as ch:
        driver = driver_cls(keys, ch, get_group("ristretto255"))
        started = time.monotonic()
        try:
            out = driver.psu("secondary", new_session_name("psu"))
            result: dict[str, Any] = {"outcome": "finished", "sizes": out.sizes}
        except VflinkError as exc:
            result = {"outcome": "failed", "error": " ".join(str(exc).split())}
        result["seconds"] = round(time.monotonic() - started, 1)
    result["keepalives"] = sent["n"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000, help="records on each side")
    parser.add_argument("--ttl", type=float, default=30.0, help="the secondary's idle expiry")
    parser.add_argument("--skip-baseline", action="store_true",
                        help="only the run with the keepalive")
    args = parser.parse_args()
    out: dict[str, Any] = {"records": args.records, "overlap": 0.5,
                           "session_ttl_s": args.ttl, "group": "ristretto255",
                           "load_average": os.getloadavg(), "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="vflink-keepalive-") as d:
        tmp = Path(d)
        proc, address, certs = _serve(tmp, args.records, args.ttl)
        try:
            out["with_keepalive"] = _run(address, certs, args.records, keepalive=True)
            out["with_keepalive"]["sessions_counted"] = _sessions(tmp)
            if not args.skip_baseline:
                out["without_keepalive"] = _run(address, certs, args.records, keepalive=False)
                out["without_keepalive"]["sessions_counted"] = _sessions(tmp)
        finally:
            proc.terminate()
            proc.wait(30)
    out["driver_peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    out["load_average_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
