"""A peer's set sessions: alive while an honest driver computes, told when they expired, and
counted against the peer's allowance (sessions and elements per window) only when the peer
got something or is to blame.

The reported case: an honest 200,000-record PSU under ``session_ttl_s = 30`` failed with
"state 'new': psu_chunk refused" after its driver spent longer than the idle time on line 3,
and the failed run used up one of the peer's ``max_set_sessions``. Here the driver's
computation is slowed down (its batches made small and each one slow), so the case is the same
on any machine; every case runs in one process and over gRPC with issued certificates.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from vflink.alignment._dh import key_bytes
from vflink.alignment.groups import get_group
from vflink.data.schema import PartySchema
from vflink.data.table import PartyTable
from vflink.errors import PolicyViolation, ProtocolError, VflinkError
from vflink.parties import SecondaryParty
from vflink.parties import setalign as setalign_module
from vflink.parties.policy import PartyPolicy
from vflink.parties.setalign import SetAlignmentDriver
from vflink.protocol import Ack
from vflink.protocol.messages import PsuChunk, PsuFetch, PsuRound1, SetChunk
from vflink.protocol.sessions import new_session_name
from vflink.transport import InProcessHub
from vflink.transport.grpc import GrpcChannel, GrpcServer, PeerAddress, TlsConfig, create_dev_pki

G = get_group("ristretto255", workers=1)
BANK = [f"held{i}" for i in range(20)] + [f"bank{i}" for i in range(20)]
MINE = [f"held{i}" for i in range(20)] + [f"mine{i}" for i in range(20)]
PEERS = ("primary", "primary2")


def keys(ids: list[str]) -> list[bytes]:
    return key_bytes(pd.DataFrame({"id": ids}), ("id",), who="test")


def new_bank(state: Path, policy: PartyPolicy) -> SecondaryParty:
    table = PartyTable(PartySchema(name="bank", role="secondary", key=("id",)),
                       pd.DataFrame({"id": BANK}), "bank.csv")
    party = SecondaryParty(table, InProcessHub().channel("bank"), out_dir=state, policy=policy)
    party.roles = {p: "primary" for p in PEERS}
    return party


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    create_dev_pki(d, ["bank", *PEERS])
    return d


Connect = Callable[[SecondaryParty], dict[str, Any]]


@pytest.fixture(params=["inprocess", "grpc"])
def connect(request: pytest.FixtureRequest, pki: Path) -> Iterator[Connect]:
    servers: list[GrpcServer] = []
    channels: list[GrpcChannel] = []

    def make(bank: SecondaryParty) -> dict[str, Any]:
        if request.param == "inprocess":
            hub = InProcessHub()
            hub.register("bank", bank)
            return {p: hub.channel(p) for p in PEERS}
        server = GrpcServer("bank", bank, "127.0.0.1:0", TlsConfig.for_party(pki, "bank"),
                            set(PEERS)).start()
        servers.append(server)
        out = {}
        for p in PEERS:
            channels.append(GrpcChannel(p, {"bank": PeerAddress("127.0.0.1", server.port)},
                                        TlsConfig.for_party(pki, p)))
            out[p] = channels[-1]
        return out

    yield make
    for c in channels:
        c.close()
    for s in servers:
        s.stop(grace=0)


def used(bank: SecondaryParty, peer: str = "primary") -> tuple[int, int]:
    allowance, _ = bank._set_resources()
    return allowance.used(peer, bank.policy)


def slow_driver(monkeypatch: pytest.MonkeyPatch, per_batch_s: float) -> None:
    """The driver computes its own lists in batches of 4 elements, each taking ``per_batch_s``
    (an honest primary on a slow or loaded machine, for any list size)."""
    real = setalign_module._hashed

    def slow(group: Any, batches: Any, size: int) -> Iterator[Any]:
        for item in real(group, batches, size):
            time.sleep(per_batch_s)
            yield item

    monkeypatch.setattr(setalign_module, "_hashed", slow)
    monkeypatch.setattr(SetAlignmentDriver, "_batch", lambda self, c: 4)


POLICY = dict(session_ttl_s=0.8, max_set_sessions=10, max_message_work_s=1.0)


@pytest.mark.parametrize("method", ["psu", "psi"])
def test_an_honest_driver_slower_than_the_idle_expiry_finishes(
        connect: Connect, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    bank = new_bank(tmp_path, PartyPolicy(**POLICY))  # type: ignore[arg-type]
    ch = connect(bank)["primary"]
    slow_driver(monkeypatch, per_batch_s=0.2)  # 10 batches: 2 s, over twice the idle time
    started = time.monotonic()
    driver = SetAlignmentDriver(keys(MINE), ch, G)
    out = (driver.psu("bank", new_session_name("psu")) if method == "psu"
           else driver.psi("bank", new_session_name("psi"), reveal="both"))
    assert time.monotonic() - started > 2 * POLICY["session_ttl_s"]
    assert out.sizes["intersection"] == 20  # the plaintext answer
    assert used(bank) == (1, len(MINE))  # one session, its elements
    # the peer's policy, as its round 1 stated it, for the run's ledger
    assert out.limits["guess_limit"] == bank.policy.dictionary_limit
    assert out.limits["idle_s"] == POLICY["session_ttl_s"]


def test_without_keepalive_it_expires_is_told_so_and_keeps_its_allowance(
        connect: Connect, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bank = new_bank(tmp_path, PartyPolicy(**POLICY))  # type: ignore[arg-type]
    ch = connect(bank)
    slow_driver(monkeypatch, per_batch_s=0.2)
    monkeypatch.setattr(SetAlignmentDriver, "_tick", lambda self, stream, n: None)
    with pytest.raises(ProtocolError) as info:  # an older driver: no SetProgress
        SetAlignmentDriver(keys(MINE), ch["primary"], G).psu("bank", new_session_name("psu"))
    text = str(info.value)
    assert "expired" in text and "policy.session_ttl_s" in text and "session.ended" in text
    assert "state 'new'" not in text
    # its allowance came back: it expired before anything of the bank's set left
    assert used(bank) == (0, 0)
    monkeypatch.undo()
    SetAlignmentDriver(keys(MINE), ch["primary"], G).psu("bank", new_session_name("psu"))
    assert used(bank) == (1, len(MINE))


def test_guesses_are_bounded_in_elements_per_peer(connect: Connect, tmp_path: Path) -> None:
    bank = new_bank(tmp_path, PartyPolicy(max_set_guesses=60, max_set_sessions=100))
    ch = connect(bank)
    assert bank.policy.dictionary_limit == 60
    SetAlignmentDriver(keys(MINE), ch["primary"], G).psi("bank", new_session_name("psi"))
    with pytest.raises(PolicyViolation) as info:  # 40 + 40 elements: over 60
        SetAlignmentDriver(keys(MINE), ch["primary"], G).psu("bank", new_session_name("psu"))
    assert "limit.set-guesses" in str(info.value) and "policy.max_set_guesses" in str(info.value)
    assert SetAlignmentDriver(keys(MINE[:20]), ch["primary"], G).psu(
        "bank", new_session_name("psu")).sizes["intersection"] == 20  # within: 60
    # another peer's allowance is its own
    SetAlignmentDriver(keys(MINE), ch["primary2"], G).psi("bank", new_session_name("psi"))
    assert used(bank, "primary") == (2, 60) and used(bank, "primary2") == (1, 40)


def _round1(ch: Any, session: str, n_a: int = 40) -> int:
    reply = ch.request("bank", PsuRound1(session=session, group=G.name, n_a=n_a,
                                         chunk_rows=100), Ack)
    return int(reply.info["chunk_rows"])


def test_a_session_that_revealed_or_was_refused_keeps_counting(
        connect: Connect, tmp_path: Path) -> None:
    bank = new_bank(tmp_path, PartyPolicy(session_ttl_s=0.5, max_set_sessions=10))
    ch = connect(bank)["primary"]
    e = setalign_module.psu.PsuExponents.draw(G)
    mine = G.power(G.hash_to_group(keys(MINE)), e.first)
    # one that got the bank's blinded set (it can count the intersection), then stopped
    got = new_session_name("psu")
    _round1(ch, got)
    ch.call("bank", PsuChunk(session=got, stream="a_s1", index=0, total=40, elements=mine))
    ch.request("bank", PsuFetch(session=got, stream="a_s1t1", index=0), SetChunk)
    ch.request("bank", PsuFetch(session=got, stream="p_t1", index=0), SetChunk)
    # one whose chunk was refused (not group elements)
    bad = new_session_name("psu")
    _round1(ch, bad)
    with pytest.raises(VflinkError):
        ch.call("bank", PsuChunk(session=bad, stream="a_s1", index=0, total=40,
                                 elements=np.full((40, 32), 255, dtype=np.uint8)))
    time.sleep(0.7)
    _round1(ch, new_session_name("psu"))  # expires the first; the second ended at once
    assert used(bank) == (3, 120)


def test_our_own_failure_gives_the_allowance_back(connect: Connect, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    bank = new_bank(tmp_path, PartyPolicy())

    def broken(self: Any, group: Any, size: int) -> Iterator[Any]:
        raise OSError("the bank's disk failed")
        yield  # pragma: no cover

    ch = connect(bank)["primary"]
    monkeypatch.setattr(SecondaryParty, "_own_hashed", broken)
    with pytest.raises(VflinkError, match="internal"):
        _round1(ch, new_session_name("psu"))
    assert used(bank) == (0, 0)


def test_a_restart_gives_back_what_a_killed_process_had_not_revealed(tmp_path: Path) -> None:
    now = time.time()
    (tmp_path / "_set-sessions.json").write_text(json.dumps({"version": 2, "peers": {
        "primary": [
            {"t": now, "session": "psu@1", "elements": 40, "revealed": True,
             "owner": "999999999 1"},
            {"t": now, "session": "psu@2", "elements": 40, "revealed": False,
             "owner": "999999999 1"}],  # a process that is gone, cut off before its answer
        "primary2": [now - 10.0]}}))  # a record of version 1: a session, its size unknown
    bank = new_bank(tmp_path, PartyPolicy())
    assert used(bank, "primary") == (1, 40)
    assert used(bank, "primary2") == (1, bank.policy.max_set_elements)
