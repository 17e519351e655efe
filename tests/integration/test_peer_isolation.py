"""Peers that can neither out-guess nor crowd out each other, against a real `vflink serve`.

A secondary is served to two honest primaries and one hostile peer, each with its own issued
certificate (tests/helpers/hostile.py). Each case the hostile tester reported is re-run here:

* PSU's dictionary and substitution attacks tell held from unheld guesses no better than
  chance (the list they needed in line 11 is refused); PSI rows outside the intersection are
  refused without a proof; set sizes that are not positive or over policy are refused;
* a second peer is served within seconds while the first abandons sessions, holds streams
  that trickle, and sends maximal chunks; a finished alignment survives other peers' runs and
  a restart; the spools of a killed process are gone after a restart; a budget reset while the
  service runs is refused.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from tests.helpers.hostile import (
    Tenancy,
    abandon_sessions,
    expected_run,
    honest_run,
    keys,
    maximal_chunk,
    out_of_policy_sizes,
    psi_forged_rows,
    psu_dictionary,
    setup_bottom,
    tenancy,
    trickle,
)
from vflink.alignment.groups import get_group
from vflink.cli.main import main
from vflink.errors import PeerUnavailable, PolicyViolation, ProtocolError, VflinkError
from vflink.parties.setalign import SetAlignmentDriver
from vflink.protocol import Ack, AlignmentView, FetchAlignment
from vflink.protocol.messages import PsuChunk, PsuRound1
from vflink.protocol.sessions import new_session_name

pytestmark = pytest.mark.network

@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenancy]:
    with tenancy(tmp_path_factory.mktemp("isolation")) as t:
        yield t


def test_psu_guesses_tell_nothing_and_psi_rows_need_their_proof(served: Tenancy) -> None:
    held, unheld = served.ids[:10], [f"NOBODY{i}" for i in range(10)]
    with served.channel("hostile") as ch:
        says = psu_dictionary(served, ch, held + unheld)
        # no better than chance: the attack calls held and unheld guesses alike
        assert [says[g] for g in held] == [says[g] for g in unheld]
        err = psi_forged_rows(served, ch, held + unheld)
        assert isinstance(err, ProtocolError) and "proof.invalid" in str(err)
        for err in out_of_policy_sizes(served, ch):
            assert isinstance(err, (ProtocolError, PolicyViolation))
            assert "set.size" in str(err) or "limit.set-elements" in str(err)
    # the honest primaries' results are the plaintext oracle's
    for who in ("primary", "primary2"):
        got = honest_run(served, who, 40)
        want = expected_run(served, who, 40)
        assert {k: got[k] for k in want} == want
    served.alive()


@pytest.mark.slow
def test_abandoned_sessions_lock_out_only_their_own_peer(served: Tenancy) -> None:
    quota = int(served.policy["max_sessions"])
    time.sleep(float(served.policy["session_ttl_s"]) + 1.0)  # earlier tests' sessions expire
    with served.channel("hostile") as ch:
        assert abandon_sessions(served, ch, quota + 3) == quota  # its own share, no more
        # its training setup is not a set session: still served
        assert isinstance(setup_bottom(ch), Ack)
        # ... and another peer is served at once
        served.alive("primary2", within=3.0)
        got = honest_run(served, "primary2", 30)
        assert {k: got[k] for k in ("rows", "theirs")} == \
            {k: v for k, v in expected_run(served, "primary2", 30).items()
             if k in ("rows", "theirs")}
        # the abandoned sessions expire after the policy's idle time (minutes by default)
        time.sleep(float(served.policy["session_ttl_s"]) + 1.0)
        assert abandon_sessions(served, ch, 1) == 1
    assert "limit.sessions" in served.log()


def test_trickling_streams_hold_only_the_hostile_share_and_are_cut_off(
        served: Tenancy) -> None:
    spent: list[float] = []
    done = threading.Event()

    def other_peer() -> None:
        while not done.is_set():
            spent.append(served.alive("primary", within=5.0))
            time.sleep(0.2)

    watcher = threading.Thread(target=other_peer)
    watcher.start()
    try:
        started = time.monotonic()
        codes = trickle(served, streams=8, hold_s=60.0)
        cut_after = time.monotonic() - started
    finally:
        done.set()
        watcher.join(20)
    # none held the party long: cut off at the receive timeout, or refused at once as busy
    assert cut_after < 30.0, cut_after
    assert all(c is not None for c in codes), codes
    assert len(spent) >= 3 and max(spent) < 5.0
    with served.channel("hostile", deadline_s=5) as ch:  # its share is free again
        assert isinstance(setup_bottom(ch), Ack)
    deadline = time.monotonic() + 10  # the server logs once its handler thread has ended
    while "did not arrive at the minimum rate" not in served.log():
        assert time.monotonic() < deadline, "the cut-off streams were not logged"
        time.sleep(0.2)


def test_a_maximal_chunk_does_not_starve_another_peer(served: Tenancy) -> None:
    result: dict[str, object] = {}

    def hostile() -> None:
        with served.channel("hostile", deadline_s=120) as ch:
            result["reply"] = maximal_chunk(served, ch)

    worker = threading.Thread(target=hostile)
    worker.start()
    try:
        spent = []
        while worker.is_alive() and len(spent) < 10:
            # calls with 5 s deadlines (the reported case): each served within it
            spent.append(served.alive("primary2", within=5.0))
            time.sleep(0.1)
    finally:
        worker.join(180)
    assert isinstance(result["reply"], Ack), result["reply"]
    assert spent and max(spent) < 5.0


@pytest.mark.slow
def test_a_finished_alignment_survives_other_peers_runs_and_a_restart(served: Tenancy) -> None:
    g = get_group("ristretto255", workers=1)
    mine = served.ids[:25] + [f"MINE{i}" for i in range(5)]
    session = new_session_name("psi")
    with served.channel("primary") as ch:
        SetAlignmentDriver(keys(mine), ch, g).psi("secondary", session, reveal="both")
    # another peer runs many short PSIs: more than any peer's finished share
    with served.channel("primary2") as ch:
        for _ in range(2 * int(served.policy["max_finished_sessions"]) + 2):
            SetAlignmentDriver(keys(served.ids[:3]), ch, g).psi(
                "secondary", new_session_name("psi"), reveal="both")
    for restart in (False, True):
        if restart:
            served.stop()
            served.start()
        # the other peer first: after a restart nothing of the owner's is in memory yet
        with served.channel("primary2") as ch:  # only to the peer that ran it
            with pytest.raises((PolicyViolation, ProtocolError)):
                ch.call("secondary", FetchAlignment(session=session))
            # nor can another peer open a session under its name, before or after a restart
            # (it would shadow the owner's result until the next restart)
            with pytest.raises(VflinkError, match=r"session\.(bound|finished)"):
                SetAlignmentDriver(keys(served.ids[:3]), ch, g).psi(
                    "secondary", session, reveal="cardinality")
        with served.channel("primary") as ch:
            view = ch.request("secondary", FetchAlignment(session=session), AlignmentView)
            assert sorted(view.secondary_index) == list(range(25))


@pytest.mark.slow
def test_the_spools_of_a_killed_process_are_gone_after_a_restart(served: Tenancy) -> None:
    g = get_group("ristretto255", workers=1)
    with served.channel("hostile") as ch:
        session = new_session_name("psu")
        reply = ch.request("secondary", PsuRound1(session=session, group=g.name, n_a=40,
                                                  chunk_rows=40), Ack)
        ch.call("secondary", PsuChunk(session=session, stream="a_s1", index=0, total=40,
                                      elements=g.hash_to_group(keys([f"k{i}" for i in
                                                                     range(40)]))))
        assert reply.info["n_p"] == len(served.ids)
    spool = served.state / ".set-tmp"
    left = [p for p in spool.iterdir() if p.name.startswith("vflink-set-")]
    assert left
    hashed = [bytes(h) for h in g.hash_to_group(keys(served.ids))]
    for path in spool.rglob("*"):  # keyed at rest: no unblinded hash of the party's IDs
        if path.is_file():
            data = path.read_bytes()
            assert not any(h in data for h in hashed), path
    served.kill()
    assert all(p.exists() for p in left)  # kill -9 runs no clean-up
    served.start()
    assert not any(p.exists() for p in left)
    served.alive()


def test_a_budget_reset_is_refused_while_the_service_runs(
        served: Tenancy, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["privacy-budget", "--party-file", str(served.party_file), "--reset",
                 "--yes-i-understand"])
    assert code == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "running `vflink serve`" in said, said


def test_busy_is_per_peer(served: Tenancy) -> None:
    """Beyond its share a peer is told it is busy, while the others are served."""
    with served.channel("hostile", deadline_s=60) as ch:
        errors: list[object] = []

        def hold() -> None:
            try:
                maximal_chunk(served, ch)
            except PeerUnavailable as exc:
                errors.append(exc)

        workers = [threading.Thread(target=hold) for _ in range(4)]
        for w in workers:
            w.start()
        served.alive("primary", within=5.0)
        for w in workers:
            w.join(240)
    assert "its share" in served.log()
