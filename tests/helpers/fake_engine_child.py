"""A stand-in for the PSI engine's child process, for tests where ``spu`` is not installed
(see tests/helpers/engine.py). Standard library only: it is run by path, as the real child is.

It reads the real child's job file, meets its peer (the same link id, the other rank) in the
folder ``VFLINK_FAKE_ENGINE_RENDEZVOUS``, and computes the intersection in plaintext from the
two input CSVs; it writes the output in input order (the receiver's, and the
other's when the result is broadcast), ``result.json``, and a log in libpsi's format naming a
trace file that it creates in ``/tmp`` and leaves there (as a child killed after libpsi wrote
its trace would): the parent must remove it. ``VFLINK_FAKE_ENGINE`` picks a failure:
``link-fail`` (no peer: the link does not connect), ``fail-rank1`` (the secondary's engine
fails), ``hang`` (never finishes), ``wrong-output`` (the secondary's output holds one wrong row).
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import signal
import sys
import time
from datetime import datetime


def log(fh, text: str) -> None:
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    fh.write(f"[{stamp}] [info] [fake.cc:1] {text}\n")
    fh.flush()


def write(path: str, doc: dict) -> None:
    with open(path + ".part", "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
    os.replace(path + ".part", path)


def read_input(path: str) -> list[tuple[str, int]]:
    with open(path, encoding="ascii") as fh:
        next(fh)
        return [(k, int(r)) for k, r in (line.strip().split(",") for line in fh if line.strip())]


def main(argv: list[str]) -> int:
    with open(argv[1], encoding="utf-8") as fh:
        job = json.load(fh)
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # die with the parent, as the real child
    except (OSError, AttributeError):
        pass
    if os.getppid() != int(job["parent"]):
        os._exit(3)
    behaviour = os.environ.get("VFLINK_FAKE_ENGINE", "")
    rank = int(job["rank"])
    out = sys.stdout
    log(out, f"[FakePsi::Init] start (rank {rank})")
    if behaviour == "hang":
        while True:
            time.sleep(1)
    # both children of a run announce their job in the rendezvous folder, named by link id
    meet = os.environ["VFLINK_FAKE_ENGINE_RENDEZVOUS"]
    with open(os.path.join(meet, f"{job['link_id']}-{rank}"), "w", encoding="utf-8") as fh:
        fh.write(os.path.abspath(sys.argv[1]))
    peer_job = None
    limit = time.monotonic() + (job["connect_retry_times"] * job["connect_retry_interval_ms"]
                                / 1000.0)
    other_path = os.path.join(meet, f"{job['link_id']}-{1 - rank}")
    while peer_job is None and behaviour != "link-fail":
        try:
            with open(other_path, encoding="utf-8") as fh:
                with open(fh.read(), encoding="utf-8") as jf:
                    peer_job = json.load(jf)
        except (OSError, ValueError):
            if time.monotonic() > limit:
                break
            time.sleep(0.05)
    if peer_job is None:
        write(job["result"], {"ok": False, "stage": "link", "error": "RuntimeError: what: "})
        return 1
    if behaviour == "fail-rank1" and rank == 1:
        write(job["result"], {"ok": False, "stage": "psi", "error": "RuntimeError: boom"})
        return 1
    log(out, "[FakePsi::Init] end")
    log(out, "[FakePsi::Online] start")
    mine = read_input(job["input"])
    # the peer's input may still be being written: wait for its last line to settle
    deadline = time.monotonic() + 30
    theirs: list[tuple[str, int]] = []
    while time.monotonic() < deadline:
        try:
            theirs = read_input(peer_job["input"])
            break
        except (OSError, StopIteration, ValueError):
            time.sleep(0.05)
    keys = {k for k, _ in theirs}
    log(out, "[FakePsi::Online] end")
    log(out, "[FakePsi::Finalize] start")
    gets = rank == job["receiver"] or job["broadcast"]
    rows = [(k, r) for k, r in mine if k in keys] if gets else []
    if behaviour == "wrong-output" and rank == 1 and rows:
        # one common record swapped for one the primary does not hold: the count agrees,
        # the records do not
        other = next((k, r) for k, r in mine if k not in keys)
        rows = sorted(rows[1:] + [other], key=lambda kr: kr[1])
    with open(job["output"], "w", encoding="ascii") as fh:
        fh.write('"key","row"\n' + "".join(f"{k},{r}\n" for k, r in rows))
    log(out, "[FakePsi::Finalize] end")
    trace = f"/tmp/psi_FAKE{secrets.token_hex(6)}.trace"
    with open(trace, "wb") as fh:
        fh.write(b"trace")
    log(out, f"Trace has been written to {trace}.")
    write(job["result"], {"ok": True, "original_count": len(mine),
                          "intersection_count": sum(1 for k, _ in mine if k in keys),
                          "seconds": {"engine_import": 0.0, "engine_link": 0.0,
                                      "engine_run": 0.0}})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
