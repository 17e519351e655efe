"""A secondary that trains with two primaries at once keeps each one's run apart.

The reported failures: the second primary's ``SetupBottom`` replaced the model the first
trained with, its training steps moved the first's model, and it could ``LoadState`` a name the
first saved. Here two primaries (and two runs of one primary) interleave every training verb
against one secondary, in one process and over gRPC with issued certificates; the oracle is
the same messages sent to a fresh secondary by that primary alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from vflink.data.schema import PartySchema
from vflink.data.table import PartyTable
from vflink.errors import PolicyViolation, ProtocolError, VflinkError
from vflink.models.spec import BottomSpec
from vflink.parties import SecondaryParty
from vflink.parties.policy import PartyPolicy
from vflink.protocol import (
    Ack,
    Backward,
    Embeddings,
    FitPreprocessing,
    Forward,
    LoadState,
    Message,
    Restore,
    SaveState,
    SetupBottom,
    Snapshot,
)
from vflink.transport import InProcessHub
from vflink.transport.grpc import GrpcChannel, GrpcServer, PeerAddress, TlsConfig, create_dev_pki

N = 60
PRIMARIES = ("primary", "primary2")
ROWS = {"primary": np.arange(0, 40, dtype=np.int64), "primary2": np.arange(20, 60, dtype=np.int64)}
SPECS = {"primary": BottomSpec(hidden=(8,), out_dim=4, seed=1, lr=0.05),
         "primary2": BottomSpec(hidden=(6,), out_dim=4, seed=2, lr=0.05)}


def bank_table() -> PartyTable:
    rng = np.random.default_rng(3)
    frame = pd.DataFrame({"id": [f"k{i}" for i in range(N)], "x1": rng.normal(size=N),
                          "x2": rng.normal(size=N), "x3": rng.normal(size=N)})
    schema = PartySchema(name="bank", role="secondary", key=("id",), numeric=("x1", "x2", "x3"))
    return PartyTable.from_frame(schema, frame, "bank.csv")


def new_bank(state: Path | None, policy: PartyPolicy | None = None,
             peers: tuple[str, ...] = PRIMARIES) -> SecondaryParty:
    bank = SecondaryParty(bank_table(), InProcessHub().channel("bank"), out_dir=state,
                          policy=policy)
    bank.roles = {p: "primary" for p in PRIMARIES}
    for p in peers:  # each primary's own alignment: the rows it may ask for
        bank.set_linked_rows(ROWS[p], peer=p)
    return bank


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    create_dev_pki(d, ["bank", *PRIMARIES])
    return d


Connect = Callable[[SecondaryParty], dict[str, Any]]


@pytest.fixture(params=["inprocess", "grpc"])
def connect(request: pytest.FixtureRequest, pki: Path) -> Iterator[Connect]:
    """``connect(bank)``: each primary's channel to ``bank``, in one process or over gRPC
    (mutual TLS, each primary with its own certificate)."""
    servers: list[GrpcServer] = []
    channels: list[GrpcChannel] = []

    def make(bank: SecondaryParty) -> dict[str, Any]:
        if request.param == "inprocess":
            hub = InProcessHub()
            hub.register("bank", bank)
            return {p: hub.channel(p) for p in PRIMARIES}
        server = GrpcServer("bank", bank, "127.0.0.1:0", TlsConfig.for_party(pki, "bank"),
                            set(PRIMARIES)).start()
        servers.append(server)
        out = {}
        for p in PRIMARIES:
            ch = GrpcChannel(p, {"bank": PeerAddress("127.0.0.1", server.port)},
                             TlsConfig.for_party(pki, p))
            channels.append(ch)
            out[p] = ch
        return out

    yield make
    for c in channels:
        c.close()
    for s in servers:
        s.stop(grace=0)


def grad_for(emb: torch.Tensor) -> torch.Tensor:
    """A gradient that depends on the embeddings (so a run's result depends on its path)."""
    return 0.1 * emb + 0.01


class Script:
    """One primary's training verbs, sent to its channel and recorded (to replay alone)."""

    def __init__(self, who: str, channel: Any, run: str = "") -> None:
        self.who, self.channel, self.run = who, channel, run
        self.sent: list[Message] = []
        self.batch = 0

    def send(self, message: Message) -> Any:
        self.sent.append(message)
        return self.channel.call("bank", message)

    def setup(self, spec: BottomSpec | None = None) -> None:
        assert isinstance(self.send(SetupBottom(spec=spec or SPECS[self.who], run=self.run)),
                          Ack)
        assert isinstance(self.send(FitPreprocessing(rows=ROWS[self.who], run=self.run)), Ack)

    def step(self) -> None:
        self.batch += 1  # both primaries number their batches alike: 1, 2, 3, ...
        rows = ROWS[self.who][self.batch % 4::4]
        reply = self.send(Forward(batch_id=self.batch, rows=rows, train=True, run=self.run))
        assert isinstance(reply, Embeddings)
        self.send(Backward(batch_id=self.batch, grad=grad_for(reply.embeddings), run=self.run))

    def embeddings(self) -> torch.Tensor:
        reply = self.send(Forward(batch_id=10_000, rows=ROWS[self.who], train=False,
                                  run=self.run))
        assert isinstance(reply, Embeddings)
        return reply.embeddings[torch.from_numpy(reply.inverse)]

    def alone(self) -> torch.Tensor:
        """The same messages sent to a fresh secondary that serves this primary alone."""
        ref = new_bank(None, peers=(self.who,))
        out = None
        for m in self.sent:
            if isinstance(m, (SaveState, LoadState)):
                continue  # the reference keeps no files; these verbs change no model here
            reply = ref.handle(self.who, m)
            if isinstance(reply, Embeddings):
                out = reply.embeddings[torch.from_numpy(reply.inverse)]
        assert out is not None
        return out


def test_two_primaries_interleaving_every_verb_each_get_only_their_own_model(
        connect: Connect, tmp_path: Path) -> None:
    state = tmp_path / "state"
    bank = new_bank(state)
    ch = connect(bank)
    a, b = Script("primary", ch["primary"]), Script("primary2", ch["primary2"])
    a.setup()
    b.setup()  # the second primary's setup: the first's model stays its own
    for _ in range(3):  # the same batch ids from both
        a.step()
        b.step()
    a.send(Snapshot(tag="best"))
    b.send(Snapshot(tag="best"))
    a.step()
    b.step()
    b.send(Restore(tag="best"))  # only the second's model goes back
    for s in (a, b):  # the same state name from both
        assert s.send(SaveState(name="run/best")) == Ack(info={"saved": 1.0})
    a_saved = a.embeddings()
    b.setup(BottomSpec(hidden=(5,), out_dim=4, seed=9))  # a new model for the second only
    b.step()
    got_a = a.embeddings()
    assert torch.equal(got_a, a_saved)  # its setup and step moved nothing of the first's
    assert torch.allclose(got_a, a.alone(), atol=1e-6)  # exactly what it computes alone
    assert torch.allclose(b.embeddings(), b.alone(), atol=1e-6)
    # each primary's states in its own folder, under the same name
    for p in PRIMARIES:
        assert (state / "peers" / p / "run" / "best.json").is_file()
    # loading "run/best" gives each its own state back
    b.send(LoadState(name="run/best"))
    a.send(LoadState(name="run/best"))
    assert torch.equal(a.embeddings(), a_saved)
    # a name only the first saved: the second gets a clear refusal, not the state
    a.send(SaveState(name="only-mine"))
    with pytest.raises(ProtocolError, match=r"no saved state 'only-mine' of yours.*state\.unknown"):
        b.send(LoadState(name="only-mine"))
    assert torch.equal(a.embeddings(), a_saved)


def test_two_runs_of_one_primary_are_kept_apart(connect: Connect) -> None:
    bank = new_bank(None)
    ch = connect(bank)["primary"]
    r1, r2 = Script("primary", ch, run="r1@a"), Script("primary", ch, run="r2@b")
    r1.setup()
    r1.step()
    before = r1.embeddings()
    r2.setup(BottomSpec(hidden=(3,), out_dim=4, seed=5))
    r2.step()
    r2.step()
    assert torch.equal(r1.embeddings(), before)
    r1.step()
    assert torch.allclose(r1.embeddings(), r1.alone(), atol=1e-6)
    runs = {(r.peer, r.run) for r in bank.training_runs()}
    assert runs == {("primary", "r1@a"), ("primary", "r2@b")}


def test_runs_and_memory_are_limited_per_peer(connect: Connect) -> None:
    spec = SPECS["primary"]
    # runs: a peer's third run drops its own oldest, never the other peer's
    bank = new_bank(None, PartyPolicy(max_training_runs=2))
    ch = connect(bank)
    other = Script("primary2", ch["primary2"])
    other.setup()
    other.step()
    kept = other.embeddings()
    runs = [Script("primary", ch["primary"], run=f"r{i}") for i in range(3)]
    for s in runs:
        s.setup(spec)
    assert {r.run for r in bank.training_runs() if r.peer == "primary"} == {"r1", "r2"}
    with pytest.raises(VflinkError, match=r"run 'r0' was dropped.*max_training_runs"):
        runs[0].embeddings()
    assert torch.equal(other.embeddings(), kept)

    # memory: one of these small models fits a peer's limit, two do not
    held = bank.training_run("primary", "r1")
    assert held is not None
    one = held.nbytes()  # a set-up run's model, gradients' room and features
    assert one > 0
    bank = new_bank(None, PartyPolicy(max_training_bytes=int(2.5 * one)))
    ch = connect(bank)
    other = Script("primary2", ch["primary2"])
    other.setup()  # another peer's memory is its own
    kept = other.embeddings()
    first, second = (Script("primary", ch["primary"], run=r) for r in ("m1", "m2"))
    first.setup(spec)
    first.step()
    second.setup(spec)  # does not fit beside the first: the peer's own older run goes
    assert {r.run for r in bank.training_runs() if r.peer == "primary"} == {"m2"}
    with pytest.raises(VflinkError, match=r"max_training_bytes"):
        first.embeddings()
    # a model that does not fit alone is refused before it is built, dropping nothing
    with pytest.raises(PolicyViolation, match=r"limit\.training-memory"):
        first.setup(BottomSpec(hidden=(4000,), out_dim=4))
    assert {r.run for r in bank.training_runs() if r.peer == "primary"} >= {"m2"}
    assert sum(r.nbytes() for r in bank.training_runs() if r.peer == "primary") <= 2.5 * one
    assert torch.equal(other.embeddings(), kept)


@pytest.mark.parametrize("name", ["x" * 5000, "../escape", "a/../../b", "/etc/passwd", "a\x00b",
                                  "alignments/psi@1"])
def test_long_and_path_like_state_names_are_refused_clearly(connect: Connect, tmp_path: Path,
                                                            name: str) -> None:
    state = tmp_path / "state"
    bank = new_bank(state)
    s = Script("primary", connect(bank)["primary"])
    s.setup()
    for verb in (SaveState, LoadState):
        with pytest.raises(ProtocolError) as info:
            s.send(verb(name=name))
        text = str(info.value)
        assert "invalid state name" in text and "state.name" in text, text
        assert "internal" not in text and str(tmp_path) not in text
    assert not any(p.is_file() for p in tmp_path.rglob("*") if "peers" not in p.parts
                   and p.suffix in (".json", ".safetensors"))
    assert s.send(SaveState(name="fine")) == Ack(info={"saved": 1.0})  # still serving


def test_a_bad_name_is_refused_for_its_name_whatever_the_session_state(
        connect: Connect, tmp_path: Path) -> None:
    """Names are checked before the protocol's state: a peer that has set nothing up learns
    that its state name is invalid, not that save_state is out of turn."""
    bank = new_bank(tmp_path / "state")
    ch = connect(bank)["primary"]
    for message in (SaveState(name="x" * 5000), LoadState(name="../../etc/passwd"),
                    Snapshot(tag="t" * 300), Restore(tag="a/b"),
                    SaveState(name="fine", run="../run")):
        with pytest.raises(ProtocolError) as info:
            ch.call("bank", message)
        assert getattr(info.value, "code", None) in ("state.name", "snapshot.tag", "run.name")
    assert bank.training_runs() == []  # nothing was opened for them
