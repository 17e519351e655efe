"""The PSI engine's child process (see :mod:`vflink.alignment.engine`).

Run by path (``python -I _engine_child.py job.json``, by this or another environment's
interpreter: ``$VFLINK_PSI_PYTHON``) in a folder of the party's spool, with
``TMPDIR`` inside it: it imports ``spu`` and nothing of vflink (no torch, no numpy 2), dies with
its parent (``PR_SET_PDEATHSIG``), runs one ``psi_execute`` on the link the job describes, and
writes ``result.json``: ``ok`` with libpsi's counts and its own timings, or the ``stage`` that
failed (``start``, ``link``, ``timeout``, ``psi``) with the error's text. libpsi writes a trace
to ``/tmp/psi_<random>.trace`` after a successful run and names it in its log (this process's
output): the child removes it before it exits.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import sys
import time
from typing import Any

#: libpsi's trace file as its log names it (kept in step with vflink.alignment._spool)
_TRACE = re.compile(r"Trace has been written to (/tmp/psi_[A-Za-z0-9_-]{1,64}\.trace)")
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """Be killed when the party that started us dies (Linux), and stop at once if it
    already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(3)


def _remove_traces(log_path: str) -> None:
    try:
        with open(log_path, "rb") as fh:
            text = fh.read(8 << 20).decode("utf-8", "replace")
    except OSError:
        return
    for path in set(_TRACE.findall(text)):
        try:
            if os.lstat(path).st_uid == os.getuid():
                os.unlink(path)
        except OSError:
            pass


def _write(path: str, doc: dict[str, Any]) -> None:
    tmp = path + ".part"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
    os.replace(tmp, path)


def _ssl(opts: Any, tls: dict[str, str]) -> None:
    opts.cert.certificate_path = tls["cert"]
    opts.cert.private_key_path = tls["key"]
    opts.verify.ca_file_path = tls["ca"]
    opts.verify.verify_depth = 1


def main(argv: list[str]) -> int:
    with open(argv[1], encoding="utf-8") as fh:
        job = json.load(fh)
    _die_with_parent(int(job["parent"]))
    started = time.time()
    result: dict[str, Any] = {"ok": False, "stage": "start"}
    try:
        import spu.libspu as libspu
        from spu import psi
    except Exception as exc:  # an engine that cannot load: say why
        result["error"] = f"spu cannot be imported: {type(exc).__name__}: {exc}"
        _write(job["result"], result)
        return 2
    imported = time.time()
    desc = libspu.link.Desc()
    desc.id = job["link_id"]
    for party, address in job["parties"]:
        desc.add_party(party, address)
    desc.connect_retry_times = int(job["connect_retry_times"])
    desc.connect_retry_interval_ms = int(job["connect_retry_interval_ms"])
    desc.recv_timeout_ms = int(job["recv_timeout_ms"])
    desc.http_timeout_ms = int(job["http_timeout_ms"])
    if job["tls"] is not None:
        desc.enable_ssl = True
        _ssl(desc.client_ssl_opts, job["tls"])
        _ssl(desc.server_ssl_opts, job["tls"])
    try:
        lctx = libspu.link.create_brpc(desc, int(job["rank"]))
    except Exception as exc:
        result.update(stage="link", error=f"{type(exc).__name__}: {exc}")
        _write(job["result"], result)
        return 1
    linked = time.time()
    config = psi.PsiExecuteConfig(
        protocol_conf=psi.PsiProtocolConfig(
            protocol=getattr(psi.PsiProtocol, job["protocol"]),
            receiver_rank=int(job["receiver"]), broadcast_result=bool(job["broadcast"])),
        input_params=psi.InputParams(path=job["input"], selected_keys=["key"],
                                     keys_unique=True),
        # in input order (rows ascending), not sorted by key: no second sort of the output
        output_params=psi.OutputParams(path=job["output"], disable_alignment=True))
    try:
        report = psi.psi_execute(config, lctx)
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}"
        result.update(stage="timeout" if "timeout" in text.lower() else "psi", error=text)
        _remove_traces(job["log"])
        _write(job["result"], result)
        os._exit(1)  # no link teardown: the peer may have gone, and brpc aborts on that
    done = time.time()
    _remove_traces(job["log"])
    _write(job["result"], {
        "ok": True, "original_count": int(report.original_count),
        "intersection_count": int(report.intersection_count),
        "seconds": {"engine_import": imported - started, "engine_link": linked - imported,
                    "engine_run": done - linked}})
    # the run is complete on both sides once psi_execute returns (its last message was the
    # peer's); tearing the link down (stop_link) races the peer's own exit and brpc aborts the
    # process on a failed send, so the child exits at once
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
