"""PSI through an engine (RR22, KKRT16 from SecretFlow's ``spu``) between two parties, with
vflink's own session in charge of everything around the engine's cryptography.

The engine (:mod:`vflink.alignment.engine`) opens its own link between the parties. Before any
link exists, the primary and the secondary agree through their authenticated session
(:data:`vflink.protocol.sessions.ENGINE_PSI`) on the protocol (which the secondary's policy may
refuse: ``policy.psi_protocols``), the run (the session's name and a fresh key for the UIDs),
the set sizes (the secondary's limits and allowance, as for the DH PSI), the key columns, the
addresses (each party's own, from its own party file) and the TLS settings (a mismatch is
refused at once: the engine itself would retry it until its connect budget runs out). Then:

1. each party writes its keyed-hash CSV into its spool (the secondary in a thread of its own,
   while the primary writes its own);
2. the primary asks how the secondary is doing (:class:`EnginePsiStatus`, also the session's
   keepalive); once both inputs are written, the secondary starts its engine and then the
   primary its own: both links dial within a round trip of each other;
3. both engines run; the primary keeps asking, so a failure on either side stops the other
   at once (its engine killed) instead of at the engine's own timeouts;
4. the primary sends the result: with ``reveal = "both"`` its size and a digest of its
   intersection's UIDs, which the secondary checks against its own output before it accepts
   any row; the session is then finished and immutable, its rows written through the same
   writers as the DH PSI's (``alignments/<session>.parquet`` at a served secondary).

Security: semi-honest only (libpsi exposes nothing else to Python): a peer that deviates inside
the engine can learn more than the intersection, and the party that receives the result can
misreport it. Against a deviating primary, the DH PSI (``protocol = "dh"``) is the choice: its
answers carry proofs (:mod:`vflink.alignment.proofs`). What each side learns: the other's set
size, and the intersection (its rows and a shared UID per row) as ``reveal`` says.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from vflink.alignment._spool import Workdir, sweep_stale
from vflink.alignment.engine import (
    UID_BYTES,
    EngineFailed,
    EngineJob,
    EngineSettings,
    check_address,
    engine_missing,
    output_digest,
    read_output,
    require_engine,
    write_input,
)
from vflink.alignment.groups import Elements
from vflink.alignment.protocols import ENGINE_PROTOCOLS, ENGINE_REVEALS
from vflink.errors import (
    ConfigError,
    PolicyViolation,
    ProtocolError,
    VflinkError,
)
from vflink.parties.policy import PartyPolicy
from vflink.parties.setquota import Grant
from vflink.protocol.boundary import refuse
from vflink.protocol.messages import (
    Ack,
    EnginePsiOpen,
    EnginePsiReady,
    EnginePsiResult,
    EnginePsiStatus,
)

if TYPE_CHECKING:
    from vflink.data.table import PartyTable
    from vflink.parties.setalign import KeyBatches, SetAlignment, SetAlignmentDriver
    from vflink.parties.setquota import SetAllowance, SpoolQuota
    from vflink.protocol.sessions import Session

__all__ = ["ENGINE_STATES", "EnginePsiPeer", "EngineRun", "drive_engine_psi", "engine_spool_bytes"]

log = logging.getLogger(__name__)

#: what a primary may say of its side (EnginePsiStatus.state)
ENGINE_STATES = ("preparing", "ready", "running", "done", "failed")
#: the secondary's side, as EnginePsiStatus's reply says it
_PREPARING, _RUNNING, _DONE = 0.0, 1.0, 2.0
#: seconds between the primary's status requests while the engines start, and while they run
_POLL_START_S, _POLL_RUN_S = 0.1, 0.5
#: the least time allowed to write one key's line of the input CSV, and to read one back (a
#: generous bound, for waits on the peer's side)
_PER_KEY_S = 20e-6


def engine_spool_bytes(n_a: int, n_p: int) -> int:
    """An upper bound on the disk a party's engine run spools: its input CSV (a 32-digit hex
    UID and a row per record, with libpsi's meta file), libpsi's hash buckets of both sets and
    its result files (measured: about 120 bytes a record at 10^6 records a side)."""
    return int((n_p * 200 + n_a * 40) * 1.25) + (8 << 20)


def _link_timeout(settings: EngineSettings, n: int) -> float:
    """The engine link's receive timeout: the party's deadline, plus the time a party may
    spend between two messages on its own work over ``n`` records in all (libpsi reads its
    input and fills its hash buckets before the protocol, at its own pace on each side, while
    the other waits on the link; its default of 30 s fails a large set on a busy host)."""
    return settings.deadline_s + n * _PER_KEY_S


def _receiver(reveal: str) -> tuple[int, bool]:
    """(the engine's receiving rank, whether it tells the other): the primary is rank 0."""
    return (1, False) if reveal == "secondary" else (0, reveal == "both")


def _link_id(session: str, uid_key: bytes) -> str:
    """The engine link's id: the same on both sides, fresh per session, unknown to others."""
    return hashlib.sha256(b"vflink-engine-link\0" + session.encode() + uid_key).hexdigest()[:24]


def _read(path: Path, n_rows: int) -> tuple[npt.NDArray[np.int64], Elements]:
    parts = list(read_output(path, n_rows))
    if not parts:
        return np.empty(0, dtype=np.int64), np.empty((0, UID_BYTES), dtype=np.uint8)
    return (np.concatenate([r for r, _ in parts]).astype(np.int64),
            np.ascontiguousarray(np.concatenate([u for _, u in parts])))


# --- the primary's side ------------------------------------------------------------------------


def drive_engine_psi(driver: SetAlignmentDriver, peer: str, session: str, *, protocol: str,
                     reveal: str, settings: EngineSettings, key_columns: int) -> SetAlignment:
    """Run PSI ``session`` with ``peer`` on the engine's ``protocol``; this party's output.

    ``settings``: this party's own engine link (its party file's ``[psi]``, or loopback for
    parties in one process); ``key_columns``: how many key columns its keys join (the
    secondary refuses another number)."""
    from vflink.parties.setalign import SetAlignment, write_alignment_rows

    if protocol not in ENGINE_PROTOCOLS:
        raise ConfigError(f"the PSI engine runs {', '.join(ENGINE_PROTOCOLS)}, not {protocol!r}")
    if reveal not in ENGINE_REVEALS:
        raise ConfigError(f"`reveal` = {reveal!r} is not offered by the {protocol} engine (it "
                          f"offers {', '.join(ENGINE_REVEALS)}); the DH PSI (protocol \"dh\") "
                          "also reveals only the intersection's size (cardinality)")
    require_engine(protocol)
    if settings.tls is not None:
        settings.tls.check()
    n_a = driver._own_size()
    timings: dict[str, float] = {}
    started = time.perf_counter()
    sweep_stale(settings.spool)
    work = Workdir(settings.spool)
    job: EngineJob | None = None
    step = driver._step
    try:
        uid_key = secrets.token_bytes(32)
        listen, advertise = settings.bind()
        step("engine: open", 1, 4)
        opened = driver._request(peer, EnginePsiOpen(
            session=session, protocol=protocol, reveal=reveal, n_a=n_a,
            key_columns=int(key_columns), tls=settings.tls is not None, address=advertise,
            uid_key=uid_key), EnginePsiReady)
        n_p = _opened(opened, peer, session)
        receiver, broadcast = _receiver(reveal)
        job = EngineJob(work.path, protocol=protocol, rank=0, receiver=receiver,
                        broadcast=broadcast, parties=[("primary", listen),
                                                      ("secondary", opened.address)],
                        tls=settings.tls, deadline_s=_link_timeout(settings, n_a + n_p),
                        connect_s=settings.connect_s, link_id=_link_id(session, uid_key))
        t = time.perf_counter()
        write_input(job.input, driver.keys.batches(driver.chunk_rows), uid_key)
        timings["input_csv"] = time.perf_counter() - t
        step("engine: start", 2, 4)
        _start_both(driver, peer, session, job, n_p, settings)
        step(f"engine: {protocol}", 3, 4)
        t = time.perf_counter()
        _run_both(driver, peer, session, job, n_a + n_p, settings)
        timings["engines"] = time.perf_counter() - t
        outcome = job.outcome()
        timings.update(outcome.seconds)
        learns = reveal in ("both", "primary")
        t = time.perf_counter()
        rows, uids = _read(job.output, n_a) if learns else (
            np.empty(0, dtype=np.int64), np.empty((0, UID_BYTES), dtype=np.uint8))
        if learns and len(rows) != outcome.intersection:
            raise EngineFailed("output", f"the engine reported {outcome.intersection} common "
                                         f"records and wrote {len(rows)}")
        both = reveal == "both"
        driver._request(peer, EnginePsiResult(
            session=session, size=len(rows) if both else -1,
            digest=output_digest(uids, session) if both else b""), Ack)
        if driver.out is not None:  # a party that learns nothing writes the empty table
            write_alignment_rows(driver.out, [(rows, uids)] if learns else ())
        timings["output"] = time.perf_counter() - t
    except EngineFailed as exc:
        if job is not None:
            job.kill()
            _tell_failed(driver, peer, session)
        raise ProtocolError(f"PSI with {peer!r} on {protocol}: {exc}") from None
    except BaseException:
        if job is not None and job.poll() == "running":
            job.kill()
            _tell_failed(driver, peer, session)
        raise
    finally:
        if job is not None:
            job.close()
        work.close()
    step("done", 4, 4)
    timings["total"] = time.perf_counter() - started
    size = len(rows) if learns else -1
    sizes = {"primary": n_a, "secondary": n_p}
    if learns:
        sizes["intersection"] = size
    out_path = driver.out
    return SetAlignment(
        method="psi", group=protocol, rows=rows if out_path is None else np.empty(0, np.int64),
        uids=uids if out_path is None else np.empty((0, UID_BYTES), np.uint8), size=size,
        known=learns, sizes=sizes, session=session, path=out_path,
        limits={k: float(opened.info[k]) for k in ("guess_limit", "guess_window_s", "idle_s")
                if k in opened.info},
        timings={k: round(v, 3) for k, v in timings.items()},
        engine={"protocol": protocol, "security": "semi-honest", "reveal": reveal,
                "tls": settings.tls is not None, "listen": listen, "peer_address":
                opened.address})


def _opened(reply: EnginePsiReady, peer: str, session: str) -> int:
    if reply.session != session:
        raise ProtocolError(f"{peer!r} answered for session {reply.session!r}, not {session!r}")
    try:
        host, port = check_address(reply.address, f"{peer!r}'s engine address")
    except ConfigError as exc:
        raise ProtocolError(str(exc)) from None
    if port == 0:
        raise ProtocolError(f"{peer!r} did not say on which port its engine listens")
    n_p = reply.info.get("n_p")
    if n_p is None or n_p != int(n_p) or n_p < 1:
        raise ProtocolError(f"{peer!r} did not state its set size (n_p)")
    return int(n_p)


def _status(driver: SetAlignmentDriver, peer: str, session: str, state: str) -> float:
    reply = driver._request(peer, EnginePsiStatus(session=session, state=state), Ack)
    value = reply.info.get("state")
    if value not in (_PREPARING, _RUNNING, _DONE):
        raise ProtocolError(f"{peer!r} answered an engine status of {value!r}")
    return float(value)


def _tell_failed(driver: SetAlignmentDriver, peer: str, session: str) -> None:
    """Tell the peer our engine failed, so it stops its own (its answer is the end of the
    session, an error: ignored)."""
    try:
        driver._request(peer, EnginePsiStatus(session=session, state="failed"), Ack)
    except VflinkError:
        pass


def _start_both(driver: SetAlignmentDriver, peer: str, session: str, job: EngineJob,
                n_p: int, settings: EngineSettings) -> None:
    """Wait until the secondary has written its input and started its engine (it does when
    told we are ready), then start ours."""
    limit = time.monotonic() + settings.deadline_s + n_p * _PER_KEY_S
    while _status(driver, peer, session, "ready") < _RUNNING:
        if time.monotonic() > limit:
            raise EngineFailed("start", f"{peer!r} did not prepare its input within "
                                        f"{settings.deadline_s + n_p * _PER_KEY_S:.0f} s")
        time.sleep(_POLL_START_S)
    job.start()


def _run_both(driver: SetAlignmentDriver, peer: str, session: str, job: EngineJob, n: int,
              settings: EngineSettings) -> None:
    """Both engines to their end, asking the peer how it goes (a failure on its side is an
    error here at once, ours is told to it); after ours, the peer's is waited for at most our
    deadline plus the time to read its output."""
    mine_done_at: float | None = None
    theirs = _RUNNING
    while True:
        if mine_done_at is None:
            state = job.wait(_POLL_RUN_S)  # returns as soon as ours exits
        else:  # ours is done: the peer's output is being read, ask again soon
            time.sleep(_POLL_START_S)
            state = "done"
        if state == "failed":
            job.outcome()  # raises EngineFailed with the reason
        if state == "done" and mine_done_at is None:
            mine_done_at = time.monotonic()
        theirs = _status(driver, peer, session, state)
        if state == "done" and theirs == _DONE:
            return
        if mine_done_at is not None and \
                time.monotonic() - mine_done_at > settings.deadline_s + n * _PER_KEY_S:
            raise EngineFailed("timeout", f"{peer!r}'s engine did not finish within "
                                          f"{settings.deadline_s:g} s of ours")


# --- the secondary's side ----------------------------------------------------------------------


@dataclass
class EngineRun:
    """The secondary's state of one engine session (``session.data["set"]``): its spool
    folder, its engine, and what the engine gave once it finished."""

    work: Workdir | None
    job: EngineJob | None
    n_own: int
    reveal: str
    protocol: str
    #: preparing (writing the input), ready (written: waiting for the primary), running, done
    #: (the output read), failed (``error`` says why)
    state: str = "preparing"
    error: str = ""
    rows: npt.NDArray[np.int64] | None = None
    uids: Elements | None = None
    result: SetAlignment | None = None
    release: Callable[[], None] | None = None
    grant: Grant | None = None
    our_fault: bool = False
    go: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    thread: threading.Thread | None = None
    timings: dict[str, float] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    #: when the primary was last heard of (monotonic): a primary that goes silent for the
    #: party's deadline while the engines run is gone, and our engine is stopped
    heard: float = field(default_factory=time.monotonic)

    @property
    def failed(self) -> bool:
        return self.result is None and (self.state == "failed" or self.work is None
                                         or self.work.closed)

    def fail(self, why: str, *, ours: bool) -> None:
        with self.lock:
            if self.state in ("failed", "done") and self.result is not None:
                return
            self.state, self.error = "failed", why
            self.our_fault = self.our_fault or ours
        self.close()

    def end(self, why: str) -> None:
        """The session ended (``why``: the session table's reason): the allowance goes back
        if nothing was revealed and the peer is not to blame (an expiry, our own failure)."""
        if self.grant is not None and self.result is None and (why == "expired"
                                                               or self.our_fault):
            self.grant.give_back("expired" if why == "expired" else "this party's failure")
        self.close()

    def close(self) -> None:
        """Stop the engine, remove the spool folder, free the disk reservation."""
        self.stop.set()
        self.go.set()
        if self.job is not None:
            self.job.close()
        if self.work is not None:
            self.work.close()
        if self.release is not None:
            self.release()
            self.release = None


class EnginePsiPeer:
    """The secondary's handlers of :data:`~vflink.protocol.sessions.ENGINE_PSI` (a mixin of
    :class:`~vflink.parties.SecondaryParty`, beside :class:`~vflink.parties.setalign.
    SetAlignmentPeer`, whose results, spool and allowance it shares).

    ``psi_engine``: this party's engine link (its party file's ``[psi]``; loopback for parties
    in one process); None: the party runs no engine PSI (refused, naming what to configure).
    """

    psi_engine: EngineSettings | None = None
    name: str
    table: PartyTable
    policy: PartyPolicy
    out_dir: Path | None
    set_keys: KeyBatches | None
    set_chunk_rows: int | None
    if TYPE_CHECKING:
        @property
        def session(self) -> Session: ...
        def _set_resources(self) -> tuple[SetAllowance, SpoolQuota]: ...
        def _refuse_finished_name(self, session: str) -> None: ...
        def _finish(self, session: str, result: SetAlignment) -> None: ...
        def _streamed_to(self, session: str) -> Path | None: ...
        def _own_key_batches(self) -> KeyBatches: ...

    def _engine_state(self) -> EngineRun:
        state = self.session.data.get("set")
        if not isinstance(state, EngineRun):  # pragma: no cover - the declaration orders it
            raise ProtocolError(f"party {self.name!r}: session {self.session.name!r} is no "
                                "engine PSI")
        if state.state == "failed" and state.result is None:
            raise refuse(ProtocolError, f"party {self.name!r}: its {state.protocol} engine "
                                        f"failed: {state.error}", code="engine.failed")
        return state

    def _engine_spool(self) -> Path | None:
        out_dir = getattr(self, "out_dir", None)
        if out_dir is not None:
            from vflink.parties.setalign import SPOOL_DIR

            return Path(out_dir) / SPOOL_DIR
        return None if self.psi_engine is None else self.psi_engine.spool

    def on_engine_psi_open(self, sender: str, message: EnginePsiOpen) -> EnginePsiReady:
        name = self.session.name
        self._refuse_finished_name(name)
        protocol = message.protocol
        if protocol not in ENGINE_PROTOCOLS:
            raise refuse(ProtocolError, f"party {self.name!r}: the PSI engine runs "
                                        f"{', '.join(ENGINE_PROTOCOLS)}, not {protocol!r}",
                         code="engine.protocol")
        self.policy.check_psi_protocol(self.name, protocol)
        if message.reveal not in ENGINE_REVEALS:
            raise refuse(ProtocolError, f"party {self.name!r}: reveal must be one of "
                                        f"{', '.join(ENGINE_REVEALS)} with the engine, got "
                                        f"{message.reveal!r}", code="engine.reveal")
        settings = self.psi_engine
        if settings is None:
            raise refuse(PolicyViolation, f"party {self.name!r} has no PSI engine link "
                                          "configured (a [psi] section with `listen` in its "
                                          "party file)", code="engine.unconfigured")
        if engine_missing() is not None:
            raise refuse(PolicyViolation, f"party {self.name!r} cannot run {protocol!r}: the "
                                          "optional PSI engine is not installed there "
                                          "(pip install 'vflink[rr22]')",
                         code="engine.unavailable", detail=engine_missing())
        ours = settings.tls is not None
        if bool(message.tls) != ours:
            said = "with mutual TLS" if message.tls else "in plaintext"
            mine = ("with mutual TLS (its certificates from `vflink certs`)" if ours else
                    "in plaintext (its [psi] tls = false, or security.insecure = true)")
            raise refuse(PolicyViolation, f"party {self.name!r} runs its PSI engine link "
                                          f"{mine}, and the primary offered one {said}: both "
                                          "parties must run it with TLS, or both without "
                                          "([psi] tls in each party file); no link was opened",
                         code="engine.tls")
        own_keys = len(self.table.schema.key)
        if message.key_columns != own_keys:
            raise refuse(ProtocolError, f"party {self.name!r} aligns on {own_keys} key "
                                        f"column(s) and the primary on {message.key_columns}: "
                                        "each key column needs its counterpart",
                         code="engine.keys")
        try:
            _, port = check_address(message.address, "the primary's engine address")
        except ConfigError as exc:
            raise refuse(ProtocolError, f"party {self.name!r}: {exc}",
                         code="engine.address") from None
        if port == 0:
            raise refuse(ProtocolError, f"party {self.name!r}: the primary's engine address "
                                        "needs a port", code="engine.address")
        if not isinstance(message.uid_key, bytes) or len(message.uid_key) != 32:
            raise refuse(ProtocolError, f"party {self.name!r}: the engine's UID key must be 32 "
                                        "bytes", code="engine.key")
        self.policy.check_peer_set_size(self.name, "EnginePsiOpen: n_a", message.n_a)
        keys = self._own_key_batches()
        n_own = len(keys)
        allowance, quota = self._set_resources()
        release = quota.reserve(self.name, sender, engine_spool_bytes(message.n_a, n_own),
                                self.policy.max_spool_bytes)
        grant = None
        try:
            grant = allowance.admit(self.name, sender, self.policy, "EnginePsiOpen",
                                    session=name, elements=message.n_a)
            work = Workdir(self._engine_spool())
            listen, advertise = settings.bind()
            receiver, broadcast = _receiver(message.reveal)
            job = EngineJob(work.path, protocol=protocol, rank=1, receiver=receiver,
                            broadcast=broadcast, parties=[("primary", message.address),
                                                          ("secondary", listen)],
                            tls=settings.tls,
                            deadline_s=_link_timeout(settings, message.n_a + n_own),
                            connect_s=settings.connect_s,
                            link_id=_link_id(name, message.uid_key))
        except BaseException as exc:
            release()
            if grant is not None and not isinstance(exc, VflinkError):
                grant.give_back("this party's failure")
            raise
        run = EngineRun(work=work, job=job, n_own=n_own, reveal=message.reveal,
                        protocol=protocol, release=release, grant=grant,
                        engine={"protocol": protocol, "security": "semi-honest",
                                "reveal": message.reveal, "tls": ours, "listen": listen,
                                "peer_address": message.address})
        self.session.data["set"] = run
        self.session.commit("n_p", n_own)
        run.thread = threading.Thread(
            target=self._engine_worker,
            args=(run, keys, message.uid_key, name, settings.deadline_s, message.n_a),
            name=f"vflink-engine-{name}", daemon=True)
        run.thread.start()
        log.info("%s: %s PSI session %r of %r: engine link on %s (peer %s, %s)", self.name,
                 protocol, name, sender, listen, message.address,
                 "mutual TLS" if ours else "plaintext")
        return EnginePsiReady(session=name, address=advertise, info={
            "n_p": float(n_own), "idle_s": float(self.policy.session_ttl_s),
            "guess_limit": float(self.policy.dictionary_limit),
            "guess_window_s": float(self.policy.set_session_window_s)})

    def _engine_worker(self, run: EngineRun, keys: KeyBatches, uid_key: bytes, session: str,
                       deadline_s: float, n_a: int) -> None:
        """Write our input, wait for the primary, run our engine, read its output. A primary
        that does not start within its deadline (plus the time to write its input), or goes
        silent for its deadline while the engines run, is gone: our engine is stopped and its
        files removed at once, not when the session expires."""
        job = run.job
        if job is None:  # pragma: no cover - set before the thread starts
            return
        try:
            t = time.perf_counter()
            chunk = max(1, int(self.set_chunk_rows or 100_000))
            write_input(job.input, keys.batches(chunk), uid_key)
            run.timings["input_csv"] = time.perf_counter() - t
            with run.lock:
                if run.state != "preparing":
                    return
                run.state = "ready"
            if not run.go.wait(deadline_s + n_a * _PER_KEY_S):
                raise EngineFailed("start", "the primary did not start its engine")
            if run.stop.is_set():
                return
            while job.wait(0.5) == "running":
                if run.stop.is_set():
                    return
                if time.monotonic() - run.heard > deadline_s:
                    job.kill()
                    raise EngineFailed("killed", f"the primary went silent for "
                                                 f"{deadline_s:g} s; the engine was stopped")
            outcome = job.outcome()
            run.timings.update(outcome.seconds)
            learns = run.reveal in ("both", "secondary")
            t = time.perf_counter()
            if learns:
                rows, uids = _read(job.output, run.n_own)
                if len(rows) != outcome.intersection:
                    raise EngineFailed("output", f"the engine reported "
                                                 f"{outcome.intersection} common records and "
                                                 f"wrote {len(rows)}")
                run.rows, run.uids = rows, uids
            run.timings["output"] = time.perf_counter() - t
            with run.lock:
                if run.state == "running":
                    run.state = "done"
        except EngineFailed as exc:
            log.warning("%s: engine PSI session %r failed: %s", self.name, session, exc)
            run.fail(str(exc), ours=exc.stage not in ("link", "timeout", "killed", "start"))
        except Exception as exc:  # our own fault (disk, table): the session ends
            log.exception("%s: engine PSI session %r failed", self.name, session)
            run.fail(f"an internal error ({type(exc).__name__})", ours=True)

    def on_engine_psi_status(self, sender: str, message: EnginePsiStatus) -> Ack:
        run = self._engine_state()
        run.heard = time.monotonic()
        if message.state not in ENGINE_STATES:
            raise refuse(ProtocolError, f"party {self.name!r}: an engine status must be one of "
                                        f"{', '.join(ENGINE_STATES)}, got {message.state!r}",
                         code="engine.status")
        if message.state == "failed":
            run.fail("the primary's engine failed", ours=False)
            raise refuse(ProtocolError, f"party {self.name!r}: the primary's engine failed; "
                                        f"session {self.session.name!r} ended",
                         code="engine.peer-failed")
        with run.lock:
            state = run.state
            if state == "ready" and message.state != "preparing":
                run.state = state = "running"
                start = True
            else:
                start = False
        if start and run.job is not None:
            try:
                run.job.start()
            except EngineFailed as exc:
                run.fail(str(exc), ours=True)
                raise refuse(ProtocolError, f"party {self.name!r}: its {run.protocol} engine "
                                            f"did not start", code="engine.failed") from None
            if run.grant is not None:
                run.grant.reveal()  # our set enters the engine: the allowance is used
            run.go.set()
        if state == "failed":
            self._engine_state()  # raises with the reason
        code = {"preparing": _PREPARING, "ready": _PREPARING, "running": _RUNNING,
                "done": _DONE}.get(state, _PREPARING)
        return Ack(info={"state": code})

    def on_engine_psi_result(self, sender: str, message: EnginePsiResult) -> Ack:
        from vflink.parties.setalign import SetAlignment, write_alignment_rows

        run = self._engine_state()
        name = self.session.name
        if run.state != "done":
            raise refuse(ProtocolError, f"party {self.name!r}: its engine has not finished "
                                        f"session {name!r}", code="engine.not-done")
        both = run.reveal == "both"
        learns = run.reveal in ("both", "secondary")
        rows = run.rows if run.rows is not None else np.empty(0, dtype=np.int64)
        uids = run.uids if run.uids is not None else np.empty((0, UID_BYTES), dtype=np.uint8)
        if both and (message.size != len(rows) or
                     message.digest != output_digest(uids, name)):
            run.fail("the two outputs disagree", ours=False)
            raise refuse(ProtocolError, f"party {self.name!r}: the primary's intersection "
                                        f"({message.size} records) is not the one this party's "
                                        "engine gave; no row is accepted",
                         code="engine.mismatch")
        out = self._streamed_to(name)
        sizes = {"secondary": run.n_own}
        if learns:
            sizes["intersection"] = len(rows)
        if out is not None and learns:
            write_alignment_rows(out, [(rows, uids)])
        result = SetAlignment(
            method="psi", group=run.protocol,
            rows=rows if out is None else np.empty(0, dtype=np.int64),
            uids=uids if out is None else np.empty((0, UID_BYTES), dtype=np.uint8),
            size=len(rows) if learns else -1, known=learns, sizes=sizes,
            path=out if learns else None,
            timings={k: round(v, 3) for k, v in run.timings.items()}, engine=run.engine)
        self._finish(name, result)
        return Ack(info={"size": float(len(rows)) if both else -1.0})

