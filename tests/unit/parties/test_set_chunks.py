"""PSU and PSI streamed in chunks: results equal to one chunk per list, whatever
the chunk size; bucket files removed when a session finishes or fails."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vflink.alignment import proofs
from vflink.alignment._dh import key_bytes
from vflink.alignment.groups import get_group
from vflink.data import PartySchema, PartyTable
from vflink.errors import ProtocolError
from vflink.parties import SecondaryParty
from vflink.parties.setalign import KeyBatches, SetAlignment, SetAlignmentDriver
from vflink.protocol import Message
from vflink.protocol.messages import PsiChunk, PsiRound1
from vflink.transport import InProcessHub, Transcript
from vflink.transport.grpc import GrpcChannel, GrpcServer, TlsConfig, create_dev_pki
from vflink.transport.grpc.channel import PeerAddress

GROUP = get_group("ristretto255", workers=1)
COMMITMENT = proofs.commit(GROUP, GROUP.random_exponent())[0].tobytes()


def table(ids: list[str]) -> PartyTable:
    return PartyTable(PartySchema(name="bank", role="secondary", key=("id",)),
                      pd.DataFrame({"id": ids}), "bank.csv")


class _Proxy:
    """The served bank: its party changes with every example."""

    target: Any = None

    def handle(self, sender: str, message: Message) -> Message:
        return self.target.handle(sender, message)  # type: ignore[no-any-return]


_GRPC: dict[str, Any] = {}


@pytest.fixture(scope="module")
def grpc_bank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A gRPC server for "bank" on loopback (mutual TLS) and the primary's channel."""
    pki = tmp_path_factory.mktemp("chunks-pki")
    create_dev_pki(pki, ["primary", "bank"])
    proxy = _Proxy()
    server = GrpcServer("bank", proxy, "127.0.0.1:0", TlsConfig.for_party(pki, "bank"),
                        {"primary", "bank"}).start()
    channel = GrpcChannel("primary", {"bank": PeerAddress("127.0.0.1", server.port)},
                          TlsConfig.for_party(pki, "primary"), deadline_s=60)
    _GRPC.update(proxy=proxy, channel=channel)
    yield
    _GRPC.clear()
    channel.close()
    server.stop(grace=None)


def run(a: list[str], p: list[str], method: str, chunk: int, reveal: str = "both",
        tmp: Path | None = None, transport: str = "inprocess",
        transcript: Transcript | None = None) -> tuple[SetAlignment, SetAlignment | None]:
    hub = InProcessHub(transcript=transcript)
    peer = SecondaryParty(table(p), hub.channel("bank"), out_dir=tmp)
    hub.register("bank", peer)
    channel = hub.channel("primary")
    if transport == "grpc":
        _GRPC["proxy"].target = peer
        channel = _GRPC["channel"]
    keys = key_bytes(pd.DataFrame({"id": a}), ["id"])
    driver = SetAlignmentDriver(keys, channel, GROUP, chunk_rows=chunk,
                                tmp_dir=None if tmp is None else tmp / "driver")
    out = driver.psu("bank", "s@1") if method == "psu" else driver.psi("bank", "s@1", reveal)
    return out, peer.set_alignment("s@1")


def pairs(mine: SetAlignment, theirs: SetAlignment | None) -> set[tuple[int, int]]:
    """(primary row, secondary row) pairs sharing a UID: what an alignment is made of."""
    assert theirs is not None
    by_uid = {bytes(u): int(r) for r, u in zip(theirs.rows, theirs.uids, strict=True)}
    return {(int(r), by_uid[bytes(u)]) for r, u in zip(mine.rows, mine.uids, strict=True)
            if bytes(u) in by_uid}


ids = st.lists(st.integers(0, 40).map(lambda i: f"id{i}"), max_size=25, unique=True)
#: a primary aligns at least one record (a peer's n_a must be positive)
primary_ids = st.lists(st.integers(0, 40).map(lambda i: f"id{i}"), min_size=1, max_size=25,
                       unique=True)


@pytest.mark.network
@pytest.mark.parametrize("transport", ["inprocess", "grpc"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=primary_ids, p=ids, chunk=st.integers(1, 9),
       method=st.sampled_from(["psu", "psi"]))
def test_chunked_equals_one_chunk(grpc_bank: None, transport: str, a: list[str],
                                  p: list[str], chunk: int, method: str) -> None:
    whole, whole_p = run(a, p, method, 10**5, transport=transport)
    part, part_p = run(a, p, method, chunk, transport=transport)
    assert whole.sizes == part.sizes and whole.size == part.size
    assert np.array_equal(whole.rows, part.rows)
    assert whole_p is not None and part_p is not None
    assert np.array_equal(whole_p.rows, part_p.rows)
    assert pairs(whole, whole_p) == pairs(part, part_p)
    # the plaintext oracle
    common = {(a.index(k), p.index(k)) for k in set(a) & set(p)}
    assert pairs(part, part_p) == common
    if method == "psu":  # U sorted, each record's index in U, the same for both parties
        assert part.union is not None and part.uid_index is not None
        assert len(part.union) == len(set(a) | set(p))
        assert np.array_equal(part.union[part.uid_index], part.uids)
        assert part_p.union is not None and np.array_equal(part.union, part_p.union)


def test_no_message_holds_more_than_a_chunk() -> None:
    """Every list crosses in chunks of at most ``chunk_rows`` elements, in both directions."""
    transcript = Transcript()
    a, p = [f"k{i}" for i in range(0, 23)], [f"k{i}" for i in range(11, 40)]
    for method in ("psu", "psi"):
        run(a, p, method, 4, transcript=transcript)
    sizes = [len(v) for r in transcript.records for v in vars(r.message).values()
             if isinstance(v, np.ndarray)]
    assert sizes and max(sizes) == 4
    assert sum(1 for r in transcript.records if r.message.kind == "psu_chunk") >= 5 * 6


@pytest.mark.parametrize("reveal", ["primary", "secondary", "cardinality"])
def test_chunked_psi_reveals_as_before(reveal: str) -> None:
    a, p = [f"k{i}" for i in range(0, 30)], [f"k{i}" for i in range(20, 45)]
    out, theirs = run(a, p, "psi", 4, reveal)
    assert out.size == 10 and theirs is not None
    assert out.known == (reveal == "primary") and theirs.known == (reveal == "secondary")
    if out.known:
        assert list(out.rows) == list(range(20, 30))
    if theirs.known:
        assert list(theirs.rows) == list(range(0, 10))


def test_keys_read_in_batches_give_the_same_result(tmp_path: Path) -> None:
    a, p = [f"k{i}" for i in range(50)], [f"k{i}" for i in range(25, 60)]
    keys = key_bytes(pd.DataFrame({"id": a}), ["id"])
    batches = KeyBatches(len(keys), lambda size: (keys[i:i + 7] for i in range(0, 50, 7)))
    hub = InProcessHub()
    hub.register("bank", SecondaryParty(table(p), hub.channel("bank")))
    out = SetAlignmentDriver(batches, hub.channel("primary"), GROUP, chunk_rows=5).psi(
        "bank", "s@2")
    assert list(out.rows) == list(range(25, 50))


def test_bucket_files_are_removed_when_a_session_finishes_or_fails(tmp_path: Path) -> None:
    out, theirs = run([f"k{i}" for i in range(20)], [f"k{i}" for i in range(10, 30)], "psu",
                      3, tmp=tmp_path)
    assert theirs is not None and out.sizes["union"] == 30
    assert list((tmp_path / ".set-tmp").iterdir()) == []  # the secondary's
    assert list((tmp_path / "driver").iterdir()) == []  # the primary's
    # a chunk whose contents fail: the session's files go, and the session is over
    hub = InProcessHub()
    peer = SecondaryParty(table([f"k{i}" for i in range(10)]), hub.channel("bank"),
                          out_dir=tmp_path / "b")
    hub.register("bank", peer)
    ch = hub.channel("primary")
    ch.call("bank", PsiRound1(session="f@1", group=GROUP.name, reveal="both", n_a=4,
                              chunk_rows=2, commitment=COMMITMENT))
    assert len(list((tmp_path / "b" / ".set-tmp").iterdir())) == 1
    ch.call("bank", PsiChunk(session="f@1", stream="a_s", index=0, total=4,
                             elements=GROUP.hash_to_group([b"a", b"b"])))
    bad = np.full((2, 32), 255, dtype=np.uint8)  # not encodings of group elements
    with pytest.raises(ProtocolError):
        ch.call("bank", PsiChunk(session="f@1", stream="a_s", index=1, total=4, elements=bad))
    assert list((tmp_path / "b" / ".set-tmp").iterdir()) == []
    # the failed session is gone at once (it holds none of the peer's share of sessions)
    assert peer.sessions.get("psi", "f@1") is None
    # ... and its opener is told why, not that its chunk does not fit a fresh session
    with pytest.raises(ProtocolError, match=r"'f@1' failed earlier and ended.*session\.ended"):
        ch.call("bank", PsiChunk(session="f@1", stream="a_s", index=1, total=4,
                                 elements=GROUP.hash_to_group([b"c", b"d"])))
    # and the primary's files go when its peer fails it
    hub2 = InProcessHub()
    hub2.register("bank", SecondaryParty(table(["x"]), hub2.channel("bank")))
    driver = SetAlignmentDriver([b"y", b"z"], hub2.channel("primary"), GROUP, chunk_rows=1,
                                tmp_dir=tmp_path / "d2")
    hub2.channel("primary").call("bank", PsiRound1(session="taken@1", group=GROUP.name,
                                                   reveal="both", n_a=1, chunk_rows=1,
                                                   commitment=COMMITMENT))
    with pytest.raises(ProtocolError):
        driver.psi("bank", "taken@1")  # the name is another session's: refused mid-way
    assert list((tmp_path / "d2").iterdir()) == []
