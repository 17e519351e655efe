"""The ``Channel`` interface: how parties talk, whatever carries the bytes.

A party sends a request to a named peer and waits for the reply (request/response). The party
receiving it implements :class:`MessageHandler`. The in-process transport calls the handler
directly; the network transport carries the same messages over gRPC.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol, TypeVar

from vflink.errors import ProtocolError
from vflink.protocol.messages import Message

__all__ = ["Channel", "MessageHandler", "expect"]

M = TypeVar("M", bound=Message)


class MessageHandler(Protocol):
    """Something that answers messages: a secondary party or a coordinator."""

    def handle(self, sender: str, message: Message) -> Message: ...


class Channel(ABC):
    """A party's connection to its peers; ``name`` is the party's own identity."""

    def __init__(self, name: str) -> None:
        self.name = name

    @abstractmethod
    def call(self, peer: str, message: Message) -> Message:
        """Send ``message`` to ``peer`` and return its reply."""

    def request(self, peer: str, message: Message, reply_type: type[M]) -> M:
        """Like :meth:`call`, and check that the reply has the expected type."""
        return expect(self.call(peer, message), reply_type, peer)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources held by the channel."""


def expect(reply: Message, reply_type: type[M], peer: str) -> M:
    if not isinstance(reply, reply_type):
        raise ProtocolError(
            f"peer {peer!r} replied with {type(reply).__name__}, expected {reply_type.__name__}"
        )
    return reply
