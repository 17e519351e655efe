"""The PSI engine in tests: party files with ``[psi]`` links, the real engine's skip reason, and
a stand-in engine for environments without ``spu``.

The stand-in (:data:`FAKE_CHILD`) takes the real child's job file and writes what the real one
writes (its output CSV in input order, ``result.json``, a log naming a trace file in ``/tmp``,
which it leaves there as a killed child would), computing the intersection in plaintext from
its peer's input (both parties are on this machine; a run's two children meet in a folder).
It lets the session layer around the engine (agreement, policy, TLS, status, failures,
cleanup) run on both transports in the default suite; the real engine's tests carry the
``rr22`` marker and run where ``spu`` is installed (CI's rr22 job).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.helpers.network import free_port
from vflink.alignment import engine as engine_module
from vflink.alignment._spool import process_alive
from vflink.alignment.engine import engine_missing
from vflink.transport.grpc import create_dev_pki

FAKE_CHILD = Path(__file__).with_name("fake_engine_child.py")

#: why the real engine's tests skip here (None: spu is installed)
SPU_MISSING = engine_missing()
needs_spu = pytest.mark.skipif(SPU_MISSING is not None, reason=str(SPU_MISSING))


@contextmanager
def fake_engine(monkeypatch: pytest.MonkeyPatch, *, behaviour: str = "") -> Iterator[None]:
    """Run the stand-in engine instead of spu's (``behaviour``: ``""``, ``link-fail``,
    ``fail-rank1``, ``hang``, ``wrong-output``); a run's two children meet in a folder of
    their own."""
    from vflink.parties import setengine

    monkeypatch.setattr(engine_module, "CHILD", FAKE_CHILD)
    monkeypatch.setattr(engine_module, "engine_python", lambda: sys.executable)
    monkeypatch.setattr(engine_module, "engine_missing", lambda: None)
    monkeypatch.setattr(setengine, "engine_missing", lambda: None)
    monkeypatch.setenv("VFLINK_FAKE_ENGINE", behaviour)
    with tempfile.TemporaryDirectory(prefix="vflink-fake-engine-") as meet:
        monkeypatch.setenv("VFLINK_FAKE_ENGINE_RENDEZVOUS", meet)
        yield


def _ours_or_orphaned(workdir: Path) -> bool:
    """A workdir of this process, or of one that is gone (other jobs on a shared machine run
    engines of their own, whose workdirs live while they run)."""
    try:
        token = (workdir / ".owner").read_text(encoding="ascii")
    except OSError:
        return workdir.exists()
    return token.split()[0] == str(os.getpid()) or not process_alive(token)


def leftovers(*folders: Path) -> list[str]:
    """What an engine run may leave behind: trace files in /tmp, engine workdirs in the
    system's temporary directory and in ``folders`` (spools)."""
    tmp = Path("/tmp")
    found = [str(p) for p in tmp.glob("psi_*")]  # traces and temporary folders
    found += [str(p) for p in Path(tempfile.gettempdir()).glob("vflink-set-*")
              if (p / "job.json").exists() and _ours_or_orphaned(p)]
    for folder in folders:
        if folder.exists():
            found += [str(p) for p in folder.rglob("*") if p.name != ".gitkeep"]
    return found


def engine_party_files(tmp: Path, secondary_table: Path, *, insecure: bool = False,
                       secondary_tls: bool | None = None, secondary_policy: str = "",
                       primary_policy: str = "", secondary_psi: bool = True,
                       primary_psi: bool = True, key: str = "id",
                       deadline_s: float = 60, connect_s: float = 10) -> tuple[Path, Path]:
    """(primary.toml, bank.toml): a served secondary "bank" on ``secondary_table`` and its
    primary, each with its own ``[psi]`` link on loopback; mutual TLS from ``vflink certs``
    unless ``insecure`` (``secondary_tls=False``: the secondary's engine link alone in
    plaintext, ``psi.tls = false``: a mismatch)."""
    certs = tmp / "certs"
    if not certs.exists():
        create_dev_pki(certs, ["primary", "bank"])
    port = free_port()
    sec_tls = "" if secondary_tls is None else f"tls = {'true' if secondary_tls else 'false'}\n"

    def security(plain: bool) -> str:
        return '[security]\ninsecure = true\n' if plain else f'[security]\ntls_dir = "{certs}"\n'

    sec = tmp / "bank.toml"
    sec.write_text(
        f'version = 1\n[party]\nname = "bank"\nrole = "secondary"\nlisten = "127.0.0.1:{port}"\n'
        f'state_dir = "{tmp / "state"}"\ndeadline_s = {deadline_s}\n'
        f'[party.table]\npath = "{secondary_table}"\nkey = ["{key}"]\n'
        f'[peers.coordinator]\naddress = "127.0.0.1:{free_port()}"\nrole = "coordinator"\n'
        f'{security(insecure)}allowed = ["primary"]\n'
        + (f'[psi]\nlisten = "127.0.0.1:{free_port()}"\nconnect_s = {connect_s}\n{sec_tls}'
           if secondary_psi else "")
        + (f"[policy]\n{secondary_policy}\n" if secondary_policy else ""))
    pri = tmp / "primary.toml"
    pri.write_text(
        f'version = 1\n[party]\nname = "primary"\nrole = "primary"\n'
        f'state_dir = "{tmp / "primary-state"}"\ndeadline_s = {deadline_s}\n'
        f'[peers.bank]\naddress = "127.0.0.1:{port}"\nrole = "secondary"\n'
        f'[peers.coordinator]\naddress = "127.0.0.1:{free_port()}"\nrole = "coordinator"\n'
        f'{security(insecure)}'
        + (f'[psi]\nlisten = "127.0.0.1:{free_port()}"\nconnect_s = {connect_s}\n'
           if primary_psi
           else "")
        + (f"[policy]\n{primary_policy}\n" if primary_policy else ""))
    return pri, sec
