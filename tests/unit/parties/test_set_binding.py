"""PSU and PSI bound to what the secondary has seen, against a hostile primary that speaks the
protocol's messages itself (the attacks reported against the served secondary):

* the dictionary attack (dummies in round 1, guessed IDs in line 11) and the substitution
  attack (own records swapped between round 1 and line 11) find no line 11 to send: the
  secondary raises the round-1 list it holds, so guesses it was not sent tell held from unheld
  no better than chance;
* what a primary that deviates in line 8 still learns is about its round-1 list only (the
  threat model in docs/security.md says so; this test keeps it honest);
* a PSI primary cannot add a row to the secondary's intersection: its ``p_ts`` carries a proof
  over the elements that match, against the exponent committed in round 1.

Also: nothing the parties spool on disk is an unkeyed hash of a record's key, and a session's
disk stays within what it reserved.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vflink.alignment import proofs, psu
from vflink.alignment._dh import key_bytes, lookup, secure_permutation, sorted_unique
from vflink.alignment.groups import get_group
from vflink.data import PartySchema, PartyTable
from vflink.errors import PolicyViolation, ProtocolError
from vflink.parties import SecondaryParty
from vflink.parties.policy import PartyPolicy
from vflink.parties.setalign import SetAlignmentDriver, spool_bytes
from vflink.protocol import Ack
from vflink.protocol.channel import Channel
from vflink.protocol.messages import (
    Message,
    PsiChunk,
    PsiFetch,
    PsiRound1,
    PsuChunk,
    PsuFetch,
    PsuRound1,
    SetChunk,
)
from vflink.protocol.sessions import new_session_name
from vflink.transport import InProcessHub

G = get_group("ristretto255", workers=1)
HELD = [f"held{i}" for i in range(10)]
BANK = HELD + [f"bank{i}" for i in range(30)]
UNHELD = [f"nobody{i}" for i in range(10)]


def keys(ids: list[str]) -> list[bytes]:
    return key_bytes(pd.DataFrame({"id": ids}), ("id",), who="test")


def bank(tmp: Path | None = None, policy: PartyPolicy | None = None
         ) -> tuple[SecondaryParty, Channel]:
    hub = InProcessHub()
    table = PartyTable(PartySchema(name="bank", role="secondary", key=("id",)),
                       pd.DataFrame({"id": BANK}), "bank.csv")
    party = SecondaryParty(table, hub.channel("bank"), out_dir=tmp, policy=policy)
    hub.register("bank", party)
    return party, hub.channel("primary")


def fetch_all(ch: Channel, kind: type[PsuFetch] | type[PsiFetch], session: str, stream: str,
              total: int, chunk: int) -> np.ndarray:
    parts = []
    for index in range(max(1, -(-total // chunk))):
        reply = ch.request("bank", kind(session=session, stream=stream, index=index), SetChunk)
        parts.append(reply.elements)
    return np.concatenate(parts) if parts else G.empty()


def up(ch: Channel, kind: type[PsuChunk] | type[PsiChunk], session: str, stream: str,
       elements: np.ndarray, chunk: int, **last: bytes) -> Message:
    reply: Message = Ack()
    for i, lo in enumerate(range(0, len(elements), chunk)):
        extra = last if lo + chunk >= len(elements) else {}
        reply = ch.call("bank", kind(session=session, stream=stream, index=i,
                                     total=len(elements), elements=elements[lo:lo + chunk],
                                     **extra))
    return reply


def test_no_list_of_the_primarys_choosing_is_raised_in_line_11() -> None:
    """The reported attacks: dummies in round 1 and guesses (or own records left out of round
    1) as a_s2, with equal lengths; there is no a_s2 any more, at any point of the session."""
    _, ch = bank()
    session = new_session_name("psu")
    dummies = G.hash_to_group(keys([f"dummy{i}" for i in range(20)]))
    guesses = G.hash_to_group(keys(HELD + UNHELD))
    e = psu.PsuExponents.draw(G)
    r1 = ch.request("bank", PsuRound1(session=session, group=G.name, n_a=20, chunk_rows=50), Ack)
    n_p, c = int(r1.info["n_p"]), int(r1.info["chunk_rows"])
    for stream, state in (("a_s2", "a_s1"),):
        with pytest.raises(ProtocolError, match=rf"state '{state}'.*psu_chunk refused"):
            up(ch, PsuChunk, session, stream, G.power(guesses, e.second), c)
    up(ch, PsuChunk, session, "a_s1", G.power(dummies, e.first), c)
    a_s1t1 = fetch_all(ch, PsuFetch, session, "a_s1t1", 20, c)
    p_s1t1 = G.power(fetch_all(ch, PsuFetch, session, "p_t1", n_p, c), e.first)
    up(ch, PsuChunk, session, "p_s1t1", p_s1t1, c)
    union = sorted_unique(np.concatenate([a_s1t1, p_s1t1]))
    up(ch, PsuChunk, session, "union_s123t1", G.power(union, G.combine(e.second, e.third)), c)
    for a_s2 in (G.power(guesses, e.second), G.power(guesses[:20], e.second)):
        with pytest.raises(ProtocolError, match=r"psu_chunk refused.*session.state"):
            up(ch, PsuChunk, session, "a_s2", a_s2, c)
    # what comes back for line 11 is the round-1 list (the dummies), nothing else: none of
    # the guesses, held or not, has a final value in U
    u = fetch_all(ch, PsuFetch, session, "union", len(union), c)
    finals = psu.line11_finish(G, fetch_all(ch, PsuFetch, session, "a_s1t123", 20, c), e)
    assert (lookup(sorted_unique(u), finals, "dummies") >= 0).all()
    tried = G.power(guesses, G.combine(e.first, e.second, e.third))  # its best guess at them
    assert not (lookup(sorted_unique(u), tried, "guesses", missing_ok=True) >= 0).any()


def _tagging_attack(ch: Channel, committed: list[str]) -> dict[str, bool]:
    """A primary that deviates in line 8: it raises the union elements it knows are shared
    (it merged them) to an extra exponent, and recognises its own tagged finals in U."""
    session = new_session_name("psu")
    e = psu.PsuExponents.draw(G)
    tag = G.random_exponent()
    x = G.hash_to_group(keys(committed))
    order = secure_permutation(len(x))
    r1 = ch.request("bank", PsuRound1(session=session, group=G.name, n_a=len(x),
                                      chunk_rows=1000), Ack)
    n_p, c = int(r1.info["n_p"]), int(r1.info["chunk_rows"])
    up(ch, PsuChunk, session, "a_s1", G.power(x[order], e.first), c)
    a_s1t1 = fetch_all(ch, PsuFetch, session, "a_s1t1", len(x), c)
    p_s1t1 = G.power(fetch_all(ch, PsuFetch, session, "p_t1", n_p, c), e.first)
    up(ch, PsuChunk, session, "p_s1t1", p_s1t1, c)
    shared = lookup(sorted_unique(p_s1t1), a_s1t1, "shared", missing_ok=True) >= 0
    k = G.combine(e.second, e.third)
    union = np.concatenate([G.power(a_s1t1[~shared], k), G.power(a_s1t1[shared], k * tag),
                            G.power(p_s1t1, k)])
    up(ch, PsuChunk, session, "union_s123t1", union, c)
    u = sorted_unique(fetch_all(ch, PsuFetch, session, "union", len(union), c))
    finals = psu.line11_finish(G, fetch_all(ch, PsuFetch, session, "a_s1t123", len(x), c), e)
    hit = lookup(u, G.power(finals, tag), "tagged", missing_ok=True) >= 0
    back = G.power(fetch_all(ch, PsuFetch, session, "p_t2", n_p, c),
                   G.combine(e.first, e.second, e.third))
    up(ch, PsuChunk, session, "p_s123t2", back, c)  # the secondary finishes: not detected
    return {committed[order[i]]: bool(hit[i]) for i in range(len(x))}


def test_a_primary_deviating_in_line_8_learns_only_about_its_round_1_list() -> None:
    """The residual of the threat model (docs/security.md): against a malicious primary, PSU
    protects IDs it did not commit to in round 1, not those it did (bounded per peer by
    policy.max_set_elements and policy.max_set_sessions)."""
    _, ch = bank()
    learnt = _tagging_attack(ch, [f"dummy{i}" for i in range(20)])
    assert not any(learnt.values())  # nothing about HELD or UNHELD: they were not committed
    learnt = _tagging_attack(ch, HELD + UNHELD)
    assert {k for k, v in learnt.items() if v} == set(HELD)  # its committed set: learnt


def _psi_until_p_ts(ch: Channel, mine: list[str], a: int
                    ) -> tuple[str, np.ndarray, np.ndarray, np.ndarray, int]:
    session = new_session_name("psi")
    r1 = ch.request("bank", PsiRound1(session=session, group=G.name, reveal="both",
                                      n_a=len(mine), chunk_rows=1000,
                                      commitment=proofs.commit(G, a)[0].tobytes()), Ack)
    c = int(r1.info["chunk_rows"])
    up(ch, PsiChunk, session, "a_s", G.power(G.hash_to_group(keys(mine)), a), c)
    a_st = fetch_all(ch, PsiFetch, session, "a_st", len(mine), c)
    p_t = fetch_all(ch, PsiFetch, session, "p_t", int(r1.info["n_p"]), c)
    return session, a_st, p_t, G.power(p_t, a), c


def test_a_psi_primary_cannot_add_a_row_to_the_secondarys_intersection(tmp_path: Path
                                                                       ) -> None:
    party, ch = bank(tmp_path)
    a = G.random_exponent()
    mine = HELD[:5] + UNHELD
    # forged: positions outside the intersection answered with elements of a_st
    session, a_st, p_t, p_ts, c = _psi_until_p_ts(ch, mine, a)
    matched = lookup(sorted_unique(a_st), p_ts, "m", missing_ok=True) >= 0
    forged = p_ts.copy()
    outside = np.flatnonzero(~matched)[:3]
    forged[outside] = a_st[-3:]  # the UIDs of three unheld guesses
    for proof in (b"",  # none: refused
                  proofs.prove(G, a, p_t[matched | np.isin(np.arange(len(p_t)), outside)],
                               forged[matched | np.isin(np.arange(len(p_t)), outside)],
                               ctx=proofs.context(session, "p_ts", -1)),
                  proofs.prove(G, a, p_t[matched], p_ts[matched],  # the honest part only
                               ctx=proofs.context(session, "p_ts", -1))):
        with pytest.raises(ProtocolError, match="proof.invalid"):
            up(ch, PsiChunk, session, "p_ts", forged, c, proof=proof)
        assert party.set_alignment(session) is None  # no result, no rows
        session, a_st, p_t, p_ts, c = _psi_until_p_ts(ch, mine, a)
        matched = lookup(sorted_unique(a_st), p_ts, "m", missing_ok=True) >= 0
        forged = p_ts.copy()
        outside = np.flatnonzero(~matched)[:3]
        forged[outside] = a_st[-3:]
    # a proof replayed from another session is refused too
    replayed = proofs.prove(G, a, p_t[matched], p_ts[matched],
                            ctx=proofs.context("psi@other", "p_ts", -1))
    with pytest.raises(ProtocolError, match="proof.invalid"):
        up(ch, PsiChunk, session, "p_ts", p_ts, c, proof=replayed)
    # honest, with the proof over the matching elements: exactly the intersection
    session, a_st, p_t, p_ts, c = _psi_until_p_ts(ch, mine, a)
    matched = lookup(sorted_unique(a_st), p_ts, "m", missing_ok=True) >= 0
    up(ch, PsiChunk, session, "p_ts", p_ts, c, proof=proofs.prove(
        G, a, p_t[matched], p_ts[matched], ctx=proofs.context(session, "p_ts", -1)))
    result = party.set_alignment(session)
    assert result is not None and sorted(result.rows) == list(range(5))
    # withholding matches only shrinks the secondary's rows (as a smaller set would)
    session, a_st, p_t, p_ts, c = _psi_until_p_ts(ch, mine, a)
    random = G.hash_to_group(keys([f"r{i}" for i in range(len(p_ts))]))
    up(ch, PsiChunk, session, "p_ts", random, c, proof=proofs.prove(
        G, a, G.empty(), G.empty(), ctx=proofs.context(session, "p_ts", -1)))
    result = party.set_alignment(session)
    assert result is not None and len(result.rows) == 0


@pytest.mark.parametrize("n_a", [-5, 0, 10**9])
def test_a_set_size_that_is_not_positive_or_over_policy_is_refused(n_a: int) -> None:
    party, ch = bank(policy=PartyPolicy(max_set_elements=1000))
    for message in (PsuRound1(session=new_session_name("psu"), group=G.name, n_a=n_a,
                              chunk_rows=10),
                    PsiRound1(session=new_session_name("psi"), group=G.name, reveal="both",
                              n_a=n_a, chunk_rows=10,
                              commitment=proofs.commit(G, 3)[0].tobytes())):
        with pytest.raises((ProtocolError, PolicyViolation),
                           match=r"set.size|limit.set-elements"):
            ch.call("bank", message)
    assert not party.sessions.sessions()  # nothing left open
    party.policy = PartyPolicy(min_set_elements=5)
    with pytest.raises(PolicyViolation, match="policy.min_set_elements"):
        ch.call("bank", PsuRound1(session=new_session_name("psu"), group=G.name, n_a=4,
                                  chunk_rows=10))


def test_set_sessions_are_counted_per_peer_across_restarts(tmp_path: Path) -> None:
    policy = PartyPolicy(max_set_sessions=3)
    party, ch = bank(tmp_path, policy)
    for _ in range(3):
        SetAlignmentDriver(keys(HELD), ch, G).psi("bank", new_session_name("psi"))
    with pytest.raises(PolicyViolation, match="limit.set-sessions"):
        SetAlignmentDriver(keys(HELD), ch, G).psi("bank", new_session_name("psi"))
    party, ch = bank(tmp_path, policy)  # a restarted party keeps the count
    with pytest.raises(PolicyViolation, match="limit.set-sessions"):
        SetAlignmentDriver(keys(HELD), ch, G).psu("bank", new_session_name("psu"))


class _Scanner:
    """A channel that, after every message, looks at every file the two parties spool: none
    may hold the hash of a record key, and the secondary's spool stays within its reservation."""

    def __init__(self, inner: Channel, roots: list[Path], forbidden: list[bytes],
                 bound: int) -> None:
        self.inner, self.roots, self.forbidden, self.bound = inner, roots, forbidden, bound
        self.peak = 0
        self.scanned = 0

    def call(self, peer: str, message: Message) -> Message:
        reply = self.inner.call(peer, message)
        secondary = 0
        for i, root in enumerate(self.roots):
            for path in root.rglob("*"):
                if path.is_file():
                    data = path.read_bytes()
                    self.scanned += 1
                    assert not any(f in data for f in self.forbidden), path
                    if i == 0:
                        secondary += len(data)
        self.peak = max(self.peak, secondary)
        assert secondary <= self.bound, (secondary, self.bound)
        return reply

    def request(self, peer: str, message: Message, expect: type) -> Message:
        reply = self.call(peer, message)
        assert isinstance(reply, expect)
        return reply


@pytest.mark.parametrize("method", ["psu", "psi"])
def test_spools_hold_no_unkeyed_hash_and_stay_within_the_reservation(
        tmp_path: Path, method: str) -> None:
    party, ch = bank(tmp_path / "bank")
    mine = HELD + UNHELD + [f"primaryonly{i}" for i in range(15)]
    everyone = sorted(set(BANK) | set(mine))
    forbidden = [bytes(h) for h in G.hash_to_group(keys(everyone))]
    forbidden += [k.encode() for k in everyone]
    bound = spool_bytes(method, G.element_bytes, len(mine), len(BANK))
    scan = _Scanner(ch, [tmp_path / "bank" / ".set-tmp", tmp_path / "driver"], forbidden,
                    bound)
    driver = SetAlignmentDriver(keys(mine), scan, G, chunk_rows=4,  # type: ignore[arg-type]
                                tmp_dir=tmp_path / "driver")
    out = driver.psu("bank", new_session_name("psu")) if method == "psu" else \
        driver.psi("bank", new_session_name("psi"))
    assert out.sizes["intersection"] == len(HELD)
    assert scan.scanned > 50 and scan.peak > 0  # files were there to scan
