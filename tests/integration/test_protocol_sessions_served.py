"""Hostile peers that step outside a protocol's script, against real `vflink serve` processes.

A coordinator and a secondary run as `vflink serve` processes on loopback with certificates from
`vflink certs`. The tests play the primary, a second secondary and the coordinator, each with its
own legitimately issued certificate (the secondary lets all three call it, so every refusal
below comes from the protocol sessions, not from the TLS allow-list). After every case the
service still answers a Hello within 1 s.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.helpers.network import free_port, secret_env, start_process, stop_processes
from vflink.alignment._dh import key_bytes
from vflink.alignment.groups import get_group
from vflink.cli.main import main
from vflink.errors import PolicyViolation, ProtocolError, VflinkError
from vflink.models.spec import BottomSpec
from vflink.parties.setalign import SetAlignmentDriver
from vflink.protocol import (
    Ack,
    AlignmentReady,
    AlignmentView,
    Embeddings,
    FetchAlignment,
    FitPreprocessing,
    Forward,
    Hello,
    SetupBottom,
)
from vflink.protocol.messages import PsiChunk, PsuChunk, PsuFetch, PsuRound1
from vflink.protocol.sessions import new_session_name
from vflink.transport.grpc import GrpcChannel, TlsConfig

pytestmark = pytest.mark.network

N = 400
GROUP = get_group("ristretto255")
PARTIES = ("primary", "secondary", "secondary2", "coordinator")


@dataclass
class Served:
    tmp: Path
    certs: Path
    state: Path
    addresses: dict[str, str]
    ids: list[str]

    def channel(self, name: str = "primary") -> GrpcChannel:
        return GrpcChannel(name, self.addresses, TlsConfig.for_party(self.certs, name),
                           deadline_s=30)

    def alive(self, name: str = "primary") -> None:
        """The service answers a Hello within 1 s."""
        with self.channel(name) as ch:
            start = time.monotonic()
            assert isinstance(ch.call("secondary", Hello(party=name, role="primary")), Hello)
            assert time.monotonic() - start < 1.0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("sessions-served")
    certs = tmp / "certs"
    assert main(["certs", "--out", str(certs), "--parties", ",".join(PARTIES)]) == 0
    rng = np.random.default_rng(5)
    ids = [f"CUSTQ{i:05d}" for i in range(N)]
    frame = pd.DataFrame({"id": ids, "name": [f"Ottoline{i} Brackwater" for i in range(N)],
                          "x1": rng.normal(size=N), "x2": rng.normal(size=N)})
    csv = tmp / "secondary.csv"
    frame.to_csv(csv, index=False)
    addresses = {p: f"127.0.0.1:{free_port()}" for p in ("coordinator", "secondary")}
    state = tmp / "state"
    roles = ('roles = { primary = "primary", secondary = "secondary", '
             'secondary2 = "secondary", coordinator = "coordinator" }\n')
    (tmp / "coordinator.toml").write_text(
        f'version = 1\n[party]\nname = "coordinator"\nrole = "coordinator"\n'
        f'listen = "{addresses["coordinator"]}"\n'
        f'[security]\ntls_dir = "{certs}"\nallowed = ["primary", "secondary", "secondary2"]\n'
        + roles)
    (tmp / "secondary.toml").write_text(
        f'version = 1\n[party]\nname = "secondary"\nrole = "secondary"\n'
        f'listen = "{addresses["secondary"]}"\nstate_dir = "{state}"\ndeadline_s = 20\n'
        f'[party.table]\npath = "{csv}"\nkey = ["id"]\nidentifiers = ["name"]\n'
        f'numeric = ["x1", "x2"]\n'
        f'[peers.coordinator]\naddress = "{addresses["coordinator"]}"\nrole = "coordinator"\n'
        f'[security]\ntls_dir = "{certs}"\n'
        f'allowed = ["primary", "secondary2", "coordinator"]\n' + roles)
    procs: list[subprocess.Popen[bytes]] = []
    with secret_env("sessions-served-test-secret-0123456789"):
        try:
            for name in ("coordinator", "secondary"):
                procs.append(start_process(tmp / f"{name}.toml", tmp / f"{name}.log"))
            yield Served(tmp, certs, state, addresses, ids)
        finally:
            stop_processes(procs)


def keys(ids: list[str]) -> list[bytes]:
    return key_bytes(pd.DataFrame({"id": ids}), ("id",), who="test")


def refused(call: object, cls: type[VflinkError] = ProtocolError) -> VflinkError:
    with pytest.raises(VflinkError) as info:
        call()  # type: ignore[operator]
    assert isinstance(info.value, cls), (type(info.value), info.value)
    text = str(info.value)
    assert "CUSTQ" not in text and "Ottoline" not in text and "Traceback" not in text, text
    return info.value


def test_a_secondary_with_no_alignment_serves_no_embeddings(served: Served) -> None:
    # the attack: FitPreprocessing / Forward on a fresh secondary gave embeddings of every row
    with served.channel() as ch:
        ch.request("secondary", SetupBottom(spec=BottomSpec(hidden=(8,), out_dim=4, seed=1)),
                   Ack)
        err = refused(lambda: ch.call("secondary", FitPreprocessing(rows=np.arange(N))))
        assert "session.no-alignment" in str(err)
        err = refused(lambda: ch.call("secondary", Forward(batch_id=1, rows=np.arange(3),
                                                           train=False)))
        assert "training protocol" in str(err) and "forward" in str(err)
    served.alive()


def test_psu_line11_takes_no_list_from_the_primary(served: Served) -> None:
    # the attack: a longer a_s2 than the round-1 set, with guessed IDs, told the primary which
    # guesses the secondary holds (10/10); leaving an own record out of round 1 likewise. Line
    # 11 now raises the round-1 list the secondary holds: no list of the primary's is taken
    own = GROUP.hash_to_group(keys([f"mine{i}" for i in range(10)]))
    guesses = GROUP.hash_to_group(keys(served.ids[:10]))
    session = new_session_name("psu")
    with served.channel() as ch:
        r1 = ch.call("secondary", PsuRound1(session=session, group=GROUP.name, n_a=10,
                                            chunk_rows=1000))
        n_p = int(r1.info["n_p"])  # type: ignore[attr-defined]
        union = np.concatenate([own, GROUP.hash_to_group(keys(served.ids))])
        # lines 3-8, streamed in chunks
        ch.call("secondary", PsuChunk(session=session, stream="a_s1", index=0, total=10,
                                      elements=own))
        for stream in ("a_s1t1", "p_t1"):
            ch.call("secondary", PsuFetch(session=session, stream=stream, index=0))
        ch.call("secondary", PsuChunk(session=session, stream="p_s1t1", index=0, total=n_p,
                                      elements=union[10:10 + n_p]))
        ch.call("secondary", PsuChunk(session=session, stream="union_s123t1", index=0,
                                      total=len(union), elements=union))
        for a_s2 in (np.concatenate([own, guesses]), guesses, own[:9]):
            err = refused(lambda a_s2=a_s2: ch.call("secondary", PsuChunk(
                session=session, stream="a_s2", index=0, total=len(a_s2), elements=a_s2)))
            text = str(err)
            assert "psu protocol" in text and "psu_chunk refused" in text
            assert "session.state" in text
        # an honest run still works (a new session)
        out = SetAlignmentDriver(keys(served.ids[:50] + ["x1", "x2"]), ch, GROUP).psu(
            "secondary", new_session_name("psu"))
        assert out.sizes["intersection"] == 50
    served.alive()


@pytest.mark.slow
def test_a_finished_psi_is_immutable_and_its_rows_go_to_its_primary_only(
        served: Served) -> None:
    session = new_session_name("psi")
    mine = served.ids[:30] + [f"other{i}" for i in range(5)]
    with served.channel() as ch:
        SetAlignmentDriver(keys(mine), ch, GROUP).psi("secondary", session, reveal="both")
        written = served.state / "alignments" / f"{session}.parquet"
        before = written.read_bytes()
        # the attack: replaying PsiRound2 with random points emptied the finished intersection
        # and rewrote its file, silently
        random_points = GROUP.hash_to_group(keys([f"r{i}" for i in range(N)]))
        err = refused(lambda: ch.call("secondary", PsiChunk(
            session=session, stream="p_ts", index=0, total=len(random_points),
            elements=random_points)))
        assert "psi protocol" in str(err) and "immutable" in str(err)
        assert written.read_bytes() == before
        view = ch.request("secondary", FetchAlignment(session=session), AlignmentView)
        assert len(view.secondary_index) == 30
    # the attack: a second secondary or the coordinator fetched that secondary's rows
    for other in ("secondary2", "coordinator"):
        with served.channel(other) as ch:
            refused(lambda ch=ch: ch.call("secondary", FetchAlignment(session=session)),
                    PolicyViolation)
    # the intersection becomes the rows served to its primary, and to nobody else
    with served.channel() as ch:
        ch.request("secondary", AlignmentReady(session=session, coordinator="coordinator"), Ack)
        ch.request("secondary", SetupBottom(spec=BottomSpec(hidden=(8,), out_dim=4, seed=1)),
                   Ack)
        ch.request("secondary", FitPreprocessing(rows=np.asarray(view.secondary_index)), Ack)
        emb = ch.request("secondary", Forward(batch_id=2, rows=np.asarray(
            view.secondary_index[:5]), train=False), Embeddings)
        assert emb.embeddings.shape == (5, 4)
        outside = np.setdiff1d(np.arange(N), view.secondary_index)[:3]
        err = refused(lambda: ch.call("secondary", Forward(batch_id=3, rows=outside,
                                                           train=False)))
        assert "rows.unaligned" in str(err)
    with served.channel("secondary2") as ch:
        refused(lambda: ch.call("secondary", Forward(batch_id=4, rows=np.asarray(
            view.secondary_index[:5]), train=False)), PolicyViolation)
    served.alive()
