"""Communication accounting and transcripts, shared by every transport.

Counts are of *payload* bytes (:func:`vflink.protocol.payload_nbytes`), so the in-process and
network transports report equal figures for the same run.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from vflink.protocol.messages import Message, payload_nbytes

__all__ = ["Record", "TrafficCounter", "Transcript"]


@dataclass(frozen=True)
class Record:
    """One message as it crossed the boundary."""

    sender: str
    receiver: str
    message: Message


class Transcript:
    """Records every message that crosses, for tests that assert the boundary contract."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self._lock = threading.Lock()

    def add(self, sender: str, receiver: str, message: Message) -> None:
        with self._lock:
            self.records.append(Record(sender, receiver, message))

    def kinds(self, sender: str | None = None, receiver: str | None = None) -> set[str]:
        return {r.message.kind for r in self.records
                if (sender is None or r.sender == sender)
                and (receiver is None or r.receiver == receiver)}


class TrafficCounter:
    """Messages and payload bytes per direction (``"primary->bank"``), and per
    (message kind, sender, receiver) for the privacy ledger (:meth:`kinds`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._messages: dict[str, int] = defaultdict(int)
        self._bytes: dict[str, int] = defaultdict(int)
        self._kinds: dict[tuple[str, str, str], list[int]] = {}

    def add(self, sender: str, receiver: str, message: Message) -> None:
        key = f"{sender}->{receiver}"
        n = payload_nbytes(message)
        with self._lock:
            self._messages[key] += 1
            self._bytes[key] += n
            slot = self._kinds.setdefault((message.kind, sender, receiver), [0, 0])
            slot[0] += 1
            slot[1] += n

    def kinds(self) -> list[dict[str, Any]]:
        """One entry per (kind, sender, receiver): ``messages`` and payload ``bytes``."""
        with self._lock:
            return [{"kind": k, "sender": s, "receiver": r, "messages": v[0], "bytes": v[1]}
                    for (k, s, r), v in sorted(self._kinds.items())]

    @staticmethod
    def kinds_delta(after: list[dict[str, Any]], before: list[dict[str, Any]]
                    ) -> list[dict[str, Any]]:
        """``after - before`` of :meth:`kinds`, entries with traffic only."""
        prior = {(b["kind"], b["sender"], b["receiver"]): b for b in before}
        out = []
        for a in after:
            b = prior.get((a["kind"], a["sender"], a["receiver"]))
            messages = int(a["messages"]) - (int(b["messages"]) if b else 0)
            if messages:
                nbytes = int(a["bytes"]) - (int(b["bytes"]) if b else 0)
                out.append({**a, "messages": messages, "bytes": nbytes})
        return out

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {k: {"messages": self._messages[k], "bytes": self._bytes[k]}
                    for k in sorted(self._messages)}

    @staticmethod
    def delta(after: dict[str, dict[str, int]], before: dict[str, dict[str, int]]
              ) -> dict[str, dict[str, int]]:
        """``after - before``, per direction with traffic (for per-epoch figures)."""
        out = {}
        for k, v in after.items():
            b = before.get(k, {"messages": 0, "bytes": 0})
            if v["messages"] != b["messages"]:
                out[k] = {"messages": v["messages"] - b["messages"],
                          "bytes": v["bytes"] - b["bytes"]}
        return out

    @staticmethod
    def combine(*parts: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
        """The sum of several snapshots or deltas, per direction (sorted by direction)."""
        out: dict[str, dict[str, int]] = {}
        for part in parts:
            for k, v in part.items():
                acc = out.setdefault(k, {"messages": 0, "bytes": 0})
                acc["messages"] += int(v["messages"])
                acc["bytes"] += int(v["bytes"])
        return {k: out[k] for k in sorted(out)}

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(self._bytes.values())
