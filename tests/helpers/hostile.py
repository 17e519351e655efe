"""A served secondary with two honest primaries and one hostile peer, each with its own issued
certificate, as real `vflink serve` processes on loopback; and the hostile peer's cases (the
attacks reported against served secondaries: abandoned sessions, trickling streams, maximal
chunks, guessed IDs in PSU, forged PSI rows, sizes out of policy, other peers' results)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pandas as pd
import torch

from tests.helpers.network import free_port, start_process, stop_processes
from vflink.alignment import proofs, psu
from vflink.alignment._dh import key_bytes, lookup, sorted_unique
from vflink.alignment.groups import get_group
from vflink.cli.main import main
from vflink.errors import VflinkError
from vflink.models.spec import BottomSpec
from vflink.parties.setalign import SetAlignment, SetAlignmentDriver
from vflink.protocol import (
    Ack,
    AlignmentReady,
    AlignmentView,
    Backward,
    Embeddings,
    FetchAlignment,
    FitPreprocessing,
    Forward,
    Hello,
    LoadState,
    Message,
    SaveState,
    SetupBottom,
    Snapshot,
)
from vflink.protocol.messages import (
    PsiChunk,
    PsiFetch,
    PsiRound1,
    PsuChunk,
    PsuFetch,
    PsuRound1,
    SetChunk,
)
from vflink.protocol.sessions import new_session_name
from vflink.transport.grpc import GrpcChannel, TlsConfig, load_tls
from vflink.transport.grpc._wire import EXCHANGE, pb

G = get_group("ristretto255", workers=1)
PEERS = ("primary", "primary2", "hostile")


def keys(ids: list[str]) -> list[bytes]:
    return key_bytes(pd.DataFrame({"id": ids}), ("id",), who="test")


@dataclass
class Tenancy:
    """The served secondary and what each peer needs to call it."""

    tmp: Path
    certs: Path
    party_file: Path
    state: Path
    address: str
    ids: list[str]
    policy: dict[str, Any]
    proc: subprocess.Popen[bytes] | None = None
    logs: list[Path] = field(default_factory=list)

    def channel(self, name: str, deadline_s: float = 60.0) -> GrpcChannel:
        return GrpcChannel(name, {"secondary": self.address},
                           TlsConfig.for_party(self.certs, name), deadline_s=deadline_s)

    def start(self) -> None:
        log = self.tmp / f"secondary-{len(self.logs)}.log"
        self.logs.append(log)
        self.proc = start_process(self.party_file, log)

    def stop(self) -> None:
        if self.proc is not None:
            stop_processes([self.proc])
            self.proc = None

    def kill(self) -> None:
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
            self.proc = None

    def log(self) -> str:
        return " ".join(" ".join(p.read_text().split()) for p in self.logs if p.exists())

    def rss(self) -> int:
        if self.proc is None:
            return 0
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        found = re.search(r"VmRSS:\s+(\d+) kB", status)
        return int(found.group(1)) * 1024 if found else 0

    def spool_bytes(self) -> int:
        """Bytes under the secondary's spool now (files come and go while we walk)."""
        total = 0
        for folder, _, files in os.walk(self.state / ".set-tmp"):
            for name in files:
                try:
                    total += os.lstat(os.path.join(folder, name)).st_size
                except OSError:  # removed while we walk
                    continue
        return total

    def alive(self, name: str = "primary2", within: float = 5.0) -> float:
        """Seconds a Hello from ``name`` took (asserting it was answered within ``within``)."""
        with self.channel(name, deadline_s=within) as ch:
            started = time.monotonic()
            assert isinstance(ch.call("secondary", Hello(party=name, role="primary")), Hello)
            return time.monotonic() - started


@contextmanager
def tenancy(tmp: Path, *, n: int = 400, policy: dict[str, Any] | None = None
            ) -> Iterator[Tenancy]:
    """The secondary served to ``primary``, ``primary2`` and ``hostile``."""
    certs = tmp / "certs"
    assert main(["certs", "--out", str(certs), "--parties",
                 ",".join((*PEERS, "secondary", "coordinator"))]) == 0
    ids = [f"CUSTZ{i:06d}" for i in range(n)]
    rng = np.random.default_rng(7)
    csv = tmp / "secondary.csv"
    pd.DataFrame({"id": ids, "x1": rng.normal(size=n), "x2": rng.normal(size=n)}).to_csv(
        csv, index=False)
    address = f"127.0.0.1:{free_port()}"
    state = tmp / "state"
    pol = {"max_set_elements": 20_000, "max_sessions": 4, "session_ttl_s": 4.0,
           "max_concurrent_calls": 6, "receive_timeout_s": 2.0, "max_message_work_s": 1.0,
           "max_finished_sessions": 4, "max_spool_bytes": 64 << 20, **(policy or {})}
    body = "\n".join(f"{k} = {v!r}" for k, v in pol.items())
    roles = ", ".join(f'{p} = "primary"' for p in PEERS)
    party = tmp / "secondary.toml"
    party.write_text(
        f'version = 1\n[party]\nname = "secondary"\nrole = "secondary"\n'
        f'listen = "{address}"\nstate_dir = "{state}"\ndeadline_s = 30\n'
        f'[party.table]\npath = "{csv}"\nkey = ["id"]\nnumeric = ["x1", "x2"]\n'
        f'[peers.coordinator]\naddress = "127.0.0.1:{free_port()}"\nrole = "coordinator"\n'
        f'[security]\ntls_dir = "{certs}"\nallowed = {list(PEERS)!r}\n'
        f'roles = {{ {roles} }}\n'.replace("'", '"')
        + f"[policy]\n{body}\n")
    old = os.environ.get("VFLINK_SECRET")
    os.environ["VFLINK_SECRET"] = "hostile-tenant-test-secret-0123456789"
    t = Tenancy(tmp, certs, party, state, address, ids, pol)
    try:
        t.start()
        yield t
    finally:
        t.stop()
        if old is None:
            os.environ.pop("VFLINK_SECRET", None)
        else:
            os.environ["VFLINK_SECRET"] = old


# --- honest primaries ------------------------------------------------------------------------


def honest_ids(t: Tenancy, who: str, n: int) -> list[str]:
    """A primary's set: half the secondary's first records, half its own."""
    return t.ids[: n // 2] + [f"{who}-only-{i}" for i in range(n - n // 2)]


def honest_run(t: Tenancy, who: str, n: int) -> dict[str, Any]:
    """One PSU and one PSI (both learn it) with the secondary, and the rows it serves back:
    what an honest primary's results are made of, and how long it took."""
    mine = honest_ids(t, who, n)
    started = time.monotonic()
    with t.channel(who) as ch:
        driver = SetAlignmentDriver(keys(mine), ch, G)
        union = driver.psu("secondary", new_session_name("psu"))
        session = new_session_name("psi")
        inter = driver.psi("secondary", session, reveal="both")
        view = ch.request("secondary", FetchAlignment(session=session), AlignmentView)
    return {"seconds": time.monotonic() - started, "union": union.sizes,
            "rows": sorted(int(r) for r in inter.rows),
            "theirs": sorted(int(r) for r in view.secondary_index)}


def expected_run(t: Tenancy, who: str, n: int) -> dict[str, Any]:
    """The plaintext oracle of :func:`honest_run`."""
    mine = honest_ids(t, who, n)
    held = set(t.ids)
    both = [i for i, k in enumerate(mine) if k in held]
    return {"union": {"primary": n, "secondary": len(t.ids),
                      "union": len(held | set(mine)), "intersection": len(both)},
            "rows": both, "theirs": sorted(t.ids.index(mine[i]) for i in both)}


# --- the hostile peer's cases ------------------------------------------------------------------


def refused(call: Callable[[], object]) -> VflinkError:
    try:
        call()
    except VflinkError as exc:
        return exc
    raise AssertionError("the hostile call was accepted")


def abandon_sessions(t: Tenancy, ch: GrpcChannel, count: int) -> int:
    """Open ``count`` PSU sessions and never finish them; how many were admitted."""
    opened = 0
    for _ in range(count):
        try:
            ch.call("secondary", PsuRound1(session=new_session_name("psu"), group=G.name,
                                           n_a=50, chunk_rows=50))
            opened += 1
        except VflinkError:
            pass
    return opened


def trickle(t: Tenancy, streams: int, hold_s: float) -> list[grpc.StatusCode | None]:
    """``streams`` Exchange calls that announce 2 MB and send 10 bytes; their end codes."""
    m = load_tls(TlsConfig.for_party(t.certs, "hostile"))
    creds = grpc.ssl_channel_credentials(m.ca_pem, m.key_pem, m.cert_pem)
    codes: list[grpc.StatusCode | None] = []
    stop = threading.Event()

    def one() -> None:
        def chunks() -> Iterator[bytes]:
            yield pb.Chunk(total_size=2 * 1024 * 1024, data=b"x" * 10).SerializeToString()
            stop.wait(hold_s)

        with grpc.secure_channel(t.address, creds, options=[
                ("grpc.ssl_target_name_override", "secondary")]) as ch:
            try:
                list(ch.stream_stream(EXCHANGE)(chunks(), timeout=hold_s + 10))
                codes.append(None)
            except grpc.RpcError as exc:
                codes.append(exc.code())

    threads = [threading.Thread(target=one) for _ in range(streams)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(hold_s + 20)
    stop.set()
    return codes


def maximal_chunk(t: Tenancy, ch: GrpcChannel) -> Message | VflinkError:
    """One PSU round 1 of the largest set allowed, then its largest allowed chunk."""
    n = int(t.policy["max_set_elements"])
    session = new_session_name("psu")
    reply = ch.request("secondary", PsuRound1(session=session, group=G.name, n_a=n,
                                              chunk_rows=n), Ack)
    c = int(reply.info["chunk_rows"])
    some = G.hash_to_group([b"h%d" % i for i in range(min(c, 1000))])
    elements = np.tile(some, (-(-c // len(some)), 1))[:c]
    try:
        return ch.call("secondary", PsuChunk(session=session, stream="a_s1", index=0, total=n,
                                             elements=elements))
    except VflinkError as exc:
        return exc


def psu_dictionary(t: Tenancy, ch: GrpcChannel, guesses: list[str]) -> dict[str, bool]:
    """Dummies in round 1, the guesses where the old line 11 took them; returns, per guess,
    whether the attack says "held" (its guess's would-be final value in U)."""
    session = new_session_name("psu")
    e = psu.PsuExponents.draw(G)
    dummies = G.hash_to_group(keys([f"dummy-{i}" for i in range(len(guesses))]))
    r1 = ch.request("secondary", PsuRound1(session=session, group=G.name, n_a=len(dummies),
                                           chunk_rows=1000), Ack)
    n_p, c = int(r1.info["n_p"]), int(r1.info["chunk_rows"])

    def up(stream: str, el: np.ndarray) -> None:
        for i, lo in enumerate(range(0, len(el), c)):
            ch.call("secondary", PsuChunk(session=session, stream=stream, index=i,
                                          total=len(el), elements=el[lo:lo + c]))

    def down(stream: str, total: int) -> np.ndarray:
        return np.concatenate([ch.request("secondary", PsuFetch(
            session=session, stream=stream, index=i), SetChunk).elements
            for i in range(max(1, -(-total // c)))])

    up("a_s1", G.power(dummies, e.first))
    a_s1t1 = down("a_s1t1", len(dummies))
    p_s1t1 = G.power(down("p_t1", n_p), e.first)
    up("p_s1t1", p_s1t1)
    union = sorted_unique(np.concatenate([a_s1t1, p_s1t1]))
    up("union_s123t1", G.power(union, G.combine(e.second, e.third)))
    guessed = G.hash_to_group(keys(guesses))
    # the old line 11: refused, whatever its size
    for el in (G.power(guessed, e.second), G.power(guessed[:1], e.second)):
        err = refused(lambda el=el: up("a_s2", el))
        assert "session.state" in str(err), err
    u = sorted_unique(down("union", len(union)))
    # its best remaining test of a guess: the guess under all of its own exponents
    tried = G.power(guessed, G.combine(e.first, e.second, e.third))
    hit = lookup(u, tried, "guesses", missing_ok=True) >= 0
    return dict(zip(guesses, (bool(h) for h in hit), strict=True))


def psi_forged_rows(t: Tenancy, ch: GrpcChannel, mine: list[str]) -> VflinkError:
    """A PSI whose p_ts answers rows outside the intersection with elements of a_st (and a
    random p_ts), under proofs that cannot verify: refused, and the secondary keeps no rows."""
    session = new_session_name("psi")
    a = G.random_exponent()
    r1 = ch.request("secondary", PsiRound1(session=session, group=G.name, reveal="both",
                                           n_a=len(mine), chunk_rows=1000,
                                           commitment=proofs.commit(G, a)[0].tobytes()), Ack)
    c = int(r1.info["chunk_rows"])
    el = G.power(G.hash_to_group(keys(mine)), a)
    for i, lo in enumerate(range(0, len(el), c)):
        ch.call("secondary", PsiChunk(session=session, stream="a_s", index=i, total=len(el),
                                      elements=el[lo:lo + c]))

    def down(stream: str, total: int) -> np.ndarray:
        return np.concatenate([ch.request("secondary", PsiFetch(
            session=session, stream=stream, index=i), SetChunk).elements
            for i in range(max(1, -(-total // c)))])

    a_st = down("a_st", len(mine))
    p_t = down("p_t", int(r1.info["n_p"]))
    p_ts = G.power(p_t, a)
    matched = lookup(sorted_unique(a_st), p_ts, "m", missing_ok=True) >= 0
    forged = p_ts.copy()
    outside = np.flatnonzero(~matched)[:3]
    # the UIDs of guesses the secondary does not hold, answered for rows it holds
    unheld = a_st[lookup(sorted_unique(p_ts), a_st, "u", missing_ok=True) < 0]
    forged[outside] = unheld[:len(outside)]
    chosen = matched.copy()
    chosen[outside] = True
    proof = proofs.prove(G, a, p_t[chosen], forged[chosen],
                         ctx=proofs.context(session, "p_ts", -1))

    def send() -> None:
        for i, lo in enumerate(range(0, len(forged), c)):
            last = lo + c >= len(forged)
            ch.call("secondary", PsiChunk(session=session, stream="p_ts", index=i,
                                          total=len(forged), elements=forged[lo:lo + c],
                                          proof=proof if last else b""))

    return refused(send)


def out_of_policy_sizes(t: Tenancy, ch: GrpcChannel) -> list[VflinkError]:
    cap = int(t.policy["max_set_elements"])
    errors = []
    for n_a in (-5, 0, cap + 1):
        errors.append(refused(lambda n_a=n_a: ch.call("secondary", PsuRound1(
            session=new_session_name("psu"), group=G.name, n_a=n_a, chunk_rows=10))))
    return errors


def fetch_others(ch: GrpcChannel, sessions: list[str]) -> list[VflinkError]:
    return [refused(lambda s=s: ch.call("secondary", FetchAlignment(session=s)))
            for s in sessions]


def setup_bottom(ch: GrpcChannel) -> Message:
    return ch.call("secondary", SetupBottom(spec=BottomSpec(hidden=(8,), out_dim=4, seed=1)))


def final_result(out: SetAlignment) -> tuple[int, ...]:
    return tuple(int(r) for r in out.rows)


# --- training at the served secondary ----------------------------------------------------------

#: each honest primary's bottom model (different, so that one's model in the other's place shows)
TRAIN_SPECS = {"primary": BottomSpec(hidden=(8,), out_dim=4, seed=1, lr=0.05),
               "primary2": BottomSpec(hidden=(6,), out_dim=4, seed=2, lr=0.05),
               "hostile": BottomSpec(hidden=(7,), out_dim=4, seed=3, lr=0.5)}


def training_grad(emb: Any) -> Any:
    """The gradient a test primary sends back: a function of the embeddings it received, so
    that the model's path shows in every later answer."""
    return 0.1 * emb + 0.01


@dataclass
class Training:
    """One primary's training verbs against the served secondary, recorded to be replayed
    against a secondary serving that primary alone (:func:`trained_alone`)."""

    t: Tenancy
    who: str
    ch: GrpcChannel
    rows: np.ndarray
    run: str = ""
    sent: list[Message] = field(default_factory=list)
    batch: int = 0

    def send(self, message: Message) -> Message:
        self.sent.append(message)
        return self.ch.call("secondary", message)

    def setup(self, spec: BottomSpec | None = None) -> None:
        self.send(SetupBottom(spec=spec or TRAIN_SPECS[self.who], run=self.run))
        self.send(FitPreprocessing(rows=self.rows, run=self.run))

    def step(self) -> None:
        self.batch += 1  # every primary numbers its batches 1, 2, 3, ...
        rows = self.rows[self.batch % 3::3]
        reply = self.send(Forward(batch_id=self.batch, rows=rows, train=True, run=self.run))
        assert isinstance(reply, Embeddings), reply
        self.send(Backward(batch_id=self.batch, grad=training_grad(reply.embeddings),
                           run=self.run))

    def embeddings(self) -> Any:
        reply = self.send(Forward(batch_id=99_999, rows=self.rows, train=False, run=self.run))
        assert isinstance(reply, Embeddings), reply
        return reply.embeddings[torch.from_numpy(reply.inverse)]


def align_for_training(t: Tenancy, who: str, ch: GrpcChannel, n: int = 40) -> np.ndarray:
    """An honest PSI of ``who`` with the secondary (both learn the intersection) and its
    AlignmentReady: the secondary's rows it may then train on (the plaintext oracle's)."""
    session = new_session_name("psi")
    SetAlignmentDriver(keys(honest_ids(t, who, n)), ch, G).psi("secondary", session,
                                                               reveal="both")
    ch.request("secondary", AlignmentReady(session=session, coordinator="coordinator"), Ack)
    return np.asarray(expected_run(t, who, n)["theirs"], dtype=np.int64)


def honest_training(t: Tenancy, who: str, steps: int = 4) -> tuple[Training, Any]:
    """``who`` aligns, sets up, trains ``steps`` batches, snapshots and saves its state;
    returns its script and the embeddings its model then gives."""
    with t.channel(who) as ch:
        rows = align_for_training(t, who, ch)
        tr = Training(t, who, ch, rows, run=f"soak-{who}@{os.getpid()}")
        tr.setup()
        for _ in range(steps):
            tr.step()
        tr.send(Snapshot(tag="best", run=tr.run))
        tr.send(SaveState(name=f"{tr.run.split('@')[0]}/best", run=tr.run))
        return tr, tr.embeddings()


def trained_alone(tr: Training) -> Any:
    """What ``tr``'s messages give at a secondary that serves its primary alone (the same
    table, in this process): the oracle of a served run."""
    from vflink.parties import SecondaryParty
    from vflink.runfiles.party import load_party_config, party_table
    from vflink.transport import InProcessHub

    ref = SecondaryParty(party_table(load_party_config(tr.t.party_file)),
                         InProcessHub().channel("secondary"))
    ref.set_linked_rows(tr.rows, peer=tr.who)
    out = None
    for m in tr.sent:
        if isinstance(m, (SaveState, LoadState)):
            continue  # no files in the reference; neither verb moves a model
        reply = ref.handle(tr.who, m)
        if isinstance(reply, Embeddings):
            out = reply.embeddings[torch.from_numpy(reply.inverse)]
    return out


def hostile_training(t: Tenancy, ch: GrpcChannel) -> list[Message | VflinkError]:
    """The hostile peer's training verbs on the honest primaries' names: a setup and steps
    of its own, and the honest runs' state names saved over and loaded."""
    out: list[Message | VflinkError] = []
    for message in (SetupBottom(spec=TRAIN_SPECS["hostile"]),
                    *(SetupBottom(spec=TRAIN_SPECS["hostile"], run=f"soak-{w}@{os.getpid()}")
                      for w in ("primary", "primary2")),
                    *(LoadState(name=f"soak-{w}/best") for w in ("primary", "primary2")),
                    *(SaveState(name=f"soak-{w}/best") for w in ("primary", "primary2")),
                    SaveState(name="x" * 5000), LoadState(name="../../etc/passwd")):
        try:
            out.append(ch.call("secondary", message))
        except VflinkError as exc:
            out.append(exc)
    return out
