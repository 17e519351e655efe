"""What every party shares: a name, a channel, and dispatch of incoming messages by type."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from vflink.errors import ProtocolError, VflinkError
from vflink.protocol.messages import PROTOCOL_VERSION, Hello, Message

__all__ = ["Party"]

log = logging.getLogger(__name__)


class Party:
    """Base class: ``handle`` dispatches a message to ``on_<kind>``."""

    role = "party"

    def __init__(self, name: str) -> None:
        self.name = name

    def handle(self, sender: str, message: Message) -> Message:
        method: Callable[[str, Any], Message] | None = getattr(self, f"on_{message.kind}", None)
        if method is None:
            raise ProtocolError(
                f"party {self.name!r} ({self.role}) does not accept {type(message).__name__} "
                f"messages (from {sender!r})"
            )
        try:
            return method(sender, message)
        except VflinkError:
            raise
        except Exception as exc:  # translate at the boundary, keep the cause for debugging
            log.exception("party %s failed handling %s from %s", self.name, message.kind, sender)
            raise ProtocolError(f"party {self.name!r} failed handling {message.kind} from "
                                f"{sender!r}: {exc}") from exc

    def on_hello(self, sender: str, message: Hello) -> Message:
        if message.version != PROTOCOL_VERSION:
            raise ProtocolError(f"{sender!r} speaks protocol version {message.version}, "
                                f"{self.name!r} speaks {PROTOCOL_VERSION}")
        return Hello(party=self.name, role=self.role)
