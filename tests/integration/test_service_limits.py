"""One request cannot take a served party down, against a real `vflink serve`.

A hostile tester sent one PsuRound1 of 10^7 valid group points: the secondary computed for
minutes and answered nobody else long after the caller gave up. Here the secondary's party file
caps a PSU list at 60,000 elements (``policy.max_set_elements``) and two calls at once
(``policy.max_concurrent_calls``); the tests play the primary. Timings are liveness bounds
only (the machine is shared): a maximal round takes seconds, the bounds are 1-5 s.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.helpers.network import free_port, secret_env, start_process, stop_processes
from vflink.alignment.groups import get_group
from vflink.errors import PeerUnavailable, PolicyViolation
from vflink.protocol import Ack, Health, Hello, Message
from vflink.protocol.messages import PsuChunk, PsuRound1
from vflink.transport.grpc import GrpcChannel, TlsConfig, create_dev_pki

pytestmark = pytest.mark.network

CAP = 60_000


@dataclass
class Served:
    tmp: Path
    certs: Path
    address: str
    proc: subprocess.Popen[bytes]

    def channel(self, deadline_s: float = 60.0) -> GrpcChannel:
        return GrpcChannel("primary", {"secondary": self.address},
                           TlsConfig.for_party(self.certs, "primary"), deadline_s=deadline_s)

    def log(self) -> str:
        """The server's log, its lines unwrapped (the console handler wraps them)."""
        return " ".join((self.tmp / "secondary.log").read_text().split())


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("service")
    certs = tmp / "certs"
    create_dev_pki(certs, ["primary", "secondary"])
    csv = tmp / "secondary.csv"
    pd.DataFrame({"id": [f"r{i}" for i in range(500)], "x": np.arange(500.0)}).to_csv(
        csv, index=False)
    address = f"127.0.0.1:{free_port()}"
    party = tmp / "secondary.toml"
    party.write_text(
        f'version = 1\n[party]\nname = "secondary"\nrole = "secondary"\n'
        f'listen = "{address}"\n'
        f'[party.table]\npath = "{csv}"\nkey = ["id"]\nnumeric = ["x"]\n'
        # never contacted here; a secondary's file must name its coordinator
        f'[peers.coordinator]\naddress = "127.0.0.1:{free_port()}"\nrole = "coordinator"\n'
        f'[security]\ntls_dir = "{certs}"\nallowed = ["primary"]\n'
        f'[policy]\nmax_set_elements = {CAP}\nmax_concurrent_calls = 2\n')
    with secret_env("service-limits-test-secret-0123456789"):
        proc = start_process(party, tmp / "secondary.log")
        try:
            yield Served(tmp, certs, address, proc)
        finally:
            stop_processes([proc])


def points(n: int) -> np.ndarray:
    """``n`` valid ristretto255 elements (repeated: validity and work do not need them
    distinct, and hashing 10^5 keys here would cost the test seconds)."""
    g = get_group("ristretto255", workers=1)
    return np.tile(g.hash_to_group([b"k%d" % i for i in range(1000)]), (-(-n // 1000), 1))[:n]


def timed(call: object) -> tuple[float, object]:
    started = time.monotonic()
    out = call()  # type: ignore[operator]
    return time.monotonic() - started, out


def wait_until(what: str, check: object, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.05)


@pytest.mark.slow
def test_health_is_answered_while_maximal_rounds_run_and_extra_calls_are_busy(
        served: Served) -> None:
    results: dict[str, object] = {}

    def run(name: str, message: Message) -> None:
        with served.channel() as ch:
            try:
                results[name] = ch.call("secondary", message)
            except Exception as exc:  # reported by the asserts below
                results[name] = exc

    chunks = {}
    with served.channel(deadline_s=60) as ch:  # the lists follow in chunks
        for name in ("max1", "max2"):
            reply = ch.request("secondary", PsuRound1(session=name, group="ristretto255",
                                                      n_a=CAP, chunk_rows=CAP), Ack)
            # the party's own work limit decides the largest chunk it takes
            chunks[name] = int(reply.info["chunk_rows"])
            assert 1 <= chunks[name] <= CAP
    bigs = [threading.Thread(target=run, args=(f"psu-{name}", PsuChunk(
        session=name, stream="a_s1", index=0, total=CAP, elements=points(chunks[name]))))
        for name in ("max1", "max2")]
    with served.channel(deadline_s=5) as probe:
        bigs[0].start()
        wait_until("the round is being worked on", lambda: probe.request(
            "secondary", Health(), Ack).info["busy"] == 1.0)
        # a second maximal chunk of the same peer takes the second slot and waits its turn
        bigs[1].start()
        wait_until("both slots are taken", lambda: probe.request(
            "secondary", Health(), Ack).info["active"] >= 2)
        # a third call is refused at once as busy instead of queueing
        spent, _ = timed(lambda: pytest.raises(PeerUnavailable, probe.call, "secondary",
                                               Hello(party="primary", role="primary")))
        assert spent < 1.0, spent
        # health is answered within 1 s, again and again, while the maximal rounds run
        for _ in range(5):
            spent, reply = timed(lambda: probe.request("secondary", Health(), Ack))
            assert spent < 1.0, spent
            assert reply.info["slots"] == 2.0  # type: ignore[attr-defined]
            assert any(b.is_alive() for b in bigs)  # measured while a round ran
            time.sleep(0.1)
    for b in bigs:
        b.join(120)
    # the legitimate maximal chunks both completed
    for name in ("max1", "max2"):
        assert isinstance(results[f"psu-{name}"], Ack), results[f"psu-{name}"]
    assert "calls in progress (its share)" in served.log()


def test_work_for_a_caller_who_gave_up_is_stopped(served: Served) -> None:
    # modp2048 exponentiations cost about 3.6 times the group's declared fastest rate, so the
    # largest chunk the party takes (about 2 s of its own measured work) passes the upfront work
    # check for a 0.5 s deadline (n exponentiations at 1 ms over 2 workers) and still outlasts
    # it on any machine where that rate holds
    g = get_group("modp2048", workers=1)
    some = g.hash_to_group([b"m%d" % i for i in range(50)])
    with served.channel(deadline_s=60) as ch:
        reply = ch.request("secondary", PsuRound1(session="abandoned", group="modp2048",
                                                  n_a=1500, chunk_rows=1500), Ack)
    # about 1.3 s of the party's measured work, and at most 900 elements, which the upfront
    # check for a 0.5 s deadline lets through (0.45 s at the declared fastest rate)
    n = min(int(reply.info["chunk_rows"]), 900)
    assert n >= 50, n
    big = PsuChunk(session="abandoned", stream="a_s1", index=0, total=1500,
                   elements=np.tile(some, (30, 1))[:n])
    with served.channel(deadline_s=0.5) as impatient:
        with pytest.raises(PeerUnavailable, match="deadline"):
            impatient.call("secondary", big)
    gave_up = time.monotonic()
    with served.channel(deadline_s=30) as ch:
        ch.request("secondary", Hello(party="primary", role="primary"), Hello)
        # answered promptly: the abandoned round (several seconds of work) was stopped
        assert time.monotonic() - gave_up < 5.0
    wait_until("the server logs the stop", lambda: "stopped work on psu_chunk" in served.log())


def test_an_over_cap_round_is_refused_before_any_work(served: Served) -> None:
    with served.channel(deadline_s=30) as ch:
        spent, _ = timed(lambda: pytest.raises(PolicyViolation, ch.call, "secondary", PsuRound1(
            session="over", group="ristretto255", n_a=CAP + 1, chunk_rows=CAP)))
        assert spent < 3.0, spent  # CAP + 1 exponentiations would take seconds
        assert "limit.set-elements" in served.log()
