"""PSI at OT-extension speed through an existing engine: RR22 and KKRT16 from SecretFlow's
``spu`` (which bundles libpsi), an optional extra (``pip install 'vflink[rr22]'``).

Nobody should write that cryptography by hand, and ``spu`` 0.9.5 carries it; what vflink owns
is everything around it, here, with no party or protocol code (the session layer that agrees on
a run, its sizes, its ports and its TLS lives in :mod:`vflink.parties.setengine`):

* **Inputs.** Each party feeds the engine one CSV in its spool: ``key`` is a keyed hash of the
  record's canonical key (:func:`keyed_uids`, BLAKE2b under a fresh 32-byte key the two parties
  agree on in their authenticated session), ``row`` the record's row. Equal keys give equal
  hashes on both sides, so the engine's intersection is the DH PSI's (up to a 2^-128 collision
  per pair); nothing on disk is an unkeyed hash of an identifier, and the hash doubles as the
  UID that pairs the two outputs (:func:`vflink.parties.setalign.pair_by_uid`).
* **A child process.** The engine runs in a child process (:data:`CHILD`, run as a script, so
  the child imports neither vflink nor torch), with its working directory and ``TMPDIR``
  inside the party's spool: the engine's temporary folders and its ``sort`` files land there,
  and a kill of the child (or of the party: the child dies with its parent, ``PR_SET_PDEATHSIG``)
  leaves nothing outside the spool, whose owner file lets the next start sweep it
  (:func:`vflink.alignment._spool.sweep_stale`). The one file libpsi writes elsewhere, its
  ``/tmp/psi_<random>.trace`` after a successful run, is named in the child's log and removed
  by the child, by the parent after it, and by the sweeper of a stale spool.
* **Its link.** The engine opens its own brpc link, on which both parties listen and dial; the
  child is given the two addresses the parties agreed on, mutual TLS from the party's own
  certificates (``vflink certs``) or none when both said so, a short connect budget (libpsi
  retries a TLS/plain mismatch until its budget runs out instead of failing, so the parties
  agree on TLS in their session before any link starts) and receive and send timeouts from
  the party's deadline (libpsi's default is 30 s).
* **Outputs.** With ``disable_alignment`` the engine writes the intersection in input order:
  rows ascending, each with its UID, read back in batches (:func:`read_output`).

Security: libpsi exposes only semi-honest security to Python. A deviating party can learn more
than the intersection (and the receiver can lie about it); against a deviating primary, use the
DH PSI (``protocol = "dh"``), whose answers carry proofs. Each party learns the other's set size
and, as ``reveal`` says, the intersection; the link's ports are each party's own.
"""

from __future__ import annotations

import binascii
import datetime as dt
import functools
import hashlib
import importlib.util
import json
import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from vflink.alignment._spool import ENGINE_LOG, remove_engine_traces
from vflink.alignment.groups import Elements
from vflink.alignment.protocols import (
    ENGINE_PROTOCOLS,
    ENGINE_REVEALS,
    INSTALL,
    PSI_PROTOCOLS,
    PYTHONS,
)
from vflink.errors import ConfigError, DataError, ProtocolError, VflinkError

__all__ = [
    "CHILD",
    "ENGINE_PROTOCOLS",
    "ENGINE_REVEALS",
    "INSTALL",
    "PSI_PROTOCOLS",
    "UID_BYTES",
    "EngineFailed",
    "EngineJob",
    "EngineOutcome",
    "EngineSettings",
    "EngineTls",
    "check_address",
    "check_endpoints",
    "check_protocol",
    "PYTHON_ENV",
    "engine_missing",
    "engine_python",
    "keyed_uids",
    "output_digest",
    "read_output",
    "require_engine",
    "write_input",
]

log = logging.getLogger(__name__)

EXTRA = "rr22"  # the optional extra
#: bytes of a UID (the keyed hash fed to the engine): collisions among 2·10^7 keys ~ 6e-25
UID_BYTES = 16
_PERSON = b"vflink-psi-uid"  # BLAKE2b personalisation: these hashes are for nothing else
#: the child's script (run by path: it imports neither vflink nor torch)
CHILD = Path(__file__).with_name("_engine_child.py")
#: the protocols' names as libpsi knows them
_LIBPSI = {"rr22": "PROTOCOL_RR22", "kkrt": "PROTOCOL_KKRT"}


class EngineFailed(VflinkError):
    """The engine did not finish: ``stage`` says where (``start``, ``link``, ``psi``,
    ``timeout``, ``killed``, ``output``), ``str()`` what happened, without a local path."""

    def __init__(self, stage: str, message: str) -> None:
        self.stage = stage
        super().__init__(message)


def check_protocol(name: str, *, what: str = "protocol") -> str:
    if name not in PSI_PROTOCOLS:
        raise ConfigError(f"`{what}` must be one of {', '.join(PSI_PROTOCOLS)}, got {name!r}")
    return name


#: an interpreter of its own for the engine's child (a Python 3.10/3.11 environment with the
#: extra installed), where this one cannot hold it (spu pins numpy < 2; vflink runs on numpy 2)
PYTHON_ENV = "VFLINK_PSI_PYTHON"
_PROBE = ("import importlib.util, sys; "
          "sys.exit(0 if importlib.util.find_spec('spu') is not None else 1)")


@functools.lru_cache(maxsize=8)
def _probe(python: str) -> str | None:
    """Why ``python`` cannot run the engine's child (None: it can import ``spu``)."""
    path = Path(python)
    if not path.is_file() or not os.access(path, os.X_OK):
        return f"${PYTHON_ENV} = {python!r} is not an executable file"
    try:
        done = subprocess.run([python, "-I", "-c", _PROBE], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"${PYTHON_ENV} = {python!r} does not run ({exc})"
    if done.returncode != 0:
        return (f"${PYTHON_ENV} = {python!r} has no SecretFlow spu: install it there with "
                f"`{python} -m pip install spu==0.9.5` (Python {PYTHONS} only)")
    return None


def _named_python() -> str | None:
    """``$VFLINK_PSI_PYTHON`` as an absolute path (a relative one is relative to where the
    command runs, not to the engine's folder), or None when unset."""
    value = os.environ.get(PYTHON_ENV)
    return os.path.abspath(os.path.expanduser(value)) if value else None


def engine_python() -> str:
    """The interpreter that runs the engine's child: ``$VFLINK_PSI_PYTHON`` when set, else
    this one (where the extra is installed beside vflink)."""
    return _named_python() or sys.executable


def engine_missing() -> str | None:
    """Why the engine cannot run here (None: it can): the child imports ``spu``, which the
    base install does not have, in this interpreter or in ``$VFLINK_PSI_PYTHON``'s. Nothing
    of ``spu`` is imported in this process."""
    other = _named_python()
    if other:
        return _probe(other)
    try:
        found = importlib.util.find_spec("spu") is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return None
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    return (f"SecretFlow's spu is not installed in this environment (Python {here}): "
            f"{INSTALL} (its wheels exist for Python {PYTHONS} only, and pin numpy < 2), or "
            f"point ${PYTHON_ENV} at the python of an environment that has it")


def require_engine(protocol: str) -> None:
    """Refuse an engine protocol where the extra is not installed, with the install command."""
    why = engine_missing()
    if why is not None:
        raise ConfigError(f"protocol {protocol!r} runs on the optional PSI engine: {why}; "
                          "or use protocol \"dh\" (vflink's own PSI)")


def check_endpoints(problems: list[str], listen: Any, advertise: Any, *,
                    listen_required: bool = True) -> None:
    """``psi.listen`` and ``psi.advertise`` as :func:`check_address` reads them, into
    ``problems``; a listen address on every interface needs ``advertise`` (what the peer
    dials)."""
    for name, value in (("listen", listen), ("advertise", advertise)):
        if value is None and (name == "advertise" or not listen_required):
            continue
        try:
            check_address(value, f"psi.{name}")
        except ConfigError as exc:
            problems.append(str(exc))
    if not problems and advertise is None and \
            check_address(listen, "psi.listen")[0] in ("0.0.0.0", "::"):
        problems.append(f"psi.listen = {listen!r} binds every interface: set "
                        "psi.advertise to the host:port the peer dials")


def check_address(value: Any, what: str) -> tuple[str, int]:
    """``host:port`` (port 0: a free port chosen per run) as (host, port)."""
    if not isinstance(value, str) or ":" not in value:
        raise ConfigError(f"{what} must be host:port, got {value!r}")
    host, _, port = value.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535 or len(value) > 300 \
            or any(c.isspace() or c in "/\\@" for c in host):
        raise ConfigError(f"{what} must be host:port with a port in [0, 65535], got {value!r}")
    return host, int(port)


@dataclass(frozen=True)
class EngineTls:
    """The party's own certificate, key and the federation's CA (``vflink certs``)."""

    cert: Path
    key: Path
    ca: Path

    def check(self) -> None:
        missing = [str(p) for p in (self.cert, self.key, self.ca) if not Path(p).is_file()]
        if missing:
            raise ConfigError(f"the PSI engine's mutual TLS needs {', '.join(missing)}: "
                              "certificates from `vflink certs`")


@dataclass(frozen=True)
class EngineSettings:
    """One party's engine link, from its own party file (``[psi]``), never from a peer.

    Attributes:
        listen: ``host:port`` the engine link binds (port 0: a free port per run, for
            parties on one host).
        advertise: the address the peer dials (default: ``listen``; required when
            ``listen`` binds every interface).
        tls: mutual TLS from the party's certificates; None: a plaintext link (both
            parties must say so).
        spool: where the engine's files go (a private folder per run, swept when stale).
        deadline_s: the party's deadline: the link's receive and send timeouts.
        connect_s: how long the link tries to reach the peer before it fails.
    """

    listen: str = "127.0.0.1:0"
    advertise: str | None = None
    tls: EngineTls | None = None
    spool: Path | None = None
    deadline_s: float = 60.0
    connect_s: float = 30.0

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_endpoints(problems, self.listen, self.advertise, listen_required=False)
        for name in ("deadline_s", "connect_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not value > 0:
                problems.append(f"`{name}` must be a number > 0, got {value!r}")
        if problems:
            raise ConfigError("; ".join(problems), problems)

    def bind(self) -> tuple[str, str]:
        """(the address to listen on, the one the peer dials) for one run: port 0 becomes a
        port free now (on loopback, for parties on one host)."""
        host, port = check_address(self.listen, "psi.listen")
        if port == 0:
            with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
                s.bind((host, 0))
                port = int(s.getsockname()[1])
            listen = f"{_bracket(host)}:{port}"
            return listen, listen if self.advertise is None else self.advertise
        return self.listen, self.advertise or self.listen


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


# --- keys in, rows out -------------------------------------------------------------------------


def keyed_uids(keys: Sequence[bytes], uid_key: bytes) -> Elements:
    """BLAKE2b-128 of each canonical key under ``uid_key`` (32 bytes): what each party feeds
    the engine and keeps as the record's UID."""
    if len(uid_key) != 32:
        raise ProtocolError("the engine's UID key must be 32 bytes")
    # one keyed state copied per key: the key block is compressed once, not once per key
    base = hashlib.blake2b(digest_size=UID_BYTES, key=uid_key, person=_PERSON)

    def one(k: bytes) -> bytes:
        h = base.copy()
        h.update(k)
        return h.digest()

    raw = b"".join(map(one, keys))
    return np.frombuffer(raw, dtype=np.uint8).reshape(len(keys), UID_BYTES)


#: a UID's text in the engine's files: ``u`` and 32 hex digits (never read as a number, which
#: an all-digit or ``1e5``-shaped hex string could be)
_UID_PREFIX = "u"
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def _lines(uids: Elements, start: int) -> bytes:
    """``u<hex UID>,<row>\n`` for rows ``start, start+1, ...``, built as one array (rows
    zero-padded to the batch's widest)."""
    n = len(uids)
    digits = len(str(max(start + n - 1, 0)))
    hex_end = 1 + 2 * UID_BYTES
    out = np.empty((n, hex_end + 1 + digits + 1), dtype=np.uint8)
    out[:, 0] = ord(_UID_PREFIX)
    out[:, 1:hex_end:2] = _HEX[uids >> 4]
    out[:, 2:hex_end:2] = _HEX[uids & 15]
    out[:, hex_end] = ord(",")
    rows = np.arange(start, start + n, dtype=np.int64)
    for d in range(digits - 1, -1, -1):
        out[:, hex_end + 1 + d] = 48 + rows % 10
        rows //= 10
    out[:, -1] = ord("\n")
    return out.tobytes()


def write_input(path: Path, batches: Iterable[Sequence[bytes]], uid_key: bytes,
                *, who: str = "table") -> int:
    """The engine's input CSV (``key``: the UID's text, ``row``: the record's row) from
    canonical key batches in row order; returns the number of rows. Keys must be unique (the
    engine is told they are): a repeated one is refused naming its row, as the DH PSI refuses
    it."""
    n = 0
    heads: list[npt.NDArray[np.uint64]] = []
    with open(path, "wb") as fh:
        fh.write(b"key,row\n")
        for batch in batches:
            uids = keyed_uids(batch, uid_key)
            heads.append(uids[:, :8].copy().view(">u8").ravel().astype(np.uint64))
            fh.write(_lines(uids, n))
            n += len(batch)
    _refuse_repeats(heads, path, who)
    return n


def _refuse_repeats(heads: list[npt.NDArray[np.uint64]], path: Path, who: str) -> None:
    """A repeated key among the UIDs just written (their first 8 bytes sorted, equal
    neighbours checked in full), refused naming the later row."""
    if not heads:
        return
    head = np.concatenate(heads)
    order = np.argsort(head, kind="stable")
    same = np.flatnonzero(head[order][1:] == head[order][:-1])
    if len(same) == 0:
        return
    import pyarrow as pa
    import pyarrow.csv as pacsv

    # rare: only when 64-bit prefixes collide
    table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(
        column_types={"key": pa.string(), "row": pa.int64()}))
    keys = table.column("key").to_pylist()
    later = [int(max(order[i], order[i + 1])) for i in same
             if keys[int(order[i])] == keys[int(order[i + 1])]]
    if later:
        raise DataError(f"{who}: duplicate key at row {min(later)}; set alignment needs "
                        "unique keys")


def read_output(path: Path, n_rows: int, *, batch_bytes: int = 1 << 24
                ) -> Iterator[tuple[npt.NDArray[np.int64], Elements]]:
    """(rows, UIDs) of the engine's output CSV, in batches: rows must be ascending, in
    ``[0, n_rows)`` and each UID the width of ours (the file is the engine's, so it is checked
    like a peer's answer)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    path = Path(path)
    if not path.is_file():
        raise EngineFailed("output", "the engine finished without writing its output")
    options = pacsv.ConvertOptions(column_types={"key": pa.string(), "row": pa.int64()},
                                   include_columns=["key", "row"])
    try:
        reader = pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=batch_bytes),
                                convert_options=options)
    except (pa.ArrowInvalid, OSError) as exc:
        raise EngineFailed("output", f"the engine's output is not the expected CSV ({exc})"
                           ) from None
    last = -1
    for batch in reader:
        rows = batch.column("row").to_numpy(zero_copy_only=False).astype(np.int64)
        keys = batch.column("key").to_pylist()
        width = 1 + 2 * UID_BYTES
        if any(not isinstance(k, str) or len(k) != width or k[0] != _UID_PREFIX
               for k in keys):
            raise EngineFailed("output", "the engine's output holds a key that is not a UID")
        try:
            raw = binascii.unhexlify("".join(k[1:] for k in keys))
        except (TypeError, binascii.Error):
            raise EngineFailed("output", "the engine's output holds a key that is not a UID"
                               ) from None
        if len(rows) and (rows[0] <= last or (len(rows) > 1 and np.any(np.diff(rows) <= 0))
                          or rows[-1] >= n_rows):
            raise EngineFailed("output", "the engine's output rows are not ascending rows of "
                                         "the input")
        if len(rows):
            last = int(rows[-1])
        yield rows, np.frombuffer(raw, dtype=np.uint8).reshape(len(rows), UID_BYTES).copy()


def output_digest(uids: Elements, session: str) -> bytes:
    """SHA-256 over the session name and the UIDs in byte order: two parties that learnt the
    same intersection hold the same digest (a check that the engine's outputs agree; both
    already know the intersection, so it tells neither anything new)."""
    from vflink.alignment._dh import sorted_unique

    h = hashlib.sha256(b"vflink-engine-output\0" + session.encode() + b"\0")
    h.update(np.ascontiguousarray(sorted_unique(uids)).tobytes())
    return h.digest()


# --- the child process -------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineOutcome:
    """A finished run: the engine's counts and where the time went (seconds)."""

    intersection: int
    original: int
    seconds: dict[str, float] = field(default_factory=dict)


#: libpsi's phases as it logs them (``[<Class>::<Phase>] start|end``)
_PHASE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\] \[\w+\] \[[^\]]*\] "
                    r"\[\w+::(Init|PreProcess|Online|PostProcess|Finalize)\] (start|end)\s*$")


def phase_seconds(log_text: str) -> dict[str, float]:
    """Seconds of each libpsi phase, from its log: ``Init`` (reading and checking the CSV),
    ``PreProcess`` (hash buckets on disk), ``Online`` (the protocol), ``PostProcess`` and
    ``Finalize`` (the result: index sorting and the output CSV)."""
    spans: dict[str, list[float]] = {}
    for line in log_text.splitlines():
        m = _PHASE.match(line)
        if m is None:
            continue
        try:
            t = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
        except ValueError:
            continue
        span = spans.setdefault(m.group(2), [t, t])
        span[0], span[1] = min(span[0], t), max(span[1], t)
    return {name.lower(): round(b - a, 3) for name, (a, b) in spans.items()}


class EngineJob:
    """One party's engine run in a child process, inside ``work`` (a folder of its spool).

    ``start()`` launches it (its own process group, working directory ``work``, ``TMPDIR``
    ``work/tmp``, its output to ``work/engine.log``); ``poll()`` says whether it runs;
    ``outcome()`` is its result once it exited (or raises :class:`EngineFailed`); ``close()``
    kills it if it still runs and removes the trace file libpsi wrote to ``/tmp``.
    """

    def __init__(self, work: Path, *, protocol: str, rank: int, receiver: int, broadcast: bool,
                 parties: Sequence[tuple[str, str]], tls: EngineTls | None,
                 deadline_s: float, connect_s: float, link_id: str | None = None) -> None:
        if protocol not in _LIBPSI:
            raise ConfigError(f"the engine runs {', '.join(_LIBPSI)}, not {protocol!r}")
        self.work = Path(work)
        self.input = self.work / "input.csv"
        self.output = self.work / "output.csv"
        self.log = self.work / ENGINE_LOG
        self.result = self.work / "result.json"
        interval_ms = 250
        self.spec = {
            "protocol": _LIBPSI[protocol], "rank": int(rank), "receiver": int(receiver),
            "broadcast": bool(broadcast), "link_id": link_id or secrets.token_hex(8),
            "parties": [list(p) for p in parties],
            "tls": None if tls is None else {"cert": str(tls.cert), "key": str(tls.key),
                                             "ca": str(tls.ca)},
            "connect_retry_times": max(1, int(connect_s * 1000 / interval_ms)),
            "connect_retry_interval_ms": interval_ms,
            "recv_timeout_ms": int(deadline_s * 1000), "http_timeout_ms": int(deadline_s * 1000),
            "input": str(self.input), "output": str(self.output), "result": str(self.result),
            "log": str(self.log), "parent": os.getpid()}
        self.deadline_s, self.connect_s = float(deadline_s), float(connect_s)
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.ended: float | None = None

    def start(self) -> None:
        tmp = self.work / "tmp"
        tmp.mkdir(mode=0o700, exist_ok=True)
        job = self.work / "job.json"
        job.write_text(json.dumps(self.spec), encoding="utf-8")
        env = dict(os.environ, TMPDIR=str(tmp), TMP=str(tmp), TEMP=str(tmp))
        self.started = time.monotonic()
        with open(self.log, "ab") as out:
            try:
                # -I: the script's folder (vflink/alignment, with a psi.py) never shadows an
                # import, no user site, no PYTHON* variables (the child may be another
                # environment's interpreter: $VFLINK_PSI_PYTHON); its own session: a kill
                # takes its `sort`s along
                self.proc = subprocess.Popen(
                    [engine_python(), "-I", str(CHILD), str(job)], cwd=self.work, env=env,
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True)
            except OSError as exc:
                raise EngineFailed("start", f"the engine could not start ({exc.strerror})"
                                   ) from None

    def poll(self) -> str:
        """``"running"``, ``"done"`` (exited, successfully) or ``"failed"``."""
        if self.proc is None:
            return "failed"
        code = self.proc.poll()
        if code is None:
            return "running"
        if self.ended is None:
            self.ended = time.monotonic()
        return "done" if code == 0 and self.result.is_file() else "failed"

    def wait(self, timeout: float | None = None) -> str:
        if self.proc is not None:
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        return self.poll()

    def _result(self) -> dict[str, Any]:
        try:
            doc = json.loads(self.result.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def log_text(self, limit: int = 4 << 20) -> str:
        try:
            with open(self.log, "rb") as fh:
                return fh.read(limit).decode("utf-8", "replace")
        except OSError:
            return ""

    def outcome(self) -> EngineOutcome:
        """The finished run's counts and timings; :class:`EngineFailed` if it failed."""
        state = self.poll()
        if state == "running":
            raise EngineFailed("psi", "the engine is still running")
        doc = self._result()
        if state != "done" or not doc.get("ok"):
            stage = str(doc.get("stage") or ("killed" if self.proc is not None and
                                              (self.proc.returncode or 0) < 0 else "psi"))
            raise EngineFailed(stage, self.failure(doc, stage))
        seconds = {k: round(float(v), 3) for k, v in dict(doc.get("seconds") or {}).items()
                   if isinstance(v, (int, float))}
        seconds.update({f"engine_{k}": v for k, v in phase_seconds(self.log_text()).items()})
        try:
            return EngineOutcome(intersection=int(doc["intersection_count"]),
                                 original=int(doc["original_count"]), seconds=seconds)
        except (KeyError, TypeError, ValueError):
            raise EngineFailed("output", "the engine's report is incomplete") from None

    def failure(self, doc: dict[str, Any], stage: str) -> str:
        """What went wrong, in words (no local path): the child's own classification."""
        if stage == "link":
            return (f"the engine link did not connect to the peer within {self.connect_s:g} s "
                    "(is the peer's engine listening at the address it advertised, and do both "
                    "parties use the same TLS settings?)")
        if stage == "killed":
            return "the engine was stopped"
        if stage == "timeout":
            return f"the engine waited more than {self.deadline_s:g} s for the peer"
        text = str(doc.get("error") or "").strip().splitlines()
        if not text:  # it died without a word of its own: the last line it wrote
            text = [line for line in self.log_text().splitlines() if line.strip()][-1:]
            code = self.proc.returncode if self.proc is not None else None
            text = [f"exit status {code}" + (f", last output: {text[0]}" if text else "")]
        return f"the engine failed ({stage}): {_no_paths(text[0][:300])}"

    def kill(self) -> None:
        """Stop the child and everything it started (its process group)."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not wait
            log.warning("the PSI engine (pid %d) did not stop", proc.pid)

    def close(self) -> None:
        """Kill it if it runs; remove what libpsi wrote outside the spool."""
        self.kill()
        remove_engine_traces(self.work)


def _no_paths(text: str) -> str:
    return re.sub(r"(?:/[^\s,:;'\"]+)+", "<path>", text)
