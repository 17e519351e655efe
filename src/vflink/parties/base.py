"""What every party shares: a name, a channel, and dispatch of incoming messages by type."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vflink.errors import ProtocolError, VflinkError
from vflink.protocol.messages import PROTOCOL_VERSION, Hello, Message

__all__ = ["Party", "state_path"]

_SAFE_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def state_path(root: Path, name: str) -> Path:
    """``root / name`` for a state file name sent by a peer, refusing anything that could
    leave ``root`` (absolute paths, ``..``, odd characters)."""
    parts = Path(name).parts
    if not parts or any(not _SAFE_PART.match(p) or p in (".", "..") for p in parts):
        raise ProtocolError(f"invalid state file name {name!r}: use relative names of letters, "
                            "digits, '.', '_' and '-'")
    return root.joinpath(*parts)

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
