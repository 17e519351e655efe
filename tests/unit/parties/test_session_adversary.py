"""A stateful adversary per protocol: an authenticated peer of each role
sends any message of the protocol, in any state, with honest, replayed, resized and random
contents, over both transports; invariants are checked after every step.

Each machine drives real parties (a :class:`SecondaryParty`, a :class:`CoordinatorParty`)
through an in-process hub or through gRPC servers with mutual TLS on loopback. The model in the
machine is the oracle: which sessions an honest run finished (and their results), which rows
the honest alignment serves to whom, what sizes each session committed to.

Invariants after every step:

* no finished session changed (its result object, rows and written file are as they were);
* no row outside the alignment served: an :class:`Embeddings` reply only for rows the honest
  alignment gave that very sender;
* every PSU/PSI reply agrees with the sizes committed in round 1;
* every refusal is a ``ProtocolError``/``PolicyViolation`` that names no cell value and no
  local path;
* the party still answers (Hello).

More examples run in the slow job (``VFLINK_ADVERSARY_EXAMPLES``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from vflink.alignment import proofs
from vflink.alignment._dh import key_bytes
from vflink.alignment.groups import get_group
from vflink.data import PartySchema, PartyTable
from vflink.errors import PolicyViolation, ProtocolError, VflinkError
from vflink.models.spec import BottomSpec
from vflink.parties import CoordinatorParty, SecondaryParty
from vflink.parties.linking import AlignmentInitiator
from vflink.parties.policy import PartyPolicy
from vflink.parties.setalign import SetAlignmentDriver
from vflink.parties.union import uid_rows
from vflink.protocol import (
    Ack,
    AlignmentReady,
    AlignmentView,
    AlignmentViews,
    Backward,
    ConfirmKey,
    Embeddings,
    EncodingSpec,
    FetchAlignment,
    FitPreprocessing,
    Forward,
    Hello,
    IdentifierEncodings,
    Message,
    SetupBottom,
    ShareEncodings,
    ShareFieldEncodings,
    ShareKeys,
    SoftLink,
)
from vflink.protocol.messages import (
    FieldEncoding,
    PsiChunk,
    PsiFetch,
    PsiRound1,
    PsuChunk,
    PsuFetch,
    PsuRound1,
    SetChunk,
    UnionForward,
    UnionSetup,
)
from vflink.transport import InProcessHub
from vflink.transport.grpc import GrpcChannel, GrpcServer, TlsConfig, create_dev_pki
from vflink.transport.grpc.channel import PeerAddress

N_BANK = 24


def _round1_info(reply: Ack) -> dict[str, float]:
    """Round 1's set size and chunk size (the policy's idle time and dictionary limit, which
    the reply also states, are the bank's own figures)."""
    assert {"idle_s", "guess_limit", "guess_window_s"} <= set(reply.info), reply.info
    return {k: reply.info[k] for k in ("n_p", "chunk_rows")}


KEYS = [f"secretkey{i:03d}" for i in range(N_BANK)]
NAMES = [f"Quirinus{i} Vandermolen" for i in range(N_BANK)]
PRIMARY_KEYS = KEYS[:12] + [f"onlyprimary{i}" for i in range(8)]
PARTIES = ("primary", "bank", "other", "coordinator")
ROLES = {"primary": "primary", "bank": "secondary", "other": "secondary",
         "coordinator": "coordinator"}
EXAMPLES = int(os.environ.get("VFLINK_ADVERSARY_EXAMPLES", "20"))
STEPS = int(os.environ.get("VFLINK_ADVERSARY_STEPS", "15"))
GROUP = get_group("ristretto255")


def bank_table() -> PartyTable:
    frame = pd.DataFrame({"id": KEYS, "name": NAMES,
                          "income": np.linspace(1000.5, 9000.25, N_BANK)})
    schema = PartySchema(name="bank", role="secondary", key=("id",), identifiers=("name",),
                         numeric=("income",))
    return PartyTable.from_frame(schema, frame, "/very/private/path/bank.csv")


def primary_keys() -> list[bytes]:
    return key_bytes(pd.DataFrame({"id": PRIMARY_KEYS}), ("id",), who="primary")


# --- transports: the same machine over an in-process hub and over gRPC with mutual TLS ----------


class Proxy:
    """A served handler whose target party changes with every Hypothesis example."""

    def __init__(self) -> None:
        self.target: Any = None

    def handle(self, sender: str, message: Message) -> Message:
        return self.target.handle(sender, message)  # type: ignore[no-any-return]


class Net:
    """Servers for the bank and the coordinator, started once, and a channel per sender."""

    def __init__(self, pki: Path) -> None:
        self.proxies = {"bank": Proxy(), "coordinator": Proxy()}
        self.servers = {name: GrpcServer(name, proxy, "127.0.0.1:0",
                                         TlsConfig.for_party(pki, name), set(PARTIES)).start()
                        for name, proxy in self.proxies.items()}
        addresses = {n: PeerAddress("127.0.0.1", s.port) for n, s in self.servers.items()}
        self.channels = {name: GrpcChannel(name, addresses, TlsConfig.for_party(pki, name),
                                           deadline_s=30) for name in PARTIES}

    def close(self) -> None:
        for c in self.channels.values():
            c.close()
        for s in self.servers.values():
            s.stop(grace=None)


_NET: dict[str, Net] = {}


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    pki = tmp_path_factory.mktemp("adversary-pki")
    create_dev_pki(pki, list(PARTIES))
    n = Net(pki)
    _NET["net"] = n
    yield n
    _NET.pop("net", None)
    n.close()


class World:
    """Fresh parties for one example, reachable over the chosen transport."""

    def __init__(self, transport: str, out_dir: Path | None) -> None:
        self.hub = InProcessHub()
        self.coordinator = CoordinatorParty("coordinator", seed=0, roles=ROLES)
        self.bank = SecondaryParty(bank_table(), self.hub.channel("bank"), secret=b"s" * 32,
                                   roles=ROLES, out_dir=out_dir)
        self.hub.register("bank", self.bank)
        self.hub.register("coordinator", self.coordinator)
        self.transport = transport
        if transport == "grpc":
            net = _NET["net"]
            net.proxies["bank"].target = self.bank
            net.proxies["coordinator"].target = self.coordinator
            self.bank.channel = net.channels["bank"]

    def channel(self, sender: str) -> Any:
        if self.transport == "grpc":
            return _NET["net"].channels[sender]
        return self.hub.channel(sender)

    def send(self, sender: str, to: str, message: Message) -> Message | VflinkError:
        """The reply, or the refusal (checked to be a clean boundary refusal)."""
        try:
            return self.channel(sender).call(to, message)  # type: ignore[no-any-return]
        except VflinkError as exc:
            clean_refusal(exc)
            return exc


def clean_refusal(exc: VflinkError) -> None:
    assert isinstance(exc, (ProtocolError, PolicyViolation)), (type(exc), exc)
    text = str(exc)
    assert not any(k in text for k in KEYS), text
    assert not any(n in text for n in NAMES), text
    assert "/very/private" not in text and "Traceback" not in text, text


def elements(n: int, seed: int) -> np.ndarray:
    return GROUP.hash_to_group([f"guess-{seed}-{i}".encode() for i in range(n)])


def sizes() -> st.SearchStrategy[str]:
    return st.sampled_from(["honest", "honest", "more", "fewer", "empty"])


def resize(honest: np.ndarray, how: str, seed: int) -> np.ndarray:
    """Honest contents, or resized with valid group elements (guessed IDs), or empty."""
    if how == "honest":
        return honest
    if how == "more":
        return np.concatenate([honest, elements(3, seed)]) if len(honest) else elements(3, seed)
    if how == "fewer":
        return honest[: max(len(honest) - 2, 0)]
    return honest[:0]


# --- PSU and PSI at the secondary -----------------------------------------------------------------


#: the lists of each protocol in the order they travel: (name, uploaded by the primary?, total)
#: where total names the model's committed size (every list travels in chunks)
_PSU_LISTS = (("a_s1", True, "n_a"), ("a_s1t1", False, "n_a"), ("p_t1", False, "n_p"),
              ("p_s1t1", True, "n_p"), ("union_s123t1", True, "n_u"),
              ("union", False, "n_u"), ("a_s1t123", False, "n_a"), ("p_t2", False, "n_p"),
              ("p_s123t2", True, "n_p"))
_PSI_LISTS = (("a_s", True, "n_a"), ("a_st", False, "n_a"), ("p_t", False, "n_p"),
              ("p_ts", True, "n_p"))
#: streams a hostile primary may name although no protocol has them (PSU's old line 11)
_STREAMS = sorted({n for n, _, _ in _PSU_LISTS + _PSI_LISTS} | {"a_s2", "a_s2t123"})
#: the exponent every PSI round 1 of the machine commits to (so it can prove honestly)
EXPONENT = GROUP.random_exponent()


class SetProtocolMachine(RuleBasedStateMachine):
    """PSU and PSI streamed in chunks: a hostile primary (or another party) sends
    chunks of any list, in any order, of any size, repeated or after the list closed; the
    model predicts exactly which are admitted."""

    transport = "inprocess"
    out_dir: Path | None = None

    def __init__(self) -> None:
        super().__init__()
        self.world = World(self.transport, self.out_dir)
        self.finished: dict[str, tuple[Any, bytes | None]] = {}  # name → (result, file bytes)
        # name → the model: method, reveal, sizes, chunk, list position, chunks and rows so far
        self.opened: dict[str, dict[str, Any]] = {}
        self.counter = 0
        self.keys = primary_keys()

    @initialize(n_a=st.integers(1, 8), chunk=st.integers(1, 5),
                reveal=st.sampled_from(["both", "secondary"]))
    def open_sessions(self, n_a: int, chunk: int, reveal: str) -> None:
        """Every example starts with a PSU and a PSI session the primary opened honestly."""
        for method in ("psu", "psi"):
            name = self._name(method)
            reply = self.world.send("primary", "bank", self._round1(method, name, n_a, chunk,
                                                                     reveal))
            assert isinstance(reply, Ack)
            assert _round1_info(reply) == {"n_p": float(N_BANK), "chunk_rows": float(chunk)}
            self._open(name, method, n_a, chunk, reveal)

    @staticmethod
    def _round1(method: str, name: str, n_a: int, chunk: int, reveal: str,
                commitment: bytes | None = None) -> Message:
        if method == "psu":
            return PsuRound1(session=name, group=GROUP.name, n_a=n_a, chunk_rows=chunk)
        if commitment is None:
            commitment = proofs.commit(GROUP, EXPONENT)[0].tobytes()
        return PsiRound1(session=name, group=GROUP.name, reveal=reveal, n_a=n_a,
                         chunk_rows=chunk, commitment=commitment)

    def _open(self, name: str, method: str, n_a: int, chunk: int, reveal: str) -> None:
        self.opened[name] = {"method": method, "reveal": reveal, "n_a": n_a, "n_p": N_BANK,
                             "n_u": None, "chunk": chunk, "at": 0, "chunks": 0, "rows": 0,
                             "dead": False}

    def _name(self, purpose: str) -> str:
        self.counter += 1
        return f"{purpose}@{self.transport}{self.counter}"

    def _file(self, name: str) -> bytes | None:
        if self.out_dir is None:
            return None
        path = self.out_dir / "alignments" / f"{name}.parquet"
        return path.read_bytes() if path.exists() else None

    def _remember(self, name: str) -> None:
        result = self.world.bank.set_alignment(name)
        if result is not None:
            self.finished[name] = (result, self._file(name))
            self.opened.pop(name, None)

    def _lists(self, m: dict[str, Any]) -> tuple[tuple[str, bool, str], ...]:
        if m["method"] == "psu":
            return _PSU_LISTS
        return _PSI_LISTS if m["reveal"] in ("both", "secondary") else _PSI_LISTS[:3]

    def _current(self, m: dict[str, Any]) -> tuple[str, bool, str]:
        return self._lists(m)[m["at"]]

    def _advance(self, name: str, m: dict[str, Any], n: int, total: int) -> None:
        m["chunks"] += 1
        m["rows"] += n
        if m["rows"] == total:
            m["at"] += 1
            m["chunks"] = m["rows"] = 0
            if m["at"] == len(self._lists(m)):
                self._remember(name)

    @rule(method=st.sampled_from(["psu", "psi"]), chunk=st.integers(1, 7),
          reveal=st.sampled_from(["both", "primary", "secondary", "cardinality"]))
    def honest_run(self, method: str, chunk: int, reveal: str) -> None:
        name = self._name(method)
        driver = SetAlignmentDriver(self.keys, self.world.channel("primary"), GROUP,
                                    chunk_rows=chunk)
        out = driver.psu("bank", name) if method == "psu" else \
            driver.psi("bank", name, reveal=reveal)
        assert out.session == name
        self._remember(name)
        assert name in self.finished

    def _target(self, data: st.DataObject) -> str:
        """A session name: mostly a running one, else any known one or a fresh one."""
        running = sorted(n for n, m in self.opened.items() if not m["dead"])
        if running and data.draw(st.integers(0, 3)) > 0:
            return data.draw(st.sampled_from(running))
        known = sorted({*self.finished, *self.opened})
        return data.draw(st.sampled_from([*known, self._name("x")]) if known else
                         st.just(self._name("x")))

    @rule(data=st.data(), sender=st.sampled_from(["primary", "primary", "other", "bank"]),
          method=st.sampled_from(["psu", "psi"]), n_a=st.sampled_from([-5, 0, 1, 3, 6]),
          chunk=st.sampled_from([0, 1, 3, 2**20 + 1]),
          reveal=st.sampled_from(["both", "primary", "secondary", "cardinality"]),
          commitment=st.sampled_from(["honest", "honest", "short", "not-an-element",
                                      "identity"]))
    def round1(self, data: st.DataObject, sender: str, method: str, n_a: int, chunk: int,
               reveal: str, commitment: str) -> None:
        name = self._target(data)
        committed = {"honest": None, "short": b"\x01" * 5, "not-an-element": b"\xff" * 32,
                     "identity": bytes(32)}[commitment]
        reply = self.world.send(sender, "bank", self._round1(method, name, n_a, chunk, reveal,
                                                             committed))
        fresh = name not in self.finished and name not in self.opened
        ok = (sender == "primary" and fresh and 1 <= chunk <= 2**20 and n_a >= 1
              and (method == "psu" or commitment == "honest"))
        assert isinstance(reply, VflinkError) != ok, (reply, sender, fresh, chunk, n_a)
        if ok:
            assert _round1_info(reply) == {  # type: ignore[arg-type]
                "n_p": float(N_BANK), "chunk_rows": float(chunk)}
            self._open(name, method, n_a, chunk, reveal)

    @rule(data=st.data(), sender=st.sampled_from(["primary", "primary", "primary", "other"]),
          stream=st.sampled_from(["current", "current", "current", "other"]),
          index=st.sampled_from(["next", "next", "next", "repeat", "skip"]),
          size=st.sampled_from(["honest", "honest", "over-limit", "over-total", "empty"]),
          total=st.sampled_from(["honest", "honest", "more", "fewer"]),
          proof=st.sampled_from(["valid", "valid", "none", "replayed", "garbage"]))
    def chunk(self, data: st.DataObject, sender: str, stream: str, index: str, size: str,
              total: str, proof: str) -> None:
        """One chunk of an uploaded list, honest or out of order, repeated, too large, too
        many elements in all, of the wrong list, or after its list closed; the last chunk of
        PSI's p_ts with a proof for the elements that match (none do: they are guesses), none,
        one replayed from another session, or garbage."""
        name = self._target(data)
        m = self.opened.get(name)
        method = m["method"] if m else data.draw(st.sampled_from(["psu", "psi"]))
        lists = self._lists(m) if m else _PSU_LISTS if method == "psu" else _PSI_LISTS
        cur = self._current(m) if m else lists[0]
        name_ = cur[0] if stream == "current" else data.draw(st.sampled_from(_STREAMS))
        chunks, rows = (m["chunks"], m["rows"]) if m else (0, 0)
        idx = {"next": chunks, "repeat": chunks - 1, "skip": chunks + 1}[index]
        limit = m["chunk"] if m else 3
        if m and cur[2] == "n_u":
            honest_total = m["n_u"] if m["n_u"] is not None else max(m["n_a"], N_BANK) + 1
        else:
            honest_total = m[cur[2]] if m else 3
        n_total = max(0, honest_total + {"honest": 0, "more": 1, "fewer": -1}[total])
        left = max(0, honest_total - rows)
        n = {"honest": min(limit, left), "over-limit": limit + 1, "over-total": left + 1,
             "empty": 0}[size]
        last = name_ == "p_ts" and rows + n == n_total
        if method == "psu":
            msg: Message = PsuChunk(session=name, stream=name_, index=idx, total=n_total,
                                    elements=elements(n, 1000 * self.counter + rows))
        else:
            ctx = proofs.context(name if proof != "replayed" else "other@1", "p_ts", -1)
            sealed = {"valid": proofs.prove(GROUP, EXPONENT, GROUP.empty(), GROUP.empty(),
                                            ctx=ctx),
                      "replayed": proofs.prove(GROUP, EXPONENT, GROUP.empty(), GROUP.empty(),
                                               ctx=ctx),
                      "none": b"", "garbage": b"\x07" * 64}[proof] if last else b""
            msg = PsiChunk(session=name, stream=name_, index=idx, total=n_total,
                           elements=elements(n, 1000 * self.counter + rows), proof=sealed)
        reply = self.world.send(sender, "bank", msg)
        ok = (m is not None and not m["dead"] and sender == "primary" and cur[1]
              and name_ == cur[0] and idx == chunks and n <= limit and rows + n <= n_total
              and (n > 0 or (n_total == 0 and chunks == 0)))
        if ok and m is not None and cur[2] == "n_u":
            fixed = m["n_u"]
            ok = (fixed == n_total if fixed is not None else
                  max(m["n_a"], N_BANK) <= n_total <= m["n_a"] + N_BANK)
        elif ok and m is not None:
            ok = n_total == m[cur[2]]
        if not ok:
            assert isinstance(reply, VflinkError), (msg.stream, msg.index, n, m)
            return
        assert m is not None
        if last and m["method"] == "psi":  # the proof decides: no proof, no rows
            assert isinstance(reply, VflinkError) == (proof != "valid"), (proof, reply)
        if isinstance(reply, VflinkError):  # admitted, then the contents failed: it ended
            m["dead"] = True
            return
        if cur[2] == "n_u":
            m["n_u"] = n_total
        self._advance(name, m, n, n_total)

    @rule(data=st.data(), sender=st.sampled_from(["primary", "primary", "other"]),
          stream=st.sampled_from(["current", "current", "other"]),
          index=st.sampled_from(["next", "next", "repeat", "skip"]))
    def fetch(self, data: st.DataObject, sender: str, stream: str, index: str) -> None:
        """A chunk of a list the secondary sends: only the next one, of the current list."""
        name = self._target(data)
        m = self.opened.get(name)
        method = m["method"] if m else data.draw(st.sampled_from(["psu", "psi"]))
        cur = self._current(m) if m else ("a_st", False, "n_a")
        name_ = cur[0] if stream == "current" else data.draw(st.sampled_from(_STREAMS))
        chunks = m["chunks"] if m else 0
        idx = {"next": chunks, "repeat": chunks - 1, "skip": chunks + 1}[index]
        kind = PsuFetch if method == "psu" else PsiFetch
        reply = self.world.send(sender, "bank", kind(session=name, stream=name_, index=idx))
        ok = (m is not None and not m["dead"] and sender == "primary" and not cur[1]
              and name_ == cur[0] and idx == chunks)
        if not ok:
            assert isinstance(reply, VflinkError), (name_, idx, m)
            return
        assert m is not None and isinstance(reply, SetChunk), reply
        total = m[cur[2]]
        # every reply agrees with the sizes committed: the next slice of the list
        assert len(reply.elements) == min(m["chunk"], total - m["rows"])
        assert reply.stream == name_ and reply.index == idx
        self._advance(name, m, len(reply.elements), total)

    @precondition(lambda self: bool(self.finished))
    @rule(data=st.data())
    def replay_on_finished(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.finished)))
        for msg in (PsiChunk(session=name, stream="p_ts", index=0, total=N_BANK,
                             elements=elements(3, 6)),
                    PsuChunk(session=name, stream="p_s123t2", index=0, total=N_BANK,
                             elements=elements(3, 7)),
                    PsiFetch(session=name, stream="a_st", index=0),
                    PsiRound1(session=name, group=GROUP.name, reveal="both", n_a=3,
                              chunk_rows=3, commitment=proofs.commit(GROUP, 5)[0].tobytes())):
            reply = self.world.send("primary", "bank", msg)
            assert isinstance(reply, VflinkError), msg.kind  # a finished session is immutable

    @rule(data=st.data(), sender=st.sampled_from(PARTIES))
    def fetch_rows(self, data: st.DataObject, sender: str) -> None:
        name = self._target(data)
        reply = self.world.send(sender, "bank", FetchAlignment(session=name))
        if not isinstance(reply, VflinkError):
            # PSI rows go to the party that ran that PSI, revealing "both", and nobody else
            result = self.finished[name][0]
            assert sender == "primary" and result.method == "psi" and result.known
            assert isinstance(reply, AlignmentView)
            assert sorted(reply.secondary_index) == sorted(result.rows)

    @invariant()
    def finished_sessions_never_change(self) -> None:
        for name, (result, blob) in self.finished.items():
            now = self.world.bank.set_alignment(name)
            assert now is result, name
            assert self._file(name) == blob, name

    @invariant()
    def no_files_left_behind(self) -> None:
        """Finished or failed sessions keep no bucket files."""
        if self.out_dir is None:
            return
        tmp = self.out_dir / ".set-tmp"
        running = sum(1 for m in self.opened.values() if not m["dead"])
        left = list(tmp.iterdir()) if tmp.exists() else []
        assert len(left) <= running, (left, running)

    @invariant()
    def still_answers(self) -> None:
        reply = self.world.channel("primary").call("bank", Hello(party="primary",
                                                                 role="primary"))
        assert isinstance(reply, Hello)


# --- split training at the secondary --------------------------------------------------------------


class TrainingMachine(RuleBasedStateMachine):
    """Split training bound to the honest alignment (a PSI run with the primary)."""

    transport = "inprocess"

    def __init__(self) -> None:
        super().__init__()
        self.world = World(self.transport, None)
        self.served: dict[str, set[int]] = {}  # the oracle: rows served to each sender
        self.batches: dict[int, int] = {}  # batch id → number of unique rows
        self.session = ""

    @initialize(aligned=st.booleans())
    def start(self, aligned: bool) -> None:
        """The primary builds the bottom model at once (allowed before any alignment); half
        the examples also align honestly first."""
        reply = self.world.send("primary", "bank", SetupBottom(spec=BottomSpec(
            hidden=(4,), out_dim=3, seed=1)))
        assert isinstance(reply, Ack)
        if aligned:
            self.honest_alignment()

    @precondition(lambda self: not self.session)
    @rule()
    def honest_alignment(self) -> None:
        self.session = "psi@training"
        driver = SetAlignmentDriver(primary_keys(), self.world.channel("primary"), GROUP)
        driver.psi("bank", self.session, reveal="both")
        reply = self.world.send("primary", "bank", AlignmentReady(session=self.session,
                                                                  coordinator="coordinator"))
        assert isinstance(reply, Ack)
        rows = self.world.bank.set_alignment(self.session).rows  # type: ignore[union-attr]
        self.served["primary"] = {int(r) for r in rows}

    @rule(sender=st.sampled_from(PARTIES[:3]), session=st.sampled_from(["psi@training",
                                                                        "never@opened"]))
    def alignment_ready(self, sender: str, session: str) -> None:
        reply = self.world.send(sender, "bank", AlignmentReady(session=session,
                                                               coordinator="coordinator"))
        if not isinstance(reply, VflinkError):
            assert sender == "primary" and session == self.session

    @rule(sender=st.sampled_from(PARTIES[:3]))
    def setup_bottom(self, sender: str) -> None:
        self.world.send(sender, "bank", SetupBottom(spec=BottomSpec(hidden=(4,), out_dim=3,
                                                                    seed=1)))

    @rule(sender=st.sampled_from(PARTIES[:3]),
          rows=st.lists(st.integers(-2, N_BANK + 2), min_size=0, max_size=8))
    def fit(self, sender: str, rows: list[int]) -> None:
        reply = self.world.send(sender, "bank", FitPreprocessing(rows=np.array(rows,
                                                                               dtype=np.int64)))
        if not isinstance(reply, VflinkError):
            assert set(rows) <= self.served.get(sender, set()), rows

    @rule(sender=st.sampled_from(PARTIES[:3]), train=st.booleans(), batch=st.integers(0, 4),
          rows=st.lists(st.integers(-2, N_BANK + 2), min_size=1, max_size=8))
    def forward(self, sender: str, train: bool, batch: int, rows: list[int]) -> None:
        reply = self.world.send(sender, "bank", Forward(batch_id=batch, rows=np.array(
            rows, dtype=np.int64), train=train))
        if not isinstance(reply, VflinkError):
            # no row outside the alignment is ever served, to anyone
            assert set(rows) <= self.served.get(sender, set()), rows
            assert isinstance(reply, Embeddings) and len(reply.inverse) == len(rows)
            if train:
                self.batches[batch] = len(set(rows))

    # the attacker's favourite move: the primary asks for valid rows, aligned or not
    @rule(rows=st.lists(st.integers(0, N_BANK - 1), min_size=1, max_size=6),
          kind=st.sampled_from(["fit", "train", "eval"]))
    def primary_probes(self, rows: list[int], kind: str) -> None:
        idx = np.array(rows, dtype=np.int64)
        msg: Message = FitPreprocessing(rows=idx) if kind == "fit" else \
            Forward(batch_id=9, rows=idx, train=kind == "train")
        reply = self.world.send("primary", "bank", msg)
        if not isinstance(reply, VflinkError):
            assert set(rows) <= self.served.get("primary", set()), (kind, rows)

    @rule(sender=st.sampled_from(PARTIES[:3]), batch=st.integers(0, 4),
          how=st.sampled_from(["honest", "shape", "nan"]))
    def backward(self, sender: str, batch: int, how: str) -> None:
        n = self.batches.get(batch, 2)
        grad = torch.zeros(n if how != "shape" else n + 1, 3)
        if how == "nan":
            grad[0, 0] = float("nan")
        reply = self.world.send(sender, "bank", Backward(batch_id=batch, grad=grad))
        if not isinstance(reply, VflinkError):
            assert sender == "primary" and how == "honest"

    @invariant()
    def still_answers(self) -> None:
        reply = self.world.channel("primary").call("bank", Hello(party="primary",
                                                                 role="primary"))
        assert isinstance(reply, Hello)


# --- alignment at the coordinator ---------------------------------------------------------------


class CoordinationMachine(RuleBasedStateMachine):
    transport = "inprocess"

    def __init__(self) -> None:
        super().__init__()
        self.world = World(self.transport, None)
        self.linked: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
        self.counter = 0

    def _target(self, data: st.DataObject) -> str:
        self.counter += 1
        fresh = f"link@{self.transport}{self.counter}"
        return data.draw(st.sampled_from([*sorted(self.linked), fresh, "shared@1"]))

    @rule(data=st.data(), sender=st.sampled_from(PARTIES[:3]),
          n=st.integers(0, 4), width=st.sampled_from([1, 2]))
    def submit(self, data: st.DataObject, sender: str, n: int, width: int) -> None:
        name = self._target(data)
        values = tuple(f"v{i}" for i in range(n)) if width == 1 else np.zeros((n, 3))
        reply = self.world.send(sender, "coordinator", IdentifierEncodings(
            session=name, encoder="string" if width == 1 else "raw", values=values))
        if not isinstance(reply, VflinkError):
            assert name not in self.linked  # a linked session is final

    @rule(data=st.data(), sender=st.sampled_from(PARTIES[:3]),
          secondaries=st.sampled_from([("bank",), ("other",), ("bank", "other"), ("primary",)]))
    def link(self, data: st.DataObject, sender: str, secondaries: tuple[str, ...]) -> None:
        name = self._target(data)
        reply = self.world.send(sender, "coordinator", SoftLink(
            session=name, secondaries=secondaries, metric="levenshtein", top_k=1, sigma=1.0))
        if not isinstance(reply, VflinkError):
            assert sender == "primary" and name not in self.linked
            assert isinstance(reply, AlignmentViews)
            self.linked[name] = {v.secondary: (v.primary_index.copy(),
                                               v.secondary_index.copy()) for v in reply.views}

    @rule(data=st.data(), sender=st.sampled_from(PARTIES))
    def fetch(self, data: st.DataObject, sender: str) -> None:
        name = self._target(data)
        reply = self.world.send(sender, "coordinator", FetchAlignment(session=name))
        if not isinstance(reply, VflinkError):
            # a secondary's own view of a linked session, without similarities
            assert name in self.linked and sender in self.linked[name]
            assert isinstance(reply, AlignmentView) and reply.similarity is None
            p, s = self.linked[name][sender]
            assert np.array_equal(reply.secondary_index, s)

    @invariant()
    def linked_sessions_never_change(self) -> None:
        for name, views in self.linked.items():
            for sec, (_, s) in views.items():
                now = self.world.coordinator.linkage(name, sec)
                assert now is not None
                assert np.array_equal(self.world.coordinator._sessions[name]
                                      .alignments[sec].secondary_index, s)

    @invariant()
    def still_answers(self) -> None:
        reply = self.world.channel("primary").call("coordinator", Hello(party="primary",
                                                                        role="primary"))
        assert isinstance(reply, Hello)


# --- alignment through the coordinator, at the secondary -----------------------------------------


class DataAlignmentMachine(RuleBasedStateMachine):
    """The secondary's side of exact and soft alignment: key confirmation, one submission per
    session, then the coordinator's view. The oracle: what the bank submitted to the
    coordinator, and which rows it serves to whom."""

    transport = "inprocess"
    out_dir: Path | None = None

    def __init__(self) -> None:
        super().__init__()
        self.world = World(self.transport, None)
        self.world.bank.policy = PartyPolicy(identifiers="bloom")
        self.counter = 0
        self.linked: dict[str, set[int]] = {}  # session → rows the exact alignment links
        self.primary = AlignmentInitiator(
            "primary", pd.DataFrame({"id": PRIMARY_KEYS}), self.world.channel("primary"),
            secondaries=("bank",), key=("id",), secret=b"s" * 32, source="primary")

    def _name(self, data: st.DataObject) -> str:
        self.counter += 1
        return data.draw(st.sampled_from([*sorted(self.linked), f"exact@{self.counter}"]))

    @rule()
    def honest_exact(self) -> None:
        self.counter += 1
        name = f"exact@h{self.counter}"
        got = self.primary.align_exact("coordinator", session=name)
        links = got["bank"].secondary_index.ravel()
        self.linked[name] = {int(r) for r in links if r >= 0}
        assert self.linked[name] == set(range(12))  # the 12 shared keys, by construction

    @rule(data=st.data(), sender=st.sampled_from(PARTIES[:3]),
          kind=st.sampled_from(["keys", "bloom", "raw", "fields"]),
          coordinator=st.sampled_from(["coordinator", "primary", "other"]))
    def share(self, data: st.DataObject, sender: str, kind: str, coordinator: str) -> None:
        name = self._name(data)
        msg: Message
        if kind == "keys":
            msg = ShareKeys(session=name, coordinator=coordinator)
        elif kind == "fields":
            msg = ShareFieldEncodings(session=name, coordinator=coordinator, fields=(
                FieldEncoding(columns=("name",), spec=EncodingSpec(
                    encoder="bloom", kind="string", params={})),))
        else:
            msg = ShareEncodings(session=name, coordinator=coordinator, spec=EncodingSpec(
                encoder=kind, kind="string", params={}))
        reply = self.world.send(sender, "bank", msg)
        if not isinstance(reply, VflinkError):
            # only to the coordinator, only for the primary, only after a key confirmation of
            # that session, only once, and never raw identifiers under the default policy
            assert sender == "primary" and coordinator == "coordinator" and kind != "raw"
            assert name not in self.linked
            session = self.world.bank.sessions.get("alignment", name)
            assert session is not None and session.data.get("confirmed") is True

    @rule(data=st.data(), sender=st.sampled_from(PARTIES[:3]))
    def confirm(self, data: st.DataObject, sender: str) -> None:
        name = self._name(data)
        reply = self.world.send(sender, "bank", ConfirmKey(session=name, nonce="n" * 32,
                                                           coordinator="coordinator"))
        if not isinstance(reply, VflinkError):
            # no tag of the primary's for this nonce: the confirmation cannot succeed
            assert sender == "primary" and isinstance(reply, Ack)
            assert reply.info.get("confirmed") != 1.0

    @rule(data=st.data(), sender=st.sampled_from(PARTIES[:3]))
    def alignment_ready(self, data: st.DataObject, sender: str) -> None:
        name = self._name(data)
        reply = self.world.send(sender, "bank", AlignmentReady(session=name,
                                                               coordinator="coordinator"))
        if not isinstance(reply, VflinkError):
            assert sender == "primary" and name in self.linked

    @invariant()
    def serves_only_linked_rows_to_the_primary(self) -> None:
        served = self.world.bank.served
        assert set(served) <= {"primary"}
        if "primary" in served:
            rows = {int(r) for r in np.flatnonzero(served["primary"])}
            assert any(rows == linked for linked in self.linked.values())

    @invariant()
    def the_coordinator_got_nothing_unconfirmed(self) -> None:
        for name, state in self.world.coordinator._sessions.items():
            if "bank" in state.digests or "bank" in state.encodings or "bank" in state.fields:
                session = self.world.bank.sessions.get("alignment", name)
                assert session is not None and session.data.get("confirmed") is True, name


# --- FLORIST union training, at the secondary ---------------------------------------------------


class UnionMachine(RuleBasedStateMachine):
    """Union training after an honest PSU. The invariant is the membership one: every request
    about the primary's own members, and the same request about its own non-members, get
    answers of the same kind (reply or refusal code) and shape."""

    transport = "inprocess"
    out_dir: Path | None = None

    def __init__(self) -> None:
        super().__init__()
        self.world = World(self.transport, None)
        self.session = "psu@union"
        mine = SetAlignmentDriver(primary_keys(), self.world.channel("primary"), GROUP).psu(
            "bank", self.session)
        rows = uid_rows(mine)  # the primary's row of each UID, -1 where it holds none
        own = {int(r): u for u, r in enumerate(rows) if r >= 0}
        self.members = np.array([own[i] for i in range(12)], dtype=np.int64)
        self.outsiders = np.array([own[i] for i in range(12, 20)], dtype=np.int64)
        self.n_union = len(rows)
        self.batch = 100
        self.union_setup("primary", self.session, "fea-sampling")  # the honest start

    @rule(sender=st.sampled_from(PARTIES[:3]),
          session=st.sampled_from(["psu@union", "psu@never"]),
          features=st.sampled_from(["fea-sampling", "fea-gaussian", "fea-random", "none"]))
    def union_setup(self, sender: str, session: str, features: str) -> None:
        reply = self.world.send(sender, "bank", UnionSetup(
            session=session, spec=BottomSpec(hidden=(4,), out_dim=3, seed=2),
            features=features, fit_uids=np.arange(self.n_union, dtype=np.int64)))
        if not isinstance(reply, VflinkError):
            assert sender == "primary" and session == self.session
            assert features in ("fea-sampling",)  # "none": the bank lacks some UIDs

    def _ask(self, uids: np.ndarray, train: bool) -> tuple[str, tuple[int, ...]]:
        self.batch += 1
        reply = self.world.send("primary", "bank", UnionForward(
            batch_id=self.batch, uids=uids, train=train))
        if isinstance(reply, VflinkError):
            return f"refused {getattr(reply, 'code', '')}", ()
        assert isinstance(reply, Embeddings)
        if train:
            # answer the batch at once, so that the twin request meets the same number of
            # batches waiting for their gradient (policy.max_pending_batches counts them)
            done = self.world.send("primary", "bank", Backward(
                batch_id=self.batch, grad=torch.zeros(reply.embeddings.shape)))
            assert not isinstance(done, VflinkError), done
        return "answered", tuple(reply.embeddings[reply.inverse].shape)

    @rule(n=st.integers(1, 8), train=st.booleans(), data=st.data())
    def member_twin_requests(self, n: int, train: bool, data: st.DataObject) -> None:
        k = min(n, len(self.outsiders))
        members = data.draw(st.permutations(self.members))[:k]
        outsiders = data.draw(st.permutations(self.outsiders))[:k]
        # the same request about members and about non-members: the same kind of answer
        assert self._ask(members, train) == self._ask(outsiders, train)

    @rule(uids=st.lists(st.integers(-3, 80), min_size=1, max_size=6), train=st.booleans(),
          sender=st.sampled_from(PARTIES[:3]))
    def anything(self, uids: list[int], train: bool, sender: str) -> None:
        self.batch += 1
        reply = self.world.send(sender, "bank", UnionForward(
            batch_id=self.batch, uids=np.array(uids, dtype=np.int64), train=train))
        if not isinstance(reply, VflinkError):
            assert sender == "primary" and all(0 <= u < self.n_union for u in uids)

    @rule(batch=st.integers(100, 130), how=st.sampled_from(["honest", "shape"]))
    def backward(self, batch: int, how: str) -> None:
        reply = self.world.send("primary", "bank", Backward(
            batch_id=batch, grad=torch.zeros(3 if how == "honest" else 2, 3)))
        del reply  # refusals are checked clean by World.send; the invariant below holds

    @invariant()
    def still_answers(self) -> None:
        reply = self.world.channel("primary").call("bank", Hello(party="primary",
                                                                 role="primary"))
        assert isinstance(reply, Hello)


MACHINES: dict[str, type[RuleBasedStateMachine]] = {
    "set-protocols": SetProtocolMachine, "training": TrainingMachine,
    "coordination": CoordinationMachine, "alignment": DataAlignmentMachine,
    "union": UnionMachine}


def _run(machine: type[RuleBasedStateMachine], transport: str, out_dir: Path | None,
         examples: int) -> None:
    from hypothesis.stateful import run_state_machine_as_test

    cls: Callable[[], RuleBasedStateMachine] = type(
        f"{machine.__name__}_{transport}", (machine,),
        {"transport": transport, "out_dir": out_dir})
    run_state_machine_as_test(cls, settings=settings(
        max_examples=examples, stateful_step_count=STEPS, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))


@pytest.mark.network
@pytest.mark.parametrize("transport", ["inprocess", "grpc"])
@pytest.mark.parametrize("protocol", [
    # the set protocols' machine is the slowest (each PSU/PSI step is group work): in the
    # slow job, beside the many-examples run of every machine
    pytest.param(name, marks=pytest.mark.slow) if name == "set-protocols" else name
    for name in sorted(MACHINES)])
def test_hostile_peer_cannot_step_outside_the_protocol(
        protocol: str, transport: str, net: Net, tmp_path: Path) -> None:
    counter = iter(range(10**6))

    class WithDir(MACHINES[protocol]):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            self.out_dir = tmp_path / f"ex{next(counter)}"
            super().__init__()

    _run(WithDir, transport, None, EXAMPLES)


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("transport", ["inprocess", "grpc"])
@pytest.mark.parametrize("protocol", sorted(MACHINES))
def test_hostile_peer_many_examples(protocol: str, transport: str, net: Net,
                                   tmp_path: Path) -> None:
    counter = iter(range(10**6))

    class WithDir(MACHINES[protocol]):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            self.out_dir = tmp_path / f"ex{next(counter)}"
            super().__init__()

    _run(WithDir, transport, None, 10 * EXAMPLES)
