from __future__ import annotations

import pytest
import torch

from vflink.errors import PeerUnavailable, ProtocolError
from vflink.protocol import Ack, Backward, Hello, Message
from vflink.transport import InProcessHub, Transcript


class Echo:
    def handle(self, sender: str, message: Message) -> Message:
        return Ack(info={"from_" + sender: 1.0})


def test_calls_are_counted_and_recorded_per_direction() -> None:
    transcript = Transcript()
    hub = InProcessHub(transcript=transcript)
    hub.register("b", Echo())
    grad = torch.ones(2, 4)
    reply = hub.channel("a").call("b", Backward(batch_id=3, grad=grad))
    assert reply == Ack(info={"from_a": 1.0})
    snap = hub.counter.snapshot()
    assert snap["a->b"] == {"messages": 1, "bytes": 8 + 32}
    assert snap["b->a"]["messages"] == 1
    assert [(r.sender, r.receiver, r.message.kind) for r in transcript.records] == [
        ("a", "b", "backward"), ("b", "a", "ack")]
    # passed by reference: no copy in-process
    assert transcript.records[0].message.grad is grad  # type: ignore[attr-defined]


def test_unknown_peer_and_bad_reply() -> None:
    hub = InProcessHub()
    with pytest.raises(PeerUnavailable, match="'nobody'"):
        hub.channel("a").call("nobody", Hello(party="a", role="primary"))

    class Bad:
        def handle(self, sender: str, message: Message) -> object:
            return "not a message"

    hub.register("bad", Bad())  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="not a protocol message"):
        hub.channel("a").call("bad", Hello(party="a", role="primary"))


def test_a_closed_hub_forgets_its_parties() -> None:
    import gc
    import weakref

    hub = InProcessHub()

    class Party:
        def __init__(self) -> None:
            self.channel = hub.channel("b")  # a party holds its channel, which holds the hub

        def handle(self, sender: str, message: Message) -> Message:
            return Ack()

    party = Party()
    hub.register("b", party)
    gone = weakref.ref(party)
    gc.disable()
    try:
        del party
        assert gone() is not None  # the hub keeps it
        hub.close()
        assert gone() is None  # no cycle left: freed at once, no collection needed
    finally:
        gc.enable()
    with pytest.raises(PeerUnavailable, match="'b'"):
        hub.channel("a").call("b", Hello(party="a", role="primary"))
