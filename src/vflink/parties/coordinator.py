"""The coordinator: matches keyed hashes (and, for soft linkage, encodings) without raw data.

It sees only what the boundary table in ARCHITECTURE.md allows: digests or encodings in, and
alignment indices out — similarities go to the primary only.
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from vflink.alignment.exact import exact_alignment
from vflink.errors import ProtocolError
from vflink.linkage import SearchOptions, SoftLinkage, link
from vflink.parties.base import Party
from vflink.protocol.messages import (
    Ack,
    AlignmentView,
    AlignmentViews,
    FetchAlignment,
    IdentifierEncodings,
    KeyDigests,
    MatchKeys,
    SoftLink,
)
from vflink.types import Alignment

__all__ = ["CoordinatorParty"]

log = logging.getLogger(__name__)


@dataclass
class _Session:
    digests: dict[str, npt.NDArray[np.uint8]] = field(default_factory=dict)
    encodings: dict[str, tuple[str, Any]] = field(default_factory=dict)
    primary: str | None = None
    alignments: dict[str, Alignment] = field(default_factory=dict)
    linkages: dict[str, SoftLinkage] = field(default_factory=dict)


def view_of(session: str, alignment: Alignment, *, with_similarity: bool) -> AlignmentView:
    return AlignmentView(
        session=session,
        secondary=alignment.secondary,
        primary_index=alignment.primary_index,
        secondary_index=alignment.secondary_index,
        similarity=alignment.similarity if with_similarity else None,
        meta=dict(alignment.meta) if with_similarity else {},
    )


class CoordinatorParty(Party):
    """Matches digests (exact) or links encodings (soft linkage) for the data parties.

    Args:
        name: the coordinator's party name.
        seed: seeds the Eq. 2 similarity noise for reproducible simulations; ``None`` draws it
            from OS entropy. It is the coordinator's own: never taken from a data party.
        search: top-K search options (exact or approximate, chunk size, threads).
    """

    role = "coordinator"

    def __init__(self, name: str = "coordinator", *, seed: int | None = None,
                 search: SearchOptions | None = None) -> None:
        super().__init__(name)
        self._sessions: dict[str, _Session] = {}
        self._seed = seed
        self._rng = np.random.default_rng(seed)
        self._search = search

    def _noise_rng(self, session: str) -> np.random.Generator:
        """With a seed, each session's noise depends on (seed, session) only, so a long-lived
        coordinator gives the same linkage as a fresh in-process one; without, OS entropy."""
        if self._seed is None:
            return self._rng
        return np.random.default_rng([self._seed, zlib.crc32(session.encode())])

    def linkage(self, session: str, secondary: str) -> SoftLinkage:
        """The coordinator's full linkage result (raw distances included): coordinator-side."""
        try:
            return self._sessions[session].linkages[secondary]
        except KeyError:
            raise ProtocolError(f"no linkage for {secondary!r} in session {session!r}") from None

    def _session(self, session: str) -> _Session:
        return self._sessions.setdefault(session, _Session())

    def on_key_digests(self, sender: str, message: KeyDigests) -> Ack:
        self._session(message.session).digests[sender] = np.asarray(message.digests)
        log.info("coordinator: %d key digests from %s", len(message.digests), sender)
        return Ack(info={"rows": float(len(message.digests))})

    def _complete(self, session: str, parties: list[str], store: str, what: str) -> _Session:
        """The session, once every party in ``parties`` has submitted its ``store``."""
        s = self._session(session)
        absent = [p for p in parties if p not in getattr(s, store)]
        if absent:
            raise ProtocolError(f"coordinator: session {session!r} has no {what} from {absent}")
        return s

    def on_match_keys(self, sender: str, message: MatchKeys) -> AlignmentViews:
        s = self._complete(message.session, [sender, *message.secondaries], "digests",
                           "key digests")
        s.primary = sender
        views = []
        for sec in message.secondaries:
            alignment = exact_alignment(s.digests[sender], s.digests[sec], sec)
            s.alignments[sec] = alignment
            views.append(view_of(message.session, alignment, with_similarity=True))
        return AlignmentViews(views=tuple(views))

    def on_identifier_encodings(self, sender: str, message: IdentifierEncodings) -> Ack:
        self._session(message.session).encodings[sender] = (message.encoder, message.values)
        log.info("coordinator: %d %s encodings from %s", len(message.values), message.encoder,
                 sender)
        return Ack(info={"rows": float(len(message.values))})

    def on_soft_link(self, sender: str, message: SoftLink) -> AlignmentViews:
        needed = [sender, *message.secondaries]
        s = self._complete(message.session, needed, "encodings", "identifier encodings")
        encoders = {s.encodings[p][0] for p in needed}
        if len(encoders) != 1:
            raise ProtocolError(f"coordinator: parties used different encoders {sorted(encoders)}")
        s.primary = sender
        # FedSim App. C: the first secondary is soft-linked (top-K) to the primary; every other
        # secondary is linked one-to-one to that first one, so a primary record's k-th pair is
        # the chain primary → first secondary → others. K^(n-1) pairs would not scale.
        anchor, *others = message.secondaries
        linkage = link(s.encodings[sender][1], s.encodings[anchor][1], metric=message.metric,
                       top_k=message.top_k, mode=message.mode,  # type: ignore[arg-type]
                       tau=message.tau, sigma=message.sigma, delta=message.delta,
                       search=self._search, rng=self._noise_rng(message.session),
                       scale=(message.scale[0], message.scale[1]) if message.scale else None)
        s.linkages[anchor] = linkage
        first = linkage.to_alignment(anchor)
        s.alignments[anchor] = first
        views = [view_of(message.session, first, with_similarity=True)]
        for sec in others:
            one = link(s.encodings[anchor][1], s.encodings[sec][1], metric=message.metric,
                       top_k=1, mode="top1", search=self._search,
                       rng=self._noise_rng(f"{message.session}/{sec}"))
            s.linkages[sec] = one
            hop = one.indices[:, 0]
            chained = np.where(first.secondary_index >= 0,
                               hop[np.maximum(first.secondary_index, 0)], -1)
            alignment = Alignment(first.primary_index, chained, first.similarity, sec,
                                  dict(first.meta))
            s.alignments[sec] = alignment
            views.append(view_of(message.session, alignment, with_similarity=True))
        return AlignmentViews(views=tuple(views))

    def adopt(self, session: str, alignments: dict[str, Alignment]) -> None:
        """Serve ``alignments`` under ``session`` (an alignment computed elsewhere in this
        process, e.g. the per-split linkage of ``alignment.pool = "split"``)."""
        self._session(session).alignments.update(alignments)

    def on_fetch_alignment(self, sender: str, message: FetchAlignment) -> AlignmentView:
        s = self._sessions.get(message.session)
        if s is None or sender not in s.alignments:
            raise ProtocolError(f"coordinator: no alignment for {sender!r} in session "
                                f"{message.session!r}")
        # Similarities are for the primary only (ARCHITECTURE.md, boundary table).
        return view_of(message.session, s.alignments[sender], with_similarity=False)
