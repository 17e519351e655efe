"""In-process transport: parties in one process, messages passed by reference.

This is the simulation transport. It runs the very same party code as the network transport;
the only difference is that a call invokes the peer's handler directly instead of going over
gRPC, so tensors are not copied.
"""

from __future__ import annotations

import logging

from vflink.errors import PeerUnavailable, ProtocolError, VflinkError
from vflink.protocol.boundary import boundary_error, is_boundary, with_local_trace
from vflink.protocol.channel import Channel, MessageHandler
from vflink.protocol.messages import Message
from vflink.transport.accounting import TrafficCounter, Transcript

__all__ = ["InProcessChannel", "InProcessHub"]

log = logging.getLogger(__name__)


class InProcessHub:
    """Routes messages between named parties living in this process."""

    def __init__(self, *, transcript: Transcript | None = None,
                 counter: TrafficCounter | None = None) -> None:
        self._handlers: dict[str, MessageHandler] = {}
        self.transcript = transcript
        self.counter = counter if counter is not None else TrafficCounter()

    def register(self, name: str, handler: MessageHandler) -> None:
        if name in self._handlers:
            raise ProtocolError(f"a party named {name!r} is already registered")
        self._handlers[name] = handler

    def channel(self, name: str) -> InProcessChannel:
        return InProcessChannel(name, self)

    def close(self) -> None:
        """Forget every registered party. A party holds its channel, which holds this hub,
        which holds the party: without this, the parties and all they keep (a link's n × K
        arrays, at FedSim's house scale 0.5 GB) outlive their last use until the cyclic
        garbage collector runs. A message delivered afterwards finds no party."""
        self._handlers.clear()

    def deliver(self, sender: str, receiver: str, message: Message) -> Message:
        handler = self._handlers.get(receiver)
        if handler is None:
            raise PeerUnavailable(receiver, f"no party of that name in this process "
                                            f"(known: {', '.join(sorted(self._handlers))})")
        self._count(sender, receiver, message)
        try:
            reply = handler.handle(sender, message)
        except Exception as exc:
            # Parity with the network transport: the caller learns only the boundary message
            # (vflink.protocol.boundary); the full text stays in the log. An internal error's
            # trace file is on this machine: the message names its path.
            if isinstance(exc, VflinkError) and not is_boundary(exc):
                log.warning("party %r: handler failed on %s from %r: %s", receiver,
                            message.kind, sender, exc)
            raise with_local_trace(boundary_error(exc, receiver, message.kind)) from None
        if not isinstance(reply, Message):
            raise ProtocolError(f"party {receiver!r} answered {type(reply).__name__}, "
                                "which is not a protocol message")
        self._count(receiver, sender, reply)
        return reply

    def _count(self, sender: str, receiver: str, message: Message) -> None:
        self.counter.add(sender, receiver, message)
        if self.transcript is not None:
            self.transcript.add(sender, receiver, message)


class InProcessChannel(Channel):
    def __init__(self, name: str, hub: InProcessHub) -> None:
        super().__init__(name)
        self._hub = hub

    def call(self, peer: str, message: Message) -> Message:
        return self._hub.deliver(self.name, peer, message)
