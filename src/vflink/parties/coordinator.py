"""The coordinator: matches keyed hashes (and, for soft linkage, encodings) without raw data.

It sees only what the boundary table in ARCHITECTURE.md allows: digests or encodings in, and
alignment indices out — similarities go to the primary only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from vflink.alignment.exact import exact_alignment
from vflink.errors import ProtocolError
from vflink.parties.base import Party
from vflink.protocol.messages import (
    Ack,
    AlignmentView,
    AlignmentViews,
    FetchAlignment,
    KeyDigests,
    MatchKeys,
)
from vflink.types import Alignment

__all__ = ["CoordinatorParty"]

log = logging.getLogger(__name__)


@dataclass
class _Session:
    digests: dict[str, npt.NDArray[np.uint8]] = field(default_factory=dict)
    primary: str | None = None
    alignments: dict[str, Alignment] = field(default_factory=dict)


def view_of(session: str, alignment: Alignment, *, with_similarity: bool) -> AlignmentView:
    return AlignmentView(
        session=session,
        secondary=alignment.secondary,
        primary_index=alignment.primary_index,
        secondary_index=alignment.secondary_index,
        similarity=alignment.similarity if with_similarity else None,
    )


class CoordinatorParty(Party):
    role = "coordinator"

    def __init__(self, name: str = "coordinator") -> None:
        super().__init__(name)
        self._sessions: dict[str, _Session] = {}

    def _session(self, session: str) -> _Session:
        return self._sessions.setdefault(session, _Session())

    def on_key_digests(self, sender: str, message: KeyDigests) -> Ack:
        self._session(message.session).digests[sender] = np.asarray(message.digests)
        log.info("coordinator: %d key digests from %s", len(message.digests), sender)
        return Ack(info={"rows": float(len(message.digests))})

    def on_match_keys(self, sender: str, message: MatchKeys) -> AlignmentViews:
        s = self._session(message.session)
        needed = [sender, *message.secondaries]
        absent = [p for p in needed if p not in s.digests]
        if absent:
            raise ProtocolError(f"coordinator: session {message.session!r} has no key digests "
                                f"from {absent}")
        s.primary = sender
        views = []
        for sec in message.secondaries:
            alignment = exact_alignment(s.digests[sender], s.digests[sec], sec)
            s.alignments[sec] = alignment
            views.append(view_of(message.session, alignment, with_similarity=True))
        return AlignmentViews(views=tuple(views))

    def on_fetch_alignment(self, sender: str, message: FetchAlignment) -> AlignmentView:
        s = self._sessions.get(message.session)
        if s is None or sender not in s.alignments:
            raise ProtocolError(f"coordinator: no alignment for {sender!r} in session "
                                f"{message.session!r}")
        # Similarities are for the primary only (ARCHITECTURE.md, boundary table).
        return view_of(message.session, s.alignments[sender], with_similarity=False)
