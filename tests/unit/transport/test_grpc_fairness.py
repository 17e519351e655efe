"""One peer cannot crowd out another at a served party: calls counted per peer from their first
moment, a trickling request cancelled, the serialised handler handed to the peers in turn, and a
long concurrent call of one peer running beside another peer's calls."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from tests.unit.transport.test_grpc_channel import (  # the same fixtures and helpers
    Secondary,
    chunk,
    connect,
    pki,
    raw_channel,
    serve,
)
from vflink.errors import PeerUnavailable
from vflink.protocol import Ack, Hello, Message, Snapshot
from vflink.transport.grpc._wire import EXCHANGE
from vflink.transport.grpc.server import FairLock

pytestmark = pytest.mark.network

__all__ = ["connect", "pki", "serve"]  # fixtures used by name


def test_the_lock_goes_to_the_peers_in_turn() -> None:
    lock = FairLock()
    holder = lock.enter("x")
    assert lock.wait(holder, 0)
    tickets = [("a", lock.enter("a")) for _ in range(3)] + [("b", lock.enter("b"))]
    order = []
    lock.release()
    for _ in range(4):
        owner = next(p for p, t in tickets if lock.wait(t, 0))
        order.append(owner)
        tickets = [(p, t) for p, t in tickets if not lock.wait(t, 0)]
        lock.release()
    assert order == ["a", "b", "a", "a"]  # b's one call does not wait behind a's three
    # a waiter that gives up loses its place, and the lock is free again
    t = lock.enter("c")
    assert lock.wait(t, 0)
    u = lock.enter("d")
    lock.leave(u)
    lock.release()
    assert lock.wait(lock.enter("e"), 0)


def _trickle(pki: Any, server: Any, name: str, stop: threading.Event,
             out: dict[str, Any]) -> None:
    """A request that announces 2 MB and sends 10 bytes, then nothing."""
    def chunks() -> Iterator[bytes]:
        yield chunk(b"x" * 10, total=2 * 1024 * 1024)
        stop.wait(30)

    with raw_channel(pki, server, name) as ch:
        try:
            list(ch.stream_stream(EXCHANGE)(chunks(), timeout=30))
        except grpc.RpcError as exc:
            out[name + str(threading.get_ident())] = exc.code()


def test_a_trickling_peer_fills_only_its_share_and_is_cut_off(serve: Any, connect: Any,
                                                             pki: Any) -> None:
    server = serve(Secondary(), allowed=("primary", "intruder"), max_workers=4,
                   receive_timeout_s=1.5, min_receive_bytes_per_s=64 * 1024)
    assert server.peer_calls == 2
    stop, codes = threading.Event(), {}
    slow = [threading.Thread(target=_trickle, args=(pki, server, "intruder", stop, codes))
            for _ in range(2)]
    for t in slow:
        t.start()
    try:
        deadline = time.monotonic() + 10
        while server._per_peer.get("intruder", 0) < 2:  # both streams hold its share
            assert time.monotonic() < deadline, "the trickling streams never arrived"
            time.sleep(0.02)
        intruder = connect(server, name="intruder", deadline_s=5)
        with pytest.raises(PeerUnavailable, match="busy for intruder"):
            intruder.call("bank", Hello(party="intruder", role="primary"))
        primary = connect(server, deadline_s=5)
        started = time.monotonic()
        for _ in range(3):  # the other peer is served at once, again and again
            assert isinstance(primary.call("bank", Hello(party="primary", role="primary")),
                              Hello)
        assert time.monotonic() - started < 3.0
        for t in slow:  # cancelled after the receive timeout, long before their 30 s
            t.join(10)
            assert not t.is_alive()
        assert set(codes.values()) <= {grpc.StatusCode.CANCELLED,
                                       grpc.StatusCode.DEADLINE_EXCEEDED}, codes
        assert len(codes) == 2
        # the intruder's share is free again
        assert isinstance(intruder.call("bank", Hello(party="intruder", role="primary")), Hello)
    finally:
        stop.set()


class _SlowConcurrent(Secondary):
    """Snapshot stands for a set-protocol chunk: long work, declared concurrent."""

    def __init__(self) -> None:
        super().__init__()
        self.running = threading.Event()

    def concurrent(self, message: Message) -> bool:
        return isinstance(message, Snapshot)

    def handle(self, sender: str, message: Message) -> Message:
        if isinstance(message, Snapshot):
            self.running.set()
            time.sleep(3.0)
            return Ack()
        return super().handle(sender, message)


def test_a_long_concurrent_call_does_not_hold_other_peers(serve: Any, connect: Any) -> None:
    handler = _SlowConcurrent()
    server = serve(handler, allowed=("primary", "intruder"), max_workers=4)
    long = connect(server, name="intruder", deadline_s=20)
    worker = threading.Thread(target=long.call, args=("bank", Snapshot(tag="t")))
    worker.start()
    assert handler.running.wait(10)
    primary = connect(server, deadline_s=2)  # a deadline shorter than the long call
    started = time.monotonic()
    assert isinstance(primary.call("bank", Hello(party="primary", role="primary")), Hello)
    assert time.monotonic() - started < 1.5
    assert worker.is_alive()  # measured while the long call ran
    worker.join(20)
