"""Start parties as gRPC services on 127.0.0.1 for tests (threads or real processes)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vflink.runfiles.party import load_party_config
from vflink.runner.network import serve
from vflink.transport.grpc import create_dev_pki


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _toml(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, Path)):
        text = str(value)
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def write_party_files(tmp: Path, *, dataset: str | None = None,
                      options: dict[str, object] | None = None, seed: int | None,
                      secondary: str = "secondary", primary: str = "primary",
                      insecure: bool = False, private: bool = True,
                      tables: dict[str, dict[str, object]] | None = None,
                      secondary_table: dict[str, object] | None = None,
                      reproducible_secondary: bool = False) -> dict[str, Path]:
    """Certificates and party files for primary, one secondary and the coordinator.

    ``private=False``: every party opts out of the private defaults of its [policy] (raw
    identifiers may reach the coordinator, similarities with any noise), for runs whose
    ``alignment.privacy = "off"``. ``tables``: each data party's own [party.table] (path,
    identifiers, numeric...) instead of its part of ``dataset``; ``secondary_table``: the
    secondary's only (the primary keeps its part of ``dataset``). ``seed``: the coordinator's
    similarity-noise seed, with ``[privacy] reproducible_noise = true`` (``None``: secret
    noise); ``reproducible_secondary``: the secondary's own switch too (union training's
    stand-ins repeat across hosts).
    """
    if secondary_table is not None:
        tables = {**(tables or {}), secondary: secondary_table}
    certs = tmp / "certs"
    if not insecure:
        create_dev_pki(certs, [primary, secondary, "coordinator"])
    ports = {"coordinator": free_port(), secondary: free_port()}
    opts = "\n".join(f"{k} = {v!r}" for k, v in (options or {}).items())

    def data(party: str) -> str:
        if tables is not None and party in tables:
            body = "\n".join(f"{k} = {_toml(v)}" for k, v in tables[party].items())
            return f"[party.table]\n{body}\n"
        return f'dataset = "{dataset}"\n[party.options]\n{opts}\n'
    security = ('[security]\ninsecure = true\n' if insecure else
                f'[security]\ntls_dir = "{certs}"\n')
    data_policy = "" if private else '[policy]\nidentifiers = "any"\n'
    coordinator_policy = "" if private else "[policy]\nmax_tau = 1.0\n"
    # a seeded coordinator is a reproducible one, behind the one switch (not private): the
    # transports' results then agree with an in-process run of the same switch
    coordinator_seed = "" if seed is None else f"seed = {seed}\n"
    coordinator_privacy = "" if seed is None else "[privacy]\nreproducible_noise = true\n"
    secondary_privacy = ("[privacy]\nreproducible_noise = true\n" if reproducible_secondary
                         else "")
    files = {}
    files["coordinator"] = tmp / "coordinator.toml"
    files["coordinator"].write_text(
        f'version = 1\n[party]\nname = "coordinator"\nrole = "coordinator"\n'
        f'listen = "127.0.0.1:{ports["coordinator"]}"\n{coordinator_seed}'
        f'{security}allowed = ["{primary}", "{secondary}"]\n'
        f'roles = {{ {primary} = "primary", {secondary} = "secondary" }}\n'
        f'{coordinator_policy}{coordinator_privacy}')
    files[secondary] = tmp / f"{secondary}.toml"
    files[secondary].write_text(
        f'version = 1\n[party]\nname = "{secondary}"\nrole = "secondary"\n'
        f'listen = "127.0.0.1:{ports[secondary]}"\nstate_dir = "{tmp / "state" / secondary}"\n'
        f'deadline_s = 20\n{data(secondary)}'
        f'[peers.coordinator]\naddress = "127.0.0.1:{ports["coordinator"]}"\n'
        f'role = "coordinator"\n{security}allowed = ["{primary}"]\n{data_policy}'
        f'{secondary_privacy}')
    files[primary] = tmp / f"{primary}.toml"
    files[primary].write_text(
        f'version = 1\n[party]\nname = "{primary}"\nrole = "primary"\n'
        f'deadline_s = 10\n{data(primary)}'
        f'[peers.coordinator]\naddress = "127.0.0.1:{ports["coordinator"]}"\n'
        f'role = "coordinator"\n[peers.{secondary}]\n'
        f'address = "127.0.0.1:{ports[secondary]}"\nrole = "secondary"\n{security}'
        f'{data_policy}')
    return files


@contextmanager
def served_in_threads(*party_files: Path) -> Iterator[None]:
    """Serve the given parties from threads of this process (same code as `vflink serve`)."""
    stops, threads = [], []
    for path in party_files:
        config = load_party_config(path)
        ready, stop = threading.Event(), threading.Event()
        t = threading.Thread(target=serve, args=(config,), kwargs={"ready": ready, "stop": stop},
                             daemon=True)
        t.start()
        if not ready.wait(30):
            raise RuntimeError(f"{path} did not start")
        stops.append(stop)
        threads.append(t)
    try:
        yield
    finally:
        for stop in stops:
            stop.set()
        for t in threads:
            t.join(10)


def start_process(party_file: Path, log: Path) -> subprocess.Popen[bytes]:
    """`vflink serve --config party_file` as a real process; waits until it listens."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as handle:  # the child keeps its own descriptor
        proc = subprocess.Popen([sys.executable, "-m", "vflink.cli.main", "serve", "--config",
                                 str(party_file)], stdout=handle, stderr=subprocess.STDOUT,
                                env=env)
    config = load_party_config(party_file)
    host, port = (config.listen or "").rsplit(":", 1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{party_file} exited: {log.read_text()}")
        with socket.socket() as s:
            if s.connect_ex((host, int(port))) == 0:
                return proc
        time.sleep(0.2)
    stop_processes([proc], timeout=0)
    raise RuntimeError(f"{party_file} did not start listening: {log.read_text()}")


def stop_processes(procs: Iterable[subprocess.Popen[Any]], timeout: float = 10) -> None:
    """Terminate processes, kill those still running after ``timeout`` s, and wait for every
    one of them: a process object dropped while its process runs warns (ResourceWarning)
    when it is collected, which may be in a later test, on a busy machine (a served party
    takes a while to stop gracefully there)."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def secret_env(value: str) -> Iterator[None]:
    """``$VFLINK_SECRET`` set to ``value`` inside the block (for module-scoped fixtures, where
    pytest's monkeypatch is not available), restored after."""
    old = os.environ.get("VFLINK_SECRET")
    os.environ["VFLINK_SECRET"] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("VFLINK_SECRET", None)
        else:
            os.environ["VFLINK_SECRET"] = old


@contextmanager
def bank_federation(tmp: Path, *, seed: int, tables: dict[str, dict[str, object]],
                    run_id: str) -> Iterator[object]:
    """A coordinator and the secondary "bank" served from threads, and the primary's
    federation to them. The data parties keep their private defaults; the coordinator accepts
    any noise (a test's small σ is far from its default τ bound on close-together records)."""
    from vflink.runner.network import network_federation

    files = write_party_files(tmp, seed=seed, secondary="bank", tables=tables)
    with files["coordinator"].open("a") as fh:
        fh.write("[policy]\nmax_tau = 1.0\n")
    with served_in_threads(files["coordinator"], files["bank"]):
        federation = network_federation(load_party_config(files["primary"]), run_id=run_id)
        try:
            yield federation
        finally:
            federation.close()
